//! Bit layouts of the three kinds of words the semaphore keeps in its file.
//!
//! # Count word (`SemHead::count`, `u64`)
//!
//! | bits    | field    | meaning                                                        |
//! |---------|----------|----------------------------------------------------------------|
//! | 0..24   | `AVAIL`  | permits available, `0..=max_permits`                           |
//! | 24      | `OP`     | the author's held-count change: 0 = +1 (acquire), 1 = -1       |
//! | 25..35  | `AUTHOR` | holder slot index + 1 of the transition that wrote this word; 0 = none (untracked) |
//! | 35..64  | `SEQ`    | transition sequence number, `1..=SEQ_MAX` (0 only before the first transition) |
//!
//! # Book word (`HolderSlot::book`, `u64`)
//!
//! | bits    | field     | meaning                                                      |
//! |---------|-----------|--------------------------------------------------------------|
//! | 0..32   | `HELD`    | permits this holder holds                                    |
//! | 32..64  | `APPLIED` | `SEQ` of the last transition authored by this slot that has been applied to `HELD` |
//!
//! # Owner word (`HolderSlot::owner`, `u64`)
//!
//! | bits    | field   | meaning                                                         |
//! |---------|---------|-----------------------------------------------------------------|
//! | 0..32   | `PID`   | process id                                                      |
//! | 32..62  | `START` | start-time tag: `start % (2^30 - 1) + 1`; 0 = start unknown     |
//! | 62..64  | `STATE` | 0 free (whole word 0), 1 active (holder), 2 reclaiming (the pid/start are the reclaimer's) |

/// Bits of the count word that hold the available permits.
pub(crate) const AVAIL_MASK: u64 = (1 << 24) - 1;
/// The count-word bit saying the author's held count goes down (release) rather than up.
pub(crate) const OP_RELEASE: u64 = 1 << 24;
const AUTHOR_SHIFT: u32 = 25;
const AUTHOR_FIELD: u64 = (1 << 10) - 1;
const SEQ_SHIFT: u32 = 35;
/// Largest transition sequence number; after it comes 1 again.
pub(crate) const SEQ_MAX: u32 = (1 << 29) - 1;

/// Largest `max_permits` the count word can hold.
pub(crate) const MAX_PERMITS: u32 = AVAIL_MASK as u32;
/// Largest holder-table capacity the `AUTHOR` field can name.
pub(crate) const MAX_HOLDERS: u32 = AUTHOR_FIELD as u32;

/// The pool word: available permits plus who wrote it last and whether that writer's
/// bookkeeping is still to be applied (see the module docs of `semaphore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountWord(pub(crate) u64);

impl CountWord {
    /// A count word with `avail` permits. `author` is the holder slot whose held count
    /// this transition changes (`release`: by -1, else +1), or `None` for an untracked
    /// transition. Out-of-range fields are masked, never panicking.
    #[inline]
    pub(crate) fn new(avail: u32, release: bool, author: Option<usize>, seq: u32) -> Self {
        let author = match author {
            Some(i) if (i as u64) < AUTHOR_FIELD => i as u64 + 1,
            _ => 0,
        };
        let op = if release && author != 0 {
            OP_RELEASE
        } else {
            0
        };
        CountWord(
            (u64::from(avail) & AVAIL_MASK)
                | op
                | (author << AUTHOR_SHIFT)
                | (u64::from(seq & SEQ_MAX) << SEQ_SHIFT),
        )
    }

    /// Permits available.
    #[inline]
    pub(crate) fn avail(self) -> u32 {
        (self.0 & AVAIL_MASK) as u32
    }

    /// Whether the author's held count goes down (release) rather than up.
    #[inline]
    pub(crate) fn is_release(self) -> bool {
        self.0 & OP_RELEASE != 0
    }

    /// The holder slot that authored this word, if any. Not bounds-checked against the
    /// table: callers use `slots.get(i)`.
    #[inline]
    pub(crate) fn author(self) -> Option<usize> {
        match (self.0 >> AUTHOR_SHIFT) & AUTHOR_FIELD {
            0 => None,
            a => Some(a as usize - 1),
        }
    }

    /// The transition sequence number.
    #[inline]
    pub(crate) fn seq(self) -> u32 {
        (self.0 >> SEQ_SHIFT) as u32
    }
}

/// The sequence number after `seq`, skipping 0 and `avoid` (the author's last applied
/// number, so "applied == seq" can never be mistaken for a fresh transition).
#[inline]
pub(crate) fn next_seq(seq: u32, avoid: u32) -> u32 {
    let bump = |s: u32| if s >= SEQ_MAX { 1 } else { s + 1 };
    let n = bump(seq);
    if n == avoid { bump(n) } else { n }
}

/// A holder's bookkeeping: permits held and the last transition applied to that count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BookWord(pub(crate) u64);

impl BookWord {
    /// Permits held.
    #[inline]
    pub(crate) fn held(self) -> u32 {
        self.0 as u32
    }

    /// `SEQ` of the last applied transition authored by this slot.
    #[inline]
    pub(crate) fn applied(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// This book with transition `c` applied: held +1 or -1 (saturating, so a corrupt
    /// file cannot make it wrap), applied = `c.seq()`.
    #[inline]
    pub(crate) fn apply(self, c: CountWord) -> BookWord {
        let held = if c.is_release() {
            self.held().saturating_sub(1)
        } else {
            self.held().saturating_add(1)
        };
        BookWord(u64::from(held) | (u64::from(c.seq()) << 32))
    }

    /// This book with `held` set to 0, keeping `applied`.
    #[inline]
    pub(crate) fn emptied(self) -> BookWord {
        BookWord(self.0 & !u64::from(u32::MAX))
    }
}

/// Owner-word state: the slot is in use by a live (or not yet reclaimed) holder.
pub(crate) const STATE_ACTIVE: u64 = 1;
/// Owner-word state: a reclaimer (named by the word's pid/start) is returning the
/// permits of a dead holder.
pub(crate) const STATE_RECLAIMING: u64 = 2;
const STATE_SHIFT: u32 = 62;
const START_MASK: u64 = (1 << 30) - 1;

/// The 30-bit tag stored for a process start time; 0 means "unknown".
#[inline]
pub(crate) fn start_tag(start: u64) -> u32 {
    if start == 0 {
        0
    } else {
        (start % START_MASK) as u32 + 1
    }
}

/// An owner word.
#[inline]
pub(crate) fn owner_word(state: u64, pid: u32, tag: u32) -> u64 {
    (state << STATE_SHIFT) | ((u64::from(tag) & START_MASK) << 32) | u64::from(pid)
}

/// `(state, pid, start tag)` of an owner word.
#[inline]
pub(crate) fn owner_parts(word: u64) -> (u64, u32, u32) {
    (
        word >> STATE_SHIFT,
        word as u32,
        ((word >> 32) & START_MASK) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_word_round_trips() {
        let c = CountWord::new(MAX_PERMITS, true, Some(MAX_HOLDERS as usize - 1), SEQ_MAX);
        assert_eq!(c.avail(), MAX_PERMITS);
        assert!(c.is_release());
        assert_eq!(c.author(), Some(MAX_HOLDERS as usize - 1));
        assert_eq!(c.seq(), SEQ_MAX);
        let u = CountWord::new(3, true, None, 7);
        assert_eq!(
            (u.avail(), u.is_release(), u.author(), u.seq()),
            (3, false, None, 7)
        );
        // An index the field cannot name is stored as "no author", never wrapped.
        assert_eq!(CountWord::new(0, false, Some(5000), 1).author(), None);
    }

    #[test]
    fn seq_skips_zero_and_the_avoided_value() {
        assert_eq!(next_seq(0, 0), 1);
        assert_eq!(next_seq(SEQ_MAX, 0), 1);
        assert_eq!(next_seq(SEQ_MAX, 1), 2);
        assert_eq!(next_seq(4, 5), 6);
        assert_eq!(next_seq(4, 9), 5);
    }

    #[test]
    fn book_applies_and_saturates() {
        let b = BookWord(0);
        let acq = CountWord::new(0, false, Some(0), 9);
        let rel = CountWord::new(0, true, Some(0), 10);
        let b1 = b.apply(acq);
        assert_eq!((b1.held(), b1.applied()), (1, 9));
        let b2 = b1.apply(rel);
        assert_eq!((b2.held(), b2.applied()), (0, 10));
        assert_eq!(b2.apply(rel).held(), 0);
        assert_eq!(BookWord(u64::from(u32::MAX)).apply(acq).held(), u32::MAX);
        assert_eq!(b1.emptied(), BookWord(9 << 32));
    }

    #[test]
    fn owner_words() {
        let w = owner_word(STATE_RECLAIMING, 4_194_304, start_tag(123_456_789));
        assert_eq!(
            owner_parts(w),
            (STATE_RECLAIMING, 4_194_304, start_tag(123_456_789))
        );
        assert_eq!(start_tag(0), 0);
        assert_ne!(start_tag(START_MASK), 0);
        assert_ne!(owner_word(STATE_ACTIVE, 0, 0), 0);
    }
}

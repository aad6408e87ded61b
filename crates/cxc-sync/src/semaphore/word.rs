//! Bit layouts of the three kinds of words the semaphore keeps in its file.
//!
//! # Count word (`SemHead::count`, `u64`)
//!
//! | bits    | field    | meaning                                                        |
//! |---------|----------|----------------------------------------------------------------|
//! | 0..24   | `AVAIL`  | permits available, `0..=max_permits`                           |
//! | 24..26  | `OP`     | the transition's book changes, see [`Op`]                      |
//! | 26..36  | `AUTHOR` | holder slot index + 1 of the transition that wrote this word; 0 = none |
//! | 36..64  | `SEQ`    | transition sequence number, `1..=SEQ_MAX` (0 only before the first transition) |
//!
//! | `OP` | name      | author's held | handed (`SemHead::handed`) | avail |
//! |------|-----------|---------------|-----------------------------|-------|
//! | 0    | `Acquire` | +1            |                             | -1    |
//! | 1    | `Release` | -1            |                             | +1    |
//! | 2    | `Disown`  | -1            | +1                          |       |
//! | 3    | `Take`    | (no author)   | -1                          | +1    |
//!
//! The *handed* book (`SemHead::handed`, same layout as a book word) counts permits
//! handed off with `Permit::disown` and not yet released by their receiver.
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
//! | 32..62  | `TAG`   | identity tag: bit 29 = fallback form, bits 0..29 a hash of the process [`Identity`] (never 0); 0 = identity unknown |
//! | 62..64  | `STATE` | 0 free (whole word 0), 1 active (holder), 2 reclaiming (the pid/tag are the reclaimer's) |
//!
//! A holder is judged by looking its pid up now (in the form its tag says) and comparing
//! tags: no process with that pid, another tag (the pid was reused), or a process whose
//! whole thread group exited means dead.

use cxc_mmf::identity::Identity;

/// Bits of the count word that hold the available permits.
pub(crate) const AVAIL_MASK: u64 = (1 << 24) - 1;
const OP_SHIFT: u32 = 24;
const AUTHOR_SHIFT: u32 = 26;
const AUTHOR_FIELD: u64 = (1 << 10) - 1;
const SEQ_SHIFT: u32 = 36;
/// Largest transition sequence number; after it comes 1 again.
pub(crate) const SEQ_MAX: u32 = (1 << 28) - 1;

/// The book changes of a transition (the `OP` field of the count word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// The author's held count +1 (a permit leaves the pool to the author).
    Acquire = 0,
    /// The author's held count -1 (a permit comes back from the author).
    Release = 1,
    /// The author's held count -1 and the handed count +1 (the permit stays out, in
    /// transit to another process).
    Disown = 2,
    /// The handed count -1 (a handed-off permit comes back); no author.
    Take = 3,
}

impl Op {
    fn from_bits(b: u64) -> Op {
        match b & 3 {
            0 => Op::Acquire,
            1 => Op::Release,
            2 => Op::Disown,
            _ => Op::Take,
        }
    }

    /// Change of the author's held count.
    #[inline]
    pub(crate) fn author_delta(self) -> i8 {
        match self {
            Op::Acquire => 1,
            Op::Release | Op::Disown => -1,
            Op::Take => 0,
        }
    }

    /// Change of the handed count.
    #[inline]
    pub(crate) fn handed_delta(self) -> i8 {
        match self {
            Op::Disown => 1,
            Op::Take => -1,
            Op::Acquire | Op::Release => 0,
        }
    }
}

/// Largest `max_permits` the count word can hold.
pub(crate) const MAX_PERMITS: u32 = AVAIL_MASK as u32;
/// Largest holder-table capacity the `AUTHOR` field can name.
pub(crate) const MAX_HOLDERS: u32 = AUTHOR_FIELD as u32;

/// The pool word: available permits plus who wrote it last and whether that writer's
/// bookkeeping is still to be applied (see the module docs of `semaphore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountWord(pub(crate) u64);

impl CountWord {
    /// A count word with `avail` permits written by transition `op` of `author` (the
    /// holder slot whose held count it changes; `None` for [`Op::Take`] and for the
    /// initial word). Out-of-range fields are masked, never panicking.
    #[inline]
    pub(crate) fn new(avail: u32, op: Op, author: Option<usize>, seq: u32) -> Self {
        let author = match author {
            Some(i) if (i as u64) < AUTHOR_FIELD => i as u64 + 1,
            _ => 0,
        };
        CountWord(
            (u64::from(avail) & AVAIL_MASK)
                | ((op as u64) << OP_SHIFT)
                | (author << AUTHOR_SHIFT)
                | (u64::from(seq & SEQ_MAX) << SEQ_SHIFT),
        )
    }

    /// The initial word: `avail` permits, no transition yet.
    #[inline]
    pub(crate) fn initial(avail: u32) -> Self {
        CountWord::new(avail, Op::Acquire, None, 0)
    }

    /// The transition that wrote this word.
    #[inline]
    pub(crate) fn op(self) -> Op {
        Op::from_bits(self.0 >> OP_SHIFT)
    }

    /// Whether this word's transition changes the handed count (and so may need
    /// helping there).
    #[inline]
    pub(crate) fn touches_handed(self) -> bool {
        self.seq() != 0 && self.op().handed_delta() != 0
    }

    /// Permits available.
    #[inline]
    pub(crate) fn avail(self) -> u32 {
        (self.0 & AVAIL_MASK) as u32
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

/// The sequence number after `seq`, skipping 0 and `avoid` (the last applied numbers of
/// the books the new transition changes, so "applied == seq" can never be mistaken for a
/// fresh transition).
#[inline]
pub(crate) fn next_seq(seq: u32, avoid: [u32; 2]) -> u32 {
    let bump = |s: u32| if s >= SEQ_MAX { 1 } else { s + 1 };
    let mut n = bump(seq);
    while avoid.contains(&n) {
        n = bump(n);
    }
    n
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

    /// This book with a change of `delta` (+1 or -1) by transition `c` applied
    /// (saturating, so a corrupt file cannot make it wrap), applied = `c.seq()`.
    #[inline]
    pub(crate) fn apply(self, c: CountWord, delta: i8) -> BookWord {
        let held = if delta < 0 {
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
/// Owner-word state: a reclaimer (named by the word's pid/tag) is returning the
/// permits of a dead holder.
pub(crate) const STATE_RECLAIMING: u64 = 2;
const STATE_SHIFT: u32 = 62;
const TAG_MASK: u64 = (1 << 30) - 1;

/// Tag bit saying the identity has the fallback form (pid + start time).
pub(crate) const TAG_FALLBACK: u32 = 1 << 29;
const TAG_HASH_MASK: u64 = (1 << 29) - 1;

/// The 30-bit tag of an identity: its form, and a 29-bit hash of all its words (never 0
/// for a known identity); 0 for an unknown identity.
#[inline]
pub(crate) fn identity_tag(id: &Identity) -> u32 {
    if !id.is_known() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in id.to_words() {
        h ^= w;
        h = h.wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    let hash = (h % TAG_HASH_MASK) as u32 + 1;
    if id.is_fallback() {
        hash | TAG_FALLBACK
    } else {
        hash
    }
}

/// An owner word.
#[inline]
pub(crate) fn owner_word(state: u64, pid: u32, tag: u32) -> u64 {
    (state << STATE_SHIFT) | ((u64::from(tag) & TAG_MASK) << 32) | u64::from(pid)
}

/// `(state, pid, tag)` of an owner word.
#[inline]
pub(crate) fn owner_parts(word: u64) -> (u64, u32, u32) {
    (
        word >> STATE_SHIFT,
        word as u32,
        ((word >> 32) & TAG_MASK) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_word_round_trips() {
        let c = CountWord::new(
            MAX_PERMITS,
            Op::Release,
            Some(MAX_HOLDERS as usize - 1),
            SEQ_MAX,
        );
        assert_eq!(c.avail(), MAX_PERMITS);
        assert_eq!(c.op(), Op::Release);
        assert_eq!(c.author(), Some(MAX_HOLDERS as usize - 1));
        assert_eq!(c.seq(), SEQ_MAX);
        for op in [Op::Acquire, Op::Release, Op::Disown, Op::Take] {
            let u = CountWord::new(3, op, None, 7);
            assert_eq!((u.avail(), u.op(), u.author(), u.seq()), (3, op, None, 7));
        }
        assert!(CountWord::new(0, Op::Take, None, 1).touches_handed());
        assert!(CountWord::new(0, Op::Disown, Some(0), 1).touches_handed());
        assert!(!CountWord::new(0, Op::Release, Some(0), 1).touches_handed());
        assert!(!CountWord::initial(5).touches_handed());
        // An index the field cannot name is stored as "no author", never wrapped.
        assert_eq!(CountWord::new(0, Op::Acquire, Some(5000), 1).author(), None);
    }

    #[test]
    fn seq_skips_zero_and_the_avoided_value() {
        assert_eq!(next_seq(0, [0, 0]), 1);
        assert_eq!(next_seq(SEQ_MAX, [0, 0]), 1);
        assert_eq!(next_seq(SEQ_MAX, [1, 0]), 2);
        assert_eq!(next_seq(4, [5, 0]), 6);
        assert_eq!(next_seq(4, [5, 6]), 7);
        assert_eq!(next_seq(4, [9, 0]), 5);
    }

    #[test]
    fn book_applies_and_saturates() {
        let b = BookWord(0);
        let acq = CountWord::new(0, Op::Acquire, Some(0), 9);
        let rel = CountWord::new(0, Op::Release, Some(0), 10);
        let b1 = b.apply(acq, 1);
        assert_eq!((b1.held(), b1.applied()), (1, 9));
        let b2 = b1.apply(rel, -1);
        assert_eq!((b2.held(), b2.applied()), (0, 10));
        assert_eq!(b2.apply(rel, -1).held(), 0);
        assert_eq!(BookWord(u64::from(u32::MAX)).apply(acq, 1).held(), u32::MAX);
        assert_eq!(b1.emptied(), BookWord(9 << 32));
    }

    #[test]
    fn owner_words() {
        let id = Identity {
            pid: 7,
            pidns: 1,
            boot: 2,
            unique: 3,
        };
        let tag = identity_tag(&id);
        assert_ne!(tag, 0);
        assert_eq!(tag & TAG_FALLBACK, 0);
        let fb = Identity {
            unique: cxc_mmf::identity::FALLBACK_BIT | 3,
            ..id
        };
        assert_ne!(identity_tag(&fb) & TAG_FALLBACK, 0);
        assert_eq!(identity_tag(&Identity::default()), 0);
        assert_ne!(tag, identity_tag(&Identity { unique: 4, ..id }));
        let w = owner_word(STATE_RECLAIMING, 4_194_304, tag);
        assert_eq!(owner_parts(w), (STATE_RECLAIMING, 4_194_304, tag));
        assert_ne!(owner_word(STATE_ACTIVE, 0, 0), 0);
    }
}

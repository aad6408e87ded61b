//! The protocol: every change of the pool goes through one CAS on the count word, and the
//! per-holder bookkeeping of that change is finished by whoever touches the word next.
//!
//! Invariant **B** (books): for every slot `s` that is not the author of the current count
//! word, `held(s)` counts every transition `s` authored; for the author `a`, either the
//! same holds, or exactly the current transition is missing and then
//! `applied(a) != seq(count)` (the *pending* state). The same holds for the *handed*
//! book (`SemHead::handed`) and the transitions that change it (`Disown`, `Take`).
//!
//! - Every CAS on the count word is preceded by [`RawSemaphore::help`], which applies the
//!   current author's pending change (an idempotent CAS on its book), so B still holds
//!   after the new word replaces the old one.
//! - The CAS'ing process applies its own change right after its CAS succeeds; if it dies
//!   first, the next process to touch the count word (or the reclaimer) applies it.
//! - So `available + Σ held + handed == max_permits` (the **conservation** invariant)
//!   holds at every instant up to one pending transition, which anyone can finish. A
//!   process that dies between any two instructions leaves at most that. Every permit
//!   out of the pool is held by a tracked holder or handed off: there are no untracked
//!   transitions.
//!
//! See `docs/shared-semaphore.md` for the full argument, including why a helper that
//! read the count word long ago cannot apply a change twice.

use super::layout::{HolderSlot, SemHead};
use super::word::{BookWord, CountWord, Op, next_seq};
use crate::primitive::AtomicU64;
use crate::primitive::{Ordering, spin_hint};

#[cfg(cxc_loom)]
use super::model::{CrashPlan, ModelFutex};

/// What a transition wants to do, decided from the current count word, the caller's
/// book and the handed book (all read after helping).
pub(crate) enum Plan {
    /// Write `avail` with the book changes of `op` (an op with an author change needs a
    /// holder slot; without one the transition is refused).
    Commit { avail: u32, op: Op },
    /// Do nothing.
    Refuse,
}

/// What [`RawSemaphore::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// A permit held by the caller went back.
    Held,
    /// A handed-off permit went back.
    Handed,
    /// Refused: the pool is already full.
    Full,
    /// Refused: the caller holds no permit and none is handed off.
    NotHeld,
}

/// What [`RawSemaphore::own_fast`] did.
enum Fast {
    /// The transition is done.
    Done,
    /// Refused (an `Acquire` with no permit available); nothing changed.
    Refused,
    /// Loom only: this "process" died at a crash point.
    Died,
    /// Not the common case: run the general transition.
    Slow,
}

/// A view of one semaphore's state (in a mapped file, or on the heap in loom models).
pub(crate) struct RawSemaphore<'a> {
    pub(crate) head: &'a SemHead,
    pub(crate) slots: &'a [HolderSlot],
    pub(crate) max: u32,
    /// Loom only: where this "process" dies (see `model::CrashPlan`).
    #[cfg(cxc_loom)]
    pub(crate) crash: Option<&'a CrashPlan>,
    /// Loom only: a faithful futex stand-in, so a lost wake-up shows as a deadlock.
    #[cfg(cxc_loom)]
    pub(crate) futex: Option<&'a ModelFutex>,
}

impl<'a> RawSemaphore<'a> {
    /// Permits available now: one atomic load.
    #[inline]
    pub(crate) fn available(&self) -> u32 {
        // SYNC: count (Acquire side; pairs with the SeqCst CAS of every transition).
        CountWord(self.head.count.load(Ordering::Acquire)).avail()
    }

    /// Finishes the bookkeeping of `c` (its author's book, the handed book), if pending.
    /// `Err(now)` if the count word is no longer `c` (then whoever changed it has helped
    /// `c` already).
    #[inline]
    pub(crate) fn help(&self, c: CountWord) -> Result<(), CountWord> {
        let op = c.op();
        if let Some(slot) = c.author().and_then(|a| self.slots.get(a)) {
            // SYNC: book (Acquire; pairs with the AcqRel book CAS of whoever applied last).
            let w = BookWord(slot.book.load(Ordering::Acquire));
            if w.applied() != c.seq() && op.author_delta() != 0 {
                self.help_slow(&slot.book, c, w, op.author_delta())?;
            }
        }
        if c.touches_handed() {
            // SYNC: book (as above, for the handed book).
            let w = BookWord(self.head.handed.load(Ordering::Acquire));
            if w.applied() != c.seq() {
                self.help_slow(&self.head.handed, c, w, op.handed_delta())?;
            }
        }
        Ok(())
    }

    #[inline(never)]
    fn help_slow(
        &self,
        book: &AtomicU64,
        c: CountWord,
        w: BookWord,
        delta: i8,
    ) -> Result<(), CountWord> {
        // Validate after reading the book: if the count word is still `c`, it was `c` when
        // `w` was read, so `w` is the author's book just before `c` (B) and applying `c`
        // to it is right. A stale `w` fails the CAS below.
        let now = CountWord(self.head.count.load(Ordering::SeqCst));
        if now != c {
            return Err(now);
        }
        // Failure means someone else applied `c` first: the book moves only by applying.
        let _ = book.compare_exchange(
            w.0,
            w.apply(c, delta).0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        Ok(())
    }

    /// One transition of the count word on behalf of `holder` (a slot index; `None` for a
    /// caller without one, which can only `Take`). Returns the word written, or `None` if
    /// `plan` refused (or, in loom models, the "process" died).
    #[inline]
    pub(crate) fn transition(
        &self,
        holder: Option<usize>,
        plan: impl Fn(CountWord, Option<BookWord>, BookWord) -> Plan,
    ) -> Option<CountWord> {
        let mine = holder.and_then(|i| self.slots.get(i).map(|s| (i, s)));
        // SYNC: count (Acquire suffices; SeqCst costs nothing extra on x86).
        let mut c = CountWord(self.head.count.load(Ordering::SeqCst));
        loop {
            if self.crash_here() {
                return None;
            }
            if let Err(now) = self.help(c) {
                c = now;
                continue;
            }
            if self.crash_here() {
                return None;
            }
            // After helping, our book and the handed book have no pending change while
            // the word stays `c`, so both are exact if the CAS below succeeds.
            let book = mine.map(|(_, s)| BookWord(s.book.load(Ordering::Acquire)));
            let handed = BookWord(self.head.handed.load(Ordering::Acquire));
            if self.crash_here() {
                return None;
            }
            let Plan::Commit { avail, op } = plan(c, book, handed) else {
                return None;
            };
            // An op that changes a held count needs the caller's slot: a permit leaves
            // the pool only to a tracked holder and comes back only from one.
            let author = match (op.author_delta(), mine, book) {
                (0, _, _) => None,
                (_, Some((i, s)), Some(b)) => Some((i, s, b)),
                _ => return None,
            };
            let touches_handed = op.handed_delta() != 0;
            let avoid = [
                author.map_or(0, |(_, _, b)| b.applied()),
                if touches_handed { handed.applied() } else { 0 },
            ];
            let new = CountWord::new(
                avail,
                op,
                author.map(|(i, _, _)| i),
                next_seq(c.seq(), avoid),
            );
            // SYNC: count. Release publishes the caller's critical section to the next
            // acquirer, Acquire takes the previous releaser's (RMWs continue release
            // sequences, so every later acquirer is ordered after every earlier release).
            // SeqCst is more than the protocol needs and costs nothing extra on x86.
            match self
                .head
                .count
                .compare_exchange(c.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if self.crash_here() {
                        return Some(new);
                    }
                    if let Some((_, s, b)) = author {
                        // The book was `b` when the CAS succeeded; failure means a helper
                        // applied `new` already (or later transitions did, after helping).
                        let _ = s.book.compare_exchange(
                            b.0,
                            b.apply(new, op.author_delta()).0,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                    }
                    if touches_handed {
                        if self.crash_here() {
                            return Some(new);
                        }
                        // As for the author's book.
                        let _ = self.head.handed.compare_exchange(
                            handed.0,
                            handed.apply(new, op.handed_delta()).0,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                    }
                    return Some(new);
                }
                Err(now) => {
                    c = CountWord(now);
                    spin_hint();
                }
            }
        }
    }

    /// The common case of [`Self::transition`]: an `Acquire` or `Release` of slot `i`'s
    /// own permit right after a transition of `i`'s own, already applied. Same CASes and
    /// orderings as the general path, but its two loads do not wait for each other: this
    /// slot's book `b`, then the count word `c`. Taken only if `c` was authored by `i`,
    /// changes `i`'s book (and not the handed book) and `b` has applied it
    /// (`b.applied() == c.seq()`): then `help(c)` would do nothing, and `b` is exact while
    /// the word stays `c` (B: only the current word's author can have a change pending; a
    /// later `c.seq()` always differs from the applied number of its author's book,
    /// `next_seq`). Then the count CAS from `c`, and the book CAS from `b`, which fails
    /// only if a helper applied the new word first. [`Fast::Slow`] for every other case,
    /// and after a lost count CAS: the caller runs the general transition, which loads
    /// again.
    #[inline(always)]
    fn own_fast(&self, i: usize, op: Op) -> Fast {
        let Some(s) = self.slots.get(i) else {
            return Fast::Slow;
        };
        // SYNC: book (as in `help`), then count (as in `transition`).
        let b = BookWord(s.book.load(Ordering::Acquire));
        let c = CountWord(self.head.count.load(Ordering::SeqCst));
        if self.crash_here() {
            return Fast::Died;
        }
        if c.author() != Some(i)
            || c.op().author_delta() == 0
            || b.applied() != c.seq()
            || c.touches_handed()
        {
            return Fast::Slow;
        }
        let avail = match op {
            Op::Acquire if c.avail() > 0 => c.avail() - 1,
            Op::Acquire => return Fast::Refused,
            Op::Release if c.avail() < self.max && b.held() > 0 => c.avail() + 1,
            _ => return Fast::Slow,
        };
        let new = CountWord::new(avail, op, Some(i), next_seq(c.seq(), [b.applied(), 0]));
        // SYNC: count (as in `transition`).
        if self
            .head
            .count
            .compare_exchange(c.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Fast::Slow;
        }
        if self.crash_here() {
            return Fast::Done;
        }
        // As in `transition`: failure means a helper applied `new` already.
        let _ = s.book.compare_exchange(
            b.0,
            b.apply(new, op.author_delta()).0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        Fast::Done
    }

    /// Takes one permit for `holder` if one is available. Without a holder slot nothing
    /// is taken: a permit leaves the pool only to a tracked holder.
    #[inline]
    pub(crate) fn try_acquire(&self, holder: Option<usize>) -> bool {
        let Some(i) = holder else {
            return false;
        };
        match self.own_fast(i, Op::Acquire) {
            Fast::Done => return true,
            Fast::Refused | Fast::Died => return false,
            Fast::Slow => {}
        }
        self.try_acquire_slow(holder)
    }

    #[inline(never)]
    fn try_acquire_slow(&self, holder: Option<usize>) -> bool {
        if self.available() == 0 {
            return false;
        }
        self.transition(holder, |c, _, _| match c.avail() {
            0 => Plan::Refuse,
            n => Plan::Commit {
                avail: n - 1,
                op: Op::Acquire,
            },
        })
        .is_some()
    }

    /// Returns one permit: one `holder` holds (its held count goes down), else one that
    /// was handed off (the handed count goes down). Refused, changing nothing, if the
    /// pool is already full or the caller holds none and none is handed off.
    #[inline]
    pub(crate) fn release(&self, holder: Option<usize>) -> Released {
        if let Some(i) = holder {
            match self.own_fast(i, Op::Release) {
                Fast::Done => return Released::Held,
                // As the general path reports a caller that died mid-transition.
                Fast::Died | Fast::Refused => return Released::NotHeld,
                Fast::Slow => {}
            }
        }
        self.release_slow(holder)
    }

    #[inline(never)]
    fn release_slow(&self, holder: Option<usize>) -> Released {
        let max = self.max;
        let why = std::cell::Cell::new(Released::NotHeld);
        let done = self.transition(holder, |c, book, handed| {
            if c.avail() >= max {
                why.set(Released::Full);
                return Plan::Refuse;
            }
            let op = match book {
                Some(b) if b.held() > 0 => Op::Release,
                _ if handed.held() > 0 => Op::Take,
                _ => {
                    why.set(Released::NotHeld);
                    return Plan::Refuse;
                }
            };
            Plan::Commit {
                avail: c.avail() + 1,
                op,
            }
        });
        match done {
            Some(c) if c.op() == Op::Take => Released::Handed,
            Some(_) => Released::Held,
            None => why.get(),
        }
    }

    /// Hands one permit held by `holder` off: it stays out of the pool, no longer held by
    /// `holder` (so not reclaimed if `holder` dies) but counted as handed, so that one
    /// later `release` by a process without a permit of its own returns it. `false` if
    /// the holder holds none.
    pub(crate) fn disown(&self, holder: usize) -> bool {
        self.transition(Some(holder), |c, book, _| match book {
            Some(b) if b.held() > 0 => Plan::Commit {
                avail: c.avail(),
                op: Op::Disown,
            },
            _ => Plan::Refuse,
        })
        .is_some()
    }

    /// Adds `n` to a counter (slow paths only); an index past the counters is ignored.
    #[inline]
    pub(crate) fn bump(&self, index: usize, n: u64) {
        if let Some(c) = self.head.counters.get(index) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    crate::macros::crash_points!();
}

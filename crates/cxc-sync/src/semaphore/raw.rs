//! The protocol: every change of the pool goes through one CAS on the count word, and the
//! per-holder bookkeeping of that change is finished by whoever touches the word next.
//!
//! Invariant **B** (books): for every slot `s` that is not the author of the current count
//! word, `held(s)` counts every transition `s` authored; for the author `a`, either the
//! same holds, or exactly the current transition is missing and then
//! `applied(a) != seq(count)` (the *pending* state).
//!
//! - Every CAS on the count word is preceded by [`RawSemaphore::help`], which applies the
//!   current author's pending change (an idempotent CAS on its book), so B still holds
//!   after the new word replaces the old one.
//! - The CAS'ing process applies its own change right after its CAS succeeds; if it dies
//!   first, the next process to touch the count word (or the reclaimer) applies it.
//! - So `available + Σ held == max_permits` (the **conservation** invariant, for tracked
//!   permits) holds at every instant up to one pending transition, which anyone can
//!   finish. A process that dies between any two instructions leaves at most that.
//!
//! See `docs/shared-semaphore.md` for the full argument, including why a helper that
//! read the count word long ago cannot apply a change twice.

use super::layout::{HolderSlot, SemHead};
use super::word::{BookWord, CountWord, next_seq};
use crate::primitive::{Ordering, spin_hint};

#[cfg(cxc_loom)]
use super::model::{CrashPlan, ModelFutex};

/// What a transition wants to do, decided from the current count word and the caller's
/// book (both read after helping).
pub(crate) enum Plan {
    /// Write `avail`; `book` says how the caller's held count changes: `Some(false)` +1,
    /// `Some(true)` -1, `None` untracked (no book change, no author).
    Commit { avail: u32, book: Option<bool> },
    /// Do nothing.
    Refuse,
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

    /// Finishes the bookkeeping of the author of `c`, if pending. `Err(now)` if the count
    /// word is no longer `c` (then whoever changed it has helped `c` already).
    #[inline]
    pub(crate) fn help(&self, c: CountWord) -> Result<(), CountWord> {
        let Some(slot) = c.author().and_then(|a| self.slots.get(a)) else {
            return Ok(());
        };
        // SYNC: book (Acquire; pairs with the AcqRel book CAS of whoever applied last).
        let w = BookWord(slot.book.load(Ordering::Acquire));
        if w.applied() == c.seq() {
            return Ok(());
        }
        self.help_slow(slot, c, w)
    }

    #[inline(never)]
    fn help_slow(&self, slot: &HolderSlot, c: CountWord, w: BookWord) -> Result<(), CountWord> {
        // Validate after reading the book: if the count word is still `c`, it was `c` when
        // `w` was read, so `w` is the author's book just before `c` (B) and applying `c`
        // to it is right. A stale `w` fails the CAS below.
        let now = CountWord(self.head.count.load(Ordering::SeqCst));
        if now != c {
            return Err(now);
        }
        // Failure means someone else applied `c` first: the book moves only by applying.
        let _ = slot
            .book
            .compare_exchange(w.0, w.apply(c).0, Ordering::AcqRel, Ordering::Acquire);
        Ok(())
    }

    /// One transition of the count word on behalf of `holder` (a slot index, `None` for
    /// untracked). Returns the word written, or `None` if `plan` refused (or, in loom
    /// models, the "process" died).
    #[inline]
    pub(crate) fn transition(
        &self,
        holder: Option<usize>,
        plan: impl Fn(CountWord, Option<BookWord>) -> Plan,
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
            // After helping, our book has no pending change while the word stays `c`,
            // so `book` is exact if the CAS below succeeds.
            let book = mine.map(|(_, s)| BookWord(s.book.load(Ordering::Acquire)));
            if self.crash_here() {
                return None;
            }
            let Plan::Commit { avail, book: op } = plan(c, book) else {
                return None;
            };
            let new = match (mine, book, op) {
                (Some((i, _)), Some(b), Some(release)) => {
                    CountWord::new(avail, release, Some(i), next_seq(c.seq(), b.applied()))
                }
                _ => CountWord::new(avail, false, None, next_seq(c.seq(), 0)),
            };
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
                    if let (Some((_, s)), Some(b), Some(_)) = (mine, book, op) {
                        // The book was `b` when the CAS succeeded; failure means a helper
                        // applied `new` already (or later transitions did, after helping).
                        let _ = s.book.compare_exchange(
                            b.0,
                            b.apply(new).0,
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

    /// Takes one permit if one is available.
    #[inline]
    pub(crate) fn try_acquire(&self, holder: Option<usize>) -> bool {
        if self.available() == 0 {
            return false;
        }
        self.transition(holder, |c, _| match c.avail() {
            0 => Plan::Refuse,
            n => Plan::Commit {
                avail: n - 1,
                book: Some(false),
            },
        })
        .is_some()
    }

    /// Returns one permit; `false` (and no change) if the pool is already full. The
    /// caller's held count goes down if it is positive; otherwise the release is
    /// untracked (a permit acquired by another process and handed over).
    #[inline]
    pub(crate) fn release(&self, holder: Option<usize>) -> bool {
        let max = self.max;
        self.transition(holder, |c, book| {
            if c.avail() >= max {
                return Plan::Refuse;
            }
            Plan::Commit {
                avail: c.avail() + 1,
                book: match book {
                    Some(b) if b.held() > 0 => Some(true),
                    _ => None,
                },
            }
        })
        .is_some()
    }

    /// Stops tracking one permit held by `holder` without returning it to the pool: it
    /// will not be reclaimed if the holder dies. `false` if the holder holds none.
    pub(crate) fn disown(&self, holder: usize) -> bool {
        self.transition(Some(holder), |c, book| match book {
            Some(b) if b.held() > 0 => Plan::Commit {
                avail: c.avail(),
                book: Some(true),
            },
            _ => Plan::Refuse,
        })
        .is_some()
    }

    /// Adds one to a counter (slow paths only).
    #[inline]
    pub(crate) fn bump(&self, index: usize) {
        self.add(index, 1);
    }

    /// Adds `n` to a counter (slow paths only).
    pub(crate) fn add(&self, index: usize, n: u64) {
        if let Some(c) = self.head.counters.get(index) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Loom crash point: `true` once this "process" has died (never outside loom).
    #[cfg(not(cxc_loom))]
    #[inline(always)]
    pub(crate) fn crash_here(&self) -> bool {
        false
    }

    /// Whether this "process" has died (never outside loom).
    #[cfg(not(cxc_loom))]
    #[inline(always)]
    pub(crate) fn stopped(&self) -> bool {
        false
    }

    #[cfg(cxc_loom)]
    pub(crate) fn crash_here(&self) -> bool {
        self.crash.is_some_and(CrashPlan::step)
    }

    #[cfg(cxc_loom)]
    pub(crate) fn stopped(&self) -> bool {
        self.crash.is_some_and(|p| p.stopped.get())
    }
}

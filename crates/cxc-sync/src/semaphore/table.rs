//! The holder table: claiming a slot, taking a dead holder's slot over, returning its
//! permits, freeing it.
//!
//! Owner-word transitions (`word::owner_word`):
//!
//! | from                      | to                        | by                         |
//! |---------------------------|---------------------------|----------------------------|
//! | free (0)                  | active(pid, tag)          | registration (`claim_free`) |
//! | active(dead process)      | reclaiming(me)            | a reclaimer (`take_over`)  |
//! | reclaiming(dead reclaimer)| reclaiming(me)            | the next reclaimer         |
//! | reclaiming(me), left by an earlier image (`exec`) | (kept)  | me, alone in this image (`holder.rs`) |
//! | reclaiming(me)            | free (0)                  | me, after `drain` (`free`) |

use super::layout::ctr;
use super::raw::{Plan, RawSemaphore};
use super::word::{
    BookWord, CountWord, Op, STATE_ACTIVE, STATE_RECLAIMING, owner_parts, owner_word,
};
use crate::primitive::Ordering;

impl RawSemaphore<'_> {
    /// Returns every permit held by slot `d` to the pool, one transition at a time, and
    /// leaves its held count 0. The caller must own the slot exclusively (it took it over
    /// with [`RawSemaphore::take_over`]): no one else authors transitions for it.
    pub(crate) fn drain(&self, d: usize) -> u32 {
        let Some(slot) = self.slots.get(d) else {
            return 0;
        };
        let max = self.max;
        let mut returned = 0;
        loop {
            let step = self.transition(Some(d), |c, book, _| match book {
                Some(b) if b.held() > 0 && c.avail() < max => Plan::Commit {
                    avail: c.avail() + 1,
                    op: Op::Release,
                },
                _ => Plan::Refuse,
            });
            if step.is_some() {
                returned += 1;
                continue;
            }
            if self.stopped() {
                return returned;
            }
            // Refused: nothing held, or the pool is full although the slot holds permits
            // (conservation says that cannot happen; only a corrupt file gets here).
            let c = CountWord(self.head.count.load(Ordering::SeqCst));
            if self.help(c).is_err() {
                continue;
            }
            let w = BookWord(slot.book.load(Ordering::Acquire));
            if w.held() == 0 {
                return returned;
            }
            if c.avail() < max {
                continue;
            }
            if slot
                .book
                .compare_exchange(w.0, w.emptied().0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.bump(ctr::OVER_HELD, 1);
                return returned;
            }
        }
    }

    /// The slot whose owner word is exactly `owner`, if any.
    pub(crate) fn find_owner(&self, owner: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.owner.load(Ordering::Acquire) == owner)
    }

    /// Claims a free slot for `owner`. The slot's book is `(0, applied)` (every free slot
    /// was drained before being freed), so the new owner starts with nothing held.
    pub(crate) fn claim_free(&self, owner: u64) -> Option<usize> {
        self.slots.iter().position(|s| {
            s.owner.load(Ordering::Relaxed) == 0
                // SYNC: owner (AcqRel; pairs with the Release in `free`: the drained book
                // is visible to the new owner).
                && s.owner
                    .compare_exchange(0, owner, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
        })
    }

    /// Takes slot `d` over for reclaim if its owner word is still `seen` (whose process
    /// the caller found dead). The new word names the caller (pid and identity tag), so a
    /// reclaimer that dies in turn can be superseded.
    pub(crate) fn take_over(&self, d: usize, seen: u64, reclaimer_pid: u32, tag: u32) -> bool {
        let Some(slot) = self.slots.get(d) else {
            return false;
        };
        let (state, _, _) = owner_parts(seen);
        if state != STATE_ACTIVE && state != STATE_RECLAIMING {
            return false;
        }
        slot.owner
            .compare_exchange(
                seen,
                owner_word(STATE_RECLAIMING, reclaimer_pid, tag),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Frees slot `d` after [`RawSemaphore::drain`]: the caller still owns it as
    /// `reclaimer`.
    pub(crate) fn free(&self, d: usize, reclaimer_pid: u32, tag: u32) -> bool {
        let Some(slot) = self.slots.get(d) else {
            return false;
        };
        // SYNC: owner (Release; pairs with the AcqRel claim in `claim_free`).
        slot.owner
            .compare_exchange(
                owner_word(STATE_RECLAIMING, reclaimer_pid, tag),
                0,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

//! Eviction of a dead or stalled writer, the quarantine of its staging buffer, and the
//! clean-up after a dead holder.

use super::layout::ctr;
use super::raw::RawRwLock;
use super::word::{BUFS, BufferFields, WRITER_MASK, Word, quarantine_tag};
use crate::park;
use crate::primitive::Ordering;

impl RawRwLock<'_> {
    /// Evicts the writer of `seen` (dead, or made no progress for a grace period): no
    /// writer, its staging buffer quarantined. `false` if that claim is no longer
    /// current (it ended, or someone else evicted it).
    pub(crate) fn evict(&self, seen: Word) -> bool {
        let mut cur = seen;
        loop {
            if cur.writer().is_none() || cur.id() != seen.id() {
                return false;
            }
            let mut next = cur.vacated();
            if let Some(b) = cur.stage() {
                if let Some(q) = self.head.qtag.get(b) {
                    // Before the Q bit can be seen (the CAS below is SeqCst).
                    q.fetch_max(quarantine_tag(cur), Ordering::AcqRel);
                }
                next = next.with_quarantined(b);
            }
            match self.head.state.compare_exchange(
                cur.0,
                next.0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                // The claim may still be the same (it published, or Q changed): retry
                // with the current staging buffer.
                Err(now) => cur = Word(now),
            }
        }
        self.wake_after_writer();
        true
    }

    /// Called by an evicted writer of `claim` that will store nothing more into its
    /// staging buffer: the buffer leaves quarantine.
    pub(crate) fn free_own_quarantine(&self, claim: Word) {
        if let Some(s) = claim.stage()
            && self.unquarantine(s, quarantine_tag(claim))
        {
            self.bump(ctr::QUARANTINE_FREED);
        }
    }

    /// Frees every quarantined buffer whose writer (holder slot) `dead` says is gone.
    pub(crate) fn reap_quarantine(&self, dead: impl Fn(usize) -> bool) {
        for b in 0..BUFS {
            if !self.word().is_quarantined(b) {
                continue;
            }
            let tag = self.head.qtag[b].load(Ordering::Acquire);
            let slot = (tag & WRITER_MASK) as usize;
            if slot != 0 && dead(slot - 1) && self.unquarantine(b, tag) {
                self.bump(ctr::QUARANTINE_REAPED);
            }
        }
    }

    /// Takes buffer `b` out of quarantine if it is still quarantined with tag `tag`;
    /// `false` if it was not (any more), or someone else freed it first.
    fn unquarantine(&self, b: usize, tag: u64) -> bool {
        let Some(q) = self.head.qtag.get(b) else {
            return false;
        };
        let mut cur = self.word();
        loop {
            if !cur.is_quarantined(b) || q.load(Ordering::Acquire) != tag {
                return false;
            }
            match self.head.state.compare_exchange(
                cur.0,
                cur.without_quarantined(b).0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = Word(now),
            }
        }
    }

    /// Returns holder slot `d` to the table: the caller took it over from a dead process
    /// (its owner word is now `mine`, a reclaiming word naming the caller). Drops the dead
    /// process's read holds, evicts it if it writes, frees every buffer quarantined for a
    /// writer of slot `d`, and only then frees the slot (owner word `mine` → 0). Returns
    /// the evicted writer's token, if it was evicted here.
    ///
    /// The quarantines go first: while the caller owns the slot nobody else writes as
    /// slot `d`, so every quarantine naming it is the dead process's (or an earlier
    /// owner's, gone too). Left to the reap after `reclaim_dead`'s loop, which judges a
    /// slot by its owner word, they would stay quarantined until the newcomer that took
    /// the freed slot meanwhile dies (`loom_reclaim_frees_the_dead_writers_quarantine`).
    pub(crate) fn reclaim_slot(&self, d: usize, mine: u64) -> Option<u64> {
        let evicted = self.drop_dead_slot(d);
        self.reap_quarantine(|s| s == d);
        if let Some(slot) = self.slots.get(d) {
            // SYNC: owner (Release; pairs with the AcqRel claim in `holder_slow`).
            let _ = slot
                .owner
                .compare_exchange(mine, 0, Ordering::Release, Ordering::Relaxed);
        }
        evicted
    }

    /// Drops every read hold of slot `d`, whose process died (the caller owns the slot
    /// exclusively: it took it over), and evicts it if it is the writer. Returns the
    /// evicted writer's token, if it was evicted here.
    pub(crate) fn drop_dead_slot(&self, d: usize) -> Option<u64> {
        let slot = self.slots.get(d)?;
        let w = self.word();
        let mut evicted = None;
        if w.writer() == Some(d) && self.evict(w) {
            self.bump(ctr::EVICTED_DEAD);
            evicted = Some(w.token());
        } else {
            // It may have died between releasing the write lock and waking the waiters.
            self.wake_after_writer();
        }
        // SYNC: park (an RMW on the word a draining writer re-checks), then wake it, even
        // if the count was 0 already: the reader may have died between its decrement
        // and its wake-up call (the loom model `loom_dead_reader_never_wedges_writer`).
        slot.readers.swap(0, Ordering::SeqCst);
        if park::has_sleepers(&self.head.dwake) {
            self.wake(&self.head.dwake, u32::MAX);
        }
        evicted
    }
}

//! This process's holder slot (cached per handle, keyed by pid) and reclaim of dead
//! holders.

use std::sync::atomic::Ordering;

use cxc_mmf::identity::Identity;

use super::error::SemaphoreError;
use super::handle::SharedSemaphore;
use super::layout::ctr;
use super::word::{
    BookWord, CountWord, STATE_ACTIVE, identity_tag, owner_parts, owner_word,
};
use crate::holders::{find_or_claim, reclaimable};
use crate::liveness;
use cxc_sidecar::Instrumented;

impl SharedSemaphore {
    /// This process's holder slot: cached; looked up or registered on first use (and
    /// again in a forked child). `None` if the table is full of live holders: then this
    /// process can neither take nor return a permit of its own (it never runs untracked).
    #[inline]
    pub(super) fn holder(&self) -> Option<usize> {
        self.holder
            .get(liveness::current_proc())
            .or_else(|| self.holder_slow().ok())
    }

    /// Registers this process in the holder table now (`open`/`create` do it already;
    /// a child made by `fork` registers again on first use).
    ///
    /// # Errors
    /// [`SemaphoreError::TableFull`] if every slot belongs to a live process (dead
    /// holders are reclaimed first to make room).
    pub fn register(&self) -> Result<(), SemaphoreError> {
        self.holder_slow().map(|_| ())
    }

    #[cold]
    pub(super) fn holder_slow(&self) -> Result<usize, SemaphoreError> {
        // A handle carried into another pid namespace (`unshare` + `fork`) is refused as
        // `open` refuses one opened there.
        super::error::check_namespace(self.map.info().layout.params[2])?;
        self.holder.register(|me| {
            let raw = self.raw();
            let owner = owner_word(STATE_ACTIVE, me.pid, identity_tag(me));
            find_or_claim(
                raw.find_owner(owner),
                || raw.claim_free(owner),
                || {
                    self.reclaim_scan(false);
                },
                |claimed| raw.bump(if claimed { ctr::REGISTERED } else { ctr::TABLE_FULL }, 1),
            )
            .ok_or(SemaphoreError::TableFull {
                capacity: self.map.slots().len() as u32,
            })
        })
    }

    /// Returns the permits of every holder whose process has died (the whole thread
    /// group gone, or its pid now names another process) and frees their slots. Also
    /// finishes reclaims abandoned by reclaimers that died. Returns the number of
    /// permits returned to the pool.
    pub fn reclaim_dead(&self) -> u32 {
        self.reclaim_noted(false)
    }

    /// [`reclaim_scan`](Self::reclaim_scan), recording what it returned.
    pub(super) fn reclaim_noted(&self, only_holding: bool) -> u32 {
        let n = self.reclaim_scan(only_holding);
        if n > 0 {
            self.note(cxc_sidecar::OpCode::SemReclaim, 0, u64::from(n));
        }
        n
    }

    /// The reclaim scan; `only_holding` skips dead holders that hold nothing (the
    /// blocked-acquirer variant, which only wants permits back).
    pub(super) fn reclaim_scan(&self, only_holding: bool) -> u32 {
        if crate::holders::foreign_namespace(self.map.info().layout.params[2]) {
            // From another pid namespace no holder can be judged (see `holder_slow`).
            return 0;
        }
        let raw = self.raw();
        raw.bump(ctr::RECLAIM_SCANS, 1);
        let me = Identity::current();
        let my_tag = identity_tag(&me);
        let mut total = 0;
        // The current count word's pending change, if any, is finished first (a holder
        // killed between its count CAS and its book update otherwise looks like one that
        // holds nothing, and the blocked-acquirer variant would skip it).
        let mut c = CountWord(raw.head.count.load(Ordering::Acquire));
        while let Err(now) = raw.help(c) {
            c = now;
        }
        for (d, slot) in raw.slots.iter().enumerate() {
            let seen = slot.owner.load(Ordering::Acquire);
            // The blocked-acquirer variant skips dead holders that hold nothing (the
            // author of the count word's change is never skipped: its change may be
            // pending again if it is still the author).
            let skip = only_holding
                && owner_parts(seen).0 == STATE_ACTIVE
                && c.author() != Some(d)
                && BookWord(slot.book.load(Ordering::Acquire)).held() == 0;
            if skip || !reclaimable(seen, me.pid, my_tag) || !raw.take_over(d, seen, me.pid, my_tag)
            {
                continue;
            }
            let returned = raw.drain(d);
            raw.free(d, me.pid, my_tag);
            raw.bump(ctr::RECLAIMED_PERMITS, u64::from(returned));
            raw.bump(ctr::RECLAIMED_HOLDERS, 1);
            total += returned;
        }
        if total > 0 {
            raw.wake_sleepers(total);
        }
        total
    }
}

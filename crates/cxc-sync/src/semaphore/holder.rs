//! This process's holder slot (cached per handle, keyed by pid) and reclaim of dead
//! holders.

use std::sync::atomic::Ordering;

use cxc_mmf::identity::Identity;

use super::error::SemaphoreError;
use super::handle::SharedSemaphore;
use super::layout::ctr;
use super::word::{
    BookWord, CountWord, STATE_ACTIVE, STATE_RECLAIMING, identity_tag, owner_parts, owner_word,
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
    /// holders are reclaimed first to make room); [`SemaphoreError::File`] (an `Io`
    /// error, "identify this process") while this process's identity cannot be read
    /// whole, e.g. a forked child out of file descriptors.
    pub fn register(&self) -> Result<(), SemaphoreError> {
        self.holder_slow().map(|_| ())
    }

    #[cold]
    pub(super) fn holder_slow(&self) -> Result<usize, SemaphoreError> {
        // A handle carried into another pid namespace (`unshare` + `fork`) is refused as
        // `open` refuses one opened there.
        super::error::check_namespace(self.map.info().layout.params[2])?;
        self.holder.register(self.map.path(), |me| {
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
    /// finishes reclaims abandoned by reclaimers that died, and those an earlier image of
    /// this process left (a draining thread ended by `exec`). Returns the number of
    /// permits returned to the pool. A reclaim running in a live process that is stopped
    /// is left to it: those permits come back when it continues or dies.
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
        let mine = owner_word(STATE_RECLAIMING, me.pid, my_tag);
        for (d, slot) in raw.slots.iter().enumerate() {
            let seen = slot.owner.load(Ordering::Acquire);
            // The blocked-acquirer variant skips dead holders that hold nothing (the
            // author of the count word's change is never skipped: its change may be
            // pending again if it is still the author).
            let skip = only_holding
                && owner_parts(seen).0 == STATE_ACTIVE
                && c.author() != Some(d)
                && BookWord(slot.book.load(Ordering::Acquire)).held() == 0;
            if skip {
                continue;
            }
            // A reclaim under this very identity that no thread of this image runs was
            // left by an earlier image of this process: an `exec` ended its draining
            // thread, and the identity (pid, pidfs inode or start time) stays. Finished
            // here, alone (`DrainGate`): while no other drain of this image runs, no
            // thread of it can be the one that took the slot over.
            let _gate = if seen == mine {
                match DrainGate::enter(true) {
                    Some(g) if slot.owner.load(Ordering::Acquire) == mine => g,
                    _ => continue,
                }
            } else {
                if !reclaimable(seen, me.pid, my_tag) {
                    continue;
                }
                let Some(g) = DrainGate::enter(false) else {
                    continue;
                };
                if !raw.take_over(d, seen, me.pid, my_tag) {
                    continue;
                }
                g
            };
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

/// The drains of dead holders this process image runs (from `take_over` to `free`), over
/// all its handles and threads: `token << 32 | EXCLUSIVE? | count`, keyed by the lineage
/// token so that a forked child, whose copy may count its parent's drains (threads it
/// does not have), starts from none.
static DRAINS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One drain's place in [`DRAINS`]; leaves it on drop.
struct DrainGate {
    exclusive: bool,
}

impl DrainGate {
    const EXCLUSIVE: u64 = 1 << 31;

    /// Enters as one more drain, or (`exclusive`) as the only one; `None` if that cannot
    /// be now (an exclusive drain runs, or any drain does). The caller skips the slot and
    /// a later scan (every 20 ms while an acquirer waits) tries again.
    fn enter(exclusive: bool) -> Option<DrainGate> {
        let me = u64::from(liveness::current_proc()) << 32;
        let mut v = DRAINS.load(Ordering::SeqCst);
        loop {
            let cur = if v & !0xFFFF_FFFF == me { v & 0xFFFF_FFFF } else { 0 };
            let next = match exclusive {
                true if cur != 0 => return None,
                true => me | Self::EXCLUSIVE,
                false if cur & Self::EXCLUSIVE != 0 => return None,
                false => me | (cur + 1),
            };
            match DRAINS.compare_exchange(v, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(DrainGate { exclusive }),
                Err(now) => v = now,
            }
        }
    }
}

impl Drop for DrainGate {
    fn drop(&mut self) {
        // The thread that entered leaves, in the same process: the token is unchanged.
        DRAINS.fetch_sub(
            if self.exclusive { Self::EXCLUSIVE } else { 1 },
            Ordering::SeqCst,
        );
    }
}

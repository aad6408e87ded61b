//! The identity table: which process stands behind the holder of a claim.
//!
//! A claim names its holder by a slot of this table (the claim word's holder field is the
//! slot index + 1). A slot records the pid the claims through it are made for (the seed
//! API's `my_pid`, usually the caller's own) and the identity of the process that
//! registered it — the process whose threads make those claims and write under them.
//! "The holder is dead" means that process's whole thread group is gone (see the identity
//! module), which is what makes a takeover mid-write safe.
//!
//! A process registers a slot per pid it claims for, the first time it claims, so handles
//! that never claim use none. Slot protocol: `state` 0 = free, `BUSY` = being written,
//! `VALID | version << 2` = valid. A writer CASes `state` from free (or from a valid state
//! of a dead, unreferenced process) to `BUSY`, stores `pid` and the identity, then stores
//! the next valid state (Release); a reader accepts a slot only if it loads the same valid
//! state before and after reading the fields.
//!
//! A slot is never rewritten while anything refers to it: the current claim word, or a
//! quarantine record of a buffer in quarantine. So a claim, or a quarantined buffer,
//! always names the process that made it, and a full table can only refuse new claimants
//! (no claim: `false` or `None`, or a wait for a slot), never make a dead holder look alive or a live one dead.

use crate::liveness::Liveness;
use crate::payload::BufferFields;
use crate::primitive::Ordering;

use super::os::{Identity, liveness};
use super::slot::{BUSY, IdentSlot, known};
use super::state::LeaseState;
use super::word::{BUFS, Word};

/// Serialises registration and unregistration within this process, so two handles of one
/// file never register two slots for the same pid, and a slot is never freed while a
/// handle of this process is about to use it. Held only on slow paths; fork-safe (a child
/// never waits for a lock its parent's thread held at the fork).
#[cfg(not(cxc_loom))]
pub(crate) static REGISTRY: crate::forklock::ForkSafeLock = crate::forklock::ForkSafeLock::new();

impl LeaseState {
    /// The holder value (slot + 1) of the slot registered by `me` for `pid`, registering
    /// one if needed. `None` if every slot belongs to a live process or is referenced.
    /// Handles call it holding [`REGISTRY`].
    pub(crate) fn register(&self, pid: u64, me: &Identity) -> Option<u8> {
        if pid as u32 == 0 {
            return None;
        }
        // 1. Already registered (never for an unknown identity: two processes whose
        // identities are both unknown must not share a slot).
        if let Some(h) = self.lookup(pid, me) {
            return Some(h);
        }
        // 2. A free slot.
        for (i, slot) in self.idents.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) == 0
                && slot
                    .state
                    .compare_exchange(0, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                slot.fill(0, pid, me);
                return Some(i as u8 + 1);
            }
        }
        // 3. The slot of a dead process that nothing refers to.
        for (i, slot) in self.idents.iter().enumerate() {
            let holder = i as u8 + 1;
            let s = slot.state.load(Ordering::Acquire);
            let Some((_, owner)) = slot.read() else {
                continue;
            };
            if self.slot_referenced(holder) || liveness(&owner) != Liveness::Dead {
                continue;
            }
            // (A takeover may quarantine a buffer of this process until the slot is BUSY;
            // nothing else can create a reference to a dead process.)
            if self.seize_unreferenced(holder, s) {
                slot.fill(s, pid, me);
                return Some(holder);
            }
        }
        None
    }

    /// The slot registered by `me` for `pid`, if any (no registration).
    pub(crate) fn lookup(&self, pid: u64, me: &Identity) -> Option<u8> {
        if !known(me) {
            return None;
        }
        self.idents
            .iter()
            .position(|s| s.read() == Some((pid, *me)))
            .map(|i| i as u8 + 1)
    }

    /// A handle of `me` starts using slot `holder` (caller holds [`REGISTRY`]).
    pub(crate) fn pin(&self, holder: u8) {
        if let Some(slot) = self.slot(holder) {
            slot.handles.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A handle of `me` stops using slot `holder` (caller holds [`REGISTRY`]). The last
    /// one frees the slot unless a claim or a quarantined buffer still refers to it (then
    /// it is reused once the process is gone). A forked child's copy of a handle does
    /// nothing: the slot is its parent's.
    pub(crate) fn unpin(&self, holder: u8, me: &Identity) {
        let Some(slot) = self.slot(holder) else {
            return;
        };
        let s = slot.state.load(Ordering::Acquire);
        match slot.read() {
            Some((_, owner)) if owner == *me => {}
            _ => return,
        }
        if slot.handles.fetch_sub(1, Ordering::AcqRel) != 1 || self.slot_referenced(holder) {
            return;
        }
        if self.seize_unreferenced(holder, s) {
            slot.state.store(0, Ordering::Release);
        }
    }

    /// Puts slot `holder` (registered by this process, pinned by the caller's handle) on
    /// this process's sentinel list if no handle has, and stores the sentinel's thread id
    /// in it (`sentinel.rs`). Also after an exec, whose sentinel ended (the word says
    /// `FUTEX_OWNER_DIED`): the new image's sentinel takes over the slot. Returns whether
    /// the caller's handle linked it (and must unlink it before unmapping). The caller
    /// holds [`REGISTRY`].
    #[cfg(all(target_os = "linux", not(cxc_loom)))]
    pub(crate) fn arm_sentinel(&self, holder: u8) -> bool {
        let Some(slot) = self.slot(holder) else {
            return false;
        };
        // Not armed: never, or by a handle since dropped, or the sentinel of an earlier
        // image of this process, which exec'd (the same process: its claims stay).
        if super::sentinel::armed(slot.sentinel.load(Ordering::Acquire)) {
            return false;
        }
        let Some(tid) = super::sentinel::link(&slot.robust) else {
            return false;
        };
        // SeqCst, before any claim this process makes through the slot from now on: a
        // claimant that sees such a claim sees this word too.
        slot.sentinel.store(tid, Ordering::SeqCst);
        true
    }

    /// Without a sentinel (not Linux): nothing to arm.
    #[cfg(not(all(target_os = "linux", not(cxc_loom))))]
    pub(crate) fn arm_sentinel(&self, _holder: u8) -> bool {
        false
    }

    /// Takes slot `holder` off this process's sentinel list and clears its sentinel word
    /// (the handle that linked it is going); waiters sleeping on the word look again.
    /// The caller holds [`REGISTRY`].
    #[cfg(all(target_os = "linux", not(cxc_loom)))]
    pub(crate) fn disarm_sentinel(&self, holder: u8) {
        if let Some(slot) = self.slot(holder) {
            super::sentinel::unlink(&slot.robust);
            super::sentinel::disarm(&slot.sentinel);
        }
    }

    #[cfg(not(all(target_os = "linux", not(cxc_loom))))]
    pub(crate) fn disarm_sentinel(&self, _holder: u8) {}

    /// The sentinel word of the current holder's slot and the value to sleep on, with
    /// `FUTEX_WAITERS` set in it (so the kernel wakes a sleeper when the holder's process
    /// starts to exit); `None` when the lease is vacant, held through `mine` (the
    /// caller's own slot) or by this very process, or its holder has no live sentinel.
    #[cfg(all(target_os = "linux", not(cxc_loom)))]
    pub(crate) fn sentinel_to_sleep_on(
        &self,
        mine: u8,
    ) -> Option<(&crate::primitive::AtomicU32, u32)> {
        use super::sentinel::{FUTEX_WAITERS, armed};
        let cur = self.word();
        if cur.is_vacant() || cur.holder() == mine {
            return None;
        }
        let slot = self.slot(cur.holder())?;
        // A holder in this very process cannot exit while we wait: nothing to sleep on.
        if slot
            .read()
            .is_some_and(|(_, id)| id == crate::liveness::Identity::current())
        {
            return None;
        }
        let word = &slot.sentinel;
        let mut v = word.load(Ordering::SeqCst);
        while armed(v) && v & FUTEX_WAITERS == 0 {
            match word.compare_exchange(v, v | FUTEX_WAITERS, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => v |= FUTEX_WAITERS,
                Err(actual) => v = actual,
            }
        }
        armed(v).then_some((word, v))
    }

    /// Without a sentinel (not Linux): none to sleep on.
    #[cfg(not(all(target_os = "linux", not(cxc_loom))))]
    #[allow(dead_code)]
    pub(crate) fn sentinel_to_sleep_on(
        &self,
        _mine: u8,
    ) -> Option<(&crate::primitive::AtomicU32, u32)> {
        None
    }

    /// Whether no thread of the process behind the claim `word` can run user code again
    /// (`cxc_mmf::identity::threads_stopped`: every thread in the kernel's exit, or the
    /// process dead). With the sentinel's mark, this is what lets a claimant take over at
    /// once: the mark says the process is exiting (or exec'd), this that none of its
    /// threads can still be in a critical section. Loom models only the mark.
    pub(crate) fn holder_stopped(&self, word: Word) -> bool {
        #[cfg(cxc_loom)]
        {
            let _ = word;
            true
        }
        #[cfg(not(cxc_loom))]
        self.holder_identity(word)
            .is_some_and(|id| cxc_mmf::identity::threads_stopped(&id))
    }

    /// Whether the process that registered slot `holder` is exiting or has exec'd, by its
    /// sentinel (`sentinel.rs`): then its claims are taken over as stale.
    #[inline]
    pub(crate) fn slot_exiting(&self, holder: u8) -> bool {
        self.slot(holder).is_some_and(|s| {
            s.sentinel.load(Ordering::Acquire) & super::slot::SENTINEL_EXITING != 0
        })
    }

    /// Takes slot `holder` (whose state word was `s`) to BUSY if nothing refers to it,
    /// re-checking under BUSY (a reference made before then puts `s` back). Returns
    /// whether the caller now owns the slot.
    fn seize_unreferenced(&self, holder: u8, s: u64) -> bool {
        let Some(slot) = self.slot(holder) else {
            return false;
        };
        if slot
            .state
            .compare_exchange(s, BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if self.slot_referenced(holder) {
            slot.state.store(s, Ordering::Release);
            return false;
        }
        true
    }

    /// Whether the claim word or a quarantine record refers to slot `holder`.
    fn slot_referenced(&self, holder: u8) -> bool {
        let w = self.word();
        if w.holder() == holder {
            return true;
        }
        (0..BUFS).any(|b| {
            w.is_quarantined(b) && (self.qowner[b].load(Ordering::Acquire) & 0xFF) as u8 == holder
        })
    }

    /// The slot behind holder value `holder` (slot + 1).
    fn slot(&self, holder: u8) -> Option<&IdentSlot> {
        self.idents.get(usize::from(holder).checked_sub(1)?)
    }

    /// The pid the claim `word` was made for (0 when vacant or unreadable).
    pub(crate) fn holder_pid(&self, word: Word) -> u32 {
        self.slot(word.holder())
            .and_then(IdentSlot::read)
            .map_or(0, |(pid, _)| pid as u32)
    }

    /// The identity of the process that made the claim `word`.
    pub(crate) fn holder_identity(&self, word: Word) -> Option<Identity> {
        self.slot(word.holder())
            .and_then(IdentSlot::read)
            .map(|(_, id)| id)
    }

    /// Liveness of the process registered in slot `holder`.
    pub(crate) fn slot_liveness(&self, holder: u8) -> Liveness {
        #[cfg(cxc_loom)]
        {
            if holder != 0 && self.loom_dead.load(Ordering::Acquire) & (1 << holder) != 0 {
                Liveness::Dead
            } else {
                Liveness::Unknown
            }
        }
        #[cfg(not(cxc_loom))]
        match self.slot(holder).and_then(IdentSlot::read) {
            Some((_, id)) => liveness(&id),
            None => Liveness::Unknown,
        }
    }

    /// Liveness of the holder of `word` by its recorded OS identity.
    pub(crate) fn holder_liveness(&self, word: Word) -> Liveness {
        self.slot_liveness(word.holder())
    }
}

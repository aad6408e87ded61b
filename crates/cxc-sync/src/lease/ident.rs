//! The identity table: which process (pid + start time) stands behind a pid in a claim.
//!
//! Every `OwnerLease` handle registers its process here when it is made, *before* it can
//! claim, so a claim word never exists without the identity already being readable: a
//! process killed right after its claim CAS is still recognised as dead. Lookups scan the
//! table by pid (slow paths only: takeover decisions and diagnostics).
//!
//! Slot protocol: `pid` word 0 = empty, `P` = valid, `P | WRITING` = being rewritten. A
//! writer CASes the pid word to `P | WRITING`, stores `start`, then stores `P` (Release).
//! A reader loads the pid word (Acquire), then `start` (Acquire), then the pid word again;
//! it accepts `start` only if both loads were `P`.
//!
//! Safety argument (no false "dead"): an entry for pid `P` is only ever written by a live
//! process whose pid is `P`, and a registering process first rewrites every entry that
//! already names its pid. So an entry for `P` names either the live process `P` or a dead
//! one whose pid was since reused by a process that has not registered (then it cannot
//! hold a claim made through a handle) — a stale entry can make a dead holder look alive
//! (falling back to heartbeats), never a live holder look dead.

use crate::liveness::{self, Liveness, ProcessIdentity};
use crate::primitive::{AtomicU64, Ordering};

use super::state::{GEN_MASK, IDX_BIT, LeaseState, counter, pid_of};

/// Number of identity slots per lease file.
pub(crate) const IDENT_SLOTS: usize = 16;
const WRITING: u64 = 1 << 32;

/// One identity slot.
#[repr(C)]
pub(crate) struct IdentSlot {
    pub(crate) pid: AtomicU64,
    pub(crate) start: AtomicU64,
}

impl IdentSlot {
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        IdentSlot {
            pid: AtomicU64::new(0),
            start: AtomicU64::new(0),
        }
    }

    /// Rewrites the slot from pid word `from` to `me`; false if the slot changed.
    fn write(&self, from: u64, me: ProcessIdentity) -> bool {
        if self
            .pid
            .compare_exchange(
                from,
                u64::from(me.pid) | WRITING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        self.start.store(me.start_time, Ordering::Release);
        // SYNC: ident slot. Pairs with the Acquire loads in `read`.
        self.pid.store(u64::from(me.pid), Ordering::Release);
        true
    }

    /// The start time recorded for `pid`, if this slot names it.
    fn read(&self, pid: u32) -> Option<u64> {
        let want = u64::from(pid);
        if self.pid.load(Ordering::Acquire) != want {
            return None;
        }
        let start = self.start.load(Ordering::Acquire);
        (self.pid.load(Ordering::Acquire) == want && start != 0).then_some(start)
    }
}

impl LeaseState {
    /// Records this process's identity (idempotent). Returns false if the table has no
    /// room; claims by this process then fail over by heartbeat only.
    pub(crate) fn register_identity(&self, me: ProcessIdentity) -> bool {
        if me.pid == 0 || me.start_time == 0 {
            return false;
        }
        let mine = u64::from(me.pid);
        for _ in 0..4 {
            // 1. Every entry naming our pid is ours now (the pid is unique among live
            //    processes): make sure it carries our start time.
            let mut found = false;
            for slot in &self.idents {
                let p = slot.pid.load(Ordering::Acquire);
                if p & !WRITING == mine {
                    let current = p == mine
                        && (slot.start.load(Ordering::Acquire) == me.start_time
                            || (slot.write(p, me) && {
                                // The entry named a dead process with our pid: a claim
                                // for this pid is that process's, abandoned.
                                self.vacate_dead_namesake(me.pid);
                                true
                            }));
                    if current {
                        found = true;
                    } else {
                        // Mid-rewrite by another handle of ours, or raced: rescan.
                        found = false;
                        break;
                    }
                }
            }
            if found {
                return true;
            }
            // 2. Take an empty slot, or one whose process is dead.
            for slot in &self.idents {
                let p = slot.pid.load(Ordering::Acquire);
                if p == 0 && slot.write(0, me) {
                    return true;
                }
            }
            // Never the entry of the current holder's pid: a dead holder must stay
            // provably dead, or a holder killed mid-write could never be superseded.
            let holder = u64::from(pid_of(self.claim.load(Ordering::Acquire)));
            for slot in &self.idents {
                let p = slot.pid.load(Ordering::Acquire);
                if p != 0 && p & WRITING == 0 && p != holder {
                    let start = slot.start.load(Ordering::Acquire);
                    if liveness::check(p as u32, start) == Liveness::Dead && slot.write(p, me) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Releases a claim held under `pid` by a dead process whose pid this process now
    /// has (found while registering). Its unfinished write, if any, is never published.
    fn vacate_dead_namesake(&self, pid: u32) {
        let cur = self.claim.load(Ordering::Acquire);
        if pid_of(cur) != pid {
            return;
        }
        let next = cur & (GEN_MASK | IDX_BIT);
        if self
            .claim
            .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            self.bump(counter::CLAIM_DEAD, 1);
            self.wake_waiters();
        }
    }

    /// The recorded start time of the process with `pid`, if any.
    pub(crate) fn identity_of(&self, pid: u32) -> Option<u64> {
        if pid == 0 {
            return None;
        }
        self.idents.iter().find_map(|s| s.read(pid))
    }

    /// The recorded start time of the holder of claim word `word`.
    pub(crate) fn holder_start(&self, word: u64) -> Option<u64> {
        self.identity_of(pid_of(word))
    }

    /// Liveness of the holder of `word` by its recorded OS identity (`/proc`).
    pub(crate) fn holder_liveness(&self, word: u64) -> Liveness {
        match self.holder_start(word) {
            Some(start) => liveness::check(pid_of(word), start),
            None => Liveness::Unknown,
        }
    }
}

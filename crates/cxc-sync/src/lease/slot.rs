//! One slot of the identity table (`ident.rs`): its layout and the seqlock-style protocol
//! by which it is written and read (`state` 0 = free, `BUSY` = being written,
//! `VALID | version << 2` = valid; a reader accepts the fields only if it loads the same
//! valid state before and after them).

#[cfg(not(cxc_loom))]
use zerocopy::{FromBytes, KnownLayout};

use crate::primitive::{AtomicU32, AtomicU64, Ordering};

use super::os::Identity;

/// Number of identity slots per lease file.
pub(crate) const IDENT_SLOTS: usize = 64;
pub(super) const BUSY: u64 = 1;
const VALID: u64 = 2;
const VERSION_ONE: u64 = 4;
/// `FUTEX_OWNER_DIED` in a slot's sentinel word: the registering process's sentinel
/// thread ended, so that process is exiting or has exec'd (`sentinel.rs`).
pub(crate) const SENTINEL_EXITING: u32 = 0x4000_0000;
/// Pid-word flag of a slot used by guards (`LeaseGuard`), which pid calls never match.
pub(crate) const PRIVATE_SLOT: u64 = 1 << 32;

/// Whether `id` names one process (an unknown identity must never match another).
pub(super) fn known(id: &Identity) -> bool {
    #[cfg(cxc_loom)]
    {
        id.pid != 0 && id.unique != 0
    }
    #[cfg(not(cxc_loom))]
    {
        id.is_known()
    }
}

/// The pid word of a slot for `pid` (guards: `private`).
pub(crate) fn pid_word(pid: u32, private: bool) -> u64 {
    u64::from(pid) | if private { PRIVATE_SLOT } else { 0 }
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// One identity slot (one cache line).
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C)]
    pub(crate) struct IdentSlot {
        pub(crate) state: AtomicU64,
        pub(crate) pid: AtomicU64,
        pub(crate) ident: [AtomicU64; 4],
        /// Handles of the registering process that use this slot (see `unpin`).
        pub(crate) handles: AtomicU32,
        /// The registering process's sentinel (`sentinel.rs`): its thread id while a
        /// handle keeps the slot on the sentinel's robust futex list, 0 when none; the
        /// kernel replaces the id by `FUTEX_OWNER_DIED` when that thread ends (the
        /// process exits or execs). Waiters set `FUTEX_WAITERS` to be woken then.
        pub(crate) sentinel: AtomicU32,
        /// The slot's entry in the sentinel's robust list (`struct robust_list`: the
        /// address of the next entry, in the registering process's address space). Only
        /// the registering process writes it and only its kernel reads it; nobody
        /// dereferences it.
        pub(crate) robust: AtomicU64,
    }
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<IdentSlot>() == 64);
/// Where the kernel finds a slot's sentinel word from its robust-list entry.
#[cfg(not(cxc_loom))]
pub(crate) const SENTINEL_FROM_ENTRY: isize = std::mem::offset_of!(IdentSlot, sentinel) as isize
    - std::mem::offset_of!(IdentSlot, robust) as isize;

impl IdentSlot {
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        IdentSlot {
            state: AtomicU64::new(0),
            pid: AtomicU64::new(0),
            ident: std::array::from_fn(|_| AtomicU64::new(0)),
            handles: AtomicU32::new(0),
            sentinel: AtomicU32::new(0),
            robust: AtomicU64::new(0),
        }
    }

    /// `(pid word, identity)` if the slot is valid. The pid word is the pid, with
    /// [`PRIVATE_SLOT`] for the slot of this process's guards.
    pub(crate) fn read(&self) -> Option<(u64, Identity)> {
        let s1 = self.state.load(Ordering::Acquire);
        if s1 & VALID == 0 {
            return None;
        }
        let pid = self.pid.load(Ordering::Acquire);
        let ident = Identity::from_words(std::array::from_fn(|i| {
            self.ident[i].load(Ordering::Acquire)
        }));
        // SYNC: ident slot. Pairs with the Release store of the valid state in `fill`.
        (self.state.load(Ordering::Acquire) == s1).then_some((pid, ident))
    }

    /// Writes the slot (the caller moved `state` to BUSY) and makes it valid.
    pub(super) fn fill(&self, from: u64, pid: u64, ident: &Identity) {
        self.pid.store(pid, Ordering::Relaxed);
        self.handles.store(0, Ordering::Relaxed);
        self.sentinel.store(0, Ordering::Relaxed);
        self.robust.store(0, Ordering::Relaxed);
        for (dst, w) in self.ident.iter().zip(ident.to_words()) {
            dst.store(w, Ordering::Relaxed);
        }
        let version = (from & !(VERSION_ONE - 1)).wrapping_add(VERSION_ONE);
        // SYNC: ident slot. Pairs with the Acquire loads in `read`.
        self.state.store(version | VALID, Ordering::Release);
    }
}

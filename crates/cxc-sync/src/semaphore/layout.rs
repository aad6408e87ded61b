//! The on-file structs: the 2880-byte head block and the 64-byte holder slots.
//!
//! Offsets are relative to the start of the block (the head block starts at byte 128 of
//! the file, after the cxc header; slot `i` at `128 + 2880 + 64 * i`). The normative table
//! is in `docs/shared-semaphore.md`.
//!
//! | offset | field       | type          | meaning                                     |
//! |--------|-------------|---------------|---------------------------------------------|
//! | 0      | `count`     | `u64`         | count word (`word::CountWord`)              |
//! | 8      | `wake`      | `u32`         | futex word: bit 0 sleepers flag, bits 1.. wake sequence |
//! | 12     | reserved    | `u32`         | 0                                           |
//! | 16     | `handed`    | `u64`         | handed book (`word::BookWord`): permits disowned, not yet released |
//! | 24     | reserved    | `[u64; 5]`    | 0                                           |
//! | 64     | `counters`  | `[u64; 16]`   | cumulative event counters (`ctr::*`)        |
//! | 192    | `handshake` | 64 bytes      | shared strategy (`cxc_sidecar::HandshakeHeader`) |
//! | 256    | `ring`      | 2624 bytes    | observation ring (`cxc_sidecar::ObservationRing`) |
//!
//! Slot: `owner: u64` at 0 (`word::owner_word`: pid and identity tag), `book: u64` at 8
//! (`word::BookWord`), 48 reserved bytes, so each process's book sits on its own cache
//! line.

use crate::primitive::{AtomicU32, AtomicU64};

crate::macros::file_layout! {
    /// The semaphore's fixed block.
    #[repr(C, align(64))]
    pub(crate) struct SemHead {
        /// The count word.
        pub(crate) count: AtomicU64,
        /// The futex word blocked acquirers sleep on.
        pub(crate) wake: AtomicU32,
        _reserved0: AtomicU32,
        /// The handed book: permits handed off by `Permit::disown`, not yet released.
        pub(crate) handed: AtomicU64,
        _reserved1: [AtomicU64; 5],
        /// Cumulative event counters, incremented on slow paths only (indices in [`ctr`]).
        pub(crate) counters: [AtomicU64; 16],
        /// Shared strategy (spin budget of blocked acquirers), see `cxc-sidecar`.
        pub(crate) handshake: cxc_sidecar::HandshakeHeader,
        /// Recent transitions, recorded while a `SidecarBox` observes a handle.
        pub(crate) ring: cxc_sidecar::ObservationRing,
    }

    /// One entry of the holder table: which process it belongs to and what it holds.
    #[repr(C, align(64))]
    pub(crate) struct HolderSlot {
        /// The owner word.
        pub(crate) owner: AtomicU64,
        /// The book word.
        pub(crate) book: AtomicU64,
        _reserved: [AtomicU64; 6],
    }
}

/// Size of [`SemHead`] in the file.
pub(crate) const HEAD_SIZE: u32 = 2880;
/// Size of one [`HolderSlot`] in the file.
pub(crate) const SLOT_SIZE: u32 = 64;

#[cfg(not(cxc_loom))]
const _: () = {
    assert!(size_of::<SemHead>() == HEAD_SIZE as usize);
    assert!(size_of::<HolderSlot>() == SLOT_SIZE as usize);
    assert!(std::mem::offset_of!(SemHead, wake) == 8);
    assert!(std::mem::offset_of!(SemHead, handed) == 16);
    assert!(std::mem::offset_of!(SemHead, counters) == 64);
    assert!(std::mem::offset_of!(HolderSlot, book) == 8);
};

crate::macros::counters! {
    /// Indices into [`SemHead::counters`].
    pub(crate) mod ctr {
        /// An acquire found no permit and entered the blocking path.
        CONTENDED = contended,
        /// A blocked acquirer went to sleep in the kernel.
        SLEEPS = sleeps,
        /// `acquire_timeout` gave up.
        TIMEOUTS = timeouts,
        /// A release (or reclaim) woke sleepers.
        WAKES = wakes,
        /// A release was refused because the pool was already at `max_permits`.
        OVERFLOW_REJECTED = overflow_rejected,
        /// Permits returned by reclaim from dead holders.
        RECLAIMED_PERMITS = reclaimed_permits,
        /// Dead holders' slots freed by reclaim.
        RECLAIMED_HOLDERS = reclaimed_holders,
        /// Holder slots registered.
        REGISTERED = registered,
        /// A registration found the holder table full of live processes and was refused.
        TABLE_FULL = table_full,
        /// Reclaim scans over the holder table.
        RECLAIM_SCANS = reclaim_scans,
        /// Held counts dropped by reclaim because the pool was already full (only a corrupt
        /// file can get there: every permit out is held or handed).
        OVER_HELD = over_held,
        /// Releases refused because the caller held no permit and none was handed off.
        NOT_HELD_REJECTED = not_held_rejected,
        /// Permits handed off with `Permit::disown`.
        DISOWNED = disowned,
    }
}

impl SemHead {
    /// A head in its initial state (`initial` of `max` permits available, the other
    /// `max - initial` handed, no author, sequence 0). Used by the loom models; the file
    /// is initialised in place by [`SemHead::init`].
    #[cfg(cxc_loom)]
    pub(crate) fn new(initial: u32, max: u32) -> Self {
        SemHead {
            count: AtomicU64::new(super::word::CountWord::initial(initial).0),
            wake: AtomicU32::new(0),
            _reserved0: AtomicU32::new(0),
            handed: AtomicU64::new(u64::from(max.saturating_sub(initial))),
            _reserved1: std::array::from_fn(|_| AtomicU64::new(0)),
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            handshake: cxc_sidecar::HandshakeHeader::new(),
            ring: cxc_sidecar::ObservationRing::new(),
        }
    }

    /// Initialises a zero-filled head in a file being created: `initial` permits
    /// available, the other `max - initial` counted as handed (out of the pool, held by
    /// no process: the first releases by processes without a permit return them).
    #[cfg(not(cxc_loom))]
    pub(crate) fn init(&self, initial: u32, max: u32) {
        use crate::primitive::Ordering;
        // Published by the file layer's init-state Release store.
        self.count.store(
            super::word::CountWord::initial(initial).0,
            Ordering::Relaxed,
        );
        self.handed
            .store(u64::from(max.saturating_sub(initial)), Ordering::Relaxed);
    }
}

impl HolderSlot {
    /// A free slot (loom models build the table on the heap).
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        HolderSlot {
            owner: AtomicU64::new(0),
            book: AtomicU64::new(0),
            _reserved: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

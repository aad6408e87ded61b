//! The on-file structs: the 3456-byte head block and the 64-byte holder slots.
//!
//! Offsets are relative to the start of the block (the head starts at byte 128 of the
//! file, after the cxc header; slot `i` at `128 + 3456 + 64 * i`). The normative table is
//! in `docs/shared-rwlock.md`.
//!
//! | offset | field      | type           | meaning                                      |
//! |--------|------------|----------------|----------------------------------------------|
//! | 0      | `state`    | `u64`          | state word (`word::Word`)                    |
//! | 8      | `beat`     | `u64`          | writer progress counter (write, beat, drain) |
//! | 16     | `rwake`    | `u32`          | futex word: readers waiting for the writer to leave |
//! | 20     | `wwake`    | `u32`          | futex word: writers waiting for the writer to leave |
//! | 24     | `dwake`    | `u32`          | futex word: the writer waiting for readers to leave |
//! | 28     | reserved   | `u32`          | 0                                            |
//! | 32     | `hwm`      | `u64`          | 1 + highest holder slot ever registered      |
//! | 40     | reserved   | `[u64; 3]`     | 0                                            |
//! | 64     | `qtag`     | `[u64; 8]`     | quarantine records (`word::quarantine_tag`)  |
//! | 128    | `counters` | `[u64; 16]`    | cumulative event counters (`ctr::*`)         |
//! | 256    | `bufs`     | `[[u64; 8]; 8]`| payload buffers, 64 bytes each               |
//! | 768    | `handshake`| `HandshakeHeader` | the shared strategy (`docs/sidecar.md`)   |
//! | 832    | `ring`     | `ObservationRing` | recent observations (2624 bytes)          |
//!
//! Slot: `owner: u64` at 0 (the semaphore's owner word: pid and identity tag),
//! `readers: u64` at 8 (read holds of that process), 48 reserved bytes, so each
//! process's read count sits on its own cache line.

use crate::primitive::{AtomicU32, AtomicU64};

/// Payload words per buffer.
pub(crate) const PAYLOAD_WORDS: usize = 8;
/// Largest payload `T` (bytes).
pub const PAYLOAD_BYTES: usize = PAYLOAD_WORDS * 8;

crate::macros::file_layout! {
    /// The lock's fixed block.
    #[repr(C, align(64))]
    pub(crate) struct RwHead {
        /// The state word.
        pub(crate) state: AtomicU64,
        /// Bumped by the writer when it writes (publishes) or beats, and every 20 ms while
        /// it waits for readers to leave (a lock moves the token instead): waiters that see
        /// neither this nor the token move for a grace period evict the writer.
        pub(crate) beat: AtomicU64,
        /// Readers blocked behind a writer sleep here.
        pub(crate) rwake: AtomicU32,
        /// Writers blocked behind a writer sleep here.
        pub(crate) wwake: AtomicU32,
        /// The writer waiting for readers to leave sleeps here.
        pub(crate) dwake: AtomicU32,
        _reserved0: AtomicU32,
        /// 1 + the highest holder slot ever registered (never shrinks): writers scan the
        /// read counts of slots below it.
        pub(crate) hwm: AtomicU64,
        _reserved1: [AtomicU64; 3],
        /// Quarantine records, one per buffer.
        pub(crate) qtag: [AtomicU64; 8],
        /// Cumulative event counters (indices in [`ctr`]).
        pub(crate) counters: [AtomicU64; 16],
        /// Payload buffers.
        pub(crate) bufs: [[AtomicU64; PAYLOAD_WORDS]; 8],
        /// The shared strategy of blocked callers (spin budget), set by a sidecar policy.
        pub(crate) handshake: cxc_sidecar::HandshakeHeader,
        /// Recent transitions and slow paths, recorded while a sidecar observes a handle.
        pub(crate) ring: cxc_sidecar::ObservationRing,
    }

    /// One entry of the holder table.
    #[repr(C, align(64))]
    pub(crate) struct RwSlot {
        /// The owner word (`semaphore::word::owner_word`).
        pub(crate) owner: AtomicU64,
        /// Read holds of the owning process.
        pub(crate) readers: AtomicU64,
        _reserved: [AtomicU64; 6],
    }
}

/// Size of [`RwHead`] in the file.
pub(crate) const HEAD_SIZE: u32 = 3456;
/// Size of one [`RwSlot`] in the file.
pub(crate) const SLOT_SIZE: u32 = 64;

#[cfg(not(cxc_loom))]
const _: () = {
    assert!(size_of::<RwHead>() == HEAD_SIZE as usize);
    assert!(size_of::<RwSlot>() == SLOT_SIZE as usize);
    assert!(std::mem::offset_of!(RwHead, beat) == 8);
    assert!(std::mem::offset_of!(RwHead, rwake) == 16);
    assert!(std::mem::offset_of!(RwHead, dwake) == 24);
    assert!(std::mem::offset_of!(RwHead, hwm) == 32);
    assert!(std::mem::offset_of!(RwHead, qtag) == 64);
    assert!(std::mem::offset_of!(RwHead, counters) == 128);
    assert!(std::mem::offset_of!(RwHead, bufs) == 256);
    assert!(std::mem::offset_of!(RwHead, handshake) == 768);
    assert!(std::mem::offset_of!(RwHead, ring) == 832);
    assert!(std::mem::offset_of!(RwSlot, readers) == 8);
};

crate::macros::counters! {
    /// Indices into [`RwHead::counters`].
    pub(crate) mod ctr {
        /// A read lock found a writer and entered the blocking path.
        READ_CONTENDED = read_contended,
        /// A write lock found a writer or readers and entered the blocking path.
        WRITE_CONTENDED = write_contended,
        /// A blocked caller went to sleep in the kernel.
        SLEEPS = sleeps,
        /// A timed lock gave up.
        TIMEOUTS = timeouts,
        /// Writers evicted because their process died.
        EVICTED_DEAD = evicted_dead,
        /// Writers evicted because they made no progress for a grace period.
        EVICTED_STALE = evicted_stale,
        /// Dead processes' holder slots reclaimed (their read holds dropped).
        RECLAIMED = reclaimed,
        /// Holder slots registered.
        REGISTERED = registered,
        /// Registrations refused: the table was full of live processes.
        TABLE_FULL = table_full,
        /// Writes, beats or unlocks of an evicted writer, refused.
        STALE_REJECTED = stale_rejected,
        /// Quarantined buffers freed by their (evicted, live) writer.
        QUARANTINE_FREED = quarantine_freed,
        /// Quarantined buffers freed because their writer's process died.
        QUARANTINE_REAPED = quarantine_reaped,
    }
    /// A snapshot of an rwlock's cumulative event counters
    /// ([`SharedRwLock::stats`](crate::SharedRwLock::stats)), field by field as in
    /// [`SharedRwLock::counters`](crate::SharedRwLock::counters).
    pub struct RwLockStats;
}

impl RwHead {
    /// A zeroed head (the initial state: no writer, buffer 0 published, token 0). Loom
    /// models build it on the heap; the file starts zero-filled.
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        RwHead {
            state: AtomicU64::new(0),
            beat: AtomicU64::new(0),
            rwake: AtomicU32::new(0),
            wwake: AtomicU32::new(0),
            dwake: AtomicU32::new(0),
            _reserved0: AtomicU32::new(0),
            hwm: AtomicU64::new(0),
            _reserved1: std::array::from_fn(|_| AtomicU64::new(0)),
            qtag: std::array::from_fn(|_| AtomicU64::new(0)),
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            bufs: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            handshake: cxc_sidecar::HandshakeHeader::new(),
            ring: cxc_sidecar::ObservationRing::new(),
        }
    }
}

impl RwSlot {
    /// A free slot (loom models build the table on the heap).
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        RwSlot {
            owner: AtomicU64::new(0),
            readers: AtomicU64::new(0),
            _reserved: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

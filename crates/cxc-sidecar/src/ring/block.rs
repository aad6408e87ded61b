//! [`ObservationRing`]: the in-file block, its construction and its two counters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use zerocopy::{FromBytes, KnownLayout};

use super::slot::{RING_CAPACITY, RingSlot};

cxc_mmf::atomic_layout! {
    /// A fixed-size, multi-producer, lossy ring of [`Observation`]s, stored in a primitive's
    /// file so any process (or the `cxc` CLI) can read recent events.
    ///
    /// It is an in-file view: `#[repr(C, align(64))]`, only `AtomicU64`s, 2624 bytes, and an
    /// all-zero ring is a valid empty ring, so a primitive embeds it in its fixed block and a
    /// freshly created (zero-filled) file needs no initialisation. Any number of threads and
    /// processes may [`record`](Self::record) at once; readers ([`read_since`](Self::read_since))
    /// validate every entry and never return a torn one. When producers outpace a reader, the
    /// oldest entries are overwritten and the reader is told how many it lost.
    ///
    /// | offset | size | field                                   |
    /// |-------:|-----:|-----------------------------------------|
    /// | 0      | 8    | `head`: tickets taken (= events recorded) |
    /// | 8      | 8    | `dropped`: producers that lost their slot to a later lap |
    /// | 16     | 48   | reserved, zero                          |
    /// | 64     | 2560 | 64 slots of 40 bytes: `seq`, `timestamp`, `meta`, `arg`, `check` |
    ///
    /// # Examples
    /// ```
    /// use cxc_sidecar::{ObservationRing, OpCode};
    ///
    /// let ring = ObservationRing::new(); // in a file: a field of the primitive's fixed block
    /// ring.record(OpCode::LeaseRelease, 0, 7);
    /// let batch = ring.read_since(0);
    /// assert_eq!(batch.observations.len(), 1);
    /// assert_eq!(batch.observations[0].op, OpCode::LeaseRelease);
    /// assert_eq!((batch.next, batch.lost), (1, 0));
    /// ```
    #[derive(FromBytes, KnownLayout)]
    #[repr(C, align(64))]
    pub struct ObservationRing {
        pub(super) head: AtomicU64,
        pub(super) dropped: AtomicU64,
        pub(super) _reserved: [AtomicU64; 6],
        pub(super) slots: [RingSlot; RING_CAPACITY],
    }
}

const _: () = assert!(size_of::<RingSlot>() == 40);
const _: () = assert!(size_of::<ObservationRing>() == 2624);
const _: () = assert!(align_of::<ObservationRing>() == 64);
const _: () = assert!(std::mem::offset_of!(ObservationRing, slots) == 64);

impl Default for ObservationRing {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ObservationRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservationRing")
            .field("head", &self.head())
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl ObservationRing {
    /// An empty ring (the same state as all-zero bytes in a file). For rings on the heap,
    /// e.g. in tests and loom models; a file needs no initialisation.
    pub const fn new() -> Self {
        ObservationRing {
            head: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            _reserved: [const { AtomicU64::new(0) }; 6],
            slots: [const { RingSlot::new() }; RING_CAPACITY],
        }
    }

    /// Number of entries retained ([`RING_CAPACITY`]).
    pub const fn capacity(&self) -> usize {
        RING_CAPACITY
    }

    /// Tickets taken so far: the number of events ever recorded into this ring (by all
    /// processes, including entries since overwritten or dropped).
    #[inline]
    pub fn head(&self) -> u64 {
        // Relaxed: it only bounds which positions to look at; every entry is validated by
        // its own slot's sequence word and checksum.
        self.head.load(Ordering::Relaxed)
    }

    /// Producers that lost their slot to a producer one lap ahead before they could
    /// publish (their entries are among the readers' `lost`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

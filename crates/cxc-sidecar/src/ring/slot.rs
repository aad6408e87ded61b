//! One ring slot and the encodings of its words: sequence word, meta word, checksum.

use std::sync::atomic::AtomicU64;

use zerocopy::{FromBytes, KnownLayout};

/// Number of observations a ring retains.
pub const RING_CAPACITY: usize = 64;
pub(super) const CAP: u64 = RING_CAPACITY as u64;

/// Rounds a reader waits for an unfinished entry: first spins, then yields.
pub(super) const PENDING_SPINS: u32 = 64;
pub(super) const PENDING_YIELDS: u32 = 8;
/// The most one `read_since` waits for unfinished entries in all: a yield can cost a
/// whole scheduler slice on a busy machine, and a lap of tickets taken by producers that
/// died before writing would otherwise cost 64 × 8 of them.
pub(super) const PENDING_BUDGET: std::time::Duration = std::time::Duration::from_micros(200);

cxc_mmf::atomic_layout! {
    /// One entry: five words, 40 bytes.
    ///
    /// `pub` only because `ObservationRing`'s derived `KnownLayout` names the type of its last
    /// field in a public impl; the module is private, so the type cannot be named outside.
    #[derive(Debug, FromBytes, KnownLayout)]
    #[repr(C)]
    #[allow(unreachable_pub)]
    pub struct RingSlot {
        /// Sequence word (see the module docs).
        pub(super) seq: AtomicU64,
        /// `CLOCK_MONOTONIC` nanoseconds.
        pub(super) timestamp: AtomicU64,
        /// `pid | op << 32 | flags << 48`.
        pub(super) meta: AtomicU64,
        /// The op's argument.
        pub(super) arg: AtomicU64,
        /// [`checksum`] over the ticket and the three words above.
        pub(super) check: AtomicU64,
    }
}

impl RingSlot {
    pub(super) const fn new() -> Self {
        RingSlot {
            seq: AtomicU64::new(0),
            timestamp: AtomicU64::new(0),
            meta: AtomicU64::new(0),
            arg: AtomicU64::new(0),
            check: AtomicU64::new(0),
        }
    }
}

#[inline]
pub(super) const fn writing(ticket: u64) -> u64 {
    ticket.wrapping_mul(2).wrapping_add(1)
}

#[inline]
pub(super) const fn published(ticket: u64) -> u64 {
    ticket.wrapping_mul(2).wrapping_add(2)
}

/// The ticket named by a non-zero sequence word.
#[inline]
pub(super) const fn ticket_of(seq: u64) -> u64 {
    (seq - 1) / 2
}

#[inline]
pub(super) const fn pack_meta(pid: u32, code: u16, flags: u16) -> u64 {
    pid as u64 | (code as u64) << 32 | (flags as u64) << 48
}

#[inline]
pub(super) const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The per-entry checksum: a 64-bit hash of the ticket and the three data words.
#[inline]
pub(super) const fn checksum(ticket: u64, timestamp: u64, meta: u64, arg: u64) -> u64 {
    let mut h = fmix64(ticket ^ 0x6a09_e667_f3bc_c909);
    h = fmix64(h ^ timestamp.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    h = fmix64(h ^ meta.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    fmix64(h ^ arg.wrapping_mul(0x94d0_49bb_1331_11eb))
}

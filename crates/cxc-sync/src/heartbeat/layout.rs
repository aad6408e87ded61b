//! The heartbeat file's shared state: the fixed block ([`HeartbeatHead`]), one 64-byte
//! [`HeartbeatSlot`] per worker, and the bit encodings of the slot words.
//!
//! Offsets are relative to the start of the block (the file header is 128 bytes, so the
//! head starts at file offset 128 and slot `i` at `128 + 2880 + 64 * i`). `docs/heartbeat.md`
//! has the same table.
//!
//! # Slot words
//!
//! ```text
//! owner      63........32 31..........1 0
//!            pid          generation    FENCED
//! lo / hi    63........32 31..................0
//!            tag          in-flight bits 0..31 (lo) / 32..63 (hi)
//! id_gen     63.....33 32     31    30..........0
//!            0         MIXED  BUSY  generation the id_* words belong to
//! ```
//!
//! `id_unique`, `id_pidns`, `id_boot` hold the [`Identity`](cxc_mmf::identity::Identity)
//! of the process the slot was registered for (its pid is the owner word's), each XORed
//! with a mix of the generation ([`id_word`]). The registrant takes them after its owner
//! CAS by a CAS on `id_gen` (`generation | BUSY`), writes each word by CAS, and ends with
//! `generation | MIXED`; a registrant that stalled and was replaced cannot overwrite a
//! newer one's words (`write_identity` in `slot.rs`). They are read only when `id_gen` is
//! the owner word's generation with MIXED before and after the read. (A record written
//! by an earlier release, without MIXED, reads as unknown.)
//!
//! A *tag* is the low half of an owner word (`generation << 1 | FENCED`). A bitmap half is
//! writable by a worker only while its tag is the worker's live tag, so every worker write
//! is a CAS that fails once the watchdog or a new registration retagged the half.
//!
//! | owner word                 | state   | meaning                                      |
//! |----------------------------|---------|----------------------------------------------|
//! | `pid == 0`                 | FREE    | never used, or unregistered with no bits     |
//! | `pid != 0`, FENCED clear   | LIVE    | registered worker `(pid, generation)`        |
//! | `pid != 0`, FENCED set     | FENCED  | declared dead or unregistered; owner locked out |

use crate::primitive::AtomicU64;

/// Largest slot count a table may have.
pub const MAX_CAPACITY: usize = 65_536;

/// The FENCED flag of an owner word / tag.
pub(crate) const FENCED_BIT: u64 = 1;
/// Generations are 31 bits wide.
pub(crate) const GEN_MASK: u32 = 0x7FFF_FFFF;

/// Builds an owner word.
#[inline]
pub(crate) const fn owner_word(pid: u32, generation: u32, fenced: bool) -> u64 {
    ((pid as u64) << 32) | (((generation & GEN_MASK) as u64) << 1) | fenced as u64
}

/// The pid of an owner word (0: free).
#[inline]
pub(crate) const fn pid_of(owner: u64) -> u32 {
    (owner >> 32) as u32
}

/// The generation of an owner word or tag.
#[inline]
pub(crate) const fn gen_of(owner_or_tag: u64) -> u32 {
    ((owner_or_tag as u32) >> 1) & GEN_MASK
}

/// Whether generation `a` is newer than `b` (31-bit wrapping order: up to 2³⁰
/// registrations ahead).
#[inline]
pub(crate) const fn gen_newer(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b) & GEN_MASK;
    d != 0 && d < 1 << 30
}

/// `id_gen` flag: the registration of the low 31 bits is writing the identity words.
pub(crate) const ID_BUSY: u64 = 1 << 31;
/// `id_gen` flag: the identity words are complete and stored mixed ([`id_word`]).
pub(crate) const ID_MIXED: u64 = 1 << 32;

/// Identity word `index` (0 `unique`, 1 `pidns`, 2 `boot`) as stored for `generation`,
/// or back (the mix is an XOR): the value XOR an odd multiple of the generation and the
/// index, so one registration's words differ from every other generation's, even for
/// the same process (see `write_identity` in `slot.rs`).
#[inline]
pub(crate) const fn id_word(value: u64, generation: u32, index: usize) -> u64 {
    value ^ ((generation as u64) | ((index as u64 + 1) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Whether the FENCED flag is set.
#[inline]
pub(crate) const fn is_fenced(owner_or_tag: u64) -> bool {
    owner_or_tag & FENCED_BIT != 0
}

/// The tag (low 32 bits) of an owner word.
#[inline]
pub(crate) const fn tag_of(owner: u64) -> u32 {
    owner as u32
}

/// The live tag of a generation.
#[inline]
pub(crate) const fn live_tag(generation: u32) -> u32 {
    (generation & GEN_MASK) << 1
}

/// The fenced tag of a generation.
#[inline]
pub(crate) const fn fenced_tag(generation: u32) -> u32 {
    live_tag(generation) | 1
}

/// Builds a bitmap-half word.
#[inline]
pub(crate) const fn half_word(tag: u32, bits: u32) -> u64 {
    ((tag as u64) << 32) | bits as u64
}

/// The tag of a bitmap-half word.
#[inline]
pub(crate) const fn half_tag(half: u64) -> u32 {
    (half >> 32) as u32
}

/// The in-flight bits of a bitmap-half word.
#[inline]
pub(crate) const fn half_bits(half: u64) -> u32 {
    half as u32
}

/// The generation after `generation` (31-bit wrap, skipping 0 so a live tag is never 0).
#[inline]
pub(crate) const fn next_gen(generation: u32) -> u32 {
    let n = generation.wrapping_add(1) & GEN_MASK;
    if n == 0 { 1 } else { n }
}

crate::macros::counters! {
    /// Indices into the heartbeat file's `counters` array (cumulative event counts,
    /// transitions and slow paths only). Read them with `HeartbeatTable::counters`.
    pub mod counter [16] {
        /// Successful `register` calls.
        REGISTER = register,
        /// Registrations that reused a fenced or freed slot.
        REUSE_FENCED = reuse_fenced,
        /// Registrations that reused a slot whose owner was dead by OS identity.
        REUSE_OS_DEAD = reuse_os_dead,
        /// `register` calls that failed with `TableFull`.
        TABLE_FULL = table_full,
        /// Successful `unregister` calls.
        UNREGISTER = unregister,
        /// Watchdog scans.
        SCAN = scan,
        /// Dead-slot entries reported by scans.
        DEAD_REPORTED = dead_reported,
        /// Of those, slots reported dead by OS identity while their lag was within grace.
        OS_DEAD_DETECTED = os_dead_detected,
        /// Successful fencing transitions (LIVE -> FENCED) by a watchdog.
        FENCE = fence,
        /// In-flight bits returned by `reclaim`.
        RECLAIMED_BITS = reclaimed_bits,
        /// In-flight bits erased by `clear_dead_bitmap`.
        CLEARED_BITS = cleared_bits,
        /// `beat`/`mark_in_flight`/`clear_in_flight` refused because the caller was fenced
        /// or its slot was taken over.
        FENCED_REJECT = fenced_reject,
        /// Snapshots abandoned after the bounded number of retries.
        SNAPSHOT_GIVEUP = snapshot_giveup,
        /// Calls with a slot index or bit outside the table.
        OUT_OF_RANGE = out_of_range,
        /// Idle stale slots fenced by `sweep_idle`.
        SWEPT_IDLE = swept_idle,
    }
    /// A snapshot of a heartbeat table's cumulative event counters
    /// ([`HeartbeatTable::stats`](crate::HeartbeatTable::stats)), field by field as in
    /// [`heartbeat_counter`](crate::heartbeat_counter).
    pub struct HeartbeatStats;
}

crate::macros::file_layout! {
    /// The fixed block after the file header (2880 bytes).
    ///
    /// | offset | field          | meaning                                            |
    /// |-------:|----------------|----------------------------------------------------|
    /// | 0      | `global_epoch` | manual epoch counter (also the offset in clock mode) |
    /// | 8      | `_reserved`    | zero                                               |
    /// | 64     | `counters`     | `[u64; 16]` event counters, see [`counter`]        |
    /// | 192    | `handshake`    | shared strategy block (`cxc-sidecar`)              |
    /// | 256    | `ring`         | observation ring (`cxc-sidecar`), 2624 bytes       |
    #[repr(C, align(64))]
    #[cfg_attr(cxc_loom, allow(dead_code))]
    pub(crate) struct HeartbeatHead {
        pub(crate) global_epoch: AtomicU64,
        pub(crate) _reserved: [AtomicU64; 7],
        pub(crate) counters: [AtomicU64; counter::COUNT],
        pub(crate) handshake: cxc_sidecar::HandshakeHeader,
        pub(crate) ring: cxc_sidecar::ObservationRing,
    }

    /// One worker's slot: exactly one cache line.
    ///
    /// | offset | field        | meaning                                              |
    /// |-------:|--------------|------------------------------------------------------|
    /// | 0      | `owner`      | pid / generation / FENCED                            |
    /// | 8      | `last_seen`  | epoch of the last beat (monotone per registration)   |
    /// | 16     | `lo`         | tag / in-flight bits 0..31                           |
    /// | 24     | `hi`         | tag / in-flight bits 32..63                          |
    /// | 32     | `id_unique`  | identity of the registered process: pidfs inode or start time |
    /// | 40     | `id_pidns`   | identity: pid namespace inode                        |
    /// | 48     | `id_boot`    | identity: boot id hash                               |
    /// | 56     | `id_gen`     | generation of the `id_*` words · BUSY · MIXED (module docs) |
    #[repr(C, align(64))]
    pub(crate) struct HeartbeatSlot {
        pub(crate) owner: AtomicU64,
        pub(crate) last_seen: AtomicU64,
        pub(crate) lo: AtomicU64,
        pub(crate) hi: AtomicU64,
        pub(crate) id_unique: AtomicU64,
        pub(crate) id_pidns: AtomicU64,
        pub(crate) id_boot: AtomicU64,
        pub(crate) id_gen: AtomicU64,
    }
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<HeartbeatHead>() == 2880);
#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<HeartbeatSlot>() == 64);
#[cfg(not(cxc_loom))]
const _: () = assert!(std::mem::offset_of!(HeartbeatHead, counters) == 64);

impl HeartbeatSlot {
    /// A never-used slot: owner FREE (generation 0), both halves fenced for generation 0.
    /// `create` writes the same values into the file.
    #[cfg_attr(not(cxc_loom), allow(dead_code))]
    pub(crate) fn new_free() -> Self {
        HeartbeatSlot {
            owner: AtomicU64::new(0),
            last_seen: AtomicU64::new(0),
            lo: AtomicU64::new(half_word(fenced_tag(0), 0)),
            hi: AtomicU64::new(half_word(fenced_tag(0), 0)),
            id_unique: AtomicU64::new(0),
            id_pidns: AtomicU64::new(0),
            id_boot: AtomicU64::new(0),
            id_gen: AtomicU64::new(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        let w = owner_word(0xDEAD_BEEF, 12345, false);
        assert_eq!(pid_of(w), 0xDEAD_BEEF);
        assert_eq!(gen_of(w), 12345);
        assert!(!is_fenced(w));
        assert!(is_fenced(w | FENCED_BIT));
        assert_eq!(tag_of(w), live_tag(12345));
        assert_eq!(fenced_tag(7) as u64, tag_of(owner_word(1, 7, true)) as u64);
        let h = half_word(live_tag(9), 0x8000_0001);
        assert_eq!(half_tag(h), live_tag(9));
        assert_eq!(half_bits(h), 0x8000_0001);
        assert_eq!(next_gen(GEN_MASK), 1);
        assert_eq!(next_gen(0), 1);
    }
}

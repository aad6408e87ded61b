//! The fixed 128-byte file header every cxc file starts with.
//!
//! The normative offset table is `docs/memory-layout.md`; the constants here are that table.
//! All fields are little-endian on little-endian machines (native order); the byte-order
//! mark detects a file written with the other order.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// The header length in bytes. The primitive's body starts right after it.
pub const HEADER_LEN: usize = 128;
/// `b"CXC-MMF\0"` read as a native `u64`.
pub const MAGIC: u64 = u64::from_ne_bytes(*b"CXC-MMF\0");
/// The on-file format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 4;
/// Byte-order mark as written by this machine.
pub const ENDIAN_MARK: u32 = 0x0102_0304;
/// Largest file this build will create or map (1 GiB).
pub const MAX_FILE_LEN: u64 = 1 << 30;

/// Init-state: the creator has not finished.
pub const INIT_UNINIT: u32 = 0;
/// Init-state: every byte of the file is written; openers may validate and map it.
pub const INIT_READY: u32 = 0x5245_4459; // "READY"-ish, so a zero-filled file is not ready

/// The 128-byte header as it lies in a file (the table in `docs/memory-layout.md`). The
/// memory is shared with other processes, so every field is an atomic; the layout is
/// `#[repr(C)]` with explicit padding, and [`off`] is derived from it.
#[repr(C)]
#[derive(Debug)]
pub struct FileHeader {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`FORMAT_VERSION`].
    pub version: AtomicU32,
    /// [`ENDIAN_MARK`] as written by the creator.
    pub endian: AtomicU32,
    /// The primitive's [`Kind`] code.
    pub kind: AtomicU32,
    /// The header length (always [`HEADER_LEN`]).
    pub header_len: AtomicU32,
    /// The total file length.
    pub total_len: AtomicU64,
    /// The size of the primitive's fixed block.
    pub head_size: AtomicU32,
    /// The size of one slot.
    pub slot_size: AtomicU32,
    /// The number of slots.
    pub capacity: AtomicU64,
    /// The payload type's size.
    pub payload_size: AtomicU32,
    /// The payload type's alignment.
    pub payload_align: AtomicU32,
    /// The payload type's name hash.
    pub type_hash: AtomicU64,
    /// The primitive's parameters.
    pub params: [AtomicU64; 4],
    /// The creator's pid.
    pub creator_pid: AtomicU32,
    /// Zero.
    pub _pad0: AtomicU32,
    /// The creator's start time (clock ticks since boot).
    pub creator_start: AtomicU64,
    /// The init-state word, stored last by the creator ([`INIT_READY`]).
    pub init_state: AtomicU32,
    /// Zero.
    pub _pad1: AtomicU32,
    /// FNV-1a over the native bytes of the fields before [`init_state`](Self::init_state).
    pub checksum: AtomicU64,
}

const _: () = assert!(size_of::<FileHeader>() == HEADER_LEN && align_of::<FileHeader>() == 8);

/// Byte offsets of the header fields, from [`FileHeader`] (see `docs/memory-layout.md`).
pub mod off {
    use super::FileHeader;
    use std::mem::offset_of;

    /// `u64` magic.
    pub const MAGIC: usize = offset_of!(FileHeader, magic);
    /// `u32` format version.
    pub const VERSION: usize = offset_of!(FileHeader, version);
    /// `u32` byte-order mark.
    pub const ENDIAN: usize = offset_of!(FileHeader, endian);
    /// `u32` primitive kind code.
    pub const KIND: usize = offset_of!(FileHeader, kind);
    /// `u32` header length (always 128).
    pub const HEADER_LEN: usize = offset_of!(FileHeader, header_len);
    /// `u64` total file length.
    pub const TOTAL_LEN: usize = offset_of!(FileHeader, total_len);
    /// `u32` size of the primitive's fixed block.
    pub const HEAD_SIZE: usize = offset_of!(FileHeader, head_size);
    /// `u32` size of one slot.
    pub const SLOT_SIZE: usize = offset_of!(FileHeader, slot_size);
    /// `u64` number of slots.
    pub const CAPACITY: usize = offset_of!(FileHeader, capacity);
    /// `u32` payload size.
    pub const PAYLOAD_SIZE: usize = offset_of!(FileHeader, payload_size);
    /// `u32` payload alignment.
    pub const PAYLOAD_ALIGN: usize = offset_of!(FileHeader, payload_align);
    /// `u64` payload type-name hash.
    pub const TYPE_HASH: usize = offset_of!(FileHeader, type_hash);
    /// `[u64; 4]` primitive parameters.
    pub const PARAMS: usize = offset_of!(FileHeader, params);
    /// `u32` creator pid.
    pub const CREATOR_PID: usize = offset_of!(FileHeader, creator_pid);
    /// `u64` creator start time (clock ticks since boot).
    pub const CREATOR_START: usize = offset_of!(FileHeader, creator_start);
    /// `u32` init-state word, stored last by the creator.
    pub const INIT_STATE: usize = offset_of!(FileHeader, init_state);
    /// `u64` checksum over bytes 0..112.
    pub const CHECKSUM: usize = offset_of!(FileHeader, checksum);

    // The documented table (`docs/memory-layout.md`): a field that moves is a new format.
    const _: () = assert!(
        MAGIC == 0
            && VERSION == 8
            && ENDIAN == 12
            && KIND == 16
            && HEADER_LEN == 20
            && TOTAL_LEN == 24
            && HEAD_SIZE == 32
            && SLOT_SIZE == 36
            && CAPACITY == 40
            && PAYLOAD_SIZE == 48
            && PAYLOAD_ALIGN == 52
            && TYPE_HASH == 56
            && PARAMS == 64
            && CREATOR_PID == 96
            && CREATOR_START == 104
            && INIT_STATE == 112
            && CHECKSUM == 120
    );
}

/// Which primitive a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// `OwnerLease<T>`.
    Lease,
    /// `HeartbeatTable`.
    Heartbeat,
    /// `SharedSemaphore`.
    Semaphore,
    /// `SharedCell<T>` (a `SeqLock<T>` in a file).
    Cell,
    /// `SharedRwLock<T>`.
    RwLock,
    /// A test-only kind, for exercising the file layer itself.
    Test,
}

impl Kind {
    /// The on-file code.
    pub const fn code(self) -> u32 {
        match self {
            Kind::Lease => 1,
            Kind::Heartbeat => 2,
            Kind::Semaphore => 3,
            Kind::Cell => 4,
            Kind::RwLock => 5,
            Kind::Test => 0xFF,
        }
    }

    /// The kind for an on-file code, if known.
    pub const fn from_code(code: u32) -> Option<Kind> {
        match code {
            1 => Some(Kind::Lease),
            2 => Some(Kind::Heartbeat),
            3 => Some(Kind::Semaphore),
            4 => Some(Kind::Cell),
            5 => Some(Kind::RwLock),
            0xFF => Some(Kind::Test),
            _ => None,
        }
    }

    /// Lower-case name, as the CLI prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Lease => "lease",
            Kind::Heartbeat => "heartbeat",
            Kind::Semaphore => "semaphore",
            Kind::Cell => "cell",
            Kind::RwLock => "rwlock",
            Kind::Test => "test",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Size, alignment and a stable hash of the payload type's name.
///
/// The name hash is FNV-1a over [`core::any::type_name`]; it catches a file created for
/// `Foo` being opened as `Bar` of the same size. (Type names are stable for a given
/// compiler; processes sharing a file should be built from the same source.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeFingerprint {
    /// `size_of::<T>()`.
    pub size: u32,
    /// `align_of::<T>()`.
    pub align: u32,
    /// FNV-1a hash of `type_name::<T>()`.
    pub name_hash: u64,
}

impl TypeFingerprint {
    /// The fingerprint of `T`.
    pub fn of<T>() -> Self {
        TypeFingerprint {
            size: size_of::<T>() as u32,
            align: align_of::<T>() as u32,
            name_hash: fnv1a(core::any::type_name::<T>().as_bytes()),
        }
    }

    /// The fingerprint of "no payload".
    pub const NONE: TypeFingerprint = TypeFingerprint {
        size: 0,
        align: 0,
        name_hash: 0,
    };
}

impl fmt::Display for TypeFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "size {} align {} name-hash {:#018x}",
            self.size, self.align, self.name_hash
        )
    }
}

/// FNV-1a, 64-bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What a primitive asks the file layer to create: everything that goes into the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Which primitive.
    pub kind: Kind,
    /// Size of the primitive's fixed block, right after the header (multiple of 64).
    pub head_size: u32,
    /// Size of one slot (multiple of 8; 0 when there are no slots).
    pub slot_size: u32,
    /// Number of slots.
    pub capacity: u64,
    /// The payload type, or [`TypeFingerprint::NONE`].
    pub payload: TypeFingerprint,
    /// Primitive-specific parameters (epoch mode, tick length, max permits, ...).
    pub params: [u64; 4],
}

impl Layout {
    /// Total file length for this layout, or `None` if it overflows or exceeds
    /// [`MAX_FILE_LEN`].
    pub fn total_len(&self) -> Option<u64> {
        let slots = u64::from(self.slot_size).checked_mul(self.capacity)?;
        let total = (HEADER_LEN as u64)
            .checked_add(u64::from(self.head_size))?
            .checked_add(slots)?;
        (total <= MAX_FILE_LEN).then_some(total)
    }

    /// Offset of the fixed block.
    pub const fn head_offset(&self) -> usize {
        HEADER_LEN
    }

    /// Offset of slot 0.
    pub const fn slots_offset(&self) -> usize {
        HEADER_LEN + self.head_size as usize
    }
}

/// Everything read from a validated header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderInfo {
    /// The layout recorded in the file.
    pub layout: Layout,
    /// Total file length.
    pub total_len: u64,
    /// Pid of the process that created the file.
    pub creator_pid: u32,
    /// Start time (clock ticks since boot) of the creating process, 0 if unknown.
    pub creator_start: u64,
}

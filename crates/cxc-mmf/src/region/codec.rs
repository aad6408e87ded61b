//! The header codec: reading and writing the 128-byte header's fields through atomics,
//! its checksum, and the whole header of a new file.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::header::{
    ENDIAN_MARK, FORMAT_VERSION, HEADER_LEN, HeaderInfo, Kind, Layout, MAGIC, TypeFingerprint,
    fnv1a, off,
};

/// The header words of a live mapping (field offsets in [`off`]). The memory is shared
/// with other processes, so every field is read and written through an atomic.
#[derive(Clone, Copy)]
pub(super) struct HeaderWords<'a> {
    base: NonNull<u8>,
    _map: PhantomData<&'a MmapRaw>,
}

impl<'a> HeaderWords<'a> {
    /// The header at the start of `map`, which must be at least [`HEADER_LEN`] bytes.
    pub(super) fn of(map: &'a MmapRaw) -> Self {
        assert!(map.len() >= HEADER_LEN, "a mapping shorter than the header");
        HeaderWords {
            base: NonNull::new(map.as_mut_ptr()).expect("a mapping is not at address 0"),
            _map: PhantomData,
        }
    }

    fn atomic_u64(self, offset: usize) -> &'a AtomicU64 {
        assert!(offset + 8 <= HEADER_LEN && offset % 8 == 0);
        // SAFETY: `base` is the page-aligned start of a mapping of at least HEADER_LEN
        // bytes (checked in `of`) that outlives 'a; `offset` is 8-aligned and the 8 bytes
        // are inside the header (asserted above), so the pointer is valid and aligned for
        // an `AtomicU64`. The memory is shared, and every access to it goes through atomics.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) }
    }

    fn atomic_u32(self, offset: usize) -> &'a AtomicU32 {
        assert!(offset + 4 <= HEADER_LEN && offset % 4 == 0);
        // SAFETY: as in `atomic_u64`, for a 4-aligned 4-byte field.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast::<u32>()) }
    }

    /// Reads a `u64` field.
    pub(super) fn u64(self, offset: usize) -> u64 {
        self.atomic_u64(offset).load(Ordering::Relaxed)
    }

    /// Reads a `u32` field.
    pub(super) fn u32(self, offset: usize) -> u32 {
        self.atomic_u32(offset).load(Ordering::Relaxed)
    }

    fn set_u64(self, offset: usize, v: u64) {
        self.atomic_u64(offset).store(v, Ordering::Relaxed);
    }

    fn set_u32(self, offset: usize, v: u32) {
        self.atomic_u32(offset).store(v, Ordering::Relaxed);
    }

    /// The init-state word, published last by the creator (Release) and awaited by
    /// openers (Acquire).
    pub(super) fn init_state(self) -> &'a AtomicU32 {
        self.atomic_u32(off::INIT_STATE)
    }

    /// Checksum of header bytes 0..INIT_STATE, computed from the 8-byte words.
    pub(super) fn checksum(self) -> u64 {
        let mut bytes = [0u8; off::INIT_STATE];
        for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.u64(i * 8).to_ne_bytes());
        }
        fnv1a(&bytes)
    }

    /// Writes the header of a new file of `layout`, `total` bytes long, created by this
    /// process, with its checksum (not the init state).
    pub(super) fn write(self, layout: &Layout, total: u64) {
        let me_pid = crate::identity::current_pid();
        let me_start = crate::identity::self_start_time();
        self.set_u64(off::MAGIC, MAGIC);
        self.set_u32(off::VERSION, FORMAT_VERSION);
        self.set_u32(off::ENDIAN, ENDIAN_MARK);
        self.set_u32(off::KIND, layout.kind.code());
        self.set_u32(off::HEADER_LEN, HEADER_LEN as u32);
        self.set_u64(off::TOTAL_LEN, total);
        self.set_u32(off::HEAD_SIZE, layout.head_size);
        self.set_u32(off::SLOT_SIZE, layout.slot_size);
        self.set_u64(off::CAPACITY, layout.capacity);
        self.set_u32(off::PAYLOAD_SIZE, layout.payload.size);
        self.set_u32(off::PAYLOAD_ALIGN, layout.payload.align);
        self.set_u64(off::TYPE_HASH, layout.payload.name_hash);
        for (i, p) in layout.params.iter().enumerate() {
            self.set_u64(off::PARAMS + 8 * i, *p);
        }
        self.set_u32(off::CREATOR_PID, me_pid);
        self.set_u64(off::CREATOR_START, me_start);
        let sum = self.checksum();
        self.set_u64(off::CHECKSUM, sum);
    }

    /// The header's fields, for a file of `kind`.
    pub(super) fn read_fields(self, kind: Kind) -> HeaderInfo {
        let mut params = [0u64; 4];
        for (i, p) in params.iter_mut().enumerate() {
            *p = self.u64(off::PARAMS + 8 * i);
        }
        HeaderInfo {
            layout: Layout {
                kind,
                head_size: self.u32(off::HEAD_SIZE),
                slot_size: self.u32(off::SLOT_SIZE),
                capacity: self.u64(off::CAPACITY),
                payload: TypeFingerprint {
                    size: self.u32(off::PAYLOAD_SIZE),
                    align: self.u32(off::PAYLOAD_ALIGN),
                    name_hash: self.u64(off::TYPE_HASH),
                },
                params,
            },
            total_len: self.u64(off::TOTAL_LEN),
            creator_pid: self.u32(off::CREATOR_PID),
            creator_start: self.u64(off::CREATOR_START),
        }
    }
}

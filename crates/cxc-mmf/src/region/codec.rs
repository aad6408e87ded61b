//! The header codec: reading and writing the 128-byte header's fields through atomics,
//! its checksum, and the whole header of a new file.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::header::{
    ENDIAN_MARK, FORMAT_VERSION, FileHeader, HEADER_LEN, HeaderInfo, Kind, Layout, MAGIC,
    TypeFingerprint, fnv1a, off,
};

/// The header of a live mapping, as a [`FileHeader`] reference. The memory is shared with
/// other processes, so every field is read and written through an atomic.
#[derive(Clone, Copy)]
pub(super) struct HeaderWords<'a>(&'a FileHeader);

impl<'a> std::ops::Deref for HeaderWords<'a> {
    type Target = FileHeader;

    fn deref(&self) -> &FileHeader {
        self.0
    }
}

impl<'a> HeaderWords<'a> {
    /// The header at the start of `map`, which must be at least [`HEADER_LEN`] bytes.
    pub(super) fn of(map: &'a MmapRaw) -> Self {
        assert!(map.len() >= HEADER_LEN, "a mapping shorter than the header");
        let base = NonNull::new(map.as_mut_ptr()).expect("a mapping is not at address 0");
        // SAFETY: `base` is the page-aligned start of a mapping of at least HEADER_LEN
        // bytes (asserted above) that `map` keeps alive for 'a, so it is valid and aligned
        // for a `FileHeader` (128 bytes, alignment 8). `FileHeader` is made of atomics only,
        // valid for every bit pattern, and every access to the shared bytes goes through
        // them.
        HeaderWords(unsafe { base.cast::<FileHeader>().as_ref() })
    }

    /// The init-state word, published last by the creator (Release) and awaited by
    /// openers (Acquire).
    pub(super) fn init_state(self) -> &'a AtomicU32 {
        &self.0.init_state
    }

    /// Checksum of the header bytes before the init-state word: FNV-1a over the fields'
    /// native bytes, in file order (padding included), taken as the 8-byte words they
    /// fill.
    pub(super) fn checksum(self) -> u64 {
        let h = self.0;
        let u64_at = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // Two adjacent `u32` fields as the 8 bytes they fill.
        let pair = |lo: &AtomicU32, hi: &AtomicU32| {
            let (lo, hi) = (lo.load(Ordering::Relaxed), hi.load(Ordering::Relaxed));
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&lo.to_ne_bytes());
            b[4..].copy_from_slice(&hi.to_ne_bytes());
            u64::from_ne_bytes(b)
        };
        let words: [u64; off::INIT_STATE / 8] = [
            u64_at(&h.magic),
            pair(&h.version, &h.endian),
            pair(&h.kind, &h.header_len),
            u64_at(&h.total_len),
            pair(&h.head_size, &h.slot_size),
            u64_at(&h.capacity),
            pair(&h.payload_size, &h.payload_align),
            u64_at(&h.type_hash),
            u64_at(&h.params[0]),
            u64_at(&h.params[1]),
            u64_at(&h.params[2]),
            u64_at(&h.params[3]),
            pair(&h.creator_pid, &h._pad0),
            u64_at(&h.creator_start),
        ];
        let mut bytes = [0u8; off::INIT_STATE];
        for (chunk, w) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        fnv1a(&bytes)
    }

    /// Writes the header of a new file of `layout`, `total` bytes long, created by this
    /// process, with its checksum (not the init state).
    pub(super) fn write(self, layout: &Layout, total: u64) {
        let h = self.0;
        let set32 = |a: &AtomicU32, v: u32| a.store(v, Ordering::Relaxed);
        let set64 = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set64(&h.magic, MAGIC);
        set32(&h.version, FORMAT_VERSION);
        set32(&h.endian, ENDIAN_MARK);
        set32(&h.kind, layout.kind.code());
        set32(&h.header_len, HEADER_LEN as u32);
        set64(&h.total_len, total);
        set32(&h.head_size, layout.head_size);
        set32(&h.slot_size, layout.slot_size);
        set64(&h.capacity, layout.capacity);
        set32(&h.payload_size, layout.payload.size);
        set32(&h.payload_align, layout.payload.align);
        set64(&h.type_hash, layout.payload.name_hash);
        for (dst, p) in h.params.iter().zip(layout.params) {
            set64(dst, p);
        }
        set32(&h.creator_pid, crate::identity::current_pid());
        set64(&h.creator_start, crate::identity::self_start_time());
        set64(&h.checksum, self.checksum());
    }

    /// The header's fields, for a file of `kind`.
    pub(super) fn read_fields(self, kind: Kind) -> HeaderInfo {
        let h = self.0;
        let u32_of = |a: &AtomicU32| a.load(Ordering::Relaxed);
        let u64_of = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HeaderInfo {
            layout: Layout {
                kind,
                head_size: u32_of(&h.head_size),
                slot_size: u32_of(&h.slot_size),
                capacity: u64_of(&h.capacity),
                payload: TypeFingerprint {
                    size: u32_of(&h.payload_size),
                    align: u32_of(&h.payload_align),
                    name_hash: u64_of(&h.type_hash),
                },
                params: std::array::from_fn(|i| u64_of(&h.params[i])),
            },
            total_len: u64_of(&h.total_len),
            creator_pid: u32_of(&h.creator_pid),
            creator_start: u64_of(&h.creator_start),
        }
    }
}

//! [`Mapped`]: a validated mapping that hands out references to its fixed block and
//! slots, which are [`AtomicView`]s.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::MmapRaw;

use crate::error::MmfError;
use crate::header::HeaderInfo;

use super::atomic::AtomicView;
use super::validate::check_layout_shapes;

/// A validated mapping of a cxc file: the header, a fixed block `H` and `capacity` slots `S`.
///
/// The mapping hands out only references to atomics (through [`AtomicView`] types), never
/// byte slices. Every bound is checked once, when the mapping is made.
pub struct Mapped<H: AtomicView, S: AtomicView = ()> {
    pub(super) map: MmapRaw,
    info: HeaderInfo,
    path: PathBuf,
    head: NonNull<H>,
    slots: NonNull<S>,
    count: usize,
    _marker: PhantomData<(H, S)>,
}

// SAFETY: the raw pointers are the only reason this is not derived. They point into
// `map` (an `MmapRaw`, itself `Send + Sync`), which lives as long as `self` and is not tied
// to a thread; through them the body is only reached as `&H`/`&S`, and `H`, `S` are
// `Sync` (an `AtomicView` bound), so those references may be used from any thread. The
// header is only touched through atomics (`HeaderWords`).
unsafe impl<H: AtomicView, S: AtomicView> Send for Mapped<H, S> {}
// SAFETY: as above; shared access is the point of atomics.
unsafe impl<H: AtomicView, S: AtomicView> Sync for Mapped<H, S> {}

impl<H: AtomicView, S: AtomicView> std::fmt::Debug for Mapped<H, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("path", &self.path)
            .field("info", &self.info)
            .finish()
    }
}

impl<H: AtomicView, S: AtomicView> Mapped<H, S> {
    /// A view of `map`, whose header said `info`, after checking that `H` and `S` fit
    /// its layout.
    pub(super) fn from_map(
        map: MmapRaw,
        info: HeaderInfo,
        path: PathBuf,
    ) -> Result<Self, MmfError> {
        let layout = info.layout;
        check_layout_shapes::<H, S>(&layout)?;
        let len = map.len() as u64;
        if len != info.total_len {
            return Err(MmfError::WrongLength {
                expected: info.total_len,
                found: len,
            });
        }
        let base = map.as_mut_ptr();
        let count = usize::try_from(layout.capacity)
            .map_err(|_| MmfError::InvalidLayout("capacity does not fit usize".into()))?;
        // SAFETY: HEADER_LEN + head_size + slot_size * capacity == total_len == map.len()
        // (checked above and by `check_layout_shapes`), so both offsets are inside the
        // mapping; the mapping is page-aligned, HEADER_LEN and head_size are multiples of
        // 64 and slot_size a multiple of align_of::<S>(), so both pointers are aligned.
        let (head, slots) = unsafe {
            (
                NonNull::new_unchecked(base.add(layout.head_offset()).cast::<H>()),
                NonNull::new_unchecked(base.add(layout.slots_offset()).cast::<S>()),
            )
        };
        Ok(Mapped {
            map,
            info,
            path,
            head,
            slots,
            count,
            _marker: PhantomData,
        })
    }

    /// The primitive's fixed block.
    #[inline]
    pub fn head(&self) -> &H {
        // SAFETY: `head` points to an aligned `H` inside the mapping (checked at
        // construction), which lives as long as `self`; `H: FromBytes`, so whatever bytes
        // the file holds are a valid `H`. Other processes write it concurrently, which a
        // shared reference allows because every byte of an `AtomicView` is inside an
        // atomic (the safety contract of the trait).
        unsafe { self.head.as_ref() }
    }

    /// All slots.
    #[inline]
    pub fn slots(&self) -> &[S] {
        // SAFETY: `count` aligned slots of `S` follow the head inside the mapping (checked
        // at construction); `S: FromBytes` and made of atomics (`AtomicView`), see `head`.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr(), self.count) }
    }

    /// One slot, or `None` if `index` is out of range.
    #[inline]
    pub fn slot(&self, index: usize) -> Option<&S> {
        self.slots().get(index)
    }

    /// The validated header contents.
    pub fn info(&self) -> &HeaderInfo {
        &self.info
    }

    /// The path the file was created or opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes the mapping to the file (`msync`). Not needed for cross-process
    /// visibility; only for durability across a machine crash.
    ///
    /// # Errors
    /// [`MmfError::Io`] if `msync` fails.
    pub fn flush(&self) -> Result<(), MmfError> {
        self.map
            .flush()
            .map_err(|e| MmfError::io("msync", &self.path, e))
    }
}

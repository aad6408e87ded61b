//! Create, open and validate a mapped file, and hand out typed atomic views of it.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::marker::PhantomData;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use zerocopy::{FromBytes, FromZeros, KnownLayout};

use crate::error::{FoundKind, MmfError};
use crate::header::{
    ENDIAN_MARK, FORMAT_VERSION, HEADER_LEN, HeaderInfo, INIT_READY, Kind, Layout, MAGIC,
    TypeFingerprint, fnv1a, off,
};

/// A type that may be viewed in a mapping: valid for every bit pattern, with a layout the
/// compiler knows, shareable between threads.
///
/// There is one implementation, for every `Sync` type with zerocopy's [`FromZeros`],
/// [`FromBytes`] and [`KnownLayout`]: the atomic integers, arrays of views, `()`, and the
/// `#[repr(C)]` structs of the primitives, which derive those traits. The derives refuse a
/// field that is not valid for every bit pattern and a struct without a defined layout, so
/// the compiler checks what a hand-written `unsafe impl` used to promise.
///
/// What the bounds cannot say: that every byte of a view is inside an atomic. Structs of
/// atomics are not zerocopy's `Immutable`, but Rust has no bound for "not `Immutable`", so
/// a plain-data type such as `u64` meets the bounds too, and [`Mapped::head`] would hand out
/// a `&u64` that other processes write. View only atomics (`AtomicU32`, `AtomicU64`, arrays
/// and `#[repr(C)]` structs of them), as every view in this workspace does. The alignment
/// of a view must not exceed 64 (checked when the mapping is made).
pub trait AtomicView: FromZeros + FromBytes + KnownLayout + Sync + Sized {}

impl<T: FromZeros + FromBytes + KnownLayout + Sync + Sized> AtomicView for T {}

/// How `create` makes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    /// Permission bits of the new file (default `0o600`). Applied exactly (not masked by
    /// the umask).
    pub mode: u32,
    /// How long `open`/`create_or_open` wait for another process's creation to finish.
    pub init_timeout: Duration,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            mode: 0o600,
            init_timeout: Duration::from_secs(2),
        }
    }
}

/// What `open` requires of a file, beyond the generic header checks.
pub struct Expect<'a> {
    /// The primitive kind.
    pub kind: Kind,
    /// The fixed block size this build uses for `kind`.
    pub head_size: u32,
    /// The slot size this build uses for `kind`.
    pub slot_size: u32,
    /// The exact slot count the caller expects, or `None` to take it from the file.
    pub capacity: Option<u64>,
    /// Largest slot count accepted from a file.
    pub max_capacity: u64,
    /// The payload type.
    pub payload: TypeFingerprint,
    /// Validates the primitive parameters; returns a [`MmfError::ParamMismatch`] on error.
    pub check_params: &'a dyn Fn(&[u64; 4]) -> Result<(), MmfError>,
}

impl std::fmt::Debug for Expect<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expect")
            .field("kind", &self.kind)
            .field("head_size", &self.head_size)
            .field("slot_size", &self.slot_size)
            .field("capacity", &self.capacity)
            .field("max_capacity", &self.max_capacity)
            .field("payload", &self.payload)
            .finish_non_exhaustive()
    }
}

/// Whether `create_or_open` made the file or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This call created and initialised the file.
    Created,
    /// Another process had created it; this call opened and validated it.
    Opened,
}

/// A validated mapping of a cxc file: the header, a fixed block `H` and `capacity` slots `S`.
///
/// The mapping hands out only references to atomics (through [`AtomicView`] types), never
/// byte slices. Every bound is checked once, when the mapping is made.
pub struct Mapped<H: AtomicView, S: AtomicView = ()> {
    map: MmapRaw,
    info: HeaderInfo,
    path: PathBuf,
    head: NonNull<H>,
    slots: NonNull<S>,
    count: usize,
    _marker: PhantomData<(H, S)>,
}

// SAFETY: the mapping is only accessed through `&H` and `&S` (`AtomicView`s, which are
// `Sync`, so references to them may be used from any thread); the raw pointers point into
// `map`, which lives as long as `self` and is not tied to a thread.
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

fn check_layout_shapes<H, S>(layout: &Layout) -> Result<(), MmfError> {
    let bad = |m: String| Err(MmfError::InvalidLayout(m));
    if layout.head_size % 64 != 0 {
        return bad(format!(
            "head size {} is not a multiple of 64",
            layout.head_size
        ));
    }
    if size_of::<H>() > layout.head_size as usize {
        return bad(format!(
            "head view of {} bytes does not fit a {}-byte block",
            size_of::<H>(),
            layout.head_size
        ));
    }
    if align_of::<H>() > 64 || align_of::<S>() > 64 {
        return bad("view alignment above 64".into());
    }
    if layout.capacity > 0 {
        if layout.slot_size as usize != size_of::<S>() || size_of::<S>() == 0 {
            return bad(format!(
                "slot size {} does not match slot view of {} bytes",
                layout.slot_size,
                size_of::<S>()
            ));
        }
        if layout.slot_size as usize % align_of::<S>() != 0 {
            return bad("slot size is not a multiple of the slot alignment".into());
        }
    }
    if layout.total_len().is_none() {
        return bad(format!(
            "{} slots of {} bytes exceed the {}-byte file limit",
            layout.capacity,
            layout.slot_size,
            crate::MAX_FILE_LEN
        ));
    }
    Ok(())
}

/// Reads a `u64` header field through an atomic.
fn hdr_u64(base: *mut u8, offset: usize) -> u64 {
    assert!(offset + 8 <= HEADER_LEN && offset % 8 == 0);
    // SAFETY: `base` is the start of a mapping of at least HEADER_LEN bytes (page-aligned),
    // and `offset` is an 8-aligned field offset inside it (asserted above; see
    // docs/memory-layout.md). The memory is shared, so it is only accessed atomically.
    unsafe { AtomicU64::from_ptr(base.add(offset).cast::<u64>()) }.load(Ordering::Relaxed)
}

fn hdr_u32(base: *mut u8, offset: usize) -> u32 {
    assert!(offset + 4 <= HEADER_LEN && offset % 4 == 0);
    // SAFETY: as in `hdr_u64`, for a 4-aligned 4-byte field.
    unsafe { AtomicU32::from_ptr(base.add(offset).cast::<u32>()) }.load(Ordering::Relaxed)
}

fn hdr_atomic_u32(base: *mut u8, offset: usize) -> &'static AtomicU32 {
    assert!(offset + 4 <= HEADER_LEN && offset % 4 == 0);
    // SAFETY: as in `hdr_u32`. The 'static lifetime is a private convenience: callers use
    // the reference only while the mapping is alive (inside the functions below).
    unsafe { AtomicU32::from_ptr(base.add(offset).cast::<u32>()) }
}

fn set_u64(base: *mut u8, offset: usize, v: u64) {
    assert!(offset + 8 <= HEADER_LEN && offset % 8 == 0);
    // SAFETY: as in `hdr_u64`.
    unsafe { AtomicU64::from_ptr(base.add(offset).cast::<u64>()) }.store(v, Ordering::Relaxed)
}

fn set_u32(base: *mut u8, offset: usize, v: u32) {
    assert!(offset + 4 <= HEADER_LEN && offset % 4 == 0);
    // SAFETY: as in `hdr_u32`.
    unsafe { AtomicU32::from_ptr(base.add(offset).cast::<u32>()) }.store(v, Ordering::Relaxed)
}

/// Checksum of header bytes 0..INIT_STATE, computed from the 8-byte words.
fn header_checksum(base: *mut u8) -> u64 {
    let mut bytes = [0u8; off::INIT_STATE];
    for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&hdr_u64(base, i * 8).to_ne_bytes());
    }
    fnv1a(&bytes)
}

fn write_header(base: *mut u8, layout: &Layout, total: u64) {
    let me_pid = crate::identity::current_pid();
    let me_start = crate::identity::self_start_time();
    set_u64(base, off::MAGIC, MAGIC);
    set_u32(base, off::VERSION, FORMAT_VERSION);
    set_u32(base, off::ENDIAN, ENDIAN_MARK);
    set_u32(base, off::KIND, layout.kind.code());
    set_u32(base, off::HEADER_LEN, HEADER_LEN as u32);
    set_u64(base, off::TOTAL_LEN, total);
    set_u32(base, off::HEAD_SIZE, layout.head_size);
    set_u32(base, off::SLOT_SIZE, layout.slot_size);
    set_u64(base, off::CAPACITY, layout.capacity);
    set_u32(base, off::PAYLOAD_SIZE, layout.payload.size);
    set_u32(base, off::PAYLOAD_ALIGN, layout.payload.align);
    set_u64(base, off::TYPE_HASH, layout.payload.name_hash);
    for (i, p) in layout.params.iter().enumerate() {
        set_u64(base, off::PARAMS + 8 * i, *p);
    }
    set_u32(base, off::CREATOR_PID, me_pid);
    set_u64(base, off::CREATOR_START, me_start);
    let sum = header_checksum(base);
    set_u64(base, off::CHECKSUM, sum);
}

/// Generic header validation for a file of unknown or expected kind: identity checks,
/// then lengths and checksum.
fn parse_header(
    base: *mut u8,
    file_len: u64,
    expect_kind: Option<Kind>,
) -> Result<HeaderInfo, MmfError> {
    let info = check_identity(base, expect_kind)?;
    check_lengths_and_sum(base, info, file_len)
}

/// Magic, byte order, version, header length and kind; returns the raw fields.
fn check_identity(base: *mut u8, expect_kind: Option<Kind>) -> Result<HeaderInfo, MmfError> {
    check_format(base)?;
    let header_len = hdr_u32(base, off::HEADER_LEN);
    if header_len as usize != HEADER_LEN {
        return Err(MmfError::ParamMismatch {
            name: "header_len",
            expected: HEADER_LEN.to_string(),
            found: u64::from(header_len),
        });
    }
    let code = hdr_u32(base, off::KIND);
    let kind = match (expect_kind, Kind::from_code(code)) {
        (Some(want), Some(k)) if want == k => k,
        (Some(want), found) => {
            return Err(MmfError::WrongKind {
                expected: want,
                found: found.map_or(FoundKind::Unknown(code), FoundKind::Known),
            });
        }
        (None, Some(k)) => k,
        (None, None) => {
            return Err(MmfError::ParamMismatch {
                name: "kind",
                expected: "a known primitive kind".into(),
                found: u64::from(code),
            });
        }
    };
    Ok(read_fields(base, kind))
}

/// Magic, byte order and version: is this a cxc file of this format at all?
fn check_format(base: *mut u8) -> Result<(), MmfError> {
    let magic = hdr_u64(base, off::MAGIC);
    if magic != MAGIC {
        return Err(MmfError::BadMagic {
            expected: MAGIC,
            found: magic,
        });
    }
    let endian = hdr_u32(base, off::ENDIAN);
    if endian != ENDIAN_MARK {
        return Err(MmfError::Endianness {
            expected: ENDIAN_MARK,
            found: endian,
        });
    }
    let version = hdr_u32(base, off::VERSION);
    if version != FORMAT_VERSION {
        return Err(MmfError::UnsupportedVersion {
            expected: FORMAT_VERSION,
            found: version,
        });
    }
    Ok(())
}

/// Length and checksum checks, after the caller-specific layout checks (if any) passed.
fn check_lengths_and_sum(
    base: *mut u8,
    info: HeaderInfo,
    file_len: u64,
) -> Result<HeaderInfo, MmfError> {
    let layout = &info.layout;
    if layout.head_size % 64 != 0 {
        return Err(MmfError::ParamMismatch {
            name: "head_size",
            expected: "a multiple of 64".into(),
            found: u64::from(layout.head_size),
        });
    }
    let Some(total) = layout.total_len() else {
        return Err(MmfError::ParamMismatch {
            name: "capacity",
            expected: format!("a layout of at most {} bytes", crate::header::MAX_FILE_LEN),
            found: layout.capacity,
        });
    };
    if info.total_len != total {
        return Err(MmfError::ParamMismatch {
            name: "total_len",
            expected: total.to_string(),
            found: info.total_len,
        });
    }
    if file_len != total {
        return Err(MmfError::WrongLength {
            expected: total,
            found: file_len,
        });
    }
    let sum = header_checksum(base);
    let stored = hdr_u64(base, off::CHECKSUM);
    if sum != stored {
        return Err(MmfError::HeaderChecksum {
            expected: sum,
            found: stored,
        });
    }
    Ok(info)
}

fn check_expect(info: &HeaderInfo, expect: &Expect<'_>) -> Result<(), MmfError> {
    let l = &info.layout;
    if l.head_size != expect.head_size {
        return Err(MmfError::ParamMismatch {
            name: "head_size",
            expected: expect.head_size.to_string(),
            found: u64::from(l.head_size),
        });
    }
    if l.slot_size != expect.slot_size {
        return Err(MmfError::ParamMismatch {
            name: "slot_size",
            expected: expect.slot_size.to_string(),
            found: u64::from(l.slot_size),
        });
    }
    match expect.capacity {
        Some(c) if c != l.capacity => {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: c.to_string(),
                found: l.capacity,
            });
        }
        _ if l.capacity > expect.max_capacity => {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: format!("at most {}", expect.max_capacity),
                found: l.capacity,
            });
        }
        _ => {}
    }
    if l.payload != expect.payload {
        return Err(MmfError::TypeMismatch {
            expected: expect.payload,
            found: l.payload,
        });
    }
    (expect.check_params)(&l.params)
}

fn open_file(path: &Path) -> Result<(File, u64), MmfError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
        .open(path)
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => MmfError::NotFound {
                path: path.to_path_buf(),
            },
            // open(2) with O_RDWR fails with EISDIR before any fstat can say "directory".
            ErrorKind::IsADirectory => MmfError::NotAFile {
                path: path.to_path_buf(),
            },
            _ => MmfError::io("open", path, e),
        })?;
    let meta = file.metadata().map_err(|e| MmfError::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(MmfError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let len = meta.len();
    if len < HEADER_LEN as u64 {
        return Err(MmfError::TooShort {
            expected: HEADER_LEN as u64,
            found: len,
        });
    }
    Ok((file, len))
}

/// Maps the header alone and waits (bounded) for the creator's init-state store.
fn map_header(file: &File, path: &Path, timeout: Duration) -> Result<MmapRaw, MmfError> {
    let hmap = MmapOptions::new()
        .len(HEADER_LEN)
        .map_raw(file)
        .map_err(|e| MmfError::io("mmap", path, e))?;
    let init = hdr_atomic_u32(hmap.as_mut_ptr(), off::INIT_STATE);
    let start = Instant::now();
    loop {
        // SYNC: init-state. Pairs with the creator's Release store in `create`; after it,
        // every header and body field the creator wrote is visible.
        let state = init.load(Ordering::Acquire);
        if state == INIT_READY {
            return Ok(hmap);
        }
        // Not ready: a foreign or garbage file is not "still being initialised" (creators
        // publish by rename, so a cxc file at the final path has its magic, byte-order mark
        // and version already); report it at once instead of waiting for the timeout.
        check_format(hmap.as_mut_ptr())?;
        if start.elapsed() >= timeout {
            return Err(MmfError::NotInitialised {
                waited_ms: start.elapsed().as_millis() as u64,
                found: state,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reads and validates the header of any cxc file without knowing its kind (for tools
/// such as `cxc inspect`). The body is not mapped.
///
/// # Errors
/// Any [`MmfError`] describing why the file is not a valid cxc file.
pub fn peek(path: impl AsRef<Path>) -> Result<HeaderInfo, MmfError> {
    let path = path.as_ref();
    let (file, len) = open_file(path)?;
    let hmap = map_header(&file, path, Duration::from_millis(0))?;
    parse_header(hmap.as_mut_ptr(), len, None)
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl<H: AtomicView, S: AtomicView> Mapped<H, S> {
    /// Creates the file at `path` with `layout`, initialises the body with `init`, and
    /// publishes it atomically: the file is written under a temporary name in the same
    /// directory and renamed into place without replacing anything, so no opener ever
    /// sees a half-written file, and an existing file is never touched.
    ///
    /// # Errors
    /// [`MmfError::AlreadyExists`] or [`MmfError::Symlink`] if anything is at `path`;
    /// [`MmfError::InvalidLayout`] for a layout this build cannot map; [`MmfError::Io`].
    pub fn create(
        path: impl AsRef<Path>,
        layout: Layout,
        opts: &CreateOptions,
        init: impl FnOnce(&H, &[S]),
    ) -> Result<Self, MmfError> {
        let path = path.as_ref();
        check_layout_shapes::<H, S>(&layout)?;
        let total = layout.total_len().expect("checked by check_layout_shapes");
        refuse_existing(path)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path.file_name().ok_or_else(|| {
            MmfError::InvalidLayout(format!("{}: path has no file name", path.display()))
        })?;
        let tmp = dir.join(format!(
            ".{}.cxc-tmp.{}.{}",
            name.to_string_lossy().chars().take(64).collect::<String>(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = Self::create_at_tmp(path, &tmp, layout, total, opts, init);
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn create_at_tmp(
        path: &Path,
        tmp: &Path,
        layout: Layout,
        total: u64,
        opts: &CreateOptions,
        init: impl FnOnce(&H, &[S]),
    ) -> Result<Self, MmfError> {
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(opts.mode)
            .custom_flags(flags.bits() as i32)
            .open(tmp)
            .map_err(|e| MmfError::io("create", tmp, e))?;
        file.set_permissions(std::fs::Permissions::from_mode(opts.mode))
            .map_err(|e| MmfError::io("chmod", tmp, e))?;
        file.set_len(total)
            .map_err(|e| MmfError::io("set_len", tmp, e))?;
        let map = MmapOptions::new()
            .len(total as usize)
            .map_raw(&file)
            .map_err(|e| MmfError::io("mmap", tmp, e))?;
        let base = map.as_mut_ptr();
        write_header(base, &layout, total);
        let info = HeaderInfo {
            layout,
            total_len: total,
            creator_pid: hdr_u32(base, off::CREATOR_PID),
            creator_start: hdr_u64(base, off::CREATOR_START),
        };
        let mapped = Self::from_map(map, info, path.to_path_buf())?;
        init(mapped.head(), mapped.slots());
        // SYNC: init-state. Release: everything written above (header and body) happens
        // before any opener's Acquire load of READY.
        hdr_atomic_u32(base, off::INIT_STATE).store(INIT_READY, Ordering::Release);
        publish(tmp, path)?;
        Ok(mapped)
    }

    /// Opens and validates the file at `path`: magic, byte order, version, kind, every
    /// layout parameter, the payload type, the file length and the header checksum, all
    /// before any typed view exists.
    ///
    /// # Errors
    /// One [`MmfError`] variant per failed check, naming what was expected and found.
    pub fn open(path: impl AsRef<Path>, expect: &Expect<'_>) -> Result<Self, MmfError> {
        Self::open_with_timeout(path, expect, CreateOptions::default().init_timeout)
    }

    /// [`Mapped::open`] with an explicit bound on waiting for a creator to finish.
    ///
    /// # Errors
    /// As [`Mapped::open`].
    pub fn open_with_timeout(
        path: impl AsRef<Path>,
        expect: &Expect<'_>,
        timeout: Duration,
    ) -> Result<Self, MmfError> {
        let path = path.as_ref();
        let (file, len) = open_file(path)?;
        let hmap = map_header(&file, path, timeout)?;
        let base = hmap.as_mut_ptr();
        // Kind and caller expectations first (the most specific errors), then lengths and
        // the checksum.
        let info = check_identity(base, Some(expect.kind))?;
        check_expect(&info, expect)?;
        let info = check_lengths_and_sum(base, info, len)?;
        drop(hmap);
        let map = MmapOptions::new()
            .len(info.total_len as usize)
            .map_raw(&file)
            .map_err(|e| MmfError::io("mmap", path, e))?;
        Self::from_map(map, info, path.to_path_buf())
    }

    /// Creates the file, or opens it if another process got there first. Exactly one of
    /// several racing processes initialises; the others wait (bounded by
    /// `opts.init_timeout`) and validate.
    ///
    /// # Errors
    /// As [`Mapped::create`] and [`Mapped::open`].
    pub fn create_or_open(
        path: impl AsRef<Path>,
        layout: Layout,
        opts: &CreateOptions,
        expect: &Expect<'_>,
        init: impl FnOnce(&H, &[S]),
    ) -> Result<(Self, Origin), MmfError> {
        let path = path.as_ref();
        match Self::create(path, layout, opts, init) {
            Ok(m) => Ok((m, Origin::Created)),
            Err(MmfError::AlreadyExists { .. }) => {
                Self::open_with_timeout(path, expect, opts.init_timeout)
                    .map(|m| (m, Origin::Opened))
            }
            Err(e) => Err(e),
        }
    }

    fn from_map(map: MmapRaw, info: HeaderInfo, path: PathBuf) -> Result<Self, MmfError> {
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
        // shared reference allows for the bytes inside atomics: `AtomicView`'s documented
        // rule that views are made of atomics (which its bounds cannot check).
        unsafe { self.head.as_ref() }
    }

    /// All slots.
    #[inline]
    pub fn slots(&self) -> &[S] {
        // SAFETY: `count` aligned slots of `S` follow the head inside the mapping (checked
        // at construction); `S: FromBytes` and views are made of atomics, see `head`.
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

fn read_fields(base: *mut u8, kind: Kind) -> HeaderInfo {
    let mut params = [0u64; 4];
    for (i, p) in params.iter_mut().enumerate() {
        *p = hdr_u64(base, off::PARAMS + 8 * i);
    }
    HeaderInfo {
        layout: Layout {
            kind,
            head_size: hdr_u32(base, off::HEAD_SIZE),
            slot_size: hdr_u32(base, off::SLOT_SIZE),
            capacity: hdr_u64(base, off::CAPACITY),
            payload: TypeFingerprint {
                size: hdr_u32(base, off::PAYLOAD_SIZE),
                align: hdr_u32(base, off::PAYLOAD_ALIGN),
                name_hash: hdr_u64(base, off::TYPE_HASH),
            },
            params,
        },
        total_len: hdr_u64(base, off::TOTAL_LEN),
        creator_pid: hdr_u32(base, off::CREATOR_PID),
        creator_start: hdr_u64(base, off::CREATOR_START),
    }
}

fn refuse_existing(path: &Path) -> Result<(), MmfError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(MmfError::Symlink {
            path: path.to_path_buf(),
        }),
        Ok(_) => Err(MmfError::AlreadyExists {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MmfError::io("stat", path, e)),
    }
}

/// Moves the finished temporary file to `path` without replacing anything there.
fn publish(tmp: &Path, path: &Path) -> Result<(), MmfError> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, tmp, CWD, path, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) => {
            let _ = std::fs::remove_file(tmp);
            refuse_existing(path)?;
            Err(MmfError::AlreadyExists {
                path: path.to_path_buf(),
            })
        }
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            // The file system has no RENAME_NOREPLACE: link(2) also never replaces.
            let r = std::fs::hard_link(tmp, path);
            let _ = std::fs::remove_file(tmp);
            match r {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    refuse_existing(path)?;
                    Err(MmfError::AlreadyExists {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => Err(MmfError::io("link", path, e)),
            }
        }
        Err(e) => Err(MmfError::io("rename", path, e.into())),
    }
}

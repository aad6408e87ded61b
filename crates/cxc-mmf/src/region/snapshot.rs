//! [`Snapshot`]: a private copy of a cxc file, read through a read-only mapping, for tools
//! that must not write (or cannot: another user's file, a read-only mount).

use std::path::Path;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering, fence};
use std::time::Duration;

use memmap2::{MmapMut, MmapOptions, MmapRaw};

use crate::error::MmfError;
use crate::header::{HEADER_LEN, HeaderInfo};

use super::atomic::AtomicView;
use super::codec::HeaderWords;
use super::open::{map_header, open_file};
use super::options::Expect;
use super::validate::{check_expect, check_identity, check_lengths_and_sum};
use super::view::Mapped;

/// A validated copy of a whole cxc file, taken with loads only.
///
/// [`Snapshot::read`] opens the file `O_RDONLY`, maps it `PROT_READ`, validates the header
/// as [`Mapped::open`] does (without waiting for a creator), and copies every byte into
/// private memory with Relaxed pointer-width atomic loads (the only accesses the language
/// promises to work on read-only memory), followed by an Acquire fence. Nothing is ever
/// written to the file, no identity is registered, no lock or futex is touched: read
/// permission on the file is enough, and the file's bytes and times are unchanged.
///
/// The copy is not one atomic picture: each aligned word of at most pointer width is read
/// whole, but different words may come from different moments (as with a field-by-field
/// read of the live mapping). Decoders that need a consistent group of words take a new
/// snapshot when it is torn. On 32-bit targets an 8-byte field may be read in two halves.
///
/// # Examples
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, Snapshot, TypeFingerprint};
///
/// # fn main() -> Result<(), cxc_mmf::MmfError> {
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("counter.cxc");
/// let layout = Layout {
///     kind: Kind::Test,
///     head_size: 64,
///     slot_size: 0,
///     capacity: 0,
///     payload: TypeFingerprint::NONE,
///     params: [0; 4],
/// };
/// let live: Mapped<AtomicU64> = Mapped::create(
///     &path,
///     layout,
///     &CreateOptions::default(),
///     |c: &AtomicU64, _: &[()]| c.store(7, Ordering::Relaxed),
/// )?;
/// let expect = Expect {
///     kind: Kind::Test,
///     head_size: 64,
///     slot_size: 0,
///     capacity: Some(0),
///     max_capacity: 0,
///     payload: TypeFingerprint::NONE,
///     check_params: &|_| Ok(()),
/// };
/// let snap: Snapshot<AtomicU64> = Snapshot::read(&path, &expect)?;
/// live.head().store(8, Ordering::Relaxed);
/// // The copy keeps the value it read.
/// assert_eq!(snap.head().load(Ordering::Relaxed), 7);
/// # Ok(())
/// # }
/// ```
pub struct Snapshot<H: AtomicView, S: AtomicView = ()> {
    /// Views over an anonymous private mapping holding the copy.
    copy: Mapped<H, S>,
}

impl<H: AtomicView, S: AtomicView> std::fmt::Debug for Snapshot<H, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("path", &self.copy.path())
            .field("info", self.copy.info())
            .finish()
    }
}

impl<H: AtomicView, S: AtomicView> Snapshot<H, S> {
    /// Reads and validates the file at `path` (every check of [`Mapped::open`]; a file
    /// whose creator has not finished is reported at once) and copies it.
    ///
    /// # Errors
    /// One [`MmfError`] variant per failed check; [`MmfError::Io`] when the file cannot be
    /// opened or mapped for reading.
    pub fn read(path: impl AsRef<Path>, expect: &Expect<'_>) -> Result<Self, MmfError> {
        let path = path.as_ref();
        let (info, dst) = copy_file(path, Some(expect))?;
        let copy = Mapped::from_map(MmapRaw::from(dst), info, path.to_path_buf())?;
        Ok(Snapshot { copy })
    }

    /// The primitive's fixed block, as copied.
    #[inline]
    pub fn head(&self) -> &H {
        self.copy.head()
    }

    /// All slots, as copied.
    #[inline]
    pub fn slots(&self) -> &[S] {
        self.copy.slots()
    }

    /// The validated header contents.
    pub fn info(&self) -> &HeaderInfo {
        self.copy.info()
    }

    /// The path the file was read at.
    pub fn path(&self) -> &Path {
        self.copy.path()
    }
}

/// Reads any cxc file the way [`Snapshot::read`] does (read-only, loads only), without
/// knowing its kind: its validated header and its body (everything after the 128-byte
/// header) as native-endian `u64` words. For tools that show files of kinds they have no
/// decoder for (such as [`Kind::Test`](crate::Kind::Test) files).
///
/// # Errors
/// Any [`MmfError`] describing why the file is not a valid cxc file or cannot be read.
pub fn read_words(path: impl AsRef<Path>) -> Result<(HeaderInfo, Vec<u64>), MmfError> {
    let (info, dst) = copy_file(path.as_ref(), None)?;
    let body = dst.get(HEADER_LEN..).unwrap_or_default();
    let words = body
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
        .collect();
    Ok((info, words))
}

/// Opens `path` read-only, validates its header (against `expect` if given) and copies
/// the whole file into an anonymous private mapping.
fn copy_file(path: &Path, expect: Option<&Expect<'_>>) -> Result<(HeaderInfo, MmapMut), MmfError> {
    let (file, len) = open_file(path, true)?;
    let hmap = map_header(&file, path, Duration::ZERO, true)?;
    let h = HeaderWords::of(&hmap);
    let info = check_identity(h, expect.map(|e| e.kind))?;
    if let Some(e) = expect {
        check_expect(&info, e)?;
    }
    let info = check_lengths_and_sum(h, info, len)?;
    drop(hmap);
    let total = usize::try_from(info.total_len)
        .map_err(|_| MmfError::InvalidLayout("file length does not fit usize".into()))?;
    let src = MmapOptions::new()
        .len(total)
        .map_raw_read_only(&file)
        .map_err(|e| MmfError::io("mmap", path, e))?;
    let mut dst = MmapOptions::new()
        .len(total)
        .map_anon()
        .map_err(|e| MmfError::io("mmap", path, e))?;
    copy_loads(&src, &mut dst);
    // SYNC: pairs with the Release stores of the file's writers, as an Acquire load of
    // each word would (the loads in `copy_loads` are Relaxed).
    fence(Ordering::Acquire);
    Ok((info, dst))
}

/// Copies `src` (a read-only shared mapping) into `dst` (as long) with Relaxed atomic
/// loads: pointer-width words, then the tail byte by byte.
fn copy_loads(src: &MmapRaw, dst: &mut MmapMut) {
    const W: usize = size_of::<usize>();
    let len = src.len().min(dst.len());
    let base = src.as_ptr();
    let words = len / W;
    for i in 0..words {
        // SAFETY: `base` is the page-aligned start of a live mapping of `len` bytes or
        // more, and word `i` lies inside it at a multiple of W, so the pointer is valid
        // and aligned for an `AtomicUsize` while `src` lives (this call). The mapping is
        // read-only: the only access made through the reference is a Relaxed load of
        // pointer width, which the standard library documents as working on read-only
        // memory (std::sync::atomic, "Atomic accesses to read-only memory"). Other
        // processes store into the file concurrently with atomics of at most 8 bytes; an
        // aligned pointer-width load reads each aligned field of at most that width whole.
        let v = unsafe { AtomicUsize::from_ptr(base.add(i * W).cast::<usize>().cast_mut()) }
            .load(Ordering::Relaxed);
        dst[i * W..(i + 1) * W].copy_from_slice(&v.to_ne_bytes());
    }
    for j in words * W..len {
        // SAFETY: as above, for one byte inside the mapping (any address is aligned for
        // an `AtomicU8`); a Relaxed one-byte load.
        dst[j] = unsafe { AtomicU8::from_ptr(base.add(j).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// The exit code [`exit_on_bus_error`]'s handler ends the process with.
static BUS_EXIT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(2);

/// Makes a bus error (`SIGBUS`: a file this process maps was truncated under it while it
/// was being read) end the process with exit code `code` and one line on stderr, instead
/// of a crash. A process-wide setting for read-only tools (`cxc inspect`, `cxc watch`):
/// [`Snapshot::read`] and [`read_words`] copy through a shared mapping, and no check
/// before the copy can rule out a truncation during it.
///
/// # Errors
/// If the handler cannot be installed (`sigaction` failed).
pub fn exit_on_bus_error(code: i32) -> std::io::Result<()> {
    extern "C" fn on_bus(_: libc::c_int) {
        const MSG: &[u8] = b"cxc: a file was truncated while it was being read (SIGBUS)\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe; MSG is a valid static
        // buffer of MSG.len() bytes. A Relaxed atomic load is lock-free.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(BUS_EXIT.load(Ordering::Relaxed));
        }
    }
    BUS_EXIT.store(code, Ordering::Relaxed);
    // SAFETY: `sigaction` is given a zeroed (valid) struct with a handler of the type
    // `sa_handler` expects and an emptied mask; the old action is not asked for.
    let rc = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_bus as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

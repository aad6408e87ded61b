//! Opening an existing file: the file, its header (waiting for the creator), validation,
//! then the whole mapping.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::MmfError;
use crate::header::{HEADER_LEN, HeaderInfo, INIT_READY};

use super::atomic::AtomicView;
use super::codec::HeaderWords;
use super::options::{CreateOptions, Expect};
use super::validate::{
    check_expect, check_format, check_identity, check_lengths_and_sum, parse_header,
};
use super::view::Mapped;

/// Opens `path` for reading, and for writing too unless `read_only` (no `O_RDWR`: a file
/// of another user or on a read-only mount can still be read).
///
/// `O_NONBLOCK`, so that a FIFO (or a device) at `path` cannot make the `open` wait for a
/// writer: it opens, and the `fstat` below refuses it as not a regular file. On a regular
/// file the flag changes nothing (its reads and writes never block, and the file is only
/// mapped). `O_NOCTTY`, so that a terminal at `path` does not become the caller's
/// controlling terminal.
pub(super) fn open_file(path: &Path, read_only: bool) -> Result<(File, u64), MmfError> {
    use rustix::fs::OFlags;
    let flags = OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(flags.bits() as i32)
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

/// Maps the header alone (read-only when `read_only`) and waits (bounded) for the
/// creator's init-state store.
pub(super) fn map_header(
    file: &File,
    path: &Path,
    timeout: Duration,
    read_only: bool,
) -> Result<MmapRaw, MmfError> {
    let mut opts = MmapOptions::new();
    opts.len(HEADER_LEN);
    let hmap = if read_only {
        opts.map_raw_read_only(file)
    } else {
        opts.map_raw(file)
    }
    .map_err(|e| MmfError::io("mmap", path, e))?;
    let init = HeaderWords::of(&hmap).init_state();
    let start = Instant::now();
    loop {
        // SYNC: init-state. Pairs with the creator's Release store in `create`; after it,
        // every header and body field the creator wrote is visible. A Relaxed load and an
        // Acquire fence (not an Acquire load): only Relaxed loads are promised to work on
        // a read-only mapping.
        let state = init.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        if state == INIT_READY {
            return Ok(hmap);
        }
        // Not ready: a foreign or garbage file is not "still being initialised" (creators
        // publish by rename, so a cxc file at the final path has its magic, byte-order mark
        // and version already); report it at once instead of waiting for the timeout.
        check_format(HeaderWords::of(&hmap))?;
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
/// such as `cxc inspect`). The body is not mapped; the file is opened and mapped
/// read-only and only loaded from, so read permission is enough.
///
/// # Errors
/// Any [`MmfError`] describing why the file is not a valid cxc file.
pub fn peek(path: impl AsRef<Path>) -> Result<HeaderInfo, MmfError> {
    let path = path.as_ref();
    let (file, len) = open_file(path, true)?;
    let hmap = map_header(&file, path, Duration::from_millis(0), true)?;
    parse_header(HeaderWords::of(&hmap), len, None)
}

impl<H: AtomicView, S: AtomicView> Mapped<H, S> {
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
        super::create::identify(path)?;
        let (file, len) = open_file(path, false)?;
        let hmap = map_header(&file, path, timeout, false)?;
        let h = HeaderWords::of(&hmap);
        // Kind and caller expectations first (the most specific errors), then lengths and
        // the checksum.
        let info = check_identity(h, Some(expect.kind))?;
        check_expect(&info, expect)?;
        let info = check_lengths_and_sum(h, info, len)?;
        drop(hmap);
        let map = MmapOptions::new()
            .len(info.total_len as usize)
            .map_raw(&file)
            .map_err(|e| MmfError::io("mmap", path, e))?;
        Self::from_map(map, info, path.to_path_buf())
    }
}

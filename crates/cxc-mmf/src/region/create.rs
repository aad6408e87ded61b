//! Creating a file: written under a temporary name, initialised, then published by a
//! rename that never replaces anything.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapOptions;

use crate::error::MmfError;
use crate::header::{HeaderInfo, INIT_READY, Layout};

use super::atomic::AtomicView;
use super::codec::HeaderWords;
use super::options::{CreateOptions, Expect, Origin};
use super::validate::check_layout_shapes;
use super::view::Mapped;

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
        identify(path)?;
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
        let (file, tmp) = create_tmp(&dir, &name.to_string_lossy(), opts.mode)?;
        let result = Self::create_at_tmp(path, file, &tmp, layout, total, opts, init);
        if result.is_err() {
            // Only the file this call created: a name taken by someone else (e.g. a dead
            // creator's leftover under a reused pid) was skipped, never removed.
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn create_at_tmp(
        path: &Path,
        file: std::fs::File,
        tmp: &Path,
        layout: Layout,
        total: u64,
        opts: &CreateOptions,
        init: impl FnOnce(&H, &[S]),
    ) -> Result<Self, MmfError> {
        file.set_permissions(std::fs::Permissions::from_mode(opts.mode))
            .map_err(|e| MmfError::io("chmod", tmp, e))?;
        reserve(&file, total, tmp)?;
        let map = MmapOptions::new()
            .len(total as usize)
            .map_raw(&file)
            .map_err(|e| MmfError::io("mmap", tmp, e))?;
        let h = HeaderWords::of(&map);
        h.write(&layout, total);
        let info = HeaderInfo {
            layout,
            total_len: total,
            creator_pid: h.creator_pid.load(Ordering::Relaxed),
            creator_start: h.creator_start.load(Ordering::Relaxed),
        };
        let mapped = Self::from_map(map, info, path.to_path_buf())?;
        init(mapped.head(), mapped.slots());
        // SYNC: init-state. Release: everything written above (header and body) happens
        // before any opener's Acquire load of READY.
        HeaderWords::of(&mapped.map)
            .init_state()
            .store(INIT_READY, Ordering::Release);
        publish(tmp, path)?;
        Ok(mapped)
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
}

/// How many taken temporary names `create_tmp` skips before giving up.
const TMP_ATTEMPTS: u64 = 64;

/// Creates a new temporary file in `dir` for the file `name`:
/// `.<name>.cxc-tmp.<pid>.<n>`, with `n` from a process-wide counter. The name is taken
/// with `O_EXCL`: a name that exists (a leftover of a creator that died under the same pid,
/// e.g. pid 1 of every container, or a reused pid) is skipped, never opened or removed.
fn create_tmp(dir: &Path, name: &str, mode: u32) -> Result<(std::fs::File, PathBuf), MmfError> {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    let short: String = name.chars().take(64).collect();
    let mut attempt = 0;
    loop {
        let tmp = dir.join(format!(
            ".{short}.cxc-tmp.{}.{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(flags.bits() as i32)
            .open(&tmp)
        {
            Ok(file) => return Ok((file, tmp)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt + 1 < TMP_ATTEMPTS => {
                attempt += 1;
            }
            Err(e) => return Err(MmfError::io("create", &tmp, e)),
        }
    }
}

/// Sizes the new (empty) file `file` to `len` bytes with every block allocated, so that
/// the init stores through the mapping never fault in a page the file system cannot
/// provide: a sparse file (`set_len`) on a full file system is a SIGBUS at the first store,
/// not an error. `fallocate(2)` reserves the blocks; a file system without it gets zeros
/// written. A full file system (`ENOSPC`, `EDQUOT`) is an [`MmfError::Io`] here; the
/// caller removes the file.
fn reserve(file: &std::fs::File, len: u64, tmp: &Path) -> Result<(), MmfError> {
    use rustix::fs::{FallocateFlags, fallocate};
    use rustix::io::Errno;
    loop {
        match fallocate(file, FallocateFlags::empty(), 0, len) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(Errno::OPNOTSUPP | Errno::NOSYS) => {
                return zero_fill(file, len).map_err(|e| MmfError::io("zero-fill", tmp, e));
            }
            Err(e) => return Err(MmfError::io("fallocate", tmp, e.into())),
        }
    }
}

/// Writes `len` zero bytes at the start of `file`, in chunks: the fallback of [`reserve`]
/// for a file system without `fallocate(2)`. Every block is written, so none is a hole.
fn zero_fill(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    const CHUNK: u64 = 64 * 1024;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// This process's identity must be whole before it maps a file whose records name
/// processes: one made while the process was short of file descriptors would be unknown
/// for good (never judged dead). Such a shortage is an `Io` error here (the next call
/// tries again).
pub(super) fn identify(path: &Path) -> Result<(), MmfError> {
    crate::identity::identify_for(path).map(drop)
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::{reserve, zero_fill};

    /// Bytes the file system has allocated to `f` (`st_blocks` is in 512-byte units).
    fn allocated(f: &std::fs::File) -> u64 {
        f.metadata().unwrap().blocks() * 512
    }

    #[test]
    fn zero_fill_writes_every_block() {
        let dir = tempfile::tempdir().unwrap();
        // Not a multiple of the chunk: the tail is written too.
        for len in [0u64, 1, 4096, 64 * 1024, 200 * 1024 + 17] {
            let f = std::fs::File::create_new(dir.path().join(format!("z{len}"))).unwrap();
            zero_fill(&f, len).unwrap();
            assert_eq!(f.metadata().unwrap().len(), len);
            assert!(allocated(&f) >= len, "len {len}: a hole is left");
            let bytes = std::fs::read(dir.path().join(format!("z{len}"))).unwrap();
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn reserve_sizes_the_file_and_allocates_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let f = std::fs::File::create_new(&path).unwrap();
        let len = 300 * 1024 + 5;
        reserve(&f, len, &path).unwrap();
        assert_eq!(f.metadata().unwrap().len(), len);
        assert!(allocated(&f) >= len, "a hole is left");
    }
}

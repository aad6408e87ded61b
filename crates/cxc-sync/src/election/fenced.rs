//! [`FencedResource`]: storage that keeps the highest fencing token it accepted and
//! refuses writes carrying an older one; [`FencedFile`] is one in a plain file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

/// A resource guarded by fencing tokens: it stores the highest token it accepted (the
/// high-water mark) with the data, and a write with a lower token is refused, so a
/// deposed leader that wakes up late cannot overwrite its successor's work. Equal tokens
/// are accepted (one leader writes many times).
pub trait FencedResource {
    /// Why the resource could not answer.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Replaces the data if `token` is at least the high-water mark (which becomes
    /// `token`); `Ok(false)`, changing nothing, for an older token.
    fn write(&self, token: u64, data: &[u8]) -> Result<bool, Self::Error>;

    /// Appends to the data under the same rule.
    fn append(&self, token: u64, data: &[u8]) -> Result<bool, Self::Error>;

    /// The high-water mark and the data.
    fn read(&self) -> Result<(u64, Vec<u8>), Self::Error>;
}

const MAGIC: &[u8; 8] = b"CXCFENC1";
const HEADER: u64 = 16;

/// Why a [`FencedFile`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedFileError {
    /// The file system failed.
    #[error("fenced file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The file does not start with a fenced-file header.
    #[error("{path} is not a fenced file")]
    NotFenced {
        /// The file.
        path: PathBuf,
    },
}

/// A [`FencedResource`] in one file: a 16-byte header (magic `CXCFENC1`, the high-water
/// mark as little-endian u64) and the data. Every operation holds an exclusive `flock`
/// on the file, so check and write are one step for every process using it, and the
/// handle's own lock, so they are one step for every thread sharing the handle too (a
/// `flock` is per open file description, which threads share). In a child made by
/// `fork` the inherited handle opens the file anew for each operation (through
/// `/proc/self/fd`, so the same file even if its path was replaced since), since the
/// description it inherited is the parent's, and a `flock` on it would exclude nothing
/// between them (`attack35_mp`).
///
/// A write raises the mark before it writes the data, so that once a token was accepted
/// no older token can write. A writer killed between the two leaves the mark raised and
/// its data unwritten (the data then belongs to an older token than the mark).
#[derive(Debug)]
pub struct FencedFile {
    path: PathBuf,
    file: File,
    /// The process that opened `file` (lineage token): another one is a forked child.
    proc: u32,
    /// Serialises the operations of the threads sharing this handle.
    lock: crate::forklock::ForkSafeLock,
}

impl FencedFile {
    /// Opens the file at `path`, creating it (mode 0600, high-water mark 0) if missing;
    /// a symlink at `path` is refused.
    ///
    /// # Errors
    /// [`FencedFileError::Io`]; [`FencedFileError::NotFenced`] for a file of something
    /// else.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FencedFileError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // Never follow a symlink at the final path.
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(|source| FencedFileError::Io {
                path: path.clone(),
                source,
            })?;
        let f = FencedFile {
            path,
            file,
            proc: cxc_mmf::identity::current_proc(),
            lock: crate::forklock::ForkSafeLock::new(),
        };
        f.locked(|f| {
            if f.len()? == 0 {
                let mut h = [0u8; HEADER as usize];
                h[..8].copy_from_slice(MAGIC);
                f.file.write_all_at(&h, 0).map_err(|e| f.io(e))?;
            }
            f.high_water().map(drop)
        })?;
        Ok(f)
    }

    fn io(&self, source: io::Error) -> FencedFileError {
        FencedFileError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Runs `f` holding the handle's lock and an exclusive `flock` on the file (through
    /// a description of its own in a forked child).
    fn locked<R>(
        &self,
        f: impl FnOnce(&Locked<'_>) -> Result<R, FencedFileError>,
    ) -> Result<R, FencedFileError> {
        let _threads = self.lock.lock();
        let own;
        let file = if self.proc == cxc_mmf::identity::current_proc() {
            &self.file
        } else {
            own = self.reopen()?;
            &own
        };
        flock(file, FlockOperation::LockExclusive).map_err(|e| self.io(e.into()))?;
        let r = f(&Locked {
            path: &self.path,
            file,
        });
        let _ = flock(file, FlockOperation::Unlock);
        r
    }

    /// A new open file description of the same file.
    fn reopen(&self) -> Result<File, FencedFileError> {
        use std::os::fd::AsRawFd;
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        opts.open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .or_else(|_| {
                // No /proc: by path (never through a symlink).
                opts.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&self.path)
            })
            .map_err(|e| self.io(e))
    }
}

/// A [`FencedFile`]'s file while its operation holds the locks.
struct Locked<'a> {
    path: &'a Path,
    file: &'a File,
}

impl Locked<'_> {
    fn io(&self, source: io::Error) -> FencedFileError {
        FencedFileError::Io {
            path: self.path.to_path_buf(),
            source,
        }
    }

    fn len(&self) -> Result<u64, FencedFileError> {
        Ok(self.file.metadata().map_err(|e| self.io(e))?.len())
    }

    fn high_water(&self) -> Result<u64, FencedFileError> {
        let mut h = [0u8; HEADER as usize];
        self.file.read_exact_at(&mut h, 0).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                FencedFileError::NotFenced {
                    path: self.path.to_path_buf(),
                }
            } else {
                self.io(e)
            }
        })?;
        let (magic, mark) = h.split_at(8);
        if magic != MAGIC {
            return Err(FencedFileError::NotFenced {
                path: self.path.to_path_buf(),
            });
        }
        let mut m = [0u8; 8];
        m.copy_from_slice(mark);
        Ok(u64::from_le_bytes(m))
    }
}

impl FencedFile {
    fn fenced_put(&self, token: u64, data: &[u8], append: bool) -> Result<bool, FencedFileError> {
        self.locked(|f| {
            if token < f.high_water()? {
                return Ok(false);
            }
            f.file
                .write_all_at(&token.to_le_bytes(), 8)
                .map_err(|e| f.io(e))?;
            let at = if append { f.len()? } else { HEADER };
            f.file.write_all_at(data, at).map_err(|e| f.io(e))?;
            if !append {
                f.file
                    .set_len(HEADER + data.len() as u64)
                    .map_err(|e| f.io(e))?;
            }
            Ok(true)
        })
    }
}

impl FencedResource for FencedFile {
    type Error = FencedFileError;

    fn write(&self, token: u64, data: &[u8]) -> Result<bool, FencedFileError> {
        self.fenced_put(token, data, false)
    }

    fn append(&self, token: u64, data: &[u8]) -> Result<bool, FencedFileError> {
        self.fenced_put(token, data, true)
    }

    fn read(&self) -> Result<(u64, Vec<u8>), FencedFileError> {
        self.locked(|f| {
            let mark = f.high_water()?;
            let len = f.len()?.saturating_sub(HEADER);
            // The length comes from the file, which anyone with write access can extend
            // (sparse): an allocation that fails is an error, never an abort.
            let too_big = |detail: String| {
                f.io(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!("{len} bytes of data: {detail}"),
                ))
            };
            let len = usize::try_from(len).map_err(|e| too_big(e.to_string()))?;
            let mut data = Vec::new();
            data.try_reserve_exact(len)
                .map_err(|e| too_big(e.to_string()))?;
            data.resize(len, 0);
            f.file
                .read_exact_at(&mut data, HEADER)
                .map_err(|e| f.io(e))?;
            Ok((mark, data))
        })
    }
}

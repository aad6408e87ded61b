//! Errors about files, worded for the operator: they name the path the user gave and say
//! what is wrong in words; symlinks to existing files are followed.

use std::path::{Path, PathBuf};

use cxc::MmfError;

use crate::CliError;

/// An error that may wrap a file-format error.
pub trait FileError: std::fmt::Display {
    /// The file-format error inside, if any.
    fn mmf(&self) -> Option<&MmfError>;
}

impl FileError for MmfError {
    fn mmf(&self) -> Option<&MmfError> {
        Some(self)
    }
}

/// `FileError` for error types whose `File` variant carries the file layer's error.
macro_rules! file_variant {
    ($($t:ty),* $(,)?) => {$(
        impl FileError for $t {
            fn mmf(&self) -> Option<&MmfError> {
                match self {
                    Self::File(m) => Some(m),
                    _ => None,
                }
            }
        }
    )*};
}

file_variant!(
    cxc::LeaseError,
    cxc::SemaphoreError,
    cxc::HeartbeatError,
    cxc::SeqLockError,
    cxc::RwLockError,
);

impl FileError for cxc::election::MmapElectionError {
    fn mmf(&self) -> Option<&MmfError> {
        match self {
            cxc::election::MmapElectionError::Lease(cxc::LeaseError::File(m)) => Some(m),
            _ => None,
        }
    }
}

impl FileError for std::io::Error {
    fn mmf(&self) -> Option<&MmfError> {
        None
    }
}

/// The message for `e` about `path`.
pub fn message(path: &Path, e: &dyn FileError) -> String {
    let p = path.display();
    match e.mmf() {
        Some(MmfError::BadMagic { .. } | MmfError::TooShort { .. }) => {
            format!("not a cxc file: {p}")
        }
        Some(MmfError::NotFound { .. }) => format!("{p}: no such file"),
        Some(MmfError::Io { op, source, .. }) => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            match (source.kind(), dir) {
                (std::io::ErrorKind::NotFound, Some(d)) if !d.exists() => {
                    format!("{p}: cannot create: no such directory {}", d.display())
                }
                _ => format!("{p}: {op}: {source}"),
            }
        }
        Some(m) => {
            let s = m.to_string();
            if s.starts_with(&p.to_string()) {
                s
            } else {
                format!("{p}: {s}")
            }
        }
        None => format!("{p}: {e}"),
    }
}

/// `e` about `path` as a usage-class error (exit 2).
pub fn error(path: &Path, e: &dyn FileError) -> CliError {
    CliError::usage(message(path, e))
}

/// `path`, or the file it links to when it is a symlink to an existing file (so an
/// existing file is opened through its link; creating through a link is still refused).
pub fn follow(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() && path.exists() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

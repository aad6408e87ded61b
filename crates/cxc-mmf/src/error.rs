//! The error type of every create/open operation.

use std::path::PathBuf;

use crate::Kind;

/// Why a shared file could not be created, opened or validated.
///
/// Every variant that describes a mismatch names what was expected and what was found.
/// Contention is never an error; these are all "this file is not usable as asked".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MmfError {
    /// The file does not exist.
    #[error("{path}: no such file")]
    NotFound {
        /// The path that was opened.
        path: PathBuf,
    },
    /// `create` found something at the path already; it never clobbers.
    #[error("{path}: already exists")]
    AlreadyExists {
        /// The path that was created.
        path: PathBuf,
    },
    /// `create` found a symbolic link at the final path and refused to follow it.
    #[error("{path}: is a symbolic link; refusing to create through it")]
    Symlink {
        /// The path that was created.
        path: PathBuf,
    },
    /// The path names something that is not a regular file.
    #[error("{path}: not a regular file")]
    NotAFile {
        /// The path that was opened.
        path: PathBuf,
    },
    /// The file is shorter than the fixed header.
    #[error("file too short: expected at least {expected} bytes, found {found}")]
    TooShort {
        /// Minimum length in bytes.
        expected: u64,
        /// Actual length in bytes.
        found: u64,
    },
    /// The file length does not match the layout its header declares.
    #[error("wrong file length: layout needs {expected} bytes, file has {found}")]
    WrongLength {
        /// Length implied by the validated layout.
        expected: u64,
        /// Actual length in bytes.
        found: u64,
    },
    /// The magic number is not cxc's.
    #[error("bad magic: expected {expected:#018x}, found {found:#018x}")]
    BadMagic {
        /// cxc's magic.
        expected: u64,
        /// What the file holds.
        found: u64,
    },
    /// The file was written on a machine of the other byte order.
    #[error("byte-order mark mismatch: expected {expected:#010x}, found {found:#010x}")]
    Endianness {
        /// The mark as this machine writes it.
        expected: u32,
        /// What the file holds.
        found: u32,
    },
    /// The format version is not one this build understands.
    #[error("unsupported format version: expected {expected}, found {found}")]
    UnsupportedVersion {
        /// The version this build writes and reads.
        expected: u32,
        /// What the file holds.
        found: u32,
    },
    /// The file holds a different primitive.
    #[error("wrong primitive kind: expected {expected}, found {found}")]
    WrongKind {
        /// The kind the caller asked for.
        expected: Kind,
        /// What the file holds (raw code if unknown).
        found: FoundKind,
    },
    /// A layout parameter does not agree with what the caller or this build expects.
    #[error("parameter `{name}` mismatch: expected {expected}, found {found}")]
    ParamMismatch {
        /// Which parameter.
        name: &'static str,
        /// What was expected (a value or a range).
        expected: String,
        /// What the file holds.
        found: u64,
    },
    /// The payload type recorded in the file is not the caller's `T`.
    #[error("payload type mismatch: expected {expected}, found {found}")]
    TypeMismatch {
        /// Fingerprint of the caller's type.
        expected: crate::TypeFingerprint,
        /// Fingerprint recorded in the file.
        found: crate::TypeFingerprint,
    },
    /// The header's checksum does not match its contents (corrupt header).
    #[error("header checksum mismatch: expected {expected:#018x}, found {found:#018x}")]
    HeaderChecksum {
        /// Checksum computed over the header.
        expected: u64,
        /// Checksum stored in the header.
        found: u64,
    },
    /// The file never reached the initialised state within the timeout.
    #[error("file not initialised after {waited_ms} ms (init state {found})")]
    NotInitialised {
        /// How long `open` waited.
        waited_ms: u64,
        /// The init-state word found last.
        found: u32,
    },
    /// The caller asked for a layout this build cannot represent.
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// An operating-system error.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A primitive kind code found in a file: known or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundKind {
    /// A kind this build knows.
    Known(Kind),
    /// A code this build does not know.
    Unknown(u32),
}

impl std::fmt::Display for FoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FoundKind::Known(k) => write!(f, "{k}"),
            FoundKind::Unknown(c) => write!(f, "unknown kind code {c}"),
        }
    }
}

impl MmfError {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        MmfError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

//! The error type of `SharedSemaphore`'s create/open family, and creation options.

use std::time::Duration;

/// Why a semaphore could not be created, opened or registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreError {
    /// The file could not be created, opened or validated.
    #[error(transparent)]
    File(#[from] cxc_mmf::MmfError),
    /// `max_permits` is 0 or above the limit, or `initial` exceeds `max_permits`.
    #[error(
        "invalid permits: expected 1 <= max_permits <= {limit} and initial <= max_permits, \
         found initial {initial}, max_permits {max}"
    )]
    InvalidPermits {
        /// The initial permit count asked for.
        initial: u32,
        /// The `max_permits` asked for.
        max: u32,
        /// The largest `max_permits` the file format can hold.
        limit: u32,
    },
    /// The holder-table capacity is 0 or above the limit.
    #[error("invalid holder-table capacity: expected 1..={limit}, found {requested}")]
    InvalidCapacity {
        /// The capacity asked for.
        requested: u32,
        /// The largest capacity the file format can hold.
        limit: u32,
    },
    /// Every holder slot belongs to a live process, so this process cannot be tracked
    /// (and so may not take permits).
    #[error(
        "holder table full: all {capacity} slots belong to live processes (create the file \
         with a larger SemaphoreOptions::holders)"
    )]
    TableFull {
        /// The table's capacity.
        capacity: u32,
    },
    /// This process is in another pid namespace than the file's creator, so its pid
    /// cannot be checked by the others (nor theirs by it): it may not use the file.
    #[error(
        "pid namespace mismatch: file created in namespace {expected}, this process is in {found}"
    )]
    ForeignPidNamespace {
        /// The creator's pid-namespace id.
        expected: u64,
        /// This process's pid-namespace id.
        found: u64,
    },
}

/// How [`SharedSemaphore::create_with`](crate::SharedSemaphore::create_with) makes the
/// file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreOptions {
    /// Permission bits of the new file (default `0o600`).
    pub mode: u32,
    /// Holder-table capacity: how many processes can use the semaphore at once (default
    /// 64; at most `SharedSemaphore::MAX_HOLDERS`). A process that finds the table full
    /// of live processes is refused at `open` with `SemaphoreError::TableFull`.
    pub holders: u32,
    /// How long `open`/`create_or_open` wait for a concurrent creator (default 2 s).
    pub init_timeout: Duration,
}

impl Default for SemaphoreOptions {
    fn default() -> Self {
        SemaphoreOptions {
            mode: 0o600,
            holders: 64,
            init_timeout: Duration::from_secs(2),
        }
    }
}

crate::macros::setters!(SemaphoreOptions {
    mode: u32,
    holders: u32,
    init_timeout: Duration
});

/// Checks that this process may use a file created in pid namespace `file_ns`.
#[cfg(not(cxc_loom))]
pub(super) fn check_namespace(file_ns: u64) -> Result<(), SemaphoreError> {
    crate::holders::check_namespace(file_ns)
        .map_err(|(expected, found)| SemaphoreError::ForeignPidNamespace { expected, found })
}

//! Error types of `SharedRwLock` and creation options.

use std::time::Duration;

/// Why a lock file could not be created, opened or registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RwLockError {
    /// The file could not be created, opened or validated.
    #[error(transparent)]
    File(#[from] cxc_mmf::MmfError),
    /// The holder-table capacity is 0 or above the limit.
    #[error("invalid holder-table capacity: expected 1..={limit}, found {requested}")]
    InvalidCapacity {
        /// The capacity asked for.
        requested: u32,
        /// The largest capacity the file format can hold.
        limit: u32,
    },
    /// The grace period is zero or does not fit in 64 bits of nanoseconds.
    #[error("invalid grace period: expected 1 ns..=584 years, found {found:?}")]
    InvalidGrace {
        /// The grace period asked for.
        found: Duration,
    },
    /// `T` is larger than a payload buffer.
    #[error("payload too large: expected at most {max} bytes, found {found}")]
    PayloadTooLarge {
        /// The largest payload.
        max: usize,
        /// `size_of::<T>()`.
        found: usize,
    },
    /// `T` needs a larger alignment than a payload buffer has.
    #[error("payload alignment too large: expected at most {max}, found {found}")]
    PayloadAlign {
        /// The buffers' alignment.
        max: usize,
        /// `align_of::<T>()`.
        found: usize,
    },
    /// Every holder slot belongs to a live process, so this process cannot be tracked
    /// (and so may take neither read nor write locks).
    #[error(
        "holder table full: all {capacity} slots belong to live processes (create the file \
         with a larger RwLockOptions::holders)"
    )]
    TableFull {
        /// The table's capacity.
        capacity: u32,
    },
    /// This process is in another pid namespace than the file's creator.
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

/// Why an operation of a write guard was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteGuardError {
    /// The write lock was taken from this guard (its process was found dead, or it made
    /// no progress for the grace period while others waited); nothing it writes is ever
    /// published.
    #[error("write lock lost: token {token} was evicted")]
    Lost {
        /// The guard's fencing token.
        token: u64,
    },
    /// Every payload buffer is published or quarantined for evicted writers that are
    /// still alive (stopped): the write cannot be staged.
    #[error("no free payload buffer: all are published or quarantined for evicted, live writers")]
    NoBuffer,
}

/// How [`SharedRwLock::create_with`](crate::SharedRwLock::create_with) makes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockOptions {
    /// Permission bits of the new file (default `0o600`).
    pub mode: u32,
    /// Holder-table capacity: how many processes can use the lock at once (default 64;
    /// at most `SharedRwLock::MAX_HOLDERS`).
    pub holders: u32,
    /// How long a writer may go without progress (taking the lock, a write, `beat`; a
    /// writer waiting for readers beats every 20 ms by itself) while others wait before it
    /// is evicted (default 1 s). Stored in the file.
    pub grace: Duration,
    /// How long `open`/`create_or_open` wait for a concurrent creator (default 2 s).
    pub init_timeout: Duration,
}

impl Default for RwLockOptions {
    fn default() -> Self {
        RwLockOptions {
            mode: 0o600,
            holders: 64,
            grace: Duration::from_secs(1),
            init_timeout: Duration::from_secs(2),
        }
    }
}

crate::macros::setters!(RwLockOptions { mode: u32, holders: u32, grace: Duration, init_timeout: Duration });

//! Claims, options and errors of the owner lease.

use std::time::Duration;

use cxc_mmf::MmfError;

use crate::epoch::EpochMode;

/// A fenced claim on an [`OwnerLease`](super::OwnerLease): who holds it (an identity-table
/// slot naming the claiming process and the pid the claim was made for) and the claim's
/// generation (the fencing token).
///
/// Generations strictly increase on every handover, so a storage system that remembers
/// the highest token it has seen can reject writes from a holder that lost the lease
/// (seed 003: a stale claim never clears or supersedes the current one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseClaim {
    /// Claim word bits identifying the claim (holder slot and low generation bits).
    pub(crate) id: u64,
    /// The pid the claim was made for.
    pub(crate) pid: u32,
    /// The pid of the process that made the claim: only that process may write, beat or
    /// release with it (a copy in a forked child, or a token read by another process
    /// through `current_claim`, can only be checked with `is_current`).
    pub(crate) proc: u32,
    /// Full 64-bit generation.
    pub(crate) generation: u64,
    /// Whether the previous holder died in the middle of an update.
    pub(crate) inherited_torn: bool,
}

impl LeaseClaim {
    /// The pid this claim was made for.
    #[inline]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The fencing token: strictly increasing on every handover of the lease.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// `true` when this claim took over from a holder that died (or was presumed dead)
    /// in the middle of a write or a `with_lease` closure — the analogue of a robust
    /// mutex's `EOWNERDEAD`. The payload is the last value that holder *published*
    /// (never a torn mix), but the application-level update it was making is incomplete:
    /// check and restore the payload, then write it (a successful write clears the flag).
    #[inline]
    pub fn payload_may_be_inconsistent(&self) -> bool {
        self.inherited_torn
    }
}

/// Who may take a lease from a live holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preemption {
    /// Seed behaviour: a claimant with a lower pid preempts a higher-pid holder.
    #[default]
    LowerPid,
    /// A live holder is never preempted; only a vacant, stale or dead claim is taken.
    Never,
}

impl Preemption {
    pub(crate) fn code(self) -> u64 {
        match self {
            Preemption::LowerPid => 0,
            Preemption::Never => 1,
        }
    }

    pub(crate) fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Preemption::LowerPid),
            1 => Some(Preemption::Never),
            _ => None,
        }
    }
}

/// Options for [`OwnerLease::create_with`](super::OwnerLease::create_with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Preemption policy (default: lower pid preempts).
    pub preemption: Preemption,
    /// Epoch source (default: manual `tick_epoch`).
    pub epoch: EpochMode,
    /// File permission bits (default `0o600`).
    pub mode: u32,
    /// How long `create_or_open` waits for another process's initialisation.
    pub init_timeout: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            preemption: Preemption::LowerPid,
            epoch: EpochMode::Manual,
            mode: 0o600,
            init_timeout: Duration::from_secs(2),
        }
    }
}

/// Why an [`OwnerLease`](super::OwnerLease) could not be created or opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The file layer refused (missing, corrupt, foreign or mismatched file, I/O).
    #[error(transparent)]
    File(#[from] MmfError),
    /// The payload type is larger than the lease's 48-byte payload.
    #[error("payload of {found} bytes exceeds the {max}-byte lease payload")]
    PayloadTooLarge {
        /// The limit (48).
        max: usize,
        /// `size_of::<T>()`.
        found: usize,
    },
    /// The payload type needs more alignment than 8.
    #[error("payload alignment {found} exceeds {max}")]
    PayloadAlign {
        /// The limit (8).
        max: usize,
        /// `align_of::<T>()`.
        found: usize,
    },
    /// An option is out of range (e.g. a clock tick of zero).
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

/// Grace, in epochs, of the guards of a handle made by the seed constructors (or of a
/// file with manual epochs, unless [`LeaseBuilder::grace_epochs`](super::LeaseBuilder::grace_epochs)
/// says otherwise).
pub const DEFAULT_GRACE_EPOCHS: u64 = 3;

/// How a handle's guards claim: the grace in epochs after which a holder whose heartbeat
/// stopped is replaced, and the pid their identity slot names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuardSettings {
    pub(crate) grace: u64,
    /// 0: this process's own pid.
    pub(crate) pid: u32,
}

impl GuardSettings {
    pub(crate) fn for_mode(_epoch: EpochMode) -> Self {
        GuardSettings {
            grace: DEFAULT_GRACE_EPOCHS,
            pid: 0,
        }
    }
}

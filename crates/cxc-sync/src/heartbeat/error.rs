//! The error type of the heartbeat table's create/open/register family.

use crate::epoch::EpochMode;

/// Why a heartbeat table could not be created, opened, or a slot registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeartbeatError {
    /// The file layer refused the file (exists, missing, wrong kind, bad parameters, ...).
    #[error(transparent)]
    File(#[from] cxc_mmf::MmfError),
    /// The requested capacity is 0 or above the maximum.
    #[error("invalid capacity {requested}: must be between 1 and {max}")]
    InvalidCapacity {
        /// What the caller asked for.
        requested: usize,
        /// The largest capacity accepted.
        max: usize,
    },
    /// The requested epoch mode is not valid (clock tick out of range).
    #[error("invalid epoch mode {0:?}")]
    InvalidEpochMode(EpochMode),
    /// Every slot is registered to a live (or not yet reclaimed) worker.
    #[error("heartbeat table full: no free, reclaimed or dead slot")]
    TableFull,
    /// Pid 0 marks a free slot and cannot register.
    #[error("pid 0 cannot register")]
    InvalidPid,
    /// The registration was fenced: a watchdog declared the worker dead and reclaimed
    /// its in-flight work (or it was unregistered, or the slot is not this handle's).
    #[error("heartbeat slot {slot} was fenced: the worker was declared dead")]
    Fenced {
        /// The slot.
        slot: usize,
    },
    /// An in-flight bit outside 0..64.
    #[error("in-flight bit {bit} out of range (0..64)")]
    BitOutOfRange {
        /// The bit given.
        bit: u8,
    },
}

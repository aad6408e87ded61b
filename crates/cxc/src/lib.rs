//! cxc: cross-process synchronization primitives that live in memory-mapped files.
//!
//! This facade re-exports the public API of the cxc crates; it holds no logic. Every
//! primitive lives in one file that any process may open; see `docs/api.md` for the three
//! API layers (guards, fenced claims, the seed calls).
//!
//! # [`OwnerLease`]: a cross-process mutex that survives a crashed or hung holder
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use cxc::OwnerLease;
//! let lease = OwnerLease::builder(dir.path().join("jobs.lease")).create(0u64)?;
//! let guard = lease.lock();
//! guard.update(|n| *n += 1)?;
//! assert_eq!(guard.read()?, 1);
//! let fencing_token = guard.token();
//! # let _ = fencing_token;
//! drop(guard); // released
//! # Ok(())
//! # }
//! ```
//!
//! # [`SharedSemaphore`]: permits that come back when a holder dies
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use cxc::SharedSemaphore;
//! let sem = SharedSemaphore::create(dir.path().join("encoders.sem"), 2, 2)?;
//! let permit = sem.try_acquire().expect("2 free");
//! assert_eq!(sem.available(), 1);
//! drop(permit);
//! assert_eq!(sem.available(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # [`HeartbeatTable`] and [`FailoverWatchdog`]: reclaim a dead worker's work once
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use cxc::{FailoverWatchdog, HeartbeatTable};
//! let table = HeartbeatTable::create(dir.path().join("workers.hb"), 16)?;
//! let slot = table.register(std::process::id())?;
//! assert!(table.mark_in_flight(slot, 3));
//! assert!(table.beat(slot));
//! let report = FailoverWatchdog::new(&table).scan();
//! assert!(report.dead_slots.is_empty(), "this worker is alive");
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use cxc_mmf as mmf;
pub use cxc_mmf::{Kind, MmfError};
pub use cxc_sync::{
    DEFAULT_GRACE_EPOCHS, DEFAULT_OS_CHECK_INTERVAL, FailoverWatchdog, HEARTBEAT_MAX_CAPACITY,
    HeartbeatError, HeartbeatOptions, HeartbeatSnapshot, HeartbeatTable, InFlightBits,
    ReclaimReport, Registration, heartbeat_counter,
};
pub use cxc_sync::{
    EpochMode, GuardError, LeaseBuilder, LeaseClaim, LeaseError, LeaseGuard, LeaseOptions,
    LeaseStatus, OwnedLeaseGuard, OwnerLease, Preemption,
};
pub use cxc_sync::{
    FencedGuard, FencedLease, FencedLeaseGuards, MmapLease, PermitPool, PermitPoolGuards,
    PoolPermit,
};

/// Lease internals useful to tools: counter names, type-erased inspection.
pub mod lease {
    pub use cxc_sync::lease::{
        DEFAULT_GRACE, DEFAULT_GRACE_EPOCHS, DEFAULT_TICK, PAYLOAD_BYTES, counter, inspect,
    };
}

pub use cxc_sidecar as sidecar;
pub use cxc_sidecar::{
    AdaptiveInstance, AdaptiveSpin, HandshakeHeader, Observation, ObservationRing, OpCode, Policy,
    Sidecar, SidecarBox, Strategy,
};
pub use cxc_sync::{
    HolderInfo, ManyPermits, OwnedPermit, Permit, SemaphoreError, SemaphoreOptions, SemaphoreStats,
    SharedSemaphore,
};
pub use cxc_sync::{
    ReadGuard, RwLockError, RwLockOptions, SharedRwLock, WriteGuard, WriteGuardError,
};

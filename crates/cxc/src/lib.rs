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
//! # [`SharedCell`]: one value any process may store and every process loads without blocking
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use cxc::SharedCell;
//! let cell = SharedCell::create(dir.path().join("rate.cell"), [0u64; 2])?;
//! cell.store([10, 20])?;
//! cell.update(|v| v[1] += 1)?;
//! assert_eq!(cell.load(), [10, 21]);
//! # Ok(())
//! # }
//! ```
//!
//! # Payload types: zerocopy's traits and derives, re-exported
//!
//! Payloads must be valid for every bit pattern. Derive the traits through `cxc`; a
//! struct with padding must make the padding an explicit field (zerocopy refuses
//! `IntoBytes` for a struct with implicit padding bytes):
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! #[derive(cxc::FromBytes, cxc::IntoBytes, cxc::Immutable, cxc::KnownLayout)]
//! #[derive(Debug, Clone, Copy, PartialEq)]
//! #[repr(C)]
//! struct Quote {
//!     price: u64,
//!     venue: u16,
//!     /// Explicit padding: without it `u16` + `u32` + the alignment of `u64` leave two
//!     /// implicit padding bytes, and `IntoBytes` does not derive.
//!     _pad: [u8; 2],
//!     size: u32,
//! }
//! let cell = cxc::SharedCell::create(
//!     dir.path().join("quote.cell"),
//!     Quote { price: 100, venue: 1, _pad: [0; 2], size: 5 },
//! )?;
//! cell.update(|q| q.size += 1)?;
//! assert_eq!(cell.load().size, 6);
//! # Ok(())
//! # }
//! ```
//!
//! ```compile_fail
//! // Implicit padding (2 bytes after `venue`): `IntoBytes` refuses it.
//! #[derive(cxc::FromBytes, cxc::IntoBytes, cxc::Immutable, cxc::KnownLayout)]
//! #[repr(C)]
//! struct Padded { price: u64, venue: u16, size: u32 }
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
/// Async waiting (feature `async`, `docs/async.md`).
#[cfg(feature = "async")]
pub use cxc_sync::{
    ASYNC_IDLE_MAX, ASYNC_MAX_FILES, ASYNC_TICK, AcquireFuture, LeaseLost, LockFuture,
    OwnedLockFuture, ReadFuture, WriteFuture, async_waiters, block_on,
};
pub use cxc_sync::{
    DEFAULT_GRACE_EPOCHS, DEFAULT_OS_CHECK_INTERVAL, FailoverWatchdog, HEARTBEAT_MAX_CAPACITY,
    HeartbeatError, HeartbeatOptions, HeartbeatSnapshot, HeartbeatStats, HeartbeatTable,
    HeartbeatTableSnapshot, InFlightBits, OwnedRegistration, ReclaimReport, Registration,
    heartbeat_counter,
};
pub use cxc_sync::{
    EpochMode, GuardError, LeaseBuilder, LeaseClaim, LeaseError, LeaseGuard, LeaseOptions,
    LeaseStats, LeaseStatus, OwnedLeaseGuard, OwnerLease, Preemption,
};
pub use cxc_sync::{
    FencedGuard, FencedLease, FencedLeaseGuards, MmapLease, PermitPool, PermitPoolGuards,
    PoolPermit,
};

/// Lease internals useful to tools: counter names, type-erased read-only inspection.
pub mod lease {
    pub use cxc_sync::lease::{
        DEFAULT_GRACE, DEFAULT_GRACE_EPOCHS, DEFAULT_TICK, NO_OWNER, PAYLOAD_BYTES, counter,
        inspect,
    };
}

pub use cxc_sync::{
    Abandoned, CellStatus, DEFAULT_STALL_TIMEOUT, SeqLock, SeqLockError, SharedCell, WriteError,
    Written,
};

/// zerocopy's traits and derive macros, for payload types (`#[derive(cxc::FromBytes, ..)]`).
pub use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Process identity and liveness (as `cxc_sync::liveness`), and the op code of the
/// watchdog's per-scan observation.
pub mod liveness {
    pub use cxc_sync::liveness::*;

    /// The op code of the observation a `FailoverWatchdog` scan records in its
    /// `HeartbeatTable`'s ring (`arg`: the number of dead slots found). An alias of
    /// [`OpCode::HeartbeatScan`](cxc_sidecar::OpCode::HeartbeatScan).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use cxc::{AdaptiveInstance, FailoverWatchdog, HeartbeatTable, SidecarBox, liveness};
    /// let table = SidecarBox::new(HeartbeatTable::create(dir.path().join("w.hb"), 4)?);
    /// FailoverWatchdog::new(&table).scan();
    /// assert!(table.ring().snapshot().iter().any(|o| o.op == liveness::OP_SCAN));
    /// assert_eq!(liveness::OP_SCAN.name(), "heartbeat.scan");
    /// # Ok(())
    /// # }
    /// ```
    pub const OP_SCAN: cxc_sidecar::OpCode = cxc_sidecar::OpCode::HeartbeatScan;
}

pub use cxc_sidecar as sidecar;
pub use cxc_sidecar::{
    AdaptiveInstance, AdaptiveSpin, HandshakeHeader, Observation, ObservationRing, OpCode, Policy,
    Sidecar, SidecarBox, Strategy,
};
pub use cxc_sync::election;
pub use cxc_sync::{
    ElectionBackend, ElectionConfig, ElectionError, ElectionEvent, Elector, FencedFile,
    FencedResource, Leader, Leadership, MmapElection, Renewal,
};
pub use cxc_sync::{
    HolderInfo, ManyPermits, OwnedPermit, Permit, SemaphoreError, SemaphoreOptions,
    SemaphoreSnapshot, SemaphoreStats, SharedSemaphore,
};
pub use cxc_sync::{
    ReadGuard, RwHolderInfo, RwLockError, RwLockOptions, RwLockSnapshot, RwLockStats, SharedRWLock,
    SharedRwLock, WriteGuard, WriteGuardError,
};

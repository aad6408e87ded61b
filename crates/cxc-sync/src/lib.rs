//! Cross-process synchronization primitives that live in memory-mapped files.
//!
//! - [`epoch`]: manual or clock-driven epochs, the time base of heartbeats.
//! - [`HeartbeatTable`] / [`FailoverWatchdog`]: worker heartbeats with in-flight work
//!   bits, and failover (fence + reclaim) of dead workers' work.
//! - [`liveness`]: process identity (pidfs inode or pid + start time, pid namespace, boot
//!   id) and whether the process is still alive (re-exported from `cxc_mmf::identity`).
//! - [`SeqLock`] / [`SharedCell`]: a sequence lock (readers never block, never see a torn
//!   value; a stalled or dead writer never exposes its bytes nor wedges the lock), on the
//!   heap or in a file of its own, with its own protocol (per-thread writer slots, one
//!   CAS per write).
//! - [`SharedSemaphore`]: a counting semaphore with crash recovery (like `SEM_UNDO`).
//! - [`SharedRwLock`]: a reader-writer lock (writer preference) surviving dead readers
//!   and dead or stopped writers.
//! - [`backend`]: [`FencedLease`] and [`PermitPool`], the blocking traits that the
//!   mapped-file primitives ([`MmapLease`], [`SharedSemaphore`]) and `cxc-etcd` implement.
//! - [`election`]: fenced, progress-driven leader election ([`Elector`]) on any backend,
//!   and [`FencedResource`] storage that refuses stale tokens.

#![cfg_attr(cxc_loom, allow(dead_code, unused_imports))]

#[cfg(all(feature = "async", not(cxc_loom)))]
mod asyncs;
#[cfg(all(feature = "async", not(cxc_loom)))]
pub use asyncs::{
    AcquireFuture, IDLE_MAX as ASYNC_IDLE_MAX, LeaseLost, LockFuture, MAX_WORDS as ASYNC_MAX_FILES,
    OwnedLockFuture, ReadFuture, TICK as ASYNC_TICK, WriteFuture, async_waiters, block_on,
};
pub mod backend;
#[cfg(not(cxc_loom))]
mod backend_guard;
#[cfg(not(cxc_loom))]
pub mod election;
pub mod epoch;
mod forklock;
pub(crate) mod futex;
mod heartbeat;
#[cfg(not(cxc_loom))]
mod holders;
pub mod liveness;
mod macros;
pub(crate) mod park;
mod payload;
pub(crate) mod primitive;
mod rwlock;
mod semaphore;
mod seqlock;

#[cfg(not(cxc_loom))]
pub use backend::MmapLease;
pub use backend::{FencedLease, PermitPool};
#[cfg(not(cxc_loom))]
pub use backend_guard::{FencedGuard, FencedLeaseGuards, PermitPoolGuards, PoolPermit};
#[cfg(not(cxc_loom))]
pub use election::{
    ElectionBackend, ElectionConfig, ElectionError, ElectionEvent, Elector, FencedFile,
    FencedResource, Leader, Leadership, MmapElection, Renewal,
};
pub use epoch::EpochMode;
pub mod lease;

#[cfg(not(cxc_loom))]
pub use heartbeat::HeartbeatTableSnapshot;
#[cfg(not(cxc_loom))]
pub use heartbeat::{
    DEFAULT_GRACE_EPOCHS, DEFAULT_OS_CHECK_INTERVAL, FailoverWatchdog, HeartbeatOptions,
    HeartbeatTable, InFlightBits, OwnedRegistration, ReclaimReport, Registration,
};
pub use heartbeat::{
    HEARTBEAT_MAX_CAPACITY, HeartbeatError, HeartbeatSnapshot, HeartbeatStats, heartbeat_counter,
};
#[cfg(not(cxc_loom))]
pub use lease::{GuardError, LeaseBuilder, LeaseGuard, LeaseStatus, OwnedLeaseGuard, OwnerLease};
pub use lease::{LeaseClaim, LeaseError, LeaseOptions, LeaseStats, Preemption};
pub use rwlock::{PAYLOAD_BYTES as RWLOCK_PAYLOAD_BYTES, RwLockStats};
#[cfg(not(cxc_loom))]
pub use rwlock::{
    ReadGuard, RwHolderInfo, RwLockError, RwLockOptions, RwLockSnapshot, SharedRwLock, WriteGuard,
    WriteGuardError,
};
/// The seed's spelling of [`SharedRwLock`] (seed 000, "Pitfalls").
#[cfg(not(cxc_loom))]
pub type SharedRWLock<T> = SharedRwLock<T>;
#[cfg(not(cxc_loom))]
pub use semaphore::{
    HolderInfo, ManyPermits, OwnedPermit, Permit, SemaphoreSnapshot, SemaphoreStats,
    SharedSemaphore,
};
pub use semaphore::{SemaphoreError, SemaphoreOptions};
#[cfg(not(cxc_loom))]
pub use seqlock::{
    Abandoned, CellStatus, DEFAULT_STALL_TIMEOUT, SeqLock, SeqLockError, SharedCell, WriteError,
    Written,
};

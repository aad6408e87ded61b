//! cxc: cross-process synchronization primitives that live in memory-mapped files.
//!
//! This facade re-exports the public API of the cxc crates; it holds no logic.
#![forbid(unsafe_code)]

pub use cxc_mmf as mmf;
pub use cxc_mmf::{Kind, MmfError};
pub use cxc_sync::{
    DEFAULT_GRACE_EPOCHS, DEFAULT_OS_CHECK_INTERVAL, FailoverWatchdog, HEARTBEAT_MAX_CAPACITY,
    HeartbeatError, HeartbeatOptions, HeartbeatSnapshot, HeartbeatTable, InFlightBits,
    ReclaimReport, heartbeat_counter,
};
pub use cxc_sync::{
    EpochMode, GuardError, LeaseBuilder, LeaseClaim, LeaseError, LeaseGuard, LeaseOptions,
    LeaseStatus, OwnedLeaseGuard, OwnerLease, Preemption,
};
pub use cxc_sync::{FencedLease, MmapLease, PermitPool};

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
    HolderInfo, Permit, SemaphoreError, SemaphoreOptions, SemaphoreStats, SharedSemaphore,
};

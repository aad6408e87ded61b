//! Cross-process synchronization primitives that live in memory-mapped files.
//!
//! - [`epoch`]: manual or clock-driven epochs, the time base of heartbeats.
//! - [`liveness`]: process identity (pid + start time) and whether it is still alive.

#![cfg_attr(cxc_loom, allow(dead_code, unused_imports))]

pub mod epoch;
pub(crate) mod futex;
pub mod liveness;
pub(crate) mod primitive;

pub use epoch::EpochMode;
pub mod lease;

pub use lease::{LeaseClaim, LeaseError, LeaseOptions, Preemption};
#[cfg(not(cxc_loom))]
pub use lease::{LeaseStatus, OwnerLease};

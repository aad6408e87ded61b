//! [`OwnerLease<T>`]: a cross-process mutex with failover, fencing tokens and crash-safe
//! payload updates (seed 000 + seed 003; `docs/owner-lease.md`).

mod claim;
mod claiming;
mod ident;
#[cfg(all(test, cxc_loom))]
mod loom_tests;
mod os;
mod state;
mod word;
mod write;

pub use claim::{DEFAULT_GRACE_EPOCHS, LeaseClaim, LeaseError, LeaseOptions, Preemption};
pub use state::{PAYLOAD_BYTES, counter};

#[cfg(all(feature = "async", not(cxc_loom)))]
mod async_hooks;
#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use state::LeaseState as LeaseStateRef;

#[cfg(not(cxc_loom))]
mod blocking;
#[cfg(not(cxc_loom))]
mod builder;
#[cfg(not(cxc_loom))]
mod file;
#[cfg(not(cxc_loom))]
mod guard;
#[cfg(not(cxc_loom))]
mod seed;
#[cfg(not(cxc_loom))]
mod status;
#[cfg(not(cxc_loom))]
mod watch;
#[cfg(not(cxc_loom))]
pub use builder::{DEFAULT_GRACE, DEFAULT_TICK, LeaseBuilder};
#[cfg(not(cxc_loom))]
pub use file::OwnerLease;
#[cfg(not(cxc_loom))]
pub use guard::{GuardError, LeaseGuard, OwnedLeaseGuard};
#[cfg(not(cxc_loom))]
pub use status::{LeaseStatus, inspect};

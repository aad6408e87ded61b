//! [`OwnerLease<T>`]: a cross-process mutex with failover, fencing tokens and crash-safe
//! payload updates (seed 000 + seed 003; `docs/owner-lease.md`).

mod claim;
mod claiming;
mod ident;
#[cfg(all(test, cxc_loom))]
mod loom_tests;
mod os;
#[cfg(all(target_os = "linux", not(cxc_loom)))]
mod sentinel;
mod slot;
mod state;
mod word;
mod write;

pub use claim::{DEFAULT_GRACE_EPOCHS, LeaseClaim, LeaseError, LeaseOptions, Preemption};
#[cfg(all(feature = "async", target_os = "linux", not(cxc_loom)))]
pub(crate) use sentinel::host as host_on_sentinel;

/// Whether this process's sentinel thread could not be started yet and will be tried
/// again (`sentinel.rs`); never without a sentinel module.
#[inline]
fn sentinel_start_pending() -> bool {
    #[cfg(all(target_os = "linux", not(cxc_loom)))]
    return sentinel::start_pending();
    #[cfg(not(all(target_os = "linux", not(cxc_loom))))]
    return false;
}
pub use state::{LeaseStats, PAYLOAD_BYTES, counter};

/// The seed's name for "no owner": pid 0 is reserved and never a holder (every call
/// refuses it). [`OwnerLease::current_owner`](crate::OwnerLease::current_owner) reports
/// a vacant lease as `None`.
pub const NO_OWNER: u32 = 0;

#[cfg(all(feature = "async", not(cxc_loom)))]
mod async_hooks;
#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use file::{SLOT_POLL, SLOT_POLL_MAX};
#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use state::LeaseState as LeaseStateRef;

crate::macros::not_loom! {
    mod blocking;
    mod builder;
    mod file;
    mod guard;
    mod seed;
    mod status;
    mod watch;

    pub use builder::{DEFAULT_GRACE, DEFAULT_TICK, LeaseBuilder};
    pub use file::OwnerLease;
    pub use guard::{GuardError, LeaseGuard, OwnedLeaseGuard};
    pub use status::{LeaseStatus, inspect};
}

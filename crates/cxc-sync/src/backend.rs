//! Backend-neutral traits: a fenced lease ([`FencedLease`]) and a permit pool
//! ([`PermitPool`]), so one application can run on the mapped-file primitives of this
//! crate or on a networked backend (`cxc-etcd`) by changing only its constructor.
//!
//! Both traits are blocking and synchronous, and every method can fail with the
//! backend's error (a network backend can lose its server; the mapped-file backends use
//! [`Infallible`]). Contention is not an error: it is `Ok(None)` / `Ok(false)`.
//!
//! | trait method            | [`MmapLease<T>`] ([`OwnerLease<T>`])       | `cxc_etcd::EtcdLease<T>`                     |
//! |-------------------------|--------------------------------------------|----------------------------------------------|
//! | claim identity          | the pid given to [`MmapLease::new`]        | the handle's etcd session (an etcd lease)    |
//! | generation              | claim counter, +1 per handover             | the holding contender key's create revision  |
//! | failover                | stale heartbeat (grace) or dead pid        | session TTL expiry                           |
//! | fenced write            | a WRITE CAS, then one publication CAS that succeeds only if the claim is current | a transaction comparing the contender key and the value's version |
//!
//! | trait method            | [`SharedSemaphore`]                        | `cxc_etcd::EtcdSemaphore`                    |
//! |-------------------------|--------------------------------------------|----------------------------------------------|
//! | [`PermitPool::give`]    | returns a permit this process holds, else a handed-off one; refused otherwise or at `max` | returns one this handle took; else refused   |
//! | crash recovery          | dead pid's permits (like `SEM_UNDO`)       | dead session's holder keys expire (TTL)      |

use std::convert::Infallible;
use std::fmt::Debug;
use std::time::Duration;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::lease::LeaseClaim;
#[cfg(not(cxc_loom))]
use crate::{OwnerLease, SharedSemaphore};

/// A lease with fencing tokens: at most one holder at a time, a claim carries a
/// generation that strictly increases on every handover, and every owner operation
/// succeeds only while the claim is still the current one (`docs/design.md` §3, L1–L3).
///
/// A handle is one holder identity: two threads sharing a handle share its claim
/// (claiming again while holding returns the same claim). Give each contender its own
/// handle.
///
/// # Errors
/// Every method returns `Err` only when the backend itself failed (for example the
/// server could not be reached); the outcome of a write or release that failed this way
/// is unknown, so check [`is_current`](FencedLease::is_current) or claim again. A backend
/// may then refuse further writes until the holder reads again (etcd returns
/// `EtcdError::Conflict`, so that a write that timed out can never be overtaken by a
/// later one and then applied over it).
pub trait FencedLease {
    /// The fenced claim: who holds the lease and at which generation.
    type Claim: Copy + Debug + Send + Sync;
    /// The payload guarded by the lease.
    type Value;
    /// Why the backend could not answer.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Claims the lease if it is free (or its holder failed over), without blocking.
    /// `Ok(None)` if someone else holds it.
    fn try_claim(&self) -> Result<Option<Self::Claim>, Self::Error>;

    /// Claims the lease, blocking at most `timeout`; `Ok(None)` on timeout.
    fn acquire(&self, timeout: Duration) -> Result<Option<Self::Claim>, Self::Error>;

    /// The payload, if `claim` is current when it is read; `Ok(None)` for a stale claim.
    fn read(&self, claim: &Self::Claim) -> Result<Option<Self::Value>, Self::Error>;

    /// Writes the payload if `claim` is current (one atomic step); `Ok(false)` for a
    /// stale claim, and then nothing was written.
    fn write(&self, claim: &Self::Claim, value: Self::Value) -> Result<bool, Self::Error>;

    /// Proves the holder is alive (heartbeat / keep-alive); `Ok(false)` means the claim
    /// was lost.
    fn beat(&self, claim: &Self::Claim) -> Result<bool, Self::Error>;

    /// Releases `claim` if it is current; a stale claim never clears a newer one.
    fn release(&self, claim: &Self::Claim) -> Result<bool, Self::Error>;

    /// Whether `claim` is the current claim.
    fn is_current(&self, claim: &Self::Claim) -> Result<bool, Self::Error>;

    /// The claim's fencing token: strictly greater for every later claim of this lease.
    fn generation(claim: &Self::Claim) -> u64;
}

/// A counting semaphore: at most [`max`](PermitPool::max) permits out at any instant.
///
/// Permits are counted, not returned as guards, so the trait fits backends whose permits
/// outlive a borrow: [`take`](PermitPool::try_take) hands out one permit and
/// [`give`](PermitPool::give) returns one.
///
/// # Errors
/// As for [`FencedLease`]: `Err` only when the backend failed.
pub trait PermitPool {
    /// Why the backend could not answer.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Takes a permit if one is free, without blocking.
    fn try_take(&self) -> Result<bool, Self::Error>;

    /// Takes a permit, blocking at most `timeout`; `Ok(false)` on timeout.
    fn take_timeout(&self, timeout: Duration) -> Result<bool, Self::Error>;

    /// Returns a permit. `Ok(false)`, changing nothing, if there is nothing to return
    /// (the pool never exceeds its maximum).
    fn give(&self) -> Result<bool, Self::Error>;

    /// Permits free right now (stale as soon as it returns).
    fn available(&self) -> Result<u32, Self::Error>;

    /// The most permits that can be out at once.
    fn max(&self) -> u32;
}

/// [`FencedLease`] on an [`OwnerLease<T>`]: the lease plus the holder pid and heartbeat
/// grace its claims use (the trait's methods take neither).
///
/// # Examples
/// ```
/// use cxc_sync::{FencedLease, MmapLease, OwnerLease};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let file = OwnerLease::create(dir.path().join("l"), 0u64)?;
/// let lease = MmapLease::new(file, std::process::id(), 3);
/// let claim = lease.try_claim()?.expect("vacant");
/// assert!(lease.write(&claim, 7)?);
/// assert!(lease.release(&claim)?);
/// assert!(!lease.write(&claim, 8)?); // stale: refused
/// # Ok(())
/// # }
/// ```
#[cfg(not(cxc_loom))]
#[derive(Debug)]
pub struct MmapLease<T> {
    lease: OwnerLease<T>,
    pid: u32,
    grace: u64,
}

#[cfg(not(cxc_loom))]
impl<T> MmapLease<T> {
    /// Wraps `lease`; claims are made for `pid` (usually `std::process::id()`, so the
    /// OS can prove the holder dead) with heartbeat `grace` epochs.
    pub fn new(lease: OwnerLease<T>, pid: u32, grace: u64) -> Self {
        MmapLease { lease, pid, grace }
    }

    /// The wrapped lease.
    pub fn lease(&self) -> &OwnerLease<T> {
        &self.lease
    }

    /// The pid claims are made for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The heartbeat grace, in epochs.
    pub fn grace(&self) -> u64 {
        self.grace
    }

    /// Unwraps the lease.
    pub fn into_inner(self) -> OwnerLease<T> {
        self.lease
    }
}

#[cfg(not(cxc_loom))]
impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> FencedLease for MmapLease<T> {
    type Claim = LeaseClaim;
    type Value = T;
    type Error = Infallible;

    #[inline]
    fn try_claim(&self) -> Result<Option<LeaseClaim>, Infallible> {
        Ok(self.lease.try_claim(self.pid, self.grace))
    }

    fn acquire(&self, timeout: Duration) -> Result<Option<LeaseClaim>, Infallible> {
        Ok(self.lease.acquire(self.pid, self.grace, timeout))
    }

    #[inline]
    fn read(&self, claim: &LeaseClaim) -> Result<Option<T>, Infallible> {
        Ok(self.lease.read_claimed(claim))
    }

    #[inline]
    fn write(&self, claim: &LeaseClaim, value: T) -> Result<bool, Infallible> {
        Ok(self.lease.write_claimed(claim, value))
    }

    #[inline]
    fn beat(&self, claim: &LeaseClaim) -> Result<bool, Infallible> {
        Ok(self.lease.beat_claimed(claim))
    }

    #[inline]
    fn release(&self, claim: &LeaseClaim) -> Result<bool, Infallible> {
        Ok(self.lease.release_claim(claim))
    }

    #[inline]
    fn is_current(&self, claim: &LeaseClaim) -> Result<bool, Infallible> {
        Ok(self.lease.is_current(claim))
    }

    #[inline]
    fn generation(claim: &LeaseClaim) -> u64 {
        claim.generation()
    }
}

/// The pool is the whole semaphore: a taken permit is `mem::forget`-ed and
/// [`give`](PermitPool::give) is [`SharedSemaphore::release`]: it returns a permit this process
/// holds (through any of its handles), else one handed off with `Permit::disown`; a give
/// by a process that holds none, or with all permits free, is refused. Permits taken through the
/// trait still count as held by this process, so they are reclaimed if it dies.
#[cfg(not(cxc_loom))]
impl PermitPool for SharedSemaphore {
    type Error = Infallible;

    #[inline]
    fn try_take(&self) -> Result<bool, Infallible> {
        Ok(self.try_acquire().map(std::mem::forget).is_some())
    }

    fn take_timeout(&self, timeout: Duration) -> Result<bool, Infallible> {
        Ok(self
            .acquire_timeout(timeout)
            .map(std::mem::forget)
            .is_some())
    }

    #[inline]
    fn give(&self) -> Result<bool, Infallible> {
        Ok(self.release())
    }

    #[inline]
    fn available(&self) -> Result<u32, Infallible> {
        Ok(SharedSemaphore::available(self))
    }

    #[inline]
    fn max(&self) -> u32 {
        self.max_permits()
    }
}

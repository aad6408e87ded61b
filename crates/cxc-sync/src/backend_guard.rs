//! The guard shape of the backend-neutral traits: [`FencedGuard`] over any
//! [`FencedLease`] and [`PoolPermit`] over any [`PermitPool`], so the mapped files and a
//! networked backend (`cxc-etcd`) are used the same way as [`OwnerLease`]'s own guards:
//! released on drop, errors as [`GuardError`] (a loss, or the backend's error).
//!
//! [`OwnerLease`]: crate::OwnerLease

use std::time::Duration;

use crate::backend::{FencedLease, PermitPool};
use crate::lease::GuardError;

fn backend<E: std::error::Error + Send + Sync + 'static>(e: E) -> GuardError {
    GuardError::Backend(Box::new(e))
}

/// The outcome of an explicit release or give-back: whether the backend still counted
/// the claim or permit as ours (`Lost` if not), or its error.
fn given_back<E: std::error::Error + Send + Sync + 'static>(
    r: Result<bool, E>,
) -> Result<(), GuardError> {
    if r.map_err(backend)? {
        Ok(())
    } else {
        Err(GuardError::Lost { successor: None })
    }
}

/// A held claim of any [`FencedLease`]; released when dropped. Created by
/// [`try_lock_guard`](FencedLeaseGuards::try_lock_guard) and
/// [`lock_guard_timeout`](FencedLeaseGuards::lock_guard_timeout).
#[must_use = "the lease is released when the guard is dropped"]
pub struct FencedGuard<'a, L: FencedLease> {
    lease: &'a L,
    claim: L::Claim,
    done: bool,
}

impl<L: FencedLease> FencedGuard<'_, L> {
    /// The claim this guard holds.
    pub fn claim(&self) -> &L::Claim {
        &self.claim
    }

    /// The fencing token: strictly greater for every later claim of the lease.
    pub fn token(&self) -> u64 {
        L::generation(&self.claim)
    }

    /// The payload.
    ///
    /// # Errors
    /// [`GuardError::Lost`] if the claim was lost; [`GuardError::Backend`] if the backend
    /// failed.
    pub fn read(&self) -> Result<L::Value, GuardError> {
        self.lease
            .read(&self.claim)
            .map_err(backend)?
            .ok_or(GuardError::Lost { successor: None })
    }

    /// Writes the payload (fenced: one atomic step on the backend).
    ///
    /// # Errors
    /// As [`read`](Self::read); after a [`GuardError::Backend`] the outcome is unknown.
    pub fn write(&self, value: L::Value) -> Result<(), GuardError> {
        if self.lease.write(&self.claim, value).map_err(backend)? {
            Ok(())
        } else {
            Err(GuardError::Lost { successor: None })
        }
    }

    /// Reads, applies `f`, writes.
    ///
    /// # Errors
    /// As [`read`](Self::read) and [`write`](Self::write).
    pub fn update(&self, f: impl FnOnce(&mut L::Value)) -> Result<(), GuardError> {
        let mut v = self.read()?;
        f(&mut v);
        self.write(v)
    }

    /// Proves the holder is alive.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn beat(&self) -> Result<(), GuardError> {
        if self.lease.beat(&self.claim).map_err(backend)? {
            Ok(())
        } else {
            Err(GuardError::Lost { successor: None })
        }
    }

    /// Whether the claim is still the current one.
    ///
    /// # Errors
    /// [`GuardError::Backend`] if the backend failed.
    pub fn is_current(&self) -> Result<bool, GuardError> {
        self.lease.is_current(&self.claim).map_err(backend)
    }

    /// Releases the claim, reporting a loss (which `Drop` cannot).
    ///
    /// # Errors
    /// [`GuardError::Lost`] if the claim had already been lost; [`GuardError::Backend`].
    pub fn unlock(mut self) -> Result<(), GuardError> {
        self.done = true;
        given_back(self.lease.release(&self.claim))
    }
}

impl<L: FencedLease> Drop for FencedGuard<'_, L> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.lease.release(&self.claim);
        }
    }
}

impl<L: FencedLease> std::fmt::Debug for FencedGuard<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedGuard")
            .field("claim", &self.claim)
            .finish()
    }
}

/// Guards for every [`FencedLease`] (implemented for all of them).
pub trait FencedLeaseGuards: FencedLease + Sized {
    /// Claims without blocking; `Ok(None)` if someone else holds the lease.
    ///
    /// # Errors
    /// The backend's error.
    fn try_lock_guard(&self) -> Result<Option<FencedGuard<'_, Self>>, Self::Error> {
        Ok(self.try_claim()?.map(|claim| FencedGuard {
            lease: self,
            claim,
            done: false,
        }))
    }

    /// Claims, blocking at most `timeout`; `Ok(None)` on timeout.
    ///
    /// # Errors
    /// The backend's error.
    fn lock_guard_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<FencedGuard<'_, Self>>, Self::Error> {
        Ok(self.acquire(timeout)?.map(|claim| FencedGuard {
            lease: self,
            claim,
            done: false,
        }))
    }
}

impl<L: FencedLease> FencedLeaseGuards for L {}

/// One permit of any [`PermitPool`]; given back when dropped. Created by
/// [`try_permit`](PermitPoolGuards::try_permit) and
/// [`permit_timeout`](PermitPoolGuards::permit_timeout).
#[must_use = "dropping the permit gives it back at once"]
pub struct PoolPermit<'a, P: PermitPool> {
    pool: &'a P,
    done: bool,
}

impl<P: PermitPool> PoolPermit<'_, P> {
    /// Gives the permit back, reporting whether the pool took it.
    ///
    /// # Errors
    /// [`GuardError::Lost`] if the backend no longer counted it as ours (e.g. its lease
    /// expired on etcd); [`GuardError::Backend`].
    pub fn give_back(mut self) -> Result<(), GuardError> {
        self.done = true;
        given_back(self.pool.give())
    }
}

impl<P: PermitPool> Drop for PoolPermit<'_, P> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.pool.give();
        }
    }
}

impl<P: PermitPool> std::fmt::Debug for PoolPermit<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPermit").finish_non_exhaustive()
    }
}

/// Guards for every [`PermitPool`] (implemented for all of them).
pub trait PermitPoolGuards: PermitPool + Sized {
    /// Takes a permit without blocking; `Ok(None)` if none is free.
    ///
    /// # Errors
    /// The backend's error.
    fn try_permit(&self) -> Result<Option<PoolPermit<'_, Self>>, Self::Error> {
        Ok(self.try_take()?.then_some(PoolPermit {
            pool: self,
            done: false,
        }))
    }

    /// Takes a permit, blocking at most `timeout`; `Ok(None)` on timeout.
    ///
    /// # Errors
    /// The backend's error.
    fn permit_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<PoolPermit<'_, Self>>, Self::Error> {
        Ok(self.take_timeout(timeout)?.then_some(PoolPermit {
            pool: self,
            done: false,
        }))
    }
}

impl<P: PermitPool> PermitPoolGuards for P {}

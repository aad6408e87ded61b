//! [`EtcdPermitGuard`]: an RAII permit of an [`EtcdSemaphore`], the guard API of
//! `cxc-sync`'s `SharedSemaphore::{try_acquire, acquire_timeout}` → `Permit` on etcd.

use std::time::Duration;

use crate::error::EtcdError;
use crate::semaphore::{EtcdPermit, EtcdSemaphore};

/// One permit of an [`EtcdSemaphore`]; dropping it gives the permit back.
///
/// Unlike a mapped-file permit, an etcd permit can be **lost** while it is held (its
/// session expired: the holder was cut off from etcd or paused past the TTL); then the
/// pool may already have handed it to someone else. Check [`is_lost`](Self::is_lost)
/// (no request) or [`is_current`](Self::is_current) before each effect the permit
/// guards, pass [`token`](Self::token) to storage that can fence, and use
/// [`release`](Self::release) to learn what `Drop` cannot report.
///
/// `Drop` never panics and never blocks inside an async runtime: there it leaves the
/// permit to the session (returned when the handle is dropped or the session expires).
#[must_use = "dropping a permit gives it back at once"]
pub struct EtcdPermitGuard<'a> {
    pool: &'a EtcdSemaphore,
    permit: Option<EtcdPermit>,
}

impl<'a> EtcdPermitGuard<'a> {
    fn permit(&self) -> &EtcdPermit {
        // Only taken by `release` and `into_permit`, which consume the guard.
        self.permit.as_ref().expect("permit present until consumed")
    }

    /// The semaphore this permit belongs to.
    pub fn semaphore(&self) -> &'a EtcdSemaphore {
        self.pool
    }

    /// The fencing token: the holder key's create revision.
    pub fn token(&self) -> u64 {
        self.permit().token()
    }

    /// Whether the permit is known or presumed lost, without a request
    /// ([`EtcdSemaphore::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.pool.is_lost(self.permit())
    }

    /// Whether the permit is still current, asking etcd
    /// ([`EtcdSemaphore::is_current`]).
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn is_current(&self) -> Result<bool, EtcdError> {
        self.pool.is_current(self.permit())
    }

    /// Gives the permit back and says whether it was still held (`Ok(false)`: it had been
    /// lost, and the pool had already recovered it).
    ///
    /// # Errors
    /// As [`EtcdSemaphore::give_permit`]: a give that was never sent leaves the permit
    /// held by the handle ([`PermitPool::give`](crate::PermitPool::give) or
    /// [`EtcdSemaphore::give_permit`] retry); one whose outcome is unknown leaves it no
    /// longer held (the handle's later gives and takes send its delete again).
    pub fn release(mut self) -> Result<bool, EtcdError> {
        let permit = self.permit.take().expect("permit present until consumed");
        self.pool.give_permit(&permit)
    }

    /// Turns the guard into a plain [`EtcdPermit`] that stays held until
    /// [`EtcdSemaphore::give_permit`] (or `give`) returns it.
    pub fn into_permit(mut self) -> EtcdPermit {
        self.permit.take().expect("permit present until consumed")
    }
}

impl Drop for EtcdPermitGuard<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take()
            && tokio::runtime::Handle::try_current().is_err()
        {
            let _ = self.pool.give_permit(&p);
        }
    }
}

impl std::fmt::Debug for EtcdPermitGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPermitGuard")
            .field("permit", &self.permit)
            .finish()
    }
}

impl EtcdSemaphore {
    /// Takes a permit if one is free, without blocking; the guard gives it back on drop.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn try_acquire(&self) -> Result<Option<EtcdPermitGuard<'_>>, EtcdError> {
        Ok(self.try_take_permit()?.map(|p| EtcdPermitGuard {
            pool: self,
            permit: Some(p),
        }))
    }

    /// Takes a permit, blocking at most `timeout` (`Ok(None)` then); the guard gives it
    /// back on drop.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn acquire_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<EtcdPermitGuard<'_>>, EtcdError> {
        Ok(self.take_permit(timeout)?.map(|p| EtcdPermitGuard {
            pool: self,
            permit: Some(p),
        }))
    }
}

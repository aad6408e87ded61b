//! Guards beyond the seed's [`Permit`]: permits that own their `Arc`
//! ([`OwnedPermit`], as tokio's `acquire_owned`) and several permits taken all at once
//! ([`ManyPermits`]).
//!
//! `acquire_many(n)` is all-or-nothing for the caller: it takes `n` permits one by one
//! and, if it cannot get all of them, gives back the ones it took before it waits, so it
//! never sleeps holding part of a set (no deadlock between two `acquire_many` callers).
//! Another process may briefly see fewer permits available while such an attempt is
//! under way; the count never exceeds `max_permits`, and a holder that dies in between is
//! reclaimed like any other (every permit is tracked by this process's holder slot).

use cxc_mmf::identity::current_proc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handle::SharedSemaphore;
use super::ops::Permit;

/// How long a blocked `acquire_many` sleeps between attempts at most (it is also woken
/// by every release).
const MANY_POLL: Duration = Duration::from_millis(2);

/// A permit that owns its `Arc<SharedSemaphore>` (to move into a thread or task);
/// dropping it releases the permit.
#[must_use = "dropping a permit releases it at once"]
pub struct OwnedPermit {
    sem: Arc<SharedSemaphore>,
    /// The process that acquired it (a forked child's copy releases nothing).
    proc: u32,
}

impl OwnedPermit {
    /// The semaphore this permit belongs to.
    pub fn semaphore(&self) -> &Arc<SharedSemaphore> {
        &self.sem
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        if self.proc == current_proc() {
            let _ = self.sem.release();
        }
    }
}

impl std::fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("semaphore", &self.sem.path())
            .finish()
    }
}

/// `n` permits taken at once; dropping the guard releases all of them.
#[must_use = "dropping the guard releases the permits at once"]
pub struct ManyPermits<'a> {
    sem: &'a SharedSemaphore,
    n: u32,
    /// The process that acquired them (a forked child's copy releases nothing).
    proc: u32,
}

impl ManyPermits<'_> {
    /// How many permits the guard holds.
    pub fn count(&self) -> u32 {
        self.n
    }
}

impl Drop for ManyPermits<'_> {
    fn drop(&mut self) {
        if self.proc != current_proc() {
            return;
        }
        for _ in 0..self.n {
            let _ = self.sem.release();
        }
    }
}

impl std::fmt::Debug for ManyPermits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManyPermits")
            .field("semaphore", &self.sem.path())
            .field("count", &self.n)
            .finish()
    }
}

impl SharedSemaphore {
    /// As [`try_acquire`](Self::try_acquire), for a permit that owns its `Arc`.
    pub fn try_acquire_owned(self: Arc<Self>) -> Option<OwnedPermit> {
        let p = self.try_acquire()?;
        std::mem::forget(p);
        Some(OwnedPermit { sem: self, proc: current_proc() })
    }

    /// As [`acquire`](Self::acquire), for a permit that owns its `Arc`.
    pub fn acquire_owned(self: Arc<Self>) -> OwnedPermit {
        std::mem::forget(self.acquire());
        OwnedPermit { sem: self, proc: current_proc() }
    }

    /// As [`acquire_timeout`](Self::acquire_timeout), for a permit that owns its `Arc`.
    pub fn acquire_owned_timeout(self: Arc<Self>, timeout: Duration) -> Option<OwnedPermit> {
        std::mem::forget(self.acquire_timeout(timeout)?);
        Some(OwnedPermit { sem: self, proc: current_proc() })
    }

    /// Takes `n` permits if that many are available now, all or none. `None` for `n`
    /// of 0 or above `max_permits`, or when fewer are available.
    pub fn try_acquire_many(&self, n: u32) -> Option<ManyPermits<'_>> {
        if n == 0 || n > self.max_permits() {
            return None;
        }
        let mut got = 0;
        while got < n {
            match self.try_acquire() {
                Some(p) => {
                    std::mem::forget(p);
                    got += 1;
                }
                None => {
                    for _ in 0..got {
                        let _ = self.release();
                    }
                    return None;
                }
            }
        }
        Some(ManyPermits { sem: self, n, proc: current_proc() })
    }

    /// Takes `n` permits, all or none, blocking until they are available (never holding
    /// part of them while it waits). `None` for `n` of 0 or above `max_permits`.
    pub fn acquire_many(&self, n: u32) -> Option<ManyPermits<'_>> {
        self.acquire_many_timeout(n, Duration::MAX)
    }

    /// As [`acquire_many`](Self::acquire_many), giving up after `timeout`.
    pub fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Option<ManyPermits<'_>> {
        if n == 0 || n > self.max_permits() {
            return None;
        }
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut next_reclaim = start + super::ops::RECLAIM_EVERY;
        // Only the first slice spins (docs/sidecar.md: a blocking call spins once).
        let mut spin = true;
        loop {
            if let Some(g) = self.try_acquire_many(n) {
                return Some(g);
            }
            let now = Instant::now();
            let left = deadline.map(|d| d.saturating_duration_since(now));
            if left == Some(Duration::ZERO) {
                return None;
            }
            // Each wait below is shorter than the blocked path's reclaim period, so it
            // would never reach its own reclaim: return dead holders' permits here, on
            // the same schedule as a blocked `acquire`.
            if now >= next_reclaim {
                next_reclaim = now + super::ops::RECLAIM_EVERY;
                if self.reclaim_noted(true) > 0 {
                    continue;
                }
            }
            // Wait for one permit (woken by a release), give it back, and try for all of
            // them again.
            let wait = left.map_or(MANY_POLL, |l| l.min(MANY_POLL));
            if let Some(p) = self.acquire_timeout_spinning(wait, spin) {
                drop::<Permit<'_>>(p);
            }
            spin = false;
        }
    }
}

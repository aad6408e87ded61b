//! `lock_async`, `lock_owned_async` and `LeaseGuard::lost` / `OwnedLeaseGuard::lost`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::reactor::{Check, Next, TICK, Waiting};
use crate::lease::{LeaseGuard, OwnedLeaseGuard, OwnerLease, SLOT_POLL, SLOT_POLL_MAX};

/// Tag of the lock group of a lease's wake word.
const LOCK_TAG: u64 = 0;

/// The future of [`OwnerLease::lock_async`].
#[must_use = "futures do nothing unless polled"]
pub struct LockFuture<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lease: &'a OwnerLease<T>,
    ticket: Waiting,
}

/// The future of [`OwnerLease::lock_owned_async`].
#[must_use = "futures do nothing unless polled"]
pub struct OwnedLockFuture<T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lease: Arc<OwnerLease<T>>,
    ticket: Waiting,
}

/// The future of `LeaseGuard::lost`: resolves when the guard's claim is no longer the
/// current one.
#[must_use = "futures do nothing unless polled"]
pub struct LeaseLost<'a> {
    is_current: Box<dyn Fn() -> bool + Send + Sync + 'a>,
    key: (usize, u64),
    ticket: Waiting,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Claims the lease asynchronously: resolves to a guard once this process may hold it
    /// (vacant, or its holder dead or stale past the grace), without a thread or timer per
    /// waiter (`docs/async.md`). Dropping the future at any point leaves nothing behind.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lease = cxc_sync::OwnerLease::builder(dir.path().join("l")).create(0u64).unwrap();
    /// let guard = cxc_sync::block_on(lease.lock_async());
    /// guard.update(|v| *v += 1).unwrap();
    /// ```
    pub fn lock_async(&self) -> LockFuture<'_, T> {
        LockFuture {
            lease: self,
            ticket: Waiting::new(),
        }
    }

    /// As [`lock_async`](Self::lock_async), for a guard that owns its `Arc` (to spawn on a
    /// multi-threaded runtime).
    pub fn lock_owned_async(self: Arc<Self>) -> OwnedLockFuture<T> {
        OwnedLockFuture {
            lease: self,
            ticket: Waiting::new(),
        }
    }

    /// The reactor check of this handle's lock group: the lease may be claimable (vacant,
    /// stale, or its holder's process gone). Runs on the reactor thread.
    fn lock_check(&self) -> Check {
        let st = self.state_addr();
        let grace = self.guard_grace();
        let clock = crate::epoch::EpochClock::new(self.epoch_mode_of());
        let key = self.guard_slot_key();
        let mut watch = None;
        // While this process has no slot in the identity table: when and how often the
        // waiters were last let try (a try registers one if the table has room).
        let mut slotless: Option<(Instant, Duration)> = None;
        Box::new(move || {
            // SAFETY: the state lives in the mapping of a handle that every waiter of this
            // group borrows or owns; the reactor calls checks only while the group exists
            // (see `reactor.rs`, `Group::word`).
            let st = unsafe { &*(st as *const crate::lease::LeaseStateRef) };
            let next = st.claimable(&clock, grace, &mut watch);
            if !matches!(next, Next::Now) || st.has_slot(key) {
                slotless = None;
                return next;
            }
            // Claimable, but we have no slot: a try fails while the table is full. Let the
            // waiters try at once, then after 5, 10, 20 ... ms, at most every 100 ms (as a
            // blocking `lock` does), not on every turn of the reactor (which spun).
            let now = Instant::now();
            match &mut slotless {
                None => {
                    slotless = Some((now, SLOT_POLL));
                    Next::Now
                }
                Some((at, every)) if now >= *at + *every => {
                    *at = now;
                    *every = (*every * 2).min(SLOT_POLL_MAX);
                    Next::Now
                }
                Some((at, every)) => Next::Within(*at + *every - now),
            }
        })
    }
}

impl<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> Future for LockFuture<'a, T> {
    type Output = LeaseGuard<'a, T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let lease = this.lease;
        if let Some(g) = lease.try_lock() {
            this.ticket.leave();
            return Poll::Ready(g);
        }
        let key = (lease.wake_addr(), LOCK_TAG);
        this.ticket.arm(key, cx.waker(), || lease.lock_check());
        // Re-check after arming: a release between the attempt and the arm was seen by
        // the reactor's own announce/check (it runs the parking protocol), so waiting is
        // safe; trying once more only saves a round trip through the reactor.
        Poll::Pending
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Future for OwnedLockFuture<T> {
    type Output = OwnedLeaseGuard<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(g) = this.lease.clone().try_lock_owned() {
            this.ticket.leave();
            return Poll::Ready(g);
        }
        let key = (this.lease.wake_addr(), LOCK_TAG);
        let lease = &this.lease;
        this.ticket.arm(key, cx.waker(), || lease.lock_check());
        Poll::Pending
    }
}

impl<'a> LeaseLost<'a> {
    pub(crate) fn new(
        wake_addr: usize,
        claim_id: u64,
        is_current: Box<dyn Fn() -> bool + Send + Sync + 'a>,
    ) -> Self {
        LeaseLost {
            is_current,
            key: (wake_addr, claim_id | 1 << 63),
            ticket: Waiting::new(),
        }
    }
}

impl Future for LeaseLost<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if !(this.is_current)() {
            this.ticket.leave();
            return Poll::Ready(());
        }
        // The group's check cannot borrow `is_current` (the reactor needs 'static), so
        // it wakes the waiter once per tick; the waiter's poll decides. One cheap load per
        // tick per guard that awaits its loss.
        this.ticket.arm(this.key, cx.waker(), || {
            let mut last = std::time::Instant::now();
            Box::new(move || match TICK.checked_sub(last.elapsed()) {
                Some(left) if !left.is_zero() => Next::Within(left),
                _ => {
                    last = std::time::Instant::now();
                    Next::Now
                }
            })
        });
        Poll::Pending
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for LockFuture<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockFuture")
            .field("lease", &self.lease.path())
            .field("waiting", &self.ticket.is_waiting())
            .finish()
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for OwnedLockFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedLockFuture")
            .field("lease", &self.lease.path())
            .field("waiting", &self.ticket.is_waiting())
            .finish()
    }
}

impl std::fmt::Debug for LeaseLost<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLost")
            .field("waiting", &self.ticket.is_waiting())
            .finish_non_exhaustive()
    }
}

//! `SharedSemaphore::acquire_async`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::reactor::{IDLE_MAX, Next, Waiting};
use crate::semaphore::HolderWatch;
use crate::semaphore::{Permit, SharedSemaphore};

/// The future of [`SharedSemaphore::acquire_async`].
#[must_use = "futures do nothing unless polled"]
pub struct AcquireFuture<'a> {
    sem: &'a SharedSemaphore,
    ticket: Waiting,
}

impl SharedSemaphore {
    /// Takes a permit asynchronously, without a thread or timer per waiter; permits of
    /// dead holders are reclaimed while waiting. Dropping the future at any point leaves
    /// no permit and no registered waiter behind.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let sem = cxc_sync::SharedSemaphore::create(dir.path().join("s"), 1, 1).unwrap();
    /// let permit = cxc_sync::block_on(sem.acquire_async());
    /// assert_eq!(sem.available(), 0);
    /// drop(permit);
    /// ```
    pub fn acquire_async(&self) -> AcquireFuture<'_> {
        AcquireFuture {
            sem: self,
            ticket: Waiting::new(),
        }
    }
}

impl<'a> Future for AcquireFuture<'a> {
    type Output = Permit<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a>> {
        let this = self.get_mut();
        let sem = this.sem;
        if let Some(p) = sem.try_acquire() {
            this.ticket.leave();
            return Poll::Ready(p);
        }
        let key = (sem.wake_addr(), 0);
        this.ticket.arm(key, cx.waker(), || {
            let handle = std::ptr::from_ref(sem) as usize;
            let mut watch = HolderWatch::default();
            let mut last_reclaim = Instant::now();
            Box::new(move || {
                // SAFETY: every waiter of this group borrows the handle at `handle` (the
                // group's key is an address inside its mapping), and the reactor runs
                // checks only while the group exists.
                let sem = unsafe { &*(handle as *const SharedSemaphore) };
                // Without a holder slot (a forked child that found the table full) no
                // permit can be taken, free or not: look for a slot with every reclaim,
                // as the blocking path does, instead of waking the waiter in a loop.
                let slotted = sem.has_slot();
                if slotted && sem.recheck_available() > 0 {
                    return Next::Now;
                }
                // Reclaim when a watched holder died; poll the table as the blocking
                // path does only while some holder has no pidfd, else every `IDLE_MAX`
                // (a holder that registered after the last look and died before the
                // next is found then).
                let watched = sem.watch_holders(&mut watch);
                let every = if watched.all {
                    IDLE_MAX
                } else {
                    crate::semaphore::RECLAIM_EVERY
                };
                let since = last_reclaim.elapsed();
                if !watched.died && since < every {
                    return Next::Within(every - since);
                }
                last_reclaim = Instant::now();
                let freed = sem.reclaim_dead() > 0;
                let ready = if slotted {
                    freed
                } else {
                    sem.try_register() && sem.recheck_available() > 0
                };
                if ready {
                    Next::Now
                } else {
                    Next::Within(every)
                }
            })
        });
        Poll::Pending
    }
}

impl std::fmt::Debug for AcquireFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcquireFuture")
            .field("semaphore", &self.sem.path())
            .field("waiting", &self.ticket.is_waiting())
            .finish()
    }
}

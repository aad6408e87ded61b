//! `SharedRwLock::read_async` and `SharedRwLock::write_async`.
//!
//! Readers wait in the group of the readers' wake word until no writer holds or waits.
//! A writer waits in the writers' group until it can install its claim, then in the
//! drain group until the readers inside left; while it drains, new readers back off
//! (writer preference, as the blocking `write`), and the reactor's check beats for it
//! and reclaims dead readers. Dropping a future gives up its claim, if it has one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::reactor::Waiting;
use crate::rwlock::{Claim, Drained, ReadGuard, SharedRwLock, WriteGuard};

/// Group tags of the readers' and the writers' wake words. The drain group's tag is the
/// claim (writer and token), so a check never outlives the claim it was built for.
const READ_TAG: u64 = 0;
const CLAIM_TAG: u64 = 0;

/// The future of [`SharedRwLock::read_async`].
#[must_use = "futures do nothing unless polled"]
pub struct ReadFuture<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lock: &'a SharedRwLock<T>,
    ticket: Waiting,
}

/// The future of [`SharedRwLock::write_async`].
#[must_use = "futures do nothing unless polled"]
pub struct WriteFuture<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lock: &'a SharedRwLock<T>,
    ticket: Waiting,
    /// The claim installed and draining, if any.
    claim: Option<Claim>,
    counted: bool,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SharedRwLock<T> {
    /// Takes a read lock asynchronously: resolves once no writer holds or waits, without
    /// a thread or timer per waiter (`docs/async.md`). A dead writer is evicted, and a
    /// writer that makes no progress for the grace while this waits, as with
    /// [`read`](Self::read). Dropping the future at any point leaves nothing behind.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lock = cxc_sync::SharedRwLock::create(dir.path().join("rw"), 7u64).unwrap();
    /// let r = cxc_sync::block_on(lock.read_async());
    /// assert_eq!(r.get(), 7);
    /// ```
    pub fn read_async(&self) -> ReadFuture<'_, T> {
        ReadFuture {
            lock: self,
            ticket: Waiting::new(),
        }
    }

    /// Takes the write lock asynchronously: waits for the writer to leave, installs its
    /// claim (from then on new readers back off), then waits for the readers inside to
    /// leave, reclaiming dead ones. Dropping the future at any point leaves nothing
    /// behind (a claim it installed is given up).
    ///
    /// While draining, the reactor shows this writer's progress every tick (25 ms), so
    /// waiters do not evict it; a future that is woken but not polled for longer than
    /// the grace may lose its claim, and then claims again.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lock = cxc_sync::SharedRwLock::create(dir.path().join("rw"), 7u64).unwrap();
    /// let w = cxc_sync::block_on(lock.write_async());
    /// w.update(|v| *v += 1).unwrap();
    /// drop(w);
    /// assert_eq!(lock.read().get(), 8);
    /// ```
    pub fn write_async(&self) -> WriteFuture<'_, T> {
        WriteFuture {
            lock: self,
            ticket: Waiting::new(),
            claim: None,
            counted: false,
        }
    }
}

impl<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> Future for ReadFuture<'a, T> {
    type Output = ReadGuard<'a, T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let lock = this.lock;
        if let Some(g) = lock.try_read() {
            this.ticket.leave();
            return Poll::Ready(g);
        }
        if !this.ticket.is_waiting() {
            lock.count_contended(false);
        }
        let key = (lock.async_words()[0], READ_TAG);
        this.ticket
            .arm(key, cx.waker(), || lock.writer_gone_check());
        Poll::Pending
    }
}

impl<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> Future for WriteFuture<'a, T> {
    type Output = WriteGuard<'a, T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let lock = this.lock;
        loop {
            let Some(claim) = this.claim else {
                match lock.claim_async() {
                    Some(c) => {
                        // Leave the writers' group: from now on this waits for readers.
                        this.ticket.leave();
                        this.claim = Some(c);
                        continue;
                    }
                    None => {
                        if !this.counted {
                            this.counted = true;
                            lock.count_contended(true);
                        }
                        let key = (lock.async_words()[1], CLAIM_TAG);
                        this.ticket
                            .arm(key, cx.waker(), || lock.writer_gone_check());
                        return Poll::Pending;
                    }
                }
            };
            match lock.drained(claim) {
                Drained::Held(g) => {
                    this.claim = None;
                    this.ticket.leave();
                    return Poll::Ready(g);
                }
                Drained::Lost => {
                    this.claim = None;
                    this.ticket.leave();
                }
                Drained::Waiting => {
                    if !this.counted {
                        this.counted = true;
                        lock.count_contended(true);
                    }
                    let key = (lock.async_words()[2], claim.tag());
                    this.ticket.arm(key, cx.waker(), || lock.drain_check(claim));
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Drop for WriteFuture<'_, T> {
    fn drop(&mut self) {
        self.ticket.abandon();
        if let Some(c) = self.claim.take() {
            self.lock.abandon(c);
        }
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for ReadFuture<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFuture")
            .field("lock", &self.lock.path())
            .field("waiting", &self.ticket.is_waiting())
            .finish()
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for WriteFuture<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteFuture")
            .field("lock", &self.lock.path())
            .field("claimed", &self.claim.is_some())
            .field("waiting", &self.ticket.is_waiting())
            .finish()
    }
}

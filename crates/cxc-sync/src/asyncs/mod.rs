//! Async waiting (cargo feature `async`): futures for the lease, the semaphore and the
//! rwlock that share one reactor thread per process (see `reactor.rs` and
//! `docs/async.md`).
//!
//! The futures are runtime-agnostic (`std::future::Future` and `Waker` only), `Send` when
//! the payload is, and cancellation-safe: dropping one at any point leaves no claim, no
//! permit and no registered waiter behind.

mod lease;
pub(crate) mod reactor;
mod rwlock;
mod semaphore;

pub use lease::{LeaseLost, LockFuture, OwnedLockFuture};
pub(crate) use reactor::forget_words;
pub use reactor::{IDLE_MAX, MAX_WORDS, TICK};
pub use rwlock::{ReadFuture, WriteFuture};
pub use semaphore::AcquireFuture;

/// Async waiters registered with this process's reactor right now (diagnostics: after
/// every future completed or was dropped, this is 0).
pub fn async_waiters() -> usize {
    reactor::running().map_or(0, |r| r.waiters())
}

/// Runs a future to completion on the current thread (a minimal executor: the waker
/// unparks this thread). For tests, examples and programs without a runtime.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    thread_local! {
        static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    }
    let mut fut = std::pin::pin!(fut);
    WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    })
}

//! A process-wide lock that a child made by `fork` never waits for in vain.
//!
//! A `std::sync::Mutex` held by another thread at the moment of a `fork` stays locked in
//! the child, whose copy of that thread does not exist: the child's next `lock` waits
//! forever. [`ForkSafeLock`] records the lineage token of the process that holds it
//! ([`cxc_mmf::identity::current_proc`]): a lock found held under another token was taken
//! by a thread of an ancestor (every process copying this memory has a larger token), a
//! thread the child does not have, so the child takes it over. Threads of one process
//! wait for each other as with a mutex (spinning briefly, then sleeping in short steps:
//! the lock guards cold registration paths only).
//!
//! What the ancestor's thread was doing under the lock is not finished in the child:
//! the locks here guard process-local bookkeeping that a child re-does under its own
//! token anyway (caches and registrations keyed by the token), and the shared file's
//! state, which the ancestor's thread finishes in the ancestor.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct ForkSafeLock(AtomicU32);

/// Holds a [`ForkSafeLock`]; unlocks on drop.
#[derive(Debug)]
pub(crate) struct ForkSafeGuard<'a>(&'a AtomicU32);

impl ForkSafeLock {
    pub(crate) const fn new() -> Self {
        ForkSafeLock(AtomicU32::new(0))
    }

    /// Takes the lock: waits while a thread of this process holds it; takes it over from
    /// an ancestor's thread (one that does not exist in this process).
    pub(crate) fn lock(&self) -> ForkSafeGuard<'_> {
        let me = cxc_mmf::identity::current_proc();
        let mut waited = 0u32;
        loop {
            let cur = self.0.load(Ordering::Relaxed);
            if cur != me
                && self
                    .0
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return ForkSafeGuard(&self.0);
            }
            if cur == me {
                waited += 1;
                if waited < 64 {
                    std::hint::spin_loop();
                } else if waited < 128 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }
}

impl Drop for ForkSafeGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

#[cfg(all(test, not(cxc_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_of_one_process_exclude_each_other() {
        let lock = Arc::new(ForkSafeLock::new());
        let inside = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (lock, inside) = (lock.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let _g = lock.lock();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_lock_held_under_another_token_is_taken_over() {
        let lock = ForkSafeLock::new();
        // As a child sees a lock an ancestor's thread held at the fork.
        lock.0.store(
            cxc_mmf::identity::current_proc().wrapping_add(7),
            Ordering::Relaxed,
        );
        drop(lock.lock());
        assert_eq!(lock.0.load(Ordering::Relaxed), 0);
    }
}

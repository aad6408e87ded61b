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
//! state, which the ancestor's thread finishes in the ancestor. A [`ForkSafeMutex`]
//! guards a value: the thread that takes it over finds the value replaced by a fresh one,
//! since the ancestor's thread may have been halfway through changing it.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
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
        self.lock_reporting().0
    }

    /// [`lock`](Self::lock), and whether it was taken over from an ancestor's thread.
    fn lock_reporting(&self) -> (ForkSafeGuard<'_>, bool) {
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
                return (ForkSafeGuard(&self.0), cur != 0);
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

/// A value behind a [`ForkSafeLock`], for process-local state that a child made by `fork`
/// may use through its copy (a watchdog's scan state, a handle's stall tracking). A thread
/// that takes the lock over from an ancestor's thread finds the value replaced by the
/// `fresh` one it passes to [`lock`](Self::lock); the old value is neither read nor
/// dropped (the ancestor's thread may have been halfway through changing it), so what it
/// owned leaks, once per such fork.
pub(crate) struct ForkSafeMutex<T> {
    lock: ForkSafeLock,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `ForkSafeMutexGuard`, and the lock lets one
// thread of a process hold a guard at a time (threads of an ancestor do not exist in this
// process); `T: Send` because the guard hands `&mut T` to whichever thread holds it.
unsafe impl<T: Send> Sync for ForkSafeMutex<T> {}

// As `std::sync::Mutex`, which these replace (and whose poisoning their callers ignored):
// a panic under the lock unlocks it and leaves a value that is memory-safe, which the
// users here (caches and heuristics) accept; handles that hold one stay `RefUnwindSafe`.
impl<T> std::panic::RefUnwindSafe for ForkSafeMutex<T> {}

/// Holds a [`ForkSafeMutex`]; gives access to its value; unlocks on drop.
pub(crate) struct ForkSafeMutexGuard<'a, T> {
    value: &'a UnsafeCell<T>,
    _lock: ForkSafeGuard<'a>,
}

impl<T> ForkSafeMutex<T> {
    pub(crate) const fn new(value: T) -> Self {
        ForkSafeMutex {
            lock: ForkSafeLock::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock (as [`ForkSafeLock::lock`]); if it was taken over from an
    /// ancestor's thread, the value is first replaced by `fresh()`.
    pub(crate) fn lock(&self, fresh: impl FnOnce() -> T) -> ForkSafeMutexGuard<'_, T> {
        let (guard, taken_over) = self.lock.lock_reporting();
        if taken_over {
            // SAFETY: this thread holds the lock, so no other thread of this process
            // touches the value; the old value may be torn, so it is overwritten without
            // being read or dropped.
            unsafe { self.value.get().write(fresh()) };
        }
        ForkSafeMutexGuard {
            value: &self.value,
            _lock: guard,
        }
    }
}

impl<T> std::fmt::Debug for ForkSafeMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkSafeMutex { .. }")
    }
}

impl<T> Deref for ForkSafeMutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (see `ForkSafeMutex`'s `Sync`).
        unsafe { &*self.value.get() }
    }
}

impl<T> DerefMut for ForkSafeMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only access
        // through it.
        unsafe { &mut *self.value.get() }
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
    fn a_value_taken_over_from_an_ancestor_is_fresh_and_kept_otherwise() {
        let m = ForkSafeMutex::new([1u32, 0]);
        m.lock(|| unreachable!("not taken over"))[1] = 2;
        assert_eq!(*m.lock(|| unreachable!("not taken over")), [1, 2]);
        // As a child sees it when an ancestor's thread held it at the fork: the value
        // may be mid-change, so it is replaced.
        m.lock.0.store(
            cxc_mmf::identity::current_proc().wrapping_add(7),
            Ordering::Relaxed,
        );
        assert_eq!(*m.lock(|| [9, 9]), [9, 9]);
        assert_eq!(m.lock.0.load(Ordering::Relaxed), 0);
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

//! Sleeping on a 32-bit word in shared memory: a Linux futex without the PRIVATE flag, so
//! waiters and wakers in different processes meet on the same physical page.
//!
//! Elsewhere (and under loom) waiting degrades to a short sleep, which is correct but
//! slower: every waiter re-checks its condition after any wake-up anyway.

use std::time::Duration;

use crate::primitive::AtomicU32;

/// Sleeps while `word == expected`, for at most `timeout`. Returns on a wake, a timeout,
/// a signal or a value change; callers re-check their condition in all cases.
#[cfg(all(target_os = "linux", not(cxc_loom)))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    use rustix::thread::futex;
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Shared (non-PRIVATE) futex: the word lives in a MAP_SHARED file mapping.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes up to `n` sleepers on `word`.
#[cfg(all(target_os = "linux", not(cxc_loom)))]
pub(crate) fn wake(word: &AtomicU32, n: u32) {
    use rustix::thread::futex;
    let _ = futex::wake(word, futex::Flags::empty(), n);
}

/// Fallback: sleep briefly (bounded by `timeout`) and let the caller re-check.
#[cfg(not(all(target_os = "linux", not(cxc_loom))))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    use crate::primitive::Ordering;
    if word.load(Ordering::Acquire) == expected {
        #[cfg(cxc_loom)]
        {
            let _ = timeout;
            loom::thread::yield_now();
        }
        #[cfg(not(cxc_loom))]
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
    }
}

/// Fallback: nothing to wake; sleepers poll.
#[cfg(not(all(target_os = "linux", not(cxc_loom))))]
pub(crate) fn wake(_word: &AtomicU32, _n: u32) {}

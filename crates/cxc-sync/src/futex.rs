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

/// Sleeps while `word == expected` and `other == other_expected`, for at most `timeout`
/// (`futex_waitv`, Linux 5.16+; an older kernel waits on `word` alone). Returns on a wake
/// of either word, a timeout, a signal or a changed value; callers re-check.
#[cfg(all(target_os = "linux", not(cxc_loom)))]
pub(crate) fn wait_either(
    word: &AtomicU32,
    expected: u32,
    other: &AtomicU32,
    other_expected: u32,
    timeout: Duration,
) {
    use rustix::thread::futex;
    let entry = |w: &AtomicU32, v: u32| {
        let mut e = futex::Wait::new();
        e.val = u64::from(v);
        e.uaddr = futex::WaitPtr::new(w.as_ptr().cast::<core::ffi::c_void>());
        // Shared (not PRIVATE): the words live in a MAP_SHARED mapping.
        e.flags = futex::WaitFlags::SIZE_U32;
        e
    };
    let deadline = monotonic_after(timeout);
    let r = futex::waitv(
        &[entry(word, expected), entry(other, other_expected)],
        futex::WaitvFlags::empty(),
        Some(&deadline),
        rustix::time::ClockId::Monotonic,
    );
    if r == Err(rustix::io::Errno::NOSYS) {
        wait(word, expected, timeout);
    }
}

/// `CLOCK_MONOTONIC` now + `d`: the absolute timeout `futex_waitv` takes.
#[cfg(all(target_os = "linux", not(cxc_loom)))]
pub(crate) fn monotonic_after(d: Duration) -> rustix::time::Timespec {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let mut sec = now
        .tv_sec
        .saturating_add(d.as_secs().min(i64::MAX as u64) as i64);
    let mut nsec = now.tv_nsec + i64::from(d.subsec_nanos());
    if nsec >= 1_000_000_000 {
        nsec -= 1_000_000_000;
        sec = sec.saturating_add(1);
    }
    rustix::time::Timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
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

/// Fallback: waits on `word` alone.
#[cfg(not(all(target_os = "linux", not(cxc_loom))))]
#[allow(dead_code)]
pub(crate) fn wait_either(
    word: &AtomicU32,
    expected: u32,
    _other: &AtomicU32,
    _other_expected: u32,
    timeout: Duration,
) {
    wait(word, expected, timeout);
}

/// Fallback: nothing to wake; sleepers poll.
#[cfg(not(all(target_os = "linux", not(cxc_loom))))]
pub(crate) fn wake(_word: &AtomicU32, _n: u32) {}

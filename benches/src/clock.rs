//! Timestamps and CPU time.

use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`: system-wide, so a timestamp taken in one process can
/// be subtracted from one taken in another.
#[inline]
pub fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time (user + system) this process has used so far, from `getrusage(RUSAGE_SELF)`.
pub fn cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory of the size `getrusage` fills; RUSAGE_SELF is
    // a valid `who`. On failure (impossible for these arguments) the zeroed value is used.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Sleeps for `d` (a thin wrapper so call sites read as intent).
pub fn sleep(d: Duration) {
    std::thread::sleep(d);
}

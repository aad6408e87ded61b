//! The time base of observations: `CLOCK_MONOTONIC` in nanoseconds.
//!
//! Every process on a machine reads the same monotonic clock, so timestamps recorded by
//! different processes into one ring are comparable (not across reboots, and not across
//! machines sharing a network file system).

/// Nanoseconds of `CLOCK_MONOTONIC` (time since boot, not counting suspend). Read through
/// the vDSO: no system call, some tens of nanoseconds.
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_moves_forward() {
        let a = super::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::monotonic_ns();
        assert!(b >= a + 1_000_000, "{a} -> {b}");
    }
}

//! Benches for cxc: the criterion benches (`benches/`, one per primitive) and the
//! cross-process harness `cxc-xbench` (driven by `cargo xtask bench`).
//!
//! The harness spawns real processes that meet on files in a temporary directory and
//! measures what criterion cannot: handoff round trips, contended throughput, failover
//! latency after `SIGKILL` and the CPU burned by a blocked waiter, against the classic
//! cross-process baselines.
//!
//! - [`clock`]: `CLOCK_MONOTONIC` timestamps (comparable across processes) and CPU time.
//! - [`stats`]: median and p99 of samples.
//! - [`shm`]: a small shared page mapped from a file, for flags and baseline state.
//! - [`baseline`]: raw futex wait/wake, a futex mutex, a robust process-shared pthread
//!   mutex, `flock`, SysV semaphores.
//! - [`xbench`]: the scenarios and the child roles `cxc-xbench` re-executes itself as.
//! - [`bench_main!`]: the criterion settings every criterion bench uses.

pub mod baseline;
pub mod clock;
pub mod shm;
pub mod stats;
pub mod xbench;

/// `criterion_group!` + `criterion_main!` for one bench function `$target`, with the
/// settings every criterion bench of this crate uses (20 samples, 0.5 s warm-up, 1 s of
/// measurement). For the bench targets, which have criterion as a dev-dependency.
#[macro_export]
macro_rules! bench_main {
    ($target:path) => {
        criterion::criterion_group! {
            name = benches;
            config = criterion::Criterion::default()
                .sample_size(20)
                .warm_up_time(std::time::Duration::from_millis(500))
                .measurement_time(std::time::Duration::from_secs(1));
            targets = $target
        }
        criterion::criterion_main!(benches);
    };
}

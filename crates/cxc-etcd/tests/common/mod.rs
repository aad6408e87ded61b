//! Shared test plumbing of the etcd backend: real etcd servers ([`etcd`]), `etcdctl`,
//! children of this test binary that work on one key of one server (through
//! `cxc-testkit`), and a system-wide monotonic clock for comparing intervals across
//! processes.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod client;
pub mod etcd;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// One clock for every process on the machine (intervals recorded by different
/// children are compared).
pub use cxc_testkit::mono_ns;
use cxc_testkit::{Proc, RoleCommand, find_program, wait_until};

pub use client::{
    connect, elector, keys_under, log_tokens, others, patiently, revoke, rt, serial, starting_with,
};
pub use etcd::{EtcdCluster, EtcdServer};

/// Sets the flag when dropped, also when a scope's body panics: the scope's threads that
/// loop until the flag end, and the test fails with the panic instead of hanging.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long a child waits for its parent before giving up (the parent failed then).
pub const CHILD_PATIENCE: Duration = Duration::from_secs(60);

/// Test `test` of this binary in `role`, as a child that works on `key` of the server at
/// `endpoint` (role arguments `endpoint` and `key`).
pub fn child(test: &str, role: &str, endpoint: &str, key: &str) -> RoleCommand {
    RoleCommand::new(test, role)
        .arg("endpoint", endpoint)
        .arg("key", key)
}

/// Sleeps until killed (or, if the parent died, until the patience runs out).
pub fn linger() -> ! {
    std::thread::sleep(CHILD_PATIENCE);
    std::process::exit(5)
}

/// The `etcdctl` binary (`$CXC_ETCDCTL_BIN`, else on `PATH`, else `/usr/bin/etcdctl`),
/// or a panic that says how to install it.
pub fn etcdctl_binary() -> PathBuf {
    find_program("CXC_ETCDCTL_BIN", "etcdctl").unwrap_or_else(|| {
        panic!(
            "this test needs `etcdctl` (looked at $CXC_ETCDCTL_BIN, PATH, /usr/bin/etcdctl). \
             Install it with `scripts/install-deps.sh` (Debian package etcd-client)."
        )
    })
}

/// `etcdctl --endpoints=<endpoint> <args>` (API v3), not started yet.
pub fn etcdctl_command(endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(etcdctl_binary());
    cmd.arg(format!("--endpoints={endpoint}"))
        .args(args)
        .env("ETCDCTL_API", "3");
    cmd
}

/// `etcdctl elect <args>` (etcd's `concurrency.Election`), running; its stdout is what
/// it printed (the leader's proposal once it observes or leads).
pub fn etcdctl_elect(endpoint: &str, args: &[&str]) -> Proc {
    let mut all = vec!["elect"];
    all.extend_from_slice(args);
    Proc::spawn(etcdctl_command(endpoint, &all), "etcdctl elect")
}

/// Waits until `p` has printed `needle` on its stdout.
///
/// # Panics
///
/// If it has not within `timeout` (or exited without it).
pub fn wait_printed(p: &mut Proc, needle: &str, timeout: Duration) {
    wait_until(timeout, || {
        p.stdout().contains(needle) || p.try_wait().is_some()
    });
    assert!(
        p.stdout().contains(needle),
        "{p:?} printed {:?}, not {needle:?}; stderr: {}",
        p.stdout(),
        p.stderr()
    );
}

/// Intervals `[start, end]` (ns): the largest number that overlap at one time.
pub fn max_overlap(intervals: &[(u64, u64)]) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals {
        assert!(s <= e, "interval ends before it starts: {s} > {e}");
        events.push((s, 1));
        events.push((e, -1));
    }
    // At equal times, count the start first: touching intervals count as overlapping.
    events.sort_by_key(|&(t, d)| (t, -d));
    let (mut cur, mut best) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        best = best.max(cur);
    }
    best as usize
}

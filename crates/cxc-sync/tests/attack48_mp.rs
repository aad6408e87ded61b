#![cfg(not(cxc_loom))]
//! attack48: passing shortages must pass. A process that was short of something once
//! (threads, descriptors) must not carry the consequence for the rest of its life.
//!
//! 1. **The lease's sentinel thread could not start once** (a cgroup v1 pids controller
//!    at its limit when the process made its first claim). The process went without a
//!    sentinel for life (`sentinel.rs` cached the failure as "given up"): when it was
//!    SIGKILLed later, with threads long available again, a waiter took its lease over
//!    only once the OS proved it dead, never through the sentinel (`claim_exiting` 0 in
//!    every round). FIXED: a thread that could not be started is tried again after a
//!    second, and a handle whose slot has no sentinel yet keeps taking its slow path
//!    (which arms the slot) until one runs. A thread that started but never reported
//!    (stuck after a fork) is still given up for life, as before.
//! 2. **A forked child short of descriptors takes a `SharedCell` writer slot.** Its
//!    identity cannot be read whole; a slot reserved under a partial identity could never
//!    be judged dead. FIXED: the write fails with `WriteError::Identify` and takes no
//!    slot; once a descriptor is free the next write works.
//!
//! Every test re-executes this binary in roles; the parent sides run one at a time.
//! Test 1 needs root and the cgroup v1 pids controller and skips otherwise.

use std::time::{Duration, Instant};

use cxc_sync::{LeaseOptions, OwnerLease, Preemption, SharedCell, WriteError};
use cxc_testkit::{
    RoleCommand, allow_threads, fd_free, fields, forbid_threads, path_arg, pids_group, play_role,
    report, serial, skip_without_pids_cgroup, sleep_forever, use_up_fds,
};

/// A grace no test reaches: only the OS or the sentinel can end a claim.
const BIG: u64 = 1 << 40;
const REPORT_WAIT: Duration = Duration::from_secs(20);

fn lease_opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .count()
}

// ---------------------------------------------------------------------------------------
// 1. The sentinel thread could not start once.
// ---------------------------------------------------------------------------------------

/// Holder: with `short=1`, claims while no thread can start, then lifts the limit and
/// waits past the retry interval; then releases and claims again on the same handle (and
/// once more, so a cached fast path would show). Reports whether a sentinel runs.
fn role_holder() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let me = std::process::id();
    if cxc_testkit::arg("short") == "1" {
        forbid_threads();
        assert!(lease.try_acquire(me, BIG), "claim while short of threads");
        let without = threads_named("cxc-sentinel");
        lease.release(me);
        allow_threads();
        std::thread::sleep(Duration::from_millis(1_200));
        assert!(lease.try_acquire(me, BIG));
        lease.release(me);
        assert!(lease.try_acquire(me, BIG));
        report(format!(
            "held=1 sentinels_short={without} sentinels={}",
            threads_named("cxc-sentinel")
        ));
    } else {
        assert!(lease.try_acquire(me, BIG));
        report(format!(
            "held=1 sentinels_short=0 sentinels={}",
            threads_named("cxc-sentinel")
        ));
    }
    sleep_forever();
}

/// Docs (owner-lease.md, "The sentinel"): a killed holder is taken over through its
/// sentinel, before the OS proves it dead. A holder that could not start the thread at
/// its first claim (a passing thread shortage) must get one later, not go without for
/// life: in at least 3 of 5 rounds the takeover goes through the sentinel, as for a
/// holder that never was short (the control, `short=0`).
#[test]
fn a_holder_whose_sentinel_could_not_start_once_gets_one_later() {
    const TEST: &str = "a_holder_whose_sentinel_could_not_start_once_gets_one_later";
    play_role!(role_holder);
    if skip_without_pids_cgroup(TEST) {
        return;
    }
    let _s = serial();
    for short in ["0", "1"] {
        let mut through_sentinel = 0;
        for round in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("l");
            let lease: OwnerLease<u64> = OwnerLease::create_with(&path, 0, &lease_opts()).unwrap();
            let mut kid = RoleCommand::new(TEST, "holder")
                .arg("path", &path)
                .arg("short", short)
                .spawn();
            let line = kid.next_report(REPORT_WAIT);
            let _ = std::fs::remove_dir(pids_group(kid.pid()));
            let f = fields(&line);
            assert_eq!(f["sentinels_short"], "0", "short={short}: {line}");
            assert_eq!(f["sentinels"], "1", "short={short} round {round}: {line}");
            let took = std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let c = lease.acquire(std::process::id(), BIG, Duration::from_secs(20));
                    assert!(c.is_some(), "the waiter timed out");
                    Instant::now()
                });
                std::thread::sleep(Duration::from_millis(200));
                assert!(!waiter.is_finished(), "took a live holder's lease");
                let t = Instant::now();
                kid.kill();
                waiter.join().unwrap().saturating_duration_since(t)
            });
            let st = lease.stats();
            println!(
                "short={short} round {round}: {took:?} (exiting {}, dead {})",
                st.claim_exiting, st.claim_dead_owner
            );
            assert!(
                matches!(
                    (st.claim_exiting, st.claim_dead_owner, st.claim_stale),
                    (1, 0, 0) | (0, 1, 0)
                ),
                "short={short} round {round}: taken over once: {st:?}"
            );
            through_sentinel += st.claim_exiting;
        }
        assert!(
            through_sentinel >= 3,
            "short={short}: only {through_sentinel} of 5 takeovers went through the sentinel"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. A forked child short of descriptors and a SeqLock writer slot.
// ---------------------------------------------------------------------------------------

/// Writer: opens the cell and writes once (identity warm), forks; the child uses up its
/// descriptors and writes through the inherited handle (a new process: it needs a slot
/// of its own), then frees one descriptor and writes again. The child's results go to
/// the parent through its exit status.
fn role_writer() {
    let lock: SharedCell<u64> = SharedCell::open(path_arg("path")).unwrap();
    lock.store(1).unwrap();
    // SAFETY: the role's other thread (libtest's main) only waits; the child runs the
    // code below, which takes no lock another thread could have held at the fork, and
    // ends with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut fds = use_up_fds(128);
        let short = lock.store(2);
        let code = match short {
            Err(WriteError::Identify { errno }) if errno == libc::EMFILE => 0,
            Err(WriteError::Identify { .. }) => 1,
            Err(_) => 2,
            Ok(_) if fd_free() => 3,
            Ok(_) => 4,
        };
        fds.truncate(fds.len().saturating_sub(8));
        let later = if lock.store(3).is_ok() { 0 } else { 16 };
        // SAFETY: ends the child at once, without running the parent's exit handlers.
        unsafe { libc::_exit(code | later) };
    }
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: waits for this process's own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    report(format!(
        "child_exit={} value={}",
        libc::WEXITSTATUS(status),
        lock.load()
    ));
}

/// Docs (seqlock.md, `WriteError::Identify`): a writer whose identity cannot be read
/// whole gets a typed error and takes no slot; the next write, with a descriptor free,
/// works. Before, a forked child short of descriptors reserved its slot under a partial
/// identity that could never be judged dead.
#[test]
fn a_forked_child_short_of_descriptors_takes_no_seqlock_slot() {
    const TEST: &str = "a_forked_child_short_of_descriptors_takes_no_seqlock_slot";
    play_role!(role_writer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let _cell: SharedCell<u64> = SharedCell::create(&path, 0).unwrap();
    let mut kid = RoleCommand::new(TEST, "writer").arg("path", &path).spawn();
    let line = kid.next_report(REPORT_WAIT);
    let f = fields(&line);
    assert_eq!(f["child_exit"], "0", "{line}");
    assert_eq!(f["value"], "3", "{line}");
}

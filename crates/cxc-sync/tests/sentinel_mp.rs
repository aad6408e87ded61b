//! The lease's sentinel (docs/owner-lease.md, "The sentinel"): a holder whose process is
//! exiting, with none of its threads left to run user code, is taken over as stale at
//! once, before the OS can prove it gone; a live holder never is (an exec'ing one:
//! `attack21_mp::lease_holder_that_execs_is_not_taken_over_while_it_lives`); the
//! sentinel's robust list survives handles that come and go and forked children that use
//! the lease themselves.

use std::time::{Duration, Instant};

use cxc_sync::{LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{Proc, RoleCommand, in_role, path_arg, report, sleep_forever};

/// A grace no test reaches: only the OS or the sentinel can end a claim.
const BIG: u64 = 1 << 40;

/// A lease without preemption (the test's waiters have lower pids than its holders).
fn lease_at(dir: &tempfile::TempDir, name: &str) -> OwnerLease<u64> {
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    OwnerLease::create_with(dir.path().join(name), 0, &opts).unwrap()
}

/// Starts `role` of `test` on `paths` (arguments `path0`, `path1`, ...) and waits for its
/// first report, which must be `expect`.
fn start(test: &str, role: &str, paths: &[std::path::PathBuf], expect: &str) -> Proc {
    let mut cmd = RoleCommand::new(test, role);
    for (i, p) in paths.iter().enumerate() {
        cmd = cmd.arg(&format!("path{i}"), p);
    }
    let mut kid = cmd.spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), expect);
    kid
}

/// Blocks in `acquire` on `lease` in a thread, runs `act` once the waiter sleeps, and
/// returns how long after the start of `act` the claim came (`None`: before it).
fn claim_after(lease: &OwnerLease<u64>, act: impl FnOnce()) -> Option<Duration> {
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let c = lease.acquire(std::process::id(), BIG, Duration::from_secs(20));
            assert!(c.is_some(), "the waiter timed out");
            Instant::now()
        });
        // Past the spin phase and the first nap: asleep in the kernel.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !waiter.is_finished(),
            "the waiter took a live holder's lease"
        );
        let started = Instant::now();
        act();
        let got = waiter.join().unwrap();
        got.checked_duration_since(started)
    })
}

/// A SIGKILLed holder is taken over through its sentinel (counter `claim_exiting`), not
/// through the OS's proof of death, and promptly. A waiter the scheduler runs late (the
/// machine busy) may find the process wholly gone by then and take it over as dead
/// (`claim_dead_owner`), which is as correct: each round is one or the other (never a
/// stale takeover), and most rounds go through the sentinel.
#[test]
fn a_killed_holder_is_taken_over_through_its_sentinel() {
    let test = "a_killed_holder_is_taken_over_through_its_sentinel";
    if in_role("holder") {
        let l: OwnerLease<u64> = OwnerLease::open(path_arg("path0")).unwrap();
        assert!(l.try_acquire(std::process::id(), BIG));
        report("held");
        sleep_forever();
    }
    let mut through_sentinel = 0;
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let lease = lease_at(&dir, "l");
        let mut kid = start(test, "holder", &[dir.path().join("l")], "held");
        let took = claim_after(&lease, || kid.kill()).expect("claimed before the kill");
        let st = lease.stats();
        println!(
            "round {round}: takeover {took:?} after the SIGKILL was sent (exiting {}, dead {})",
            st.claim_exiting, st.claim_dead_owner
        );
        assert!(
            matches!(
                (st.claim_exiting, st.claim_dead_owner, st.claim_stale),
                (1, 0, 0) | (0, 1, 0)
            ),
            "round {round}: taken over once, through the sentinel or as dead: {st:?}"
        );
        through_sentinel += st.claim_exiting;
        assert!(took < Duration::from_millis(100), "round {round}: {took:?}");
    }
    assert!(
        through_sentinel >= 3,
        "only {through_sentinel} of 5 takeovers went through the sentinel"
    );
}

/// A holder whose handle is dropped (its claim stays, as the seed API allows) takes its
/// sentinel off the slot: nothing ends the claim while the process lives, and its death
/// is then seen by the OS (`claim_dead_owner`), not by a sentinel.
#[test]
fn a_live_holder_without_its_handle_keeps_the_lease_until_it_dies() {
    let test = "a_live_holder_without_its_handle_keeps_the_lease_until_it_dies";
    if in_role("holder") {
        let l: OwnerLease<u64> = OwnerLease::open(path_arg("path0")).unwrap();
        assert!(l.try_acquire(std::process::id(), BIG));
        drop(l);
        report("dropped");
        sleep_forever();
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let mut kid = start(test, "holder", &[dir.path().join("l")], "dropped");
    let took = claim_after(&lease, || {
        std::thread::sleep(Duration::from_millis(300));
        kid.kill();
    })
    .expect("took a live holder's lease");
    let st = lease.stats();
    println!("takeover {took:?} after the 300 ms before the SIGKILL began");
    assert!(
        took >= Duration::from_millis(300),
        "took a live holder's lease"
    );
    assert_eq!((st.claim_exiting, st.claim_dead_owner), (0, 1));
}

/// One process holds three leases, and drops a fourth handle whose slot sat in the middle
/// of its sentinel's list; a forked child of it opens, claims through and drops handles of
/// all three files, then exits. The parent is still holding everything (the child's exit
/// ended nothing of its parent's), and when it is SIGKILLed all three leases are taken
/// over through its sentinel: the list stayed whole.
#[test]
fn the_sentinel_list_survives_unlinks_and_a_forked_childs_use() {
    let test = "the_sentinel_list_survives_unlinks_and_a_forked_childs_use";
    if in_role("holder") {
        let me = std::process::id();
        let paths: Vec<_> = (0..4).map(|i| path_arg(&format!("path{i}"))).collect();
        let handles: Vec<OwnerLease<u64>> =
            paths.iter().map(|p| OwnerLease::open(p).unwrap()).collect();
        for h in &handles[..3] {
            assert!(h.try_acquire(me, BIG));
        }
        // The fourth registers (it claims and releases), then goes: its slot leaves the
        // list while the three others stay on it, linked around it.
        assert!(handles[3].try_acquire(me, BIG) && handles[3].release(me));
        let mut handles = handles;
        let fourth = handles.remove(3);
        let (a, b) = (handles.remove(0), handles);
        drop(fourth);
        // SAFETY: the child only calls this crate, reports and `_exit`s.
        let c = unsafe { libc::fork() };
        assert!(c >= 0);
        if c == 0 {
            let child = std::process::id();
            let ok = paths[..3].iter().all(|p| {
                let h: OwnerLease<u64> = OwnerLease::open(p).unwrap();
                // Held by the parent: the child registers a slot of its own (and links
                // it on its own sentinel), claims nothing, and drops the handle.
                !h.try_acquire(child, BIG)
            });
            report(format!("child ok={}", u8::from(ok)));
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(c, &mut status, 0) };
        report("child gone");
        let _keep = (a, b);
        sleep_forever();
    }
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c", "d"];
    let leases: Vec<_> = names.iter().map(|n| lease_at(&dir, n)).collect();
    let paths: Vec<_> = names.iter().map(|n| dir.path().join(n)).collect();
    let mut kid = RoleCommand::new(test, "holder");
    for (i, p) in paths.iter().enumerate() {
        kid = kid.arg(&format!("path{i}"), p);
    }
    let mut kid = kid.spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "child ok=1");
    assert_eq!(kid.next_report(Duration::from_secs(10)), "child gone");
    let me = std::process::id();
    std::thread::sleep(Duration::from_millis(100));
    for l in &leases[..3] {
        assert!(
            !l.try_acquire(me, BIG),
            "the child's exit ended its parent's claim"
        );
    }
    std::thread::scope(|s| {
        let waiters: Vec<_> = leases[..3]
            .iter()
            .map(|l| s.spawn(move || l.acquire(me, BIG, Duration::from_secs(20)).is_some()))
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        kid.kill();
        for w in waiters {
            assert!(w.join().unwrap(), "a waiter timed out");
        }
    });
    for (l, n) in leases[..3].iter().zip(names) {
        let st = l.stats();
        assert_eq!(
            (st.claim_exiting, st.claim_dead_owner),
            (1, 0),
            "lease {n}: taken over through the sentinel"
        );
    }
}

/// The pattern `pthread_exit(3)` recommends, to its end: the main thread exits, a worker
/// thread holds the lease and then ends too, without releasing. No thread of the process
/// is left but the sentinel, which only sleeps; it must not keep the process alive for
/// ever (and its claims with it): the process ends, with status 0 as when the last thread
/// of a process exits, and its claim is taken over.
#[test]
fn a_process_whose_own_threads_all_ended_is_not_kept_alive_by_its_sentinel() {
    let test = "a_process_whose_own_threads_all_ended_is_not_kept_alive_by_its_sentinel";
    if in_role("holder") {
        let l: OwnerLease<u64> = OwnerLease::open(path_arg("path0")).unwrap();
        assert!(l.try_acquire(std::process::id(), BIG));
        assert!(cxc_testkit::exit_main_thread());
        report("held");
        // This (the test's) thread ends here holding the claim: the process's last
        // thread but the sentinel.
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let mut kid = start(test, "holder", &[dir.path().join("l")], "held");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the process did not end when its last own thread did: {status:?}"
    );
    assert!(
        lease
            .acquire(std::process::id(), BIG, Duration::from_secs(2))
            .is_some(),
        "its claim outlived it"
    );
}

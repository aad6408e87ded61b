//! Attacks on the owner lease's ownership promises (`docs/design.md` §3: L1–L7 and the identity
//! model) with real processes: a sibling thread releasing a claim mid-write, a writer
//! stalled in a signal handler or stopped with SIGSTOP, a claim made for another live
//! process's pid, a full identity table, fork without exec, the fallback identity path
//! and pid reuse inside a pid namespace.
//!
//! Every test re-executes this binary in roles (`cxc-testkit`); the parent sides run one
//! at a time (a file-wide lock), so the timing-sensitive ones do not compete with each
//! other for the CPU.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cxc_mmf::identity::{FALLBACK_BIT, Identity, force_fallback};
use cxc_sync::lease::counter;
use cxc_sync::{EpochMode, LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, ROLE_VAR, Rng, RoleCommand, arg, fields, flag, num, path_arg, report, role, serial,
    wait_until,
};

type P = [u64; 6];

/// A grace no heartbeat ever exceeds in these tests (manual epochs that nobody ticks).
const BIG: u64 = 1 << 40;
/// Marks payload values written by children (parents write small numbers).
const CHILD_TAG: u64 = 1 << 40;
/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// How long a child waits for its parent (the parent has failed then).
const CHILD_PATIENCE: Duration = Duration::from_secs(40);

fn never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

/// Clock epochs of 1 ms, no preemption.
fn clocked() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..LeaseOptions::default()
    }
}

fn me() -> u32 {
    std::process::id()
}

fn open(path: &Path) -> OwnerLease<P> {
    OwnerLease::open(path).expect("open the lease file")
}

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("create a marker file");
}

/// Waits (polling every 5 ms, cheap for many processes) for `path`; panics after `timeout`.
fn slow_wait(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Locks `m` (a poisoned lock means another thread failed already).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `n` "slot_user" children of test `test` (each claims once with its own pid and
/// keeps its handle, or drops it when `drop(i)`), and waits until every one has claimed.
fn slot_users(
    test: &str,
    path: &Path,
    done: &Path,
    n: usize,
    drop: impl Fn(usize) -> bool,
) -> Vec<Proc> {
    let mut users: Vec<Proc> = (0..n)
        .map(|i| {
            RoleCommand::new(test, "slot_user")
                .arg("path", path)
                .arg("done", done)
                .arg("drop", if drop(i) { "1" } else { "0" })
                .spawn()
        })
        .collect();
    for u in &mut users {
        let r = u.next_report(REPORT_WAIT);
        assert_eq!(num(&r, "claimed"), 1, "{r}");
    }
    users
}

fn counters(lease: &OwnerLease<P>) -> [u64; counter::COUNT] {
    lease.status().counters
}

/// Sends `sig` to process `pid` (without reaping anything).
fn signal_pid(pid: u32, sig: libc::c_int) {
    let raw = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(raw, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

fn process_exists(pid: u32) -> bool {
    let raw = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) with signal 0 only checks for existence.
    unsafe { libc::kill(raw, 0) == 0 }
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    u32::try_from(pid).expect("positive pid")
}

/// Reads reports until one has `key`; returns it (other reports are kept in `seen`).
fn report_with(p: &mut Proc, key: &str, seen: &mut Vec<String>) -> String {
    if let Some(i) = seen.iter().position(|r| fields(r).contains_key(key)) {
        return seen.remove(i);
    }
    loop {
        let r = p.next_report(REPORT_WAIT);
        if fields(&r).contains_key(key) {
            return r;
        }
        seen.push(r);
    }
}

// ---------------------------------------------------------------------------------------
// 1. A sibling thread releases the claim while `with_lease` runs.
// ---------------------------------------------------------------------------------------

const T1: &str = "sibling_release_during_with_lease_never_publishes";

fn role_sibling() {
    let path = path_arg("path");
    let marker = path_arg("marker");
    let lease = open(&path);
    let pid = me();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let l = &lease;
        let marker = &marker;
        let t1 = s.spawn(move || {
            l.with_lease(pid, BIG, |v| {
                report("inside");
                tx.send(()).expect("tell T2 we are inside");
                std::thread::sleep(Duration::from_millis(300));
                // The parent has claimed and written by now (ordering, not timing).
                slow_wait(marker, CHILD_PATIENCE);
                *v = [999; 6];
            })
        });
        rx.recv().expect("T1 entered its closure");
        let t = Instant::now();
        let ok = lease.release(pid);
        let us = t.elapsed().as_micros();
        report(format!("released={ok} us={us}"));
        let published = t1.join().expect("T1 panicked").is_some();
        let after = lease.status().payload_words;
        report(format!("published={published} after0={}", after[0]));
    });
}

#[test]
fn sibling_release_during_with_lease_never_publishes() {
    match role().as_deref() {
        Some("sibling") => return role_sibling(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut worst_us = 0;
    let mut prev = [0u64; 6];
    for round in 0..10 {
        let marker = dir.path().join(format!("parent-wrote-{round}"));
        let mut child = RoleCommand::new(T1, "sibling")
            .arg("path", &path)
            .arg("marker", &marker)
            .spawn();
        assert_eq!(child.next_report(REPORT_WAIT), "inside");
        let rel = child.next_report(REPORT_WAIT);
        assert!(
            flag(&rel, "released"),
            "round {round}: release(me) by T2 refused during T1's with_lease: {rel}"
        );
        let us = num(&rel, "us");
        assert!(
            us < 100_000,
            "round {round}: release took {us} µs (must not wait for T1's closure)"
        );
        worst_us = worst_us.max(us);
        let claim = lease
            .acquire(pid, BIG, Duration::from_secs(2))
            .unwrap_or_else(|| panic!("round {round}: lease not vacant after T2's release"));
        assert_eq!(
            lease.read_claimed(&claim),
            Some(prev),
            "round {round}: the payload is not the last published value"
        );
        assert!(lease.write_claimed(&claim, [100; 6]), "round {round}");
        touch(&marker);
        let fin = child.next_report(REPORT_WAIT);
        assert!(
            !flag(&fin, "published"),
            "round {round}: T1's with_lease published after its claim was released: {fin}"
        );
        assert_eq!(num(&fin, "after0"), 100, "round {round}: child saw {fin}");
        child.finish(REPORT_WAIT);
        assert_eq!(
            lease.read_claimed(&claim),
            Some([100; 6]),
            "round {round}: T1's abandoned value became visible"
        );
        assert!(lease.release_claim(&claim));
        assert_eq!(lease.status().payload_words, [100; 6], "round {round}");
        prev = [100; 6];
    }
    let c = counters(&lease);
    println!(
        "scenario 1: 10 rounds, worst sibling release {worst_us} µs, quarantined {} freed {}, {:?}",
        c[counter::QUARANTINED],
        c[counter::QUARANTINE_FREED],
        started.elapsed()
    );
    assert_eq!(c[counter::QUARANTINED], 10, "every release hit T1's write");
    assert_eq!(c[counter::QUARANTINE_FREED], 10, "T1 freed its buffer");
}

// ---------------------------------------------------------------------------------------
// 2. A writer stalled inside `write_claimed` by a signal handler.
// ---------------------------------------------------------------------------------------

const T2: &str = "writer_stalled_in_signal_handler_never_publishes";

/// Grace (1 ms epochs) with which the stalled writer of scenario 2 claims back the lease.
const RECLAIM_GRACE: u64 = 2_000;

extern "C" fn stall_150ms(_sig: libc::c_int) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 150_000_000,
    };
    // SAFETY: nanosleep is async-signal-safe and `ts` is a valid timespec.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

fn role_sigwriter() {
    let path = path_arg("path");
    let stop = path_arg("stop");
    // SAFETY: a zeroed `sigaction` is a valid value; we set a handler that only calls
    // nanosleep (async-signal-safe) and an empty mask, then install it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = stall_150ms as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let lease = open(&path);
    let pid = me();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut claim = lease
        .acquire(pid, 20, Duration::from_secs(10))
        .expect("first claim");
    report(format!("tid={tid}"));
    let deadline = Instant::now() + CHILD_PATIENCE;
    let mut k: u64 = 0;
    let mut lost = 0u64;
    'outer: loop {
        k += 1;
        let ok = lease.write_claimed(&claim, [CHILD_TAG | k; 6]) && lease.beat_claimed(&claim);
        if !ok {
            lost += 1;
            claim = loop {
                if stop.exists() || Instant::now() > deadline {
                    break 'outer;
                }
                // A longer grace to get the lease back than the 20 the parent uses to take it:
                // a scheduling hiccup of the parent (50 ms seen on a loaded 2-core machine)
                // must not hand the lease back mid-round. The takeover under test is the
                // parent's, from a writer stalled for 150 ms, with grace 20.
                if let Some(c) = lease.acquire(pid, RECLAIM_GRACE, Duration::from_millis(50)) {
                    break c;
                }
            };
        }
        if k.is_multiple_of(512) && (stop.exists() || Instant::now() > deadline) {
            break;
        }
    }
    report(format!("writes={k} lost={lost}"));
}

#[test]
fn writer_stalled_in_signal_handler_never_publishes() {
    match role().as_deref() {
        Some("sigwriter") => return role_sigwriter(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let stop = dir.path().join("stop");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &clocked()).expect("create");
    let pid = me();
    let mut child = RoleCommand::new(T2, "sigwriter")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    let cpid = child.pid();
    let tid = num(&child.next_report(REPORT_WAIT), "tid");
    let mut hits = 0;
    // At least 20 rounds, and more until one signal lands inside a write: about one round
    // in 13 does (0 of 20 in about one run in five), and 120 rounds (~30 s, within the
    // child's patience) miss with a probability near 1e-4.
    let mut r = 0u64;
    while r < 20 || (hits == 0 && r < 120) {
        r += 1;
        assert!(
            wait_until(Duration::from_secs(5), || lease.current_owner()
                == Some(cpid)),
            "round {r}: the child never claimed again"
        );
        std::thread::sleep(Duration::from_millis(2));
        let q0 = counters(&lease)[counter::QUARANTINED];
        // SAFETY: tgkill has no memory-safety preconditions.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::c_long::from(cpid as i32),
                tid as libc::c_long,
                libc::c_long::from(libc::SIGUSR1),
            )
        };
        assert_eq!(rc, 0, "tgkill: {}", std::io::Error::last_os_error());
        std::thread::sleep(Duration::from_millis(40));
        let claim = lease
            .acquire(pid, 20, Duration::from_secs(2))
            .unwrap_or_else(|| panic!("round {r}: a writer stalled for 150 ms was not replaced"));
        let mine = [1000 + r; 6];
        assert!(lease.write_claimed(&claim, mine), "round {r}: first write");
        let until = Instant::now() + Duration::from_millis(200);
        let mut last_beat = Instant::now();
        while Instant::now() < until {
            if !lease.beat_claimed(&claim) {
                let st = lease.status();
                panic!(
                    "round {r}: parent lost its claim {} µs after its last beat: owner {:?} \
                     generation {} (ours {}), heartbeat epoch {} now {}, stale claims {}",
                    last_beat.elapsed().as_micros(),
                    st.owner,
                    st.generation,
                    claim.generation(),
                    st.heartbeat_epoch,
                    st.epoch,
                    st.counters[counter::CLAIM_STALE]
                );
            }
            last_beat = Instant::now();
            assert_eq!(lease.read_claimed(&claim), Some(mine), "round {r}");
            let seen = lease.status().payload_words;
            assert_eq!(
                seen, mine,
                "round {r}: published payload is not the holder's"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            lease.read_claimed(&claim),
            Some(mine),
            "round {r}: at the end"
        );
        if counters(&lease)[counter::QUARANTINED] > q0 {
            hits += 1;
        }
        assert!(lease.release_claim(&claim), "round {r}: release");
    }
    touch(&stop);
    let rest = child.finish(REPORT_WAIT);
    let c = counters(&lease);
    println!(
        "scenario 2: {hits}/{r} rounds hit a write in flight; quarantined {} freed {} reaped {} \
         torn_inherited {} child {:?}, {:?}",
        c[counter::QUARANTINED],
        c[counter::QUARANTINE_FREED],
        c[counter::QUARANTINE_REAPED],
        c[counter::TORN_INHERITED],
        rest,
        started.elapsed()
    );
    assert!(hits >= 1, "no round caught the writer mid-write");
    assert_eq!(
        c[counter::QUARANTINE_FREED] + c[counter::QUARANTINE_REAPED],
        c[counter::QUARANTINED],
        "a quarantined buffer was never freed although its writer ran on"
    );
}

// ---------------------------------------------------------------------------------------
// 3 and 8. A claim made for another live process's pid, by a process killed mid-write.
// ---------------------------------------------------------------------------------------

const T3: &str = "claim_for_another_pid_by_killed_writer_is_taken_over";
const T8: &str = "claim_for_another_pid_by_killed_writer_fallback_identity";

fn role_bystander() {
    report("ready");
    slow_wait(&path_arg("stop"), CHILD_PATIENCE);
}

fn role_foreign() {
    let lease = open(&path_arg("path"));
    let b: u32 = arg("b").parse().expect("pid of B");
    assert_eq!(lease.with_lease(b, BIG, |v| *v = [7; 6]), Some(()));
    report(format!("first=ok unique={}", Identity::current().unique));
    lease.with_lease(b, BIG, |v| {
        v[0] = 8;
        report("inside");
        std::thread::sleep(Duration::from_secs(60));
    });
}

/// The acquiring side of scenarios 3 and 8 (a test process, or a driver process).
fn foreign_claim_parent(test: &str, fallback: bool) -> String {
    if fallback {
        force_fallback(true);
        assert!(
            Identity::current().is_fallback(),
            "forcing the fallback identity did not take"
        );
    }
    let env = if fallback { "1" } else { "0" };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let stop = dir.path().join("stop");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut b = RoleCommand::new(test, "bystander")
        .arg("stop", &stop)
        .env("CXC_IDENTITY_FALLBACK", env)
        .spawn();
    assert_eq!(b.next_report(REPORT_WAIT), "ready");
    let mut a = RoleCommand::new(test, "foreign")
        .arg("path", &path)
        .arg("b", b.pid().to_string())
        .env("CXC_IDENTITY_FALLBACK", env)
        .spawn();
    let first = a.next_report(REPORT_WAIT);
    let a_unique = num(&first, "unique");
    assert_eq!(a.next_report(REPORT_WAIT), "inside");
    let st = lease.status();
    assert_eq!(st.owner, Some(b.pid()), "the claim is made for B's pid");
    assert!(st.writing, "A is inside with_lease");
    assert_eq!(
        st.owner_start,
        Some(a_unique),
        "the claim must name the claiming process A, not B"
    );
    if fallback {
        assert_ne!(
            a_unique & FALLBACK_BIT,
            0,
            "A's identity is not the fallback form"
        );
    }
    assert!(
        !lease.try_acquire(pid, BIG),
        "took the lease from a live writer"
    );
    // SIGKILL without reaping: A stays a zombie while we take over.
    signal_pid(a.pid(), libc::SIGKILL);
    let t = Instant::now();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(2))
        .expect("a claim whose claiming process died must be taken over");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "takeover took {took:?}");
    assert!(
        claim.payload_may_be_inconsistent(),
        "took over a writer killed mid-write without the torn flag"
    );
    assert_eq!(
        lease.read_claimed(&claim),
        Some([7; 6]),
        "the payload is not the last published value"
    );
    assert!(b.try_wait().is_none(), "B died");
    assert!(process_exists(b.pid()));
    assert!(lease.payload_torn());
    assert!(lease.write_claimed(&claim, [9; 6]));
    assert!(!lease.payload_torn(), "a write restores the payload");
    assert!(lease.release_claim(&claim));
    touch(&stop);
    b.finish(REPORT_WAIT);
    a.kill();
    format!("took_us={} torn=true fallback={fallback}", took.as_micros())
}

#[test]
fn claim_for_another_pid_by_killed_writer_is_taken_over() {
    match role().as_deref() {
        Some("bystander") => return role_bystander(),
        Some("foreign") => return role_foreign(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let t = Instant::now();
    let summary = foreign_claim_parent(T3, false);
    println!("scenario 3: {summary}, {:?}", t.elapsed());
}

#[test]
fn claim_for_another_pid_by_killed_writer_fallback_identity() {
    match role().as_deref() {
        Some("bystander") => return role_bystander(),
        Some("foreign") => return role_foreign(),
        Some("driver") => {
            let summary = foreign_claim_parent(T8, true);
            report(summary);
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let t = Instant::now();
    // Forcing the fallback identity is process-wide, so the acquiring side runs in its own
    // process (with `force_fallback(true)` and the variable), not in this test process
    // whose other tests use pidfs identities.
    let mut driver = RoleCommand::new(T8, "driver")
        .env("CXC_IDENTITY_FALLBACK", "1")
        .spawn();
    let reports = driver.finish(Duration::from_secs(30));
    println!("scenario 8: {reports:?}, {:?}", t.elapsed());
    assert!(reports.iter().any(|r| r.contains("torn=true")));
}

// ---------------------------------------------------------------------------------------
// 4. The identity table: many processes, a full table.
// ---------------------------------------------------------------------------------------

const T4: &str = "many_slot_users_and_a_killed_writer_never_wedge";
const T4B: &str = "full_identity_table_refuses_only_newcomers";

fn role_slot_user() {
    let lease = open(&path_arg("path"));
    let done = path_arg("done");
    let pid = me();
    let c = lease
        .acquire(pid, BIG, Duration::from_secs(10))
        .expect("a slot user claims");
    assert!(lease.release_claim(&c));
    if arg("drop") == "1" {
        drop(lease);
        report("claimed=1 dropped=1");
        slow_wait(&done, CHILD_PATIENCE);
        return;
    }
    report("claimed=1 dropped=0");
    slow_wait(&done, CHILD_PATIENCE);
    drop(lease);
}

fn role_victim() {
    let lease = open(&path_arg("path"));
    let pid = me();
    assert_eq!(lease.with_lease(pid, BIG, |v| *v = [42; 6]), Some(()));
    lease.with_lease(pid, BIG, |v| {
        v[1] = 43;
        report("inside");
        std::thread::sleep(Duration::from_secs(60));
    });
}

fn role_fresh() {
    let lease = open(&path_arg("path"));
    let pid = me();
    let c = lease
        .acquire(pid, BIG, Duration::from_secs(2))
        .expect("a fresh process claims");
    let v = lease.read_claimed(&c).expect("read");
    assert!(lease.release_claim(&c));
    report(format!("claimed=1 value0={}", v[0]));
}

#[test]
fn many_slot_users_and_a_killed_writer_never_wedge() {
    match role().as_deref() {
        Some("slot_user") => return role_slot_user(),
        Some("victim") => return role_victim(),
        Some("fresh") => return role_fresh(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let done = dir.path().join("done");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut users = slot_users(T4, &path, &done, 20, |i| i % 7 == 0);
    let mut victim = RoleCommand::new(T4, "victim").arg("path", &path).spawn();
    assert_eq!(victim.next_report(REPORT_WAIT), "inside");
    assert_eq!(lease.current_owner(), Some(victim.pid()));
    victim.kill();
    let t = Instant::now();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(1))
        .expect("the killed writer's claim was not taken over within 1 s");
    let took = t.elapsed();
    assert!(claim.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&claim), Some([42; 6]));
    assert!(lease.release_claim(&claim));
    touch(&done);
    for u in &mut users {
        u.finish(REPORT_WAIT);
    }
    let mut fresh = RoleCommand::new(T4, "fresh").arg("path", &path).spawn();
    let r = fresh.finish(REPORT_WAIT);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(num(&r[0], "value0"), 42);
    println!(
        "scenario 4: takeover after SIGKILL with 20 slot users in {took:?}; fresh process claimed; {:?}",
        started.elapsed()
    );
}

fn role_crowd() {
    let dir = path_arg("dir");
    let lease = open(&dir.join("lease"));
    let pid = me();
    let done = dir.join("done");
    let t = Instant::now();
    if let Some(c) = lease.acquire(pid, BIG, Duration::from_secs(20)) {
        assert!(lease.release_claim(&c));
        report("slot=1");
        slow_wait(&dir.join("again"), CHILD_PATIENCE);
        for i in 0..3 {
            let c = lease
                .acquire(pid, BIG, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("a slot owner's claim {i} was refused"));
            assert!(lease.release_claim(&c));
        }
        report("again=3");
        let exit = dir.join(format!("drop-{pid}"));
        let deadline = Instant::now() + CHILD_PATIENCE;
        while Instant::now() < deadline && !done.exists() {
            if exit.exists() {
                drop(lease);
                touch(&dir.join(format!("dropped-{pid}")));
                slow_wait(&done, CHILD_PATIENCE);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        return;
    }
    let ms = t.elapsed().as_millis();
    let again = lease.try_acquire(pid, BIG);
    report(format!("slot=0 ms={ms} try_again={again}"));
    let deadline = Instant::now() + CHILD_PATIENCE;
    while Instant::now() < deadline && !done.exists() {
        if lease.try_acquire(pid, BIG) {
            touch(&dir.join(format!("late-{pid}")));
            assert!(lease.release(pid));
            slow_wait(&done, CHILD_PATIENCE);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn count_prefix(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
        .count()
}

#[test]
fn full_identity_table_refuses_only_newcomers() {
    match role().as_deref() {
        Some("crowd") => return role_crowd(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    // This process never claims here: the 64 slots are the children's.
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let mut crowd: Vec<Proc> = (0..70)
        .map(|_| {
            RoleCommand::new(T4B, "crowd")
                .arg("dir", dir.path())
                .spawn()
        })
        .collect();
    let mut owners = Vec::new();
    let mut newcomers = Vec::new();
    for (i, c) in crowd.iter_mut().enumerate() {
        let r = c.next_report(Duration::from_secs(40));
        if num(&r, "slot") == 1 {
            owners.push(i);
        } else {
            assert!(!flag(&r, "try_again"), "{r}");
            newcomers.push(i);
        }
    }
    assert_eq!(
        (owners.len(), newcomers.len()),
        (64, 6),
        "64 slots: exactly 64 of 70 live processes can claim"
    );
    touch(&dir.path().join("again"));
    for &i in &owners {
        assert_eq!(crowd[i].next_report(REPORT_WAIT), "again=3");
    }
    assert_eq!(count_prefix(dir.path(), "late-"), 0);
    // One slot owner dies: exactly one newcomer gets its slot, promptly.
    crowd[owners[0]].kill();
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(2), || count_prefix(dir.path(), "late-")
            >= 1),
        "no newcomer could claim after a slot owner died"
    );
    let after_kill = t.elapsed();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(
        count_prefix(dir.path(), "late-"),
        1,
        "one freed slot, one newcomer"
    );
    // Another drops its handle (process alive): one more newcomer gets in.
    let dropper = crowd[owners[1]].pid();
    touch(&dir.path().join(format!("drop-{dropper}")));
    slow_wait(&dir.path().join(format!("dropped-{dropper}")), REPORT_WAIT);
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(2), || count_prefix(dir.path(), "late-")
            >= 2),
        "no newcomer could claim after a slot owner dropped its handle"
    );
    let after_drop = t.elapsed();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(count_prefix(dir.path(), "late-"), 2);
    touch(&dir.path().join("done"));
    for (i, c) in crowd.iter_mut().enumerate() {
        if i != owners[0] {
            c.finish(REPORT_WAIT);
        }
    }
    assert_eq!(lease.current_owner(), None);
    println!(
        "scenario 4b: 64/70 got slots; newcomer in {after_kill:?} after a kill, \
         {after_drop:?} after a drop; {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 5. Eight threads of one process contending through claims, with a shadow log.
// ---------------------------------------------------------------------------------------

#[test]
fn threads_of_one_process_never_expose_unpublished_values() {
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let seed = Rng::for_test().seed();
    // (generation, value, published) in publication order: every write and `with_lease`
    // runs under this lock, claims/releases/reads do not.
    let shadow: Mutex<Vec<(u64, P, bool)>> = Mutex::new(Vec::new());
    let observed: Mutex<Vec<P>> = Mutex::new(Vec::new());
    let next = AtomicU64::new(1);
    let fresh = || {
        let n = next.fetch_add(1, Ordering::Relaxed);
        std::array::from_fn(|i| n << 8 | i as u64)
    };
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (lease, shadow, observed, fresh) = (&lease, &shadow, &observed, &fresh);
            s.spawn(move || {
                let mut rng = Rng::derive(seed, 5, t, 0);
                let mut seen = Vec::new();
                for _ in 0..1500 {
                    match rng.below(100) {
                        0..=39 => {
                            let Some(c) = lease.try_claim(pid, BIG) else {
                                continue;
                            };
                            for _ in 0..rng.below(4) {
                                if let Some(v) = lease.read_claimed(&c) {
                                    seen.push(v);
                                }
                                let v = fresh();
                                let mut log = lock(shadow);
                                let ok = lease.write_claimed(&c, v);
                                log.push((c.generation(), v, ok));
                                drop(log);
                                if rng.percent(20) {
                                    std::thread::yield_now();
                                }
                            }
                            if rng.percent(60) {
                                lease.release_claim(&c);
                            }
                        }
                        40..=59 => {
                            let mut log = lock(shadow);
                            let mut wrote = None;
                            let nap = rng.percent(30);
                            let r = lease.with_lease(pid, BIG, |p| {
                                seen.push(*p);
                                let v = fresh();
                                *p = v;
                                wrote = Some((lease.lease_term(), v));
                                if nap {
                                    std::thread::sleep(Duration::from_micros(50));
                                }
                            });
                            if let Some((g, v)) = wrote {
                                log.push((g, v, r.is_some()));
                            }
                        }
                        60..=74 => {
                            lease.release(pid);
                        }
                        75..=89 => seen.push(lease.status().payload_words),
                        _ => {
                            if let Some(v) = lease.read_as_owner(pid) {
                                seen.push(v);
                            }
                        }
                    }
                }
                lock(observed).extend(seen);
            });
        }
    });
    let log = shadow.into_inner().expect("shadow log");
    let observed = observed.into_inner().expect("observed");
    let ok: HashSet<P> = log.iter().filter(|e| e.2).map(|e| e.1).collect();
    let failed: HashSet<P> = log.iter().filter(|e| !e.2).map(|e| e.1).collect();
    for v in &observed {
        assert!(
            !failed.contains(v),
            "a value reported as not published became visible: {v:?} (seed {seed})"
        );
        assert!(
            ok.contains(v) || *v == [0; 6],
            "a value nobody published was read: {v:?} (seed {seed})"
        );
    }
    let mut last_gen = 0;
    for (g, v, _) in log.iter().filter(|e| e.2) {
        assert!(
            *g >= last_gen,
            "write {v:?} of generation {g} published after one of generation {last_gen}"
        );
        last_gen = *g;
    }
    let last = log.iter().rev().find(|e| e.2).map_or([0; 6], |e| e.1);
    assert_eq!(
        lease.status().payload_words,
        last,
        "the final value is not the last successful write (seed {seed})"
    );
    let c = counters(&lease);
    println!(
        "scenario 5: {} writes ok, {} refused, {} reads checked; quarantined {} freed {} \
         reaped {} no_buffer {}; {:?}",
        ok.len(),
        failed.len(),
        observed.len(),
        c[counter::QUARANTINED],
        c[counter::QUARANTINE_FREED],
        c[counter::QUARANTINE_REAPED],
        c[counter::NO_BUFFER],
        started.elapsed()
    );
    assert_eq!(
        c[counter::QUARANTINE_FREED] + c[counter::QUARANTINE_REAPED],
        c[counter::QUARANTINED],
        "a buffer stayed in quarantine after every writer returned"
    );
    assert_eq!(c[counter::NO_BUFFER], 0);
    // No buffer leaked: a holder can still write many times.
    let claim = lease.try_claim(pid, BIG).expect("claim at the end");
    for i in 0..20 {
        assert!(
            lease.write_claimed(&claim, [i; 6]),
            "write {i} after the run"
        );
    }
    assert!(lease.release_claim(&claim));
}

// ---------------------------------------------------------------------------------------
// 6. A holder stopped (SIGSTOP) mid-write, replaced after the grace.
// ---------------------------------------------------------------------------------------

const T6: &str = "stopped_writer_is_replaced_and_never_published";
const T6B: &str = "stopped_writer_buffer_freed_across_generation_checkpoint";

fn role_stopwriter() {
    let lease = open(&path_arg("path"));
    let pid = me();
    let grace: u64 = arg("grace").parse().expect("grace");
    match arg("mode").as_str() {
        "loop" => {
            let claim = lease
                .acquire(pid, grace, Duration::from_secs(10))
                .expect("claim");
            report("looping");
            let mut k = 0u64;
            loop {
                k += 1;
                let v = CHILD_TAG | k;
                if !lease.write_claimed(&claim, [v; 6]) {
                    report(format!("failed={v}"));
                    break;
                }
                if !lease.beat_claimed(&claim) {
                    report(format!("beat_failed={v}"));
                    break;
                }
            }
        }
        _ => {
            let r = lease.with_lease(pid, grace, |v| {
                report("inside");
                std::thread::sleep(Duration::from_millis(100));
                *v = [CHILD_TAG | 777; 6];
            });
            report(format!(
                "published={} failed={}",
                r.is_some(),
                CHILD_TAG | 777
            ));
        }
    }
    slow_wait(&path_arg("stop"), CHILD_PATIENCE);
}

/// Stops `child` until the lease shows a write in flight (loop mode retries; closure mode
/// is always inside). Returns the number of attempts.
fn stop_mid_write(child: &Proc, lease: &OwnerLease<P>) -> u32 {
    for attempt in 1..=500 {
        child.stop();
        // Give the stop time to land (the state is read while the child cannot run).
        wait_until(Duration::from_millis(200), || {
            std::fs::read_to_string(format!("/proc/{}/stat", child.pid())).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|t| t.trim_start().starts_with('T'))
            })
        });
        if lease.status().writing {
            return attempt;
        }
        child.cont();
        std::thread::sleep(Duration::from_micros(300));
    }
    panic!("never caught the writer mid-write");
}

/// One run of scenario 6 (and 6b with `checkpoint`): returns a summary.
fn stopped_writer_run(test: &str, mode: &str, checkpoint: bool) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let stop = dir.path().join("stop");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &clocked()).expect("create");
    let pid = me();
    let grace = 5u64;
    let mut child = RoleCommand::new(test, "stopwriter")
        .arg("path", &path)
        .arg("stop", &stop)
        .arg("mode", mode)
        .arg("grace", grace.to_string())
        .spawn();
    let first = child.next_report(REPORT_WAIT);
    assert!(first == "looping" || first == "inside", "{first}");
    let attempts = stop_mid_write(&child, &lease);
    let before = counters(&lease);
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(3 * grace));
    let mut claim = lease
        .acquire(pid, grace, Duration::from_secs(2))
        .expect("a stopped holder must be replaced after the grace");
    let took = t.elapsed();
    assert!(claim.payload_may_be_inconsistent(), "took over mid-write");
    let after_take = counters(&lease);
    assert_eq!(
        after_take[counter::QUARANTINED],
        before[counter::QUARANTINED] + 1,
        "the stopped writer's buffer was not quarantined"
    );
    if checkpoint {
        // Cross a generation checkpoint (every 2^16 claims) while the writer is stopped.
        let g0 = claim.generation();
        let target = (g0 / 65_536 + 1) * 65_536 + 2;
        assert!(lease.release_claim(&claim));
        loop {
            let c = lease.try_claim(pid, BIG).expect("vacant");
            if c.generation() >= target {
                claim = c;
                break;
            }
            assert!(lease.release_claim(&c));
        }
    }
    assert!(lease.write_claimed(&claim, [1; 6]));
    child.cont();
    let fin = child.next_report(REPORT_WAIT);
    let stale_value = fields(&fin)
        .iter()
        .find_map(|(k, v)| {
            k.contains("failed")
                .then(|| v.parse::<u64>().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("unexpected report {fin}"));
    if mode == "closure" {
        assert!(
            !flag(&fin, "published"),
            "stale with_lease published: {fin}"
        );
    } else {
        assert!(
            fin.starts_with("failed="),
            "the stale write did not fail: {fin}"
        );
    }
    let freed = wait_until(Duration::from_secs(1), || {
        counters(&lease)[counter::QUARANTINE_FREED] > before[counter::QUARANTINE_FREED]
    });
    // The new holder keeps writing (more writes than there are buffers).
    for i in 2..30u64 {
        assert!(lease.beat_claimed(&claim));
        assert!(
            lease.write_claimed(&claim, [i; 6]),
            "write {i} of the new holder"
        );
        let seen = lease.read_claimed(&claim).expect("read");
        assert_eq!(seen, [i; 6]);
        assert_ne!(seen, [stale_value; 6]);
    }
    assert_ne!(lease.status().payload_words, [stale_value; 6]);
    let c = counters(&lease);
    assert!(
        freed,
        "the stale writer failed its publication but its quarantined buffer was not freed \
         (quarantined {} freed {} reaped {}, generation {})",
        c[counter::QUARANTINED],
        c[counter::QUARANTINE_FREED],
        c[counter::QUARANTINE_REAPED],
        claim.generation()
    );
    assert!(lease.release_claim(&claim));
    touch(&stop);
    child.finish(REPORT_WAIT);
    format!("{mode}: caught mid-write after {attempts} stop(s), replaced in {took:?}")
}

#[test]
fn stopped_writer_is_replaced_and_never_published() {
    match role().as_deref() {
        Some("stopwriter") => return role_stopwriter(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let t = Instant::now();
    let a = stopped_writer_run(T6, "loop", false);
    let b = stopped_writer_run(T6, "closure", false);
    println!("scenario 6: {a}; {b}; {:?}", t.elapsed());
}

#[test]
fn stopped_writer_buffer_freed_across_generation_checkpoint() {
    match role().as_deref() {
        Some("stopwriter") => return role_stopwriter(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let t = Instant::now();
    let a = stopped_writer_run(T6B, "closure", true);
    println!("scenario 6b: {a}; {:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------
// 7. fork without exec.
// ---------------------------------------------------------------------------------------

const T7: &str = "forked_child_is_another_identity";

fn forked_child(lease: &OwnerLease<P>, parent: u32, dir: &Path) -> ! {
    let mine = getpid();
    let am = lease.am_i_owner(parent);
    let w = lease.write_as_owner(parent, [66; 6]);
    let rd = lease.read_as_owner(parent).is_some();
    let bt = lease.beat(parent);
    let rel = lease.release(parent);
    report(format!(
        "fork_pid={mine} am_owner={am} write={w} read={rd} beat={bt} release={rel}"
    ));
    touch(&dir.join("checked"));
    slow_wait(&dir.join("released"), CHILD_PATIENCE);
    let c = lease.try_claim(mine, BIG);
    report(format!(
        "fork_claim={} fork_gen={}",
        c.is_some(),
        c.map_or(0, |c| c.generation())
    ));
    std::thread::sleep(CHILD_PATIENCE);
    // SAFETY: `_exit` ends the forked child without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

fn role_forker() {
    let dir = path_arg("dir");
    let lease = open(&dir.join("lease"));
    let pid = me();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(5))
        .expect("forker claims");
    assert!(lease.write_claimed(&claim, [11; 6]));
    report(format!("holding={}", claim.generation()));
    // SAFETY: the child only makes lease calls, reports, sleeps and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        forked_child(&lease, pid, &dir);
    }
    assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
    report(format!("forked={child}"));
    slow_wait(&dir.join("checked"), CHILD_PATIENCE);
    assert!(
        lease.am_i_owner(pid),
        "the forker lost its claim to its forked child"
    );
    assert_eq!(lease.read_claimed(&claim), Some([11; 6]));
    assert!(lease.release_claim(&claim));
    touch(&dir.join("released"));
    std::thread::sleep(CHILD_PATIENCE);
}

#[test]
fn forked_child_is_another_identity() {
    match role().as_deref() {
        Some("forker") => return role_forker(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut forker = RoleCommand::new(T7, "forker")
        .arg("dir", dir.path())
        .spawn();
    let mut seen = Vec::new();
    let holding = num(&report_with(&mut forker, "holding", &mut seen), "holding");
    let checks = report_with(&mut forker, "fork_pid", &mut seen);
    let fork_pid = u32::try_from(num(&checks, "fork_pid")).expect("pid");
    for key in ["am_owner", "write", "read", "beat", "release"] {
        assert!(
            !flag(&checks, key),
            "a forked child acted as its parent's claim ({key}): {checks}"
        );
    }
    let claimed = report_with(&mut forker, "fork_claim", &mut seen);
    assert!(flag(&claimed, "fork_claim"), "{claimed}");
    assert_eq!(num(&claimed, "fork_gen"), holding + 1);
    let st = lease.status();
    assert_eq!(st.owner, Some(fork_pid));
    let child_ident = Identity::of_pid(fork_pid).expect("identity of the forked child");
    let parent_ident = Identity::of_pid(forker.pid()).expect("identity of the forker");
    assert_ne!(child_ident.unique, parent_ident.unique);
    assert_eq!(
        st.owner_start,
        Some(child_ident.unique),
        "the forked child's claim names another process"
    );
    // The forker dies: the forked child's claim stays (it is alive).
    forker.kill();
    assert!(process_exists(fork_pid));
    assert!(
        !lease.try_acquire(pid, BIG),
        "the forked child's claim was judged dead when its parent died"
    );
    assert!(
        lease
            .acquire(pid, BIG, Duration::from_millis(300))
            .is_none(),
        "the forked child's claim was taken while it lives"
    );
    // The forked child dies: its claim is taken over at once.
    signal_pid(fork_pid, libc::SIGKILL);
    let t = Instant::now();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(2))
        .expect("the dead forked child's claim was not taken over");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(lease.read_claimed(&claim), Some([11; 6]));
    assert!(lease.release_claim(&claim));
    println!(
        "scenario 7: forked child refused its parent's claim, its own claim survived the \
         parent's death and was taken {took:?} after its own; {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 9. Pid reuse inside a pid namespace.
// ---------------------------------------------------------------------------------------

const T9: &str = "pid_reuse_in_pid_namespace_is_a_takeover";
const T9B: &str = "pid_reuse_in_pid_namespace_fallback_identity";

fn ns_role(test: &str) -> bool {
    match role().as_deref() {
        Some("ns") => {
            // SAFETY: unshare has no memory-safety preconditions; only our future
            // children enter the new pid namespace.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWPID) };
            assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
            // This process can no longer start threads (its children live in another pid
            // namespace), so no `Proc` here: nsinit inherits our stdout (its reports reach
            // the test directly) and its role arguments, and we wait for it plainly.
            let status = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--exact",
                    test,
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ROLE_VAR, "nsinit")
                .stdin(std::process::Stdio::null())
                .status()
                .expect("start nsinit");
            assert!(status.success(), "nsinit failed: {status}");
        }
        Some("nsinit") => {
            assert_eq!(getpid(), 1, "nsinit is pid 1 of the new namespace");
            let path = path_arg("path");
            let mut holder = RoleCommand::new(test, "holder").arg("path", &path).spawn();
            report(format!("nsinit=1 unique={}", Identity::current().unique));
            let h = holder.next_report(REPORT_WAIT);
            let hpid = num(&h, "holder_pid");
            let hgen = num(&h, "gen");
            assert_eq!(u64::from(holder.pid()), hpid);
            holder.kill();
            std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", hpid - 1))
                .expect("write ns_last_pid");
            let mut taker = RoleCommand::new(test, "taker").arg("path", &path).spawn();
            let tpid = u64::from(taker.pid());
            let rs = taker.finish(REPORT_WAIT);
            assert_eq!(
                tpid, hpid,
                "pid reuse failed: the taker got pid {tpid}, not the holder's {hpid}"
            );
            for r in rs {
                report(format!("{r} holder_pid={hpid} holder_gen={hgen}"));
            }
        }
        Some("holder") => {
            let lease = open(&path_arg("path"));
            let pid = getpid();
            let c = lease.try_claim(pid, BIG).expect("holder claims");
            assert!(lease.write_claimed(&c, [5; 6]));
            assert!(lease.release_claim(&c));
            lease.with_lease(pid, BIG, |v| {
                v[0] = 6;
                report(format!("holder_pid={pid} gen={}", lease.lease_term()));
                std::thread::sleep(Duration::from_secs(60));
            });
        }
        Some("taker") => {
            let lease = open(&path_arg("path"));
            let pid = getpid();
            let before = lease.am_i_owner(pid);
            let c = lease.try_claim(pid, BIG);
            let value0 = c.and_then(|c| lease.read_claimed(&c)).map_or(0, |v| v[0]);
            let wrote = c.is_some_and(|c| lease.write_claimed(&c, [12; 6]));
            report(format!(
                "taker_pid={pid} am_owner_before={before} claimed={} gen={} torn={} value0={} wrote={wrote}",
                c.is_some(),
                c.map_or(0, |c| c.generation()),
                c.is_some_and(|c| c.payload_may_be_inconsistent()),
                value0,
            ));
        }
        Some(other) => panic!("unknown role {other}"),
        None => return false,
    }
    true
}

fn pid_reuse_parent(test: &str, fallback: bool) -> Option<String> {
    if !cxc_testkit::is_root() {
        println!("SKIPPED: needs root");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let mut ns = RoleCommand::new(test, "ns")
        .arg("path", &path)
        .env("CXC_IDENTITY_FALLBACK", if fallback { "1" } else { "0" })
        .spawn();
    let reports = ns.finish(Duration::from_secs(40));
    assert_eq!(reports.len(), 2, "{reports:?}");
    println!("nsinit: {}", reports[0]);
    let r = reports[1].clone();
    assert_eq!(num(&r, "taker_pid"), num(&r, "holder_pid"));
    assert!(
        !flag(&r, "am_owner_before"),
        "a new process with a reused pid was told it owns the dead holder's claim: {r}"
    );
    if fallback {
        // Here (fallback path, the namespace's /proc not mounted) no identity is known:
        // the dead holder cannot be proven dead, nor its threads stopped (its sentinel's
        // mark alone is not enough), so it is neither inherited nor taken over at once;
        // only its heartbeat can fail it over (docs/owner-lease.md).
        assert!(
            !flag(&r, "claimed"),
            "an unknown identity was taken over or inherited: {r}"
        );
        return Some(r);
    }
    assert!(flag(&r, "claimed"), "the taker could not claim: {r}");
    assert_eq!(
        num(&r, "gen"),
        num(&r, "holder_gen") + 1,
        "the taker inherited the dead holder's claim instead of taking it over: {r}"
    );
    assert!(flag(&r, "torn"), "the takeover lost the torn flag: {r}");
    assert_eq!(num(&r, "value0"), 5, "{r}");
    assert!(flag(&r, "wrote"), "{r}");
    assert_eq!(lease.status().payload_words, [12; 6]);
    Some(r)
}

#[test]
fn pid_reuse_in_pid_namespace_is_a_takeover() {
    if ns_role(T9) {
        return;
    }
    let _serial = serial();
    let t = Instant::now();
    if let Some(r) = pid_reuse_parent(T9, false) {
        println!("scenario 9: {r}; {:?}", t.elapsed());
    }
}

#[test]
fn pid_reuse_in_pid_namespace_fallback_identity() {
    if ns_role(T9B) {
        return;
    }
    let _serial = serial();
    let t = Instant::now();
    if let Some(r) = pid_reuse_parent(T9B, true) {
        println!("scenario 9b: {r}; {:?}", t.elapsed());
    }
}

// ---------------------------------------------------------------------------------------
// 6c. What the leak of 6b costs: seven stalls of one live process exhaust the buffers.
// ---------------------------------------------------------------------------------------

const T6C: &str = "repeated_stalls_across_checkpoints_keep_writes_working";
const STALLS: u64 = 7;

fn role_restall() {
    let lease = open(&path_arg("path"));
    let dir = path_arg("dir");
    let pid = me();
    for i in 0..STALLS {
        slow_wait(&dir.join(format!("go-{i}")), CHILD_PATIENCE);
        let r = lease.with_lease(pid, 5, |v| {
            report("inside");
            std::thread::sleep(Duration::from_millis(50));
            *v = [CHILD_TAG | i; 6];
        });
        report(format!("published={}", r.is_some()));
    }
    slow_wait(&dir.join("stop"), CHILD_PATIENCE);
}

#[test]
fn repeated_stalls_across_checkpoints_keep_writes_working() {
    match role().as_deref() {
        Some("restall") => return role_restall(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &clocked()).expect("create");
    let pid = me();
    let mut child = RoleCommand::new(T6C, "restall")
        .arg("path", &path)
        .arg("dir", dir.path())
        .spawn();
    let mut refused = Vec::new();
    for i in 0..STALLS {
        touch(&dir.path().join(format!("go-{i}")));
        assert_eq!(child.next_report(REPORT_WAIT), "inside", "stall {i}");
        stop_mid_write(&child, &lease);
        std::thread::sleep(Duration::from_millis(15));
        let claim = lease
            .acquire(pid, 5, Duration::from_secs(2))
            .expect("a stopped holder is replaced");
        // Cross a generation checkpoint (every 2^16 claims) while the writer is stopped.
        let target = (claim.generation() / 65_536 + 1) * 65_536 + 2;
        assert!(lease.release_claim(&claim));
        let claim = loop {
            let c = lease.try_claim(pid, BIG).expect("vacant");
            if c.generation() >= target {
                break c;
            }
            assert!(lease.release_claim(&c));
        };
        if !lease.write_claimed(&claim, [i + 1; 6]) {
            refused.push(i);
        }
        child.cont();
        let fin = child.next_report(REPORT_WAIT);
        assert!(!flag(&fin, "published"), "stall {i}: {fin}");
        assert!(lease.release_claim(&claim));
    }
    // The stalled process is alive and idle; its abandoned writes all failed.
    let claim = lease.try_claim(pid, BIG).expect("claim at the end");
    let wrote = lease.write_claimed(&claim, [100; 6]);
    let c = counters(&lease);
    println!(
        "scenario 6c: quarantined {} freed {} reaped {} no_buffer {}; writes refused in \
         stalls {refused:?}; final write ok={wrote}; {:?}",
        c[counter::QUARANTINED],
        c[counter::QUARANTINE_FREED],
        c[counter::QUARANTINE_REAPED],
        c[counter::NO_BUFFER],
        started.elapsed()
    );
    assert!(
        wrote && refused.is_empty(),
        "the holder's writes fail while the (idle, live) stale writer's process lives: \
         no_buffer {}",
        c[counter::NO_BUFFER]
    );
    assert_eq!(
        c[counter::QUARANTINE_FREED],
        STALLS,
        "stale writers freed their buffers"
    );
    assert!(lease.release_claim(&claim));
    touch(&dir.path().join("stop"));
    child.finish(REPORT_WAIT);
}

// ---------------------------------------------------------------------------------------
// 4c. A full table whose last slot belongs to a dead holder.
// ---------------------------------------------------------------------------------------

const T4C: &str = "dead_holder_in_full_table_is_replaced_by_a_newcomer";

#[test]
fn dead_holder_in_full_table_is_replaced_by_a_newcomer() {
    match role().as_deref() {
        Some("slot_user") => return role_slot_user(),
        Some("victim") => return role_victim(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let done = dir.path().join("done");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    // 63 live, idle slot owners, then a 64th process that dies inside `with_lease`.
    let mut users = slot_users(T4C, &path, &done, 63, |_| false);
    let mut victim = RoleCommand::new(T4C, "victim").arg("path", &path).spawn();
    assert_eq!(victim.next_report(REPORT_WAIT), "inside");
    let vpid = victim.pid();
    victim.kill();
    let t = Instant::now();
    let got = lease.acquire(pid, BIG, Duration::from_secs(1));
    let waited = t.elapsed();
    let owner = lease.current_owner();
    touch(&done);
    for u in &mut users {
        u.finish(REPORT_WAIT);
    }
    println!(
        "scenario 4c: newcomer acquire -> {:?} after {waited:?}; owner {owner:?} (dead victim \
         {vpid}); {:?}",
        got.map(|c| c.generation()),
        started.elapsed()
    );
    let claim = got.unwrap_or_else(|| {
        panic!(
            "a holder killed mid-write ({vpid}) was not replaced within 1 s by a process \
             without a slot; the lease still names it: owner {owner:?}"
        )
    });
    assert!(claim.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&claim), Some([42; 6]));
}

// ---------------------------------------------------------------------------------------
// 4d. `acquire` without a slot in a full table keeps its timeout.
// ---------------------------------------------------------------------------------------

const T4D: &str = "acquire_without_a_slot_waits_for_its_timeout";

#[test]
fn acquire_without_a_slot_waits_for_its_timeout() {
    match role().as_deref() {
        Some("slot_user") => return role_slot_user(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let done = dir.path().join("done");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut users = slot_users(T4D, &path, &done, 64, |_| false);
    assert_eq!(lease.current_owner(), None, "the lease is vacant");
    let timeout = Duration::from_millis(300);
    let t = Instant::now();
    let got = lease.acquire(pid, BIG, timeout);
    let waited = t.elapsed();
    let tried = lease.try_acquire(pid, BIG);
    touch(&done);
    for u in &mut users {
        u.finish(REPORT_WAIT);
    }
    println!("scenario 4d: acquire without a slot -> {got:?} after {waited:?}");
    assert!(got.is_none() && !tried, "no slot, yet a claim was granted");
    assert!(
        waited >= timeout,
        "acquire(.., {timeout:?}) gave up after {waited:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 7b. A claim token inherited across fork, written with after the claiming process died.
// ---------------------------------------------------------------------------------------

const T7B: &str = "token_inherited_across_fork_never_publishes_after_dead_takeover";

fn role_forkwriter() {
    let dir = path_arg("dir");
    let lease = open(&dir.join("lease"));
    let pid = me();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(5))
        .expect("forker claims");
    assert!(lease.write_claimed(&claim, [11; 6]));
    // SAFETY: the child only makes lease calls, reports, sleeps and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // The forked child writes with the claim token it inherited.
        report(format!("gc_pid={}", getpid()));
        let mut k = 0u64;
        loop {
            k += 1;
            if !lease.write_claimed(&claim, [CHILD_TAG | k; 6]) {
                report(format!("gc_failed={}", CHILD_TAG | k));
                break;
            }
        }
        std::thread::sleep(CHILD_PATIENCE);
        // SAFETY: `_exit` ends the forked child without running atexit handlers.
        unsafe { libc::_exit(0) }
    }
    assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
    std::thread::sleep(CHILD_PATIENCE);
}

/// A claim token copied into a forked child belongs to the parent: every token call of
/// the child (write, beat, release, read) is refused, so nothing it writes can be
/// published, also after the parent dies and its claim is taken over as dead.
#[test]
fn token_inherited_across_fork_never_publishes_after_dead_takeover() {
    match role().as_deref() {
        Some("forkwriter") => return role_forkwriter(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let pid = me();
    for attempt in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lease");
        let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
        let mut forker = RoleCommand::new(T7B, "forkwriter")
            .arg("dir", dir.path())
            .spawn();
        let _gc = num(&forker.next_report(REPORT_WAIT), "gc_pid");
        let failed = num(&forker.next_report(REPORT_WAIT), "gc_failed");
        assert_eq!(
            failed,
            CHILD_TAG | 1,
            "attempt {attempt}: the forked child's first write with the inherited token was accepted"
        );
        assert_eq!(lease.status().payload_words, [11; 6], "attempt {attempt}");
        // The claiming process dies: its claim is taken over as dead.
        forker.kill();
        let claim = lease
            .acquire(pid, BIG, Duration::from_secs(2))
            .expect("the dead forker's claim is taken over");
        assert_eq!(lease.read_claimed(&claim), Some([11; 6]));
        assert!(lease.write_claimed(&claim, [1; 6]));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            lease.read_claimed(&claim),
            Some([1; 6]),
            "attempt {attempt}"
        );
        assert!(lease.release_claim(&claim));
    }
}

// ---------------------------------------------------------------------------------------
// 10. A lower pid never preempts a live writer mid-write (but a stale one is superseded).
// ---------------------------------------------------------------------------------------

const T10: &str = "lower_pid_never_preempts_a_live_writer_mid_write";

fn role_slowcloser() {
    let lease = open(&path_arg("path"));
    let pid = me();
    let r = lease.with_lease(pid, BIG, |v| {
        report("inside");
        std::thread::sleep(Duration::from_millis(300));
        *v = [55; 6];
    });
    report(format!("published={}", r.is_some()));
    slow_wait(&path_arg("stop"), CHILD_PATIENCE);
}

#[test]
fn lower_pid_never_preempts_a_live_writer_mid_write() {
    match role().as_deref() {
        Some("slowcloser") => return role_slowcloser(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let stop = dir.path().join("stop");
    // Seed defaults: a lower pid preempts, manual epochs.
    let lease = OwnerLease::<P>::create(&path, [0; 6]).expect("create");
    // Claims for pid 1 (lower than any child's), made by this process.
    let low = 1;
    let grace = 10;
    let mut a = RoleCommand::new(T10, "slowcloser")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    assert_eq!(a.next_report(REPORT_WAIT), "inside");
    assert!(a.pid() > low);
    let until = Instant::now() + Duration::from_millis(150);
    let mut tries = 0;
    while Instant::now() < until {
        assert!(
            !lease.try_acquire(low, grace),
            "a lower pid preempted a live writer inside with_lease"
        );
        tries += 1;
        assert_eq!(lease.current_owner(), Some(a.pid()));
    }
    let r = a.next_report(REPORT_WAIT);
    assert!(
        flag(&r, "published"),
        "the live writer's with_lease failed: {r}"
    );
    assert_eq!(lease.status().payload_words, [55; 6]);
    // A stale writer (heartbeat older than the grace) is superseded, and never publishes.
    let mut b = RoleCommand::new(T10, "slowcloser")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    assert!(
        !lease.write_as_owner(low, [0; 6]),
        "a pid that does not hold the lease wrote"
    );
    assert_eq!(b.next_report(REPORT_WAIT), "inside");
    for _ in 0..=grace {
        lease.tick_epoch();
    }
    let claim = lease
        .try_claim(low, grace)
        .expect("a stale writer is superseded");
    assert!(claim.payload_may_be_inconsistent());
    assert!(lease.write_claimed(&claim, [56; 6]));
    let r = b.next_report(REPORT_WAIT);
    assert!(
        !flag(&r, "published"),
        "a superseded with_lease published: {r}"
    );
    assert_eq!(lease.read_claimed(&claim), Some([56; 6]));
    assert!(lease.release_claim(&claim));
    touch(&stop);
    a.finish(REPORT_WAIT);
    b.finish(REPORT_WAIT);
    println!(
        "scenario 10: {tries} preemption attempts refused during a live write; stale writer \
         superseded; {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 3b. The mirror of 3: the process whose pid the claim names dies, the claimer lives.
// ---------------------------------------------------------------------------------------

const T3B: &str = "claim_for_another_pid_survives_that_pids_death";

#[test]
fn claim_for_another_pid_survives_that_pids_death() {
    match role().as_deref() {
        Some("bystander") => return role_bystander(),
        Some("foreign") => return role_foreign(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let stop = dir.path().join("stop");
    let lease = OwnerLease::<P>::create_with(&path, [0; 6], &never()).expect("create");
    let pid = me();
    let mut b = RoleCommand::new(T3B, "bystander")
        .arg("stop", &stop)
        .spawn();
    assert_eq!(b.next_report(REPORT_WAIT), "ready");
    let bpid = b.pid();
    let mut a = RoleCommand::new(T3B, "foreign")
        .arg("path", &path)
        .arg("b", bpid.to_string())
        .spawn();
    a.next_report(REPORT_WAIT);
    assert_eq!(a.next_report(REPORT_WAIT), "inside");
    assert_eq!(lease.current_owner(), Some(bpid));
    // B (whose pid the claim names) dies; A (which made the claim and is writing) lives.
    b.kill();
    assert!(
        !lease.try_acquire(pid, BIG),
        "a live writer's claim was taken because the pid it names died"
    );
    assert!(
        lease
            .acquire(pid, BIG, Duration::from_millis(300))
            .is_none(),
        "a live writer's claim was taken because the pid it names died"
    );
    assert!(lease.status().writing);
    // Now A dies: taken over at once.
    a.kill();
    let t = Instant::now();
    let claim = lease
        .acquire(pid, BIG, Duration::from_secs(2))
        .expect("the dead claimer's claim is taken over");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(claim.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&claim), Some([7; 6]));
    assert!(lease.release_claim(&claim));
    println!(
        "scenario 3b: claim survived the named pid's death; taken {took:?} after the \
         claimer's; {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 11. A live process whose main thread exited, holding the lease mid-write.
// ---------------------------------------------------------------------------------------

const T11: &str = "holder_whose_main_thread_exited_is_alive";

fn main_thread_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

/// The pattern `pthread_exit(3)` recommends: the main thread exits while a worker thread
/// runs, here inside `with_lease`. `/proc/PID/stat` then says `Z`, but the process is
/// alive: it must not be taken over as dead, and its update must be published when the
/// closure ends.
#[test]
fn holder_whose_main_thread_exited_is_alive() {
    match role().as_deref() {
        Some("halfexit") => {
            let lease = open(&path_arg("path"));
            let pid = me();
            let worker = std::thread::spawn(move || {
                let r = lease.with_lease(pid, BIG, |v| {
                    report("inside");
                    std::thread::sleep(Duration::from_millis(1500));
                    *v = [77; 6];
                });
                report(format!("published={}", r.is_some()));
            });
            assert!(cxc_testkit::exit_main_thread());
            worker.join().expect("worker");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, [1; 6], &never()).expect("create");
    let mut kid = RoleCommand::new(T11, "halfexit").arg("path", &path).spawn();
    assert_eq!(kid.next_report(REPORT_WAIT), "inside");
    assert!(
        wait_until(Duration::from_secs(5), || main_thread_state(kid.pid())
            == Some('Z')),
        "the child's main thread did not exit"
    );
    let me = me();
    let t = Instant::now();
    assert!(
        lease.acquire(me, BIG, Duration::from_millis(400)).is_none(),
        "a live process whose main thread exited was taken over as dead"
    );
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(counters(&lease)[counter::CLAIM_DEAD], 0);
    assert_eq!(
        counters(&lease)[counter::CLAIM_EXITING],
        0,
        "its sentinel ended"
    );
    let fin = kid.next_report(REPORT_WAIT);
    assert!(flag(&fin, "published"), "{fin}");
    let c = lease
        .acquire(me, BIG, Duration::from_secs(5))
        .expect("released by the half-exited holder");
    assert!(!c.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&c), Some([77; 6]));
    assert!(lease.release_claim(&c));
    // Its worker returned: the process ends as after a `pthread_exit` of its last
    // thread, status 0, not kept alive by the library's threads.
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

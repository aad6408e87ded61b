#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack44: processes that disagree about time, or are frozen without a signal, with
//! real processes.
//!
//! Clock epochs (`EpochMode::Clock`, crates/cxc-sync/src/epoch.rs) are
//! `CLOCK_MONOTONIC / tick`, "system-wide, so every process agrees"; the election docs
//! say the mapped file assumes "one machine's `CLOCK_MONOTONIC`". A time namespace
//! (`unshare -T`, what CRIU restores and some container runtimes use) gives a process
//! its own `CLOCK_MONOTONIC` / `CLOCK_BOOTTIME` offsets on the same machine, and nothing
//! in the docs or the code mentions or detects time namespaces (the pid namespace is
//! detected and recorded; `/proc/self/ns/time` is not). The `stat` start time that the
//! fallback identity (no pidfs) compares is shifted by the *reader's* boottime offset.
//!
//! 1. **Lease, waiter ahead** (monotonic +1 h): takes over a live holder that beats
//!    every 2 ms at once, as stale (grace 200 ms).
//!    The same through `Elector<MmapElection>`: a standby 1 h ahead is elected at once
//!    while the leader renews every 5 ms (the leader's next `renew` fails).
//! 2. **Lease, holder ahead**, then frozen (cgroup v1 freezer): never replaced by a
//!    waiter of the host's clock ("a stopped or hung one ... after the grace").
//! 3. **Lease poisoned by a departed process ahead**: a process with monotonic +1 h claims
//!    and releases and exits; the next holder (no namespace) freezes and is never
//!    replaced: the heartbeat word (`fetch_max`) stays an hour in the future.
//! 4. **Heartbeat table, watchdog ahead**: reclaims every unit of a worker beating every
//!    2 ms at its first scan.
//! 5. **Heartbeat table, worker ahead**, then frozen: never reclaimed by a watchdog of
//!    the host's clock.
//! 6. **Semaphore, fallback identity, holder with a boottime offset**: `reclaim_dead()`
//!    in the host namespace judges the live holder dead (its start time reads shifted)
//!    and returns its permit: two holders of a 1-permit semaphore.
//! 7. **Freezer, no time namespace** (held): a holder frozen inside a `with_lease`
//!    closure is replaced after the grace, its closure's value never appears and its
//!    `with_lease` returns `None` when thawed; a frozen semaphore holder is never judged
//!    dead (`reclaim_dead` returns 0 for 1 s, a timed acquire times out) and its permit
//!    comes back when it releases after the thaw; a frozen heartbeat worker is reclaimed
//!    after the grace, and told when thawed.
//!
//! Each of 1-6 alternates control rounds (the same scenario without the namespace),
//! which held every time, with namespace rounds, which BROKE every time on the tree
//! before the fix (3 runs of the file, 5 of the election test). FIXED: clock epochs and
//! their deadlines use the machine's monotonic clock (this process's less its time
//! namespace's offset, read from `/proc/self/timens_offsets`), and `/proc` start times
//! are taken back to the machine's boot clock (less the reader's boottime offset), so
//! every process of the machine agrees; all six now hold. A watchdog 15 min
//! *behind* a beating worker reclaims nothing (the lag saturates at 0), which is the
//! other half of 5. 7 held in every run (the frozen process shows `D` in `/proc`, not
//! `T`; no signal is involved).
//!
//! Tests that need root (time namespaces, the freezer) print SKIPPED otherwise. Every
//! test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent sides
//! run one at a time (a file-wide lock).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionConfig, Elector, EpochMode, FailoverWatchdog, HeartbeatOptions, HeartbeatTable,
    LeaseOptions, MmapElection, OwnerLease, Preemption, SharedSemaphore,
};
use cxc_testkit::{
    Freezer, Proc, RoleCommand, arg, child_wait_for_path, find_program, num, path_arg, play_role,
    report, serial, skip_without_freezer, skip_without_unshare_timens, sleep_forever, wait_until,
};

const REPORT_WAIT: Duration = Duration::from_secs(20);
const PATIENCE: Duration = Duration::from_secs(30);
/// One epoch.
const TICK: Duration = Duration::from_millis(1);
/// The grace, in epochs of `TICK`: 200 ms.
const GRACE: u64 = 200;
/// The foreign namespace's clock offset: one hour.
const HOUR: i64 = 3600;

fn me() -> u32 {
    std::process::id()
}

/// Starts `cmd` as the first child of a new time namespace whose `CLOCK_MONOTONIC` is
/// `mono` s and `CLOCK_BOOTTIME` `boot` s ahead of the host's (`unshare -T --fork`, which
/// writes the offsets before the child is created; the child dies with it).
fn spawn_in_timens(cmd: RoleCommand, mono: i64, boot: i64, what: &str) -> Proc {
    let inner = cmd.into_command();
    let mut c = Command::new(find_program("CXC_UNSHARE", "unshare").expect("unshare"));
    c.args(["-T", "--fork", "--kill-child"])
        .arg(format!("--monotonic={mono}"))
        .arg(format!("--boottime={boot}"))
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    Proc::spawn(c, what)
}

/// Starts `cmd` in a time namespace with those offsets, or as is when both are 0 (the
/// control).
fn spawn_maybe_timens(cmd: RoleCommand, mono: i64, boot: i64, what: &str) -> Proc {
    if mono == 0 && boot == 0 {
        cmd.spawn()
    } else {
        spawn_in_timens(cmd, mono, boot, what)
    }
}

fn lease_opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock { tick: TICK },
        ..LeaseOptions::default()
    }
}

fn hb_opts() -> HeartbeatOptions {
    HeartbeatOptions {
        epoch: EpochMode::Clock { tick: TICK },
        ..HeartbeatOptions::default()
    }
}

// ---------------------------------------------------------------------------------------
// Roles.
// ---------------------------------------------------------------------------------------

/// Role: claims the lease; with `release=1` releases it and exits, else beats every 2 ms
/// until marker `stop` and reports whether a beat ever failed.
fn role_lease_holder() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
    let dir = path_arg("dir");
    let claim = loop {
        if let Some(c) = lease.try_claim(me(), GRACE) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    report(format!("claimed=1 gen={} pid={}", claim.generation(), me()));
    if arg("release") == "1" {
        let released = lease.release_claim(&claim);
        report(format!("released={}", u8::from(released)));
        return;
    }
    let mut lost = 0u8;
    while !dir.join("stop").exists() {
        if !lease.beat_claimed(&claim) {
            lost = 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // One more beat after the marker: a holder thawed just before it still looks once.
    if !lease.beat_claimed(&claim) {
        lost = 1;
    }
    report(format!("lost={lost}"));
}

/// Role: tries to claim the lease every 10 ms for 400 ms; reports whether it got it.
fn role_lease_contender() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
    let end = Instant::now() + Duration::from_millis(400);
    let mut got = None;
    while Instant::now() < end && got.is_none() {
        got = lease.try_claim(me(), GRACE);
        std::thread::sleep(Duration::from_millis(10));
    }
    match got {
        Some(c) => report(format!("got=1 gen={}", c.generation())),
        None => report("got=0 gen=0"),
    }
}

/// Role: `with_lease` whose closure writes 111, touches marker `inside` and stays until
/// marker `go`; reports whether the value was published.
fn role_lease_closure() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
    let dir = path_arg("dir");
    report(format!("pid={}", me()));
    let out = lease.with_lease(me(), GRACE, |v| {
        *v = 111;
        std::fs::write(dir.join("inside"), b"").unwrap();
        // Busy: the freezer catches it in user code, not in a sleep.
        while !dir.join("go").exists() {
            std::hint::spin_loop();
        }
        7u8
    });
    report(format!("published={}", u8::from(out.is_some())));
}

/// Role: joins the heartbeat table, marks units 0..4, beats every 2 ms until marker
/// `stop`; reports whether a beat or the final clear was refused.
fn role_hb_worker() {
    let table = HeartbeatTable::open(path_arg("path"), 4).unwrap();
    let dir = path_arg("dir");
    let reg = table.join().unwrap();
    for b in 0..4 {
        reg.mark_in_flight(b).unwrap();
    }
    report(format!("slot={} pid={}", reg.slot(), me()));
    let mut lost = 0u8;
    while !dir.join("stop").exists() {
        if reg.beat().is_err() {
            lost = 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // One more beat after the marker: a worker thawed just before it still looks once.
    if reg.beat().is_err() {
        lost = 1;
    }
    let cleared = (0..4).all(|b| table.clear_in_flight(reg.slot(), b));
    report(format!("lost={lost} cleared={}", u8::from(cleared)));
}

/// Role: a watchdog scanning every 5 ms for 400 ms; reports the bits it reclaimed.
fn role_hb_watchdog() {
    let table = HeartbeatTable::open(path_arg("path"), 4).unwrap();
    let wd = FailoverWatchdog::with_grace(&table, GRACE);
    let end = Instant::now() + Duration::from_millis(400);
    let mut got = 0u64;
    while Instant::now() < end {
        for (s, _) in wd.scan().dead_slots {
            got |= wd.reclaim(s);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    report(format!("reclaimed={got}"));
}

/// Role: takes the semaphore's permit and holds it until marker `release`.
fn role_sem_holder() {
    let sem = SharedSemaphore::open(path_arg("path")).unwrap();
    let dir = path_arg("dir");
    let permit = sem.try_acquire();
    report(format!("held={} pid={}", u8::from(permit.is_some()), me()));
    child_wait_for_path(&dir.join("release"), PATIENCE);
    drop(permit);
    report("released=1");
    sleep_forever();
}

/// Role: `reclaim_dead()` once, then `try_acquire`; reports both.
fn role_sem_reclaimer() {
    let sem = SharedSemaphore::open(path_arg("path")).unwrap();
    let n = sem.reclaim_dead();
    let got = sem.try_acquire();
    report(format!("reclaimed={n} got={}", u8::from(got.is_some())));
    if let Some(p) = got {
        p.disown();
    }
}

/// The election's lease duration.
const TERM: Duration = Duration::from_millis(500);

fn elector(path: &Path, id: &str) -> Elector<MmapElection> {
    let backend = MmapElection::create_or_open(path, TERM).expect("election");
    let cfg = ElectionConfig::new(id)
        .lease_duration(TERM)
        .retry_period(Duration::from_millis(20));
    Elector::new(backend, cfg).expect("elector")
}

/// Role: a standby that campaigns for 400 ms; reports whether it was elected.
fn role_standby() {
    let el = elector(&path_arg("path"), "standby");
    let t0 = Instant::now();
    match el.campaign(Duration::from_millis(400)).expect("campaign") {
        Some(l) => {
            let ms = t0.elapsed().as_millis();
            report(format!("elected=1 token={} after_ms={ms}", l.token()));
            std::mem::forget(l);
        }
        None => report("elected=0 token=0"),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Lease: a waiter whose CLOCK_MONOTONIC is ahead.
// ---------------------------------------------------------------------------------------

const T1: &str = "lease_waiter_ahead_in_time_never_takes_over_a_beating_holder";

/// Docs (owner-lease.md, L5/L6): stale means `now - heartbeat > grace`; "a stopped or
/// hung one (also mid-write) after the grace"; L6 "steal-freedom"; epoch.rs: clock
/// epochs are "system-wide, so every process agrees".
#[test]
fn lease_waiter_ahead_in_time_never_takes_over_a_beating_holder() {
    play_role!(role_lease_contender);
    if skip_without_unshare_timens(T1) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, offset) in [(0, 0i64), (1, HOUR), (2, 0), (3, HOUR)] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lease");
        let lease = OwnerLease::<u64>::create_with(&path, 0, &lease_opts()).unwrap();
        let claim = lease.try_claim(me(), GRACE).expect("vacant");
        let lost = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        let rep = std::thread::scope(|sc| {
            sc.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    if !lease.beat_claimed(&claim) {
                        lost.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let cmd = RoleCommand::new(T1, "lease_contender").arg("path", &path);
            let mut c = spawn_maybe_timens(cmd, offset, 0, "contender");
            let rep = c.next_report(REPORT_WAIT);
            c.finish(REPORT_WAIT);
            done.store(true, Ordering::Relaxed);
            rep
        });
        let got = num(&rep, "got") == 1;
        let lost = lost.load(Ordering::Relaxed);
        println!("round {round} offset {offset}s: contender got={got} holder lost={lost}");
        if got || lost {
            assert_ne!(offset, 0, "control round {round}: {rep}");
            broke.push(format!(
                "round {round}: contender {offset} s ahead took the lease ({rep}) while the \
                 holder beat every 2 ms; the holder's beat then failed: {lost}"
            ));
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

const T1E: &str = "standby_ahead_in_time_is_not_elected_while_the_leader_renews";

/// Docs (leader-election.md): the others "take over when the leader dies, hangs, or
/// stops making progress"; clock assumptions of the mapped file: "one machine's
/// `CLOCK_MONOTONIC`".
#[test]
fn standby_ahead_in_time_is_not_elected_while_the_leader_renews() {
    play_role!(role_standby);
    if skip_without_unshare_timens(T1E) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, offset) in [(0, 0i64), (1, HOUR), (2, 0), (3, HOUR)] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("election");
        let el = elector(&path, "leader");
        let l = el
            .campaign(Duration::from_secs(2))
            .unwrap()
            .expect("elected");
        let done = AtomicBool::new(false);
        let mut renew_failed = false;
        let rep = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let cmd = RoleCommand::new(T1E, "standby").arg("path", &path);
                let mut c = spawn_maybe_timens(cmd, offset, 0, "standby");
                let rep = c.next_report(REPORT_WAIT);
                c.finish(REPORT_WAIT);
                done.store(true, Ordering::Relaxed);
                rep
            });
            while !done.load(Ordering::Relaxed) {
                renew_failed |= l.renew().is_err();
                std::thread::sleep(Duration::from_millis(5));
            }
            h.join().unwrap()
        });
        renew_failed |= l.renew().is_err();
        let elected = num(&rep, "elected") == 1;
        println!(
            "round {round} offset {offset}s: leader token {}; standby {rep}; leader's renew failed: {renew_failed}",
            l.token()
        );
        if elected || renew_failed {
            assert_ne!(offset, 0, "control round {round}: {rep}");
            broke.push(format!(
                "round {round}: standby {offset} s ahead elected ({rep}) while leader {} renewed \
                 every 5 ms; its renew then failed: {renew_failed}",
                l.token()
            ));
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. and 3. Lease: a holder ahead, or a departed process ahead, and a frozen holder.
// ---------------------------------------------------------------------------------------

/// Runs a lease holder (optionally ahead) in a fresh file, freezes it, and returns how
/// long the parent's `acquire` took (`None`: not within 3 s). With `poison`, a process
/// `poison` s ahead first claims and releases the lease and exits.
fn frozen_holder_round(test: &str, holder_ahead: i64, poison: i64) -> Option<Duration> {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &lease_opts()).unwrap();
    if poison != 0 {
        let cmd = RoleCommand::new(test, "lease_holder")
            .arg("path", &path)
            .arg("dir", d.path())
            .arg("release", "1");
        let mut p = spawn_in_timens(cmd, poison, 0, "poisoner");
        let reps = [p.next_report(REPORT_WAIT), p.next_report(REPORT_WAIT)];
        p.finish(REPORT_WAIT);
        assert_eq!(num(&reps[1], "released"), 1, "{reps:?}");
    }
    let cmd = RoleCommand::new(test, "lease_holder")
        .arg("path", &path)
        .arg("dir", d.path())
        .arg("release", "0");
    let mut h = spawn_maybe_timens(cmd, holder_ahead, 0, "holder");
    let rep = h.next_report(REPORT_WAIT);
    let pid = num(&rep, "pid") as u32;
    std::thread::sleep(Duration::from_millis(50));
    let fr = Freezer::new("lease");
    fr.add(pid);
    fr.freeze();
    let t0 = Instant::now();
    let got = lease.acquire(me(), GRACE, Duration::from_secs(3));
    let took = t0.elapsed();
    if let Some(c) = &got {
        assert!(c.generation() > num(&rep, "gen"), "{rep}");
        assert!(lease.release_claim(c));
    }
    fr.thaw();
    std::fs::write(d.path().join("stop"), b"").unwrap();
    let end = h.next_report(REPORT_WAIT);
    drop(fr);
    println!("  holder {rep}; parent acquire {got:?} after {took:?}; holder then {end}");
    // A replaced holder is told (its beat fails); one never replaced is not.
    assert_eq!(num(&end, "lost") == 1, got.is_some(), "{end}");
    got.map(|_| took)
}

const T2: &str = "lease_holder_ahead_in_time_frozen_is_replaced_after_the_grace";

/// Docs (owner-lease.md): L5 "a stopped or hung one (also mid-write) after the grace";
/// Pitfalls: "A stopped (SIGSTOPped) holder, even mid-write, is replaced after the grace
/// with clock epochs".
#[test]
fn lease_holder_ahead_in_time_frozen_is_replaced_after_the_grace() {
    play_role!(role_lease_holder);
    if skip_without_unshare_timens(T2) || skip_without_freezer(T2) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, ahead) in [(0, 0i64), (1, HOUR), (2, 0), (3, HOUR)] {
        println!("round {round}: holder {ahead} s ahead");
        match frozen_holder_round(T2, ahead, 0) {
            Some(t) => assert!(t >= Duration::from_millis(150), "round {round}: {t:?}"),
            None => {
                assert_ne!(ahead, 0, "control round {round}: not replaced");
                broke.push(format!(
                    "round {round}: frozen holder {ahead} s ahead kept it"
                ));
            }
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

const T3: &str = "lease_once_held_by_a_process_ahead_still_replaces_a_frozen_holder";

/// As 2, but the process ahead is gone before the frozen holder (of the host's clock)
/// even claims: the heartbeat word it raised (`fetch_max`, "only moves forward") stays in
/// the future.
#[test]
fn lease_once_held_by_a_process_ahead_still_replaces_a_frozen_holder() {
    play_role!(role_lease_holder);
    if skip_without_unshare_timens(T3) || skip_without_freezer(T3) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for round in 0..3 {
        println!("round {round}: a process {HOUR} s ahead held the lease first");
        if frozen_holder_round(T3, 0, HOUR).is_none() {
            broke.push(format!("round {round}: frozen holder kept it"));
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

// ---------------------------------------------------------------------------------------
// 4. and 5. Heartbeat table + watchdog across time namespaces.
// ---------------------------------------------------------------------------------------

const T4: &str = "watchdog_ahead_in_time_never_reclaims_a_beating_worker";

/// Docs (failover-watchdog.md): a slot is dead if it "lags STRICTLY more than `grace`
/// epochs" or its process is dead; (heartbeat.md) the watchdog "finds workers that
/// stopped beating or died".
#[test]
fn watchdog_ahead_in_time_never_reclaims_a_beating_worker() {
    play_role!(role_hb_watchdog);
    if skip_without_unshare_timens(T4) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, offset) in [(0, 0i64), (1, HOUR), (2, -HOUR / 4), (3, 0)] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create_with(&path, 4, &hb_opts()).unwrap();
        let reg = table.join().unwrap();
        for b in 0..4 {
            reg.mark_in_flight(b).unwrap();
        }
        let lost = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        let rep = std::thread::scope(|sc| {
            sc.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    if reg.beat().is_err() {
                        lost.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let cmd = RoleCommand::new(T4, "hb_watchdog").arg("path", &path);
            let mut w = spawn_maybe_timens(cmd, offset, 0, "watchdog");
            let rep = w.next_report(REPORT_WAIT);
            w.finish(REPORT_WAIT);
            done.store(true, Ordering::Relaxed);
            rep
        });
        let bits = num(&rep, "reclaimed");
        let lost = lost.load(Ordering::Relaxed);
        println!("round {round} offset {offset}s: watchdog reclaimed={bits:#x} worker lost={lost}");
        if bits != 0 || lost {
            assert_ne!(offset, 0, "control round {round}: {rep}");
            broke.push(format!(
                "round {round}: watchdog {offset} s ahead reclaimed {bits:#x} of a worker \
                 beating every 2 ms (worker told: {lost})"
            ));
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

const T5: &str = "worker_ahead_in_time_frozen_is_reclaimed_after_the_grace";

/// Docs (heartbeat.md): the watchdog "finds workers that stopped beating or died and
/// reclaims their units"; (failover-watchdog.md) dead if it "lags STRICTLY more than
/// `grace` epochs". Also (7) without a namespace: a frozen worker is reclaimed after the
/// grace and told when thawed (H3).
#[test]
fn worker_ahead_in_time_frozen_is_reclaimed_after_the_grace() {
    play_role!(role_hb_worker);
    if skip_without_unshare_timens(T5) || skip_without_freezer(T5) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, ahead) in [(0, 0i64), (1, HOUR), (2, 0), (3, HOUR)] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create_with(&path, 4, &hb_opts()).unwrap();
        let cmd = RoleCommand::new(T5, "hb_worker")
            .arg("path", &path)
            .arg("dir", d.path());
        let mut w = spawn_maybe_timens(cmd, ahead, 0, "worker");
        let rep = w.next_report(REPORT_WAIT);
        std::thread::sleep(Duration::from_millis(50));
        let fr = Freezer::new("hb");
        fr.add(num(&rep, "pid") as u32);
        fr.freeze();
        let wd = FailoverWatchdog::with_grace(&table, GRACE);
        let t0 = Instant::now();
        let mut got = 0u64;
        while got == 0 && t0.elapsed() < Duration::from_secs(3) {
            for (s, _) in wd.scan().dead_slots {
                got |= wd.reclaim(s);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = t0.elapsed();
        fr.thaw();
        std::fs::write(d.path().join("stop"), b"").unwrap();
        let end = w.next_report(REPORT_WAIT);
        drop(fr);
        println!("round {round} ahead {ahead}s: reclaimed {got:#x} after {took:?}; worker {end}");
        if got == 0 {
            assert_ne!(
                ahead, 0,
                "control round {round}: frozen worker never reclaimed"
            );
            assert_eq!(num(&end, "lost"), 0, "{end}");
            broke.push(format!(
                "round {round}: frozen worker {ahead} s ahead not reclaimed in 3 s"
            ));
        } else {
            assert_eq!(got, 0xf, "round {round}");
            assert!(
                took >= Duration::from_millis(150),
                "round {round}: {took:?}"
            );
            // H3: the reclaimed worker is told, and its clears fail.
            assert_eq!(num(&end, "lost"), 1, "round {round}: {end}");
            assert_eq!(num(&end, "cleared"), 0, "round {round}: {end}");
        }
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

// ---------------------------------------------------------------------------------------
// 6. Semaphore, fallback identity, a holder with a CLOCK_BOOTTIME offset.
// ---------------------------------------------------------------------------------------

const T6: &str = "fallback_identity_semaphore_never_reclaims_a_live_holder_with_a_boottime_offset";

/// Docs (shared-semaphore.md, S4): dead means "its pid now names another process ...,
/// or its whole thread group has exited"; "an OS that cannot tell means alive (never
/// reclaim on a guess)"; on kernels without pidfs the identity is the pid plus its start
/// time (`CXC_IDENTITY_FALLBACK=1` forces that path).
#[test]
fn fallback_identity_semaphore_never_reclaims_a_live_holder_with_a_boottime_offset() {
    play_role!(role_sem_holder, role_sem_reclaimer);
    if skip_without_unshare_timens(T6) {
        return;
    }
    let _s = serial();
    let mut broke = Vec::new();
    for (round, boot) in [(0, 0i64), (1, HOUR), (2, 0), (3, HOUR)] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sem");
        drop(SharedSemaphore::create(&path, 1, 1).unwrap());
        let cmd = RoleCommand::new(T6, "sem_holder")
            .arg("path", &path)
            .arg("dir", d.path())
            .env("CXC_IDENTITY_FALLBACK", "1");
        let mut h = spawn_maybe_timens(cmd, 0, boot, "holder");
        let rep = h.next_report(REPORT_WAIT);
        assert_eq!(num(&rep, "held"), 1, "{rep}");
        let mut r = RoleCommand::new(T6, "sem_reclaimer")
            .arg("path", &path)
            .env("CXC_IDENTITY_FALLBACK", "1")
            .spawn();
        let out = r.next_report(REPORT_WAIT);
        r.finish(REPORT_WAIT);
        // The holder is alive and still thinks it holds the only permit.
        assert!(h.try_wait().is_none(), "the holder died");
        println!("round {round} boottime +{boot}s: holder {rep}; reclaimer {out}");
        if num(&out, "reclaimed") != 0 || num(&out, "got") != 0 {
            assert_ne!(boot, 0, "control round {round}: {out}");
            broke.push(format!(
                "round {round}: live holder (boottime +{boot} s) judged dead: {out}; two \
                 processes hold the 1-permit semaphore"
            ));
        }
        std::fs::write(d.path().join("release"), b"").unwrap();
        let _ = h.next_report(REPORT_WAIT);
    }
    assert!(broke.is_empty(), "{broke:#?}");
}

// ---------------------------------------------------------------------------------------
// 7. The freezer without time namespaces.
// ---------------------------------------------------------------------------------------

const T7A: &str = "holder_frozen_inside_with_lease_is_replaced_and_its_value_never_appears";

/// Docs (owner-lease.md): L5 "a stopped or hung one (also mid-write) after the grace";
/// L2 "a superseded holder's write, `with_lease` or beat fails"; L7 "no byte of an
/// abandoned write is ever published"; `with_lease` is "`None` if refused or the claim
/// was lost".
#[test]
fn holder_frozen_inside_with_lease_is_replaced_and_its_value_never_appears() {
    play_role!(role_lease_closure);
    if skip_without_freezer(T7A) {
        return;
    }
    let _s = serial();
    for round in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lease");
        let lease = OwnerLease::<u64>::create_with(&path, 5, &lease_opts()).unwrap();
        let mut h = RoleCommand::new(T7A, "lease_closure")
            .arg("path", &path)
            .arg("dir", d.path())
            .spawn();
        let pid = num(&h.next_report(REPORT_WAIT), "pid") as u32;
        assert!(wait_until(REPORT_WAIT, || d.path().join("inside").exists()));
        let fr = Freezer::new("closure");
        fr.add(pid);
        fr.freeze();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let t0 = Instant::now();
        let c = lease
            .acquire(me(), GRACE, Duration::from_secs(5))
            .expect("the frozen holder is replaced after the grace");
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(150),
            "round {round}: {took:?}"
        );
        assert_eq!(lease.read_claimed(&c), Some(5), "round {round}");
        assert!(lease.write_claimed(&c, 222), "round {round}");
        assert!(lease.release_claim(&c));
        fr.thaw();
        std::fs::write(d.path().join("go"), b"").unwrap();
        let out = h.next_report(REPORT_WAIT);
        h.finish(REPORT_WAIT);
        drop(fr);
        let c = lease.try_claim(me(), GRACE).expect("vacant");
        let v = lease.read_claimed(&c);
        assert!(lease.release_claim(&c));
        println!(
            "round {round}: replaced after {took:?} (frozen state {:?}); holder {out}; value {v:?}",
            state.split(") ").nth(1).and_then(|s| s.chars().next())
        );
        assert_eq!(num(&out, "published"), 0, "round {round}");
        assert_eq!(v, Some(222), "round {round}");
    }
}

const T7B: &str = "frozen_semaphore_holder_is_never_judged_dead";

/// Docs (shared-semaphore.md, S4): dead means the whole thread group is gone or the pid
/// names another process; "an OS that cannot tell means alive (never reclaim on a
/// guess)".
#[test]
fn frozen_semaphore_holder_is_never_judged_dead() {
    play_role!(role_sem_holder);
    if skip_without_freezer(T7B) {
        return;
    }
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 1, 1).unwrap();
    let mut h = RoleCommand::new(T7B, "sem_holder")
        .arg("path", &path)
        .arg("dir", d.path())
        .spawn();
    let rep = h.next_report(REPORT_WAIT);
    assert_eq!(num(&rep, "held"), 1, "{rep}");
    let fr = Freezer::new("sem");
    fr.add(num(&rep, "pid") as u32);
    fr.freeze();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        assert_eq!(sem.reclaim_dead(), 0, "a frozen holder was judged dead");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        sem.acquire_timeout(Duration::from_millis(300)).is_none(),
        "a timed acquire took the frozen holder's permit"
    );
    fr.thaw();
    std::fs::write(d.path().join("release"), b"").unwrap();
    assert_eq!(h.next_report(REPORT_WAIT), "released=1");
    drop(fr);
    let p = sem.acquire_timeout(Duration::from_secs(2));
    assert!(p.is_some(), "the released permit did not come back");
}

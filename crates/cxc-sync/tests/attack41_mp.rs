#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack41: the heartbeat table + failover watchdog (docs/heartbeat.md,
//! docs/failover-watchdog.md) and the mapped-file leader election
//! (docs/leader-election.md) against processes that change under the library's feet,
//! with real processes:
//!
//! 1. **A worker that execs.** A worker process registered through `join()` holds 16
//!    units (both bitmap halves) and beats from its main thread when another of its
//!    threads calls `execve` (a daemon re-executing itself). The new image has the same
//!    pid and identity: it must be able to act for the old registration through the
//!    table's slot calls (it is "this very process"), and when it then finishes (clears)
//!    its units while two watchdogs (one in another process) scan and reclaim the silent
//!    slot, every unit must be accounted for exactly once: cleared by the new image or
//!    reclaimed by one watchdog, never both, never lost (H2); a reclaimed worker is told
//!    (H3).
//! 2. **A leader that execs.** A leader whose work loop renews and appends to a
//!    `FencedFile` execs from another thread while a standby of another process is
//!    blocked in `campaign`. (a) The new image does not campaign at once: the standby must
//!    be elected (the old term is not renewed any more) with a larger token, and the new
//!    image's later campaign must fail while the standby leads. (b) The new image
//!    campaigns at once: at most one of it and the standby leads at any time, which the
//!    fenced log shows (no interleaving of accepted writes, tokens never going down,
//!    every later term's token larger).
//! 3. **A watchdog stopped mid-reclaim.** A watchdog process reclaims 40 stale slots one
//!    after the other and is SIGSTOPped somewhere in that loop; another watchdog
//!    reclaims the rest, new registrations take every slot and mark units, and then the
//!    stopped watchdog continues with its old report. It must take none of the new
//!    registrations' units, and each old unit must come back exactly once.
//!
//! All three held. Observed in 2(b): the new image's campaign returns at once with the
//! old image's token (the same claim: "Exec keeps the claims"), under a new identity
//! string; the test accepts a shared token only for that old-image/new-image pair.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).

mod procs;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::liveness::{self, Liveness};
use cxc_sync::{
    ElectionConfig, Elector, FailoverWatchdog, FencedFile, FencedResource, HeartbeatTable,
    MmapElection,
};
use cxc_testkit::{
    ARG_VAR_PREFIX, Proc, ROLE_VAR, Rng, RoleCommand, arg, child_wait_for_path, fields, num,
    path_arg, play_role, report, serial, sleep_forever, wait_until,
};

const REPORT_WAIT: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(60);

fn me() -> u32 {
    std::process::id()
}

/// Replaces this process's image by this test binary in `role` (running only `test`),
/// with the extra role arguments `args` (the current ones are inherited).
fn exec_role(test: &str, role: &str, args: &[(&str, String)]) -> ! {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role);
    for (k, v) in args {
        cmd.env(format!("{ARG_VAR_PREFIX}{}", k.to_ascii_uppercase()), v);
    }
    let err = cmd.exec();
    panic!("exec failed: {err}");
}

// ---------------------------------------------------------------------------------------
// 1. A heartbeat worker that execs with units in flight.
// ---------------------------------------------------------------------------------------

const HB_CAP: usize = 4;
/// The worker's units: 8 in the low half, 8 in the high half.
const UNITS: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39];

fn units_mask() -> u64 {
    UNITS.iter().fold(0, |m, &b| m | (1u64 << b))
}

/// Role: joins, marks every unit, reports its slot, and beats from the main thread until
/// a second thread (on marker `go`) execs this binary as `hb_reborn`.
fn role_hb_worker() {
    let table: &'static HeartbeatTable = Box::leak(Box::new(
        HeartbeatTable::open(path_arg("path"), HB_CAP).unwrap(),
    ));
    let reg = table.join().unwrap();
    for &b in &UNITS {
        reg.mark_in_flight(b).unwrap();
    }
    let slot = reg.slot();
    let dir = path_arg("dir");
    let test = arg("test");
    std::thread::spawn(move || {
        child_wait_for_path(&dir.join("go"), PATIENCE);
        exec_role(&test, "hb_reborn", &[("slot", slot.to_string())]);
    });
    report(format!("slot={slot} mask={} pid={}", units_mask(), me()));
    loop {
        // The main thread is inside the library when the exec ends it, as often as not.
        let _ = reg.beat();
        let _ = table.snapshot(slot);
    }
}

/// Role: the worker's new image. Acts for the old registration through the slot calls:
/// one beat (reported), then, on marker `go2`, clears every unit in a random order with
/// random pauses (finishing its work), and reports what it cleared.
fn role_hb_reborn() {
    let table = HeartbeatTable::open(path_arg("path"), HB_CAP).unwrap();
    let slot: usize = arg("slot").parse().unwrap();
    let dir = path_arg("dir");
    let mut rng = Rng::new(arg("seed").parse().unwrap());
    let adopt = table.beat(slot);
    report(format!("adopt={adopt} pid={}", me()));
    child_wait_for_path(&dir.join("go2"), PATIENCE);
    let mut order = UNITS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut cleared = 0u64;
    for b in order {
        std::thread::sleep(Duration::from_micros(rng.below(1500)));
        if table.clear_in_flight(slot, b) {
            cleared |= 1 << b;
        }
    }
    let beat_after = table.beat(slot);
    let unreg = beat_after && table.unregister(slot);
    let joined = table.join().map(|r| r.slot() as i64).unwrap_or(-1);
    report(format!(
        "cleared={cleared} beat_after={beat_after} unreg={unreg} joined={joined}"
    ));
}

/// Scans and reclaims until the marker `stop`; returns the bits reclaimed from `slot`.
fn watch_until_stop(table: &HeartbeatTable, grace: u64, slot: usize, stop: &Path) -> u64 {
    let wd = FailoverWatchdog::with_grace(table, grace).with_os_check_interval(Duration::ZERO);
    let mut got = 0u64;
    loop {
        for (s, _) in wd.scan().dead_slots {
            let bits = wd.reclaim(s);
            assert!(s == slot || bits == 0, "reclaimed {bits:#x} of slot {s}");
            assert_eq!(got & bits, 0, "a unit of slot {s} reclaimed twice");
            got |= bits;
        }
        if stop.exists() {
            return got;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Role: a watchdog in another process, from marker `go2` until marker `stop`.
fn role_hb_watch() {
    let table = HeartbeatTable::open(path_arg("path"), HB_CAP).unwrap();
    let dir = path_arg("dir");
    let slot: usize = arg("slot").parse().unwrap();
    let grace: u64 = arg("grace").parse().unwrap();
    report("ready");
    child_wait_for_path(&dir.join("go2"), PATIENCE);
    let got = watch_until_stop(&table, grace, slot, &dir.join("stop"));
    report(format!("reclaimed={got}"));
}

const HB_EXEC: &str = "heartbeat_worker_that_execs_is_still_itself_and_each_unit_is_accounted_once";

/// Docs (heartbeat.md, Protocol): "A handle that did not register a slot acts for it
/// only when the slot is a live registration whose recorded identity is this very
/// process's (same pid, pid namespace, boot, and pidfs inode or start time)";
/// (owner-lease.md) "Exec keeps the claims (the same process: same pid and identity)";
/// (failover-watchdog.md) "Each bit is returned by exactly one `reclaim` call"; Pitfalls:
/// "A `false` from `beat`/`mark_in_flight`/`clear_in_flight` means 'you were declared
/// dead'" and "`clear_in_flight` returning false after finishing a unit means the unit
/// may be done twice" (H2: none lost, none doubled; H3: a fenced worker is told).
#[test]
fn heartbeat_worker_that_execs_is_still_itself_and_each_unit_is_accounted_once() {
    play_role!(role_hb_worker, role_hb_reborn, role_hb_watch);
    let _s = serial();
    let mask = units_mask();
    let mut rng = Rng::for_test();
    let mut outcomes = Vec::new();
    for round in 0..5u64 {
        let grace = [1u64, 3, 6, 12, 24][round as usize];
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create(&path, HB_CAP).unwrap();
        let mut worker = RoleCommand::new(HB_EXEC, "hb_worker")
            .arg("path", &path)
            .arg("dir", d.path())
            .arg("test", HB_EXEC)
            .arg("seed", rng.next_u64().to_string())
            .spawn();
        let line = worker.next_report(REPORT_WAIT);
        let slot = num(&line, "slot") as usize;
        let pid = num(&line, "pid") as u32;
        assert_eq!(num(&line, "mask"), mask);
        // Let the worker beat a little, then exec from its second thread.
        std::thread::sleep(Duration::from_millis(rng.range(1, 20)));
        std::fs::write(d.path().join("go"), b"").unwrap();
        let line = worker.next_report(REPORT_WAIT);
        assert_eq!(num(&line, "pid") as u32, pid, "exec keeps the pid");
        let snap = table.snapshot(slot).unwrap();
        eprintln!("round {round}: after exec: {line}; slot {slot}: {snap:?}");
        assert_eq!(snap.pid, pid);
        assert!(!snap.fenced, "nobody fenced the slot yet");
        assert_eq!(snap.in_flight_bitmap, mask, "the exec lost or added units");
        assert_eq!(
            liveness::liveness(&snap.identity),
            Liveness::Alive,
            "the recorded identity of a process that exec'd must still be alive"
        );
        assert!(
            fields(&line)["adopt"] == "true",
            "round {round}: the worker's new image (same pid, same identity) could not act \
             for its own live registration: {line}"
        );

        // The race: the new image finishes its units while two watchdogs reclaim the
        // silent slot.
        let mut watcher = RoleCommand::new(HB_EXEC, "hb_watch")
            .arg("path", &path)
            .arg("dir", d.path())
            .arg("slot", slot.to_string())
            .arg("grace", grace.to_string())
            .spawn();
        assert_eq!(watcher.next_report(REPORT_WAIT), "ready");
        let stop = d.path().join("stop");
        let (mine, line) = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                // The parent's own watchdog.
                watch_until_stop(&table, grace, slot, &stop)
            });
            std::fs::write(d.path().join("go2"), b"").unwrap();
            let line = worker.next_report(REPORT_WAIT);
            let drained = wait_until(Duration::from_secs(30), || {
                table
                    .snapshot(slot)
                    .is_some_and(|s| s.in_flight_bitmap == 0 || s.pid != pid)
            });
            std::fs::write(&stop, b"").unwrap();
            assert!(drained, "round {round}: units stuck in slot {slot}");
            (h.join().unwrap(), line)
        });
        let theirs = num(&watcher.next_report(REPORT_WAIT), "reclaimed");
        let cleared = num(&line, "cleared");
        let beat_after = fields(&line)["beat_after"] == "true";
        eprintln!(
            "round {round} grace {grace}: cleared={cleared:#x} reclaimed here={mine:#x} \
             there={theirs:#x}; {line}"
        );
        assert_eq!(mine & theirs, 0, "round {round}: a unit reclaimed twice");
        assert_eq!(
            cleared & (mine | theirs),
            0,
            "round {round}: a unit both cleared by its worker and reclaimed"
        );
        assert_eq!(
            cleared | mine | theirs,
            mask,
            "round {round}: a unit neither cleared nor reclaimed (lost)"
        );
        if mine | theirs != 0 {
            assert!(
                !beat_after,
                "round {round}: a reclaimed worker was not told"
            );
        }
        if beat_after {
            assert!(
                fields(&line)["unreg"] == "true",
                "round {round}: a live adopted registration could not be unregistered"
            );
        }
        assert!(
            num(&line, "joined") < HB_CAP as u64,
            "the new image could not join"
        );
        assert!(
            worker
                .wait_timeout(REPORT_WAIT)
                .is_some_and(|s| s.success())
        );
        assert!(
            watcher
                .wait_timeout(REPORT_WAIT)
                .is_some_and(|s| s.success())
        );
        outcomes.push((cleared.count_ones(), (mine | theirs).count_ones()));
    }
    eprintln!("(cleared, reclaimed) per round: {outcomes:?}");
}

// ---------------------------------------------------------------------------------------
// 2. A leader that execs.
// ---------------------------------------------------------------------------------------

/// The lease: 1 s when the standby is to take over (`late`), 4 s when the new image is
/// to campaign first (`now`: its start must not outlast the old term).
fn lease() -> Duration {
    if arg("mode") == "late" {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(4)
    }
}

fn elector(path: &Path, name: &str) -> Elector<MmapElection> {
    let backend = MmapElection::create_or_open(path, lease()).unwrap();
    Elector::new(
        backend,
        ElectionConfig::new(name)
            .lease_duration(lease())
            .retry_period(Duration::from_millis(20)),
    )
    .unwrap()
}

fn log_line(who: &str, token: u64) -> Vec<u8> {
    format!("{who} {token}\n").into_bytes()
}

/// Role: leads as `old`, appends to the fenced file while renewing every 10 ms from the
/// main thread; on marker `go` a second thread execs this binary as `e_reborn`.
fn role_e_leader() {
    let dir = path_arg("dir");
    let e = elector(&path_arg("path"), "old");
    let store = FencedFile::open(path_arg("fenced")).unwrap();
    let l = e
        .campaign(Duration::from_secs(20))
        .unwrap()
        .expect("elected");
    let token = l.token();
    assert!(store.append(token, &log_line("old", token)).unwrap());
    let test = arg("test");
    std::thread::spawn(move || {
        child_wait_for_path(&dir.join("go"), PATIENCE);
        exec_role(&test, "e_reborn", &[("old_token", token.to_string())]);
    });
    report(format!("token={token} pid={}", me()));
    loop {
        if l.renew().is_err() {
            sleep_forever();
        }
        let _ = store.append(token, &log_line("old", token));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Role: the leader's new image, as candidate `new`. `mode=now`: campaigns at once (30 s),
/// leads for 40 renewals appending each time, steps down. `mode=late`: on marker `late`
/// campaigns for 1.5 s (the standby leads meanwhile).
fn role_e_reborn() {
    let dir = path_arg("dir");
    let e = elector(&path_arg("path"), "new");
    let store = FencedFile::open(path_arg("fenced")).unwrap();
    report(format!("up pid={}", me()));
    if arg("mode") == "late" {
        child_wait_for_path(&dir.join("late"), PATIENCE);
        match e.campaign(Duration::from_millis(1500)).unwrap() {
            None => report("late_token=none"),
            Some(l) => {
                let ok = store
                    .append(l.token(), &log_line("new", l.token()))
                    .unwrap();
                report(format!("late_token={} accepted={ok}", l.token()));
                let _ = l.step_down();
            }
        }
        return;
    }
    let l = e
        .campaign(Duration::from_secs(30))
        .unwrap()
        .expect("elected");
    let token = l.token();
    report(format!("token={token}"));
    let mut accepted = 0;
    let mut renewed = 0;
    for _ in 0..40 {
        if l.renew().is_ok() {
            renewed += 1;
        }
        if store.append(token, &log_line("new", token)).unwrap() {
            accepted += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stepped = l.step_down().is_ok();
    report(format!(
        "accepted={accepted} renewed={renewed} stepped={stepped}"
    ));
}

/// Role: a standby `standby`; once elected appends while renewing until marker `stop`.
fn role_e_standby() {
    let dir = path_arg("dir");
    let e = elector(&path_arg("path"), "standby");
    let store = FencedFile::open(path_arg("fenced")).unwrap();
    report("campaigning");
    let l = e
        .campaign(Duration::from_secs(40))
        .unwrap()
        .expect("elected");
    let token = l.token();
    let ok = store.append(token, &log_line("standby", token)).unwrap();
    report(format!("token={token} first_accepted={ok}"));
    let mut lost = false;
    while !dir.join("stop").exists() {
        if l.renew().is_err() {
            lost = true;
            break;
        }
        let _ = store.append(token, &log_line("standby", token));
        std::thread::sleep(Duration::from_millis(10));
    }
    report(format!("done lost={lost}"));
    let _ = l.step_down();
}

/// The accepted writes of the fenced file, in acceptance order: (writer, token).
fn fenced_log(path: &Path) -> Vec<(String, u64)> {
    let (_, data) = FencedFile::open(path).unwrap().read().unwrap();
    String::from_utf8(data)
        .unwrap()
        .lines()
        .map(|l| {
            let (w, t) = l.split_once(' ').unwrap();
            (w.to_owned(), t.parse().unwrap())
        })
        .collect()
}

/// Tokens never go down in acceptance order, and the writers come in runs (one writer's
/// term, then the next's): returns the runs (writer, token).
fn check_log(log: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut runs: Vec<(String, u64)> = Vec::new();
    for (i, (w, t)) in log.iter().enumerate() {
        if let Some((pw, pt)) = runs.last() {
            assert!(
                t >= pt,
                "entry {i}: token {t} of {w} accepted after {pt} of {pw}: {log:?}"
            );
            if pw == w && pt == t {
                continue;
            }
            assert!(
                !runs.iter().any(|(rw, rt)| rw == w && rt == t),
                "entry {i}: term ({w}, {t}) writes again after another writer: {runs:?}"
            );
        }
        runs.push((w.clone(), *t));
    }
    runs
}

const E_EXEC: &str = "leader_that_execs_never_shares_leadership_with_a_standby";

fn spawn_e(role: &str, d: &Path, mode: &str) -> Proc {
    RoleCommand::new(E_EXEC, role)
        .arg("path", d.join("election"))
        .arg("fenced", d.join("fenced"))
        .arg("dir", d)
        .arg("test", E_EXEC)
        .arg("mode", mode)
        .spawn()
}

/// Docs (leader-election.md): "Every term has a token, strictly greater for every later
/// term"; "a stopped or non-renewing one [is replaced] after the lease duration"; "at
/// most one leader's writes are accepted at any time, whatever the clocks do, because the
/// resource checks tokens"; (owner-lease.md, Pitfalls) "Exec keeps the claims (the same
/// process: same pid and identity). The exec ends the sentinel thread, so a waiter is
/// woken and finds the mark, but the process's threads are not in their exit: it waits
/// on."
#[test]
fn leader_that_execs_never_shares_leadership_with_a_standby() {
    play_role!(role_e_leader, role_e_reborn, role_e_standby);
    let _s = serial();
    for mode in ["late", "now", "late", "now"] {
        let d = tempfile::tempdir().unwrap();
        let mut leader = spawn_e("e_leader", d.path(), mode);
        let line = leader.next_report(REPORT_WAIT);
        let t_old = num(&line, "token");
        let mut standby = spawn_e("e_standby", d.path(), mode);
        assert_eq!(standby.next_report(REPORT_WAIT), "campaigning");
        // Let the standby block in its campaign, then exec the leader.
        std::thread::sleep(Duration::from_millis(150));
        std::fs::write(d.path().join("go"), b"").unwrap();
        let up = leader.next_report(REPORT_WAIT);
        assert!(up.starts_with("up "), "{up}");
        if mode == "late" {
            let line = standby.next_report(REPORT_WAIT);
            let t_sb = num(&line, "token");
            eprintln!("mode late: old term {t_old}, standby elected with {t_sb} ({line})");
            assert!(
                t_sb > t_old,
                "the standby's later term has token {t_sb} <= {t_old}"
            );
            assert!(fields(&line)["first_accepted"] == "true", "{line}");
            std::fs::write(d.path().join("late"), b"").unwrap();
            let late = leader.next_report(REPORT_WAIT);
            eprintln!("mode late: new image's campaign: {late}");
            assert_eq!(
                late, "late_token=none",
                "the exec'd leader's new image was elected while the standby led"
            );
        } else {
            let line = leader.next_report(REPORT_WAIT);
            let t_new = num(&line, "token");
            let done = leader.next_report(REPORT_WAIT);
            let line_sb = standby.next_report(REPORT_WAIT);
            let t_sb = num(&line_sb, "token");
            eprintln!("mode now: old term {t_old}, new image {t_new} ({done}), standby {t_sb}");
            assert!(t_new >= t_old, "the new image's token went down");
            assert!(
                t_sb > t_new,
                "the standby's later term has token {t_sb} <= {t_new}"
            );
            assert!(fields(&line_sb)["first_accepted"] == "true", "{line_sb}");
        }
        std::fs::write(d.path().join("stop"), b"").unwrap();
        let done = standby.next_report(REPORT_WAIT);
        assert_eq!(done, "done lost=false", "the standby lost its term");
        assert!(
            leader
                .wait_timeout(REPORT_WAIT)
                .is_some_and(|s| s.success())
        );
        assert!(
            standby
                .wait_timeout(REPORT_WAIT)
                .is_some_and(|s| s.success())
        );
        let log = fenced_log(&d.path().join("fenced"));
        let runs = check_log(&log);
        eprintln!("mode {mode}: runs {runs:?}");
        // Each writer's term comes after the previous one's, with a token never lower;
        // two different writers only share a token if they are the same process (the
        // exec'd image continuing the old image's claim).
        for w in runs.windows(2) {
            let ((a, ta), (b, tb)) = (&w[0], &w[1]);
            if ta == tb {
                assert!(
                    a == "old" && b == "new",
                    "{a} and {b} both wrote with token {ta}: {runs:?}"
                );
            }
        }
        assert_eq!(runs.last().unwrap().0, "standby");
    }
}

// ---------------------------------------------------------------------------------------
// 3. A watchdog SIGSTOPped mid-reclaim, continued after the slots changed hands.
// ---------------------------------------------------------------------------------------

const WD_CAP: usize = 40;
/// Pids that name no process (an unknown identity: staleness alone decides).
const FAKE_OLD: u32 = 3_900_000;
const FAKE_NEW: u32 = 3_950_000;

fn old_bits(slot: usize) -> u64 {
    (1u64 << (slot % 32)) | (1u64 << (32 + (slot * 7) % 32))
}
fn new_bits(slot: usize) -> u64 {
    (1u64 << ((slot + 5) % 32)) | (1u64 << (32 + (slot * 3 + 1) % 32))
}

/// Role: one scan (grace 1), then reclaims each reported slot, pausing about a
/// millisecond between reclaims, reporting each result; then reports `end`.
fn role_wd_slow() {
    let table = HeartbeatTable::open(path_arg("path"), WD_CAP).unwrap();
    let wd = FailoverWatchdog::with_grace(&table, 1);
    let report_ = wd.scan();
    report(format!("scanned n={}", report_.dead_slots.len()));
    for (s, snap) in &report_.dead_slots {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(800) {
            std::hint::spin_loop();
        }
        let bits = wd.reclaim(*s);
        report(format!("slot={s} gen={} bits={bits}", snap.generation));
    }
    report("end");
}

const WD_STOP: &str = "watchdog_stopped_mid_reclaim_takes_nothing_of_the_next_registrations";

/// Docs (failover-watchdog.md): "Each bit is returned by exactly one `reclaim` call";
/// "A slot unregistered or re-registered since the scan has another owner word or
/// generation, so it is never touched"; (heartbeat.md) "Generations only grow ... so a
/// watchdog acting on an old snapshot fails its CAS or its tag comparison".
#[test]
fn watchdog_stopped_mid_reclaim_takes_nothing_of_the_next_registrations() {
    play_role!(role_wd_slow);
    let _s = serial();
    let mut rng = Rng::for_test();
    for round in 0..4 {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create(&path, WD_CAP).unwrap();
        let mut old = BTreeMap::new();
        for i in 0..WD_CAP {
            let s = table.register(FAKE_OLD + i as u32).unwrap();
            for b in FailoverWatchdog::iter_in_flight_bits(old_bits(s)) {
                assert!(table.mark_in_flight(s, b));
            }
            old.insert(s, old_bits(s));
        }
        // Make every slot stale for a grace of 1.
        for _ in 0..3 {
            table.tick_global_epoch();
        }
        let mut slow = RoleCommand::new(WD_STOP, "wd_slow")
            .arg("path", &path)
            .spawn();
        let first = slow.next_report(REPORT_WAIT);
        assert_eq!(first, format!("scanned n={WD_CAP}"));
        // Stop it somewhere in its reclaim loop.
        let k = rng.range(0, 12);
        let mut got: BTreeMap<usize, u64> = BTreeMap::new();
        for _ in 0..k {
            let l = slow.next_report(REPORT_WAIT);
            got.insert(num(&l, "slot") as usize, num(&l, "bits"));
        }
        std::thread::sleep(Duration::from_micros(rng.below(1000)));
        slow.stop();
        slow.wait_state('T', REPORT_WAIT);
        // Another watchdog takes the rest; new registrations take every slot.
        let wd = FailoverWatchdog::with_grace(&table, 1);
        let mut mine: BTreeMap<usize, u64> = BTreeMap::new();
        let ok = wait_until(Duration::from_secs(20), || {
            for (s, _) in wd.scan().dead_slots {
                let bits = wd.reclaim(s);
                *mine.entry(s).or_default() |= bits;
            }
            (0..WD_CAP).all(|s| table.snapshot(s).is_some_and(|x| x.in_flight_bitmap == 0))
        });
        assert!(ok, "round {round}: old units never all reclaimed");
        let mut newer = BTreeMap::new();
        for i in 0..WD_CAP {
            let s = table.register(FAKE_NEW + i as u32).unwrap();
            for b in FailoverWatchdog::iter_in_flight_bits(new_bits(s)) {
                assert!(table.mark_in_flight(s, b));
            }
            assert!(table.beat(s));
            newer.insert(s, new_bits(s));
        }
        assert_eq!(newer.len(), WD_CAP, "every slot re-registered");
        slow.cont();
        let mut lines = Vec::new();
        loop {
            let l = slow.next_report(REPORT_WAIT);
            if l == "end" {
                break;
            }
            lines.push(l);
        }
        for l in &lines {
            let s = num(l, "slot") as usize;
            let prev = got.insert(s, num(l, "bits"));
            assert!(prev.is_none(), "slot {s} reported twice");
        }
        assert!(slow.wait_timeout(REPORT_WAIT).is_some_and(|s| s.success()));
        // Exactly once for the old units; nothing of the new registrations taken.
        for (&s, &bits) in &old {
            let a = got.get(&s).copied().unwrap_or(0);
            let b = mine.get(&s).copied().unwrap_or(0);
            assert_eq!(a & b, 0, "round {round}: slot {s}: unit reclaimed twice");
            assert_eq!(
                a | b,
                bits,
                "round {round}: slot {s}: stopped watchdog {a:#x}, other {b:#x}, \
                 expected {bits:#x} (a new registration's unit taken, or one lost)"
            );
        }
        for (&s, &bits) in &newer {
            let snap = table.snapshot(s).unwrap();
            assert!(
                !snap.fenced,
                "round {round}: slot {s}: new registration fenced"
            );
            assert_eq!(snap.in_flight_bitmap, bits, "round {round}: slot {s}");
            for b in FailoverWatchdog::iter_in_flight_bits(bits) {
                assert!(
                    table.clear_in_flight(s, b),
                    "round {round}: slot {s} bit {b}"
                );
            }
        }
        eprintln!(
            "round {round}: stopped after {k}+ reported reclaims; {} slots' units in the \
             reports read after it continued (reclaims done before the stop)",
            lines.iter().filter(|l| num(l, "bits") != 0).count()
        );
    }
}

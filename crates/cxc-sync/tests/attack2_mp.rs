//! Attacks on the documented promises of SharedRwLock, SharedCell and the mapped-file
//! election (docs/shared-rwlock.md, shared-cell.md, seqlock.md, leader-election.md) with
//! real processes: another process writing garbage into a live file, a reader whose main
//! thread exited, a write guard copied into a forked child, a forked child facing a full
//! holder table, and a leader whose main thread exited.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time.
#![cfg(not(cxc_loom))]

mod vandal;

use std::time::{Duration, Instant};

use cxc_sync::{ElectionConfig, Elector, MmapElection, RwLockOptions, SharedCell, SharedRwLock};
use vandal::{op, role_vandal, stall_detector, vandalize};

use cxc_testkit::{
    RoleCommand, arg, fields, flag, path_arg, play_role, report, serial, sleep_forever,
};

const HEADER_LEN: u64 = 128;
/// SharedRwLock: head block, then 64 bytes per holder slot (docs/shared-rwlock.md).
const RW_HEAD: u64 = 3456;
/// SharedCell's state block (docs/shared-cell.md).
const CELL_BLOCK: u64 = 9088;
/// Lease block size (docs/owner-lease.md).
const LEASE_BLOCK: u64 = 7552;
const REPORT_WAIT: Duration = Duration::from_secs(20);
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn me() -> u32 {
    std::process::id()
}

// ---------------------------------------------------------------------------------------
// Hostile bytes (as attack_mp.rs does for the lease, semaphore and heartbeat table): a
// vandal process overwrites random words of a live file while a victim process calls
// every operation. No operation may panic or hang.
// ---------------------------------------------------------------------------------------

const VANDAL_RW: &str = "rwlock_garbage_from_another_process_never_panics_or_hangs";
const RW_OPS: &[&str] = &[
    "try_read",
    "guard.get",
    "read_timeout(2ms)",
    "try_write",
    "wguard.write",
    "wguard.read/update",
    "wguard.beat/is_current",
    "wguard.unlock",
    "write_timeout(2ms)",
    "reclaim_dead",
    "current_token/stats/counters",
    "inspect",
];

/// Promise (shared-rwlock.md, memory-layout.md): nothing read from the file is trusted;
/// garbage gives errors or refusals, never a panic or a hang.
#[test]
fn rwlock_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let lock = SharedRwLock::<[u64; 4]>::open(&path).unwrap();
        stall_detector(RW_OPS, Duration::from_secs(5));
        report("VICTIM started");
        let mut i = 0u64;
        while !stop.exists() {
            i += 1;
            op(0);
            if let Some(g) = lock.try_read() {
                op(1);
                let _ = g.get();
            }
            op(2);
            if let Some(g) = lock.read_timeout(Duration::from_millis(2)) {
                let _ = g.get();
            }
            op(3);
            if let Some(g) = lock.try_write() {
                op(4);
                let _ = g.write([i; 4]);
                op(5);
                let _ = g.read();
                let _ = g.update(|v| v[0] = v[0].wrapping_add(1));
                op(6);
                let _ = (g.beat(), g.is_current(), g.token());
                op(7);
                let _ = g.unlock();
            }
            op(8);
            if let Some(g) = lock.write_timeout(Duration::from_millis(2)) {
                let _ = g.write([i; 4]);
                drop(g);
            }
            op(9);
            let _ = lock.reclaim_dead();
            op(10);
            let _ = (lock.current_token(), lock.stats(), lock.counters());
            op(11);
            let _ = SharedRwLock::inspect(&path);
        }
        report(format!("VICTIM ops={}", vandal::ops()));
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("rw");
    let opts = RwLockOptions::default()
        .holders(8)
        .grace(Duration::from_millis(20));
    drop(SharedRwLock::<[u64; 4]>::create_with(&path, [0; 4], &opts).unwrap());
    vandalize(
        VANDAL_RW,
        d.path(),
        &path,
        HEADER_LEN,
        HEADER_LEN + RW_HEAD + 64 * 8,
        Duration::from_secs(3),
    );
}

const VANDAL_CELL: &str = "cell_garbage_from_another_process_never_panics_or_hangs";
const CELL_OPS: &[&str] = &["load", "store", "update", "counters", "inspect"];

/// Promise (shared-cell.md): `load` never blocks; hostile bytes give no panic or hang.
#[test]
fn cell_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let mut cell = SharedCell::<[u64; 6]>::open(&path).unwrap();
        cell.set_stall_timeout(Duration::from_millis(5));
        stall_detector(CELL_OPS, Duration::from_secs(5));
        report("VICTIM started");
        let mut i = 0u64;
        while !stop.exists() {
            i += 1;
            op(0);
            let _ = cell.load();
            op(1);
            let _ = cell.store([i; 6]);
            op(2);
            let _ = cell.update(|v| v[0] = v[0].wrapping_add(1));
            op(3);
            let _ = cell.counters();
            op(4);
            let _ = SharedCell::inspect(&path);
        }
        report(format!("VICTIM ops={}", vandal::ops()));
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("cell");
    drop(SharedCell::<[u64; 6]>::create(&path, [0; 6]).unwrap());
    vandalize(
        VANDAL_CELL,
        d.path(),
        &path,
        HEADER_LEN,
        HEADER_LEN + CELL_BLOCK,
        Duration::from_secs(3),
    );
}

const VANDAL_ELECT: &str = "election_garbage_from_another_process_never_panics_or_hangs";
const ELECT_OPS: &[&str] = &[
    "observe",
    "campaign(2ms)",
    "renew",
    "is_current/is_lost",
    "wait_lost(1ms)",
    "step_down",
    "events",
];

/// Promise: typed errors, never a panic or hang, for an election file (a lease file with
/// a leader record: identity length and bytes come from the file) full of garbage.
#[test]
fn election_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let backend = MmapElection::create_or_open(&path, Duration::from_millis(20)).unwrap();
        let cfg = ElectionConfig::new("victim").lease_duration(Duration::from_millis(20));
        let elector = Elector::new(backend, cfg).unwrap();
        let events = elector.events();
        stall_detector(ELECT_OPS, Duration::from_secs(5));
        report("VICTIM started");
        while !stop.exists() {
            op(0);
            let _ = elector.observe();
            op(1);
            if let Ok(Some(l)) = elector.campaign(Duration::from_millis(2)) {
                op(2);
                let _ = l.renew();
                op(3);
                let _ = (l.is_current(), l.is_lost(), l.token());
                op(4);
                let _ = l.wait_lost(Duration::from_millis(1));
                op(5);
                let _ = l.step_down();
            }
            op(6);
            while events.try_recv().is_ok() {}
        }
        report(format!("VICTIM ops={}", vandal::ops()));
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("elect");
    drop(MmapElection::create_or_open(&path, Duration::from_millis(20)).unwrap());
    vandalize(
        VANDAL_ELECT,
        d.path(),
        &path,
        HEADER_LEN,
        HEADER_LEN + LEASE_BLOCK,
        Duration::from_secs(3),
    );
}

// ---------------------------------------------------------------------------------------
// Processes that are only partly alive, and forked children.
// ---------------------------------------------------------------------------------------

fn main_thread_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

const RW_HALF_EXIT: &str = "rwlock_reader_whose_main_thread_exited_still_excludes_writers";

/// A reader process whose main thread exited while another of its threads holds a read
/// lock is alive: "a process that dies holding the lock is reclaimed", not one that
/// lives. A writer (grace 10 s, so only a wrong proof of death lets it in) must not get
/// in while the read is held, on the pidfs and on the fallback identity path; once the
/// process is killed, it gets in at once.
#[test]
fn rwlock_reader_whose_main_thread_exited_still_excludes_writers() {
    fn role_reader() {
        let lock: &'static SharedRwLock<u64> = Box::leak(Box::new(
            SharedRwLock::<u64>::open(path_arg("path")).unwrap(),
        ));
        std::thread::spawn(move || {
            let _g = lock.read();
            report("HELD");
            sleep_forever();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(cxc_testkit::exit_main_thread());
        sleep_forever();
    }
    play_role!(role_reader);
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("rw");
        let opts = RwLockOptions::default().grace(Duration::from_secs(10));
        let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
        let mut cmd = RoleCommand::new(RW_HALF_EXIT, "reader").arg("path", &path);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        assert_eq!(kid.next_report(REPORT_WAIT), "HELD");
        assert!(
            cxc_testkit::wait_until(Duration::from_secs(5), || main_thread_state(kid.pid())
                == Some('Z')),
            "the main thread did not exit"
        );
        let got = lock.write_timeout(Duration::from_millis(600)).is_some();
        assert!(
            !got,
            "fallback={fallback}: a writer got in while a live reader (main thread exited) \
             held a read lock"
        );
        assert_eq!(lock.reclaim_dead(), 0, "fallback={fallback}");
        kid.kill();
        let t = Instant::now();
        let g = lock.write_timeout(Duration::from_secs(3));
        assert!(g.is_some(), "fallback={fallback}: the dead reader wedged");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}

const RW_GUARD_FORK: &str = "rwlock_write_guard_copied_by_fork_neither_writes_nor_unlocks";

/// A write guard copied into a child by `fork` (no exec): "Guards moved into a forked
/// child do nothing on drop there (the hold is the parent's)". The child (1) only drops
/// its copy, (2) writes through it, (3) unlocks it. In every case the parent must still
/// hold the write lock, nothing the child wrote may be published, and the parent's own
/// write and unlock must work (as the lease's guard, attack_mp.rs).
#[test]
fn rwlock_write_guard_copied_by_fork_neither_writes_nor_unlocks() {
    fn role_forker() {
        let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        let what = arg("what");
        let g = lock.try_write().expect("free");
        g.write(11).unwrap();
        // SAFETY: the child only makes lock calls, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let ok = match what.as_str() {
                "drop" => {
                    drop(g);
                    true
                }
                "write" => g.write(666).is_ok() | g.update(|v| *v = 667).is_ok(),
                _ => g.unlock().is_ok(),
            };
            report(format!("CHILD {what}={ok}"));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let cur = g.is_current();
        let read = g.read().ok();
        let seen_by_reader = lock.try_read().map(|r| r.get());
        report(format!(
            "PARENT current={cur} read={} other_reader_got_in={} wrote={} unlock={}",
            read.unwrap_or(0),
            seen_by_reader.is_some(),
            g.write(12).is_ok(),
            g.unlock().is_ok()
        ));
    }
    play_role!(role_forker);
    let _s = serial();
    let mut failures = Vec::new();
    for what in ["drop", "write", "unlock"] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("rw");
        let opts = RwLockOptions::default().grace(Duration::from_secs(10));
        let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
        let mut kid = RoleCommand::new(RW_GUARD_FORK, "forker")
            .arg("path", &path)
            .arg("what", what)
            .spawn();
        let reports = kid.finish(CHILD_DEADLINE);
        let child = reports.iter().find(|l| l.starts_with("CHILD")).unwrap();
        let parent = reports.iter().find(|l| l.starts_with("PARENT")).unwrap();
        let published = lock.try_read().map(|r| r.get());
        println!("{what}: {child} / {parent} / published after: {published:?}");
        let p = fields(parent);
        if p["current"] != "true"
            || p["read"] != "11"
            || p["wrote"] != "true"
            || p["unlock"] != "true"
            || published != Some(12)
        {
            failures.push(format!("{child} / {parent} / published {published:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "a forked child's copy of a write guard acted on the parent's hold: {failures:#?}"
    );
}

const RW_FORK_FULL: &str = "rwlock_forked_child_facing_a_full_table_never_reads_untracked";

/// "A forked child that finds the table full gets `None` from `try_*` and waits in
/// `read`/`write` ... There are no untracked readers." Table of 3 slots: the parent, a
/// filler and the forker. The forker's forked child tries to read; whatever it gets, the
/// parent's writer must not get in while the child holds a read lock (also after the
/// forker is killed and its slot reclaimed).
#[test]
fn rwlock_forked_child_facing_a_full_table_never_reads_untracked() {
    fn role_filler() {
        let _lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        report("FILLED");
        sleep_forever();
    }
    fn role_forker() {
        let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        drop(lock.try_read().expect("free"));
        // SAFETY: the child only makes lock calls, reports and parks.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let got = lock.try_read();
            report(format!("CHILD pid={} try={}", me(), got.is_some()));
            let g = got.or_else(|| lock.read_timeout(Duration::from_secs(5)));
            report(format!("CHILD held={}", g.is_some()));
            let _g = g;
            sleep_forever();
        }
        sleep_forever();
    }
    play_role!(role_filler, role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("rw");
    let opts = RwLockOptions::default()
        .holders(3)
        .grace(Duration::from_secs(10));
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut filler = RoleCommand::new(RW_FORK_FULL, "filler")
        .arg("path", &path)
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "FILLED");
    let mut forker = RoleCommand::new(RW_FORK_FULL, "forker")
        .arg("path", &path)
        .spawn();
    let first = forker.next_report(REPORT_WAIT);
    let child_pid: i32 = fields(&first)["pid"].parse().unwrap();
    let mut reports = vec![first.clone()];
    if flag(&first, "try") {
        // Tracked or not, it holds a read now: no writer may get in.
        assert!(
            lock.write_timeout(Duration::from_millis(300)).is_none(),
            "a writer got in while the forked child held a read lock: {reports:?}"
        );
    }
    // Free a slot: kill the forker (its child lives on, waiting in read_timeout).
    forker.kill();
    let held = loop {
        let r = forker.next_report(REPORT_WAIT);
        reports.push(r.clone());
        if r.starts_with("CHILD held=") {
            break flag(&r, "held");
        }
    };
    let got = lock.write_timeout(Duration::from_millis(500)).is_some();
    // SAFETY: kills the forked child the forker reported (no child of ours).
    unsafe { libc::kill(child_pid, libc::SIGKILL) };
    filler.kill();
    println!("{reports:?} writer_got_in={got}");
    assert!(
        !(held && got),
        "a writer got in while a forked child held a read lock: {reports:?}"
    );
    assert!(
        lock.write_timeout(Duration::from_secs(3)).is_some(),
        "the killed child's read hold wedged the lock: {reports:?}"
    );
}

const EL_HALF_EXIT: &str = "election_leader_whose_main_thread_exited_is_not_replaced";

/// A leader whose main thread exited while its worker thread renews is alive and making
/// progress: a standby must not lead ("A leader whose process dies is replaced at once";
/// this one did not die). Once it is killed, the standby leads at once.
#[test]
fn election_leader_whose_main_thread_exited_is_not_replaced() {
    fn role_leader() {
        let path = path_arg("path");
        std::thread::spawn(move || {
            let backend = MmapElection::create_or_open(&path, Duration::from_millis(300)).unwrap();
            let cfg = ElectionConfig::new("half").lease_duration(Duration::from_millis(300));
            let elector = Elector::new(backend, cfg).unwrap();
            let l = elector
                .campaign(Duration::from_secs(5))
                .unwrap()
                .expect("elected");
            report(format!("LEADING token={}", l.token()));
            loop {
                if l.renew().is_err() {
                    report("LOST");
                    sleep_forever();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(cxc_testkit::exit_main_thread());
        sleep_forever();
    }
    play_role!(role_leader);
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("e");
        let backend = MmapElection::create_or_open(&path, Duration::from_millis(300)).unwrap();
        let cfg = ElectionConfig::new("standby").lease_duration(Duration::from_millis(300));
        let standby = Elector::new(backend, cfg).unwrap();
        let mut cmd = RoleCommand::new(EL_HALF_EXIT, "leader").arg("path", &path);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        assert!(kid.next_report(REPORT_WAIT).starts_with("LEADING"));
        assert!(
            cxc_testkit::wait_until(Duration::from_secs(5), || main_thread_state(kid.pid())
                == Some('Z')),
            "the main thread did not exit"
        );
        let won = standby.campaign(Duration::from_millis(800)).unwrap();
        assert!(
            won.is_none(),
            "fallback={fallback}: a standby was elected while the leader (main thread \
             exited) renewed"
        );
        kid.kill();
        let t = Instant::now();
        let won = standby.campaign(Duration::from_secs(3)).unwrap();
        assert!(
            won.is_some(),
            "fallback={fallback}: the killed leader wedged"
        );
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
    }
}

const EL_FORK: &str = "election_leadership_copied_by_fork_is_not_current_in_the_child";

/// A forked child's copy of a `Leadership` is not the leader: `is_current` must say so
/// (as `renew` and `LeaseGuard::is_current` already do), and nothing the child does with
/// it may end the parent's term. (Found by the Python package's attack tests.)
#[test]
fn election_leadership_copied_by_fork_is_not_current_in_the_child() {
    fn role_leader() {
        let backend =
            MmapElection::create_or_open(path_arg("path"), Duration::from_secs(10)).unwrap();
        let cfg = ElectionConfig::new("forker")
            .lease_duration(Duration::from_secs(10))
            .renewal(cxc_sync::Renewal::Progress);
        let elector = Elector::new(backend, cfg).unwrap();
        let l = elector
            .campaign(Duration::from_secs(5))
            .unwrap()
            .expect("elected");
        // SAFETY: the child only makes election calls, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let current = l.is_current().unwrap_or(true);
            let renewed = l.renew().is_ok();
            report(format!("CHILD current={current} renewed={renewed}"));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!(
            "PARENT current={} renewed={}",
            l.is_current().unwrap_or(false),
            l.renew().is_ok()
        ));
    }
    play_role!(role_leader);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("e");
    drop(MmapElection::create_or_open(&path, Duration::from_secs(10)).unwrap());
    let mut kid = RoleCommand::new(EL_FORK, "leader")
        .arg("path", &path)
        .spawn();
    let reports = kid.finish(CHILD_DEADLINE);
    let child = fields(reports.iter().find(|l| l.starts_with("CHILD")).unwrap());
    let parent = fields(reports.iter().find(|l| l.starts_with("PARENT")).unwrap());
    assert_eq!(
        (child["current"], child["renewed"]),
        ("false", "false"),
        "a forked child's copy of the leadership acted as the leader"
    );
    assert_eq!(
        (parent["current"], parent["renewed"]),
        ("true", "true"),
        "the parent's term did not survive its child"
    );
}

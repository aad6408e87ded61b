//! Third round of attacks on documented promises, with real processes: the lease's death
//! watcher (docs/owner-lease.md, "After the first 1 ms sleep, a helper thread `poll`s the
//! holder's pidfd"), the semaphore's fast path (docs/shared-semaphore.md, "Fast path"),
//! and the failover watchdog's exactly-once reclaim (docs/failover-watchdog.md).
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock) so the timing-sensitive ones do not compete
//! for the CPU.
#![cfg(not(cxc_loom))]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cxc_sync::{LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, RoleCommand, arg, child_wait_for_path, num, path_arg, play_role, report, serial, sigkill,
    sleep_forever,
};

/// A grace no heartbeat exceeds (manual epochs that nobody ticks).
const BIG: u64 = 1 << 40;
/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// How long a child waits for the parent's go signal.
const CHILD_PATIENCE: Duration = Duration::from_secs(30);
/// Fake pids of the test process's own claims (above `PID_MAX_LIMIT`): higher than every
/// child's claim pid, so under lower-pid preemption they never preempt.
const WAITER_PID: u32 = 9_000_000;

fn arg_u64(key: &str) -> u64 {
    arg(key).parse().expect("numeric role argument")
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Spins until `cond` holds (at most 5 s).
fn spin_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: never happened"
        );
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// The number of this process's death-watcher threads.
fn watcher_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "cxc-lease-watch")
        .count()
}

/// This process's threads, but the lease's sentinel (one per process for its whole life,
/// started by its first registration; docs/owner-lease.md, "The sentinel").
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = t
                .as_ref()
                .ok()
                .and_then(|t| std::fs::read_to_string(t.path().join("comm")).ok());
            comm.as_deref().map(str::trim) != Some("cxc-sentinel")
        })
        .count()
}

fn lower_pid() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::LowerPid,
        ..LeaseOptions::default()
    }
}

fn never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

fn new_lease(dir: &Path, opts: &LeaseOptions) -> (PathBuf, OwnerLease<u64>) {
    let path = dir.join("lease");
    let lease = OwnerLease::create_with(&path, 0u64, opts).expect("create lease");
    (path, lease)
}

/// Child holder: claims for pid `first` (lower-pid preemption lets it take the lease from
/// a holder with a higher claim pid), reports, then for every `go.N` file that appears
/// (N = 1, 2, ...) claims again for `first - 200 N` and reports. A claim for another number is
/// still this process's claim (docs/owner-lease.md, "Identity"): the lease's holder
/// identity is this process throughout.
fn role_holder() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let first = arg_u64("first") as u32;
    let dir = path_arg("dir");
    let go0 = dir.join("go.0");
    child_wait_for_path(&go0, CHILD_PATIENCE);
    let c = lease.try_claim(first, BIG);
    report(format!("held={}", u8::from(c.is_some())));
    for n in 1.. {
        child_wait_for_path(&dir.join(format!("go.{n}")), CHILD_PATIENCE);
        let c = lease.try_claim(first - 200 * n, BIG);
        report(format!("held={}", u8::from(c.is_some())));
    }
}

fn holder(test: &str, path: &Path, dir: &Path, first: u32) -> Proc {
    RoleCommand::new(test, "holder")
        .arg("path", path)
        .arg("dir", dir)
        .arg("first", first.to_string())
        .spawn()
}

/// A blocked `acquire` on `lease` in a thread: sends `Instant` of its return and whether
/// it got the lease (then released).
fn blocked_waiter(
    lease: &'static OwnerLease<u64>,
    pid: u32,
    timeout: Duration,
) -> mpsc::Receiver<(Instant, bool)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let c = lease.acquire(pid, BIG, timeout);
        let at = Instant::now();
        let got = c.is_some();
        if let Some(c) = c {
            assert!(lease.release_claim(&c));
        }
        let _ = tx.send((at, got));
    });
    rx
}

// ---------------------------------------------------------------------------------------
// 1. The lease's death watcher
// ---------------------------------------------------------------------------------------

/// One round: child P holds, a thread A of this process blocks in `acquire` (its wait
/// covered by the handle's watcher of P). With `dance`, the holder then moves to child Q
/// (lower-pid preemption, which wakes nobody), a sibling thread B of the same handle makes
/// a short wait (which, as documented, moves the handle's one watcher to Q), and P takes
/// the lease back from Q (again lower pid). A is still blocked on P. P is SIGKILLed;
/// returns how long A took to get the lease, in ms.
fn watcher_round(test: &str, dance: bool) -> f64 {
    let d = tempfile::tempdir().unwrap();
    let (path, lease) = new_lease(d.path(), &lower_pid());
    let lease: &'static OwnerLease<u64> = Box::leak(Box::new(lease));
    let pdir = d.path().join("p");
    let qdir = d.path().join("q");
    std::fs::create_dir_all(&pdir).unwrap();
    std::fs::create_dir_all(&qdir).unwrap();
    let mut p = holder(test, &path, &pdir, 500);
    let mut q = holder(test, &path, &qdir, 400);
    touch(&pdir.join("go.0"));
    assert_eq!(num(&p.next_report(REPORT_WAIT), "held"), 1);
    let a = blocked_waiter(lease, WAITER_PID, Duration::from_secs(10));
    // A's first sleep (1 ms), then its watcher of P; a few 25 ms rounds.
    std::thread::sleep(Duration::from_millis(60));
    if dance {
        touch(&qdir.join("go.0"));
        assert_eq!(num(&q.next_report(REPORT_WAIT), "held"), 1);
        spin_until("Q holds", || lease.status().owner == Some(400));
        // B: a short wait on Q (more than the first 1 ms sleep, so it needs a watcher).
        assert!(
            lease
                .acquire(WAITER_PID + 1, BIG, Duration::from_millis(4))
                .is_none()
        );
        touch(&pdir.join("go.1"));
        assert_eq!(num(&p.next_report(REPORT_WAIT), "held"), 1);
        spin_until("P holds again", || lease.status().owner == Some(300));
    }
    std::thread::sleep(Duration::from_millis(60));
    assert!(a.try_recv().is_err(), "A returned while P held the lease");
    let killed = Instant::now();
    sigkill(p.pid());
    let (at, got) = a.recv_timeout(Duration::from_secs(10)).expect("A returns");
    assert!(got, "A took over from the killed holder");
    p.kill();
    q.kill();
    at.duration_since(killed).as_secs_f64() * 1e3
}

/// Promise: "the waiter sleeps 25 ms at a time and still takes over within a fraction of a
/// millisecond of the death" (SIGKILL of the holder while the waiter sleeps), the baseline:
/// one waiter, one holder, medians over rounds.
#[test]
fn lease_sigkill_takeover_of_a_sleeping_waiter_is_prompt() {
    play_role!(role_holder);
    let _s = serial();
    let test = "lease_sigkill_takeover_of_a_sleeping_waiter_is_prompt";
    let mut v: Vec<f64> = (0..15).map(|_| watcher_round(test, false)).collect();
    let m = median(&mut v);
    eprintln!("takeover ms (sorted): {v:.2?}");
    // Lenient against load: a fraction of a millisecond idle; 25 ms is the poll period.
    assert!(m < 3.0, "median takeover {m:.2} ms after SIGKILL: {v:.2?}");
}

/// Many threads of one process blocked on one handle while the holder changes: thread A
/// waits on P; the holder moves P → Q → P while A sleeps, and a sibling thread B's wait in
/// between moves the handle's one watcher to Q (as documented: "the handle stops it ...
/// to watch another process, at the start of a wait"). A's wait keeps believing it is
/// covered by a watcher of P (the same process holds again), but that watcher was
/// stopped: when P is SIGKILLed, A learns of it later than "within a fraction of a
/// millisecond of the death". Observed on the 2-core test machine: median 1.5–2.1 ms
/// against 0.5–0.7 ms without B's wait, and in some runs 2–3 of 15 rounds at 17–50 ms.
#[test]
fn lease_waiter_takes_over_promptly_after_a_sibling_moved_the_watcher() {
    play_role!(role_holder);
    let _s = serial();
    let test = "lease_waiter_takes_over_promptly_after_a_sibling_moved_the_watcher";
    let mut base: Vec<f64> = (0..9).map(|_| watcher_round(test, false)).collect();
    let mut v: Vec<f64> = (0..15).map(|_| watcher_round(test, true)).collect();
    let slow = v.iter().filter(|ms| **ms > 5.0).count();
    let b = median(&mut base);
    let m = median(&mut v);
    eprintln!("takeover ms (sorted): without the move {base:.2?}, with it {v:.2?}");
    // Lenient against load: relative to the same scenario without the sibling's wait,
    // measured in this run (about 0.6 ms on an idle machine).
    let limit = (1.5 * b).max(1.0);
    assert!(
        slow <= 1 && m <= limit,
        "once a sibling wait had moved the handle's watcher, the median takeover after \
         SIGKILL was {m:.2} ms (without that wait {b:.2} ms; limit {limit:.2} ms) and {slow} \
         of {} took more than 5 ms (the promise: a fraction of a millisecond): {v:.2?}",
        v.len()
    );
}

/// A holder that releases and re-claims (same process) while a waiter sleeps, then dies:
/// the release wakes the waiter, which finds the lease held again and sleeps on; the
/// holder's death must still wake it at once (its watcher watches the same process).
#[test]
fn lease_holder_that_released_and_reclaimed_then_died_is_taken_over_promptly() {
    fn role_flipper() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
        let dir = path_arg("dir");
        let me = std::process::id();
        let c = lease.try_claim(me, BIG).expect("vacant");
        report("held=1");
        child_wait_for_path(&dir.join("flip"), CHILD_PATIENCE);
        assert!(lease.release_claim(&c));
        // Straight back (the woken waiter needs tens of µs to run).
        let again = lease.try_claim(me, BIG).is_some();
        report(format!("again={}", u8::from(again)));
        sleep_forever();
    }
    play_role!(role_flipper);
    let _s = serial();
    let test = "lease_holder_that_released_and_reclaimed_then_died_is_taken_over_promptly";
    let mut v = Vec::new();
    let mut lost_race = 0;
    // Rounds until 8 are measured (the waiter may win the handoff: then there is
    // nothing to measure), at most 60.
    for _ in 0..60 {
        if v.len() >= 8 {
            break;
        }
        let d = tempfile::tempdir().unwrap();
        let (path, lease) = new_lease(d.path(), &never());
        let lease: &'static OwnerLease<u64> = Box::leak(Box::new(lease));
        let mut h = RoleCommand::new(test, "flipper")
            .arg("path", &path)
            .arg("dir", d.path())
            .spawn();
        assert_eq!(num(&h.next_report(REPORT_WAIT), "held"), 1);
        let a = blocked_waiter(lease, WAITER_PID, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(40));
        touch(&d.path().join("flip"));
        if num(&h.next_report(REPORT_WAIT), "again") == 0 {
            // The waiter won the handoff: nothing to measure this round.
            lost_race += 1;
            let _ = a.recv_timeout(Duration::from_secs(10));
            h.kill();
            continue;
        }
        std::thread::sleep(Duration::from_millis(40));
        if let Ok((_, got)) = a.try_recv() {
            // A took the lease between the release and the re-claim, and released it at
            // once (`blocked_waiter`), so the holder's re-claim found it vacant: A won the
            // handoff after all; nothing to measure this round.
            assert!(got, "A returned without the lease while the holder held it");
            lost_race += 1;
            h.kill();
            continue;
        }
        let killed = Instant::now();
        sigkill(h.pid());
        let (at, got) = a.recv_timeout(Duration::from_secs(10)).expect("A returns");
        assert!(got);
        h.kill();
        v.push(at.duration_since(killed).as_secs_f64() * 1e3);
    }
    assert!(
        v.len() >= 5,
        "the holder lost the re-claim race {lost_race} times, measured {}",
        v.len()
    );
    let m = median(&mut v);
    eprintln!("takeover ms (sorted): {v:.2?}");
    assert!(m < 3.0, "median takeover {m:.2} ms: {v:.2?}");
}

/// 50 handles of one process, each with a thread blocked on a live holder until a timeout:
/// at most one watcher per handle while they wait; afterwards the handles stay open and
/// their watchers end by themselves ("after 1 s in which no wait used it"; a poll period
/// of 1 s makes that up to about 2 s), the thread count comes back to where it was, and
/// dropping all 50 handles returns promptly.
#[test]
fn lease_fifty_waiting_handles_leave_no_threads_behind() {
    fn role_many() {
        let path = path_arg("path");
        let base = threads();
        let handles: Vec<OwnerLease<u64>> =
            (0..50).map(|_| OwnerLease::open(&path).unwrap()).collect();
        let peak = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for (i, h) in handles.iter().enumerate() {
                s.spawn(move || {
                    assert!(
                        h.acquire(WAITER_PID + i as u32, BIG, Duration::from_millis(300))
                            .is_none()
                    )
                });
            }
            std::thread::sleep(Duration::from_millis(200));
            peak.store(watcher_threads(), std::sync::atomic::Ordering::Relaxed);
        });
        let peak = peak.into_inner();
        let t = Instant::now();
        while watcher_threads() > 0 && t.elapsed() < Duration::from_millis(3500) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let gone_ms = t.elapsed().as_millis();
        let left = watcher_threads();
        let after = threads();
        let t = Instant::now();
        drop(handles);
        let drop_ms = t.elapsed().as_millis();
        report(format!(
            "base={base} peak={peak} left={left} gone_ms={gone_ms} after={after} \
             drop_ms={drop_ms} end={}",
            threads()
        ));
    }
    fn role_sitter() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
        let _c = lease.try_claim(std::process::id(), BIG).expect("vacant");
        report("held=1");
        sleep_forever();
    }
    play_role!(role_many, role_sitter);
    let _s = serial();
    let test = "lease_fifty_waiting_handles_leave_no_threads_behind";
    let d = tempfile::tempdir().unwrap();
    let (path, _lease) = new_lease(d.path(), &lower_pid());
    let mut h = RoleCommand::new(test, "sitter").arg("path", &path).spawn();
    assert_eq!(num(&h.next_report(REPORT_WAIT), "held"), 1);
    let mut m = RoleCommand::new(test, "many").arg("path", &path).spawn();
    let r = m.next_report(REPORT_WAIT);
    h.kill();
    eprintln!("{r}");
    assert!(num(&r, "peak") <= 50, "{r}");
    assert!(num(&r, "peak") >= 1, "no watcher ever ran: {r}");
    assert_eq!(num(&r, "left"), 0, "watchers outlived their use: {r}");
    assert!(num(&r, "after") <= num(&r, "base"), "{r}");
    assert!(num(&r, "drop_ms") < 500, "{r}");
}

/// Child holder that takes turns: acquire (blocking), hold 2 ms, release, pause 1 ms,
/// until `stop` appears.
fn role_turns() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let stop = path_arg("dir").join("stop");
    let me = std::process::id();
    report("ready=1");
    while !stop.exists() {
        if let Some(c) = lease.acquire(me, BIG, Duration::from_secs(1)) {
            std::thread::sleep(Duration::from_millis(2));
            assert!(lease.release_claim(&c));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `fork` while a watcher runs and while sibling threads start, move and use watchers of
/// the same handle (the holder changes between two processes every few ms). Promise (the
/// module docs of lease/watch.rs and docs/owner-lease.md, "Identity": correct after
/// `fork` without `exec`): the child neither hangs nor touches the parent's watcher; it
/// can wait on the lease itself and its handle drop returns. A child that does not exit
/// within 3 s is counted as hung.
#[test]
fn lease_fork_while_watchers_start_and_move_never_hangs_the_child() {
    fn role_forker() {
        let path = path_arg("path");
        let raw = Box::into_raw(Box::new(OwnerLease::<u64>::open(&path).unwrap()));
        // SAFETY: `raw` lives until the end of this function, after the threads are joined.
        let lease: &'static OwnerLease<u64> = unsafe { &*raw };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let stop: &'static std::sync::atomic::AtomicBool = Box::leak(Box::new(stop));
        let mut workers = Vec::new();
        for i in 0..3u32 {
            workers.push(std::thread::spawn(move || {
                let mut got = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(c) = lease.acquire(WAITER_PID + i, BIG, Duration::from_millis(3)) {
                        got += 1;
                        assert!(lease.release_claim(&c));
                    }
                }
                got
            }));
        }
        let mut hung = Vec::new();
        let mut child_failed = 0;
        let forks = 150;
        for k in 0..forks {
            if !hung.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_micros(300 + (k * 7919 % 2500)));
            // SAFETY: the child only calls the lease and `_exit`s; no unwinding out.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let r = lease.acquire(WAITER_PID + 100, BIG, Duration::from_millis(10));
                if let Some(c) = &r {
                    lease.release_claim(c);
                }
                // SAFETY: no other thread of the parent exists in the child.
                drop(unsafe { Box::from_raw(raw) });
                // SAFETY: `_exit` ends the child at once.
                unsafe { libc::_exit(0) };
            }
            let t = Instant::now();
            loop {
                let mut status = 0;
                // SAFETY: waitpid on our own child.
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if r == pid {
                    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                        child_failed += 1;
                    }
                    break;
                }
                if t.elapsed() > Duration::from_secs(2) {
                    let wchan =
                        std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
                    hung.push(format!("{pid}:{wchan}"));
                    if std::env::var_os("ATTACK3_GDB").is_some() {
                        let o = std::process::Command::new("gdb")
                            .args(["-p", &pid.to_string(), "-batch", "-ex", "bt"])
                            .output()
                            .unwrap();
                        std::fs::write(std::env::var_os("ATTACK3_GDB").unwrap(), &o.stdout)
                            .unwrap();
                    }
                    // SAFETY: our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let got: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        // SAFETY: every thread using it was joined.
        drop(unsafe { Box::from_raw(raw) });
        report(format!(
            "forks={forks} hung={} failed={child_failed} got={got} which={}",
            hung.len(),
            hung.join(",")
        ));
    }
    play_role!(role_forker, role_turns);
    let _s = serial();
    let test = "lease_fork_while_watchers_start_and_move_never_hangs_the_child";
    let d = tempfile::tempdir().unwrap();
    let (path, _lease) = new_lease(d.path(), &never());
    let mut turns: Vec<Proc> = (0..2)
        .map(|_| {
            RoleCommand::new(test, "turns")
                .arg("path", &path)
                .arg("dir", d.path())
                .spawn()
        })
        .collect();
    for t in &mut turns {
        assert_eq!(num(&t.next_report(REPORT_WAIT), "ready"), 1);
    }
    let mut f = RoleCommand::new(test, "forker").arg("path", &path).spawn();
    let r = f.next_report(Duration::from_secs(60));
    touch(&d.path().join("stop"));
    for t in &mut turns {
        t.kill();
    }
    eprintln!("{r}");
    assert_eq!(num(&r, "hung"), 0, "forked children hung: {r}");
    assert_eq!(num(&r, "failed"), 0, "forked children failed: {r}");
}

//! SharedSemaphore across real processes: crash recovery after SIGKILL, the permit cap
//! under contention, and kernel sleep of blocked acquirers.
//!
//! Each test re-executes this test binary in a role (`cxc_testkit`); the test function runs
//! the child's role when it has one.
#![cfg(not(cxc_loom))]

mod ctl;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cxc_sync::SharedSemaphore;
use cxc_testkit::{Proc, RoleCommand, arg, path_arg, report, role};

/// How long the parent waits for a child's report or exit.
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

/// Starts this binary running only `test` in role `role`, on semaphore file `sem` (and
/// counter file `aux`), with argument `n`.
fn spawn(test: &str, role: &str, sem: &Path, aux: Option<&Path>, n: u64) -> Proc {
    let cmd = RoleCommand::new(test, role)
        .arg("sem", sem)
        .arg("n", n.to_string());
    match aux {
        Some(aux) => cmd.arg("aux", aux),
        None => cmd,
    }
    .spawn()
}

/// Child side: role argument `n`.
fn n_arg() -> u64 {
    arg("n").parse().expect("numeric argument")
}

/// Waits (bounded) for the child's next report, which must start with `tag`; returns it.
fn wait_for_line(kid: &mut Proc, tag: &str) -> String {
    let line = kid.next_report(CHILD_DEADLINE);
    assert!(
        line.starts_with(tag),
        "expected a {tag} report, got {line:?}"
    );
    line
}

/// Child role: take `n` permits, keep them, announce, and wait to be killed.
fn hold_and_wait() {
    let sem = SharedSemaphore::open(path_arg("sem")).unwrap();
    for _ in 0..n_arg() {
        std::mem::forget(sem.acquire());
    }
    report("READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn killed_holder_unblocks_waiter() {
    if role().is_some() {
        return hold_and_wait();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let sem = SharedSemaphore::create(&path, 2, 2).unwrap();
    let mut child = spawn("killed_holder_unblocks_waiter", "hold", &path, None, 2);
    wait_for_line(&mut child, "READY");
    assert_eq!(sem.available(), 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t0 = Instant::now();
            let got = sem.acquire_timeout(Duration::from_secs(5)).is_some();
            (got, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        child.kill();
        let (got, waited) = waiter.join().unwrap();
        assert!(got, "blocked acquirer never got the dead child's permit");
        assert!(
            waited < Duration::from_secs(2),
            "took {waited:?} to reclaim a dead holder's permits"
        );
    });
    // The waiter's permit was dropped; the dead child's other permit was returned too.
    assert_eq!(sem.available(), 2);
    assert!(sem.stats().reclaimed_permits >= 2);
}

#[test]
fn reclaim_dead_returns_exactly_the_dead_childs_permits() {
    if role().is_some() {
        return hold_and_wait();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let sem = SharedSemaphore::create(&path, 6, 6).unwrap();
    let mine = sem.acquire();
    let k = 3;
    let mut child = spawn(
        "reclaim_dead_returns_exactly_the_dead_childs_permits",
        "hold",
        &path,
        None,
        k,
    );
    wait_for_line(&mut child, "READY");
    assert_eq!(sem.available(), 2);
    assert_eq!(sem.reclaim_dead(), 0, "reclaimed from a live process");
    child.kill();
    assert_eq!(sem.reclaim_dead(), k as u32);
    assert_eq!(sem.available(), 5);
    assert_eq!(sem.reclaim_dead(), 0, "reclaimed twice");
    // Only this process's slot is left, holding the parent's permit.
    let holders = sem.holders();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].pid, std::process::id());
    assert_eq!(holders[0].held, 1);
    drop(mine);
    assert_eq!(sem.available(), 6);
}

/// A timeout shorter than the 20 ms reclaim period (zero included) still returns a dead
/// holder's permits before giving up: `acquire_timeout` is never weaker than a
/// `reclaim_dead` + `try_acquire`. Before the fix, every timeout below 20 ms timed out
/// with the dead holder's permits still counted as held.
#[test]
fn short_timeouts_take_a_dead_holders_permit() {
    if role().is_some() {
        return hold_and_wait();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let sem = SharedSemaphore::create(&path, 4, 4).unwrap();
    for timeout_ms in [0u64, 1, 5, 15] {
        let mut child = spawn(
            "short_timeouts_take_a_dead_holders_permit",
            "hold",
            &path,
            None,
            4,
        );
        wait_for_line(&mut child, "READY");
        assert_eq!(sem.available(), 0);
        assert!(sem.try_acquire().is_none());
        child.kill();
        let p = sem.acquire_timeout(Duration::from_millis(timeout_ms));
        assert!(
            p.is_some(),
            "acquire_timeout({timeout_ms} ms) timed out with a dead holder's permits"
        );
        drop(p);
        assert_eq!(
            sem.available(),
            4,
            "the dead holder's other permits came back too"
        );
    }
}

/// Words of the control file (`ctl`): permits in use, their peak, cycles done.
const IN_USE: usize = 0;
const PEAK: usize = 1;
const CYCLES: usize = 2;

/// Child role: `CXC_ARG` acquire/release cycles, counting permits in use in the aux file.
fn cycle_worker() {
    let sem = SharedSemaphore::open(path_arg("sem")).unwrap();
    let aux = ctl::open(&path_arg("aux"));
    let c = aux.head();
    for i in 0..n_arg() {
        let _p = sem.acquire();
        let n = c[IN_USE].fetch_add(1, Ordering::SeqCst) + 1;
        c[PEAK].fetch_max(n, Ordering::SeqCst);
        for _ in 0..(i % 64) {
            std::hint::spin_loop();
        }
        if i % 256 == 0 {
            std::thread::yield_now();
        }
        c[IN_USE].fetch_sub(1, Ordering::SeqCst);
        c[CYCLES].fetch_add(1, Ordering::Relaxed);
    }
    report("DONE");
}

#[test]
fn four_processes_never_exceed_the_cap() {
    if role().is_some() {
        return cycle_worker();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let aux_path = dir.path().join("aux");
    let max = 2;
    let sem = SharedSemaphore::create(&path, max, max).unwrap();
    let aux = ctl::create(&aux_path);
    let cycles = 20_000;
    let mut kids: Vec<Proc> = (0..4)
        .map(|_| {
            spawn(
                "four_processes_never_exceed_the_cap",
                "cycle",
                &path,
                Some(&aux_path),
                cycles,
            )
        })
        .collect();
    for k in &mut kids {
        wait_for_line(k, "DONE");
        assert!(k.finish(CHILD_DEADLINE).is_empty());
    }
    let c = aux.head();
    assert_eq!(c[CYCLES].load(Ordering::SeqCst), 4 * cycles);
    let peak = c[PEAK].load(Ordering::SeqCst);
    assert!(
        peak <= u64::from(max),
        "{peak} permits in use at once, cap {max}"
    );
    assert_eq!(c[IN_USE].load(Ordering::SeqCst), 0);
    assert_eq!(sem.available(), max);
    assert_eq!(sem.holders().iter().map(|h| h.held).sum::<u32>(), 0);
}

/// Child role: loop acquire/release forever (until SIGKILLed).
fn churn_forever() {
    let sem = SharedSemaphore::open(path_arg("sem")).unwrap();
    report("READY");
    let mut i = 0u64;
    loop {
        let p = sem.acquire();
        i += 1;
        if i.is_multiple_of(3) {
            // Sometimes hold two.
            let q = sem.try_acquire();
            drop(q);
        }
        drop(p);
    }
}

/// Workers are SIGKILLed at arbitrary points of their acquire/release loops, again and
/// again; once all are dead and reclaimed, every permit is back.
#[test]
fn sigkill_storm_conserves_permits() {
    if role().is_some() {
        return churn_forever();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    // Four workers contend for two permits, so kills also land in blocked acquirers
    // and in their reclaim of dead holders.
    let max = 2;
    let sem = SharedSemaphore::create(&path, max, max).unwrap();
    let spawn_one = || spawn("sigkill_storm_conserves_permits", "churn", &path, None, 0);
    let mut kids: Vec<Proc> = (0..4).map(|_| spawn_one()).collect();
    for k in &mut kids {
        wait_for_line(k, "READY");
    }
    for round in 0..30u64 {
        std::thread::sleep(Duration::from_millis(5 + (round * 7) % 30));
        let victim = (round % 4) as usize;
        kids[victim].kill();
        kids[victim] = spawn_one();
        wait_for_line(&mut kids[victim], "READY");
        assert!(sem.available() <= max);
    }
    for k in &mut kids {
        k.kill();
    }
    sem.reclaim_dead();
    assert_eq!(
        sem.available(),
        max,
        "permits lost or duplicated by a crash"
    );
    // Only this process (registered at create) is left in the table.
    let holders = sem.holders();
    assert!(
        holders
            .iter()
            .all(|h| h.pid == std::process::id() && h.held == 0),
        "dead holders' slots not freed: {holders:?}"
    );
    // Every permit can be taken again, and no more.
    let ps: Vec<_> = (0..max).map(|_| sem.try_acquire().unwrap()).collect();
    assert!(sem.try_acquire().is_none());
    drop(ps);
}

use cxc_testkit::process_cpu;

/// Child role: block in `acquire` and report the CPU time it burned.
fn blocked_waiter() {
    let sem = SharedSemaphore::open(path_arg("sem")).unwrap();
    report("READY");
    let (cpu0, t0) = (process_cpu(), Instant::now());
    let p = sem.acquire();
    let (cpu, waited) = (process_cpu() - cpu0, t0.elapsed());
    drop(p);
    report(format!("RESULT {} {}", cpu.as_micros(), waited.as_micros()));
}

#[test]
fn blocked_acquirer_sleeps_in_the_kernel() {
    if role().is_some() {
        return blocked_waiter();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let sem = SharedSemaphore::create(&path, 1, 1).unwrap();
    let held = sem.acquire();
    let mut child = spawn(
        "blocked_acquirer_sleeps_in_the_kernel",
        "wait",
        &path,
        None,
        0,
    );
    wait_for_line(&mut child, "READY");
    // Wait until the child is actually blocked, then keep it blocked for a second.
    let t0 = Instant::now();
    while sem.stats().sleeps == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "child never blocked");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
    let line = wait_for_line(&mut child, "RESULT");
    assert!(child.finish(CHILD_DEADLINE).is_empty());
    let mut f = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse::<u64>().unwrap());
    let (cpu_us, waited_us) = (f.next().unwrap(), f.next().unwrap());
    assert!(waited_us >= 900_000, "child waited only {waited_us} µs");
    assert!(
        cpu_us < 50_000,
        "blocked acquirer burned {cpu_us} µs of CPU in {waited_us} µs"
    );
    eprintln!("blocked acquirer: {cpu_us} µs CPU over {waited_us} µs");
    assert_eq!(sem.available(), 1);
}

/// Child role: find the one-slot table taken by the live parent: refused at open.
fn table_full_worker() {
    let line = match SharedSemaphore::open(path_arg("sem")) {
        Err(cxc_sync::SemaphoreError::TableFull { capacity }) => format!("RESULT full {capacity}"),
        Err(e) => format!("RESULT error {e}"),
        Ok(_) => "RESULT opened".to_string(),
    };
    report(line);
}

#[test]
fn full_holder_table_is_refused_at_open() {
    if role().is_some() {
        return table_full_worker();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let opts = cxc_sync::SemaphoreOptions::default().holders(1);
    let sem = SharedSemaphore::create_with(&path, 1, 1, &opts).unwrap();
    sem.register().unwrap();
    let mut kid = spawn(
        "full_holder_table_is_refused_at_open",
        "full",
        &path,
        None,
        0,
    );
    let line = wait_for_line(&mut kid, "RESULT");
    assert!(kid.finish(CHILD_DEADLINE).is_empty());
    assert_eq!(line, "RESULT full 1");
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.holders().len(), 1);
    assert_eq!(sem.stats().table_full, 1);
}

//! SharedSemaphore and process identity, across real processes:
//!
//! - a release by a process that holds no permit (and has none handed to it) returns
//!   false and changes nothing (max_permits 1, three processes);
//! - a holder whose main thread exited while a worker thread holds its permit is alive:
//!   it is not reclaimed and max_permits is never exceeded (5 runs);
//! - a full holder table is a clear error at open, and a dead holder's slot is reclaimed
//!   for the next process;
//! - a reused pid does not inherit the dead holder's permits (pid reuse forced in a fresh
//!   pid namespace; needs root, else "SKIPPED: needs root"), on the pidfs and the fallback
//!   path. (On the fallback path a pid reused within one start-time tick would look like
//!   the same process: the scenario waits past that window, see the identity docs.)
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::liveness::{ProcStatus, proc_status};
use cxc_sync::{SemaphoreError, SemaphoreOptions, SharedSemaphore};
use procs::*;

fn sem_path() -> std::path::PathBuf {
    dir().join("sem")
}

/// Runs the parent side of a test in a fresh directory.
fn run_kids(body: impl FnOnce(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    body(tmp.path());
}

// ---------------------------------------------------------------------------------------

/// The test's semaphore, opened, with one permit taken and kept (never released by a
/// guard: the process holds it until it dies or releases it by hand).
fn open_holding() -> SharedSemaphore {
    let sem = SharedSemaphore::open(sem_path()).unwrap();
    std::mem::forget(sem.acquire());
    sem
}

const NON_HOLDER: &str = "release_by_a_non_holder_returns_false_and_changes_nothing";

#[test]
fn release_by_a_non_holder_returns_false_and_changes_nothing() {
    match role().as_deref() {
        Some("holder") => {
            let sem = open_holding();
            report("HELD");
            // Release when told to (the file `go` appears).
            while !dir().join("go").exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            let ok = sem.release();
            report(format!("RELEASED {ok} {}", sem.available()));
            park();
        }
        Some("stranger") => {
            let sem = SharedSemaphore::open(sem_path()).unwrap();
            let before = sem.available();
            let ok = sem.release();
            let again = sem.release();
            report(format!("RESULT {ok} {again} {before} {}", sem.available()));
            park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => run_kids(|d| {
            let sem = SharedSemaphore::create(d.join("sem"), 1, 1).unwrap();
            let mut holder = spawn(NON_HOLDER, "holder", d, &[]);
            wait_line(&mut holder, "HELD");
            assert_eq!(sem.available(), 0);
            let mut stranger = spawn(NON_HOLDER, "stranger", d, &[]);
            let line = wait_line(&mut stranger, "RESULT");
            assert_eq!(
                line, "RESULT false false 0 0",
                "a process holding no permit released one"
            );
            // Nor can this process (registered at create, holding nothing).
            assert!(!sem.release());
            assert_eq!(sem.available(), 0);
            let held: Vec<(u32, u32)> = sem.holders().iter().map(|h| (h.pid, h.held)).collect();
            assert!(
                held.contains(&(holder.pid(), 1)),
                "the holder's permit is still its own: {held:?}"
            );
            assert!(sem.try_acquire().is_none(), "max_permits 1 exceeded");
            assert!(sem.stats().not_held_rejected >= 3);
            std::fs::write(d.join("go"), b"").unwrap();
            let line = wait_line(&mut holder, "RELEASED");
            assert_eq!(line, "RELEASED true 1");
            holder.kill();
            stranger.kill();
            assert_eq!(sem.available(), 1);
        }),
    }
}

// ---------------------------------------------------------------------------------------

const MAIN_EXIT: &str = "holder_whose_main_thread_exited_is_not_reclaimed";

#[test]
fn holder_whose_main_thread_exited_is_not_reclaimed() {
    match role().as_deref() {
        Some("main_exits") => {
            let _sem = open_holding(); // kept mapped while parked
            assert!(cxc_testkit::exit_main_thread());
            // This (worker) thread keeps the permit and lives on.
            report("HOLDING");
            park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => run_kids(|d| {
            let sem = SharedSemaphore::create(d.join("sem"), 1, 1).unwrap();
            for run in 0..5 {
                let mut kid = spawn(MAIN_EXIT, "main_exits", d, &[]);
                wait_line(&mut kid, "HOLDING");
                let t0 = Instant::now();
                while proc_status(kid.pid()) != ProcStatus::Zombie {
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "main thread never exited"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                // /proc says Z; the process lives in its worker thread.
                for _ in 0..3 {
                    assert_eq!(
                        sem.reclaim_dead(),
                        0,
                        "run {run}: a live holder was reclaimed"
                    );
                    assert!(
                        sem.acquire_timeout(Duration::from_millis(30)).is_none(),
                        "run {run}: max_permits 1 exceeded"
                    );
                }
                assert_eq!(sem.available(), 0);
                // Once the whole process is gone, its permit comes back.
                kid.kill();
                assert_eq!(sem.reclaim_dead(), 1, "run {run}: the dead holder's permit");
                assert_eq!(sem.available(), 1);
            }
        }),
    }
}

// ---------------------------------------------------------------------------------------

const FULL: &str = "full_table_is_an_error_at_open_and_dead_slots_are_reused";

#[test]
fn full_table_is_an_error_at_open_and_dead_slots_are_reused() {
    match role().as_deref() {
        Some("opener") => {
            let line = match SharedSemaphore::open(sem_path()) {
                Ok(sem) => {
                    let p = sem.try_acquire();
                    let took = p.is_some();
                    std::mem::forget(p);
                    format!("OPENED {took}")
                }
                Err(SemaphoreError::TableFull { capacity }) => format!("FULL {capacity}"),
                Err(e) => format!("ERROR {e}"),
            };
            report(line);
            park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => run_kids(|d| {
            let opts = SemaphoreOptions::default().holders(2);
            let sem = SharedSemaphore::create_with(d.join("sem"), 2, 2, &opts).unwrap();
            let mut a = spawn(FULL, "opener", d, &[]);
            assert_eq!(wait_line(&mut a, "OPENED"), "OPENED true");
            let mut b = spawn(FULL, "opener", d, &[]);
            assert_eq!(
                wait_line(&mut b, "FULL"),
                "FULL 2",
                "a third process must be refused, not run untracked"
            );
            assert_eq!(sem.available(), 1, "the refused process took a permit");
            a.kill();
            // A's slot (and permit) go to the next process.
            let mut c = spawn(FULL, "opener", d, &[]);
            assert_eq!(wait_line(&mut c, "OPENED"), "OPENED true");
            assert_eq!(sem.available(), 1);
            let err = SemaphoreError::TableFull { capacity: 2 }.to_string();
            assert!(err.contains("holder table full"), "{err}");
            b.kill();
            c.kill();
        }),
    }
}

// ---------------------------------------------------------------------------------------

#[test]
fn reused_pid_does_not_inherit_permits() {
    reuse("reused_pid_does_not_inherit_permits", false);
}

#[test]
fn reused_pid_does_not_inherit_permits_fallback() {
    reuse("reused_pid_does_not_inherit_permits_fallback", true);
}

fn reuse(test: &str, fallback: bool) {
    match role().as_deref() {
        Some("nsroot") => nsroot(test),
        Some("scenario") => reuse_scenario(test, fallback),
        Some("worker") => {
            let sem = open_holding();
            std::mem::forget(sem.acquire());
            report("HELD");
            park();
        }
        Some("impostor") => {
            let sem = SharedSemaphore::open(sem_path()).unwrap();
            let released = sem.release();
            let me = std::process::id();
            // Its own slot and the dead holder's: the dead one's was not taken over.
            let slots = sem.holders().iter().filter(|h| h.pid == me).count();
            report(format!("RESULT {released} {slots}"));
            park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => run_reuse_test(test, fallback),
    }
}

fn reuse_scenario(test: &str, fallback: bool) {
    mount_own_proc();
    assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
    let sem = SharedSemaphore::create(sem_path(), 2, 2).unwrap();
    let mut worker = spawn(test, "worker", &dir(), &[]);
    wait_line(&mut worker, "HELD");
    let wpid = worker.pid();
    assert_eq!(sem.available(), 0);
    worker.kill();
    // Past the fallback path's same-tick window.
    std::thread::sleep(Duration::from_millis(30));
    let mut imp = spawn_with_pid(wpid, test, "impostor", &[]);
    let line = wait_line(&mut imp, "RESULT");
    assert_eq!(
        line, "RESULT false 2",
        "a process with a dead holder's pid inherited its permits or slot"
    );
    assert_eq!(sem.available(), 0);
    // The dead holder is dead although its pid is alive (another identity).
    assert_eq!(sem.reclaim_dead(), 2);
    assert_eq!(sem.available(), 2);
    let left: Vec<u32> = sem
        .holders()
        .iter()
        .filter(|h| h.pid == wpid)
        .map(|h| h.held)
        .collect();
    assert_eq!(
        left,
        vec![0],
        "only the newcomer's own (empty) slot is left"
    );
    imp.kill();
}

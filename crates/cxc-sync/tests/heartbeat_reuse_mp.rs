//! Heartbeat table under pid reuse, across real processes: a worker registers and marks
//! units, is SIGKILLed, and a new process is started with the dead worker's pid (in a
//! fresh pid namespace, through `ns_last_pid`). The newcomer cannot beat, mark, clear or
//! unregister the dead worker's slot, and the watchdog reclaims exactly the dead worker's
//! units (H2: none lost, none doubled) while a live worker's units stay.
//!
//! Needs root (pid namespaces); without it each test prints "SKIPPED: needs root".
#![cfg(not(cxc_loom))]

mod procs;

use std::time::{Duration, Instant};

use cxc_sync::liveness::{Identity, Liveness, fallback_active, liveness};
use cxc_sync::{FailoverWatchdog, HeartbeatTable};
use procs::*;

const CAPACITY: usize = 4;
const WORKER_BITS: u64 = (1 << 3) | (1 << 5);
const OWN_BIT: u8 = 9;

#[test]
fn new_process_with_a_dead_workers_pid_cannot_act_for_its_slot() {
    run(
        "new_process_with_a_dead_workers_pid_cannot_act_for_its_slot",
        false,
    );
}

#[test]
fn new_process_with_a_dead_workers_pid_cannot_act_for_its_slot_fallback() {
    run(
        "new_process_with_a_dead_workers_pid_cannot_act_for_its_slot_fallback",
        true,
    );
}

fn run(test: &str, fallback: bool) {
    match role().as_deref() {
        Some("nsroot") => nsroot(test),
        Some("scenario") => scenario(test, fallback),
        Some("worker") => worker(),
        Some("impostor") => impostor(),
        Some(other) => panic!("unknown role {other}"),
        None => run_reuse_test(test, fallback),
    }
}

fn scenario(test: &str, fallback: bool) {
    mount_own_proc();
    assert_eq!(fallback_active(), fallback);
    let table = HeartbeatTable::create(dir().join("hb.cxc"), CAPACITY).unwrap();
    // A live worker (this process) with a unit of its own.
    let mine = table.register(std::process::id()).unwrap();
    assert!(table.mark_in_flight(mine, OWN_BIT));

    let mut worker = spawn(test, "worker", &dir(), &[]);
    let line = wait_line(&mut worker, "READY");
    let slot: usize = line["READY ".len()..].parse().unwrap();
    let wpid = worker.pid();
    let recorded = table.snapshot(slot).unwrap().identity;
    assert!(recorded.is_known(), "{recorded:?}");
    assert_eq!(recorded.pid, wpid);
    assert_eq!(recorded.is_fallback(), fallback);
    worker.kill();
    // Past the fallback path's same-tick window (start times have a 10 ms resolution: a
    // pid reused within one tick is indistinguishable there, see the identity docs).
    std::thread::sleep(Duration::from_millis(30));

    // A new process gets the dead worker's pid.
    let slot_env = slot.to_string();
    let mut imp = spawn_with_pid(wpid, test, "impostor", &[("slot", &slot_env)]);
    let line = wait_line(&mut imp, "RESULT");
    assert_eq!(
        line, "RESULT beat=false mark=false clear=false unregister=false",
        "a process with a dead worker's pid acted for its slot"
    );
    let newcomer = Identity::of_pid(wpid).unwrap();
    assert_ne!(newcomer, recorded, "pid reuse must give another identity");
    assert_eq!(liveness(&recorded), Liveness::Dead);
    assert_eq!(liveness(&newcomer), Liveness::Alive);
    let snap = table.snapshot(slot).unwrap();
    assert_eq!(
        snap.in_flight_bitmap, WORKER_BITS,
        "the newcomer changed the bits"
    );
    assert!(!snap.fenced);

    // Grace so long that only the OS identity can tell the worker is dead.
    let wd = FailoverWatchdog::with_grace(&table, 1_000_000);
    let t0 = Instant::now();
    let report = loop {
        assert!(table.beat(mine));
        let r = wd.scan();
        if !r.dead_slots.is_empty() {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dead worker was never reported"
        );
        std::thread::sleep(Duration::from_millis(12));
    };
    let dead: Vec<usize> = report.dead_slots.iter().map(|(i, _)| *i).collect();
    assert_eq!(dead, vec![slot], "only the dead worker's slot is reported");
    assert_eq!(
        wd.reclaim(slot),
        WORKER_BITS,
        "exactly the dead worker's units"
    );
    assert_eq!(wd.reclaim(slot), 0, "a unit reclaimed twice");
    assert_eq!(
        table.snapshot(mine).unwrap().in_flight_bitmap,
        1 << OWN_BIT,
        "the live worker's unit was touched"
    );
    imp.kill();
}

/// Registers its own pid, marks two units, beats, reports its slot, waits to be killed.
fn worker() {
    let table = HeartbeatTable::open(dir().join("hb.cxc"), CAPACITY).unwrap();
    let slot = table.register(std::process::id()).unwrap();
    for bit in [3, 5] {
        assert!(table.mark_in_flight(slot, bit));
    }
    assert!(table.beat(slot));
    report(format!("READY {slot}"));
    park();
}

/// Has the dead worker's pid: tries to act for the worker's slot through a fresh handle.
fn impostor() {
    let slot: usize = cxc_testkit::arg("slot").parse().unwrap();
    let table = HeartbeatTable::open(dir().join("hb.cxc"), CAPACITY).unwrap();
    let beat = table.beat(slot);
    let mark = table.mark_in_flight(slot, 7);
    let clear = table.clear_in_flight(slot, 3);
    let unregister = table.unregister(slot);
    report(format!(
        "RESULT beat={beat} mark={mark} clear={clear} unregister={unregister}"
    ));
    park();
}

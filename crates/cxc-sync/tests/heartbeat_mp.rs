//! Multi-process tests of `HeartbeatTable` + `FailoverWatchdog`: real worker processes
//! (this test binary re-executed in a role, `cxc_testkit`), one of them SIGKILLed
//! mid-work; the scheduler (the test process) reclaims and reassigns its work.

mod ctl;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cxc_sync::{FailoverWatchdog, HeartbeatTable, heartbeat_counter as counter};
use cxc_testkit::{Proc, RoleCommand, arg, path_arg, try_arg};

const UNITS: u64 = 40;
const ALL_DONE: u64 = (1 << UNITS) - 1;
const CAPACITY: usize = 3;

/// The shared work queue (a second mapped file): `[next unit, redo bitmap, done bitmap,
/// finish flag, ...]`.
type Work = ctl::Ctl;
const NEXT: usize = 0;
const REDO: usize = 1;
const DONE: usize = 2;
const FINISH: usize = 3;

/// How long a child may take to finish once told to.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// Starts worker `id` of test `test` in `role`, sharing `dir`.
fn spawn(test: &str, role: &str, dir: &Path, id: usize) -> RoleCommand {
    RoleCommand::new(test, role)
        .arg("dir", dir)
        .arg("id", id.to_string())
}

fn log_path(dir: &Path, id: usize) -> PathBuf {
    dir.join(format!("worker-{id}.log"))
}

fn append(path: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(line.as_bytes()).unwrap(); // one small O_APPEND write
}

/// Claims a unit: first from the redo bitmap, else from the counter. The unit's bit is
/// marked in flight BEFORE the claim is committed (CAS), so a worker killed at any point
/// leaves every unit it may own visible in its bitmap. `None` if nothing is left or the
/// worker was fenced.
fn claim(t: &HeartbeatTable, slot: usize, w: &Work) -> Option<u8> {
    let q = w.head();
    loop {
        let r = q[REDO].load(Ordering::Acquire);
        if r == 0 {
            break;
        }
        let b = r.trailing_zeros() as u8;
        if !t.mark_in_flight(slot, b) {
            return None;
        }
        if q[REDO]
            .compare_exchange(r, r & !(1 << b), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(b);
        }
        t.clear_in_flight(slot, b);
    }
    loop {
        let n = q[NEXT].load(Ordering::Acquire);
        if n >= UNITS {
            return None;
        }
        if !t.mark_in_flight(slot, n as u8) {
            return None;
        }
        if q[NEXT]
            .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(n as u8);
        }
        t.clear_in_flight(slot, n as u8);
    }
}

/// A worker process: registers, claims units, "works" (sleeps while beating), logs
/// "done unit N", clears the bit; idles (beating) until the scheduler says finish.
fn worker(dir: &Path, id: usize, stall_at: Option<usize>) {
    let t = HeartbeatTable::open(dir.join("hb.cxc"), CAPACITY).unwrap();
    let w = ctl::open(&dir.join("work.cxc"));
    let log = log_path(dir, id);
    let slot = t.register(std::process::id()).unwrap();
    append(&log, &format!("slot {slot}\n"));
    let mut claimed = 0;
    while w.head()[FINISH].load(Ordering::Acquire) == 0 {
        if !t.beat(slot) {
            append(&log, "fenced\n");
            return;
        }
        let Some(unit) = claim(&t, slot, &w) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        claimed += 1;
        if stall_at == Some(claimed) {
            // Hold the unit until killed (keep beating: only the OS knows we are gone).
            loop {
                t.beat(slot);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1));
            t.beat(slot);
        }
        append(&log, &format!("done unit {unit}\n"));
        w.head()[DONE].fetch_or(1 << unit, Ordering::AcqRel);
        if !t.clear_in_flight(slot, unit) {
            append(&log, "fenced\n");
            return;
        }
    }
    assert!(t.unregister(slot));
}

/// In a child: its role, shared directory and worker id.
fn role() -> Option<(String, PathBuf, usize)> {
    let role = cxc_testkit::role()?;
    let id = arg("id").parse().expect("numeric worker id");
    Some((role, path_arg("dir"), id))
}

fn logs(dir: &Path, id: usize) -> String {
    std::fs::read_to_string(log_path(dir, id)).unwrap_or_default()
}

fn slot_of(log: &str) -> Option<usize> {
    log.lines()
        .find_map(|l| l.strip_prefix("slot ").map(|s| s.parse().unwrap()))
}

const TEST_FAILOVER: &str = "killed_worker_units_are_reclaimed_and_slot_reused";

#[test]
fn killed_worker_units_are_reclaimed_and_slot_reused() {
    if let Some((role, dir, id)) = role() {
        assert_eq!(role, "worker");
        let stall = try_arg("stall").map(|s| s.to_str().unwrap().parse().unwrap());
        return worker(&dir, id, stall);
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let table = HeartbeatTable::create(dir.join("hb.cxc"), CAPACITY).unwrap();
    let work: Work = ctl::create(&dir.join("work.cxc"));
    // Grace is generous (a live worker would have to stall ~1 s to be declared dead);
    // the killed worker is found at once by OS identity.
    let watchdog = FailoverWatchdog::with_grace(&table, 200);

    // Worker 0 stalls on its second unit and is killed there.
    let mut kids: Vec<Proc> = vec![
        spawn(TEST_FAILOVER, "worker", dir, 0)
            .arg("stall", "2")
            .spawn(),
    ];
    for id in 1..3 {
        kids.push(spawn(TEST_FAILOVER, "worker", dir, id).spawn());
    }
    let victim_pid = kids[0].pid();

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut killed: Option<(usize, u64)> = None; // (slot, bits in flight at the kill)
    let mut reclaimed = 0u64;
    let mut victim_slot_reclaimed = false;
    let mut newcomer = false;
    loop {
        assert!(
            Instant::now() < deadline,
            "timed out; logs: {:?}",
            (0..4).map(|i| logs(dir, i)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
        let report = watchdog.scan();
        for (slot, snap) in &report.dead_slots {
            let bits = watchdog.reclaim(*slot);
            reclaimed |= bits;
            work.head()[REDO].fetch_or(bits, Ordering::AcqRel);
            if snap.pid == victim_pid {
                assert!(killed.is_some(), "the victim was declared dead while alive");
                victim_slot_reclaimed = true;
            }
        }
        if killed.is_none() {
            let log = logs(dir, 0);
            if let Some(slot) = slot_of(&log) {
                let snap = table.snapshot(slot).unwrap();
                if log.contains("done unit") && snap.pid == victim_pid && snap.in_flight_bitmap != 0
                {
                    kids[0].kill(); // SIGKILL, mid-work
                    killed = Some((slot, snap.in_flight_bitmap));
                }
            }
        }
        if victim_slot_reclaimed && !newcomer {
            // A new worker registers after the reclaim: the table is full of live workers
            // except the victim's fenced slot, which it must reuse.
            kids.push(spawn(TEST_FAILOVER, "worker", dir, 3).spawn());
            newcomer = true;
        }
        if work.head()[DONE].load(Ordering::Acquire) == ALL_DONE && newcomer {
            // Let the newcomer register before finishing (it may have nothing left to do).
            if slot_of(&logs(dir, 3)).is_some() {
                work.head()[FINISH].store(1, Ordering::Release);
                break;
            }
        }
    }
    for c in &mut kids[1..] {
        c.finish(CHILD_DEADLINE);
    }

    let (victim_slot, victim_bits) = killed.expect("victim killed");
    assert_ne!(victim_bits, 0);
    assert_eq!(
        reclaimed & victim_bits,
        victim_bits,
        "the victim's units were reclaimed"
    );
    // The newcomer reused the victim's slot.
    assert_eq!(slot_of(&logs(dir, 3)), Some(victim_slot));
    // Every unit completed at least once; only reclaimed (in flight on the dead worker)
    // units were done twice.
    let mut done = [0u32; UNITS as usize];
    for id in 0..4 {
        let log = logs(dir, id);
        assert!(!log.contains("fenced"), "a live worker was fenced: {log}");
        for l in log.lines() {
            if let Some(u) = l.strip_prefix("done unit ") {
                done[u.parse::<usize>().unwrap()] += 1;
            }
        }
    }
    for (u, &n) in done.iter().enumerate() {
        assert!(n >= 1, "unit {u} never completed");
        if n > 1 {
            assert!(
                reclaimed & (1 << u) != 0,
                "unit {u} redone without being reclaimed"
            );
        }
    }
    let c = table.counters();
    eprintln!(
        "victim slot {victim_slot} bits {victim_bits:#x}; reclaimed {reclaimed:#x}; \
         redone {:?}; counters {c:?}",
        (0..UNITS as usize)
            .filter(|&u| done[u] > 1)
            .collect::<Vec<_>>()
    );
    assert!(c[counter::OS_DEAD_DETECTED] + c[counter::DEAD_REPORTED] >= 1);
    assert_eq!(c[counter::REUSE_FENCED], 1);
}

const TEST_OS_DEAD: &str = "os_dead_worker_detected_within_grace_and_idle_slot_reused";

#[test]
fn os_dead_worker_detected_within_grace_and_idle_slot_reused() {
    if let Some((role, dir, id)) = role() {
        let t = HeartbeatTable::open(dir.join("hb.cxc"), 2).unwrap();
        let slot = t.register(std::process::id()).unwrap();
        if role == "busy" {
            assert!(t.mark_in_flight(slot, 3));
        }
        append(&log_path(&dir, id), &format!("slot {slot}\n"));
        return; // exit without unregistering: only the OS knows
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let table = HeartbeatTable::create(dir.join("hb.cxc"), 2).unwrap();
    let watchdog =
        FailoverWatchdog::with_grace(&table, 1_000_000).with_os_check_interval(Duration::ZERO);

    // A busy worker exits with a unit in flight: reported at once (lag far within grace).
    spawn(TEST_OS_DEAD, "busy", dir, 0)
        .spawn()
        .finish(CHILD_DEADLINE);
    let busy_slot = slot_of(&logs(dir, 0)).unwrap();
    let first = watchdog.scan(); // records the heartbeat
    let second = watchdog.scan(); // it did not move: ask the OS
    let dead: Vec<_> = first.dead_slots.iter().chain(&second.dead_slots).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, busy_slot);
    assert!(dead[0].1.identity.is_known());
    assert_eq!(table.counters()[counter::OS_DEAD_DETECTED], 1);
    assert_eq!(watchdog.reclaim(busy_slot), 1 << 3);

    // An idle worker exits: its slot is reused by register with no watchdog involved.
    let keep = table.register(4_100_000).unwrap(); // occupies the reclaimed slot
    assert_eq!(keep, busy_slot);
    spawn(TEST_OS_DEAD, "idle", dir, 1)
        .spawn()
        .finish(CHILD_DEADLINE);
    let idle_slot = slot_of(&logs(dir, 1)).unwrap();
    assert_ne!(idle_slot, keep);
    assert_eq!(table.register(4_100_001).unwrap(), idle_slot);
    assert_eq!(table.counters()[counter::REUSE_OS_DEAD], 1);
}

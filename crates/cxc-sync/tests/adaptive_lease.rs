//! Issue acceptance: `AdaptiveSpin` changes the strategy in a real lease file after a
//! burst of short blocked waits, and another process's handle follows it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cxc_sidecar::{AdaptiveInstance, AdaptiveSpin, Sidecar, SidecarBox, Strategy};
use cxc_sync::{LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{RoleCommand, in_role, path_arg, report};

fn opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

/// Child: opens the lease raw and reports the strategy it sees and how it waits.
fn child() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).expect("child opens the lease");
    let (s, generation) = lease.handshake().current();
    // The blocked-acquire path reads the same word: its spin budget.
    report(format!(
        "CHILD strategy={s:?} generation={generation} budget={:?}",
        lease.handshake().spin_budget()
    ));
    std::process::exit(0);
}

#[test]
fn adaptive_spin_switches_a_real_lease_and_another_process_follows() {
    if in_role("child") {
        child();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adaptive.lease");
    static SC: Sidecar = Sidecar::new();
    let lease = SidecarBox::new_in(
        &SC,
        OwnerLease::<u64>::create_with(&path, 0, &opts()).unwrap(),
        Some(Box::new(AdaptiveSpin::new())),
    );
    assert_eq!(lease.handshake().current(), (Strategy::Default, 0));
    // Two threads hand the lease back and forth with very short holds: the blocked
    // acquirer's waits are a few microseconds (recorded as LeaseBlockedWait).
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let switched = std::thread::scope(|s| {
        for pid in [11u32, 12] {
            let lease = &lease;
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(c) = lease.acquire(pid, u64::MAX, Duration::from_millis(50)) {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(2) {
                            std::hint::spin_loop();
                        }
                        lease.release_claim(&c);
                        // A short gap before claiming again, so that the other thread,
                        // spinning, takes over (a hand-off, not one thread re-claiming
                        // at once while the other sleeps).
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(5) {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
        }
        let mut switched = None;
        while start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(5));
            SC.poll();
            let (s, g) = lease.handshake().current();
            if matches!(s, Strategy::Spin { .. }) {
                switched = Some((s, g));
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        switched
    });
    let (strategy, generation) = switched.expect("AdaptiveSpin chose to spin for short waits");
    assert!(generation >= 1);
    let waits = lease
        .ring()
        .snapshot()
        .into_iter()
        .filter(|o| o.op == cxc_sidecar::OpCode::LeaseBlockedWait)
        .count();
    // The ring keeps the last 64 observations; later claims may have pushed the waits out,
    // so the file's cumulative count of blocked acquires is evidence too.
    let blocked = lease.status().counters[cxc_sync::lease::counter::BLOCKED_WAITS];
    assert!(waits > 0 || blocked > 0, "waits were recorded");

    let reports = RoleCommand::new(
        "adaptive_spin_switches_a_real_lease_and_another_process_follows",
        "child",
    )
    .arg("path", &path)
    .spawn()
    .finish(Duration::from_secs(60));
    let line = reports
        .iter()
        .find(|l| l.starts_with("CHILD"))
        .unwrap_or_else(|| panic!("no child report: {reports:?}"));
    assert!(
        line.contains(&format!("strategy={strategy:?} generation={generation}")),
        "child sees {line}, parent published {strategy:?} gen {generation}"
    );
    assert!(line.contains("budget=Some("), "{line}");
}

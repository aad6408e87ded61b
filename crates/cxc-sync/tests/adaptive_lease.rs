//! Issue acceptance: `AdaptiveSpin` changes the strategy in a real lease file after a
//! burst of short blocked waits, and another process's handle follows it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cxc_sidecar::{AdaptiveInstance, AdaptiveSpin, Sidecar, SidecarBox, Strategy};
use cxc_sync::{LeaseOptions, OwnerLease, Preemption};

const ROLE: &str = "CXC_ADAPTIVE_ROLE";
const PATH: &str = "CXC_ADAPTIVE_PATH";
const REPORT: &str = "CXC_ADAPTIVE_REPORT";

fn opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

/// Child: opens the lease raw and reports the strategy it sees and how it waits.
fn child() {
    let lease: OwnerLease<u64> =
        OwnerLease::open(std::env::var(PATH).unwrap()).expect("child opens the lease");
    let (s, generation) = lease.handshake().current();
    // The blocked-acquire path reads the same word: its spin budget.
    let report = format!(
        "CHILD strategy={s:?} generation={generation} budget={:?}\n",
        lease.handshake().spin_budget()
    );
    std::fs::write(std::env::var(REPORT).unwrap(), report).unwrap();
    std::process::exit(0);
}

#[test]
fn adaptive_spin_switches_a_real_lease_and_another_process_follows() {
    if std::env::var(ROLE).is_ok() {
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
    assert!(waits > 0, "waits were recorded");

    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "adaptive_spin_switches_a_real_lease_and_another_process_follows",
            "--exact",
            "--test-threads=1",
        ])
        .env(ROLE, "child")
        .env(PATH, &path)
        .env(REPORT, dir.path().join("report"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("report")).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.starts_with("CHILD"))
        .unwrap_or_else(|| panic!("no child report: {text}"));
    assert!(
        line.contains(&format!("strategy={strategy:?} generation={generation}")),
        "child sees {line}, parent published {strategy:?} gen {generation}"
    );
    assert!(line.contains("budget=Some("), "{line}");
}

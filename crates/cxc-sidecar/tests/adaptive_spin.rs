//! `AdaptiveSpin` end to end across processes: a waiter process records bursts of short
//! blocked waits into the file's ring; the parent's sidecar drains them, its policy
//! switches the file's strategy to spinning, and the waiter process follows the new
//! strategy from the handshake in the file. Then long waits switch it to parking.

mod common;

use std::time::{Duration, Instant};

use common::{Probe, private_sidecar};
use cxc_sidecar::{AdaptiveInstance, AdaptiveSpin, OpCode, SidecarBox, Strategy, flags};
use cxc_testkit::{RoleCommand, path_arg, report, role, wait_until};

const TEST: &str = "adaptive_spin_decision_reaches_other_process";
/// Bound on each wait for the waiter process (it gives up by itself after 30 s).
const CHILD: Duration = Duration::from_secs(60);

/// The waiter process: reports the strategy it starts with, then records bursts of short
/// waits until the strategy in the file changes, and reports what it follows.
fn waiter() {
    let probe = Probe::open(&path_arg("path"));
    let (s0, g0) = probe.handshake().current();
    report(format_args!("READY {} {g0}", s0.name()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut burst = 0u64;
    loop {
        // What a primitive's blocking slow path does: read the budget, wait, record.
        if let Some(budget) = probe.handshake().spin_budget() {
            let (s, g) = probe.handshake().current();
            report(format_args!(
                "FOLLOWED {} {} {g} after {burst} bursts",
                s.name(),
                budget.as_nanos()
            ));
            return;
        }
        for i in 0..40 {
            probe.wait(1_500 + (burst * 40 + i) % 1_000, flags::WAIT_PARKED);
        }
        burst += 1;
        assert!(Instant::now() < deadline, "the strategy never changed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn adaptive_spin_decision_reaches_other_process() {
    if let Some(role) = role() {
        assert_eq!(role, "waiter");
        waiter();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adaptive.probe");
    let sc = private_sidecar();
    let probe = SidecarBox::new_in(
        sc,
        Probe::create(&path),
        Some(Box::new(AdaptiveSpin::new())),
    );
    assert_eq!(sc.instances()[0].policy.as_deref(), Some("adaptive-spin"));
    let thread = sc.spawn(Duration::from_millis(2)).unwrap();

    let mut child = RoleCommand::new(TEST, "waiter").arg("path", &path).spawn();
    assert_eq!(child.next_report(CHILD), "READY default 0");
    let followed = child.next_report(CHILD);
    let followed = followed
        .strip_prefix("FOLLOWED ")
        .unwrap_or_else(|| panic!("expected FOLLOWED, got {followed:?}"))
        .to_owned();
    child.finish(CHILD);

    // The parent's view of the file and the waiter's agree.
    let (s, g) = probe.handshake().current();
    let Strategy::Spin { budget_ns } = s else {
        panic!("expected a spin strategy, found {s}");
    };
    assert_eq!(g, 1);
    assert!(
        followed.starts_with(&format!("spin {budget_ns} 1 ")),
        "waiter followed {followed:?}, file has {s} gen {g}"
    );
    // Waits of 1.5..2.5 µs: a budget of 4 µs covers them.
    assert_eq!(budget_ns, 4096);
    // The parent saw the waiter's observations and changed the strategy once.
    assert!(wait_until(Duration::from_secs(5), || probe
        .stats()
        .strategy
        == s));
    let stats = probe.stats();
    assert_eq!(stats.strategy_changes, 1);
    assert!(stats.waits.count >= 64, "{stats:?}");
    assert!(stats.counter("waits").unwrap() >= 64);
    let changed = probe
        .ring()
        .snapshot()
        .into_iter()
        .find(|o| o.op == OpCode::StrategyChanged)
        .expect("the change is in the ring");
    assert_eq!(changed.pid, std::process::id());
    assert_eq!(changed.arg, probe.handshake().word());
    eprintln!(
        "waiter: {followed}; parent stats: {} waits, p90 {} ns",
        stats.waits.count,
        stats.waits.quantile(0.9)
    );

    // Long waits (2 ms, beyond the dead band) move it to parking.
    let mut parked = false;
    for _ in 0..100 {
        for _ in 0..40 {
            probe.wait(2_000_000, flags::WAIT_PARKED | flags::WAIT_TIMED_OUT);
        }
        if wait_until(Duration::from_millis(20), || {
            probe.handshake().strategy() == Strategy::Park
        }) {
            parked = true;
            break;
        }
    }
    assert!(parked, "long waits did not switch to parking");
    assert_eq!(probe.handshake().current(), (Strategy::Park, 2));
    drop(thread);
    assert_eq!(probe.stats().strategy_changes, 2);
}

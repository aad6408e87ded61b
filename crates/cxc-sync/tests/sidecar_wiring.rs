//! The primitives' sidecar wiring: raw handles record nothing; a `SidecarBox` makes them
//! record their transitions; a strategy published through one handle is seen by another.

use std::time::Duration;

use cxc_sidecar::{AdaptiveInstance, OpCode, Sidecar, SidecarBox, Strategy};
use cxc_sync::{FailoverWatchdog, HeartbeatTable, OwnerLease};

fn ops(ring: &cxc_sidecar::ObservationRing) -> Vec<OpCode> {
    ring.snapshot().into_iter().map(|o| o.op).collect()
}

/// `instance` in a `SidecarBox` of a sidecar of its own (nothing else is registered
/// there, so the test sees only what this instance records), and that sidecar.
fn boxed<T: AdaptiveInstance + 'static>(instance: T) -> (&'static Sidecar, SidecarBox<T>) {
    let sc: &'static Sidecar = Box::leak(Box::new(Sidecar::new()));
    (sc, SidecarBox::new_in(sc, instance, None))
}

#[test]
fn raw_lease_records_nothing_boxed_lease_records_transitions() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let raw: OwnerLease<u64> = OwnerLease::create(&p, 0).unwrap();
    assert!(raw.try_acquire(7, 3));
    assert!(raw.release(7));
    assert!(ops(raw.ring()).is_empty(), "raw handles record nothing");

    let (sc, boxed) = boxed(OwnerLease::<u64>::open(&p).unwrap());
    let c = boxed.try_claim(7, 3).unwrap();
    assert!(boxed.try_acquire(5, 3), "lower pid preempts");
    assert!(!boxed.write_claimed(&c, 1), "stale write rejected");
    assert!(boxed.release(5));
    assert!(boxed.acquire(9, 3, Duration::from_millis(10)).is_some());
    let seen = ops(boxed.ring());
    assert_eq!(
        seen,
        vec![
            OpCode::LeaseClaimVacant,
            OpCode::LeaseClaimPreempt,
            OpCode::LeaseStaleWriteRejected,
            OpCode::LeaseRelease,
            OpCode::LeaseClaimVacant,
        ]
    );
    let report = sc.poll();
    assert_eq!(report.instances.len(), 1);
    let counters = boxed.counters();
    assert!(counters.contains(&("claim_preempt", 1)), "{counters:?}");
    drop(boxed);
    // Unregistered again: the raw handle from before still records nothing.
    assert!(raw.try_acquire(3, 3));
    assert_eq!(ops(raw.ring()).len(), 5);
}

#[test]
fn strategy_published_on_one_handle_is_seen_by_another() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let a: OwnerLease<u64> = OwnerLease::create(&p, 0).unwrap();
    let b: OwnerLease<u64> = OwnerLease::open(&p).unwrap();
    let generation = a.apply(Strategy::Park);
    assert_eq!(b.handshake().current(), (Strategy::Park, generation));
    assert_eq!(b.status().strategy, (Strategy::Park, generation));
}

#[test]
fn boxed_heartbeat_records_register_scan_reclaim_fenced_beat() {
    let d = tempfile::tempdir().unwrap();
    let (_, table) = boxed(HeartbeatTable::create(d.path().join("hb"), 4).unwrap());
    let slot = table.register(u32::MAX - 3).unwrap();
    assert!(table.mark_in_flight(slot, 5));
    let wd = FailoverWatchdog::with_grace(&table, 1);
    for _ in 0..3 {
        wd.scan();
    }
    assert_eq!(wd.reclaim(slot), 1 << 5);
    assert!(!table.beat(slot));
    let seen = ops(table.ring());
    assert_eq!(seen.first(), Some(&OpCode::HeartbeatRegister));
    assert!(seen.contains(&OpCode::HeartbeatScan));
    assert!(seen.contains(&OpCode::HeartbeatReclaim));
    assert_eq!(seen.last(), Some(&OpCode::HeartbeatFencedBeat));
    let reclaim = table
        .ring()
        .snapshot()
        .into_iter()
        .find(|o| o.op == OpCode::HeartbeatReclaim)
        .unwrap();
    assert_eq!(reclaim.arg, 1 << 5);
}

#[test]
fn boxed_semaphore_records_contention_timeout_overflow() {
    let d = tempfile::tempdir().unwrap();
    let (_, sem) = boxed(cxc_sync::SharedSemaphore::create(d.path().join("s"), 1, 1).unwrap());
    let p = sem.try_acquire().unwrap();
    assert!(sem.acquire_timeout(Duration::from_millis(5)).is_none());
    drop(p);
    assert!(!sem.release(), "at max");
    let seen = ops(sem.ring());
    assert_eq!(
        seen,
        vec![OpCode::SemTimeout, OpCode::SemOverflowRejected],
        "{seen:?}"
    );
    assert!(sem.counters().contains(&("timeouts", 1)));
}

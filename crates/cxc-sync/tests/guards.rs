//! Guards of the semaphore and the heartbeat table: owned permits, all-or-nothing
//! `acquire_many`, the registration guard; `Send`/`Sync` of every handle and guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cxc_sync::{
    FailoverWatchdog, HeartbeatError, HeartbeatTable, LeaseBuilder, LeaseGuard, ManyPermits,
    OwnedLeaseGuard, OwnedPermit, OwnedRegistration, OwnerLease, Permit, Registration,
    SharedSemaphore,
};

const fn send<T: Send>() {}
const fn sync<T: Sync>() {}
// Handles are shared between threads. The lease guards move between threads but are
// used by one at a time: they are not `Sync` (their single writer publishes in one step;
// the `compile_fail` doc tests on `LeaseGuard` and `OwnedLeaseGuard` check it). The
// semaphore's and the heartbeat table's guards are `Send + Sync` (`docs/api.md`).
const _: () = {
    send::<OwnerLease<u64>>();
    sync::<OwnerLease<u64>>();
    send::<SharedSemaphore>();
    sync::<SharedSemaphore>();
    send::<HeartbeatTable>();
    sync::<HeartbeatTable>();
    send::<LeaseGuard<'static, u64>>();
    send::<OwnedLeaseGuard<u64>>();
    send::<Permit<'static>>();
    sync::<Permit<'static>>();
    send::<OwnedPermit>();
    sync::<OwnedPermit>();
    send::<ManyPermits<'static>>();
    sync::<ManyPermits<'static>>();
    send::<Registration<'static>>();
    sync::<Registration<'static>>();
    send::<OwnedRegistration>();
    sync::<OwnedRegistration>();
    send::<LeaseBuilder>();
};

#[test]
fn owned_permits_move_into_threads_and_come_back() {
    let d = tempfile::tempdir().unwrap();
    let sem = Arc::new(SharedSemaphore::create(d.path().join("s"), 2, 2).unwrap());
    let a = sem.clone().acquire_owned();
    let b = sem.clone().try_acquire_owned().expect("second permit");
    assert!(sem.clone().try_acquire_owned().is_none());
    let t = std::thread::spawn(move || drop(a));
    t.join().unwrap();
    assert_eq!(sem.available(), 1);
    drop(b);
    assert_eq!(sem.available(), 2);
    assert!(
        sem.clone()
            .acquire_owned_timeout(Duration::from_millis(10))
            .is_some()
    );
    assert_eq!(sem.available(), 2);
}

#[test]
fn acquire_many_is_all_or_nothing() {
    let d = tempfile::tempdir().unwrap();
    let sem = SharedSemaphore::create(d.path().join("s"), 3, 3).unwrap();
    assert!(sem.try_acquire_many(0).is_none());
    assert!(sem.try_acquire_many(4).is_none(), "more than max");
    let one = sem.try_acquire().unwrap();
    assert!(sem.try_acquire_many(3).is_none(), "only 2 available");
    assert_eq!(
        sem.available(),
        2,
        "a failed attempt gives back what it took"
    );
    let two = sem.try_acquire_many(2).expect("2 available");
    assert_eq!(two.count(), 2);
    assert_eq!(sem.available(), 0);
    let t0 = Instant::now();
    assert!(
        sem.acquire_many_timeout(2, Duration::from_millis(50))
            .is_none()
    );
    assert!(t0.elapsed() >= Duration::from_millis(50));
    assert_eq!(sem.available(), 0);
    drop(two);
    assert_eq!(sem.available(), 2);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| sem.acquire_many(3).map(|g| g.count()));
        std::thread::sleep(Duration::from_millis(30));
        drop(one);
        assert_eq!(waiter.join().unwrap(), Some(3));
    });
    assert_eq!(sem.available(), 3);
}

#[test]
fn two_acquire_many_callers_never_deadlock() {
    let d = tempfile::tempdir().unwrap();
    let sem = SharedSemaphore::create(d.path().join("s"), 3, 3).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..200 {
                    let g = sem
                        .acquire_many_timeout(2, Duration::from_secs(10))
                        .expect("progress");
                    assert!(sem.available() <= 1);
                    drop(g);
                }
            });
        }
    });
    assert_eq!(sem.available(), 3);
}

#[test]
fn registration_guard_unregisters_on_drop_and_reports_fencing() {
    let d = tempfile::tempdir().unwrap();
    let table = HeartbeatTable::create(d.path().join("t"), 4).unwrap();
    let slot;
    {
        let r = table.join().unwrap();
        slot = r.slot();
        r.beat().unwrap();
        r.mark_in_flight(5).unwrap();
        assert_eq!(r.in_flight(), Some(1 << 5));
        r.clear_in_flight(5).unwrap();
        assert!(matches!(
            r.mark_in_flight(64),
            Err(HeartbeatError::BitOutOfRange { bit: 64 })
        ));
        assert_eq!(table.snapshot(slot).unwrap().pid, std::process::id());
    }
    assert_eq!(table.snapshot(slot).unwrap().pid, 0, "unregistered on drop");
    // A registration the watchdog declares dead is fenced: its calls say so.
    let r = table.join_as(std::process::id()).unwrap();
    r.mark_in_flight(1).unwrap();
    let dog = FailoverWatchdog::with_grace(&table, 1);
    let mut fenced = false;
    for _ in 0..10 {
        table.tick_global_epoch();
        let report = dog.scan();
        for (s, _) in &report.dead_slots {
            assert_eq!(dog.reclaim(*s), 1 << 1);
            fenced = true;
        }
        if fenced {
            break;
        }
    }
    assert!(fenced, "a silent worker is declared dead");
    assert!(matches!(r.beat(), Err(HeartbeatError::Fenced { .. })));
    assert_eq!(r.in_flight(), None);
}

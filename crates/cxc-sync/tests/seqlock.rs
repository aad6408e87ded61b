//! `SeqLock<T>` and `SharedCell<T>` in one process: round trips, files, threads hammering
//! (checksummed payloads never torn), a stalled `update` superseded and never published,
//! a `write` that never waits for a stalled `update`, a panicking `update` (which releases
//! the update claim).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxc_sync::{Abandoned, SeqLock, SeqLockError, SharedCell, WriteError, Written};
use cxc_testkit::{intact, sealed};

#[test]
fn round_trip_heap() {
    let lock = SeqLock::new(7u64).unwrap();
    assert_eq!(lock.read(), 7);
    assert_eq!(lock.write(9).unwrap().abandoned, None);
    lock.update(|v| *v *= 2).unwrap();
    assert_eq!(lock.read(), 18);
}

#[test]
fn payload_too_large_refused() {
    assert!(matches!(
        SeqLock::new([0u8; 49]),
        Err(SeqLockError::PayloadTooLarge { max: 48, found: 49 })
    ));
    let dir = tempfile::tempdir().unwrap();
    assert!(SharedCell::create(dir.path().join("c"), [0u8; 48]).is_ok());
}

#[test]
fn cell_files_create_open_validate() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.cell");
    let a = SharedCell::create(&p, [1u64, 2, 3]).unwrap();
    assert!(SharedCell::create(&p, [0u64; 3]).is_err(), "never clobbers");
    let b = SharedCell::<[u64; 3]>::open(&p).unwrap();
    b.store([4, 5, 6]).unwrap();
    assert_eq!(a.load(), [4, 5, 6]);
    assert!(SharedCell::<u64>::open(&p).is_err(), "another T is refused");
    let (c, origin) = SharedCell::create_or_open(&p, [0u64; 3]).unwrap();
    assert_eq!(origin, cxc_mmf::Origin::Opened);
    assert_eq!(c.load(), [4, 5, 6]);
    drop((a, b, c));
    // A lease file is not a cell.
    let l = dir.path().join("l");
    let _lease = cxc_sync::OwnerLease::create(&l, [0u64; 3]).unwrap();
    assert!(SharedCell::<[u64; 3]>::open(&l).is_err());
}

/// A cell file of protocol 1 (whose block was the lease's 7552-byte state) is refused
/// by the version, not by the block size.
#[test]
fn cell_of_protocol_1_is_refused_naming_both_versions() {
    use cxc_mmf::{CreateOptions, Kind, Layout, Mapped, MmfError, TypeFingerprint};
    use std::sync::atomic::AtomicU64;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v1.cell");
    let layout = Layout {
        kind: Kind::Cell,
        head_size: 7552,
        slot_size: 0,
        capacity: 0,
        payload: TypeFingerprint::of::<[u64; 3]>(),
        params: [1, 0, 0, 0],
    };
    drop(
        Mapped::<[AtomicU64; 8]>::create(&p, layout, &CreateOptions::default(), |_, _| {}).unwrap(),
    );
    match SharedCell::<[u64; 3]>::open(&p) {
        Err(SeqLockError::File(MmfError::ParamMismatch {
            name,
            expected,
            found,
        })) => {
            assert_eq!((name, expected.as_str(), found), ("cell_protocol", "2", 1));
        }
        other => panic!("expected a cell_protocol mismatch, got {other:?}"),
    }
    let e = SharedCell::<[u64; 3]>::open(&p).unwrap_err().to_string();
    assert!(e.contains('1') && e.contains('2'), "{e}");
}

#[test]
fn threads_never_see_torn_values_nor_lose_updates() {
    let lock = Arc::new(SeqLock::new(sealed(0)).unwrap());
    let counter = Arc::new(SeqLock::new(0u64).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (lock, stop) = (lock.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert!(intact(&lock.read()), "torn read");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let (lock, counter) = (lock.clone(), counter.clone());
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    lock.write(sealed(t << 32 | i)).unwrap();
                    // A thread descheduled longer than the stall timeout inside `update`
                    // is superseded, and an update that races a publication conflicts;
                    // its increment is then never published: retry.
                    while let Err(e) = counter.update(|c| *c += 1) {
                        assert_eq!(e, WriteError::Superseded);
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(counter.read(), 60_000, "an update was lost");
}

/// Starts a thread that runs `update` with a stalling closure (inside, it sleeps
/// `stall`, then writes 666) and returns once the closure runs; the thread returns what
/// `update` returned.
fn stalled_update<R: Send + 'static>(
    stall: Duration,
    update: impl FnOnce(&mut dyn FnMut(&mut u64)) -> R + Send + 'static,
) -> JoinHandle<R> {
    let inside = Arc::new(Barrier::new(2));
    let slow = {
        let inside = inside.clone();
        std::thread::spawn(move || {
            update(&mut |v: &mut u64| {
                inside.wait();
                std::thread::sleep(stall);
                *v = 666;
            })
        })
    };
    inside.wait();
    slow
}

#[test]
fn stalled_update_is_superseded_and_never_published() {
    let mut lock = SeqLock::new(1u64).unwrap();
    lock.set_stall_timeout(Duration::from_millis(20));
    let lock = Arc::new(lock);
    let l = lock.clone();
    let slow = stalled_update(Duration::from_millis(200), move |f| l.update(f));
    // Another update waits for the claim, then supersedes the stalled one.
    let t = Instant::now();
    let w = lock.update(|v| *v += 1).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(w.abandoned, Some(Abandoned::Stalled));
    assert_eq!(lock.read(), 2);
    assert_eq!(slow.join().unwrap(), Err(WriteError::Superseded));
    assert_eq!(lock.read(), 2, "the stalled update was published");
    for i in 0..100 {
        lock.write(i).unwrap();
    }
    assert_eq!(lock.read(), 99);
}

#[test]
fn write_never_waits_for_a_stalled_update() {
    let lock = Arc::new(SeqLock::new(1u64).unwrap());
    let l = lock.clone();
    let slow = stalled_update(Duration::from_millis(200), move |f| l.update(f));
    let t = Instant::now();
    for i in 0..1000 {
        assert_eq!(lock.write(i).unwrap().abandoned, None);
    }
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "1000 writes took {:?}",
        t.elapsed()
    );
    // The update read 1 and would replace 999 without having seen it: refused.
    assert_eq!(slow.join().unwrap(), Err(WriteError::Superseded));
    assert_eq!(lock.read(), 999);
}

#[test]
fn panicking_update_publishes_nothing_and_releases() {
    let lock = SeqLock::new(5u32).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lock.update(|v| {
            *v = 9;
            panic!("boom");
        })
    }));
    assert!(r.is_err());
    assert_eq!(lock.read(), 5);
    let t = Instant::now();
    assert_eq!(lock.write(6).unwrap().abandoned, None);
    assert!(t.elapsed() < Duration::from_millis(5));
    assert_eq!(lock.read(), 6);
}

/// A panic in an `update`'s closure releases the update claim (`docs/seqlock.md`, API): a
/// following `update`, here from another thread, takes it at once and publishes. With a
/// 10 s stall timeout, a claim left held would make it wait 10 s and report
/// `Abandoned::Stalled`.
#[test]
fn panicking_update_releases_the_update_claim() {
    let dir = tempfile::tempdir().unwrap();
    let mut lock = SeqLock::new(5u32).unwrap();
    lock.set_stall_timeout(Duration::from_secs(10));
    panic_then_update(|f| lock.update(f), || lock.read());
    let mut cell = SharedCell::create(dir.path().join("p.cell"), 5u32).unwrap();
    cell.set_stall_timeout(Duration::from_secs(10));
    panic_then_update(|f| cell.update(f), || cell.load());
    let counters: std::collections::HashMap<_, _> = cell.counters().into_iter().collect();
    assert_eq!(counters["claim_stalled_writer"], 0);
    assert_eq!(counters["claim_dead_writer"], 0);
}

/// An `update` (of a value 5) whose closure panics, then an `update` from another thread
/// that must take the claim at once and publish 6.
fn panic_then_update(
    update: impl Fn(&dyn Fn(&mut u32)) -> Result<Written, WriteError> + Sync,
    read: impl Fn() -> u32,
) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        update(&|v| {
            *v = 9;
            panic!("boom");
        })
    }));
    assert!(r.is_err());
    assert_eq!(read(), 5, "the panicking update published");
    std::thread::scope(|s| {
        s.spawn(|| {
            let t = Instant::now();
            let w = update(&|v| *v += 1).unwrap();
            let took = t.elapsed();
            assert!(
                took < Duration::from_secs(1),
                "the next update waited {took:?}"
            );
            assert_eq!(w.abandoned, None, "the update claim was left held");
        });
    });
    assert_eq!(read(), 6);
}

#[test]
fn cell_sidecar_records_takeovers_and_counts_them() {
    use cxc_sidecar::{AdaptiveInstance, OpCode, SidecarBox};
    let dir = tempfile::tempdir().unwrap();
    let mut cell = SharedCell::create(dir.path().join("s.cell"), 0u64).unwrap();
    cell.set_stall_timeout(Duration::from_millis(20));
    let cell = Arc::new(SidecarBox::new(cell));
    assert_eq!(cell.kind(), cxc_mmf::Kind::Cell);
    let c = cell.clone();
    let slow = stalled_update(Duration::from_millis(150), move |f| c.update(f));
    assert_eq!(
        cell.update(|v| *v = 1).unwrap().abandoned,
        Some(Abandoned::Stalled)
    );
    assert_eq!(slow.join().unwrap(), Err(WriteError::Superseded));
    assert_eq!(cell.load(), 1);
    let counters: std::collections::HashMap<_, _> = cell.counters().into_iter().collect();
    assert_eq!(counters["claim_stalled_writer"], 1);
    assert_eq!(counters["update_conflict"], 1);
    assert_eq!(
        counters["slot_reserved"], 2,
        "one writer slot per writing thread"
    );
    assert!(
        cell.ring()
            .snapshot()
            .iter()
            .any(|o| o.op == OpCode::LeaseClaimStale)
    );
}

//! `SharedRwLock::read_async` / `write_async` (feature `async`): readers share and wait
//! for the writer, the writer waits for readers with writer preference, cancellation at
//! any point leaves nothing behind, many tasks keep exclusion, and a writer killed or
//! stopped in another process is replaced while the futures wait.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use cxc_sync::{RwLockOptions, SharedRwLock, async_waiters, block_on};
use cxc_testkit::{Rng, RoleCommand, in_role, path_arg, report, wait_until};

mod reactor;
use reactor::{serial, tokio_runtime};

type P = [u64; 4];

/// The reactor to this test alone ([`serial`]), and a new lock (grace `grace`) in a
/// fresh directory.
fn serial_lock(
    grace: Duration,
) -> (
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
    Arc<SharedRwLock<P>>,
) {
    let s = serial();
    let dir = tempfile::tempdir().unwrap();
    let l = lock(&dir, grace);
    (s, dir, l)
}

fn lock(dir: &tempfile::TempDir, grace: Duration) -> Arc<SharedRwLock<P>> {
    Arc::new(
        SharedRwLock::create_with(
            dir.path().join("rw"),
            [0; 4],
            &RwLockOptions::default().grace(grace),
        )
        .unwrap(),
    )
}

/// Readers wait while a writer holds, then all hold at once; the value they read is the
/// writer's.
#[test]
fn readers_wait_for_the_writer_then_share() {
    let (_s, _dir, l) = serial_lock(Duration::from_secs(5));
    let rt = tokio_runtime();
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    rt.block_on(async {
        let w = l.write_async().await;
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (l, inside, peak) = (l.clone(), inside.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                let r = l.read_async().await;
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                // Hold until every reader is in (they all can be: no writer waits).
                while inside.load(Ordering::SeqCst) < 20 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let v = r.get();
                drop(r);
                v
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            inside.load(Ordering::SeqCst),
            0,
            "a reader got in past the writer"
        );
        assert!(async_waiters() >= 1, "readers wait on the reactor");
        w.write([9; 4]).unwrap();
        drop(w);
        for t in tasks {
            assert_eq!(t.await.unwrap(), [9; 4]);
        }
    });
    assert_eq!(peak.load(Ordering::SeqCst), 20, "all readers held at once");
    assert!(wait_until(Duration::from_secs(1), || async_waiters() == 0));
}

/// An async writer behind a reader installs its claim (new readers back off: writer
/// preference) and gets the lock once the reader leaves.
#[test]
fn writer_waits_for_readers_with_preference() {
    let (_s, _dir, l) = serial_lock(Duration::from_secs(5));
    let r = l.read();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let w = block_on(l.write_async());
            let t = Instant::now();
            w.write([1; 4]).unwrap();
            t
        });
        // The writer claimed: a new reader is refused while it drains.
        assert!(
            wait_until(Duration::from_secs(2), || l.try_read().is_none()),
            "a draining async writer did not hold new readers back"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished(), "the writer got in past a reader");
        let released = Instant::now();
        drop(r);
        let got = writer.join().unwrap();
        assert!(got.duration_since(released) < Duration::from_millis(500));
    });
    assert_eq!(l.read().get(), [1; 4]);
    assert!(wait_until(Duration::from_secs(1), || async_waiters() == 0));
}

/// A write future dropped while draining gives its claim up: readers get in at once.
#[test]
fn dropping_a_draining_write_future_gives_up_its_claim() {
    let (_s, _dir, l) = serial_lock(Duration::from_secs(5));
    let r = l.read();
    let mut fut = Box::pin(l.write_async());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert!(l.try_read().is_none(), "claimed: new readers back off");
    assert_eq!(async_waiters(), 1);
    drop(fut);
    assert_eq!(async_waiters(), 0);
    assert!(l.try_read().is_some(), "the claim was given up");
    drop(r);
    assert!(l.try_write().is_some());
}

/// Futures dropped at random points (tokio timeouts) leave nothing behind, and the
/// writes that completed are all counted; an in-process counter of holders shows no
/// writer ever together with anyone.
#[test]
fn random_cancellation_and_exclusion_under_many_tasks() {
    let (_s, _dir, l) = serial_lock(Duration::from_secs(5));
    let rt = tokio_runtime();
    let mut rng = Rng::for_test();
    // > 0: readers inside; -1: a writer inside.
    let holders = Arc::new(AtomicI64::new(0));
    let written = Arc::new(AtomicU32::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..400 {
            let (l, holders, written) = (l.clone(), holders.clone(), written.clone());
            let write = rng.percent(30);
            let hold = Duration::from_micros(rng.below(1_500));
            let cancel_after = Duration::from_micros(rng.below(15_000));
            tasks.push(tokio::spawn(async move {
                if write {
                    if let Ok(w) = tokio::time::timeout(cancel_after, l.write_async()).await {
                        assert_eq!(
                            holders.compare_exchange(0, -1, Ordering::SeqCst, Ordering::SeqCst),
                            Ok(0)
                        );
                        tokio::time::sleep(hold).await;
                        w.update(|v| v[0] += 1).unwrap();
                        holders.store(0, Ordering::SeqCst);
                        drop(w);
                        written.fetch_add(1, Ordering::SeqCst);
                    }
                } else if let Ok(r) = tokio::time::timeout(cancel_after, l.read_async()).await {
                    assert!(
                        holders.fetch_add(1, Ordering::SeqCst) >= 0,
                        "reader with a writer"
                    );
                    tokio::time::sleep(hold).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    drop(r);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert!(wait_until(Duration::from_secs(1), || async_waiters() == 0));
    let w = written.load(Ordering::SeqCst);
    assert!(w > 0, "some writes completed");
    let t0 = Instant::now();
    let g = l
        .write_timeout(Duration::from_secs(1))
        .expect("the lock is free");
    assert!(t0.elapsed() < Duration::from_millis(100));
    assert_eq!(g.read().unwrap()[0], u64::from(w));
}

/// A writer process SIGKILLed while holding is evicted at once for waiting async
/// readers; a writer process SIGSTOPped while holding is evicted after the grace for a
/// waiting async writer, and its later write is refused.
#[test]
fn killed_and_stopped_writers_in_other_processes_are_replaced() {
    if in_role("writer") {
        let l = SharedRwLock::<P>::open(path_arg("path")).unwrap();
        let w = l.write();
        w.write([5; 4]).unwrap();
        report("holding");
        // Stopped here by the parent (or killed); on resume the write is refused.
        std::thread::sleep(Duration::from_millis(1500));
        report(match w.write([6; 4]) {
            Ok(()) => "write=accepted",
            Err(_) => "write=refused",
        });
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let (_s, dir, l) = serial_lock(Duration::from_millis(300));
    let test = "killed_and_stopped_writers_in_other_processes_are_replaced";
    let path = dir.path().join("rw");

    let mut kid = RoleCommand::new(test, "writer").arg("path", &path).spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "holding");
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let r = block_on(l.read_async());
            (Instant::now(), r.get())
        });
        std::thread::sleep(Duration::from_millis(100));
        let killed = Instant::now();
        kid.kill();
        let (got, v) = reader.join().unwrap();
        assert_eq!(v, [5; 4], "the dead writer's published write stays");
        let after = got.duration_since(killed);
        assert!(
            after < Duration::from_millis(250),
            "dead writer replaced after {after:?}"
        );
    });

    let mut kid = RoleCommand::new(test, "writer").arg("path", &path).spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "holding");
    kid.stop();
    let t0 = Instant::now();
    let w = block_on(l.write_async());
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "stopped writer evicted after {waited:?} (grace 300 ms)"
    );
    w.write([7; 4]).unwrap();
    drop(w);
    kid.cont();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "write=refused");
    assert_eq!(
        l.read().get(),
        [7; 4],
        "the evicted writer's write is not visible"
    );
    kid.kill();
    let c = l.counters();
    let get = |n: &str| c.iter().find(|(k, _)| *k == n).unwrap().1;
    assert!(
        get("evicted_dead") >= 1 && get("evicted_stale") >= 1,
        "{c:?}"
    );
}

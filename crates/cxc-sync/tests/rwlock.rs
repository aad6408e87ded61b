//! SharedRwLock in one process: the file, the API, exclusion between threads, writer
//! preference, timeouts, and eviction of a stalled writer with fencing.
#![cfg(not(cxc_loom))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{RwLockError, RwLockOptions, SharedRwLock, WriteGuardError};

fn opts() -> RwLockOptions {
    RwLockOptions::default().grace(Duration::from_millis(150))
}

/// A new `SharedRwLock<u64>` holding `value` (grace 150 ms) in a fresh directory, shared
/// between threads.
fn shared_lock(value: u64) -> (tempfile::TempDir, Arc<SharedRwLock<u64>>) {
    let dir = tempfile::tempdir().unwrap();
    let lock = SharedRwLock::create_with(dir.path().join("l.rw"), value, &opts()).unwrap();
    (dir, Arc::new(lock))
}

#[test]
fn create_open_read_write_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.rw");
    let lock = SharedRwLock::<[u64; 2]>::create(&path, [1, 2]).unwrap();
    assert!(matches!(
        SharedRwLock::<[u64; 2]>::create(&path, [0, 0]),
        Err(RwLockError::File(_))
    ));
    let other = SharedRwLock::<[u64; 2]>::open(&path).unwrap();
    assert_eq!(other.read().get(), [1, 2]);
    let t1 = {
        let w = lock.write();
        assert_eq!(w.read().unwrap(), [1, 2]);
        w.write([3, 4]).unwrap();
        w.update(|v| v[1] += 1).unwrap();
        assert_eq!(w.read().unwrap(), [3, 5]);
        w.token()
    };
    let w = other.try_write().unwrap();
    assert!(w.token() > t1);
    assert_eq!(lock.current_token(), w.token());
    w.unlock().unwrap();
    assert_eq!(lock.read().get(), [3, 5]);
    // Another payload type is refused at open.
    assert!(matches!(
        SharedRwLock::<u32>::open(&path),
        Err(RwLockError::File(_))
    ));
    // Too large a payload is refused at create.
    assert!(matches!(
        SharedRwLock::<[u64; 9]>::create(dir.path().join("b.rw"), [0; 9]),
        Err(RwLockError::PayloadTooLarge { max: 64, found: 72 })
    ));
    let (_, origin) =
        SharedRwLock::<[u64; 2]>::create_or_open(&path, [9, 9], &RwLockOptions::default()).unwrap();
    assert_eq!(origin, cxc_mmf::Origin::Opened);
}

#[test]
fn writer_excludes_readers_and_readers_share() {
    let dir = tempfile::tempdir().unwrap();
    let lock = SharedRwLock::<u64>::create(dir.path().join("x.rw"), 0).unwrap();
    let r1 = lock.read();
    let r2 = lock.try_read().unwrap();
    assert!(lock.try_write().is_none());
    assert!(lock.write_timeout(Duration::from_millis(30)).is_none());
    // A writer that gave up let readers in again.
    let r3 = lock.try_read().unwrap();
    drop((r1, r2, r3));
    let w = lock.try_write().unwrap();
    assert!(lock.try_read().is_none());
    assert!(lock.read_timeout(Duration::from_millis(30)).is_none());
    assert!(lock.try_write().is_none());
    drop(w);
    assert!(lock.try_read().is_some());
}

#[test]
fn writer_preference_blocks_new_readers() {
    let dir = tempfile::tempdir().unwrap();
    let lock = Arc::new(SharedRwLock::<u64>::create(dir.path().join("p.rw"), 0).unwrap());
    let r = lock.read();
    let l2 = Arc::clone(&lock);
    let writer = std::thread::spawn(move || {
        let w = l2.write();
        w.write(1).unwrap();
    });
    // Once the writer waits, a new reader must wait too.
    assert!(cxc_testkit::wait_until(Duration::from_secs(5), || {
        lock.try_read().is_none()
    }));
    assert!(lock.read_timeout(Duration::from_millis(20)).is_none());
    drop(r);
    writer.join().unwrap();
    assert_eq!(lock.read().get(), 1);
}

#[test]
fn threads_never_share_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let lock = Arc::new(SharedRwLock::<[u64; 2]>::create(dir.path().join("t.rw"), [0, 0]).unwrap());
    // > 0: readers inside; -1: a writer inside.
    let inside = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for t in 0..4 {
        let (lock, inside, stop, writes) = (
            Arc::clone(&lock),
            Arc::clone(&inside),
            Arc::clone(&stop),
            Arc::clone(&writes),
        );
        hs.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if t % 2 == 0 {
                    let w = lock.write();
                    assert_eq!(inside.swap(-1, Ordering::SeqCst), 0, "writer with others");
                    let [a, b] = w.read().unwrap();
                    assert_eq!(a, b, "torn payload");
                    w.write([a + 1, b + 1]).unwrap();
                    assert_eq!(inside.swap(0, Ordering::SeqCst), -1);
                    writes.fetch_add(1, Ordering::Relaxed);
                } else {
                    let r = lock.read();
                    assert!(
                        inside.fetch_add(1, Ordering::SeqCst) >= 0,
                        "reader with writer"
                    );
                    let [a, b] = r.get();
                    assert_eq!(a, b, "torn payload");
                    assert!(inside.fetch_sub(1, Ordering::SeqCst) >= 1);
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let n = writes.load(Ordering::Relaxed);
    assert!(n > 0);
    assert_eq!(lock.read().get(), [n, n]);
}

#[test]
fn stalled_writer_is_evicted_and_fenced() {
    let (_dir, lock) = shared_lock(5);
    let stalled = lock.write();
    let old = stalled.token();
    let t0 = Instant::now();
    let l2 = Arc::clone(&lock);
    let taker = std::thread::spawn(move || {
        let w = l2.write();
        w.write(6).unwrap();
        w.token()
    });
    let new = taker.join().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "evicted before the grace"
    );
    assert!(new > old);
    // The stalled guard finds out: its writes are refused and never visible.
    assert!(!stalled.is_current());
    assert_eq!(stalled.write(99), Err(WriteGuardError::Lost { token: old }));
    assert_eq!(stalled.read(), Err(WriteGuardError::Lost { token: old }));
    assert_eq!(stalled.unlock(), Err(WriteGuardError::Lost { token: old }));
    assert_eq!(lock.read().get(), 6);
    let stale = lock
        .counters()
        .into_iter()
        .find(|(n, _)| *n == "evicted_stale")
        .unwrap()
        .1;
    assert_eq!(stale, 1);
}

#[test]
fn beating_writer_is_not_evicted() {
    let (_dir, lock) = shared_lock(0);
    let w = lock.write();
    let l2 = Arc::clone(&lock);
    let reader = std::thread::spawn(move || l2.read().get());
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(50));
        w.beat().unwrap();
    }
    w.write(3).unwrap();
    drop(w);
    assert_eq!(reader.join().unwrap(), 3);
}

#[test]
fn evicted_writers_buffers_are_freed() {
    let (_dir, lock) = shared_lock(0);
    // Eight evictions in a row: each stalled guard frees its quarantined buffer when it
    // finds out, so buffers never run out.
    for i in 0..8 {
        let stalled = lock.write();
        let l2 = Arc::clone(&lock);
        let t = std::thread::spawn(move || l2.write().write(i).unwrap());
        t.join().unwrap();
        assert!(stalled.write(100).is_err());
    }
    assert_eq!(lock.read().get(), 7);
}

/// The sidecar wiring: a raw handle records nothing; a handle in a `SidecarBox` records
/// its waits, the evictions it makes and its refused writes into the file's ring; a
/// strategy published through one handle is seen by the other.
#[test]
fn sidecar_records_waits_evictions_and_refused_writes() {
    use cxc_sidecar::{AdaptiveInstance, OpCode, Sidecar, SidecarBox, Strategy, flags};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.rw");
    let raw = SharedRwLock::<u64>::create_with(&path, 0, &opts()).unwrap();
    {
        let _w = raw.write();
        assert!(raw.read_timeout(Duration::from_millis(10)).is_none());
    }
    assert!(
        raw.ring().snapshot().is_empty(),
        "raw handles record nothing"
    );

    static SC: Sidecar = Sidecar::new();
    let boxed = SidecarBox::new_in(&SC, SharedRwLock::<u64>::open(&path).unwrap(), None);
    // A read that times out behind a writer.
    let w = raw.write();
    assert!(boxed.read_timeout(Duration::from_millis(20)).is_none());
    // The writer makes no progress: the boxed writer evicts it after the grace.
    let bw = boxed
        .write_timeout(Duration::from_secs(5))
        .expect("stale writer evicted");
    drop(bw);
    assert!(w.write(5).is_err());
    drop(w);
    // Now the boxed handle's writer is evicted (by the raw one) and its write refused.
    let bw = boxed.write();
    let rw = raw
        .write_timeout(Duration::from_secs(5))
        .expect("stale writer evicted");
    drop(rw);
    assert!(matches!(bw.write(1), Err(WriteGuardError::Lost { .. })));
    drop(bw);

    let seen: Vec<(OpCode, u16)> = boxed
        .ring()
        .snapshot()
        .into_iter()
        .map(|o| (o.op, o.flags))
        .collect();
    let ops: Vec<OpCode> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        ops,
        vec![
            OpCode::RwReadWait,
            OpCode::RwEvictStale,
            OpCode::RwWriteWait,
            OpCode::RwStaleRejected,
        ],
        "{seen:?}"
    );
    assert!(seen[0].1 & flags::WAIT_TIMED_OUT != 0);
    assert!(seen[2].1 & flags::WAIT_TIMED_OUT == 0);
    let report = SC.poll();
    assert_eq!(report.instances.len(), 1);
    let counters = boxed.counters();
    assert!(counters.contains(&("evicted_stale", 2)), "{counters:?}");

    let generation = boxed.apply(Strategy::Park);
    assert_eq!(raw.handshake().current(), (Strategy::Park, generation));
    // With the strategy published, a blocked reader parks without spinning.
    let w = raw.write();
    assert!(boxed.read_timeout(Duration::from_millis(20)).is_none());
    drop(w);
    let last = boxed.ring().snapshot().pop().unwrap();
    assert_eq!(last.op, OpCode::RwReadWait);
    assert!(last.flags & flags::WAIT_PARKED != 0, "{last:?}");
}

/// Payloads that do not fill a buffer, or fill it exactly: readers and writers see the
/// bytes last written, whatever the other buffers held before.
#[test]
fn odd_sized_and_full_payloads_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let small = SharedRwLock::<[u8; 13]>::create(dir.path().join("13.rw"), [1; 13]).unwrap();
    let full = SharedRwLock::<[u8; 64]>::create(dir.path().join("64.rw"), [1; 64]).unwrap();
    for i in 2..20u8 {
        let mut v = [i; 13];
        v[12] = i.wrapping_mul(7);
        small.write().write(v).unwrap();
        assert_eq!(small.read().get(), v);
        let w = full.write();
        assert_eq!(w.read().unwrap(), [i - 1; 64]);
        w.update(|b| *b = [i; 64]).unwrap();
        drop(w);
        assert_eq!(full.read().get(), [i; 64]);
    }
}

/// Timed waits shorter than the grace, back to back, add up to it: a writer without
/// progress is evicted by a caller that waits in slices (as `cxc rwlock run` does to look
/// at signals), not only by one long wait.
#[test]
fn short_timed_waits_in_a_row_evict_a_stalled_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slices.rw");
    let a = SharedRwLock::<u64>::create_with(&path, 0, &opts()).unwrap();
    let b = SharedRwLock::<u64>::open(&path).unwrap();
    let stalled = a.write();
    let t0 = Instant::now();
    let mut slices = 0;
    let got = loop {
        slices += 1;
        if let Some(g) = b.write_timeout(Duration::from_millis(50)) {
            break g;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never evicted");
    };
    assert!(
        slices > 2,
        "evicted within {slices} slices of 50 ms (grace 150 ms)"
    );
    assert!(t0.elapsed() >= Duration::from_millis(140));
    drop(got);
    assert!(matches!(
        stalled.write(1),
        Err(WriteGuardError::Lost { .. })
    ));
}

/// A new rwlock file is `0600` by default (`RwLockOptions::mode`).
#[test]
fn new_rwlock_files_default_to_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let _lock = SharedRwLock::create(&p, 0u64).unwrap();
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

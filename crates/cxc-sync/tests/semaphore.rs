//! SharedSemaphore: the seed's behaviours plus file validation, in one process.
#![cfg(not(cxc_loom))]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use cxc_mmf::MmfError;
use cxc_sync::{SemaphoreError, SemaphoreOptions, SharedSemaphore};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A new semaphore (`permits` of `max` available) in a fresh directory.
fn sem_file(permits: u32, max: u32) -> (tempfile::TempDir, SharedSemaphore) {
    let d = dir();
    let sem = SharedSemaphore::create(d.path().join("s"), permits, max).unwrap();
    (d, sem)
}

#[test]
fn try_acquire_release_cycle() {
    let (_d, sem) = sem_file(2, 2);
    let a = sem.try_acquire().unwrap();
    let b = sem.try_acquire().unwrap();
    assert!(sem.try_acquire().is_none());
    assert_eq!(sem.available(), 0);
    drop(a);
    assert_eq!(sem.available(), 1);
    let c = sem.try_acquire().unwrap();
    drop((b, c));
    assert_eq!(sem.available(), 2);
}

#[test]
fn dropping_a_permit_releases_it() {
    let (_d, sem) = sem_file(1, 1);
    let p = sem.acquire();
    assert_eq!(sem.available(), 0);
    drop(p);
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.holders().iter().map(|h| h.held).sum::<u32>(), 0);
}

#[test]
fn release_at_max_is_rejected() {
    let (_d, sem) = sem_file(3, 3);
    assert!(!sem.release());
    assert_eq!(sem.available(), 3);
    let p = sem.acquire();
    std::mem::forget(p);
    assert!(sem.release());
    assert!(!sem.release());
    assert_eq!(sem.available(), 3);
    assert_eq!(sem.stats().overflow_rejected, 2);
}

#[test]
fn two_handles_see_each_other() {
    let d = dir();
    let path = d.path().join("s");
    let a = SharedSemaphore::create(&path, 2, 2).unwrap();
    let b = SharedSemaphore::open(&path).unwrap();
    let p = a.acquire();
    assert_eq!(b.available(), 1);
    let q = b.try_acquire().unwrap();
    assert!(a.try_acquire().is_none());
    drop(p);
    assert_eq!(b.available(), 1);
    // A permit taken through one handle, released through the other (one process).
    std::mem::forget(q);
    assert!(a.release());
    assert_eq!(b.available(), 2);
    // Both handles share this process's one holder slot.
    assert_eq!(a.holders().len(), 1);
    assert_eq!(a.holders()[0].held, 0);
}

#[test]
fn acquire_blocks_until_release() {
    let (_d, sem) = sem_file(1, 1);
    let held = sem.acquire();
    let got = AtomicU32::new(0);
    thread::scope(|s| {
        s.spawn(|| {
            let _p = sem.acquire();
            got.store(1, Ordering::SeqCst);
        });
        thread::sleep(Duration::from_millis(100));
        assert_eq!(
            got.load(Ordering::SeqCst),
            0,
            "acquired while the permit was held"
        );
        drop(held);
    });
    assert_eq!(got.load(Ordering::SeqCst), 1);
    assert_eq!(sem.available(), 1);
}

#[test]
fn acquire_timeout_none_then_some() {
    let (_d, sem) = sem_file(1, 1);
    let sem = Arc::new(sem);
    let held = sem.acquire();
    let t0 = Instant::now();
    assert!(sem.acquire_timeout(Duration::from_millis(50)).is_none());
    assert!(t0.elapsed() >= Duration::from_millis(50));
    assert_eq!(sem.stats().timeouts, 1);

    // The permit is released from another thread: forget the guard here, release there.
    std::mem::forget(held);
    let releaser = {
        let sem = sem.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            assert!(sem.release());
        })
    };
    let t0 = Instant::now();
    let p = sem.acquire_timeout(Duration::from_secs(5));
    assert!(p.is_some(), "not woken by the release");
    assert!(t0.elapsed() < Duration::from_secs(4));
    releaser.join().unwrap();
}

#[test]
fn eight_threads_two_permits() {
    let (_d, sem) = sem_file(2, 2);
    let in_use = AtomicU32::new(0);
    let peak = AtomicU32::new(0);
    thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for i in 0..500 {
                    let _p = sem.acquire();
                    let n = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    assert!(n <= 2, "{n} permits in use");
                    if i % 50 == 0 {
                        thread::yield_now();
                    }
                    in_use.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= 2);
    assert_eq!(sem.available(), 2);
    assert_eq!(sem.holders().iter().map(|h| h.held).sum::<u32>(), 0);
}

#[test]
fn many_waiters_all_acquire() {
    let (_d, sem) = sem_file(0, 1);
    let sem = Arc::new(sem);
    let start = Arc::new(Barrier::new(17));
    let done = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (sem, start, done) = (sem.clone(), start.clone(), done.clone());
            thread::spawn(move || {
                start.wait();
                let p = sem.acquire_timeout(Duration::from_secs(8));
                assert!(p.is_some(), "a waiter never got a permit");
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    start.wait();
    thread::sleep(Duration::from_millis(50));
    assert!(sem.release());
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 16);
    assert_eq!(sem.available(), 1);
}

#[test]
fn forgotten_permit_manual_release() {
    let (_d, sem) = sem_file(1, 1);
    let p = sem.acquire();
    std::mem::forget(p);
    assert_eq!(sem.available(), 0);
    assert_eq!(sem.holders()[0].held, 1, "a forgotten permit is still held");
    assert!(sem.release());
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.holders()[0].held, 0);
}

#[test]
fn disowned_permit_is_not_held() {
    let (_d, sem) = sem_file(2, 2);
    sem.acquire().disown();
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.holders()[0].held, 0);
    assert!(sem.release());
    assert_eq!(sem.available(), 2);
}

#[test]
fn invalid_permits_rejected() {
    let d = dir();
    let path = d.path().join("s");
    assert!(matches!(
        SharedSemaphore::create(&path, 3, 2),
        Err(SemaphoreError::InvalidPermits {
            initial: 3,
            max: 2,
            ..
        })
    ));
    assert!(matches!(
        SharedSemaphore::create(&path, 0, 0),
        Err(SemaphoreError::InvalidPermits { max: 0, .. })
    ));
    assert!(matches!(
        SharedSemaphore::create(&path, 0, SharedSemaphore::MAX_PERMITS + 1),
        Err(SemaphoreError::InvalidPermits { .. })
    ));
    let opts = SemaphoreOptions::default().holders(0);
    assert!(matches!(
        SharedSemaphore::create_with(&path, 1, 1, &opts),
        Err(SemaphoreError::InvalidCapacity { requested: 0, .. })
    ));
    assert!(!path.exists(), "a rejected create left a file");
}

#[test]
fn max_is_stored_in_the_file() {
    let d = dir();
    let path = d.path().join("s");
    let opts = SemaphoreOptions::default().holders(5).mode(0o640);
    let a = SharedSemaphore::create_with(&path, 3, 7, &opts).unwrap();
    let b = SharedSemaphore::open(&path).unwrap();
    assert_eq!(b.max_permits(), 7);
    assert_eq!(b.available(), 3);
    assert_eq!(b.holder_capacity(), 5);
    drop(a);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    // create_or_open agrees only on the same max.
    let (c, origin) = SharedSemaphore::create_or_open(&path, 0, 7, &opts).unwrap();
    assert_eq!(origin, cxc_mmf::Origin::Opened);
    assert_eq!(c.available(), 3);
    assert!(matches!(
        SharedSemaphore::create_or_open(&path, 0, 8, &opts),
        Err(SemaphoreError::File(MmfError::ParamMismatch {
            name: "max_permits",
            found: 7,
            ..
        }))
    ));
    assert!(matches!(
        SharedSemaphore::create(&path, 1, 1),
        Err(SemaphoreError::File(MmfError::AlreadyExists { .. }))
    ));
}

#[test]
fn available_is_correct() {
    let (_d, sem) = sem_file(5, 10);
    assert_eq!(sem.available(), 5);
    let ps: Vec<_> = (0..5).map(|_| sem.acquire()).collect();
    assert_eq!(sem.available(), 0);
    drop(ps);
    assert_eq!(sem.available(), 5);
    for _ in 0..5 {
        assert!(sem.release());
    }
    assert_eq!(sem.available(), 10);
    assert!(!sem.release());
}

#[test]
fn open_rejects_foreign_and_corrupt_files() {
    let d = dir();
    let path = d.path().join("s");
    std::fs::write(&path, b"not a semaphore").unwrap();
    assert!(matches!(
        SharedSemaphore::open(&path),
        Err(SemaphoreError::File(_))
    ));
    assert!(matches!(
        SharedSemaphore::open(d.path().join("missing")),
        Err(SemaphoreError::File(MmfError::NotFound { .. }))
    ));
}

#[test]
fn reclaim_dead_without_dead_holders_is_zero() {
    let (_d, sem) = sem_file(2, 2);
    let _p = sem.acquire();
    assert_eq!(sem.reclaim_dead(), 0);
    assert_eq!(sem.available(), 1);
    assert!(sem.register().is_ok());
    assert_eq!(sem.stats().registered, 1);
}

/// Writes a semaphore-shaped file with arbitrary parameters through the generic file
/// layer: head word 0 is the count word (`avail` permits, no author, sequence 0).
fn forge(path: &std::path::Path, params: [u64; 4], avail: u64) {
    use std::sync::atomic::AtomicU64;
    let layout = cxc_mmf::Layout {
        kind: cxc_mmf::Kind::Semaphore,
        head_size: 2880,
        slot_size: 64,
        capacity: 4,
        payload: cxc_mmf::TypeFingerprint::NONE,
        params,
    };
    cxc_mmf::Mapped::<[AtomicU64; 360], [AtomicU64; 8]>::create(
        path,
        layout,
        &cxc_mmf::CreateOptions::default(),
        |h, _| h[0].store(avail, Ordering::Relaxed),
    )
    .unwrap();
}

#[test]
fn open_validates_params() {
    let d = dir();
    for (i, (params, name)) in [
        ([0, 2, 0, 0], "max_permits"),
        ([1 << 24, 2, 0, 0], "max_permits"),
        ([4, 1, 0, 0], "protocol"),
        ([4, 3, 0, 0], "protocol"),
        ([4, 2, 0, 9], "reserved param 3"),
    ]
    .into_iter()
    .enumerate()
    {
        let path = d.path().join(format!("bad{i}"));
        forge(&path, params, 0);
        match SharedSemaphore::open(&path) {
            Err(SemaphoreError::File(e @ MmfError::ParamMismatch { name: n, .. })) => {
                assert_eq!(n, name);
                if name == "protocol" {
                    // The message names the version read and the one found.
                    let text = e.to_string();
                    assert!(text.contains("version 2"), "{text}");
                    assert!(text.contains(&format!("version {}", params[1])), "{text}");
                }
            }
            other => panic!("{params:?}: expected a {name} mismatch, got {other:?}"),
        }
    }
}

#[test]
fn other_pid_namespace_is_refused_at_open() {
    let d = dir();
    let path = d.path().join("s");
    // Created "in another pid namespace" (an id no namespace has).
    forge(&path, [2, 2, 1, 0], 2);
    match SharedSemaphore::open(&path) {
        Err(SemaphoreError::ForeignPidNamespace { expected: 1, found }) => assert_ne!(found, 1),
        other => panic!("expected ForeignPidNamespace, got {other:?}"),
    }
}

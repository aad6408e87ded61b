//! SharedSemaphore vs the textbook in-process semaphore `Arc<(Mutex<u32>, Condvar)>`
//! (seed 004), uncontended, single-threaded.
//!
//! Ids are `shared_semaphore/<case>/<impl>`:
//! - `try_acquire`: take a permit without blocking and drop it (release).
//! - `acquire_release`: blocking acquire (a permit is free) and release.
//! - `available`: read the number of free permits.
//!
//! `SharedSemaphore` always tracks which process holds permits (so a dead holder's
//! permits are reclaimed, like SysV `SEM_UNDO`); there is no untracked mode to compare.

use std::hint::black_box;
use std::sync::{Arc, Condvar, Mutex};

use criterion::Criterion;
use cxc::SharedSemaphore;

/// The seed's baseline semaphore.
#[derive(Clone)]
struct CondvarSem(Arc<(Mutex<u32>, Condvar)>);

impl CondvarSem {
    fn new(permits: u32) -> Self {
        CondvarSem(Arc::new((Mutex::new(permits), Condvar::new())))
    }

    fn try_acquire(&self) -> bool {
        let mut n = self.0.0.lock().unwrap();
        if *n > 0 {
            *n -= 1;
            true
        } else {
            false
        }
    }

    fn acquire(&self) {
        let mut n = self.0.0.lock().unwrap();
        while *n == 0 {
            n = self.0.1.wait(n).unwrap();
        }
        *n -= 1;
    }

    fn release(&self) {
        *self.0.0.lock().unwrap() += 1;
        self.0.1.notify_one();
    }

    fn available(&self) -> u32 {
        *self.0.0.lock().unwrap()
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let sem = SharedSemaphore::create(dir.path().join("bench.sem"), 4, 4).unwrap();
    let base = CondvarSem::new(4);

    let mut g = c.benchmark_group("shared_semaphore");
    g.bench_function("try_acquire/semaphore", |b| {
        b.iter(|| drop(black_box(sem.try_acquire())))
    });
    g.bench_function("try_acquire/mutex_condvar", |b| {
        b.iter(|| {
            if black_box(base.try_acquire()) {
                base.release();
            }
        })
    });
    g.bench_function("acquire_release/semaphore", |b| {
        b.iter(|| drop(black_box(sem.acquire())))
    });
    g.bench_function("acquire_release/mutex_condvar", |b| {
        b.iter(|| {
            base.acquire();
            base.release();
        })
    });
    g.bench_function("available/semaphore", |b| {
        b.iter(|| black_box(sem.available()))
    });
    g.bench_function("available/mutex_condvar", |b| {
        b.iter(|| black_box(base.available()))
    });
    g.finish();
    assert_eq!(sem.available(), 4);
}

cxc_benches::bench_main!(bench);

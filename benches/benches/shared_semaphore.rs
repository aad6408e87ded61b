//! SharedSemaphore vs the textbook in-process semaphore `Arc<(Mutex<u32>, Condvar)>`
//! (seed 004), uncontended, single-threaded, and for `try_acquire` and
//! `acquire_release` also vs a fair peer (`fair_condvar`): a `parking_lot` mutex and
//! condvar whose release notifies only when a waiter is recorded. std's `notify_one`
//! makes a system call on every release even when nobody waits, which flatters our ratio
//! against the seed's baseline (issue #18).
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

/// The free permits and the threads waiting for one, under one mutex.
struct FairState {
    permits: u32,
    waiters: u32,
}

/// The fair peer: a counting semaphore on `parking_lot::Mutex` + `parking_lot::Condvar`
/// whose release notifies only when `acquire` recorded a waiter (under the mutex), so an
/// uncontended release costs a lock, an increment and an unlock.
#[derive(Clone)]
struct FairSem(Arc<(parking_lot::Mutex<FairState>, parking_lot::Condvar)>);

impl FairSem {
    fn new(permits: u32) -> Self {
        let state = FairState {
            permits,
            waiters: 0,
        };
        FairSem(Arc::new((
            parking_lot::Mutex::new(state),
            parking_lot::Condvar::new(),
        )))
    }

    fn try_acquire(&self) -> bool {
        let mut s = self.0.0.lock();
        if s.permits > 0 {
            s.permits -= 1;
            true
        } else {
            false
        }
    }

    fn acquire(&self) {
        let mut s = self.0.0.lock();
        while s.permits == 0 {
            s.waiters += 1;
            self.0.1.wait(&mut s);
            s.waiters -= 1;
        }
        s.permits -= 1;
    }

    fn release(&self) {
        let mut s = self.0.0.lock();
        s.permits += 1;
        let wake = s.waiters > 0;
        drop(s);
        // A waiter records itself under the mutex before it sleeps (and `wait` queues it
        // before unlocking), so a waiter not counted here sees the new permit.
        if wake {
            self.0.1.notify_one();
        }
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let sem = SharedSemaphore::create(dir.path().join("bench.sem"), 4, 4).unwrap();
    let base = CondvarSem::new(4);
    let fair = FairSem::new(4);
    fair_peer_blocks_and_wakes();

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
    g.bench_function("try_acquire/fair_condvar", |b| {
        b.iter(|| {
            if black_box(fair.try_acquire()) {
                fair.release();
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
    g.bench_function("acquire_release/fair_condvar", |b| {
        b.iter(|| {
            fair.acquire();
            fair.release();
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
    assert_eq!(base.available(), 4);
    assert!((0..4).all(|_| fair.try_acquire()) && !fair.try_acquire());
}

/// The fair peer is a semaphore: with no permit free, `acquire` sleeps until a release
/// (so skipping `notify_one` when nobody waits loses no wake-up).
fn fair_peer_blocks_and_wakes() {
    let sem = FairSem::new(0);
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire())
    };
    while sem.0.0.lock().waiters == 0 {
        std::thread::yield_now();
    }
    sem.release();
    waiter.join().unwrap();
    assert!(!sem.try_acquire());
}

cxc_benches::bench_main!(bench);

//! SharedRwLock vs a process-shared `pthread_rwlock_t` (PTHREAD_PROCESS_SHARED, in a
//! `MAP_SHARED` file mapping), uncontended, single-threaded, same run.
//!
//! Ids are `shared_rwlock/<case>/<impl>`:
//! - `read_lock_unlock`: take a read lock and drop it.
//! - `write_lock_unlock`: take the write lock and drop it.
//! - `read_get`: read lock, copy an 8-byte payload out, unlock (pthread: the same copy
//!   from the shared page).
//!
//! `SharedRwLock` always tracks which process holds the lock (so a dead holder is
//! reclaimed) and fences evicted writers; the pthread lock does neither (a reader or
//! writer that dies holding it wedges it forever).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use cxc::SharedRwLock;
use cxc_benches::baseline::init_pshared_rwlock;
use cxc_benches::shm::SharedPage;

/// A `pthread_rwlock_t` with PTHREAD_PROCESS_SHARED in a shared mapping.
struct PthreadRwLock(*mut libc::pthread_rwlock_t);

impl PthreadRwLock {
    /// # Safety
    /// `cell` must be valid for writes of a `pthread_rwlock_t`, suitably aligned, unused
    /// by anyone else, and outlive the returned value.
    unsafe fn init(cell: *mut u8) -> Self {
        let l = cell.cast::<libc::pthread_rwlock_t>();
        // SAFETY: `l` is valid for writes of a `pthread_rwlock_t`, aligned, and used by
        // nobody else (the caller's contract).
        unsafe { init_pshared_rwlock(l) };
        PthreadRwLock(l)
    }

    fn read(&self) {
        // SAFETY: `self.0` was initialised by `init` and stays mapped (see `init`).
        let r = unsafe { libc::pthread_rwlock_rdlock(self.0) };
        debug_assert_eq!(r, 0);
    }

    fn write(&self) {
        // SAFETY: as in `read`.
        let r = unsafe { libc::pthread_rwlock_wrlock(self.0) };
        debug_assert_eq!(r, 0);
    }

    fn unlock(&self) {
        // SAFETY: as in `read`; called only by the thread that locked it.
        let r = unsafe { libc::pthread_rwlock_unlock(self.0) };
        debug_assert_eq!(r, 0);
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let lock = SharedRwLock::<u64>::create(dir.path().join("bench.rw"), 7).unwrap();
    let page = SharedPage::open(&dir.path().join("page")).unwrap();
    // SAFETY: cell 0 of the page is 64 bytes, 64-byte aligned, used by nothing else, and
    // `page` outlives `base` (both live until the end of this function).
    let base = unsafe { PthreadRwLock::init(page.cell(0)) };
    let payload = page.counter(0);

    same_run(
        c,
        "read_lock_unlock",
        || drop(black_box(lock.read())),
        || {
            base.read();
            base.unlock();
        },
    );
    same_run(
        c,
        "write_lock_unlock",
        || drop(black_box(lock.write())),
        || {
            base.write();
            base.unlock();
        },
    );
    same_run(
        c,
        "read_get",
        || black_box(lock.read().get()),
        || {
            base.read();
            let v = payload.load(std::sync::atomic::Ordering::Relaxed);
            base.unlock();
            black_box(v)
        },
    );
}

/// Group `shared_rwlock/<case>`: `cxc` then `pthread`, each running its routine.
fn same_run<A, B>(
    c: &mut Criterion,
    case: &str,
    mut cxc: impl FnMut() -> A,
    mut pthread: impl FnMut() -> B,
) {
    let mut g = c.benchmark_group(format!("shared_rwlock/{case}"));
    g.bench_function("cxc", |b| b.iter(&mut cxc));
    g.bench_function("pthread", |b| b.iter(&mut pthread));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);

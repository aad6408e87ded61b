//! OwnerLease vs `std::sync::Mutex` and `parking_lot::Mutex` on the seed's workloads
//! (seed 000 "Bench evidence"). Single-threaded; the lease file lives in a temp dir.
//!
//! Ids are `owner_lease/<case>/<impl>`; `cargo xtask bench` reads the medians and puts
//! them beside the seed's ratios in `docs/BENCHMARKS.md`. `beat` and `am_i_owner` are
//! compared with a mutex lock+unlock (`acquire_release/std_mutex`).
//!
//! The `payload<bytes>_<case>/<impl>` ids repeat `acquire_release`, `read_as_owner_held`
//! and `write_as_owner_held` for `[u64; 1]`, `[u64; 3]` and `[u64; 6]` payloads (8, 24
//! and 48 bytes, issue #18), against mutexes guarding the same array. Before the
//! criterion runs, their ratios to the std mutex are also measured interleaved (see
//! [`interleaved`]) and printed to stderr.

use cxc_benches::stats::{median, ns_per_call};
use std::hint::black_box;
use std::sync::Mutex;

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use cxc::{FromBytes, Immutable, IntoBytes, KnownLayout, OwnerLease};

/// The payload cases for one array type `T`. `make` is a closure (monomorphised and
/// inlined), so no side pays an indirect call per iteration.
///
/// The read rows return the array: criterion's `iter` passes the closure's return value
/// through `black_box` once, so no row adds a second `black_box` (a store and reload of
/// the whole array) on top. Every side builds the written array with the same `make`.
fn payload_case<T>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    dir: &std::path::Path,
    me: u32,
    make: impl Fn(u64) -> T + Copy,
) where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + Default + 'static,
{
    let bytes = size_of::<T>();
    let lease: OwnerLease<T> =
        OwnerLease::create(dir.join(format!("payload{bytes}.lease")), make(0)).unwrap();
    let std_m = Mutex::new(make(0));
    let pl_m = parking_lot::Mutex::new(make(0));
    let id = |case: &str, imp: &str| format!("payload{bytes}_{case}/{imp}");

    g.bench_function(id("acquire_release", "lease"), |b| {
        b.iter(|| {
            black_box(lease.try_acquire(black_box(me), 3));
            black_box(lease.release(black_box(me)));
        })
    });
    g.bench_function(id("acquire_release", "std_mutex"), |b| {
        b.iter(|| drop(black_box(std_m.lock().unwrap())))
    });
    g.bench_function(id("acquire_release", "parking_lot"), |b| {
        b.iter(|| drop(black_box(pl_m.lock())))
    });

    assert!(lease.try_acquire(me, 3));
    g.bench_function(id("read_as_owner_held", "lease"), |b| {
        b.iter(|| lease.read_as_owner(black_box(me)).unwrap_or_default())
    });
    g.bench_function(id("read_as_owner_held", "std_mutex"), |b| {
        b.iter(|| *std_m.lock().unwrap())
    });
    g.bench_function(id("read_as_owner_held", "parking_lot"), |b| {
        b.iter(|| *pl_m.lock())
    });
    let mut x = 0u64;
    g.bench_function(id("write_as_owner_held", "lease"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            lease.write_as_owner(black_box(me), make(black_box(x)))
        })
    });
    // The writes landed: the lease is still held and holds the last array written.
    assert!(
        lease
            .read_as_owner(me)
            .is_some_and(|v| v.as_bytes() == make(x).as_bytes())
    );
    g.bench_function(id("write_as_owner_held", "std_mutex"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            *std_m.lock().unwrap() = make(black_box(x));
        })
    });
    g.bench_function(id("write_as_owner_held", "parking_lot"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            *pl_m.lock() = make(black_box(x));
        })
    });
    assert!(lease.release(me));
}

/// Interleaved check of the payload ratios to the std mutex, printed before the criterion
/// runs (as the seqlock bench does): on a shared machine whose load changes from second
/// to second, criterion's one-function-at-a-time medians can compare a quiet second with
/// a busy one; here every round times 100 000 operations of each side back to back, and
/// the median over 41 rounds of the per-round ratio is printed.
fn interleaved<T>(dir: &std::path::Path, me: u32, make: impl Fn(u64) -> T + Copy)
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + Default + 'static,
{
    const N: u32 = 100_000;
    let bytes = size_of::<T>();
    let lease: OwnerLease<T> =
        OwnerLease::create(dir.join(format!("interleaved{bytes}.lease")), make(0)).unwrap();
    let m = Mutex::new(make(0));
    let mut x = 0u64;
    let mut rows: [Vec<f64>; 3] = Default::default();
    for _ in 0..41 {
        let mutex_lock = ns_per_call(N, || drop(black_box(m.lock().unwrap())));
        let lease_claim = ns_per_call(N, || {
            black_box(lease.try_acquire(black_box(me), 3));
            black_box(lease.release(black_box(me)));
        });
        assert!(lease.try_acquire(me, 3));
        let mutex_read = ns_per_call(N, || {
            black_box(*m.lock().unwrap());
        });
        let lease_read = ns_per_call(N, || {
            black_box(lease.read_as_owner(black_box(me)).unwrap_or_default());
        });
        let mutex_write = ns_per_call(N, || {
            x = x.wrapping_add(1);
            *m.lock().unwrap() = make(black_box(x));
        });
        let lease_write = ns_per_call(N, || {
            x = x.wrapping_add(1);
            black_box(lease.write_as_owner(black_box(me), make(black_box(x))));
        });
        assert!(lease.release(me));
        rows[0].push(lease_claim / mutex_lock);
        rows[1].push(lease_read / mutex_read);
        rows[2].push(lease_write / mutex_write);
    }
    let med = |v: &mut Vec<f64>| median(v);
    eprintln!(
        "owner_lease interleaved {bytes:>2} B: acquire_release/mutex {:.3}, read_as_owner_held/mutex {:.3}, write_as_owner_held/mutex {:.3}",
        med(&mut rows[0]),
        med(&mut rows[1]),
        med(&mut rows[2]),
    );
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let lease: OwnerLease<u64> = OwnerLease::create(dir.path().join("bench.lease"), 0).unwrap();
    let me = std::process::id();
    let std_m = Mutex::new(0u64);
    let pl_m = parking_lot::Mutex::new(0u64);

    interleaved(dir.path(), me, |x| [x]);
    interleaved(dir.path(), me, |x| [x; 3]);
    interleaved(dir.path(), me, |x| [x; 6]);

    let mut g = c.benchmark_group("owner_lease");
    g.bench_function("acquire_release/lease", |b| {
        b.iter(|| {
            black_box(lease.try_acquire(black_box(me), 3));
            black_box(lease.release(black_box(me)));
        })
    });
    g.bench_function("acquire_release/std_mutex", |b| {
        b.iter(|| drop(black_box(std_m.lock().unwrap())))
    });
    g.bench_function("acquire_release/parking_lot", |b| {
        b.iter(|| drop(black_box(pl_m.lock())))
    });

    g.bench_function("with_lease/lease", |b| {
        b.iter(|| black_box(lease.with_lease(black_box(me), 3, |v| *v = v.wrapping_add(1))))
    });
    g.bench_function("with_lease/std_mutex", |b| {
        b.iter(|| {
            let mut v = std_m.lock().unwrap();
            *v = v.wrapping_add(1);
        })
    });
    g.bench_function("with_lease/parking_lot", |b| {
        b.iter(|| {
            let mut v = pl_m.lock();
            *v = v.wrapping_add(1);
        })
    });

    // Held-lease ops: acquire once, then many ops (the mutex pays lock+op+unlock per op).
    assert!(lease.try_acquire(me, 3));
    g.bench_function("read_as_owner_held/lease", |b| {
        // black_box the u64 (as the mutex rows do), not the 16-byte `Option<u64>`: its
        // store/reload through the stack is a store-forwarding stall that cost more than
        // the read itself (perf annotate).
        b.iter(|| black_box(lease.read_as_owner(black_box(me)).unwrap_or_default()))
    });
    g.bench_function("read_as_owner_held/std_mutex", |b| {
        b.iter(|| black_box(*std_m.lock().unwrap()))
    });
    g.bench_function("read_as_owner_held/parking_lot", |b| {
        b.iter(|| black_box(*pl_m.lock()))
    });
    let mut x = 0u64;
    g.bench_function("write_as_owner_held/lease", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            black_box(lease.write_as_owner(black_box(me), black_box(x)))
        })
    });
    g.bench_function("write_as_owner_held/std_mutex", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            *std_m.lock().unwrap() = black_box(x);
        })
    });
    g.bench_function("write_as_owner_held/parking_lot", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            *pl_m.lock() = black_box(x);
        })
    });
    g.bench_function("beat/lease", |b| {
        b.iter(|| black_box(lease.beat(black_box(me))))
    });
    g.bench_function("am_i_owner/lease", |b| {
        b.iter(|| black_box(lease.am_i_owner(black_box(me))))
    });
    assert!(lease.release(me));

    payload_case(&mut g, dir.path(), me, |x| [x]);
    payload_case(&mut g, dir.path(), me, |x| [x; 3]);
    payload_case(&mut g, dir.path(), me, |x| [x; 6]);
    g.finish();
}

cxc_benches::bench_main!(bench);

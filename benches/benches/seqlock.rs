//! `SeqLock` (heap) and `SharedCell` (mapped file) vs a `std::sync::Mutex` doing the same
//! copy, for 8-, 24- and 48-byte payloads (issue #20). Single-threaded, uncontended.
//!
//! Ids are `seqlock/<op>_<bytes>/<impl>`: `read` (SeqLock `read`, SharedCell `load`,
//! mutex lock + copy out + unlock) and `write` (SeqLock `write`, SharedCell `store`,
//! mutex lock + copy in + unlock). Targets: read ≤ 0.15× the mutex, write ≤ 0.8×.
//! Before the criterion runs, the same ratios are measured interleaved (see
//! [`interleaved`]) and printed to stderr.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Duration;

use cxc_benches::stats::{median, ns_per_call};

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use cxc::{FromBytes, Immutable, IntoBytes, KnownLayout, SeqLock, SharedCell};

/// `make` is a closure (monomorphised and inlined), not a function pointer: an indirect
/// call per iteration would add the same few nanoseconds to every side and blur the
/// ratios.
fn case<T>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    dir: &std::path::Path,
    make: impl Fn(u64) -> T + Copy,
) where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + 'static,
{
    let bytes = size_of::<T>();
    let lock = SeqLock::new(make(0)).unwrap();
    let cell = SharedCell::create(dir.join(format!("b{bytes}.cell")), make(0)).unwrap();
    let m = Mutex::new(make(0));

    // The read rows return the value: criterion's `iter` already passes it through
    // `black_box`, and a second `black_box` would add a store and reload of the whole
    // value to every side (for 48 bytes, about as much as the SeqLock read itself).
    g.bench_function(format!("read_{bytes}/seqlock"), |b| b.iter(|| lock.read()));
    g.bench_function(format!("read_{bytes}/shared_cell"), |b| {
        b.iter(|| cell.load())
    });
    g.bench_function(format!("read_{bytes}/std_mutex"), |b| {
        b.iter(|| *m.lock().unwrap())
    });
    let mut x = 0u64;
    g.bench_function(format!("write_{bytes}/seqlock"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            black_box(lock.write(make(black_box(x))).is_ok())
        })
    });
    g.bench_function(format!("write_{bytes}/shared_cell"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            black_box(cell.store(make(black_box(x))).is_ok())
        })
    });
    g.bench_function(format!("write_{bytes}/std_mutex"), |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            *m.lock().unwrap() = make(black_box(x));
        })
    });
}

/// Interleaved check of the same ratios, printed before the criterion runs: on a shared
/// machine whose load changes from second to second, criterion's one-function-at-a-time
/// medians can compare a quiet second with a busy one; here every round times 100 000
/// operations of each side back to back, and the median over 41 rounds of the per-round
/// ratio is printed.
fn interleaved<T>(dir: &std::path::Path, make: impl Fn(u64) -> T + Copy)
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + 'static,
{
    const N: u32 = 100_000;
    let bytes = size_of::<T>();
    let lock = SeqLock::new(make(0)).unwrap();
    let cell = SharedCell::create(dir.join(format!("i{bytes}.cell")), make(0)).unwrap();
    let m = Mutex::new(make(0));
    let mut x = 0u64;
    let mut rows: [Vec<f64>; 4] = Default::default();
    for _ in 0..41 {
        let mutex_read = ns_per_call(N, || {
            black_box(*m.lock().unwrap());
        });
        let lock_read = ns_per_call(N, || {
            black_box(lock.read());
        });
        let cell_read = ns_per_call(N, || {
            black_box(cell.load());
        });
        let mutex_write = ns_per_call(N, || {
            x = x.wrapping_add(1);
            *m.lock().unwrap() = make(black_box(x));
        });
        let lock_write = ns_per_call(N, || {
            x = x.wrapping_add(1);
            black_box(lock.write(make(black_box(x))).is_ok());
        });
        let cell_write = ns_per_call(N, || {
            x = x.wrapping_add(1);
            black_box(cell.store(make(black_box(x))).is_ok());
        });
        rows[0].push(lock_read / mutex_read);
        rows[1].push(cell_read / mutex_read);
        rows[2].push(lock_write / mutex_write);
        rows[3].push(cell_write / mutex_write);
    }
    let med = |v: &mut Vec<f64>| median(v);
    eprintln!(
        "seqlock interleaved {bytes:>2} B: read/mutex {:.3}, load/mutex {:.3}, write/mutex {:.3}, store/mutex {:.3}",
        med(&mut rows[0]),
        med(&mut rows[1]),
        med(&mut rows[2]),
        med(&mut rows[3]),
    );
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    interleaved(dir.path(), |x| x);
    interleaved(dir.path(), |x| [x; 3]);
    interleaved(dir.path(), |x| [x; 6]);
    let mut g = c.benchmark_group("seqlock");
    case(&mut g, dir.path(), |x| x);
    case(&mut g, dir.path(), |x| [x; 3]);
    case(&mut g, dir.path(), |x| [x; 6]);
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800));
    targets = bench
}
criterion_main!(benches);

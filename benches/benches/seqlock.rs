//! `SeqLock` (heap) and `SharedCell` (mapped file) vs a `std::sync::Mutex` doing the same
//! copy, for 8-, 24- and 48-byte payloads (issue #20). Single-threaded, uncontended.
//!
//! Ids are `seqlock/<op>_<bytes>/<impl>`: `read` (SeqLock `read`, SharedCell `load`,
//! mutex lock + copy out + unlock) and `write` (SeqLock `write`, SharedCell `store`,
//! mutex lock + copy in + unlock). Targets: read ≤ 0.15× the mutex, write ≤ 0.8×.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use cxc::{FromBytes, Immutable, IntoBytes, KnownLayout, SeqLock, SharedCell};

fn case<T>(g: &mut BenchmarkGroup<'_, WallTime>, dir: &std::path::Path, make: fn(u64) -> T)
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + 'static,
{
    let bytes = size_of::<T>();
    let lock = SeqLock::new(make(0)).unwrap();
    let cell = SharedCell::create(dir.join(format!("b{bytes}.cell")), make(0)).unwrap();
    let m = Mutex::new(make(0));

    g.bench_function(format!("read_{bytes}/seqlock"), |b| {
        b.iter(|| black_box(lock.read()))
    });
    g.bench_function(format!("read_{bytes}/shared_cell"), |b| {
        b.iter(|| black_box(cell.load()))
    });
    g.bench_function(format!("read_{bytes}/std_mutex"), |b| {
        b.iter(|| black_box(*m.lock().unwrap()))
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

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
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

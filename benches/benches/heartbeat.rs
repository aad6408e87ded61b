//! HeartbeatTable worker-side operations vs a mutex-guarded slot (the naive in-process
//! shape: `Mutex<NaiveSlot>` per slot, `Mutex<Vec<NaiveSlot>>` for registration).
//!
//! Ids are `heartbeat/<case>/<impl>`:
//! - `beat`: record the current epoch in the caller's slot.
//! - `snapshot`: a consistent copy of one slot.
//! - `mark_in_flight`: mark one work unit then clear it again (two real changes per
//!   iteration, so the bitmap does not saturate).
//! - `register_unregister`: take a free slot for a pid and give it back.

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::Criterion;
use cxc::HeartbeatTable;

/// The slot a naive implementation keeps behind a mutex (same fields as the table's).
#[derive(Debug, Clone, Copy, Default)]
struct NaiveSlot {
    pid: u32,
    last_seen: u64,
    bitmap: u64,
    generation: u64,
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let table = HeartbeatTable::create(dir.path().join("hb.cxc"), 64).unwrap();
    let me = std::process::id();
    let slot = table.register(me).unwrap();
    table.tick_global_epoch();

    let epoch = AtomicU64::new(1);
    let naive = Mutex::new(NaiveSlot {
        pid: me,
        ..NaiveSlot::default()
    });
    let pl_naive = parking_lot::Mutex::new(NaiveSlot {
        pid: me,
        ..NaiveSlot::default()
    });
    let naive_table = Mutex::new(vec![NaiveSlot::default(); 64]);

    let mut g = c.benchmark_group("heartbeat");
    g.bench_function("beat/heartbeat", |b| {
        b.iter(|| black_box(table.beat(black_box(slot))))
    });
    g.bench_function("beat/std_mutex", |b| {
        b.iter(|| {
            let now = epoch.load(Ordering::Acquire);
            naive.lock().unwrap().last_seen = black_box(now);
        })
    });
    g.bench_function("beat/parking_lot", |b| {
        b.iter(|| {
            let now = epoch.load(Ordering::Acquire);
            pl_naive.lock().last_seen = black_box(now);
        })
    });

    assert!(table.mark_in_flight(slot, 3));
    g.bench_function("snapshot/heartbeat", |b| {
        b.iter(|| black_box(table.snapshot(black_box(slot))))
    });
    g.bench_function("snapshot/std_mutex", |b| {
        b.iter(|| black_box(*naive.lock().unwrap()))
    });
    g.bench_function("snapshot/parking_lot", |b| {
        b.iter(|| black_box(*pl_naive.lock()))
    });
    assert!(table.clear_in_flight(slot, 3));

    g.bench_function("mark_in_flight/heartbeat", |b| {
        b.iter(|| {
            black_box(table.mark_in_flight(black_box(slot), 7));
            black_box(table.clear_in_flight(black_box(slot), 7));
        })
    });
    g.bench_function("mark_in_flight/std_mutex", |b| {
        b.iter(|| {
            naive.lock().unwrap().bitmap |= black_box(1 << 7);
            naive.lock().unwrap().bitmap &= !black_box(1 << 7);
        })
    });
    g.bench_function("mark_in_flight/parking_lot", |b| {
        b.iter(|| {
            pl_naive.lock().bitmap |= black_box(1 << 7);
            pl_naive.lock().bitmap &= !black_box(1 << 7);
        })
    });

    g.bench_function("register_unregister/heartbeat", |b| {
        b.iter(|| {
            let s = table.register(black_box(me)).unwrap();
            black_box(table.unregister(s));
        })
    });
    g.bench_function("register_unregister/std_mutex", |b| {
        b.iter(|| {
            let now = epoch.load(Ordering::Acquire);
            let i = {
                let mut t = naive_table.lock().unwrap();
                let i = t.iter().position(|s| s.pid == 0).unwrap();
                let s = &mut t[i];
                *s = NaiveSlot {
                    pid: black_box(me),
                    last_seen: now,
                    bitmap: 0,
                    generation: s.generation + 1,
                };
                i
            };
            naive_table.lock().unwrap()[black_box(i)].pid = 0;
        })
    });
    g.finish();
    assert!(table.unregister(slot));
}

cxc_benches::bench_main!(bench);

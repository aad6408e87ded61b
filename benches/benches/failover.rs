//! FailoverWatchdog scans vs the naive `Vec<Mutex<NaiveSlot>>` scan (seed 002).
//!
//! Every registered slot holds in-flight bits, as in the seed ("slots registered + marked +
//! beat"). The table uses clock epochs with a one-day tick, so a scan does not advance
//! the epoch and the alive/dead sets stay exactly as set up for the whole measurement
//! (the seed's bench ticked the epoch on every scan, so after `grace` iterations all 64
//! slots were stale and it measured "64 dead"). The 4 dead slots are made stale once by
//! moving the epoch `grace + 1` ahead and beating the other 60. Workers are registered
//! under pids with no OS identity, so the scans exercise the seed's staleness rule (the
//! periodic OS-identity pass finds nothing to check).
//!
//! Ids are `failover/<case>/<impl>`.

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::Criterion;
use cxc::{EpochMode, FailoverWatchdog, HeartbeatOptions, HeartbeatTable};

const GRACE: u64 = 3;
/// Pids beyond `pid_max` (2^22): never a real process.
const FAKE_PID: u32 = 10_000_000;
const DEAD: [usize; 4] = [5, 21, 37, 53];

/// The naive per-slot record (seed 002's `NaiveHeartbeatSlot`).
#[derive(Debug, Clone, Copy, Default)]
struct NaiveSlot {
    pid: u32,
    last_seen: u64,
    bitmap: u64,
}

/// The seed's scan logic over mutex-guarded slots.
fn naive_scan(slots: &[Mutex<NaiveSlot>], epoch: &AtomicU64) -> Vec<(usize, NaiveSlot)> {
    let now = epoch.load(Ordering::Acquire);
    let mut dead = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        let s = *s.lock().unwrap();
        if s.pid != 0 && now.saturating_sub(s.last_seen) > GRACE && s.bitmap != 0 {
            dead.push((i, s));
        }
    }
    dead
}

fn naive_table(n: usize, dead: &[usize], now: u64) -> Vec<Mutex<NaiveSlot>> {
    (0..n)
        .map(|i| {
            Mutex::new(NaiveSlot {
                pid: FAKE_PID + i as u32,
                last_seen: if dead.contains(&i) { 0 } else { now },
                bitmap: 1 << (i % 64),
            })
        })
        .collect()
}

/// A table of `n` busy workers; `dead` slots are stale by `GRACE + 1` epochs.
fn table(dir: &std::path::Path, name: &str, n: usize, dead: &[usize]) -> HeartbeatTable {
    let opts = HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_secs(86_400),
        },
        ..HeartbeatOptions::default()
    };
    let t = HeartbeatTable::create_with(dir.join(name), n, &opts).unwrap();
    for i in 0..n {
        let s = t.register(FAKE_PID + i as u32).unwrap();
        assert_eq!(s, i);
        assert!(t.mark_in_flight(s, (i % 64) as u8));
    }
    for _ in 0..=GRACE {
        t.tick_global_epoch();
    }
    for i in (0..n).filter(|i| !dead.contains(i)) {
        assert!(t.beat(i));
    }
    t
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let alive64 = table(dir.path(), "alive64", 64, &[]);
    let dead64 = table(dir.path(), "dead64", 64, &DEAD);
    let alive1024 = table(dir.path(), "alive1024", 1024, &[]);
    let epoch = AtomicU64::new(GRACE + 1);
    let now = GRACE + 1;
    let n_alive64 = naive_table(64, &[], now);
    let n_dead64 = naive_table(64, &DEAD, now);
    let n_alive1024 = naive_table(1024, &[], now);

    let w_alive64 = FailoverWatchdog::with_grace(&alive64, GRACE);
    let w_dead64 = FailoverWatchdog::with_grace(&dead64, GRACE);
    let w_alive1024 = FailoverWatchdog::with_grace(&alive1024, GRACE);
    assert!(w_alive64.scan().dead_slots.is_empty());
    assert_eq!(w_dead64.scan().dead_slots.len(), DEAD.len());
    assert!(w_alive1024.scan().dead_slots.is_empty());
    assert_eq!(naive_scan(&n_dead64, &epoch).len(), DEAD.len());

    let mut g = c.benchmark_group("failover");
    g.bench_function("scan_64_alive/watchdog", |b| {
        b.iter(|| black_box(w_alive64.scan()))
    });
    g.bench_function("scan_64_alive/vec_mutex", |b| {
        b.iter(|| black_box(naive_scan(&n_alive64, &epoch)))
    });
    g.bench_function("scan_64_4dead/watchdog", |b| {
        b.iter(|| black_box(w_dead64.scan()))
    });
    g.bench_function("scan_64_4dead/vec_mutex", |b| {
        b.iter(|| black_box(naive_scan(&n_dead64, &epoch)))
    });
    g.bench_function("scan_1024_alive/watchdog", |b| {
        b.iter(|| black_box(w_alive1024.scan()))
    });
    g.bench_function("scan_1024_alive/vec_mutex", |b| {
        b.iter(|| black_box(naive_scan(&n_alive1024, &epoch)))
    });

    // Six set bits, spread over both halves of the bitmap.
    let bitmap: u64 = (1 << 0) | (1 << 7) | (1 << 19) | (1 << 31) | (1 << 40) | (1 << 63);
    g.bench_function("iter_in_flight_bits/watchdog", |b| {
        b.iter(|| {
            FailoverWatchdog::iter_in_flight_bits(black_box(bitmap))
                .fold(0u32, |acc, bit| acc + u32::from(black_box(bit)))
        })
    });
    g.bench_function("iter_in_flight_bits/naive_loop", |b| {
        b.iter(|| {
            let bm = black_box(bitmap);
            (0..64u8)
                .filter(|b| (bm >> b) & 1 == 1)
                .fold(0u32, |acc, bit| acc + u32::from(black_box(bit)))
        })
    });
    g.finish();

    // The dead set must not have drifted during the measurement.
    assert_eq!(w_dead64.scan().dead_slots.len(), DEAD.len());
    assert!(w_alive1024.scan().dead_slots.is_empty());
}

cxc_benches::bench_main!(bench);

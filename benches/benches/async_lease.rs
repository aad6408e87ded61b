//! Async acquire vs blocking acquire (feature `async`): uncontended claim + release, and
//! the wake latency of a waiter asleep while another thread holds the lease and releases.
//!
//! Ids: `async_lease/<case>/<impl>`, with `impl` = `async` (`block_on(lock_async())`) or
//! `blocking` (`lock()`); the ratio async/blocking is the figure of docs/async.md.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cxc::{OwnerLease, block_on};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let lease: Arc<OwnerLease<u64>> = Arc::new(
        OwnerLease::builder(dir.path().join("bench.lease"))
            .create(0)
            .unwrap(),
    );
    let mut g = c.benchmark_group("async_lease");
    g.bench_function("acquire_release/blocking", |b| {
        b.iter(|| drop(black_box(lease.lock())))
    });
    g.bench_function("acquire_release/async", |b| {
        b.iter(|| drop(black_box(block_on(lease.lock_async()))))
    });

    // Wake latency: the waiter is asleep (blocking: on the futex; async: registered with
    // the reactor) when the holder releases; measured from just before the release to
    // the moment the waiter holds the lease.
    for mode in ["blocking", "async"] {
        g.bench_function(format!("wake_latency/{mode}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let held = lease.try_lock().expect("vacant");
                    let go = AtomicBool::new(false);
                    let got = std::thread::scope(|s| {
                        let waiter = s.spawn(|| {
                            go.store(true, Ordering::SeqCst);
                            let g = if mode == "async" {
                                block_on(lease.lock_async())
                            } else {
                                lease.lock()
                            };
                            let t = Instant::now();
                            drop(g);
                            t
                        });
                        while !go.load(Ordering::SeqCst) {
                            std::hint::spin_loop();
                        }
                        // Let the waiter fall asleep.
                        std::thread::sleep(Duration::from_millis(2));
                        let t0 = Instant::now();
                        drop(held);
                        let t1 = waiter.join().unwrap();
                        t1.duration_since(t0)
                    });
                    total += got;
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);

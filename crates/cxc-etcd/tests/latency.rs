//! Latencies of both backends, measured here (quoted in `docs/etcd.md`).
//!
//! By default a short run that only checks the numbers are sane. With
//! `CXC_ETCD_LATENCY_OUT=<file>` it runs 300 samples per operation and 5 failovers and
//! writes a Markdown table of medians (and 90th percentiles) to that file:
//!
//! ```text
//! CXC_ETCD_LATENCY_OUT=/tmp/lat.md cargo test --release -p cxc-etcd --test latency
//! ```

mod common;

use std::time::{Duration, Instant};

use common::{EtcdServer, child, linger};
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, EtcdSemaphore, FencedLease, PermitPool};
use cxc_sync::{LeaseOptions, MmapLease, OwnerLease, Preemption, SharedSemaphore};
use cxc_testkit::{arg, fields, in_role, report};

const TTL: Duration = Duration::from_secs(1);

fn connect(endpoint: &str) -> Etcd {
    Etcd::connect(&[endpoint], EtcdOptions::default().ttl(TTL)).expect("connect")
}

/// Median and 90th percentile.
fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)])
}

fn sample(n: usize, mut f: impl FnMut() -> Duration) -> (Duration, Duration) {
    stats((0..n).map(|_| f()).collect())
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// Claim + release, fenced write, fenced read, beat, on any backend.
fn lease_ops<L: FencedLease<Value = u64>>(lease: &L, n: usize) -> [(Duration, Duration); 4]
where
    L::Error: std::fmt::Debug,
{
    let round_trip = sample(n, || {
        timed(|| {
            let c = lease.try_claim().unwrap().expect("vacant");
            assert!(lease.release(&c).unwrap());
        })
    });
    let c = lease.try_claim().unwrap().expect("vacant");
    let write = sample(n, || timed(|| assert!(lease.write(&c, 1).unwrap())));
    let read = sample(n, || timed(|| assert!(lease.read(&c).unwrap().is_some())));
    let beat = sample(n, || timed(|| assert!(lease.beat(&c).unwrap())));
    assert!(lease.release(&c).unwrap());
    [round_trip, write, read, beat]
}

/// Release by one holder to the return of another's blocked `acquire`.
fn handoff<L: FencedLease<Value = u64> + Sync>(a: &L, b: &L, n: usize) -> (Duration, Duration) {
    sample(n, || {
        let c = a.try_claim().ok().flatten().expect("vacant");
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let got = b.acquire(Duration::from_secs(10)).ok().flatten();
                (got, Instant::now())
            });
            std::thread::sleep(Duration::from_millis(20));
            let released = Instant::now();
            assert!(a.release(&c).is_ok_and(|ok| ok));
            let (got, at) = waiter.join().expect("waiter");
            let got = got.expect("handoff timed out");
            assert!(b.release(&got).is_ok_and(|ok| ok));
            at.saturating_duration_since(released)
        })
    })
}

fn one(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e8 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.0} ms", ns / 1e6)
    }
}

fn fmt(d: (Duration, Duration)) -> String {
    format!("{} | {}", one(d.0), one(d.1))
}

#[test]
fn latencies() {
    if in_role("holder") {
        let lease = EtcdLease::new(&connect(&arg("endpoint")), &arg("key"), 0u64).expect("lease");
        let c = lease
            .acquire(Duration::from_secs(30))
            .unwrap()
            .expect("claim");
        report(format!("gen={}", c.generation()));
        linger();
    }
    let out = std::env::var_os("CXC_ETCD_LATENCY_OUT");
    let (n, failovers) = if out.is_some() { (300, 5) } else { (20, 1) };

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lat.lease");
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    drop(OwnerLease::create_with(&path, 0u64, &opts).expect("create"));
    let mmap = |pid| MmapLease::new(OwnerLease::<u64>::open(&path).expect("open"), pid, 3);
    let (ma, mb) = (mmap(std::process::id()), mmap(40_000_000));
    let mmap_ops = lease_ops(&ma, n);
    let mmap_handoff = handoff(&ma, &mb, n / 10 + 1);
    let sem_path = dir.path().join("lat.sem");
    let sem = SharedSemaphore::create(&sem_path, 1, 1).expect("sem");
    let mmap_sem = sample(n, || {
        timed(|| {
            assert!(sem.try_take().unwrap());
            assert!(sem.give().unwrap());
        })
    });

    let server = EtcdServer::start();
    let endpoint = server.endpoint();
    let ea = EtcdLease::new(&connect(&endpoint), "lat/lease", 0u64).expect("lease");
    let eb = EtcdLease::new(&connect(&endpoint), "lat/lease", 0u64).expect("lease");
    // Warm up the connection and session.
    let c = ea.try_claim().unwrap().expect("vacant");
    assert!(ea.release(&c).unwrap());
    let etcd_ops = lease_ops(&ea, n);
    let etcd_handoff = handoff(&ea, &eb, n / 10 + 1);
    let pool = EtcdSemaphore::open(&connect(&endpoint), "lat/pool", 1).expect("pool");
    let etcd_sem = sample(n, || {
        timed(|| {
            assert!(pool.try_take().unwrap());
            assert!(pool.give().unwrap());
        })
    });

    // Failover: SIGKILL a holder process, time until a blocked acquire gets the lease.
    let watcher = EtcdLease::new(&connect(&endpoint), "lat/failover", 0u64).expect("lease");
    let mut fo = Vec::new();
    for i in 0..failovers {
        let mut kid = child("latencies", "holder", &endpoint, "lat/failover").spawn();
        let g: u64 = fields(&kid.next_report(Duration::from_secs(60)))["gen"]
            .parse()
            .expect("gen");
        // Let the keep-alive cycle run a little, so the kill lands at a random phase.
        std::thread::sleep(Duration::from_millis(500 + 137 * i as u64));
        kid.kill();
        let killed = Instant::now();
        let c = watcher
            .acquire(Duration::from_secs(15))
            .unwrap()
            .expect("no failover within 15 s");
        fo.push(killed.elapsed());
        assert!(c.generation() > g);
        assert!(watcher.release(&c).unwrap());
    }
    let failover = stats(fo);
    assert!(
        failover.0 < TTL + Duration::from_secs(5),
        "failover {failover:?}"
    );

    let Some(out) = out else { return };
    let names = ["claim + release", "fenced write", "fenced read", "beat"];
    let mut t = String::from(
        "| operation | mmap median | mmap p90 | etcd median | etcd p90 |\n|---|---|---|---|---|\n",
    );
    for (i, name) in names.iter().enumerate() {
        t += &format!("| {name} | {} | {} |\n", fmt(mmap_ops[i]), fmt(etcd_ops[i]));
    }
    t += &format!(
        "| handoff (release → blocked acquire returns) | {} | {} |\n",
        fmt(mmap_handoff),
        fmt(etcd_handoff)
    );
    t += &format!(
        "| permit take + give | {} | {} |\n",
        fmt(mmap_sem),
        fmt(etcd_sem)
    );
    t += &format!(
        "| failover after SIGKILL of the holder (etcd TTL 1 s) | – | – | {} |\n",
        fmt(failover)
    );
    t += &format!(
        "\n{n} samples per operation ({failovers} failovers), one client per handle, etcd 3.4 on loopback.\n"
    );
    std::fs::write(out, t).expect("write latency table");
}

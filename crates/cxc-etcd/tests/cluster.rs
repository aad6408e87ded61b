//! A real 3-member etcd cluster on loopback (`common::cluster`): a hung member
//! (SIGSTOP), a killed leader, quorum loss. Members are started by the tests on free
//! loopback ports and stopped by pid.
//!
//! Measured numbers are printed as `cluster-measure: …` lines on stderr (run with
//! `--nocapture` to see them); docs/etcd.md quotes them.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{EtcdCluster, others, serial, starting_with};
use cxc_etcd::{
    Etcd, EtcdClaim, EtcdError, EtcdLease, EtcdSemaphore, FencedLease, KeepAlive, PermitPool,
};

const TTL: Duration = Duration::from_secs(2);

/// A fresh 3-member cluster (holding [`serial`] while the guard lives), its
/// leader, and a follower.
fn three_members() -> (
    std::sync::MutexGuard<'static, ()>,
    EtcdCluster,
    usize,
    usize,
) {
    let one = serial();
    let cluster = EtcdCluster::start(3);
    let leader = cluster.leader();
    (one, cluster, leader, (leader + 1) % 3)
}

fn connect(endpoints: &[String], request_timeout: Duration) -> Etcd {
    common::connect(endpoints, TTL, KeepAlive::Background, request_timeout)
}

/// `n` holders of the leases `<name>/lease<i>`, each on its own connection to all
/// members, preferring member `first(i)`, with its claim.
fn holders(
    cluster: &EtcdCluster,
    n: usize,
    name: &str,
    timeout: Duration,
    first: impl Fn(usize) -> usize,
) -> Vec<(EtcdLease<u64>, EtcdClaim)> {
    (0..n)
        .map(|i| {
            let etcd = connect(&starting_with(cluster, first(i)), timeout);
            let lease = EtcdLease::new(&etcd, &format!("{name}/lease{i}"), 0u64).expect("lease");
            let claim = lease.try_claim().expect("claim").expect("vacant");
            (lease, claim)
        })
        .collect()
}

/// One follower is SIGSTOPped for 20 s (TTL 2 s): none of 8 idle holders connected to all
/// three members (half of them preferring the hung one) loses its claim, and no permit
/// of a full pool is handed out again. Then a permit holder whose only endpoint is hung
/// for longer than the TTL learns its loss through the loss check, before a taker on the
/// healthy members gets the permit.
#[test]
fn hung_follower_loses_no_claim_and_no_permit() {
    let (_one, mut cluster, leader, hung) = three_members();
    let timeout = Duration::from_secs(1);

    // 8 holders, each its own connection to all three members; even ones talk to the
    // member that will hang first.
    let holders = holders(&cluster, 8, "hung", timeout, |i| {
        if i % 2 == 0 { hung } else { leader }
    });
    // A full pool of 3, the holders preferring the member that will hang.
    let pools: Vec<(EtcdSemaphore, _)> = (0..3)
        .map(|_| {
            let etcd = connect(&starting_with(&cluster, hung), timeout);
            let pool = EtcdSemaphore::open(&etcd, "hung/pool", 3).expect("pool");
            let permit = pool
                .try_take_permit()
                .expect("take")
                .expect("a free permit");
            (pool, permit)
        })
        .collect();
    // Observers and a taker on the healthy members only.
    let healthy = connect(&others(&cluster, hung), timeout);
    let observers: Vec<EtcdLease<u64>> = (0..8)
        .map(|i| EtcdLease::new(&healthy, &format!("hung/lease{i}"), 0).expect("observer"))
        .collect();
    let taker = EtcdSemaphore::open(&healthy, "hung/pool", 3).expect("taker");

    cluster.hang(hung);
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU32::new(0));
    let taker_thread = {
        let (stop, taken) = (stop.clone(), taken.clone());
        std::thread::spawn(move || {
            let mut tries = 0u32;
            while !stop.load(Ordering::Relaxed) && tries < 200 {
                tries += 1;
                if taker.try_take_permit().expect("taker's take").is_some() {
                    taken.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            tries
        })
    };
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_secs(2));
        checks += 1;
        for (i, ((lease, claim), observer)) in holders.iter().zip(&observers).enumerate() {
            let held = observer.holder().expect("observer").map(|h| h.1);
            assert_eq!(
                held,
                Some(claim.generation()),
                "holder {i} lost its claim {:.1} s into the hang",
                started.elapsed().as_secs_f64()
            );
            assert!(!lease.is_lost(claim), "holder {i} presumes its claim lost");
        }
        for (i, (pool, permit)) in pools.iter().enumerate() {
            assert!(!pool.is_lost(permit), "permit holder {i} presumes it lost");
            assert_eq!(pool.held(), 1, "permit holder {i}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let tries = taker_thread.join().expect("taker");
    cluster.resume(hung);
    assert!(
        checks >= 9 && tries >= 20,
        "too few checks: {checks}, {tries}"
    );
    assert_eq!(
        taken.load(Ordering::Relaxed),
        0,
        "a permit of the full pool was handed out again"
    );
    for (i, (lease, claim)) in holders.iter().enumerate() {
        assert!(lease.is_current(claim).expect("is_current"), "holder {i}");
        assert!(lease.write(claim, 7).expect("write"), "holder {i}'s write");
    }
    for (i, (pool, permit)) in pools.iter().enumerate() {
        assert!(pool.is_current(permit).expect("is_current"), "permit {i}");
        assert!(pool.lost_permits().is_empty(), "permit {i}");
    }
    let stats: Vec<_> = holders
        .iter()
        .map(|(l, _)| l.keep_alive_stats())
        .chain(pools.iter().map(|(p, _)| p.keep_alive_stats()))
        .collect();
    let max_gap = stats.iter().map(|s| s.max_gap).max().unwrap_or_default();
    let failed: u64 = stats.iter().map(|s| s.failed_attempts).sum();
    let refreshes: u64 = stats.iter().map(|s| s.refreshes).sum();
    assert!(refreshes >= 11 * 20, "too few refreshes: {stats:?}");
    assert!(
        failed >= 1,
        "no keep-alive ever went to the hung member: {stats:?}"
    );
    assert!(max_gap < TTL, "a refresh gap reached the TTL: {stats:?}");
    eprintln!(
        "cluster-measure: hung follower 20 s, TTL 2 s: 0/8 claims lost, 0 of {tries} takes on a full pool succeeded; \
         11 sessions: {refreshes} refreshes, {failed} attempts timed out, longest gap between refreshes {max_gap:?}"
    );

    // A holder whose only endpoint hangs for longer than the TTL really loses its permit.
    let lonely = connect(&[cluster.endpoint(hung)], timeout);
    let pool = EtcdSemaphore::open(&lonely, "hung/lonely", 1).expect("pool");
    let permit = pool.try_take_permit().expect("take").expect("free");
    let rival = EtcdSemaphore::open(&healthy, "hung/lonely", 1).expect("rival");
    assert!(!rival.try_take().expect("rival take"), "pool of 1 is full");
    cluster.hang(hung);
    let hung_at = Instant::now();
    let lost_at: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let pool = Arc::new(pool);
    let watcher = {
        let (pool, lost_at) = (pool.clone(), lost_at.clone());
        std::thread::spawn(move || {
            // The loss notification makes no request: it answers while the endpoint
            // hangs.
            let lost = pool.wait_lost(TTL * 3);
            *lost_at.lock().expect("lock") = Some(hung_at.elapsed());
            lost
        })
    };
    let rival_permit = rival
        .take_permit(TTL * 4)
        .expect("rival take")
        .expect("the lost permit comes back to the pool");
    let rival_at = hung_at.elapsed();
    // The moment the pool handed the permit out again, the old holder's own loss check
    // (a clock check, no request) already says it is lost: etcd cannot expire a session
    // before its local deadline.
    assert!(
        pool.is_lost(&permit),
        "the rival took the permit at {rival_at:?} while its holder still believed it held"
    );
    let lost = watcher.join().expect("watcher");
    let learnt = *lost_at.lock().expect("lock");
    assert!(
        learnt.is_some_and(|t| t < TTL + Duration::from_secs(1)),
        "the loss notification came at {learnt:?}, TTL {TTL:?}"
    );
    assert_eq!(
        lost,
        vec![permit.clone()],
        "the loss check reports the permit once"
    );
    assert_eq!(pool.held(), 0);
    assert!(rival_permit.token() > permit.token(), "tokens grow");
    cluster.resume(hung);
    assert!(!pool.is_current(&permit).expect("is_current"));
    assert!(!pool.give_permit(&permit).expect("give"), "a lost permit");
    assert!(rival.is_current(&rival_permit).expect("rival current"));
    eprintln!(
        "cluster-measure: only endpoint hung, TTL 2 s: loss learnt after {:?}, permit taken over after {rival_at:?}",
        learnt.unwrap_or_default()
    );
}

/// 50 rounds: a write through a hung member times out; through a healthy member the same
/// claim reads and writes twice; the hung member resumes. The late write is never
/// applied, and the handle whose write timed out gets `Conflict` until it reads again.
#[test]
fn late_write_through_a_hung_member_is_never_applied() {
    let (_one, mut cluster, _, hung) = three_members();
    let healthy = connect(&others(&cluster, hung), Duration::from_secs(2));
    let b = EtcdLease::new(&healthy, "late/value", 0u64).expect("lease");
    let claim = b.try_claim().expect("claim").expect("vacant");
    let a_etcd = connect(&[cluster.endpoint(hung)], Duration::from_millis(300));
    let a = EtcdLease::new(&a_etcd, "late/value", 0u64).expect("lease");
    let mut v = a.read(&claim).expect("read").expect("current");
    let (mut timeouts, mut conflicts) = (0, 0);
    for round in 0..50 {
        cluster.hang(hung);
        match a.write(&claim, v + 1) {
            Err(EtcdError::Timeout { .. }) => timeouts += 1,
            other => panic!("round {round}: write through a hung member: {other:?}"),
        }
        assert_eq!(b.read(&claim).expect("read"), Some(v), "round {round}");
        assert!(b.write(&claim, v + 1).expect("write"), "round {round}");
        assert!(b.write(&claim, v + 2).expect("write"), "round {round}");
        cluster.resume(hung);
        // The resumed member answers (and has had the stale request in its buffers).
        // The handle does not know the version: its write sends nothing and says
        // Conflict (after asking whether the claim is current; a Timeout of that question
        // on this loaded machine is asked again, bounded).
        let mut outcome = None;
        for _ in 0..20 {
            match a.write(&claim, 999_999) {
                Err(EtcdError::Timeout { .. }) => continue,
                other => {
                    outcome = Some(other);
                    break;
                }
            }
        }
        match outcome {
            Some(Err(EtcdError::Conflict { .. })) => conflicts += 1,
            other => panic!("round {round}: write after an unknown outcome: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            b.read(&claim).expect("read"),
            Some(v + 2),
            "round {round}: a late write was applied over newer writes"
        );
        // Reading again lets the handle write again. A timed-out attempt is settled by
        // reading again (the version check lets at most one attempt land).
        let mut done = false;
        for _ in 0..20 {
            match a.read(&claim) {
                Ok(Some(x)) if x == v + 3 => {
                    done = true;
                    break;
                }
                Ok(Some(x)) => assert_eq!(x, v + 2, "round {round}"),
                Err(EtcdError::Timeout { .. }) => continue,
                other => panic!("round {round}: read: {other:?}"),
            }
            match a.write(&claim, v + 3) {
                Ok(true) => {
                    done = true;
                    break;
                }
                Err(EtcdError::Timeout { .. } | EtcdError::Conflict { .. }) => continue,
                other => panic!("round {round}: write after a read: {other:?}"),
            }
        }
        assert!(done, "round {round}: the handle never wrote again");
        v += 3;
    }
    assert_eq!((timeouts, conflicts), (50, 50));
    // The whole history of the value: strictly increasing, no value ever went back.
    let history = value_history(&healthy, "late/value.value");
    assert_eq!(
        history.len(),
        150,
        "3 accepted writes per round: {history:?}"
    );
    assert!(
        history.windows(2).all(|w| w[1] > w[0]),
        "the value went back: {history:?}"
    );
    eprintln!("cluster-measure: late writes: 50 rounds, 50 timeouts, 0 late writes applied");
}

/// Every put of `key` from the start of the store, decoded as `u64`.
fn value_history(etcd: &Etcd, key: &str) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut client = etcd.client();
    rt.block_on(async move {
        let opts = etcd_client::WatchOptions::new().with_start_revision(1);
        let mut stream = client.watch(key, Some(opts)).await.expect("watch");
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        // All past events arrive at once; stop when a second passes with nothing new.
        while Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
                Ok(Ok(Some(resp))) => {
                    for ev in resp.events() {
                        if let Some(kv) = ev.kv() {
                            let bytes: [u8; 8] = kv.value().try_into().expect("u64 bytes");
                            out.push(u64::from_ne_bytes(bytes));
                        }
                    }
                }
                _ => break,
            }
        }
        out
    })
}

/// The leader is SIGKILLed: holders on all members keep their claims, and requests work
/// again within an election. Then quorum is lost (two members SIGKILLed) and the whole
/// cluster goes down: every call fails within its timeout; after all members restart,
/// calls made 1 s after the cluster answers succeed on the first try.
#[test]
fn killed_leader_and_quorum_loss() {
    let (_one, mut cluster, leader, _) = three_members();
    let timeout = Duration::from_secs(1);
    let holders = holders(&cluster, 4, "kill", timeout, |i| (leader + i) % 3);
    for (lease, claim) in &holders {
        assert!(lease.write(claim, 1).expect("write"));
    }

    cluster.kill(leader);
    let killed = Instant::now();
    // Failover: the first write through each holder that succeeds, within 10 s of the
    // kill. While the two members left elect a leader they answer "etcdserver: no
    // leader" at once: the retries are paced (10 ms) and bounded by time, not by a count
    // that such answers use up in milliseconds.
    let (pause, limit) = (Duration::from_millis(10), Duration::from_secs(10));
    let mut failover = Duration::ZERO;
    for (i, (lease, claim)) in holders.iter().enumerate() {
        let retry = |what: &str, e: EtcdError| {
            let after = killed.elapsed();
            assert!(
                after < limit,
                "holder {i}: no {what} {after:?} after the kill: {e:?}"
            );
            std::thread::sleep(pause);
        };
        loop {
            match lease.write(claim, 2) {
                Ok(true) => break,
                Ok(false) => panic!("holder {i} lost its claim when the leader died"),
                Err(EtcdError::Conflict { .. }) => {
                    // Re-read (the handle learns the value's version). The read may itself
                    // fail while the cluster elects a new leader: then try again.
                    match lease.read(claim) {
                        Ok(v) => assert_eq!(v.map(|v| v >= 1), Some(true), "holder {i}"),
                        Err(e) => retry("read", e),
                    }
                }
                Err(e) => retry("write", e),
            }
        }
        failover = failover.max(killed.elapsed());
    }
    std::thread::sleep(TTL * 2);
    for (i, (lease, claim)) in holders.iter().enumerate() {
        assert!(lease.is_current(claim).expect("is_current"), "holder {i}");
    }
    eprintln!(
        "cluster-measure: leader SIGKILLed: every holder wrote again after {failover:?}; 0/4 claims lost"
    );
    cluster.restart(leader);
    cluster.wait_healthy(&[0, 1, 2]);

    // Quorum loss: two members down.
    let a = cluster.leader();
    let b = (a + 1) % 3;
    cluster.kill(a);
    cluster.kill(b);
    let mut worst = Duration::ZERO;
    for (lease, claim) in &holders {
        let t = Instant::now();
        let r = lease.write(claim, 3);
        let took = t.elapsed();
        worst = worst.max(took);
        assert!(
            matches!(
                r,
                Err(EtcdError::Timeout { .. }) | Err(EtcdError::Request { .. })
            ),
            "write without quorum: {r:?}"
        );
        assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
        let t = Instant::now();
        let r = lease.holder();
        worst = worst.max(t.elapsed());
        assert!(r.is_err(), "read without quorum: {r:?}");
        assert!(t.elapsed() < timeout + Duration::from_millis(500));
    }
    eprintln!(
        "cluster-measure: quorum lost: every call failed within {worst:?} (timeout {timeout:?})"
    );
    // Then the whole cluster is down, and comes back.
    let c = (b + 1) % 3;
    cluster.kill(c);
    for (lease, _) in &holders {
        let t = Instant::now();
        assert!(lease.holder().is_err(), "read with the cluster down");
        assert!(t.elapsed() < timeout + Duration::from_millis(500));
    }
    for i in [a, b, c] {
        cluster.restart(i);
    }
    cluster.wait_healthy(&[0, 1, 2]);
    let answered = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    for (i, (lease, _)) in holders.iter().enumerate() {
        let t = Instant::now();
        let r = lease.holder();
        assert!(r.is_ok(), "holder {i}: first call after the restart: {r:?}");
        eprintln!(
            "cluster-measure: after the restart (+{:?}): first call of holder {i} ok in {:?}",
            answered.elapsed(),
            t.elapsed()
        );
    }
}

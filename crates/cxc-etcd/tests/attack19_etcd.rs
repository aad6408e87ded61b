//! Attacks on docs/etcd.md with real etcd servers on loopback (one member, or a 3-member
//! cluster whose members are hung by SIGSTOP): loss checks that must make no request
//! (and so must not wait for one), what a handle remembers of its lost sessions, every
//! call while no quorum answers, 30 contenders on a permit pool while members hang and
//! holders are SIGKILLed (checked against etcd's own history of the holder keys), and
//! option and name edge cases.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    EtcdCluster, StopOnDrop, child, connect, keys_under, linger, max_overlap, mono_ns, revoke, rt,
};
use cxc_etcd::{
    Etcd, EtcdError, EtcdLease, EtcdOptions, EtcdSemaphore, FencedLease, KeepAlive, PermitPool,
};
use cxc_testkit::{arg, fields, report, serial, wait_until};

/// If this process is a child, plays its role and exits.
fn child_dispatch() {
    cxc_testkit::play_role!(role_pool_holder);
}

/// The whole history of the keys under `prefix` (a watch from revision 1 up to a
/// sentinel key put last): for every change of them, how many existed after it (the
/// sentinel not counted).
fn live_counts(etcd: &Etcd, prefix: &str) -> Vec<(i64, usize)> {
    let mut c = etcd.client();
    let prefix = prefix.to_owned();
    rt().block_on(async move {
        let sentinel = format!("{prefix}~end-of-history");
        c.put(sentinel.as_str(), "", None)
            .await
            .expect("put sentinel");
        let opts = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(1);
        let mut stream = c.watch(prefix.as_str(), Some(opts)).await.expect("watch");
        let mut live = std::collections::HashSet::new();
        let mut out = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("history within 10 s")
                .expect("watch")
                .expect("stream open");
            for ev in msg.events() {
                let kv = ev.kv().expect("event kv");
                if kv.key() == sentinel.as_bytes() {
                    return out;
                }
                match ev.event_type() {
                    etcd_client::EventType::Put => {
                        live.insert(kv.key().to_vec());
                    }
                    etcd_client::EventType::Delete => {
                        live.remove(kv.key());
                    }
                }
                out.push((kv.mod_revision(), live.len()));
            }
        }
    })
}

/// A claim of a beat-driven handle is presumed lost (no beat within the TTL); the only
/// member then hangs, and one thread of the handle tries to claim again (its session
/// grant waits for the request timeout, 3 s). Meanwhile another thread asks about the
/// old claim. docs/etcd.md: "`EtcdLease::is_lost` (a loss check without a request) and
/// `wait_lost` (a loss notification)"; "The loss notification `wait_lost` ... blocks
/// until then"; `wait_lost(&claim, timeout)`: "blocks until `claim` is known or presumed
/// lost (...; `true`) or `timeout` passes"; and "All but `is_current` work while etcd is
/// unreachable, which is when a permit is lost." None of them may wait for a request.
// Found (fixed since): `is_lost`, `wait_lost(200 ms)` and `read` of a claim already presumed lost take the whole request timeout (~3 s) while a sibling thread's claim grants a new session through a hung member (the session lock is held across the grant).
#[test]
fn loss_checks_never_wait_for_a_sibling_threads_request() {
    let _one = serial();
    let mut cluster = EtcdCluster::start(1);
    let etcd = connect(
        &cluster.endpoints(),
        Duration::from_secs(1),
        KeepAlive::OnBeat,
        Duration::from_secs(3),
    );
    let lease = EtcdLease::new(&etcd, "lc/lease", 0u64).expect("lease");
    let claim = lease.try_claim().expect("claim").expect("vacant");
    assert!(
        lease.wait_lost(&claim, Duration::from_secs(5)),
        "an unbeaten claim is presumed lost after its TTL"
    );
    cluster.hang(0);
    let (is_lost, wait_lost, read, sibling) = std::thread::scope(|s| {
        let sibling = s.spawn(|| {
            let t = Instant::now();
            let r = lease.try_claim();
            (t.elapsed(), r.map(|c| c.is_some()))
        });
        std::thread::sleep(Duration::from_millis(300));
        // Three checks at once, each timed on its own.
        let is_lost = s.spawn(|| {
            let t = Instant::now();
            let lost = lease.is_lost(&claim);
            (t.elapsed(), lost)
        });
        let wait_lost = s.spawn(|| {
            let t = Instant::now();
            let lost = lease.wait_lost(&claim, Duration::from_millis(200));
            (t.elapsed(), lost)
        });
        let read = s.spawn(|| {
            let t = Instant::now();
            let r = lease.read(&claim).map_err(|e| e.to_string());
            (t.elapsed(), r)
        });
        (
            is_lost.join().expect("is_lost"),
            wait_lost.join().expect("wait_lost"),
            read.join().expect("read"),
            sibling.join().expect("sibling"),
        )
    });
    cluster.resume(0);
    eprintln!(
        "attack19: sibling try_claim {sibling:?}; is_lost {is_lost:?}; wait_lost {wait_lost:?}; read {read:?}"
    );
    assert!(is_lost.1 && wait_lost.1, "the old claim is lost");
    assert_eq!(read.1, Ok(None), "a lost claim reads nothing");
    let bound = Duration::from_millis(100);
    assert!(
        is_lost.0 < bound,
        "is_lost (no request) took {:?} while a sibling's request hung",
        is_lost.0
    );
    assert!(
        wait_lost.0 < Duration::from_millis(200) + bound,
        "wait_lost(200 ms) of a lost claim took {:?}",
        wait_lost.0
    );
    assert!(
        read.0 < bound,
        "read of a claim known lost (no request) took {:?}",
        read.0
    );
}

/// A handle whose session is revoked behind its back again and again (as `etcdctl lease
/// revoke`, or the etcd bug the doc names) grants a new session each time. A permit and
/// a claim of its first session were found lost when etcd refused that session; 70
/// sessions later they must still be lost. docs/etcd.md: `is_lost(&permit)` "says lost
/// when its session is known gone (etcd said so)"; "`held()` counts only permits not
/// known or presumed lost"; "`lost_permits()` ... returns each lost permit once";
/// `EtcdLease::is_lost`: "a loss check without a request".
// Found (fixed since): after 64 more sessions the handle forgets that the first permit's and the first claim's sessions were found gone: `is_lost` flips back to false and `held()` counts the long-lost permit again.
#[test]
fn a_lost_permit_and_claim_stay_lost_however_many_sessions_follow() {
    let _one = serial();
    let cluster = EtcdCluster::start(1);
    let etcd = connect(
        &cluster.endpoints(),
        Duration::from_secs(5),
        KeepAlive::Background,
        Duration::from_secs(2),
    );
    let admin = connect(
        &cluster.endpoints(),
        Duration::from_secs(5),
        KeepAlive::Background,
        Duration::from_secs(2),
    );
    let pool = EtcdSemaphore::open(&etcd, "ls/pool", 2).expect("pool");
    let lease = EtcdLease::new(&etcd, "ls/lease", 0u64).expect("lease");
    let first = pool.try_take_permit().expect("take").expect("free");
    let first_claim = lease.try_claim().expect("claim").expect("vacant");
    let (mut sem_session, mut lease_session) = (first.session(), first_claim.session());
    let mut early = None;
    for round in 0..70 {
        revoke(&admin, sem_session);
        let p = pool.try_take_permit().expect("take").expect("free");
        assert_ne!(p.session(), sem_session, "round {round}: a new session");
        sem_session = p.session();
        assert!(pool.give_permit(&p).expect("give"));
        revoke(&admin, lease_session);
        let c = lease.try_claim().expect("claim").expect("vacant");
        assert_ne!(c.session(), lease_session, "round {round}: a new session");
        lease_session = c.session();
        assert!(lease.release(&c).expect("release"));
        if round == 1 {
            early = Some((pool.is_lost(&first), lease.is_lost(&first_claim)));
        }
    }
    assert_eq!(
        early,
        Some((true, true)),
        "etcd refused the first session: its permit and claim are known lost"
    );
    let (permit_lost, claim_lost) = (pool.is_lost(&first), lease.is_lost(&first_claim));
    let held = pool.held();
    let reported = pool.lost_permits();
    eprintln!(
        "attack19: after 70 sessions: permit is_lost={permit_lost} claim is_lost={claim_lost} held={held} lost_permits={}",
        reported.len()
    );
    assert!(
        !pool.is_current(&first).expect("is_current"),
        "etcd: the first permit's key is gone"
    );
    assert!(
        permit_lost,
        "the first permit's is_lost forgot its session was gone"
    );
    assert!(
        claim_lost,
        "the first claim's is_lost forgot its session was gone"
    );
    assert_eq!(held, 0, "held() counts a permit whose session etcd refused");
    assert!(
        reported.contains(&first),
        "lost_permits never reported the first permit"
    );
}

/// What one call under quorum loss did: its name, how long it took, and its outcome.
type Outcome = (&'static str, Duration, String);

fn timed<T: std::fmt::Debug>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, EtcdError>,
) -> Outcome {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    let what = match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({e})"),
    };
    (name, took, what)
}

/// Two of three members are hung (SIGSTOP): no quorum. Every call, each on its own
/// connection that prefers a hung member (request timeout 1 s). docs/etcd.md (Pitfalls):
/// "While no quorum answers every operation that does not wait returns `Err` within the
/// request timeout ... A blocked `acquire` (`take_permit`, `campaign`) ... returns the
/// error instead of waiting through the outage once requests have failed in a row for
/// members × the request timeout and at least one per member (so after members × the
/// request timeout when they all time out, up to one request timeout more when some fail
/// at once), and a wait whose own timeout runs out before that returns `Ok(None)` up to
/// one request timeout after its timeout." (+ 0.5 s of slack, as
/// `cluster::killed_leader_and_quorum_loss` allows.) Here the 5 s waits meet two
/// timeouts (members 0 and 1), an instant "no leader" (member 2, then a 100 ms pause) and
/// a third timeout, which ends the run at 3 request timeouts + the pause: inside the
/// bound of 3 request timeouts + slack checked below (the docs' general bound is one
/// request timeout more).
// Found (fixed since, in the docs): they promised an `Err` within the request timeout from
// every call, but `acquire(300 ms)` and `take_permit(300 ms)` return Ok(None) after ~1 s,
// and `acquire(5 s)` / `take_permit(5 s)` their error only after ~2 s (the blocked waits'
// documented retry rule, which the Pitfalls did not state).
#[test]
fn with_no_quorum_every_call_is_an_error_within_the_request_timeout() {
    let _one = serial();
    let mut cluster = EtcdCluster::start(3);
    let request = Duration::from_secs(1);
    let ttl = Duration::from_secs(20);
    // Members 0 and 1 hang; every connection prefers member 0, then 1, then 2.
    let endpoints = cluster.endpoints();
    let conn = |ka| connect(&endpoints, ttl, ka, request);
    let lease = |name: &str| {
        EtcdLease::new(&conn(KeepAlive::OnBeat), &format!("nq/{name}"), 0u64).expect("lease")
    };
    let pool = |name: &str| {
        EtcdSemaphore::open(&conn(KeepAlive::Background), &format!("nq/{name}"), 2).expect("pool")
    };
    let (l_try, l_short, l_long, l_holder) = (lease("a"), lease("b"), lease("c"), lease("d"));
    let held: Vec<_> = ["w", "r", "i", "b", "x"]
        .iter()
        .map(|n| {
            let l = lease(n);
            let c = l.try_claim().expect("claim").expect("vacant");
            (l, c)
        })
        .collect();
    let (p_try, p_short, p_long, p_avail) = (pool("p"), pool("q"), pool("s"), pool("t"));
    let with_permit: Vec<_> = ["u", "v"]
        .iter()
        .map(|n| {
            let p = pool(n);
            let permit = p.try_take_permit().expect("take").expect("free");
            (p, permit)
        })
        .collect();
    cluster.hang(0);
    cluster.hang(1);
    // Member 2 learns it has no leader (then answers at once).
    assert!(
        wait_until(Duration::from_secs(5), || !cluster.healthy(2)),
        "member 2 still reports a leader"
    );
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(5);
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let mut hs = vec![
            s.spawn(|| timed("try_claim", || l_try.try_claim())),
            s.spawn(|| timed("acquire(300ms)", || l_short.acquire(short))),
            s.spawn(|| timed("acquire(5s)", || l_long.acquire(long))),
            s.spawn(|| timed("holder", || l_holder.holder())),
        ];
        let (w, r, i, b, x) = (&held[0], &held[1], &held[2], &held[3], &held[4]);
        hs.push(s.spawn(|| timed("write", || w.0.write(&w.1, 1))));
        hs.push(s.spawn(|| timed("read", || r.0.read(&r.1))));
        hs.push(s.spawn(|| timed("is_current", || i.0.is_current(&i.1))));
        hs.push(s.spawn(|| timed("beat", || b.0.beat(&b.1))));
        hs.push(s.spawn(|| timed("release", || x.0.release(&x.1))));
        hs.push(s.spawn(|| timed("try_take_permit", || p_try.try_take_permit())));
        hs.push(s.spawn(|| timed("take_permit(300ms)", || p_short.take_permit(short))));
        hs.push(s.spawn(|| timed("take_permit(5s)", || p_long.take_permit(long))));
        hs.push(s.spawn(|| timed("available", || p_avail.available())));
        let (u, v) = (&with_permit[0], &with_permit[1]);
        hs.push(s.spawn(|| timed("give_permit", || u.0.give_permit(&u.1))));
        hs.push(s.spawn(|| timed("permit is_current", || v.0.is_current(&v.1))));
        hs.into_iter().map(|h| h.join().expect("call")).collect()
    });
    cluster.resume(0);
    cluster.resume(1);
    let slack = Duration::from_millis(500);
    let mut wrong = Vec::new();
    for (name, took, what) in &outcomes {
        eprintln!("attack19: no quorum: {name}: {took:?} {what}");
        let (ok, bound) = if name.ends_with("(300ms)") {
            // Its own timeout runs out first: `Ok(None)` (or the error) at most one
            // request timeout late.
            (
                what.starts_with("Err(") || what == "Ok(None)",
                short + request + slack,
            )
        } else if name.ends_with("(5s)") {
            // The error once requests failed in a row for members × the request timeout
            // (one per member at least), up to one request timeout more when some fail
            // at once (docs/etcd.md, "Blocked waits and failed requests").
            (what.starts_with("Err("), request * 4 + slack)
        } else {
            (what.starts_with("Err("), request + slack)
        };
        if !ok || *took > bound {
            wrong.push(format!("{name}: {what} after {took:?} (bound {bound:?})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "without a quorum, calls outside the documented outcome: {wrong:#?}"
    );
}

/// Holds one permit of the pool `key` (max 3) on the members in `endpoints`, reports its
/// key, then lingers until killed.
fn role_pool_holder() {
    let endpoints: Vec<String> = arg("endpoints").split(',').map(str::to_owned).collect();
    let etcd = connect(
        &endpoints,
        Duration::from_secs(2),
        KeepAlive::Background,
        Duration::from_secs(1),
    );
    let pool = EtcdSemaphore::open(&etcd, &arg("key"), 3).expect("pool");
    let permit = pool
        .take_permit(Duration::from_secs(20))
        .expect("take")
        .expect("a permit within 20 s");
    report(format!("key={}", permit.key()));
    linger();
}

/// 30 takers (threads, each with its own connection and session) contend for a pool of
/// 3 with a 2 s TTL while two child processes hold two of the permits; a follower
/// hangs, the children are SIGKILLed, the follower resumes, then the leader hangs for
/// 1.5 s. etcd's own history of the holder keys (a watch from revision 1) must never
/// show more than 3 at once; the holds the takers confirmed (taken, then given back with
/// `give_permit == true`) never overlap more than 3; the killed children's permits come
/// back within the TTL + 0.5 s (+ 1 s of slack); and tokens only grow.
/// docs/etcd.md: "two takers that both counted `max − 1` cannot both succeed";
/// "failover after the holder is SIGKILLed: the session TTL (≈ TTL, up to TTL + 0.5 s)";
/// "later permits of the pool have larger tokens".
#[test]
fn thirty_takers_never_exceed_max_while_members_hang_and_holders_die() {
    child_dispatch();
    let _one = serial();
    let mut cluster = EtcdCluster::start(3);
    let name = "tt/pool";
    let prefix = "tt/pool/holders/";
    let endpoints = cluster.endpoints();
    let mut kids: Vec<_> = (0..2)
        .map(|_| {
            child(
                "thirty_takers_never_exceed_max_while_members_hang_and_holders_die",
                "pool_holder",
                &endpoints[0],
                name,
            )
            .arg("endpoints", endpoints.join(","))
            .spawn()
        })
        .collect();
    let kid_keys: Vec<String> = kids
        .iter_mut()
        .map(|k| fields(&k.next_report(Duration::from_secs(30)))["key"].to_owned())
        .collect();
    let leader = cluster.leader();
    let follower = (leader + 1) % 3;
    let stop = AtomicBool::new(false);
    let takes = AtomicU64::new(0);
    let holds = std::sync::Mutex::new(Vec::<(u64, u64, u64)>::new());
    let mut returned_after = Vec::new();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for t in 0..30 {
            let (stop, takes, holds, endpoints) = (&stop, &takes, &holds, &endpoints);
            s.spawn(move || {
                let mut e = endpoints.clone();
                e.rotate_left(t % 3);
                let etcd = connect(
                    &e,
                    Duration::from_secs(2),
                    KeepAlive::Background,
                    Duration::from_secs(1),
                );
                let pool = loop {
                    match EtcdSemaphore::open(&etcd, name, 3) {
                        Ok(p) => break p,
                        Err(_) if !stop.load(Ordering::Relaxed) => {
                            std::thread::sleep(Duration::from_millis(50))
                        }
                        Err(e) => panic!("open: {e}"),
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    match pool.take_permit(Duration::from_secs(2)) {
                        Ok(Some(p)) => {
                            takes.fetch_add(1, Ordering::Relaxed);
                            let start = mono_ns();
                            std::thread::sleep(Duration::from_millis(5));
                            let end = mono_ns();
                            if let Ok(true) = pool.give_permit(&p) {
                                holds.lock().unwrap().push((start, end, p.token()));
                            }
                        }
                        Ok(None) => {}
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            });
        }
        let admin = connect(
            &[cluster.endpoint(leader)],
            Duration::from_secs(2),
            KeepAlive::Background,
            Duration::from_secs(1),
        );
        std::thread::sleep(Duration::from_secs(2));
        cluster.hang(follower);
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        for k in &mut kids {
            k.kill();
        }
        for key in &kid_keys {
            wait_until(Duration::from_secs(10), || {
                !keys_under(&admin, prefix).contains(key)
            });
            returned_after.push(killed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(500));
        cluster.resume(follower);
        std::thread::sleep(Duration::from_secs(2));
        let leader = cluster.leader();
        cluster.hang(leader);
        std::thread::sleep(Duration::from_millis(1500));
        cluster.resume(leader);
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
    });
    let history = live_counts(
        &connect(
            &cluster.endpoints(),
            Duration::from_secs(2),
            KeepAlive::Background,
            Duration::from_secs(2),
        ),
        prefix,
    );
    let most = history.iter().map(|&(_, n)| n).max().unwrap_or(0);
    let holds = holds.into_inner().unwrap();
    let intervals: Vec<(u64, u64)> = holds.iter().map(|&(s, e, _)| (s, e)).collect();
    let mut tokens: Vec<u64> = holds.iter().map(|&(_, _, t)| t).collect();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    eprintln!(
        "attack19: {} takes, {} confirmed holds, {} revisions of holder keys, at most {most} at once; killed holders' permits back after {returned_after:?}",
        takes.load(Ordering::Relaxed),
        holds.len(),
        history.len()
    );
    assert!(
        most <= 3,
        "etcd held {most} holder keys of a pool of 3 at once"
    );
    assert!(
        max_overlap(&intervals) <= 3,
        "confirmed holds overlapped {} at once",
        max_overlap(&intervals)
    );
    assert_eq!(tokens.len(), n, "two permits share a token");
    assert!(
        holds.len() >= 30,
        "too little progress: {} holds",
        holds.len()
    );
    for after in &returned_after {
        assert!(
            *after < Duration::from_millis(3500),
            "a SIGKILLed holder's permit came back after {after:?} (TTL 2 s)"
        );
    }
}

/// Options at their limits and unusual names on one member: the longest TTL etcd grants
/// (9,000,000,000 s), request and connect timeouts of `Duration::MAX`, waits of
/// `Duration::MAX`, names with NUL, spaces, non-ASCII and percent signs, a 100 kB name,
/// and a name too large for one etcd request (2 MB), which must be an error (no panic,
/// no hang, no key left behind) while the connection keeps working.
/// docs/etcd.md: TTL "zero and values above etcd's maximum (9,000,000,000 s) are refused"
/// (so the maximum itself is accepted); "Every trait method returns `Result`"; "`Err`
/// means the backend failed".
#[test]
fn option_limits_and_odd_names() {
    let _one = serial();
    let cluster = EtcdCluster::start(1);
    let endpoints = cluster.endpoints();
    let max_ttl = Duration::from_secs(9_000_000_000);
    let etcd = connect(
        &endpoints,
        max_ttl,
        KeepAlive::Background,
        Duration::from_secs(2),
    );
    let lease = EtcdLease::new(&etcd, "ol/max-ttl", 0u64).expect("lease");
    let c = lease.try_claim().expect("claim").expect("vacant");
    assert!(lease.write(&c, 5).expect("write"));
    assert!(lease.beat(&c).expect("beat"));
    assert!(!lease.wait_lost(&c, Duration::from_millis(300)));
    assert!(!lease.is_lost(&c));
    assert!(lease.release(&c).expect("release"));
    let beat_driven = connect(
        &endpoints,
        max_ttl,
        KeepAlive::OnBeat,
        Duration::from_secs(2),
    );
    let lease = EtcdLease::new(&beat_driven, "ol/max-ttl-beat", 0u64).expect("lease");
    let c = lease.try_claim().expect("claim").expect("vacant");
    assert!(lease.beat(&c).expect("beat"));
    assert!(lease.is_current(&c).expect("current"));
    let pool = EtcdSemaphore::open(&etcd, "ol/max-ttl-pool", 1).expect("pool");
    let p = pool.try_take_permit().expect("take").expect("free");
    assert!(pool.wait_lost(Duration::from_millis(200)).is_empty());
    assert!(pool.give_permit(&p).expect("give"));

    let opts = EtcdOptions::default()
        .ttl(Duration::from_secs(2))
        .request_timeout(Duration::MAX)
        .connect_timeout(Duration::MAX);
    let forever = Etcd::connect(&endpoints, opts).expect("connect");
    let lease = EtcdLease::new(&forever, "ol/forever", 0u64).expect("lease");
    let c = lease
        .acquire(Duration::MAX)
        .expect("acquire")
        .expect("vacant");
    assert!(lease.write(&c, 1).expect("write"));
    assert!(lease.release(&c).expect("release"));
    let pool = EtcdSemaphore::open(&forever, "ol/forever-pool", 1).expect("pool");
    let p = pool
        .take_permit(Duration::MAX)
        .expect("take")
        .expect("free");
    assert!(pool.give_permit(&p).expect("give"));

    let odd = [
        "\0nul".to_owned(),
        "sp ace/ü ß %2F".to_owned(),
        "x".repeat(100_000),
    ];
    for name in &odd {
        let a = EtcdLease::new(&etcd, name, 0u64).expect("lease");
        let b = EtcdLease::new(&etcd, name, 0u64).expect("lease");
        let ca = a.try_claim().expect("claim").expect("vacant");
        assert!(b.try_claim().expect("claim").is_none(), "two holders");
        assert!(a.write(&ca, 9).expect("write"));
        assert!(a.release(&ca).expect("release"));
        let cb = b.try_claim().expect("claim").expect("released");
        assert!(cb.generation() > ca.generation());
        assert_eq!(b.read(&cb).expect("read"), Some(9));
        let pool = EtcdSemaphore::open(&etcd, name, 1).expect("pool");
        let rival = EtcdSemaphore::open(&etcd, name, 1).expect("pool");
        let p = pool.try_take_permit().expect("take").expect("free");
        assert!(rival.try_take_permit().expect("take").is_none());
        assert!(pool.give_permit(&p).expect("give"));
    }

    let huge = "y".repeat(2_000_000);
    let t = Instant::now();
    let lease = EtcdLease::new(&etcd, &huge, 0u64).expect("lease");
    let r = lease.try_claim();
    let said: String = match &r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("{e:?}")
            .chars()
            .rev()
            .take(200)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect(),
    };
    eprintln!("attack19: a 2 MB name: …{said} after {:?}", t.elapsed());
    assert!(r.is_err(), "a name larger than one etcd request claimed");
    let r = EtcdSemaphore::open(&etcd, &huge, 1);
    assert!(
        r.is_err(),
        "a pool with a name larger than one etcd request"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(keys_under(&etcd, "yyyy").is_empty(), "a key was left");
    let lease = EtcdLease::new(&etcd, "ol/after", 0u64).expect("lease");
    let c = lease.try_claim().expect("claim").expect("vacant");
    assert!(lease.write(&c, 3).expect("write"));
}

/// The only member is hung (SIGSTOP: it accepts TCP connections and never answers).
/// Connecting must not wait for it, and the first calls must fail with `Timeout`
/// within the request timeout (+ 0.5 s), typed, without a panic. docs/etcd.md and
/// `Etcd::connect`: "The connection is made lazily: this succeeds while the servers are
/// down, and requests fail until they are up"; `EtcdError::Timeout`: "the request
/// timeout passed (a hung or restarting member)".
#[test]
fn connecting_to_a_hung_member_does_not_wait_and_calls_time_out() {
    let _one = serial();
    let mut cluster = EtcdCluster::start(1);
    cluster.hang(0);
    let request = Duration::from_secs(1);
    let t = Instant::now();
    let etcd = connect(
        &cluster.endpoints(),
        Duration::from_secs(2),
        KeepAlive::Background,
        request,
    );
    let connected = t.elapsed();
    let lease = EtcdLease::new(&etcd, "hc/lease", 0u64).expect("lease");
    let t = Instant::now();
    let claim = lease.try_claim();
    let claimed = t.elapsed();
    let t = Instant::now();
    let pool = EtcdSemaphore::open(&etcd, "hc/pool", 1);
    let opened = t.elapsed();
    cluster.resume(0);
    eprintln!(
        "attack19: hung member: connect {connected:?}; try_claim {claimed:?} {claim:?}; open {opened:?} {:?}",
        pool.as_ref().map(|_| ())
    );
    assert!(
        connected < Duration::from_millis(300),
        "connect waited {connected:?}"
    );
    let bound = request + Duration::from_millis(500);
    assert!(
        matches!(claim, Err(EtcdError::Timeout { .. })) && claimed < bound,
        "try_claim: {claim:?} after {claimed:?}"
    );
    assert!(
        matches!(pool, Err(EtcdError::Timeout { .. })) && opened < bound,
        "open: {:?} after {opened:?}",
        pool.map(|_| ())
    );
    // Resumed, the same connection works.
    let c = wait_until(Duration::from_secs(10), || {
        matches!(lease.try_claim(), Ok(Some(_)))
    });
    assert!(c, "no claim after the member resumed");
}

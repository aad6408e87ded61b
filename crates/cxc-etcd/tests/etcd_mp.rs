//! Multi-process tests of [`EtcdLease`] and [`EtcdSemaphore`] against a real etcd server
//! (the acceptance list).
//!
//! Each test starts its own server (`common::etcd`), then re-executes this test binary as
//! child processes in a role (`cxc-testkit`); a test function that finds itself in a role
//! plays it and returns. Children report on stdout (`cxc_testkit::report`): results, and
//! the intervals they held a claim or a permit, stamped with `CLOCK_MONOTONIC` (one clock
//! for all processes). A child records an interval only after its claim returned and
//! before it released, so the recorded interval lies inside the real one: overlapping
//! records prove overlapping holds.
//!
//! Sessions use a 1 s TTL (the server runs with short raft timers so it accepts it).

mod common;

use std::time::{Duration, Instant};

use common::{EtcdServer, child, linger, max_overlap, mono_ns};
use cxc_etcd::{Etcd, EtcdClaim, EtcdLease, EtcdOptions, EtcdSemaphore, FencedLease, PermitPool};
use cxc_testkit::{Proc, arg, fields, path_arg, report, wait_for_path};

const TTL: Duration = Duration::from_secs(1);

fn connect(endpoint: &str) -> Etcd {
    Etcd::connect(&[endpoint], EtcdOptions::default().ttl(TTL)).expect("connect")
}

fn child_lease() -> EtcdLease<u64> {
    EtcdLease::new(&connect(&arg("endpoint")), &arg("key"), 0).expect("lease")
}

fn child_pool() -> EtcdSemaphore {
    let max: u32 = arg("max").parse().expect("max");
    EtcdSemaphore::open(&connect(&arg("endpoint")), &arg("key"), max).expect("pool")
}

fn rounds() -> u64 {
    arg("rounds").parse().expect("rounds")
}

/// If this process is a child, plays its role and exits.
fn child_dispatch() {
    cxc_testkit::play_role!(
        role_contender,
        role_holder,
        role_paused,
        role_sem_worker,
        role_sem_holder,
        role_restart_contender
    );
}

/// One hold as a child reports it: `hold start=NS end=NS gen=G`, and for the restart
/// contender `wrote=W after_restart=0|1`.
#[derive(Debug, Clone, Copy, Default)]
struct Hold {
    start: u64,
    end: u64,
    generation: u64,
    /// 1 (write applied), 0 (refused) or 2 (outcome unknown: the request failed).
    wrote: u64,
    after_restart: bool,
}

impl Hold {
    fn report(start: u64, end: u64, generation: u64, more: &str) {
        report(format!(
            "hold start={start} end={end} gen={generation}{more}"
        ));
    }

    /// The hold of report `line`, `None` for other reports.
    fn parse(line: &str) -> Option<Hold> {
        let rest = line.strip_prefix("hold ")?;
        let f = fields(rest);
        let num = |k: &str| f.get(k).map_or(0, |v| v.parse().expect("a number"));
        Some(Hold {
            start: num("start"),
            end: num("end"),
            generation: num("gen"),
            wrote: num("wrote"),
            after_restart: num("after_restart") == 1,
        })
    }
}

/// The holds among `reports`.
fn holds(reports: &[String]) -> Vec<Hold> {
    reports.iter().filter_map(|r| Hold::parse(r)).collect()
}

/// `rounds` times: acquire, increment the payload by a fenced read + write, release.
/// Reports each hold.
fn role_contender() {
    let lease = child_lease();
    for _ in 0..rounds() {
        let c = acquire(&lease);
        let t0 = mono_ns();
        let v = lease.read(&c).expect("read").expect("holder cannot read");
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            lease.write(&c, v + 1).expect("write"),
            "holder's write refused"
        );
        Hold::report(t0, mono_ns(), c.generation(), "");
        assert!(lease.release(&c).expect("release"));
    }
}

/// The lease's claim, waiting for it at most 30 s.
fn acquire(lease: &EtcdLease<u64>) -> EtcdClaim {
    lease
        .acquire(Duration::from_secs(30))
        .expect("acquire")
        .expect("acquire timed out")
}

/// Claims, writes `value`, and reports the claim's generation.
fn claim_and_write(value: u64) -> (EtcdLease<u64>, EtcdClaim) {
    let lease = child_lease();
    let c = acquire(&lease);
    assert!(lease.write(&c, value).expect("write"));
    report(format!("gen={}", c.generation()));
    (lease, c)
}

/// Claims, writes 42, reports, and holds until killed.
fn role_holder() {
    // Kept until killed: dropping the handle would release the claim at once.
    let _held = claim_and_write(42);
    linger();
}

/// Claims and reports; the parent SIGSTOPs it, takes the lease over, makes `<dir>/go`
/// and SIGCONTs it: then it tries to use its stale claim and reports what happened.
fn role_paused() {
    let (lease, c) = claim_and_write(1);
    let go = path_arg("dir").join("go");
    assert!(
        wait_for_path(&go, common::CHILD_PATIENCE),
        "no go from the parent"
    );
    let write = lease.write(&c, 999).expect("stale write");
    let release = lease.release(&c).expect("stale release");
    let beat = lease.beat(&c).expect("stale beat");
    let current = lease.is_current(&c).expect("is_current");
    let read = lease.read(&c).expect("stale read").is_some();
    report(format!(
        "write={write} release={release} beat={beat} current={current} read={read}"
    ));
}

/// `rounds` times: take a permit, hold it 2 ms, give it. Reports each hold.
fn role_sem_worker() {
    let pool = child_pool();
    for _ in 0..rounds() {
        assert!(
            pool.take_timeout(Duration::from_secs(30)).expect("take"),
            "take timed out"
        );
        let t0 = mono_ns();
        std::thread::sleep(Duration::from_millis(2));
        Hold::report(t0, mono_ns(), 0, "");
        assert!(pool.give().expect("give"), "give refused");
    }
}

/// Takes one permit, reports, and holds it until killed.
fn role_sem_holder() {
    let pool = child_pool();
    assert!(pool.try_take().expect("take"), "no permit free");
    report("taken=1");
    linger();
}

/// Contends until `<dir>/stop` exists, riding out a server restart (`<dir>/restarted`
/// says it happened): errors are counted and retried. Reports each hold, with whether
/// its write was applied and whether it began after the restart, then
/// `holds=N errors=E`.
fn role_restart_contender() {
    let lease = child_lease();
    let dir = path_arg("dir");
    let (mut errors, mut holds) = (0u64, 0u64);
    while !dir.join("stop").exists() {
        let after_restart = dir.join("restarted").exists();
        let c = match lease.acquire(Duration::from_millis(300)) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(_) => {
                errors += 1;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let t0 = mono_ns();
        let wrote = match lease.read(&c) {
            Ok(Some(v)) => match lease.write(&c, v + 1) {
                Ok(true) => 1,
                Ok(false) => 0,
                Err(_) => 2,
            },
            Ok(None) => 0,
            Err(_) => 2,
        };
        std::thread::sleep(Duration::from_millis(2));
        let more = format!(" wrote={wrote} after_restart={}", u8::from(after_restart));
        Hold::report(t0, mono_ns(), c.generation(), &more);
        holds += 1;
        if lease.release(&c).is_err() {
            errors += 1;
        }
    }
    report(format!("holds={holds} errors={errors}"));
}

/// Holds in start order must not overlap, and their generations must increase.
fn assert_exclusive(holds: &mut [Hold]) {
    holds.sort_by_key(|h| h.start);
    for w in holds.windows(2) {
        assert!(
            w[1].start > w[0].end,
            "L1: holds overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
        assert!(
            w[1].generation >= w[0].generation,
            "generations go back in time: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

/// Children `names` of test `test` in `role` on `key` of `server`, each with `args`
/// (role argument pairs) and `name`.
fn children(
    test: &str,
    role: &str,
    server: &EtcdServer,
    key: &str,
    names: &[&str],
    args: &[(&str, String)],
) -> Vec<Proc> {
    names
        .iter()
        .map(|name| {
            let mut c = child(test, role, &server.endpoint(), key).arg("name", name);
            for (k, v) in args {
                c = c.arg(k, v);
            }
            c.spawn()
        })
        .collect()
}

#[test]
fn two_clients_exclude_each_other() {
    child_dispatch();
    let server = EtcdServer::start();
    let key = "mp/exclusion";
    let n = 25u64;
    let t = "two_clients_exclude_each_other";
    let rounds = [("rounds", n.to_string())];
    let mut kids = children(t, "contender", &server, key, &["a", "b"], &rounds);
    let mut holds: Vec<Hold> = kids
        .iter_mut()
        .flat_map(|k| holds(&k.finish(Duration::from_secs(120))))
        .collect();
    assert_eq!(holds.len() as u64, 2 * n);
    assert_exclusive(&mut holds);
    for w in holds.windows(2) {
        assert!(
            w[1].generation > w[0].generation,
            "every hold is a new claim: generations must grow"
        );
    }
    // No increment was lost: the fenced read-modify-writes never interleaved.
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    let c = lease
        .try_claim()
        .expect("claim")
        .expect("vacant after the children");
    assert_eq!(lease.read(&c).expect("read"), Some(2 * n), "lost updates");
}

#[test]
fn sigkilled_holder_is_replaced_after_its_ttl() {
    child_dispatch();
    let server = EtcdServer::start();
    let key = "mp/failover";
    let t = "sigkilled_holder_is_replaced_after_its_ttl";
    let mut kid = child(t, "holder", &server.endpoint(), key).spawn();
    let gen_dead = generation(&kid.next_report(Duration::from_secs(60)));
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    // Alive and keeping its session: the claim holds well past one TTL.
    std::thread::sleep(TTL * 2);
    assert!(
        lease.try_claim().expect("claim").is_none(),
        "live holder lost its claim"
    );
    kid.kill();
    let killed = Instant::now();
    let c = lease
        .acquire(Duration::from_secs(15))
        .expect("acquire")
        .expect("the dead holder was not replaced within 15 s");
    let failover = killed.elapsed();
    assert!(
        c.generation() > gen_dead,
        "takeover must have a newer generation"
    );
    assert!(
        failover >= Duration::from_millis(300),
        "replaced after {failover:?}: before its TTL could run out"
    );
    assert!(
        failover < TTL + Duration::from_secs(5),
        "failover took {failover:?}"
    );
    assert_eq!(
        lease.read(&c).expect("read"),
        Some(42),
        "the payload survives"
    );
}

/// A holder whose main thread exited (the `pthread_exit` pattern) and whose last own
/// thread then ended, still holding: only the connection's runtime threads are left,
/// and they keep its session alive. The process must end as a process does when its last
/// thread ends (status 0) instead of holding for ever; its claim is then replaced after
/// its TTL.
#[test]
fn a_holder_whose_own_threads_all_ended_is_not_kept_alive_by_the_runtime() {
    let t = "a_holder_whose_own_threads_all_ended_is_not_kept_alive_by_the_runtime";
    if cxc_testkit::in_role("orphan_holder") {
        let held = claim_and_write(42);
        assert!(cxc_testkit::exit_main_thread());
        report("orphaned");
        // This (the test's) thread ends here holding the claim.
        std::mem::forget(held);
        return;
    }
    child_dispatch();
    let server = EtcdServer::start();
    let key = "mp/orphan";
    let mut kid = child(t, "orphan_holder", &server.endpoint(), key).spawn();
    let gen_before = generation(&kid.next_report(Duration::from_secs(60)));
    assert_eq!(kid.next_report(Duration::from_secs(20)), "orphaned");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the holder's process did not end when its last own thread did: {status:?}"
    );
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    let c = lease
        .acquire(TTL + Duration::from_secs(5))
        .expect("acquire")
        .expect("the ended holder's claim was not replaced");
    assert!(c.generation() > gen_before);
    assert_eq!(lease.read(&c).expect("read"), Some(42));
}

/// The `gen` of a child's report.
fn generation(report: &str) -> u64 {
    fields(report)["gen"].parse().expect("gen")
}

#[test]
fn stale_claims_write_and_release_are_rejected() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "mp/stale";
    let t = "stale_claims_write_and_release_are_rejected";
    let mut kid = child(t, "paused", &server.endpoint(), key)
        .arg("dir", dir.path())
        .spawn();
    let gen_old = generation(&kid.next_report(Duration::from_secs(60)));
    // A holder that stalls (GC pause, SIGSTOP, a VM freeze) stops refreshing its session.
    kid.stop();
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    let c = lease
        .acquire(Duration::from_secs(15))
        .expect("acquire")
        .expect("the stalled holder was not replaced");
    assert!(c.generation() > gen_old);
    assert!(lease.write(&c, 7).expect("write"));
    std::fs::write(dir.path().join("go"), "").expect("go file");
    kid.cont();
    let after = kid.finish(Duration::from_secs(60));
    assert_eq!(after.len(), 1, "one report after the stall: {after:?}");
    let after = fields(&after[0]);
    for field in ["write", "release", "beat", "current", "read"] {
        assert_eq!(
            after[field], "false",
            "the stale holder's {field} was not rejected: {after:?}"
        );
    }
    assert!(
        lease.is_current(&c).expect("is_current"),
        "L3: stale release cleared the claim"
    );
    assert_eq!(
        lease.read(&c).expect("read"),
        Some(7),
        "L2: stale write landed"
    );
}

#[test]
fn semaphore_never_exceeds_max_across_processes() {
    child_dispatch();
    let server = EtcdServer::start();
    let (key, max, n) = ("mp/pool", 2u32, 15u64);
    let t = "semaphore_never_exceeds_max_across_processes";
    let workers = ["w0", "w1", "w2", "w3"];
    let args = [("rounds", n.to_string()), ("max", max.to_string())];
    let mut kids = children(t, "sem_worker", &server, key, &workers, &args);
    let holds: Vec<(u64, u64)> = kids
        .iter_mut()
        .flat_map(|k| holds(&k.finish(Duration::from_secs(120))))
        .map(|h| (h.start, h.end))
        .collect();
    assert_eq!(holds.len() as u64, workers.len() as u64 * n);
    let peak = max_overlap(&holds);
    assert!(
        peak <= max as usize,
        "S1: {peak} permits out at once, max {max}"
    );
    let pool = EtcdSemaphore::open(&connect(&server.endpoint()), key, max).expect("pool");
    assert_eq!(pool.available().expect("available"), max);
}

#[test]
fn semaphore_recovers_a_killed_holders_permit() {
    child_dispatch();
    let server = EtcdServer::start();
    let (key, max) = ("mp/recover", 2u32);
    let t = "semaphore_recovers_a_killed_holders_permit";
    let mut kid = child(t, "sem_holder", &server.endpoint(), key)
        .arg("max", max.to_string())
        .spawn();
    kid.next_report(Duration::from_secs(60));
    let pool = EtcdSemaphore::open(&connect(&server.endpoint()), key, max).expect("pool");
    assert!(pool.try_take().expect("take"), "one permit should be free");
    assert!(
        !pool.try_take().expect("take"),
        "S1: a third permit out of 2"
    );
    assert_eq!(pool.available().expect("available"), 0);
    kid.kill();
    let killed = Instant::now();
    assert!(
        pool.take_timeout(Duration::from_secs(15)).expect("take"),
        "the killed holder's permit was not recovered within 15 s"
    );
    let took = killed.elapsed();
    assert!(
        took < TTL + Duration::from_secs(5),
        "recovery took {took:?}"
    );
    assert_eq!(pool.available().expect("available"), 0);
    assert!(
        !pool.try_take().expect("take"),
        "S1: more than max after recovery"
    );
    assert!(pool.give().expect("give"));
    assert!(pool.give().expect("give"));
    assert!(!pool.give().expect("give"), "S2: gave more than taken");
    assert_eq!(pool.available().expect("available"), max);
}

/// Reads holds that `kid` reports into `seen` until `enough` holds there.
fn holds_until(kid: &mut Proc, seen: &mut Vec<Hold>, enough: impl Fn(&[Hold]) -> bool) {
    while !enough(seen) {
        let r = kid.next_report(Duration::from_secs(60));
        seen.extend(Hold::parse(&r));
    }
}

#[test]
fn etcd_restart_mid_test_keeps_exclusion_and_fencing() {
    child_dispatch();
    let mut server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "mp/restart";
    let endpoint = server.endpoint();
    // A claim taken and released before the restart: stale from then on.
    let old = EtcdLease::new(&connect(&endpoint), key, 0u64).expect("lease");
    let stale = old.try_claim().expect("claim").expect("vacant");
    assert!(old.write(&stale, 100).expect("write"));
    assert!(old.release(&stale).expect("release"));

    let t = "etcd_restart_mid_test_keeps_exclusion_and_fencing";
    let dir_arg = [("dir", dir.path().display().to_string())];
    let mut kids = children(t, "restart_contender", &server, key, &["a", "b"], &dir_arg);
    let mut seen = vec![Vec::new(), Vec::new()];
    // Let them contend, then crash the server (SIGKILL) and start it on the same data.
    for (k, s) in kids.iter_mut().zip(&mut seen) {
        holds_until(k, s, |h| h.len() >= 5);
    }
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    std::fs::write(dir.path().join("restarted"), "").expect("marker");
    // Both make progress again after the restart.
    for (k, s) in kids.iter_mut().zip(&mut seen) {
        holds_until(k, s, |h| h.iter().filter(|h| h.after_restart).count() >= 5);
    }
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    for (k, s) in kids.iter_mut().zip(&mut seen) {
        s.extend(holds(&k.finish(Duration::from_secs(60))));
    }

    let mut holds: Vec<Hold> = seen.concat();
    let (applied, unknown) = holds.iter().fold((0, 0), |(a, u), h| match h.wrote {
        1 => (a + 1, u),
        2 => (a, u + 1),
        _ => (a, u),
    });
    assert_exclusive(&mut holds);
    // Fencing survives the restart: the pre-restart claim is still refused, and every
    // claim since has a larger generation.
    assert!(
        !old.write(&stale, 5).expect("stale write"),
        "stale write accepted after restart"
    );
    assert!(
        !old.release(&stale).expect("stale release"),
        "stale release accepted"
    );
    assert!(holds.iter().all(|h| h.generation > stale.generation()));
    let fresh = EtcdLease::new(&connect(&endpoint), key, 0u64).expect("lease");
    let c = fresh
        .acquire(Duration::from_secs(10))
        .expect("acquire")
        .expect("vacant after the children");
    assert!(c.generation() > holds.iter().map(|h| h.generation).max().unwrap_or(0));
    let v = fresh.read(&c).expect("read").expect("holder reads");
    assert!(
        (100 + applied..=100 + applied + unknown).contains(&v),
        "payload {v}: expected 100 + {applied} applied (+ up to {unknown} unknown) increments"
    );
}

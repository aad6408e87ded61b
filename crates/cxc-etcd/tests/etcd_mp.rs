//! Multi-process tests of [`EtcdLease`] and [`EtcdSemaphore`] against a real etcd server
//! (the acceptance list).
//!
//! Each test starts its own server (`common::server`), then re-executes this test binary
//! as child processes in a role (`CXC_ETCD_ROLE`); a test function that finds the role
//! variable set plays that role and exits. Children report through files: `key=value`
//! reports, and logs of the intervals they held a claim or a permit, stamped with
//! `CLOCK_MONOTONIC` (one clock for all processes). A child records an interval only
//! after its claim returned and before it released, so the recorded interval lies inside
//! the real one: overlapping records prove overlapping holds.
//!
//! Sessions use a 1 s TTL (the server runs with short raft timers so it accepts it).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    CHILD_PATIENCE, EtcdServer, Kid, child_dir, child_wait_for_file, env, max_overlap, mono_ns,
    publish, report, report_u64, role,
};
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, EtcdSemaphore, FencedLease, PermitPool};

const TTL: Duration = Duration::from_secs(1);
const ROUNDS_VAR: &str = "CXC_ETCD_ROUNDS";
const MAX_VAR: &str = "CXC_ETCD_MAX";

fn connect(endpoint: &str) -> Etcd {
    Etcd::connect(&[endpoint], EtcdOptions::default().ttl(TTL)).expect("connect")
}

fn child_lease() -> EtcdLease<u64> {
    EtcdLease::new(
        &connect(&env(common::ENDPOINT_VAR)),
        &env(common::KEY_VAR),
        0,
    )
    .expect("lease")
}

fn child_pool() -> EtcdSemaphore {
    let max: u32 = env(MAX_VAR).parse().expect("max");
    EtcdSemaphore::open(
        &connect(&env(common::ENDPOINT_VAR)),
        &env(common::KEY_VAR),
        max,
    )
    .expect("pool")
}

fn rounds() -> u64 {
    env(ROUNDS_VAR).parse().expect("rounds")
}

/// Appends `line` to this child's log.
fn log_line(log: &mut std::fs::File, line: &str) {
    use std::io::Write;
    writeln!(log, "{line}").expect("log");
}

fn open_log() -> std::fs::File {
    std::fs::File::create(child_dir().join(format!("{}.log", env(common::NAME_VAR))))
        .expect("log file")
}

/// Sleeps until killed (or, if the parent died, until the patience runs out).
fn linger() -> ! {
    std::thread::sleep(CHILD_PATIENCE);
    std::process::exit(5)
}

/// If this process is a child, plays its role and exits.
fn child_dispatch() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "contender" => role_contender(),
        "holder" => role_holder(),
        "paused" => role_paused(),
        "sem_worker" => role_sem_worker(),
        "sem_holder" => role_sem_holder(),
        "restart_contender" => role_restart_contender(),
        other => panic!("unknown role {other:?}"),
    }
    std::process::exit(0);
}

/// `rounds` times: acquire, increment the payload by a fenced read + write, release.
/// Logs `start end generation` per hold.
fn role_contender() {
    let lease = child_lease();
    let mut log = open_log();
    let n = rounds();
    for _ in 0..n {
        let c = lease
            .acquire(Duration::from_secs(30))
            .expect("acquire")
            .expect("acquire timed out");
        let t0 = mono_ns();
        let v = lease.read(&c).expect("read").expect("holder cannot read");
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            lease.write(&c, v + 1).expect("write"),
            "holder's write refused"
        );
        let t1 = mono_ns();
        log_line(&mut log, &format!("{t0} {t1} {}", c.generation()));
        assert!(lease.release(&c).expect("release"));
    }
    report(&format!("writes={n}"));
}

/// Claims, writes 42, reports, and holds until killed.
fn role_holder() {
    let lease = child_lease();
    let c = lease
        .acquire(Duration::from_secs(30))
        .expect("acquire")
        .expect("acquire timed out");
    assert!(lease.write(&c, 42).expect("write"));
    report(&format!("gen={}", c.generation()));
    linger();
}

/// Claims and reports; the parent SIGSTOPs it, takes the lease over, and SIGCONTs it:
/// then it tries to use its stale claim and reports what happened.
fn role_paused() {
    let lease = child_lease();
    let c = lease
        .acquire(Duration::from_secs(30))
        .expect("acquire")
        .expect("acquire timed out");
    assert!(lease.write(&c, 1).expect("write"));
    report(&format!("gen={}", c.generation()));
    child_wait_for_file(&child_dir().join("go"));
    let write = lease.write(&c, 999).expect("stale write");
    let release = lease.release(&c).expect("stale release");
    let beat = lease.beat(&c).expect("stale beat");
    let current = lease.is_current(&c).expect("is_current");
    let read = lease.read(&c).expect("stale read").is_some();
    publish(
        &child_dir().join("paused.after"),
        &format!("write={write} release={release} beat={beat} current={current} read={read}"),
    );
}

/// `rounds` times: take a permit, hold it 2 ms, give it. Logs `start end` per hold.
fn role_sem_worker() {
    let pool = child_pool();
    let mut log = open_log();
    for _ in 0..rounds() {
        assert!(
            pool.take_timeout(Duration::from_secs(30)).expect("take"),
            "take timed out"
        );
        let t0 = mono_ns();
        std::thread::sleep(Duration::from_millis(2));
        let t1 = mono_ns();
        log_line(&mut log, &format!("{t0} {t1}"));
        assert!(pool.give().expect("give"), "give refused");
    }
    report("done=1");
}

/// Takes one permit, reports, and holds it until killed.
fn role_sem_holder() {
    let pool = child_pool();
    assert!(pool.try_take().expect("take"), "no permit free");
    report("taken=1");
    linger();
}

/// Contends until `<dir>/stop` exists, riding out a server restart: errors are counted
/// and retried. Logs `start end generation wrote after_restart` per hold, where `wrote`
/// is 1 (write applied), 0 (refused) or 2 (outcome unknown: the request failed).
fn role_restart_contender() {
    let lease = child_lease();
    let dir = child_dir();
    let mut log = open_log();
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
        let t1 = mono_ns();
        log_line(
            &mut log,
            &format!(
                "{t0} {t1} {} {wrote} {}",
                c.generation(),
                u8::from(after_restart)
            ),
        );
        holds += 1;
        if lease.release(&c).is_err() {
            errors += 1;
        }
    }
    report(&format!("holds={holds} errors={errors}"));
}

/// Reads a child's log: whitespace-separated numbers per line.
fn read_log(dir: &Path, name: &str) -> Vec<Vec<u64>> {
    std::fs::read_to_string(dir.join(format!("{name}.log")))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("log number"))
                .collect()
        })
        .collect()
}

/// Holds in start order must not overlap, and their generations must increase.
fn assert_exclusive(holds: &mut [Vec<u64>]) {
    holds.sort_by_key(|h| h[0]);
    for w in holds.windows(2) {
        assert!(
            w[1][0] > w[0][1],
            "L1: holds overlap: [{}, {}] gen {} and [{}, {}] gen {}",
            w[0][0],
            w[0][1],
            w[0][2],
            w[1][0],
            w[1][1],
            w[1][2]
        );
        assert!(
            w[1][2] >= w[0][2],
            "generations go back in time: {} then {}",
            w[0][2],
            w[1][2]
        );
    }
}

#[test]
fn two_clients_exclude_each_other() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "mp/exclusion";
    let n = 25u64;
    let mut kids: Vec<Kid> = ["a", "b"]
        .iter()
        .map(|name| {
            Kid::spawn(
                "two_clients_exclude_each_other",
                "contender",
                name,
                &server.endpoint(),
                dir.path(),
                key,
                &[(ROUNDS_VAR, n.to_string())],
            )
        })
        .collect();
    for k in &mut kids {
        k.wait_success(Duration::from_secs(120));
    }
    let mut holds: Vec<Vec<u64>> = ["a", "b"]
        .iter()
        .flat_map(|name| read_log(dir.path(), name))
        .collect();
    assert_eq!(holds.len() as u64, 2 * n);
    assert_exclusive(&mut holds);
    for w in holds.windows(2) {
        assert!(
            w[1][2] > w[0][2],
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
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "mp/failover";
    let mut kid = Kid::spawn(
        "sigkilled_holder_is_replaced_after_its_ttl",
        "holder",
        "holder",
        &server.endpoint(),
        dir.path(),
        key,
        &[],
    );
    let gen_dead = report_u64(&kid.wait_report(Duration::from_secs(60)), "gen");
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    // Alive and keeping its session: the claim holds well past one TTL.
    std::thread::sleep(TTL * 2);
    assert!(
        lease.try_claim().expect("claim").is_none(),
        "live holder lost its claim"
    );
    kid.sigkill();
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

#[test]
fn stale_claims_write_and_release_are_rejected() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "mp/stale";
    let mut kid = Kid::spawn(
        "stale_claims_write_and_release_are_rejected",
        "paused",
        "paused",
        &server.endpoint(),
        dir.path(),
        key,
        &[],
    );
    let gen_old = report_u64(&kid.wait_report(Duration::from_secs(60)), "gen");
    // A holder that stalls (GC pause, SIGSTOP, a VM freeze) stops refreshing its session.
    kid.signal(rustix::process::Signal::STOP);
    let lease = EtcdLease::new(&connect(&server.endpoint()), key, 0u64).expect("lease");
    let c = lease
        .acquire(Duration::from_secs(15))
        .expect("acquire")
        .expect("the stalled holder was not replaced");
    assert!(c.generation() > gen_old);
    assert!(lease.write(&c, 7).expect("write"));
    std::fs::write(dir.path().join("go"), "").expect("go file");
    kid.signal(rustix::process::Signal::CONT);
    kid.wait_success(Duration::from_secs(60));
    let after = std::fs::read_to_string(dir.path().join("paused.after")).expect("child report");
    for field in ["write", "release", "beat", "current", "read"] {
        assert_eq!(
            common::report_value(&after, field),
            "false",
            "the stale holder's {field} was not rejected: {after}"
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
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, max, workers, n) = ("mp/pool", 2u32, 4, 15u64);
    let mut kids: Vec<Kid> = (0..workers)
        .map(|i| {
            Kid::spawn(
                "semaphore_never_exceeds_max_across_processes",
                "sem_worker",
                &format!("w{i}"),
                &server.endpoint(),
                dir.path(),
                key,
                &[(ROUNDS_VAR, n.to_string()), (MAX_VAR, max.to_string())],
            )
        })
        .collect();
    for k in &mut kids {
        k.wait_success(Duration::from_secs(120));
    }
    let holds: Vec<(u64, u64)> = (0..workers)
        .flat_map(|i| read_log(dir.path(), &format!("w{i}")))
        .map(|h| (h[0], h[1]))
        .collect();
    assert_eq!(holds.len() as u64, workers as u64 * n);
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
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, max) = ("mp/recover", 2u32);
    let mut kid = Kid::spawn(
        "semaphore_recovers_a_killed_holders_permit",
        "sem_holder",
        "holder",
        &server.endpoint(),
        dir.path(),
        key,
        &[(MAX_VAR, max.to_string())],
    );
    kid.wait_report(Duration::from_secs(60));
    let pool = EtcdSemaphore::open(&connect(&server.endpoint()), key, max).expect("pool");
    assert!(pool.try_take().expect("take"), "one permit should be free");
    assert!(
        !pool.try_take().expect("take"),
        "S1: a third permit out of 2"
    );
    assert_eq!(pool.available().expect("available"), 0);
    kid.sigkill();
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

    let mut kids: Vec<Kid> = ["a", "b"]
        .iter()
        .map(|name| {
            Kid::spawn(
                "etcd_restart_mid_test_keeps_exclusion_and_fencing",
                "restart_contender",
                name,
                &endpoint,
                dir.path(),
                key,
                &[],
            )
        })
        .collect();
    // Let them contend, then crash the server (SIGKILL) and start it on the same data.
    let contended = |min: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while ["a", "b"]
            .iter()
            .map(|n| read_log(dir.path(), n).len())
            .min()
            .unwrap_or(0)
            < min
        {
            assert!(Instant::now() < deadline, "children made no progress");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    contended(5);
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    std::fs::write(dir.path().join("restarted"), "").expect("marker");
    // Both make progress again after the restart.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ["a", "b"]
        .iter()
        .any(|n| read_log(dir.path(), n).iter().filter(|h| h[4] == 1).count() < 5)
    {
        assert!(Instant::now() < deadline, "no progress after the restart");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    for k in &mut kids {
        k.wait_success(Duration::from_secs(60));
    }

    let mut holds: Vec<Vec<u64>> = ["a", "b"]
        .iter()
        .flat_map(|name| read_log(dir.path(), name))
        .collect();
    let (applied, unknown) = holds.iter().fold((0, 0), |(a, u), h| match h[3] {
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
    assert!(holds.iter().all(|h| h[2] > stale.generation()));
    let fresh = EtcdLease::new(&connect(&endpoint), key, 0u64).expect("lease");
    let c = fresh
        .acquire(Duration::from_secs(10))
        .expect("acquire")
        .expect("vacant after the children");
    assert!(c.generation() > holds.iter().map(|h| h[2]).max().unwrap_or(0));
    let v = fresh.read(&c).expect("read").expect("holder reads");
    assert!(
        (100 + applied..=100 + applied + unknown).contains(&v),
        "payload {v}: expected 100 + {applied} applied (+ up to {unknown} unknown) increments"
    );
}

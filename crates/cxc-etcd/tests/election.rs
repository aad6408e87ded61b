//! Leader election on a real etcd server, with real processes: a SIGKILLed leader, a
//! SIGSTOPped leader and a leader whose work loop stops renewing are replaced by a
//! standby; the deposed leader sees the loss and its fenced writes are refused. The
//! fenced key's log shows, in acceptance order, tokens that never go down (no two
//! leaders' accepted writes interleave). And `etcdctl elect` and a Rust candidate on one
//! name see each other.
//!
//! Children report events (`ev=leading|refused|lost`, with token and `CLOCK_MONOTONIC`
//! time). Sessions use a 1 s TTL and progress-driven renewal (`KeepAlive::OnBeat`).

mod common;

use std::time::{Duration, Instant};

use common::{EtcdServer, child, etcdctl_elect, mono_ns, wait_printed};
use cxc_etcd::{
    ElectionBackend, Etcd, EtcdElection, EtcdFencedKey, EtcdOptions, FencedResource, KeepAlive,
};
use cxc_sync::election::{ElectionConfig, ElectionError, Elector};
use cxc_testkit::{Proc, arg, fields, report, role, try_arg};

const TTL: Duration = Duration::from_secs(1);

fn connect(endpoint: &str) -> Etcd {
    let opts = EtcdOptions::default()
        .ttl(TTL)
        .keep_alive(KeepAlive::OnBeat);
    Etcd::connect(&[endpoint], opts).expect("connect")
}

fn event(ev: &str, token: u64) {
    report(format!("ev={ev} token={token} t={}", mono_ns()));
}

/// A candidate: campaigns; while leading, appends `token name seq;` to the fenced key,
/// then renews, every 20 ms. Role argument `stall=after_ms:for_ms` stops its loop once
/// for `for_ms`. In a child, plays the role and exits; in the parent, returns.
fn child_dispatch() {
    let Some(role) = role() else { return };
    assert_eq!(role, "candidate");
    let name = arg("name");
    let etcd = connect(&arg("endpoint"));
    let backend = EtcdElection::new(&etcd, &arg("key")).expect("election");
    let cfg = ElectionConfig::new(format!("cand-{name}"))
        .lease_duration(TTL)
        .retry_period(Duration::from_millis(50));
    let el = Elector::new(backend, cfg).expect("elector");
    let res = EtcdFencedKey::new(&etcd, RES).expect("resource");
    let mut stall = try_arg("stall").map(|s| {
        let s = s.into_string().expect("UTF-8");
        let (a, b) = s.split_once(':').expect("after:for");
        (
            Duration::from_millis(a.parse().expect("ms")),
            Duration::from_millis(b.parse().expect("ms")),
        )
    });
    let l = el
        .campaign(Duration::from_secs(50))
        .expect("campaign")
        .expect("elected");
    let token = l.token();
    event("leading", token);
    let started = Instant::now();
    for seq in 0u64.. {
        if let Some((after, hold)) = stall
            && started.elapsed() >= after
        {
            std::thread::sleep(hold);
            stall = None;
        }
        let line = format!("{token} {name} {seq};");
        if !res.append(token, line.as_bytes()).expect("append") {
            event("refused", token);
        }
        match l.renew() {
            Ok(()) => {}
            Err(ElectionError::Lost { .. }) => {
                // A deposed leader that writes anyway (stopped between its write and its
                // renewal, it learns of the loss first) is refused.
                let line = format!("{token} {name} late;");
                if !res.append(token, line.as_bytes()).expect("append") {
                    event("refused", token);
                }
                event("lost", token);
                break;
            }
            Err(e) => panic!("renew: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::process::exit(0);
}

/// The fenced key the candidates write.
const RES: &str = "elect/res";

struct Run {
    server: EtcdServer,
    etcd: Etcd,
}

impl Run {
    fn new() -> Self {
        let server = EtcdServer::start();
        let etcd = connect(&server.endpoint());
        Run { server, etcd }
    }

    fn spawn(&self, test: &str, name: &str, stall: Option<&str>) -> Proc {
        let mut c = child(test, "candidate", &self.server.endpoint(), "elect/e").arg("name", name);
        if let Some(s) = stall {
            c = c.arg("stall", s);
        }
        c.spawn()
    }

    /// The next `ev` that candidate `kid` reports (skipping others): `(token, t)`.
    fn wait_event(&self, kid: &mut Proc, ev: &str, timeout: Duration) -> (u64, u64) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = kid.next_report(left);
            let f = fields(&r);
            if f["ev"] == ev {
                return (f["token"].parse().unwrap(), f["t"].parse().unwrap());
            }
        }
    }

    /// The distinct tokens of the fenced key's log, checked never to go down.
    fn terms(&self) -> Vec<u64> {
        let (mark, data) = EtcdFencedKey::new(&self.etcd, RES).unwrap().read().unwrap();
        let tokens = common::log_tokens(&data, "leaders");
        assert_eq!(tokens.last().copied().unwrap_or(0), mark);
        let mut t = tokens;
        t.dedup();
        t
    }

    fn wait_wrote(&self, token: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.terms().contains(&token) {
            assert!(Instant::now() < deadline, "leader {token} never wrote");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Candidate `a` leads and writes while standby `b` waits; then `depose` (a signal)
    /// is done to `a`, and `b` leads. Prints how long that took (named `what`) and
    /// returns `a`, `b`, their tokens and that time.
    fn failover(
        &self,
        test: &str,
        what: &str,
        depose: impl FnOnce(&mut Proc),
    ) -> (Proc, Proc, u64, u64, Duration) {
        let mut a = self.spawn(test, "a", None);
        let (ta, _) = self.wait_event(&mut a, "leading", Duration::from_secs(20));
        let mut b = self.spawn(test, "b", None);
        self.wait_wrote(ta);
        std::thread::sleep(Duration::from_millis(300));
        let deposed = mono_ns();
        depose(&mut a);
        let (tb, t) = self.wait_event(&mut b, "leading", Duration::from_secs(20));
        let took = Duration::from_nanos(t.saturating_sub(deposed));
        eprintln!("etcd {what} failover {took:?} (TTL {TTL:?})");
        assert!(tb > ta);
        self.wait_wrote(tb);
        (a, b, ta, tb, took)
    }
}

/// SIGKILL: the standby leads once the leader's session expires (one TTL after its last
/// renewal, plus the watch's delivery).
#[test]
fn etcd_sigkilled_leader_is_replaced_within_the_ttl() {
    child_dispatch();
    let run = Run::new();
    let t = "etcd_sigkilled_leader_is_replaced_within_the_ttl";
    let (_a, _b, ta, tb, took) = run.failover(t, "SIGKILL", Proc::kill);
    assert!(took < TTL + Duration::from_millis(1500), "took {took:?}");
    assert_eq!(run.terms(), vec![ta, tb]);
}

/// SIGSTOP past the TTL: the standby leads; the continued leader's write is refused and
/// it sees the loss.
#[test]
fn etcd_sigstopped_leader_is_replaced_and_fenced() {
    child_dispatch();
    let run = Run::new();
    let t = "etcd_sigstopped_leader_is_replaced_and_fenced";
    let (mut a, _b, ta, tb, _) = run.failover(t, "SIGSTOP", |a| a.stop());
    a.cont();
    run.wait_event(&mut a, "refused", Duration::from_secs(20));
    run.wait_event(&mut a, "lost", Duration::from_secs(20));
    a.finish(Duration::from_secs(20));
    assert_eq!(run.terms(), vec![ta, tb]);
}

/// A leader whose loop stops renewing (process alive) is replaced; resumed, its write is
/// refused and it sees the loss.
#[test]
fn etcd_leader_that_stops_renewing_loses_while_alive() {
    child_dispatch();
    const T: &str = "etcd_leader_that_stops_renewing_loses_while_alive";
    let run = Run::new();
    let mut a = run.spawn(T, "a", Some("300:2500"));
    let (ta, _) = run.wait_event(&mut a, "leading", Duration::from_secs(20));
    let mut b = run.spawn(T, "b", None);
    let (tb, _) = run.wait_event(&mut b, "leading", Duration::from_secs(20));
    assert!(tb > ta);
    run.wait_event(&mut a, "refused", Duration::from_secs(20));
    run.wait_event(&mut a, "lost", Duration::from_secs(20));
    a.finish(Duration::from_secs(20));
    run.wait_wrote(tb);
    assert_eq!(run.terms(), vec![ta, tb]);
}

/// A Rust leader and `etcdctl elect` on one name: `etcdctl elect -l` prints the Rust
/// leader's identity; an `etcdctl elect` candidate waits while it leads and is elected
/// when it steps down; then Rust observers see its proposal and token, and a Rust
/// campaign waits.
#[test]
fn etcdctl_elect_and_rust_candidates_see_each_other() {
    let run = Run::new();
    let name = "interop/leader";
    let cand = |id: &str| {
        let b = EtcdElection::new(&run.etcd, name).expect("election");
        Elector::new(b, ElectionConfig::new(id).lease_duration(TTL)).expect("elector")
    };
    let a = cand("rust-a");
    let b = cand("rust-b");
    let la = a.campaign(Duration::from_secs(5)).unwrap().expect("vacant");
    let mut observer = etcdctl_elect(&run.server.endpoint(), &["-l", name]);
    wait_printed(&mut observer, "rust-a", Duration::from_secs(10));
    drop(observer);

    let mut go = etcdctl_elect(&run.server.endpoint(), &[name, "go-proposal"]);
    // While Rust leads (renewing), etcdctl waits and Rust rivals see rust-a.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        la.renew().expect("renew");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!go.stdout().contains("go-proposal"));
    assert!(b.campaign(Duration::from_millis(200)).unwrap().is_none());
    assert_eq!(b.observe().unwrap().unwrap().identity, "rust-a");
    let ta = la.token();
    la.step_down().expect("step down");
    wait_printed(&mut go, "go-proposal", Duration::from_secs(10));
    let seen = b.observe().unwrap().expect("a leader");
    assert_eq!(seen.identity, "go-proposal");
    assert!(seen.token > ta);
    assert!(b.backend().try_lead("rust-b").unwrap().is_none());
}

//! Leader election on a real etcd server, with real processes: a SIGKILLed leader, a
//! SIGSTOPped leader and a leader whose work loop stops renewing are replaced by a
//! standby; the deposed leader sees the loss and its fenced writes are refused. The
//! fenced key's log shows, in acceptance order, tokens that never go down (no two
//! leaders' accepted writes interleave). And `etcdctl elect` and a Rust candidate on one
//! name see each other.
//!
//! Children report events (`leading`, `refused`, `lost`, with token and
//! `CLOCK_MONOTONIC` time) as lines of `<dir>/<name>.events`. Sessions use a 1 s TTL
//! and progress-driven renewal (`KeepAlive::OnBeat`).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{EtcdServer, Kid, child_dir, env, mono_ns, role};
use cxc_etcd::{
    ElectionBackend, Etcd, EtcdElection, EtcdFencedKey, EtcdOptions, FencedResource, KeepAlive,
};
use cxc_sync::election::{ElectionConfig, ElectionError, Elector};

const TTL: Duration = Duration::from_secs(1);
const ID_VAR: &str = "CXC_ETCD_ID";
const RES_VAR: &str = "CXC_ETCD_RES";
const STALL_VAR: &str = "CXC_ETCD_STALL";

fn connect(endpoint: &str) -> Etcd {
    let opts = EtcdOptions::default()
        .ttl(TTL)
        .keep_alive(KeepAlive::OnBeat);
    Etcd::connect(&[endpoint], opts).expect("connect")
}

fn event(name: &str, ev: &str, token: u64) {
    let path = child_dir().join(format!("{name}.events"));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("events");
    writeln!(f, "{ev} {token} {}", mono_ns()).expect("event");
}

/// A candidate: campaigns; while leading, appends `token id seq;` to the fenced key,
/// then renews, every 20 ms. `STALL=after_ms:for_ms` stops its loop once for `for_ms`.
fn child_dispatch() {
    let Some(role) = role() else { return };
    assert_eq!(role, "candidate");
    let name = env(common::NAME_VAR);
    let etcd = connect(&env(common::ENDPOINT_VAR));
    let backend = EtcdElection::new(&etcd, &env(common::KEY_VAR)).expect("election");
    let cfg = ElectionConfig::new(env(ID_VAR))
        .lease_duration(TTL)
        .retry_period(Duration::from_millis(50));
    let el = Elector::new(backend, cfg).expect("elector");
    let res = EtcdFencedKey::new(&etcd, &env(RES_VAR)).expect("resource");
    let mut stall = std::env::var(STALL_VAR).ok().map(|s| {
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
    event(&name, "leading", token);
    let started = Instant::now();
    for seq in 0u64.. {
        if let Some((after, hold)) = stall {
            if started.elapsed() >= after {
                std::thread::sleep(hold);
                stall = None;
            }
        }
        let line = format!("{token} {name} {seq};");
        if !res.append(token, line.as_bytes()).expect("append") {
            event(&name, "refused", token);
        }
        match l.renew() {
            Ok(()) => {}
            Err(ElectionError::Lost { .. }) => {
                // A deposed leader that writes anyway (stopped between its write and its
                // renewal, it learns of the loss first) is refused.
                let line = format!("{token} {name} late;");
                if !res.append(token, line.as_bytes()).expect("append") {
                    event(&name, "refused", token);
                }
                event(&name, "lost", token);
                std::process::exit(0);
            }
            Err(e) => panic!("renew: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Run {
    server: EtcdServer,
    dir: tempfile::TempDir,
    etcd: Etcd,
}

impl Run {
    fn new() -> Self {
        let server = EtcdServer::start();
        let etcd = connect(&server.endpoint());
        Run {
            server,
            dir: tempfile::tempdir().expect("tempdir"),
            etcd,
        }
    }

    fn spawn(&self, test: &str, name: &str, stall: Option<&str>) -> Kid {
        let mut envs = vec![
            (ID_VAR, format!("cand-{name}")),
            (RES_VAR, "elect/res".to_string()),
        ];
        if let Some(s) = stall {
            envs.push((STALL_VAR, s.to_string()));
        }
        Kid::spawn(
            test,
            "candidate",
            name,
            &self.server.endpoint(),
            self.dir.path(),
            "elect/e",
            &envs,
        )
    }

    /// The first `ev` of child `name`: `(token, t)`.
    fn wait_event(&self, name: &str, ev: &str, timeout: Duration) -> (u64, u64) {
        let path = self.dir.path().join(format!("{name}.events"));
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| l.starts_with(&format!("{ev} "))) {
                let w: Vec<u64> = l.split(' ').skip(1).map(|x| x.parse().unwrap()).collect();
                return (w[0], w[1]);
            }
            assert!(
                Instant::now() < deadline,
                "{name}: no {ev} within {timeout:?}; events {text:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The distinct tokens of the fenced key's log, checked never to go down.
    fn terms(&self) -> Vec<u64> {
        let (mark, data) = EtcdFencedKey::new(&self.etcd, "elect/res")
            .unwrap()
            .read()
            .unwrap();
        let text = String::from_utf8(data).unwrap();
        let tokens: Vec<u64> = text
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| s.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "accepted writes of two leaders interleave: {tokens:?}"
        );
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
}

/// SIGKILL: the standby leads once the leader's session expires (one TTL after its last
/// renewal, plus the watch's delivery).
#[test]
fn etcd_sigkilled_leader_is_replaced_within_the_ttl() {
    child_dispatch();
    const T: &str = "etcd_sigkilled_leader_is_replaced_within_the_ttl";
    let run = Run::new();
    let mut a = run.spawn(T, "a", None);
    let (ta, _) = run.wait_event("a", "leading", Duration::from_secs(20));
    let _b = run.spawn(T, "b", None);
    run.wait_wrote(ta);
    std::thread::sleep(Duration::from_millis(300));
    let killed = mono_ns();
    a.sigkill();
    let (tb, t) = run.wait_event("b", "leading", Duration::from_secs(20));
    let took = Duration::from_nanos(t.saturating_sub(killed));
    eprintln!("etcd SIGKILL failover {took:?} (TTL {TTL:?})");
    assert!(took < TTL + Duration::from_millis(1500), "took {took:?}");
    assert!(tb > ta);
    run.wait_wrote(tb);
    assert_eq!(run.terms(), vec![ta, tb]);
}

/// SIGSTOP past the TTL: the standby leads; the continued leader's write is refused and
/// it sees the loss.
#[test]
fn etcd_sigstopped_leader_is_replaced_and_fenced() {
    child_dispatch();
    const T: &str = "etcd_sigstopped_leader_is_replaced_and_fenced";
    let run = Run::new();
    let mut a = run.spawn(T, "a", None);
    let (ta, _) = run.wait_event("a", "leading", Duration::from_secs(20));
    let _b = run.spawn(T, "b", None);
    run.wait_wrote(ta);
    std::thread::sleep(Duration::from_millis(300));
    let stopped = mono_ns();
    a.signal(rustix::process::Signal::STOP);
    let (tb, t) = run.wait_event("b", "leading", Duration::from_secs(20));
    let took = Duration::from_nanos(t.saturating_sub(stopped));
    eprintln!("etcd SIGSTOP failover {took:?} (TTL {TTL:?})");
    assert!(tb > ta);
    run.wait_wrote(tb);
    a.signal(rustix::process::Signal::CONT);
    run.wait_event("a", "refused", Duration::from_secs(20));
    run.wait_event("a", "lost", Duration::from_secs(20));
    a.wait_success(Duration::from_secs(20));
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
    let (ta, _) = run.wait_event("a", "leading", Duration::from_secs(20));
    let _b = run.spawn(T, "b", None);
    let (tb, _) = run.wait_event("b", "leading", Duration::from_secs(20));
    assert!(tb > ta);
    run.wait_event("a", "refused", Duration::from_secs(20));
    run.wait_event("a", "lost", Duration::from_secs(20));
    a.wait_success(Duration::from_secs(20));
    run.wait_wrote(tb);
    assert_eq!(run.terms(), vec![ta, tb]);
}

fn etcdctl_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CXC_ETCDCTL_BIN") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcdctl"))
            .find(|p| p.is_file())
    });
    let bin = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/etcdctl"));
    assert!(
        bin.is_file(),
        "this test needs `etcdctl` (scripts/install-deps.sh)"
    );
    bin
}

/// `etcdctl elect ARGS` with stdout in `out`; SIGKILLed and reaped on drop.
struct Etcdctl(Child);

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn etcdctl_elect(endpoint: &str, args: &[&str], out: &Path) -> Etcdctl {
    Etcdctl(
        Command::new(etcdctl_binary())
            .arg(format!("--endpoints={endpoint}"))
            .arg("elect")
            .args(args)
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).expect("output file"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn etcdctl"),
    )
}

fn wait_output(path: &Path, needle: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        if s.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "etcdctl printed {s:?}, not {needle:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Rust leader and `etcdctl elect` on one name: `etcdctl elect -l` prints the Rust
/// leader's identity; an `etcdctl elect` candidate waits while it leads and is elected
/// when it steps down; then Rust observers see its proposal and token, and a Rust
/// campaign waits.
#[test]
fn etcdctl_elect_and_rust_candidates_see_each_other() {
    child_dispatch();
    let run = Run::new();
    let name = "interop/leader";
    let cand = |id: &str| {
        let b = EtcdElection::new(&run.etcd, name).expect("election");
        Elector::new(b, ElectionConfig::new(id).lease_duration(TTL)).expect("elector")
    };
    let a = cand("rust-a");
    let b = cand("rust-b");
    let la = a.campaign(Duration::from_secs(5)).unwrap().expect("vacant");
    let observed = run.dir.path().join("observe.out");
    let observer = etcdctl_elect(&run.server.endpoint(), &["-l", name], &observed);
    wait_output(&observed, "rust-a", Duration::from_secs(10));
    drop(observer);

    let campaign = run.dir.path().join("campaign.out");
    let _go = etcdctl_elect(&run.server.endpoint(), &[name, "go-proposal"], &campaign);
    // While Rust leads (renewing), etcdctl waits and Rust rivals see rust-a.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        la.renew().expect("renew");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !std::fs::read_to_string(&campaign)
            .unwrap_or_default()
            .contains("go-proposal")
    );
    assert!(b.campaign(Duration::from_millis(200)).unwrap().is_none());
    assert_eq!(b.observe().unwrap().unwrap().identity, "rust-a");
    let ta = la.token();
    la.step_down().expect("step down");
    wait_output(&campaign, "go-proposal", Duration::from_secs(10));
    let seen = b.observe().unwrap().expect("a leader");
    assert_eq!(seen.identity, "go-proposal");
    assert!(seen.token > ta);
    assert!(b.backend().try_lead("rust-b").unwrap().is_none());
}

//! Interop with etcd's own recipes: `etcdctl lock NAME` (etcd's `concurrency.Mutex`) and
//! [`EtcdLease`] on the same name exclude each other, and their fencing tokens (the
//! create revision of the holder's key) come from one sequence; `etcdctl elect NAME`
//! (`concurrency.Election`) sees an `EtcdLease` holder as its leader.
//!
//! `etcdctl lock NAME CMD` runs `CMD` while it holds the lock, with `ETCD_LOCK_KEY` and
//! `ETCD_LOCK_REV` in its environment; here `CMD` is this test binary in a child role
//! that records its hold. `etcdctl` is `$CXC_ETCDCTL_BIN`, else on `PATH`, else
//! `/usr/bin/etcdctl` (Debian `etcd-client`, installed by `scripts/install-deps.sh`); a
//! missing binary fails the tests.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    DIR_VAR, ENDPOINT_VAR, EtcdServer, NAME_VAR, ROLE_VAR, child_dir, child_wait_for_file, env,
    max_overlap, mono_ns, publish, role,
};
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, FencedLease};

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
        "the interop tests need `etcdctl` (looked at $CXC_ETCDCTL_BIN, PATH, \
         /usr/bin/etcdctl). Install it with `scripts/install-deps.sh` (Debian package \
         etcd-client)."
    );
    bin
}

/// An `etcdctl` process, SIGKILLed and reaped on drop (a failed test leaves none behind).
struct Etcdctl(Child);

impl Drop for Etcdctl {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `etcdctl lock <name>` running this binary's test `test` as `role`, child `name`.
fn etcdctl_lock(
    endpoint: &str,
    lock: &str,
    test: &str,
    role: &str,
    name: &str,
    dir: &Path,
) -> Etcdctl {
    let exe = std::env::current_exe().expect("current_exe");
    let child = Command::new(etcdctl_binary())
        .arg(format!("--endpoints={endpoint}"))
        .arg("lock")
        .arg(lock)
        // etcdctl parses flags after the name; `--` ends them.
        .arg("--")
        .arg(exe)
        .args([test, "--exact", "--test-threads=1"])
        .env("ETCDCTL_API", "3")
        .env(ROLE_VAR, role)
        .env(DIR_VAR, dir)
        .env(NAME_VAR, name)
        .env(ENDPOINT_VAR, endpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn etcdctl");
    Etcdctl(child)
}

fn wait_exit(child: &mut Etcdctl, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            assert!(s.success(), "etcdctl lock failed: {s}");
            return;
        }
        if Instant::now() > deadline {
            panic!("etcdctl lock did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// If this process runs under `etcdctl lock`, plays its role and exits.
fn child_dispatch() {
    let Some(role) = role() else { return };
    let key = env("ETCD_LOCK_KEY");
    // The fencing token of etcdctl's hold: its key's create revision (ETCD_LOCK_REV is
    // the revision of the response that acquired the lock, not the key's).
    let rev = create_revision(&env(ENDPOINT_VAR), &key);
    let dir = child_dir();
    let name = env(NAME_VAR);
    match role.as_str() {
        // Holds 30 ms; appends `start end rev` to `<name>.log`.
        "hold" => {
            let t0 = mono_ns();
            std::thread::sleep(Duration::from_millis(30));
            let t1 = mono_ns();
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{name}.log")))
                .expect("log");
            writeln!(f, "{t0} {t1} {rev}").expect("log");
        }
        // Says it holds (`<name>.holding`: rev and key), then waits for `<name>.go`.
        "linger" => {
            publish(
                &dir.join(format!("{name}.holding")),
                &format!("{rev} {key}"),
            );
            child_wait_for_file(&dir.join(format!("{name}.go")));
        }
        other => panic!("unknown role {other:?}"),
    }
    std::process::exit(0);
}

/// The create revision of `key` (which must exist).
fn create_revision(endpoint: &str, key: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("connect");
        let resp = c.get(key, None).await.expect("get");
        resp.kvs()
            .first()
            .expect("the lock key exists")
            .create_revision() as u64
    })
}

fn lease(server: &EtcdServer, name: &str) -> EtcdLease<u64> {
    let opts = EtcdOptions::default().ttl(Duration::from_secs(2));
    let etcd = Etcd::connect(&[server.endpoint()], opts).expect("connect");
    EtcdLease::new(&etcd, name, 0).expect("lease")
}

fn wait_file(path: &Path, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} not written within {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 8 `etcdctl lock` holds and 8 `EtcdLease` holds on one name, contending: no two holds
/// overlap, and ordered by time their fencing tokens increase.
#[test]
fn etcdctl_lock_and_etcd_lease_never_hold_at_once() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "interop/contend";
    let rounds = 8;
    let endpoint = server.endpoint();
    let dir_path = dir.path().to_path_buf();
    let etcdctl = std::thread::spawn(move || {
        for _ in 0..rounds {
            let mut c = etcdctl_lock(
                &endpoint,
                name,
                "etcdctl_lock_and_etcd_lease_never_hold_at_once",
                "hold",
                "etcdctl",
                &dir_path,
            );
            wait_exit(&mut c, Duration::from_secs(60));
        }
    });
    let lease = lease(&server, name);
    let mut holds: Vec<(u64, u64, u64)> = Vec::new();
    for _ in 0..rounds {
        let c = lease
            .acquire(Duration::from_secs(30))
            .expect("acquire")
            .expect("acquire timed out");
        let t0 = mono_ns();
        std::thread::sleep(Duration::from_millis(30));
        let t1 = mono_ns();
        holds.push((t0, t1, c.generation()));
        assert!(lease.release(&c).expect("release"));
        std::thread::sleep(Duration::from_millis(20));
    }
    etcdctl.join().expect("etcdctl thread");
    let theirs: Vec<(u64, u64, u64)> = std::fs::read_to_string(dir.path().join("etcdctl.log"))
        .expect("etcdctl holds")
        .lines()
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect();
            (v[0], v[1], v[2])
        })
        .collect();
    assert_eq!(theirs.len(), rounds);
    holds.extend(theirs);
    let intervals: Vec<(u64, u64)> = holds.iter().map(|h| (h.0, h.1)).collect();
    assert_eq!(
        max_overlap(&intervals),
        1,
        "an etcdctl hold and a lease hold overlapped"
    );
    holds.sort_by_key(|h| h.0);
    assert!(
        holds.windows(2).all(|w| w[1].2 > w[0].2),
        "fencing tokens do not grow with time: {holds:?}"
    );
}

/// While an `EtcdLease` holds, `etcdctl lock` waits; while `etcdctl lock` holds, the lease
/// cannot be claimed, shows the etcdctl holder's revision, and an `acquire` gets it right
/// after etcdctl lets go, with a larger generation.
#[test]
fn etcdctl_lock_waits_for_etcd_lease_and_back() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "interop/handover";
    let test = "etcdctl_lock_waits_for_etcd_lease_and_back";
    let lease = lease(&server, name);

    let ours = lease.try_claim().expect("claim").expect("vacant");
    let mut waiting = etcdctl_lock(&server.endpoint(), name, test, "linger", "a", dir.path());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !dir.path().join("a.holding").exists(),
        "etcdctl lock ran while an EtcdLease held the name"
    );
    assert!(lease.release(&ours).expect("release"));
    let held = wait_file(&dir.path().join("a.holding"), Duration::from_secs(10));
    let rev: u64 = held
        .split_whitespace()
        .next()
        .expect("rev")
        .parse()
        .expect("rev");
    assert!(
        rev > ours.generation(),
        "etcdctl's token {rev} after ours {}",
        ours.generation()
    );
    assert!(
        held.contains(&format!("{name}/")),
        "etcdctl's key is under the name: {held}"
    );

    // etcdctl holds now: the lease sees it and waits.
    assert_eq!(lease.try_claim().expect("claim"), None);
    assert_eq!(lease.holder().expect("holder").map(|h| h.1), Some(rev));
    let released = std::thread::scope(|s| {
        let acquirer = s.spawn(|| lease.acquire(Duration::from_secs(20)));
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !acquirer.is_finished(),
            "acquire returned while etcdctl held"
        );
        publish(&dir.path().join("a.go"), "");
        wait_exit(&mut waiting, Duration::from_secs(10));
        acquirer.join().expect("acquirer")
    });
    let claim = released.expect("acquire").expect("the lease after etcdctl");
    assert!(claim.generation() > rev);
    assert!(lease.write(&claim, 5).expect("write"));
    assert!(lease.release(&claim).expect("release"));
}

/// `etcdctl elect <name> <proposal>` (etcd's `concurrency.Election`) with its output in
/// `out`; SIGKILLed on drop.
fn etcdctl_elect(endpoint: &str, args: &[&str], out: &Path) -> Etcdctl {
    let child = Command::new(etcdctl_binary())
        .arg(format!("--endpoints={endpoint}"))
        .arg("elect")
        .args(args)
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).expect("output file"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn etcdctl");
    Etcdctl(child)
}

/// Elections use the same layout: `etcdctl elect -l` sees an `EtcdLease` holder as the
/// leader (its key and `host:pid`), a campaign waits until the lease is released, and
/// then the lease sees the elected proposal as its holder.
#[test]
fn etcdctl_elect_sees_the_etcd_lease_holder_as_leader() {
    child_dispatch();
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "interop/elect";
    let lease = lease(&server, name);
    let ours = lease.try_claim().expect("claim").expect("vacant");
    let tag = lease.holder().expect("holder").expect("held").0;

    let observed = dir.path().join("observe.out");
    let observer = etcdctl_elect(&server.endpoint(), &["-l", name], &observed);
    let seen = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = std::fs::read_to_string(&observed).unwrap_or_default();
            if s.contains(&tag) {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "etcdctl elect -l printed {s:?}, not {tag:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(
        seen.contains(&format!("{name}/{:x}", ours.session())),
        "{seen}"
    );
    drop(observer);

    let campaign = dir.path().join("campaign.out");
    let _candidate = etcdctl_elect(&server.endpoint(), &[name, "go-proposal"], &campaign);
    std::thread::sleep(Duration::from_millis(1500));
    let early = std::fs::read_to_string(&campaign).unwrap_or_default();
    assert!(
        !early.contains("go-proposal"),
        "elected while the lease was held: {early:?}"
    );
    assert!(lease.release(&ours).expect("release"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&campaign)
        .unwrap_or_default()
        .contains("go-proposal")
    {
        assert!(
            Instant::now() < deadline,
            "etcdctl elect not elected after the release"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        lease.try_claim().expect("claim"),
        None,
        "the elected leader holds"
    );
    let (value, rev) = lease.holder().expect("holder").expect("held");
    assert_eq!(value, "go-proposal");
    assert!(rev > ours.generation());
}

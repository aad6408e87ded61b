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

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{EtcdServer, etcdctl_command, etcdctl_elect, max_overlap, mono_ns, wait_printed};
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, FencedLease};
use cxc_testkit::{
    Proc, REPORT_PREFIX, RoleCommand, arg, fields, path_arg, report, role, wait_for_path,
};

/// `etcdctl lock <lock>` running this binary's test `test` in `role`, as child `name`
/// that works in `dir`. The child's reports come through etcdctl's stdout.
fn etcdctl_lock(
    endpoint: &str,
    lock: &str,
    test: &str,
    role: &str,
    name: &str,
    dir: &Path,
) -> Proc {
    let inner: Command = RoleCommand::new(test, role)
        .arg("endpoint", endpoint)
        .arg("name", name)
        .arg("dir", dir)
        .into_command();
    // etcdctl parses flags after the name; `--` ends them.
    let mut cmd = etcdctl_command(endpoint, &["lock", lock, "--"]);
    cmd.arg(inner.get_program()).args(inner.get_args());
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    Proc::spawn(
        cmd,
        &format!("etcdctl lock {lock} running {name} as {role}"),
    )
}

/// If this process runs under `etcdctl lock`, plays its role and exits.
fn child_dispatch() {
    let Some(role) = role() else { return };
    let key = std::env::var("ETCD_LOCK_KEY").expect("run by etcdctl lock");
    // The fencing token of etcdctl's hold: its key's create revision (ETCD_LOCK_REV is
    // the revision of the response that acquired the lock, not the key's).
    let rev = create_revision(&arg("endpoint"), &key);
    match role.as_str() {
        // Holds 30 ms; reports `start end rev`.
        "hold" => {
            let t0 = mono_ns();
            std::thread::sleep(Duration::from_millis(30));
            report(format!("start={t0} end={} rev={rev}", mono_ns()));
        }
        // Says it holds (rev and key), then waits for `<dir>/<name>.go`.
        "linger" => {
            report(format!("rev={rev} key={key}"));
            let go = path_arg("dir").join(format!("{}.go", arg("name")));
            assert!(wait_for_path(&go, common::CHILD_PATIENCE), "no go");
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

/// A test's etcd server, a scratch directory for its children, and an [`EtcdLease`] on
/// `name` (TTL 2 s) connected to the server.
fn setup(name: &str) -> (EtcdServer, tempfile::TempDir, EtcdLease<u64>) {
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let lease = lease(&server, name);
    (server, dir, lease)
}

fn lease(server: &EtcdServer, name: &str) -> EtcdLease<u64> {
    let opts = EtcdOptions::default().ttl(Duration::from_secs(2));
    let etcd = Etcd::connect(&[server.endpoint()], opts).expect("connect");
    EtcdLease::new(&etcd, name, 0).expect("lease")
}

/// 8 `etcdctl lock` holds and 8 `EtcdLease` holds on one name, contending: no two holds
/// overlap, and ordered by time their fencing tokens increase.
#[test]
fn etcdctl_lock_and_etcd_lease_never_hold_at_once() {
    child_dispatch();
    let name = "interop/contend";
    let (server, dir, lease) = setup(name);
    let rounds = 8;
    let endpoint = server.endpoint();
    let dir_path = dir.path().to_path_buf();
    let etcdctl = std::thread::spawn(move || {
        let test = "etcdctl_lock_and_etcd_lease_never_hold_at_once";
        (0..rounds)
            .map(|_| {
                let mut c = etcdctl_lock(&endpoint, name, test, "hold", "etcdctl", &dir_path);
                let reports = c.finish(Duration::from_secs(60));
                assert_eq!(reports.len(), 1, "one hold per etcdctl lock: {reports:?}");
                let f = fields(&reports[0]);
                let num = |k: &str| -> u64 { f[k].parse().expect("a number") };
                (num("start"), num("end"), num("rev"))
            })
            .collect::<Vec<_>>()
    });
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
    let theirs = etcdctl.join().expect("etcdctl thread");
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
    let name = "interop/handover";
    let (server, dir, lease) = setup(name);
    let test = "etcdctl_lock_waits_for_etcd_lease_and_back";

    let ours = lease.try_claim().expect("claim").expect("vacant");
    let mut waiting = etcdctl_lock(&server.endpoint(), name, test, "linger", "a", dir.path());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !waiting.stdout().contains(REPORT_PREFIX),
        "etcdctl lock ran while an EtcdLease held the name"
    );
    assert!(lease.release(&ours).expect("release"));
    let held = waiting.next_report(Duration::from_secs(10));
    let rev: u64 = fields(&held)["rev"].parse().expect("rev");
    assert!(
        rev > ours.generation(),
        "etcdctl's token {rev} after ours {}",
        ours.generation()
    );
    assert!(
        fields(&held)["key"].starts_with(&format!("{name}/")),
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
        std::fs::write(dir.path().join("a.go"), "").expect("go file");
        waiting.finish(Duration::from_secs(10));
        acquirer.join().expect("acquirer")
    });
    let claim = released.expect("acquire").expect("the lease after etcdctl");
    assert!(claim.generation() > rev);
    assert!(lease.write(&claim, 5).expect("write"));
    assert!(lease.release(&claim).expect("release"));
}

/// Elections use the same layout: `etcdctl elect -l` sees an `EtcdLease` holder as the
/// leader (its key and `host:pid`), a campaign waits until the lease is released, and
/// then the lease sees the elected proposal as its holder.
#[test]
fn etcdctl_elect_sees_the_etcd_lease_holder_as_leader() {
    let server = EtcdServer::start();
    let name = "interop/elect";
    let lease = lease(&server, name);
    let ours = lease.try_claim().expect("claim").expect("vacant");
    let tag = lease.holder().expect("holder").expect("held").0;

    let mut observer = etcdctl_elect(&server.endpoint(), &["-l", name]);
    wait_printed(&mut observer, &tag, Duration::from_secs(10));
    let seen = observer.stdout();
    assert!(
        seen.contains(&format!("{name}/{:x}", ours.session())),
        "{seen}"
    );
    drop(observer);

    let mut candidate = etcdctl_elect(&server.endpoint(), &[name, "go-proposal"]);
    std::thread::sleep(Duration::from_millis(1500));
    let early = candidate.stdout();
    assert!(
        !early.contains("go-proposal"),
        "elected while the lease was held: {early:?}"
    );
    assert!(lease.release(&ours).expect("release"));
    wait_printed(&mut candidate, "go-proposal", Duration::from_secs(10));
    assert_eq!(
        lease.try_claim().expect("claim"),
        None,
        "the elected leader holds"
    );
    let (value, rev) = lease.holder().expect("holder").expect("held");
    assert_eq!(value, "go-proposal");
    assert!(rev > ours.generation());
}

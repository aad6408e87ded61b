//! Client-side plumbing of the etcd tests: connections, one scenario at a time, raw
//! requests that look at etcd behind the backend's back, and member lists.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cxc_etcd::{Etcd, EtcdElection, EtcdError, EtcdOptions, KeepAlive};
use cxc_sync::election::{ElectionConfig, Elector};

use super::EtcdCluster;

/// One scenario with servers at a time in a test binary: the scenarios measure timing,
/// and several clusters at once on a small machine would measure each other.
static ONE: Mutex<()> = Mutex::new(());

/// Holds [`ONE`] while the guard lives (a test that panicked does not poison it).
pub fn serial() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection to `endpoints` (tried in that order) with sessions of `ttl` kept alive
/// by `keep_alive`, requests timing out after `request`, connects after 500 ms.
pub fn connect(
    endpoints: &[String],
    ttl: Duration,
    keep_alive: KeepAlive,
    request: Duration,
) -> Etcd {
    let opts = EtcdOptions::default()
        .ttl(ttl)
        .keep_alive(keep_alive)
        .request_timeout(request)
        .connect_timeout(Duration::from_millis(500));
    Etcd::connect(endpoints, opts).expect("connect")
}

/// An elector for the election `name` as candidate `id`, terms of `lease`, retrying
/// every 50 ms.
pub fn elector(etcd: &Etcd, name: &str, id: &str, lease: Duration) -> Elector<EtcdElection> {
    let b = EtcdElection::new(etcd, name).expect("election");
    let cfg = ElectionConfig::new(id)
        .lease_duration(lease)
        .retry_period(Duration::from_millis(50));
    Elector::new(b, cfg).expect("elector")
}

/// A runtime for raw `etcd_client` requests.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The keys under `prefix`, straight from etcd (through `etcd`'s client).
pub fn keys_under(etcd: &Etcd, prefix: &str) -> Vec<String> {
    let mut c = etcd.client();
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    match rt().block_on(async move { c.get(prefix, Some(opts)).await }) {
        Ok(r) => r
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect(),
        Err(e) => panic!("get {prefix}: {e}"),
    }
}

/// Revokes etcd lease (session) `id` behind its holder's back, as `etcdctl lease revoke`.
pub fn revoke(etcd: &Etcd, id: i64) {
    let mut c = etcd.client();
    rt().block_on(async move { c.lease_revoke(id).await })
        .expect("revoke a session from outside");
}

/// The endpoints of the members other than `i`.
pub fn others(c: &EtcdCluster, i: usize) -> Vec<String> {
    let mut e = c.endpoints();
    e.remove(i);
    e
}

/// The endpoints, rotated so that member `first` comes first (the one requests go to).
pub fn starting_with(c: &EtcdCluster, first: usize) -> Vec<String> {
    let mut e = c.endpoints();
    e.rotate_left(first);
    e
}

/// The tokens of an appended `<token> <rest>;` log (a fenced key's writes), checked never
/// to go down: writes of two `holders` (terms, leaders) must not interleave.
pub fn log_tokens(data: &[u8], holders: &str) -> Vec<u64> {
    let text = String::from_utf8(data.to_vec()).expect("utf-8");
    let tokens: Vec<u64> = text
        .split(';')
        .filter(|s| !s.is_empty())
        .map(|s| s.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "accepted writes of two {holders} interleave: {tokens:?}"
    );
    tokens
}

/// Retries `f` on `Err` for up to `patience` (the first requests after a failover or a
/// membership change may meet the election), then panics naming `what`.
pub fn patiently<T>(
    what: &str,
    patience: Duration,
    mut f: impl FnMut() -> Result<T, EtcdError>,
) -> T {
    let until = Instant::now() + patience;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() < until => {
                eprintln!("{what}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

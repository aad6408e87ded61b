//! The backend property suite of `cxc-sync` (`crates/cxc-sync/tests/suite/mod.rs`), run
//! through the traits against a real etcd server. (The same suite runs on the
//! mapped-file primitives in `crates/cxc-sync/tests/backend.rs`.)

mod common;
#[path = "../../cxc-sync/tests/suite/mod.rs"]
mod suite;

use std::time::Duration;

use common::EtcdServer;
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, EtcdSemaphore, KeepAlive};

fn connect(server: &EtcdServer, keep_alive: KeepAlive) -> Etcd {
    let opts = EtcdOptions::default()
        .ttl(Duration::from_secs(2))
        .keep_alive(keep_alive);
    Etcd::connect(&[server.endpoint()], opts).expect("connect")
}

/// The lease suite, each handle on its own connection (as separate processes would
/// have), its session kept alive as `keep_alive` says.
fn lease_properties(keep_alive: KeepAlive) {
    let server = EtcdServer::start();
    suite::lease_properties(|| {
        EtcdLease::new(&connect(&server, keep_alive), "suite/lease", 0u64).expect("lease")
    });
}

#[test]
fn etcd_lease_properties() {
    lease_properties(KeepAlive::Background);
}

#[test]
fn etcd_lease_properties_beat_driven() {
    lease_properties(KeepAlive::OnBeat);
}

#[test]
fn etcd_pool_properties() {
    let server = EtcdServer::start();
    let etcd = connect(&server, KeepAlive::Background);
    // Handles on one connection (distinct sessions) and on their own connections.
    suite::pool_properties(|| EtcdSemaphore::open(&etcd, "suite/pool", 3).expect("pool"));
    suite::pool_properties(|| {
        EtcdSemaphore::open(&connect(&server, KeepAlive::Background), "suite/pool2", 3)
            .expect("pool")
    });
}

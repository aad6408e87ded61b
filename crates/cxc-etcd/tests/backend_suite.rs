//! The backend property suite of `cxc-sync` (`crates/cxc-sync/tests/suite/mod.rs`), run
//! through the traits against both backends from one binary: the mapped-file primitives
//! and a real etcd server.

mod common;
#[path = "../../cxc-sync/tests/suite/mod.rs"]
mod suite;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::EtcdServer;
use cxc_etcd::{Etcd, EtcdLease, EtcdOptions, EtcdSemaphore, KeepAlive};
use cxc_sync::{LeaseOptions, MmapLease, OwnerLease, Preemption, SharedSemaphore};

static NEXT_PID: AtomicU32 = AtomicU32::new(30_000_000);

fn connect(server: &EtcdServer, keep_alive: KeepAlive) -> Etcd {
    let opts = EtcdOptions::default()
        .ttl(Duration::from_secs(2))
        .keep_alive(keep_alive);
    Etcd::connect(&[server.endpoint()], opts).expect("connect")
}

#[test]
fn mmap_lease_properties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("suite.lease");
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    drop(OwnerLease::create_with(&path, 0u64, &opts).expect("create"));
    suite::lease_properties(|| {
        let lease = OwnerLease::<u64>::open(&path).expect("open");
        MmapLease::new(lease, NEXT_PID.fetch_add(1, Ordering::Relaxed), 3)
    });
}

#[test]
fn mmap_pool_properties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("suite.sem");
    drop(SharedSemaphore::create(&path, 3, 3).expect("create"));
    suite::pool_properties(|| SharedSemaphore::open(&path).expect("open"));
}

#[test]
fn etcd_lease_properties() {
    let server = EtcdServer::start();
    // Each handle its own connection, as separate processes would have.
    suite::lease_properties(|| {
        EtcdLease::new(
            &connect(&server, KeepAlive::Background),
            "suite/lease",
            0u64,
        )
        .expect("lease")
    });
}

#[test]
fn etcd_lease_properties_beat_driven() {
    let server = EtcdServer::start();
    suite::lease_properties(|| {
        EtcdLease::new(&connect(&server, KeepAlive::OnBeat), "suite/lease", 0u64).expect("lease")
    });
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

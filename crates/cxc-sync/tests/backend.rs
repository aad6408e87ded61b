//! The backend property suite (`tests/suite/mod.rs`) on the mapped-file backends:
//! [`MmapLease`] over [`OwnerLease`] and [`SharedSemaphore`].
#![cfg(not(cxc_loom))]

mod suite;

use std::sync::atomic::{AtomicU32, Ordering};

use cxc_sync::{LeaseOptions, MmapLease, OwnerLease, Preemption, SharedSemaphore};

/// Fake pids (above `PID_MAX_LIMIT`): one holder identity per handle, as separate
/// processes would be.
static NEXT_PID: AtomicU32 = AtomicU32::new(20_000_000);

#[test]
fn mmap_lease_properties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("suite.lease");
    let opts = LeaseOptions {
        // The suite expects a live holder to keep its claim (etcd has no preemption).
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

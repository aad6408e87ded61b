//! One application, two backends: the same job-counter code runs on a mapped-file lease
//! (one machine) and on etcd (many machines); only the line that constructs the lease
//! differs.
//!
//! ```text
//! cargo run --manifest-path crates/cxc-etcd/Cargo.toml --example switch_backend                        # starts a throwaway etcd
//! cargo run --manifest-path crates/cxc-etcd/Cargo.toml --example switch_backend -- http://127.0.0.1:2379  # uses yours
//! ```
//!
//! Without an endpoint the example starts the local `etcd` binary (Debian `etcd-server`,
//! see `scripts/install-deps.sh`) on a free loopback port in a temporary directory.

#[path = "../tests/common/etcd.rs"]
mod etcd;

use std::error::Error;
use std::time::Duration;

use cxc_etcd::EtcdLease;
use cxc_sync::{FencedLease, MmapLease, OwnerLease};

/// The application: count jobs under a fenced lease. It only knows the trait: claim,
/// read, write through the claim (refused if the claim went stale), beat, release.
fn count_jobs<L: FencedLease<Value = u64>>(lease: &L, jobs: u32) -> Result<u64, L::Error> {
    let mut last = 0;
    for _ in 0..jobs {
        let Some(claim) = lease.acquire(Duration::from_secs(5))? else {
            continue; // somebody else is busy: skip this job
        };
        let done = lease.read(&claim)?.unwrap_or(0);
        if lease.write(&claim, done + 1)? {
            last = done + 1;
        } // else: we lost the lease meanwhile, and the write was refused
        lease.beat(&claim)?;
        lease.release(&claim)?;
    }
    println!(
        "  {jobs} jobs counted; counter is now {last} ({})",
        std::any::type_name::<L>()
    );
    Ok(last)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let (endpoint, _local_server) = match std::env::args().nth(1) {
        Some(e) => (e, None),
        None => {
            let s = etcd::EtcdServer::start();
            (s.endpoint(), Some(s))
        }
    };

    println!("one machine: OwnerLease in a mapped file");
    let file = dir.path().join("jobs.lease");
    let lease = MmapLease::new(OwnerLease::create(&file, 0u64)?, std::process::id(), 3);
    count_jobs(&lease, 10)?;

    println!("many machines: EtcdLease at {endpoint}");
    let lease = EtcdLease::connect(&[&endpoint], "cxc-demo/jobs", 0u64)?;
    count_jobs(&lease, 10)?;
    Ok(())
}

//! Regression tests for inputs the cargo-fuzz targets in `fuzz/` found (docs/RELIABILITY.md,
//! "Fuzzing"). Each test builds the hostile file the target produced — a valid file whose
//! body was overwritten — and runs the calls that panicked on it; none may panic.

use std::os::unix::fs::FileExt;
use std::path::Path;

use cxc_sync::OwnerLease;

/// The file header's length; a primitive's fixed block starts right after it.
const HEADER_LEN: u64 = 128;
/// `term` in the lease block (docs/owner-lease.md): checkpoint of the full generation.
const LEASE_TERM: u64 = HEADER_LEN + 24;

/// Overwrites `bytes` at `offset` of the body (the header checksum does not cover the
/// body, so the file still opens).
fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// Found by `open_lease` and `inspect` (fuzz artifact with `term` =
/// 0xffff_ffff_ff1c_eee7): `full_generation` computes `term + ((gen30 - term) mod 2^30)`
/// with a plain `+`, which overflows for a `term` near `u64::MAX`: a panic in debug builds
/// (`attempt to add with overflow`, lease/state.rs), a silent wrap in release builds.
/// Reached from `status()`, `lease::inspect` (so `cxc inspect`) and every granted claim.
#[test]
fn lease_with_term_near_u64_max_does_not_panic() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    drop(OwnerLease::<u64>::create(&p, 0).unwrap());
    patch(&p, LEASE_TERM, &u64::MAX.to_ne_bytes());

    let lease = OwnerLease::<u64>::open(&p).expect("the header is untouched");
    let _ = lease.status();
    let _ = lease.current_claim();
    let _ = cxc_sync::lease::inspect(&p);
    if let Some(claim) = lease.try_claim(7, 1) {
        let _ = lease.is_current(&claim);
        let _ = lease.release_claim(&claim);
    }
}

/// `claim` in the lease block, and its WRITE bit (docs/owner-lease.md).
const LEASE_CLAIM: u64 = HEADER_LEN;
const WRITE_BIT: u64 = 1 << 14;

/// Runs `f` on another thread; fails if it does not return within `limit` (the thread is
/// left spinning until the test binary exits).
fn returns_within<R: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not return within {limit:?}"))
}

/// Found by `open_lease` (a libFuzzer timeout): a claim word that names pid P with the
/// WRITE bit set — P died in the middle of `write_as_owner`/`with_lease` — makes
/// `release(P)` spin forever in `LeaseState::release_from` ("another thread of this
/// holder is mid-write; it finishes in bounded time"), although no thread is writing.
/// In the field: a crashed holder's pid reused by, or restarted as (containers often
/// reuse the same pid), a process that calls `release(my_pid)`. `try_acquire(P)` returns
/// `true` first (idempotent for the holder), so the pair `try_acquire`/`release` hangs.
#[test]
fn release_of_claim_with_orphaned_write_bit_returns() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let pid = 4_000_000; // a pid no process has (above the default pid_max)
    let lease = OwnerLease::<u64>::create(&p, 0).unwrap();
    assert!(lease.try_acquire(pid, 1));
    drop(lease);
    let mut word = [0u8; 8];
    let f = std::fs::File::open(&p).unwrap();
    f.read_exact_at(&mut word, LEASE_CLAIM).unwrap();
    patch(
        &p,
        LEASE_CLAIM,
        &(u64::from_ne_bytes(word) | WRITE_BIT).to_ne_bytes(),
    );

    let lease = OwnerLease::<u64>::open(&p).unwrap();
    assert_eq!(lease.current_owner(), Some(pid));
    returns_within(std::time::Duration::from_secs(5), move || {
        let _ = lease.try_acquire(pid, 1);
        lease.release(pid)
    });
}

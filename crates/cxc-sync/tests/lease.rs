//! Unit tests of `OwnerLease<T>`: the seed's 11 behaviours and the fencing beyond it.

use std::path::PathBuf;
use std::time::Duration;

use cxc_sync::{EpochMode, LeaseError, LeaseOptions, OwnerLease, Preemption};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A new `OwnerLease<u64>` holding 0 (default options) in a fresh directory: the
/// directory, the file's path, the lease.
fn fresh() -> (tempfile::TempDir, PathBuf, OwnerLease<u64>) {
    let d = tmp();
    let path = d.path().join("l");
    let lease = OwnerLease::create(&path, 0).unwrap();
    (d, path, lease)
}

/// A [`fresh`] lease that `pid` acquired (with `grace`), and its directory.
fn held_by(pid: u32, grace: u64) -> (tempfile::TempDir, OwnerLease<u64>) {
    let (d, _, lease) = fresh();
    assert!(lease.try_acquire(pid, grace));
    (d, lease)
}

#[test]
fn acquire_release_round_trip() {
    let d = tmp();
    let lease: OwnerLease<u64> = OwnerLease::create(d.path().join("l"), 7).unwrap();
    assert_eq!(lease.current_owner(), None);
    assert!(lease.try_acquire(100, 3));
    assert_eq!(lease.current_owner(), Some(100));
    assert!(lease.am_i_owner(100));
    assert!(lease.try_acquire(100, 3), "idempotent for the holder");
    assert!(lease.release(100));
    assert_eq!(lease.current_owner(), None);
    assert!(!lease.release(100), "second release is refused");
}

#[test]
fn lower_pid_preempts_higher() {
    let (_d, lease) = held_by(200, 3);
    assert!(
        !lease.try_acquire(300, 3),
        "higher pid cannot preempt a live holder"
    );
    assert!(lease.try_acquire(100, 3), "lower pid preempts");
    assert_eq!(lease.current_owner(), Some(100));
    assert!(!lease.am_i_owner(200));
}

#[test]
fn never_preempt_policy_keeps_live_holder() {
    let d = tmp();
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    let lease: OwnerLease<u64> = OwnerLease::create_with(d.path().join("l"), 0, &opts).unwrap();
    assert!(lease.try_acquire(200, 3));
    assert!(!lease.try_acquire(100, 3));
    for _ in 0..4 {
        lease.tick_epoch();
    }
    assert!(lease.try_acquire(100, 3), "stale holder is taken over");
    // The policy is stored in the file.
    let other: OwnerLease<u64> = OwnerLease::open(d.path().join("l")).unwrap();
    assert_eq!(other.preemption(), Preemption::Never);
}

#[test]
fn owner_only_read_write() {
    let d = tmp();
    let lease: OwnerLease<u64> = OwnerLease::create(d.path().join("l"), 5).unwrap();
    assert_eq!(lease.read_as_owner(100), None);
    assert!(!lease.write_as_owner(100, 6));
    assert!(lease.try_acquire(100, 3));
    assert_eq!(lease.read_as_owner(100), Some(5));
    assert!(lease.write_as_owner(100, 6));
    assert_eq!(lease.read_as_owner(100), Some(6));
    assert_eq!(lease.read_as_owner(101), None);
    assert!(!lease.write_as_owner(101, 9));
    assert_eq!(lease.read_as_owner(100), Some(6));
}

#[test]
fn with_lease_closure_raii() {
    let d = tmp();
    let lease: OwnerLease<u64> = OwnerLease::create(d.path().join("l"), 21).unwrap();
    let prev = lease.with_lease(100, 3, |v| {
        let p = *v;
        *v = p * 2;
        p
    });
    assert_eq!(prev, Some(21));
    assert_eq!(lease.current_owner(), None, "released on return");
    assert!(lease.try_acquire(100, 3));
    assert_eq!(lease.read_as_owner(100), Some(42));
    // Held by someone else: refused, nothing runs.
    let mut ran = false;
    assert_eq!(
        lease.with_lease(200, 3, |_| {
            ran = true;
        }),
        None
    );
    assert!(!ran);
    // Held by the caller: runs and keeps the lease.
    assert_eq!(lease.with_lease(100, 3, |v| *v += 1), Some(()));
    assert_eq!(lease.current_owner(), Some(100));
    assert_eq!(lease.read_as_owner(100), Some(43));
}

#[test]
fn with_lease_panic_publishes_nothing_and_releases() {
    let d = tmp();
    let lease: OwnerLease<u64> = OwnerLease::create(d.path().join("l"), 1).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lease.with_lease(100, 3, |v| {
            *v = 99;
            panic!("boom");
        })
    }));
    assert!(r.is_err());
    assert_eq!(lease.current_owner(), None);
    assert_eq!(lease.with_lease(100, 3, |v| *v), Some(1));
}

#[test]
fn stale_owner_failover_within_grace() {
    let (_d, lease) = held_by(100, 3);
    for _ in 0..3 {
        lease.tick_epoch();
        assert!(!lease.try_acquire(200, 3), "lag <= grace keeps the holder");
    }
    lease.tick_epoch();
    assert!(
        lease.try_acquire(200, 3),
        "lag > grace: stale holder replaced"
    );
    assert_eq!(lease.current_owner(), Some(200));
}

#[test]
fn beat_keeps_owner_alive() {
    let (_d, lease) = held_by(100, 2);
    for _ in 0..20 {
        lease.tick_epoch();
        assert!(lease.beat(100));
        assert!(!lease.try_acquire(200, 2));
    }
    assert_eq!(lease.current_owner(), Some(100));
}

#[test]
fn lease_term_advances_on_every_handover() {
    let (_d, _, lease) = fresh();
    let t0 = lease.lease_term();
    let a = lease.try_claim(300, 3).unwrap();
    assert_eq!(lease.lease_term(), t0 + 1);
    let b = lease.try_claim(200, 3).unwrap();
    assert_eq!(lease.lease_term(), t0 + 2);
    assert!(b.generation() > a.generation());
    assert!(lease.release_claim(&b));
    let c = lease.try_claim(300, 3).unwrap();
    assert!(c.generation() > b.generation());
    assert_eq!(c.generation(), lease.lease_term());
}

#[test]
fn generations_keep_increasing_past_checkpoints() {
    let (_d, _, lease) = fresh();
    let mut last = 0;
    for i in 0..70_000u32 {
        let c = lease.try_claim(1 + (i % 2), 3).unwrap();
        assert!(c.generation() > last);
        last = c.generation();
        assert!(lease.release_claim(&c));
    }
    assert_eq!(last, 70_000);
    assert_eq!(lease.lease_term(), 70_000);
}

#[test]
fn cross_handle_visibility() {
    let (_d, p, a) = fresh();
    let b: OwnerLease<u64> = OwnerLease::open(&p).unwrap();
    assert!(a.try_acquire(100, 3));
    assert_eq!(b.current_owner(), Some(100));
    assert!(a.write_as_owner(100, 77));
    assert_eq!(b.read_as_owner(100), Some(77));
    assert!(!b.try_acquire(200, 3));
    b.tick_epoch();
    assert_eq!(a.current_epoch(), 1);
}

#[test]
fn disk_persistence() {
    let (_d, p, a) = fresh();
    assert!(a.try_acquire(100, 3));
    assert!(a.write_as_owner(100, 1234));
    assert!(a.release(100));
    drop(a); // the file is all that is left
    let b: OwnerLease<u64> = OwnerLease::open(&p).unwrap();
    assert_eq!(b.with_lease(100, 3, |v| *v), Some(1234));
}

#[test]
fn beat_after_preemption_is_false() {
    let (_d, lease) = held_by(200, 3);
    assert!(lease.beat(200));
    assert!(lease.try_acquire(100, 3));
    assert!(!lease.beat(200));
    assert!(!lease.release(200));
    assert_eq!(lease.current_owner(), Some(100));
}

#[derive(Debug, Clone, Copy, PartialEq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct Job {
    id: u64,
    progress: u32,
    flags: u32,
    name: [u8; 16],
}

#[test]
fn struct_payload_round_trip() {
    let d = tmp();
    let init = Job {
        id: 1,
        progress: 2,
        flags: 3,
        name: *b"sixteen bytes!!!",
    };
    let lease: OwnerLease<Job> = OwnerLease::create(d.path().join("l"), init).unwrap();
    assert!(lease.try_acquire(100, 3));
    assert_eq!(lease.read_as_owner(100), Some(init));
    let next = Job {
        progress: 50,
        ..init
    };
    assert!(lease.write_as_owner(100, next));
    assert_eq!(lease.read_as_owner(100), Some(next));
}

#[test]
fn payload_of_48_bytes_round_trips_and_49_is_rejected() {
    let d = tmp();
    let v: [u64; 6] = [1, 2, 3, 4, 5, u64::MAX];
    let lease: OwnerLease<[u64; 6]> = OwnerLease::create(d.path().join("a"), v).unwrap();
    assert_eq!(lease.with_lease(1, 3, |x| *x), Some(v));
    let w: [u64; 6] = [9, 8, 7, 6, 5, 4];
    assert!(lease.try_acquire(1, 3));
    assert!(lease.write_as_owner(1, w));
    assert_eq!(lease.read_as_owner(1), Some(w));

    let big = OwnerLease::<[u8; 49]>::create(d.path().join("b"), [0; 49]);
    assert!(matches!(
        big,
        Err(LeaseError::PayloadTooLarge { max: 48, found: 49 })
    ));
    assert!(
        !d.path().join("b").exists(),
        "nothing created for a rejected type"
    );
}

#[test]
fn pid_zero_is_rejected_everywhere() {
    let (_d, _, lease) = fresh();
    assert!(!lease.try_acquire(0, 3));
    assert!(lease.try_claim(0, 3).is_none());
    assert!(lease.acquire(0, 3, Duration::from_millis(1)).is_none());
    assert_eq!(lease.with_lease(0, 3, |v| *v), None);
    assert!(!lease.release(0));
    assert!(!lease.beat(0));
    assert!(!lease.am_i_owner(0));
    assert_eq!(lease.read_as_owner(0), None);
    assert!(!lease.write_as_owner(0, 1));
    assert_eq!(lease.current_owner(), None);
}

#[test]
fn stale_claim_release_write_beat_are_rejected_after_handover() {
    let (_d, _, lease) = fresh();
    let old = lease.try_claim(100, 3).unwrap();
    assert!(lease.write_claimed(&old, 1));
    for _ in 0..4 {
        lease.tick_epoch();
    }
    let new = lease.try_claim(200, 3).unwrap();
    assert!(new.generation() > old.generation());
    assert!(!lease.is_current(&old));
    assert!(lease.is_current(&new));
    assert!(!lease.write_claimed(&old, 666));
    assert!(!lease.beat_claimed(&old));
    assert!(!lease.release_claim(&old));
    assert_eq!(lease.read_claimed(&old), None);
    assert_eq!(lease.read_claimed(&new), Some(1));
    assert_eq!(lease.current_owner(), Some(200));
    // Same pid again, newer generation: the old claim of pid 100 stays stale.
    assert!(lease.release_claim(&new));
    let again = lease.try_claim(100, 3).unwrap();
    assert_eq!(again.pid(), old.pid());
    assert!(!lease.is_current(&old));
    assert!(!lease.release_claim(&old));
    assert!(!lease.write_claimed(&old, 5));
    assert!(lease.is_current(&again));
    assert!(lease.write_claimed(&again, 5));
}

/// Every claim names the process that made it, also a claim made for another pid: that
/// process's threads are the ones that write under it.
#[test]
fn claims_record_the_identity_of_the_claiming_process() {
    let (_d, _, lease) = fresh();
    let me = std::process::id();
    assert!(lease.try_acquire(me, 1000));
    assert!(lease.status().owner_start.is_some());
    assert!(
        !lease.try_acquire(me.wrapping_add(1), 1000),
        "live holder kept"
    );
    assert!(lease.release(me));
    assert!(lease.try_acquire(u32::MAX - 1, 1000));
    assert_eq!(lease.current_owner(), Some(u32::MAX - 1));
    assert!(lease.status().owner_start.is_some());
}

#[test]
fn clock_epochs_need_no_ticker() {
    let d = tmp();
    let opts = LeaseOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(5),
        },
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    let lease: OwnerLease<u64> = OwnerLease::create_with(d.path().join("l"), 0, &opts).unwrap();
    let reopened: OwnerLease<u64> = OwnerLease::open(d.path().join("l")).unwrap();
    assert_eq!(reopened.epoch_mode(), opts.epoch);
    assert!(lease.try_acquire(100, 4));
    assert!(!lease.try_acquire(200, 4));
    std::thread::sleep(Duration::from_millis(60));
    assert!(
        lease.try_acquire(200, 4),
        "12 ticks without a beat > grace 4"
    );
    let zero = LeaseOptions {
        epoch: EpochMode::Clock {
            tick: Duration::ZERO,
        },
        ..LeaseOptions::default()
    };
    assert!(matches!(
        OwnerLease::<u64>::create_with(d.path().join("z"), 0, &zero),
        Err(LeaseError::InvalidOption(_))
    ));
}

#[test]
fn blocking_acquire_wakes_on_release_and_times_out() {
    let (_d, lease) = held_by(100, u64::MAX);
    let t = std::time::Instant::now();
    assert!(
        lease
            .acquire(200, u64::MAX, Duration::from_millis(50))
            .is_none()
    );
    assert!(t.elapsed() >= Duration::from_millis(50));
    std::thread::scope(|s| {
        let h = s.spawn(|| lease.acquire(200, u64::MAX, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(lease.release(100));
        let c = h.join().unwrap().expect("woken by release");
        assert_eq!(c.pid(), 200);
    });
    assert_eq!(lease.current_owner(), Some(200));
}

#[test]
fn open_validates_type_and_kind() {
    let d = tmp();
    let p = d.path().join("l");
    let _a: OwnerLease<u64> = OwnerLease::create(&p, 0).unwrap();
    assert!(matches!(
        OwnerLease::<u32>::open(&p),
        Err(LeaseError::File(cxc_mmf::MmfError::TypeMismatch { .. }))
    ));
    assert!(matches!(
        OwnerLease::<u64>::create(&p, 1),
        Err(LeaseError::File(cxc_mmf::MmfError::AlreadyExists { .. }))
    ));
    assert!(matches!(
        OwnerLease::<u64>::open(d.path().join("missing")),
        Err(LeaseError::File(cxc_mmf::MmfError::NotFound { .. }))
    ));
}

#[test]
fn threads_hammering_with_lease_lose_no_update() {
    let (_d, _, lease) = fresh();
    let per = 20_000u64;
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=2u32)
            .map(|pid| {
                let lease = &lease;
                s.spawn(move || {
                    let mut ok = 0;
                    while ok < per {
                        if lease.with_lease(pid, 3, |v| *v += 1).is_some() {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(lease.with_lease(9, 3, |v| *v), Some(total));
}

/// A claim whose recorded process is gone (here: the identity in its slot names another
/// process, as after pid reuse) is taken over at once, even mid-write; the unfinished
/// write is never published and the new holder is told the payload may be inconsistent.
#[test]
fn claim_of_a_dead_holder_mid_write_is_taken_over() {
    use std::os::unix::fs::FileExt;
    let d = tmp();
    let p = d.path().join("l");
    let me = std::process::id();
    {
        let lease: OwnerLease<u64> = OwnerLease::create(&p, 5).unwrap();
        assert!(lease.try_acquire(me, 3));
    }
    // Pretend the claim was made by an earlier process: its identity slot (slot 0 of the
    // table at body offset 768; the identity's unique word at +40) names another process,
    // and it died in the middle of a write (WRITE, bit 14 of the claim word at offset 0).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 128 + 768 + 40).unwrap();
    let unique = u64::from_ne_bytes(b);
    f.write_all_at(&(unique + 1).to_ne_bytes(), 128 + 768 + 40)
        .unwrap();
    f.read_exact_at(&mut b, 128).unwrap();
    f.write_all_at(&(u64::from_ne_bytes(b) | 1 << 14).to_ne_bytes(), 128)
        .unwrap();

    let lease: OwnerLease<u64> = OwnerLease::open(&p).unwrap();
    assert!(lease.status().writing);
    let c = lease
        .try_claim(me, 3)
        .expect("a dead holder is taken over at once");
    assert!(c.payload_may_be_inconsistent());
    assert_eq!(
        lease.read_claimed(&c),
        Some(5),
        "its unfinished write was not published"
    );
    assert!(lease.release_claim(&c));
}

/// Lease files of the previous format versions (1: pid-named claims, two buffers; 2: no
/// claim time; 3: no sentinel in the identity slots) are refused, by `open` and by the read-only `inspect`, with an error that
/// names both versions.
#[test]
fn old_format_version_is_refused_naming_both_versions() {
    use std::os::unix::fs::FileExt;
    assert_eq!(cxc_mmf::FORMAT_VERSION, 4);
    for old in [1u32, 2, 3] {
        let d = tmp();
        let p = d.path().join("l");
        drop(OwnerLease::<u64>::create(&p, 5).unwrap());
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&old.to_ne_bytes(), 8).unwrap();
        for err in [
            OwnerLease::<u64>::open(&p).unwrap_err(),
            cxc_sync::lease::inspect(&p).unwrap_err(),
        ] {
            match &err {
                cxc_sync::LeaseError::File(cxc_mmf::MmfError::UnsupportedVersion {
                    expected,
                    found,
                }) => {
                    assert_eq!((*expected, *found), (cxc_mmf::FORMAT_VERSION, old));
                }
                other => panic!("unexpected error {other:?}"),
            }
            let text = err.to_string();
            assert!(
                text.contains(&old.to_string())
                    && text.contains(&cxc_mmf::FORMAT_VERSION.to_string()),
                "{text}"
            );
        }
    }
}

/// The status names the epoch the current claim was made at ("since when"), read from
/// the file by the read-only `inspect`; a vacant lease has none.
#[test]
fn status_names_the_epoch_of_the_current_claim() {
    let d = tmp();
    let p = d.path().join("l");
    let lease = OwnerLease::<u64>::create(&p, 0).unwrap();
    let me = std::process::id();
    assert_eq!(cxc_sync::lease::inspect(&p).unwrap().claimed_epoch, None);
    for _ in 0..5 {
        lease.tick_epoch();
    }
    assert!(lease.try_acquire(me, 3));
    for _ in 0..4 {
        lease.tick_epoch();
    }
    let st = cxc_sync::lease::inspect(&p).unwrap();
    assert_eq!((st.claimed_epoch, st.epoch), (Some(5), 9));
    assert_eq!(lease.status().claimed_epoch, Some(5));
    lease.release(me);
    assert_eq!(cxc_sync::lease::inspect(&p).unwrap().claimed_epoch, None);
    assert!(lease.try_acquire(me, 3));
    assert_eq!(cxc_sync::lease::inspect(&p).unwrap().claimed_epoch, Some(9));
}

/// As [`fresh`], without preemption: a holder keeps the lease between its calls.
fn fresh_never() -> (tempfile::TempDir, PathBuf, OwnerLease<u64>) {
    let d = tmp();
    let path = d.path().join("l");
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    let lease = OwnerLease::create_with(&path, 0, &opts).unwrap();
    (d, path, lease)
}

/// The seed calls start from the handle's guess of the claim word (what its last
/// operation left). A guess made stale by another handle of the same process, or by
/// another pid, never releases, writes or claims what the caller does not hold, and a
/// stale vacant guess still claims a vacant lease.
#[test]
fn stale_handle_guesses_never_act_on_a_claim_the_caller_does_not_hold() {
    let (_d, path, a) = fresh_never();
    let b: OwnerLease<u64> = OwnerLease::open(&path).unwrap();
    let (me, other) = (std::process::id(), 1_000_003);
    const GRACE: u64 = 1_000;

    assert!(a.try_acquire(me, GRACE));
    // Another handle of this process releases `me`'s claim (the seed API is per pid).
    assert!(b.release(me));
    assert!(!a.write_as_owner(me, 5), "a's guess names a released claim");
    assert!(!a.release(me));
    assert!(
        a.with_lease(me, GRACE, |v| *v = 9).is_some(),
        "vacant: a claims"
    );
    assert_eq!(b.read_as_owner(me), None, "a released it again");

    // `other` holds it; a's guess is the vacant word it left.
    assert!(b.try_acquire(other, GRACE));
    assert!(!a.try_acquire(me, GRACE));
    assert!(!a.release(me));
    assert!(!a.write_as_owner(me, 7));
    assert_eq!(
        b.read_as_owner(other),
        Some(9),
        "nothing of a's was published"
    );
    assert!(b.release(other));
    // a's guess is stale (other's claim and release moved the generation): it still
    // claims the vacant lease, as a fresh load would.
    assert!(a.try_acquire(me, GRACE));
    assert!(a.write_as_owner(me, 11));
    assert_eq!(b.read_as_owner(me), Some(11));
    assert!(a.release(me));

    // a's guess is a live claim of another pid (made through a itself): a call for `me`
    // through a must not act on it.
    assert!(a.try_acquire(other, GRACE));
    assert!(!a.release(me), "a released other's claim for me");
    assert!(
        !a.write_as_owner(me, 13),
        "a wrote under other's claim for me"
    );
    assert!(a.am_i_owner(other) && !a.am_i_owner(me));
    assert_eq!(b.read_as_owner(other), Some(11));
    assert!(a.release(other));
}

/// Threads sharing one handle (and so its guess) and threads with handles of their own,
/// each for its own pid, increment through `with_lease` and through claim, read, write,
/// release: exclusion holds (no increment lost or doubled) while every guess goes stale
/// all the time.
#[test]
fn shared_and_separate_handles_exclude_each_other_under_stale_guesses() {
    let (_d, path, shared) = fresh_never();
    const ROUNDS: u64 = 2_000;
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (shared, path, done) = (&shared, &path, &done);
            s.spawn(move || {
                let own: OwnerLease<u64> = OwnerLease::open(path).unwrap();
                let lease = if t % 2 == 0 { shared } else { &own };
                let pid = 1_000_100 + t;
                for i in 0..ROUNDS {
                    let ok = if i % 2 == 0 {
                        lease.with_lease(pid, u64::MAX / 2, |v| *v += 1).is_some()
                    } else if lease.try_acquire(pid, u64::MAX / 2) {
                        let v = lease.read_as_owner(pid).expect("the holder reads");
                        assert!(lease.write_as_owner(pid, v + 1), "the holder writes");
                        assert!(lease.release(pid), "the holder releases");
                        true
                    } else {
                        false
                    };
                    if ok {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let total = done.load(std::sync::atomic::Ordering::Relaxed);
    assert!(total > 0);
    assert!(shared.try_acquire(std::process::id(), 3));
    assert_eq!(shared.read_as_owner(std::process::id()), Some(total));
}

/// A new lease file is `0600` by default (`LeaseOptions::mode`), whether made by
/// `create` or by the builder.
#[test]
fn new_lease_files_default_to_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let _seed: OwnerLease<u64> = OwnerLease::create(&a, 0).unwrap();
    let _built: OwnerLease<u64> = OwnerLease::builder(&b).create(0).unwrap();
    assert_eq!((mode(&a), mode(&b)), (0o600, 0o600));
}

//! Leader election on the mapped file, in one process: terms, events, progress-driven
//! loss, stepping down, the background renewer, and the fenced file.

use std::time::{Duration, Instant};

use cxc_sync::election::{FencedFileError, MmapElectionError};
use cxc_sync::{
    ElectionBackend, ElectionConfig, ElectionError, ElectionEvent, Elector, FencedFile,
    FencedResource, MmapElection, Renewal,
};

fn elector(path: &std::path::Path, id: &str, pid: u32, lease: Duration) -> Elector<MmapElection> {
    let b = MmapElection::create_or_open(path, lease)
        .expect("election file")
        .with_pid(pid);
    Elector::new(b, ElectionConfig::new(id).lease_duration(lease)).expect("elector")
}

#[test]
fn one_leader_events_and_step_down_hands_over_with_a_higher_token() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let a = elector(&p, "alpha", 1_000_001, Duration::from_secs(5));
    let b = elector(&p, "beta", 1_000_002, Duration::from_secs(5));
    let ev_a = a.events();
    let ev_b = b.events();
    let la = a.campaign(Duration::from_secs(1)).unwrap().expect("vacant");
    assert!(la.is_current().unwrap());
    la.renew().unwrap();
    assert_eq!(
        ev_a.try_recv().unwrap(),
        ElectionEvent::StartedLeading { token: la.token() }
    );
    // A rival's short campaign times out and observes the leader.
    assert!(b.campaign(Duration::from_millis(120)).unwrap().is_none());
    let seen = b.observe().unwrap().expect("a leader");
    assert_eq!(seen.identity, "alpha");
    assert_eq!(seen.token, la.token());
    assert!(
        matches!(ev_b.try_recv(), Ok(ElectionEvent::NewLeader { ref identity, .. }) if identity == "alpha")
    );
    let t1 = la.token();
    la.step_down().unwrap();
    assert!(matches!(
        ev_a.try_recv(),
        Ok(ElectionEvent::NewLeader { .. })
    ));
    assert_eq!(
        ev_a.try_recv().unwrap(),
        ElectionEvent::StoppedLeading { token: t1 }
    );
    let lb = b
        .campaign(Duration::from_secs(1))
        .unwrap()
        .expect("vacant again");
    assert!(lb.token() > t1);
    assert_eq!(b.observe().unwrap().unwrap().identity, "beta");
}

#[test]
fn a_leader_that_stops_renewing_loses_and_a_standby_leads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let lease = Duration::from_millis(150);
    let a = elector(&p, "stuck", 1_000_011, lease);
    let b = elector(&p, "standby", 1_000_012, lease);
    // The claim is made at some instant during `a.campaign`: timing from before it, a
    // takeover at `took` proves the leader held for at least `took` minus the campaign's
    // own duration (microseconds; timing from after it failed once under load, 149.8 ms
    // for a 150 ms lease claimed a little before the clock was read).
    let t0 = Instant::now();
    let la = a.campaign(Duration::from_secs(1)).unwrap().unwrap();
    let lb = b
        .campaign(Duration::from_secs(5))
        .unwrap()
        .expect("takes over");
    let took = t0.elapsed();
    assert!(
        took >= lease,
        "taken over after {took:?}, before the lease ran out"
    );
    assert!(lb.token() > la.token());
    assert!(matches!(la.renew(), Err(ElectionError::Lost { .. })));
    assert!(!la.is_current().unwrap());
    assert!(la.wait_lost(Duration::ZERO).unwrap());
    lb.renew().unwrap();
}

#[test]
fn without_a_standby_a_late_renew_still_reports_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let a = elector(&p, "late", 1_000_021, Duration::from_millis(60));
    let la = a.campaign(Duration::from_secs(1)).unwrap().unwrap();
    assert!(la.wait_lost(Duration::from_secs(2)).unwrap());
    assert!(matches!(la.renew(), Err(ElectionError::Lost { .. })));
    // It resigned: a newcomer leads at once.
    let b = elector(&p, "next", 1_000_022, Duration::from_secs(5));
    assert!(b.campaign(Duration::ZERO).unwrap().is_some());
}

#[test]
fn the_background_renewer_keeps_an_idle_leader() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let lease = Duration::from_millis(90);
    let b = MmapElection::create_or_open(&p, lease)
        .unwrap()
        .with_pid(1_000_031);
    let cfg = ElectionConfig::new("bg")
        .lease_duration(lease)
        .renewal(Renewal::Background);
    let a = Elector::new(b, cfg).unwrap();
    let la = a.campaign(Duration::from_secs(1)).unwrap().unwrap();
    let rival = elector(&p, "rival", 1_000_032, lease);
    assert!(
        rival
            .campaign(Duration::from_millis(400))
            .unwrap()
            .is_none()
    );
    assert!(la.is_current().unwrap());
    drop(la); // resigns (release on cancel)
    assert!(
        rival
            .campaign(Duration::from_millis(200))
            .unwrap()
            .is_some()
    );
}

#[test]
fn bad_configs_and_identities_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let b = MmapElection::create_or_open(&p, Duration::from_secs(1)).unwrap();
    assert!(matches!(
        Elector::new(b, ElectionConfig::new("")),
        Err(ElectionError::InvalidConfig(_))
    ));
    let b = MmapElection::create_or_open(&p, Duration::from_secs(1)).unwrap();
    let long = "x".repeat(40);
    assert!(matches!(
        b.try_lead(&long),
        Err(MmapElectionError::IdentityTooLong { len: 40 })
    ));
    let seed = cxc_sync::OwnerLease::create(dir.path().join("seed"), Default::default()).unwrap();
    assert!(matches!(
        MmapElection::new(seed, Duration::from_secs(1)),
        Err(MmapElectionError::ManualEpochs)
    ));
}

/// docs/leader-election.md, API and errors: `InvalidConfig` for a zero lease duration or
/// retry period, and for a renew period that is zero or not shorter than the lease only
/// with `Renewal::Background`; `MmapElection::new` refuses a preempting lease and a lease
/// duration that is not a positive number of epochs; an identity too long for the record
/// fails a campaign as a backend error.
#[test]
fn zero_durations_renew_periods_and_unusable_leases_are_typed_errors() {
    use cxc_sync::election::LeaderRecord;
    use cxc_sync::{OwnerLease, Preemption};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e");
    let backend = || MmapElection::create_or_open(&p, Duration::from_secs(1)).unwrap();
    let invalid = |c: ElectionConfig| {
        matches!(
            Elector::new(backend(), c),
            Err(ElectionError::InvalidConfig(_))
        )
    };
    let lease = Duration::from_secs(1);
    let bg = |renew: Duration| {
        ElectionConfig::new("a")
            .renewal(Renewal::Background)
            .renew_period(renew)
    };
    assert!(invalid(
        ElectionConfig::new("a").lease_duration(Duration::ZERO)
    ));
    assert!(invalid(
        ElectionConfig::new("a").retry_period(Duration::ZERO)
    ));
    assert!(invalid(bg(Duration::ZERO)));
    assert!(invalid(bg(lease)));
    assert!(invalid(bg(lease * 2)));
    Elector::new(backend(), bg(lease / 2)).expect("a renew period under the lease");
    // Without the background renewer the renew period is not used, nor checked.
    for renew in [Duration::ZERO, lease, lease * 2] {
        Elector::new(backend(), ElectionConfig::new("a").renew_period(renew))
            .expect("renew period unchecked with Renewal::Progress");
    }

    let (preempting, _) = OwnerLease::builder(dir.path().join("preempt"))
        .preemption(Preemption::LowerPid)
        .create_or_open(LeaderRecord::default())
        .unwrap();
    assert!(matches!(
        MmapElection::new(preempting, lease),
        Err(MmapElectionError::Preemption)
    ));
    assert!(matches!(
        MmapElection::create_or_open(&p, Duration::ZERO),
        Err(MmapElectionError::LeaseDuration(d)) if d.is_zero()
    ));
    assert!(matches!(
        MmapElection::create_or_open(&p, Duration::MAX),
        Err(MmapElectionError::LeaseDuration(d)) if d == Duration::MAX
    ));

    let e = Elector::new(backend(), ElectionConfig::new("x".repeat(40))).unwrap();
    match e.campaign(Duration::ZERO) {
        Err(ElectionError::Backend(source)) => assert!(
            matches!(
                source.downcast_ref::<MmapElectionError>(),
                Some(MmapElectionError::IdentityTooLong { len: 40 })
            ),
            "{source}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_fenced_file_refuses_older_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let f = FencedFile::open(dir.path().join("r")).unwrap();
    assert!(f.write(5, b"five").unwrap());
    assert!(f.append(5, b"+").unwrap());
    assert!(!f.write(4, b"four").unwrap());
    assert!(!f.append(4, b"x").unwrap());
    assert_eq!(f.read().unwrap(), (5, b"five+".to_vec()));
    assert!(f.write(7, b"seven").unwrap());
    assert_eq!(f.read().unwrap(), (7, b"seven".to_vec()));
    let other = FencedFile::open(dir.path().join("r")).unwrap();
    assert!(!other.write(6, b"six").unwrap());
    std::fs::write(dir.path().join("junk"), b"not fenced at all").unwrap();
    assert!(matches!(
        FencedFile::open(dir.path().join("junk")),
        Err(FencedFileError::NotFenced { .. })
    ));
}

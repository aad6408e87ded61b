//! Registration lifecycle: register, poll, drop, drop inside a policy callback, re-entrant
//! callbacks, panicking policies, background thread start and stop.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{Probe, private_sidecar};
use cxc_mmf::Kind;
use cxc_sidecar::{
    AdaptiveInstance, Observation, OpCode, Sidecar, SidecarBox, SidecarThread, Stats, Strategy,
};
use cxc_testkit::wait_until;

fn probe(dir: &tempfile::TempDir, name: &str) -> Probe {
    Probe::create(&dir.path().join(name))
}

/// Runs `f` on another thread; fails the test if it does not finish within 10 s (a
/// deadlock).
fn within_deadline<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not finish: deadlock?"))
}

/// A probe `a` (in a fresh directory) in a `SidecarBox` of a private sidecar: the
/// directory, the sidecar, the box.
fn boxed_probe() -> (tempfile::TempDir, &'static Sidecar, SidecarBox<Probe>) {
    let dir = tempfile::tempdir().unwrap();
    let sc = private_sidecar();
    let a = SidecarBox::new_in(sc, probe(&dir, "a"), None);
    (dir, sc, a)
}

#[test]
fn register_poll_drop() {
    let dir = tempfile::tempdir().unwrap();
    let sc = private_sidecar();
    let p = probe(&dir, "a");
    p.event(OpCode::SemReclaim.code(), 0, 1); // before registration: not reported
    let dropped = Arc::new(AtomicBool::new(false));
    let a = SidecarBox::new_in(sc, p.with_drop_flag(dropped.clone()), None);
    let id = a.id();
    assert_eq!(sc.len(), 1);
    let infos = sc.instances();
    assert_eq!(infos.len(), 1);
    assert_eq!(infos[0].id, id);
    assert_eq!(infos[0].kind, Kind::Test);
    assert_eq!(infos[0].name, a.name());
    assert_eq!(infos[0].policy, None);
    assert_eq!(
        (infos[0].strategy, infos[0].generation),
        (Strategy::Default, 0)
    );

    for i in 0..3 {
        a.event(OpCode::SemReclaim.code(), 0, 10 + i); // through Deref
    }
    a.wait(2_500, 0);
    let report = sc.poll();
    let r = report.get(id).expect("polled");
    assert_eq!(r.kind, Kind::Test);
    assert_eq!(r.lost, 0);
    assert_eq!(
        r.observations.iter().map(|o| o.arg).collect::<Vec<_>>(),
        [10, 11, 12, 2_500]
    );
    assert!(r.observations.iter().all(|o| o.pid == std::process::id()));
    assert_eq!(r.applied, None);
    let stats = a.stats();
    assert_eq!((stats.polls, stats.observed, stats.lost), (1, 4, 0));
    assert_eq!(stats.op_count(OpCode::SemReclaim), 3);
    assert_eq!(stats.waits.count, 1);
    assert_eq!(stats.counter("events"), Some(5));
    assert_eq!(stats.counter("waits"), Some(1));

    // Nothing new: an empty entry.
    let report = sc.poll();
    assert!(report.get(id).unwrap().observations.is_empty());

    // Overflowing the ring between polls is reported as lost.
    for i in 0..100 {
        a.event(0x7001, 0, i);
    }
    let r = sc.poll();
    let r = r.get(id).unwrap();
    assert_eq!((r.observations.len(), r.lost), (64, 36));
    assert_eq!(r.observations[0].op, OpCode::Unknown(0x7001));
    assert_eq!(a.stats().lost, 36);

    drop(a);
    assert!(
        dropped.load(Ordering::Acquire),
        "instance dropped with its box"
    );
    assert!(sc.is_empty());
    assert!(sc.instances().is_empty());
    assert!(sc.poll().instances.is_empty());
    assert!(sc.stats(id).is_none());
    assert!(!sc.unregister(id));
}

#[test]
fn global_registration() {
    let dir = tempfile::tempdir().unwrap();
    let a = SidecarBox::new(probe(&dir, "g1"));
    let b = SidecarBox::new(probe(&dir, "g2"));
    assert_ne!(a.id(), b.id());
    assert!(std::ptr::eq(a.sidecar(), Sidecar::global()));
    let ids = |sc: &Sidecar| sc.instances().iter().map(|i| i.id).collect::<Vec<_>>();
    assert!(ids(Sidecar::global()).contains(&a.id()));
    assert!(ids(Sidecar::global()).contains(&b.id()));
    let a_id = a.id();
    drop(a);
    assert!(!ids(Sidecar::global()).contains(&a_id));
    assert!(ids(Sidecar::global()).contains(&b.id()));
}

#[test]
fn raw_instances_record_but_are_not_polled() {
    let dir = tempfile::tempdir().unwrap();
    let sc = private_sidecar();
    let raw = probe(&dir, "raw");
    raw.event(OpCode::HeartbeatScan.code(), 0, 2);
    assert!(sc.poll().instances.is_empty());
    // Another handle on the same file sees the observation; boxing it starts from now.
    let other = Probe::open(raw.path());
    assert_eq!(other.ring().snapshot()[0].op, OpCode::HeartbeatScan);
    let boxed = SidecarBox::new_in(sc, other, None);
    raw.event(OpCode::HeartbeatScan.code(), 0, 3);
    let r = sc.poll();
    assert_eq!(r.get(boxed.id()).unwrap().observations[0].arg, 3);
}

#[test]
fn drop_inside_policy_callback_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let sc = private_sidecar();
    // The box is owned by a slot its own policy empties.
    let slot: Arc<Mutex<Option<SidecarBox<Probe>>>> = Arc::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let own = SidecarBox::new_in(sc, probe(&dir, "own").with_drop_flag(dropped.clone()), None);
    let own_id = own.id();
    own.event(1, 0, 0);
    *slot.lock().unwrap() = Some(own);
    let in_policy = slot.clone();
    let calls = Arc::new(AtomicU32::new(0));
    let calls2 = calls.clone();
    assert!(sc.set_policy(
        own_id,
        Box::new(move |obs: &[Observation], _: &Stats| {
            calls2.fetch_add(1, Ordering::Relaxed);
            assert_eq!(obs.len(), 1);
            drop(in_policy.lock().unwrap().take());
            None
        }),
    ));
    // A second box dropped by a third instance's policy.
    let other_slot: Arc<Mutex<Option<SidecarBox<Probe>>>> = Arc::default();
    let other = SidecarBox::new_in(sc, probe(&dir, "other"), None);
    let other_id = other.id();
    *other_slot.lock().unwrap() = Some(other);
    let dropper = SidecarBox::new_in(sc, probe(&dir, "dropper"), None);
    let os = other_slot.clone();
    dropper.set_policy(move |_: &[Observation], _: &Stats| {
        drop(os.lock().unwrap().take());
        None
    });
    assert_eq!(sc.len(), 3);

    let report = within_deadline("poll with drops in callbacks", move || sc.poll());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert!(slot.lock().unwrap().is_none());
    assert!(
        dropped.load(Ordering::Acquire),
        "instance freed after the poll"
    );
    assert!(report.get(own_id).is_some());
    let ids: Vec<_> = sc.instances().iter().map(|i| i.id).collect();
    assert_eq!(ids, [dropper.id()]);
    assert!(sc.stats(other_id).is_none());
    // Later polls do not see the dropped instances.
    let report = sc.poll();
    assert_eq!(report.instances.len(), 1);
}

#[test]
fn policy_callbacks_may_reenter_the_sidecar() {
    let (dir, sc, a) = boxed_probe();
    let id = a.id();
    let dir_path = dir.path().to_path_buf();
    let registered: Arc<Mutex<Vec<SidecarBox<Probe>>>> = Arc::default();
    let reg = registered.clone();
    let mut round = 0;
    a.set_policy(move |_: &[Observation], _: &Stats| {
        round += 1;
        // Nested poll: this instance is busy and skipped; no deadlock.
        let nested = sc.poll();
        assert!(nested.get(id).is_none());
        // Register a new instance, inspect, and replace our own policy.
        let p = Probe::create(&dir_path.join(format!("new{round}")));
        reg.lock().unwrap().push(SidecarBox::new_in(sc, p, None));
        let _ = sc.instances();
        let _ = sc.stats(id);
        sc.set_policy(
            id,
            Box::new(|_: &[Observation], _: &Stats| Some(Strategy::Park)),
        );
        None
    });
    within_deadline("re-entrant poll", move || sc.poll());
    assert_eq!(registered.lock().unwrap().len(), 1);
    // The replacement policy is in place (the old one was not put back) and acts.
    let report = sc.poll();
    assert_eq!(report.get(id).unwrap().applied, Some((Strategy::Park, 1)));
    assert_eq!(a.handshake().current(), (Strategy::Park, 1));
    assert_eq!(
        a.ring().snapshot().last().unwrap().op,
        OpCode::StrategyChanged,
        "apply records the change"
    );
    assert_eq!(a.stats().strategy_changes, 1);
    // Already current: not applied again.
    assert_eq!(sc.poll().get(id).unwrap().applied, None);
    assert_eq!(a.stats().strategy_changes, 1);
}

#[test]
fn panicking_policy_is_removed() {
    let (_dir, sc, a) = boxed_probe();
    a.set_policy(|_: &[Observation], _: &Stats| -> Option<Strategy> {
        panic!("policy bug (expected by the test)")
    });
    assert_eq!(sc.instances()[0].policy.as_deref(), Some("closure"));
    let report = sc.poll();
    assert!(report.get(a.id()).is_some());
    let info = &sc.instances()[0];
    assert_eq!(info.policy, None);
    assert_eq!(info.stats.policy_panics, 1);
    sc.poll();
    assert_eq!(a.stats().policy_panics, 1);
    assert_eq!(a.stats().polls, 2);
}

#[test]
fn background_thread_polls_and_stops_promptly() {
    let (_dir, sc, a) = boxed_probe();
    let thread = sc.spawn(Duration::from_millis(2)).unwrap();
    assert!(thread.is_running());
    a.event(OpCode::SemTimeout.code(), 0, 7);
    assert!(
        wait_until(Duration::from_secs(10), || a.stats().observed == 1),
        "the thread polled"
    );
    let t = Instant::now();
    drop(thread);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t.elapsed()
    );
    let polls = a.stats().polls;
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(a.stats().polls, polls, "no polls after stop");

    // A long interval does not delay the stop.
    let thread = sc.spawn(Duration::from_secs(3600)).unwrap();
    assert!(wait_until(Duration::from_secs(10), || a.stats().polls > polls));
    let t = Instant::now();
    thread.stop();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t.elapsed()
    );
}

#[test]
fn thread_handle_dropped_inside_callback() {
    let (_dir, sc, a) = boxed_probe();
    let handle: Arc<Mutex<Option<SidecarThread>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let (h, d) = (handle.clone(), done.clone());
    a.set_policy(move |obs: &[Observation], _: &Stats| {
        if !obs.is_empty() {
            // Runs on the sidecar thread: dropping its own handle must not self-join.
            drop(h.lock().unwrap().take());
            d.store(true, Ordering::Release);
        }
        None
    });
    *handle.lock().unwrap() = Some(sc.spawn(Duration::from_millis(1)).unwrap());
    a.event(1, 0, 0);
    assert!(wait_until(Duration::from_secs(10), || done.load(Ordering::Acquire)));
    // The thread stops after that poll.
    std::thread::sleep(Duration::from_millis(20));
    let polls = a.stats().polls;
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(a.stats().polls, polls, "thread stopped");
}

#[test]
fn concurrent_polls_never_double_report() {
    let (_dir, sc, a) = boxed_probe();
    let id = a.id();
    let stop = AtomicBool::new(false);
    let total = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    let r = sc.poll();
                    if let Some(r) = r.get(id) {
                        total.fetch_add(r.observations.len() as u64 + r.lost, Ordering::Relaxed);
                    }
                }
            });
        }
        for i in 0..20_000 {
            a.event(2, 0, i);
        }
        stop.store(true, Ordering::Release);
    });
    let r = sc.poll();
    let last = r
        .get(id)
        .map_or(0, |r| r.observations.len() as u64 + r.lost);
    assert_eq!(total.load(Ordering::Relaxed) + last, 20_000);
    let st = a.stats();
    assert_eq!(st.observed + st.lost, 20_000);
}

#[test]
fn raw_registration_is_pruned_when_the_instance_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let sc = private_sidecar();
    let inst: Arc<dyn AdaptiveInstance> = Arc::new(probe(&dir, "raw"));
    let id = sc.register(Arc::downgrade(&inst), None);
    assert_eq!(sc.instances()[0].id, id);
    assert!(sc.poll().get(id).is_some());
    drop(inst);
    assert!(sc.instances().is_empty());
    assert!(sc.poll().instances.is_empty());
    assert!(sc.is_empty(), "pruned by the poll");
}

/// A process whose main thread exited (the `pthread_exit` pattern) and whose last own
/// thread then ended, leaving a running sidecar thread (its handle never dropped): the
/// sidecar thread must not keep the process alive for ever. It ends, status 0, as a
/// process does when its last thread ends.
#[test]
fn a_sidecar_thread_does_not_keep_a_process_alive() {
    const T: &str = "a_sidecar_thread_does_not_keep_a_process_alive";
    if cxc_testkit::in_role("orphan") {
        let thread = private_sidecar()
            .spawn(Duration::from_millis(5))
            .expect("sidecar thread");
        assert!(cxc_testkit::exit_main_thread());
        cxc_testkit::report("running");
        // This (the test's) thread ends here; the sidecar thread runs on.
        std::mem::forget(thread);
        return;
    }
    let mut kid = cxc_testkit::RoleCommand::new(T, "orphan").spawn();
    assert_eq!(kid.next_report(Duration::from_secs(20)), "running");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the process did not end when its last own thread did: {status:?}"
    );
}

//! Loom models of the semaphore protocol: S1 (never more than `max` out), S2 (the count
//! never exceeds `max` or wraps), conservation (`available + Σ held + handed == max` at
//! quiescence) including "processes" that die between any two steps and are reclaimed,
//! the release rule (a permit comes back only from a holder or a recorded hand-off), and
//! no lost wake-ups.
//!
//! Run: `RUSTFLAGS="--cfg cxc_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target-loom
//! cargo test --release -p cxc-sync --lib -- loom_`

use loom::sync::Arc;
use loom::sync::atomic::AtomicU32;
use loom::thread;

use super::layout::{HolderSlot, SemHead};
use super::model::{CrashPlan, ModelFutex};
use super::raw::{RawSemaphore, Released};
use super::word::{BookWord, STATE_ACTIVE, owner_word};
use crate::primitive::Ordering;

/// Pids of the modelled "processes" (slot `i` belongs to pid `P + i`) and reclaimers;
/// start tag 1 for all.
const P: u32 = 10;
const R1: u32 = 20;
const R2: u32 = 21;

struct Model {
    head: SemHead,
    slots: Vec<HolderSlot>,
    max: u32,
    initial: u32,
    futex: ModelFutex,
    /// Permits in use by live model threads (checked against `max`).
    in_use: AtomicU32,
}

impl Model {
    /// `initial` of `max` permits, `slots` holder slots owned by pids `P, Q, ...`.
    fn new(initial: u32, max: u32, slots: usize) -> Arc<Model> {
        let m = Model {
            head: SemHead::new(initial, max),
            slots: (0..slots).map(|_| HolderSlot::new()).collect(),
            max,
            initial,
            futex: ModelFutex::new(),
            in_use: AtomicU32::new(0),
        };
        for (i, s) in m.slots.iter().enumerate() {
            s.owner
                .store(owner_word(STATE_ACTIVE, P + i as u32, 1), Ordering::Relaxed);
        }
        Arc::new(m)
    }

    /// As [`Model::new`], then P (slot 0) takes one permit.
    fn with_p_holding_one(initial: u32, max: u32, slots: usize) -> Arc<Model> {
        let m = Model::new(initial, max, slots);
        assert!(m.raw(None).try_acquire(Some(0)));
        m
    }

    fn raw<'a>(&'a self, crash: Option<&'a CrashPlan>) -> RawSemaphore<'a> {
        RawSemaphore {
            head: &self.head,
            slots: &self.slots,
            max: self.max,
            crash,
            futex: Some(&self.futex),
        }
    }

    fn held(&self, i: usize) -> u32 {
        BookWord(self.slots[i].book.load(Ordering::SeqCst)).held()
    }

    fn handed(&self) -> u32 {
        BookWord(self.head.handed.load(Ordering::SeqCst)).held()
    }

    /// S2: the count never exceeds max (a wrap would show as a huge count).
    fn check_live(&self) {
        let avail = self.raw(None).available();
        assert!(
            avail <= self.max,
            "available {avail} above max {}",
            self.max
        );
    }

    /// One acquire/use/release cycle by a live holder, asserting S1.
    fn cycle(&self, holder: usize) {
        let raw = self.raw(None);
        if raw.try_acquire(Some(holder)) {
            let n = self.in_use.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(n <= self.max, "{n} permits in use, max {}", self.max);
            self.check_live();
            self.in_use.fetch_sub(1, Ordering::SeqCst);
            assert_eq!(
                raw.release(Some(holder)),
                Released::Held,
                "release of a held permit refused"
            );
        }
        self.check_live();
    }

    /// Reclaims dead slot `d` as reclaimer `pid` (taking it over from `seen`).
    fn reclaim(&self, d: usize, seen: u64, pid: u32, crash: Option<&CrashPlan>) -> u32 {
        let raw = self.raw(crash);
        if !raw.take_over(d, seen, pid, 1) {
            return 0;
        }
        let n = raw.drain(d);
        if crash.is_some_and(|c| c.stopped.get()) {
            return n;
        }
        assert!(raw.free(d, pid, 1));
        n
    }

    /// [`Model::check_quiescent`], with `available` permits available.
    fn check_quiescent_with(&self, available: u32) {
        self.check_quiescent();
        assert_eq!(self.raw(None).available(), available);
    }

    /// Conservation at quiescence, once every dead holder has been reclaimed: every
    /// permit is available, held, or handed (`max - initial` start out handed).
    fn check_quiescent(&self) {
        let _ = self.initial;
        let avail = self.raw(None).available();
        let held: u32 = (0..self.slots.len()).map(|i| self.held(i)).sum();
        let handed = self.handed();
        assert_eq!(
            avail + held + handed,
            self.max,
            "permits not conserved: available {avail} + held {held} + handed {handed} != {}",
            self.max
        );
    }
}

/// Spawns a thread that runs `f` on model `m`.
fn on<R>(m: &Arc<Model>, f: impl FnOnce(&Model) -> R + Send + 'static) -> thread::JoinHandle<R>
where
    R: Send + 'static,
{
    let m = Arc::clone(m);
    thread::spawn(move || f(&m))
}

/// "Process" P runs `dying` on slot 0's side and dies at step `at` of it, while Q cycles
/// on slot 1; once P is dead, its slot is reclaimed (by R1) while Q may still run; then
/// Q is joined and conservation checked.
fn p_dies_while_q_cycles(
    m: &Arc<Model>,
    at: u32,
    dying: impl FnOnce(&RawSemaphore<'_>) + Send + 'static,
) {
    let p = on(m, move |m| {
        let plan = CrashPlan::new(at);
        dying(&m.raw(Some(&plan)));
    });
    let q = on(m, move |m| m.cycle(1));
    p.join().unwrap();
    let seen = m.slots[0].owner.load(Ordering::SeqCst);
    m.reclaim(0, seen, R1, None);
    q.join().unwrap();
    m.check_quiescent();
}

/// Runs `model(at)` as a loom model for every crash step `at` below `steps`.
fn at_every_step(steps: u32, model: impl Fn(u32) + Send + Sync + 'static) {
    let model = std::sync::Arc::new(model);
    for at in 0..steps {
        let model = std::sync::Arc::clone(&model);
        loom::model(move || model(at));
    }
}

/// Two processes, one permit: never two holders; everything returned at the end.
#[test]
fn loom_two_processes_one_permit() {
    loom::model(|| {
        let m = Model::new(1, 1, 2);
        let t = on(&m, move |m| {
            m.cycle(1);
            m.cycle(1);
        });
        m.cycle(0);
        t.join().unwrap();
        m.check_quiescent_with(1);
    });
}

/// Two threads of one process share its holder slot (and help each other).
#[test]
fn loom_two_threads_one_holder() {
    loom::model(|| {
        let m = Model::new(2, 2, 1);
        let t = on(&m, move |m| m.cycle(0));
        m.cycle(0);
        t.join().unwrap();
        m.check_quiescent();
        assert_eq!(m.held(0), 0);
    });
}

/// Racing releases of one handed permit by two processes that hold none: exactly one
/// returns it; the count never exceeds max (and so never wraps).
#[test]
fn loom_release_refused_at_max() {
    loom::model(|| {
        let m = Model::new(1, 2, 2);
        let t = on(&m, move |m| m.raw(None).release(Some(1)));
        let a = m.raw(None).release(Some(0));
        let b = t.join().unwrap();
        let ok = |r: Released| r == Released::Handed;
        assert!(ok(a) ^ ok(b), "exactly one release fits: {a:?} {b:?}");
        assert_eq!(m.raw(None).available(), 2);
        assert_eq!(m.handed(), 0);
        m.check_live();
        m.check_quiescent();
    });
}

/// A process that holds no permit and has none handed to it cannot release, whatever a
/// holder does meanwhile: its release is refused and changes nothing.
#[test]
fn loom_release_without_a_permit_is_refused() {
    loom::model(|| {
        let m = Model::new(1, 1, 2);
        let t = on(&m, move |m| m.cycle(0));
        let r = m.raw(None).release(Some(1));
        let r2 = m.raw(None).release(None);
        t.join().unwrap();
        assert!(matches!(r, Released::NotHeld | Released::Full), "{r:?}");
        assert!(matches!(r2, Released::NotHeld | Released::Full), "{r2:?}");
        assert_eq!(m.raw(None).available(), 1);
        assert_eq!(m.held(1), 0);
        m.check_quiescent();
    });
}

/// P hands its permit off (disown) while Q, holding nothing, releases: Q's release
/// returns the handed permit or is refused, never both, and S1 holds throughout.
#[test]
fn loom_disown_hand_off() {
    loom::model(|| {
        let m = Model::with_p_holding_one(1, 1, 2);
        let p = on(&m, move |m| assert!(m.raw(None).disown(0)));
        let first = m.raw(None).release(Some(1));
        assert!(!m.raw(None).try_acquire(Some(1)) || first == Released::Handed);
        p.join().unwrap();
        m.check_quiescent();
        match first {
            Released::Handed => assert_eq!(m.handed(), 0),
            other => {
                assert_eq!(other, Released::NotHeld);
                assert_eq!(m.handed(), 1);
                assert_eq!(m.raw(None).release(Some(1)), Released::Handed);
            }
        }
        if m.held(1) == 1 {
            assert_eq!(m.raw(None).release(Some(1)), Released::Held);
        }
        assert_eq!(m.raw(None).available(), 1);
        m.check_quiescent();
    });
}

/// What P is doing when it dies, at every step of it, while Q cycles.
#[derive(Clone, Copy)]
enum Dying {
    /// Disowning its permit: after reclaim, the permit is either back (reclaimed from
    /// P) or handed (releasable once), never both.
    Disown,
    /// Acquiring: reclaiming P returns exactly what P took (conservation with
    /// initial < max, so an over-return could not hide behind the cap).
    Acquire,
    /// Releasing the one permit it holds.
    Release,
}

/// The model of one [`Dying`] case, for each of the `steps` steps P can die at.
fn p_dies_mid(dying: Dying, steps: u32) {
    at_every_step(steps, move |at| {
        let m = match dying {
            Dying::Disown => Model::with_p_holding_one(2, 2, 2),
            // Two available, so Q can transition on top of P's pending word.
            Dying::Acquire => Model::new(2, 3, 2),
            Dying::Release => Model::with_p_holding_one(2, 3, 2),
        };
        p_dies_while_q_cycles(&m, at, move |raw| match dying {
            Dying::Disown => drop(raw.disown(0)),
            // Dies mid-way, or completes and dies holding the permit.
            Dying::Acquire => drop(raw.try_acquire(Some(0))),
            Dying::Release => drop(raw.release(Some(0))),
        });
        match dying {
            Dying::Disown => {
                if m.handed() == 1 {
                    assert_eq!(m.raw(None).release(Some(1)), Released::Handed);
                }
                assert_eq!(m.raw(None).available(), 2);
                assert_eq!(m.raw(None).release(Some(1)), Released::Full);
                m.check_quiescent();
            }
            Dying::Acquire => {
                assert_eq!(m.held(0), 0);
                assert_eq!(m.raw(None).available(), 2);
            }
            Dying::Release => assert_eq!(m.raw(None).available(), 2),
        }
    });
}

#[test]
fn loom_death_mid_disown() {
    p_dies_mid(Dying::Disown, 6);
}

#[test]
fn loom_death_mid_acquire_is_reclaimed() {
    p_dies_mid(Dying::Acquire, 5);
}

#[test]
fn loom_death_mid_release_is_reclaimed() {
    p_dies_mid(Dying::Release, 5);
}

/// A reclaimer dies at every step of draining a dead holder of two permits; a second
/// reclaimer takes over from it and finishes, while Q cycles.
#[test]
fn loom_reclaimer_dies_and_is_superseded() {
    at_every_step(8, |at| {
        let m = Model::new(2, 3, 2);
        let raw = m.raw(None);
        assert!(raw.try_acquire(Some(0)) && raw.try_acquire(Some(0)));
        // P is dead holding two permits.
        let q = on(&m, move |m| m.cycle(1));
        let r1 = on(&m, move |m| {
            let seen = m.slots[0].owner.load(Ordering::SeqCst);
            let plan = CrashPlan::new(at);
            m.reclaim(0, seen, R1, Some(&plan))
        });
        r1.join().unwrap();
        // R1 is dead too (or finished and freed the slot).
        let seen = m.slots[0].owner.load(Ordering::SeqCst);
        if seen != 0 {
            m.reclaim(0, seen, R2, None);
        }
        q.join().unwrap();
        assert_eq!(m.slots[0].owner.load(Ordering::SeqCst), 0);
        m.check_quiescent_with(2);
    });
}

/// Two reclaimers race for the same dead holder: one wins, the permits come back once.
#[test]
fn loom_racing_reclaimers_return_once() {
    loom::model(|| {
        let m = Model::with_p_holding_one(1, 2, 2);
        let seen = m.slots[0].owner.load(Ordering::SeqCst);
        let t = on(&m, move |m| m.reclaim(0, seen, R2, None));
        let a = m.reclaim(0, seen, R1, None);
        let b = t.join().unwrap();
        assert_eq!(a + b, 1);
        m.check_quiescent_with(1);
    });
}

/// The blocking path, as `ops.rs` runs it, against a faithful futex: a lost wake-up
/// would leave a waiter asleep forever, which loom reports as a deadlock.
fn wait_for_permit(m: &Model, holder: usize) {
    let raw = m.raw(None);
    loop {
        let seen = raw.announce_sleeper();
        if raw.recheck() > 0 && raw.try_acquire(Some(holder)) {
            raw.pass_on();
            return;
        }
        m.futex.wait(&m.head.wake, seen);
    }
}

fn release_and_wake(m: &Model, holder: usize) {
    let raw = m.raw(None);
    assert!(matches!(
        raw.release(Some(holder)),
        Released::Held | Released::Handed
    ));
    if raw.has_sleepers() {
        raw.wake_sleepers(1);
    }
}

#[test]
fn loom_no_lost_wakeup() {
    loom::model(|| {
        let m = Model::new(0, 1, 2);
        let w = on(&m, move |m| wait_for_permit(m, 1));
        release_and_wake(&m, 0);
        w.join().unwrap();
        assert_eq!(m.raw(None).available(), 0);
        assert_eq!(m.held(1), 1);
    });
}

/// Two sleepers, two releases in a row: waking one per release plus passing the
/// wake-up on reaches both.
#[test]
fn loom_two_waiters_two_releases() {
    loom::model(|| {
        let m = Model::new(0, 2, 3);
        let ws: Vec<_> = [1, 2]
            .into_iter()
            .map(|h| {
                let m = m.clone();
                thread::spawn(move || wait_for_permit(&m, h))
            })
            .collect();
        // Slot 0 returns the two permits handed at creation (initial 0 of max 2).
        release_and_wake(&m, 0);
        release_and_wake(&m, 0);
        for w in ws {
            w.join().unwrap();
        }
        assert_eq!(m.raw(None).available(), 0);
        assert_eq!(m.held(1) + m.held(2), 2);
    });
}

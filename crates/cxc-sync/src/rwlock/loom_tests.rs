//! Loom models of the rwlock protocol: exclusion (never a writer with a reader or another
//! writer), the blocking handoff in both directions with no lost wake-up (the model futex
//! deadlocks on one), the death of a reader or a writer at every step (reclaimed, never
//! wedging the survivor), and fencing of an evicted writer (none of its bytes published).
//!
//! Run: `cargo xtask loom` (release, `LOOM_MAX_PREEMPTIONS=2`).

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::AtomicU32;
use loom::thread;

use super::layout::{RwHead, RwSlot};
use super::raw::RawRwLock;
use super::word::{BufferFields, Word};
use crate::park::{ModelFutex, ModelFutexRef, sleep};
use crate::primitive::Ordering;
use crate::semaphore::model::CrashPlan;

struct Model {
    head: RwHead,
    slots: Vec<RwSlot>,
    futex: [ModelFutex; 3],
    /// Ghost state: readers inside (> 0) or a writer inside (`u32::MAX`).
    inside: AtomicU32,
}

impl Model {
    fn new(slots: usize) -> Arc<Model> {
        let m = Model {
            head: RwHead::new(),
            slots: (0..slots).map(|_| RwSlot::new()).collect(),
            futex: std::array::from_fn(|_| ModelFutex::new()),
            inside: AtomicU32::new(0),
        };
        m.head.hwm.store(slots as u64, Ordering::Relaxed);
        Arc::new(m)
    }

    fn raw<'a>(&'a self, crash: Option<&'a CrashPlan>) -> RawRwLock<'a> {
        RawRwLock {
            head: &self.head,
            slots: &self.slots,
            crash,
            futex: Some(&self.futex),
        }
    }

    fn sleep_on(&self, word: &crate::primitive::AtomicU32, seen: u32) {
        let raw = self.raw(None);
        let f = raw.model_futex(word).expect("a wake word");
        sleep(word, seen, Duration::MAX, Some(&ModelFutexRef(f)));
    }

    /// A blocking read lock of slot `me`. `false` if the "process" died.
    fn read_lock(&self, raw: &RawRwLock<'_>, me: usize) -> bool {
        loop {
            if raw.try_read(me) {
                return !raw.stopped();
            }
            if raw.stopped() || raw.crash_here() {
                return false;
            }
            if let Some(seen) = raw.reader_park() {
                self.sleep_on(&self.head.rwake, seen);
            }
        }
    }

    /// A blocking write lock (claim, then drain) of slot `me`. `None` if it died.
    fn write_lock(&self, raw: &RawRwLock<'_>, me: usize) -> Option<Word> {
        let claim = loop {
            if let Some(c) = raw.try_claim(me) {
                break c;
            }
            if raw.stopped() || raw.crash_here() {
                return None;
            }
            if let Some(seen) = raw.writer_park() {
                self.sleep_on(&self.head.wwake, seen);
            }
        };
        loop {
            if raw.stopped() || raw.crash_here() {
                return None;
            }
            let Some(i) = raw.reader_left() else {
                return Some(claim);
            };
            if let Some(seen) = raw.drain_park(i) {
                self.sleep_on(&self.head.dwake, seen);
            }
        }
    }

    fn enter_read(&self) {
        let n = self.inside.fetch_add(1, Ordering::SeqCst);
        assert_ne!(n, u32::MAX, "reader inside with a writer");
    }

    fn leave_read(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn enter_write(&self) {
        let n = self.inside.swap(u32::MAX, Ordering::SeqCst);
        assert_eq!(n, 0, "writer inside with {n:#x}");
    }

    fn leave_write(&self) {
        self.inside.store(0, Ordering::SeqCst);
    }

    /// The published payload: every word must be the same value (no torn buffer).
    fn published(&self) -> u64 {
        let raw = self.raw(None);
        let words = raw.copy_published(raw.word());
        assert!(words.iter().all(|w| *w == words[0]), "torn: {words:?}");
        words[0]
    }
}

fn payload(v: u64) -> [u64; super::layout::PAYLOAD_WORDS] {
    [v; super::layout::PAYLOAD_WORDS]
}

/// A reader and a writer, both blocking: exclusion, and each wakes the other (the
/// writer drains a reader inside; the reader waits behind the writer).
#[test]
fn loom_rw_handoff_no_lost_wakeup() {
    loom::model(|| {
        let m = Model::new(2);
        let r = spawn(&m, None, move |m1, raw| {
            assert!(m1.read_lock(raw, 0));
            m1.enter_read();
            let v = m1.published();
            assert!(v == 0 || v == 1);
            m1.leave_read();
            raw.read_unlock(0);
        });
        let raw = m.raw(None);
        let claim = m.write_lock(&raw, 1).unwrap();
        m.enter_write();
        raw.fill(claim, &payload(1));
        let claim = raw.publish(claim).unwrap();
        m.leave_write();
        assert!(raw.write_unlock(claim));
        r.join().unwrap();
        assert_eq!(m.published(), 1);
    });
}

/// Two writers: never both inside; the second is woken by the first's unlock.
#[test]
fn loom_two_writers_exclusion() {
    loom::model(|| {
        let m = Model::new(2);
        let hs: Vec<_> = (0..2)
            .map(|i| {
                spawn(&m, None, move |m, raw| {
                    let claim = m.write_lock(raw, i).unwrap();
                    m.enter_write();
                    m.leave_write();
                    assert!(raw.write_unlock(claim));
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(m.raw(None).word().token(), 2);
    });
}

/// Spawns a thread that runs `f` on model `m` with a raw handle; with `crash_at`, the
/// handle's "process" dies at that step (a [`CrashPlan`]).
fn spawn<R: Send + 'static>(
    m: &Arc<Model>,
    crash_at: Option<u32>,
    f: impl FnOnce(&Model, &RawRwLock<'_>) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let m = Arc::clone(m);
    thread::spawn(move || {
        let plan = crash_at.map(CrashPlan::new);
        let raw = m.raw(plan.as_ref());
        f(&m, &raw)
    })
}

/// Runs `model` as a loom model on a fresh two-slot [`Model`], once for every crash step
/// `at` below `steps`.
fn at_every_step<F>(steps: u32, model: F)
where
    F: Fn(Arc<Model>, u32) + Send + Sync + 'static,
{
    let model = std::sync::Arc::new(model);
    for at in 0..steps {
        let model = std::sync::Arc::clone(&model);
        loom::model(move || model(Model::new(2), at));
    }
}

/// A reader that dies at every step of lock/unlock, reclaimed by a third party once
/// dead: the blocked writer always gets in (a dead reader never wedges it) and never
/// while the reader was inside and alive.
#[test]
fn loom_dead_reader_never_wedges_writer() {
    at_every_step(4, |m, at| {
        let reader = spawn(&m, Some(at), move |m1, raw| {
            if m1.read_lock(raw, 0) {
                m1.enter_read();
                let dead = raw.crash_here();
                m1.leave_read(); // a dead process's hold is reclaimed, not left
                if dead {
                    return true;
                }
                raw.read_unlock(0);
            }
            raw.stopped()
        });
        let writer = spawn(&m, None, move |m2, raw| {
            let claim = m2.write_lock(raw, 1).unwrap();
            m2.enter_write();
            m2.leave_write();
            assert!(raw.write_unlock(claim));
        });
        // The reclaimer: once the reader's process is gone, drop its holds.
        if reader.join().unwrap() {
            m.raw(None).drop_dead_slot(0);
        }
        writer.join().unwrap();
        assert_eq!(m.slots[0].readers.load(Ordering::SeqCst), 0);
    });
}

/// A writer that dies at every step of lock/write/unlock, evicted by a third party once
/// dead: the blocked reader always gets in, never sees a torn or unpublished payload.
#[test]
fn loom_dead_writer_never_wedges_reader() {
    at_every_step(6, |m, at| {
        let writer = spawn(&m, Some(at), move |m1, raw| {
            let Some(claim) = m1.write_lock(raw, 0) else {
                return (true, false);
            };
            if raw.crash_here() {
                return (true, false);
            }
            raw.fill(claim, &payload(1));
            if raw.crash_here() {
                return (true, false);
            }
            let claim = raw.publish(claim).unwrap();
            let ok = raw.write_unlock(claim);
            (raw.stopped(), ok)
        });
        let reader = spawn(&m, None, move |m2, raw| {
            assert!(m2.read_lock(raw, 1));
            let v = m2.published();
            raw.read_unlock(1);
            v
        });
        let (dead, _) = writer.join().unwrap();
        if dead {
            m.raw(None).drop_dead_slot(0);
        }
        let v = reader.join().unwrap();
        assert!(v == 0 || v == 1);
        // The lock is free again: a new writer gets in at once.
        let raw = m.raw(None);
        let c = raw.try_claim(1).expect("lock wedged");
        assert_eq!(raw.reader_left(), None);
        assert!(raw.write_unlock(c));
        m.published();
    });
}

/// A writer evicted while it writes (stopped past the grace): its publication is refused
/// and none of its bytes ever shows in a buffer published after the eviction; its
/// quarantined buffer is freed when it finds out.
#[test]
fn loom_evicted_writer_never_published() {
    loom::model(|| {
        let m = Model::new(2);
        let raw = m.raw(None);
        let old = raw.try_claim(0).unwrap();
        let stale = spawn(&m, None, move |_, raw| {
            raw.fill(old, &payload(7));
            match raw.publish(old) {
                Ok(c) => {
                    // Refused (and its quarantine freed) if evicted meanwhile.
                    let _ = raw.write_unlock(c);
                    true
                }
                Err(_) => false,
            }
        });
        let taker = spawn(&m, None, move |m2, raw| {
            let seen = raw.word();
            if seen.writer() == Some(0) {
                assert!(raw.evict(seen) || raw.word().id() != seen.id());
            }
            let c = m2.write_lock(raw, 1).unwrap();
            raw.fill(c, &payload(2));
            let c = raw.publish(c).unwrap();
            assert_eq!(m2.published(), 2);
            assert!(raw.write_unlock(c));
        });
        taker.join().unwrap();
        let published_before_eviction = stale.join().unwrap();
        let _ = published_before_eviction;
        assert_eq!(m.published(), 2);
        assert_eq!(m.raw(None).word().quarantine(), 0, "quarantine not freed");
    });
}

/// A writer of slot 0 evicted mid-write, then dead; a reclaimer returns its slot while a
/// newcomer registers: whatever the interleaving, the dead writer's quarantined buffer
/// is freed. (With the slot freed before the reap, a newcomer that took slot 0 in between
/// made the reaper see a live owner of slot 0, and the buffer stayed quarantined until
/// the newcomer died.)
#[test]
fn loom_reclaim_frees_the_dead_writers_quarantine() {
    use crate::semaphore::word::{STATE_ACTIVE, STATE_RECLAIMING, owner_parts, owner_word};
    loom::model(|| {
        let m = Model::new(2);
        let raw = m.raw(None);
        // Slot 0 belongs to a process that claimed, began to fill, was evicted as stale
        // and then died.
        let dead = owner_word(STATE_ACTIVE, 100, 1);
        m.slots[0].owner.store(dead, Ordering::SeqCst);
        let stalled = raw.try_claim(0).unwrap();
        raw.fill(stalled, &payload(7));
        assert!(raw.evict(raw.word()));
        assert_ne!(raw.word().quarantine(), 0);
        let mine = owner_word(STATE_RECLAIMING, 200, 2);
        let newcomer = owner_word(STATE_ACTIVE, 300, 3);
        let reclaimer = spawn(&m, None, move |m1, raw| {
            if m1.slots[0]
                .owner
                .compare_exchange(dead, mine, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                raw.reclaim_slot(0, mine);
            }
            // What `reclaim_dead` does after its loop: slots that are not active, or
            // whose owner is the dead process, are dead.
            raw.reap_quarantine(|s| {
                let (state, pid, _) = owner_parts(m1.slots[s].owner.load(Ordering::Acquire));
                state != STATE_ACTIVE || pid == 100
            });
        });
        let registrant = spawn(&m, None, move |m2, _| {
            for _ in 0..2 {
                if m2.slots[0]
                    .owner
                    .compare_exchange(0, newcomer, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                thread::yield_now();
            }
        });
        reclaimer.join().unwrap();
        registrant.join().unwrap();
        assert_eq!(
            m.raw(None).word().quarantine(),
            0,
            "the dead writer's buffer is still quarantined"
        );
    });
}

//! Loom models of the lease protocol: claim / preempt / stale takeover / release, write vs
//! preemption, the steal race, a writer that dies mid-write, and stale writers (released by
//! a sibling, or superseded as stale) resuming at every step (L7).
//!
//! Run with `cargo xtask loom`.

use loom::sync::Arc;
use loom::thread;

use super::os::Identity;
use super::state::{Claimant, LeaseState, PAYLOAD_WORDS, Policy, WriteRefused};
use super::word::{BufferFields, ID_MASK, WRITE_BIT, Word};
use crate::liveness::Liveness;
use crate::primitive::Ordering;

mod guess;

/// The holder value of `pid` (registered on first use, as a handle does).
fn holder(s: &LeaseState, pid: u32) -> u8 {
    let me = Identity {
        pid,
        pidns: 1,
        boot: 1,
        unique: u64::from(pid),
    };
    s.register(u64::from(pid), &me).expect("identity slot")
}

fn pid_of(s: &LeaseState, w: u64) -> u32 {
    s.holder_pid(Word(w))
}

const LOWER: Policy = Policy {
    preempt_lower: true,
};
const NEVER: Policy = Policy {
    preempt_lower: false,
};

fn unknown(_: &LeaseState, _: Word) -> Liveness {
    Liveness::Unknown
}

fn claim(
    s: &LeaseState,
    policy: Policy,
    pid: u32,
    grace: u64,
    write: bool,
) -> Option<(super::LeaseClaim, u64)> {
    claim_judged(s, policy, pid, grace, write, unknown)
}

fn claim_judged(
    s: &LeaseState,
    policy: Policy,
    pid: u32,
    grace: u64,
    write: bool,
    judge: fn(&LeaseState, Word) -> Liveness,
) -> Option<(super::LeaseClaim, u64)> {
    let now = s.epoch.load(Ordering::Acquire);
    let me = Claimant {
        holder: holder(s, pid),
        pid,
        private: false,
    };
    s.try_claim(s.word(), policy, me, grace, now, judge, write)
        .map(|g| (s.claim_for(g.word, g.torn, pid), g.word))
}

/// A fresh lease claimed by pid 20 (with `policy` and `grace`): the state, the claim and
/// its word.
fn held_by_20(policy: Policy, grace: u64) -> (Arc<LeaseState>, super::LeaseClaim, u64) {
    let s = Arc::new(LeaseState::new());
    let (c1, word) = claim(&s, policy, 20, grace, false).unwrap();
    (s, c1, word)
}

/// The OS says pid 20 is dead (it was killed); everyone else is unidentified.
fn pid20_dead(s: &LeaseState, w: Word) -> Liveness {
    if s.holder_pid(w) == 20 {
        Liveness::Dead
    } else {
        Liveness::Unknown
    }
}

/// Runs `f` on the lease state `s` (a shared handle) in a new thread.
fn on<R: Send + 'static>(
    s: Arc<LeaseState>,
    f: impl FnOnce(&LeaseState) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    thread::spawn(move || f(&s))
}

/// Runs `a` and `b` on `s` in two threads and returns both results.
fn race<A: Send + 'static, B: Send + 'static>(
    s: &Arc<LeaseState>,
    a: impl FnOnce(&LeaseState) -> A + Send + 'static,
    b: impl FnOnce(&LeaseState) -> B + Send + 'static,
) -> (A, B) {
    let (ta, tb) = (on(s.clone(), a), on(s.clone(), b));
    (ta.join().unwrap(), tb.join().unwrap())
}

/// A writer of 7 through the claim `c` (`write_claimed`'s protocol).
fn write7(c: super::LeaseClaim) -> impl FnOnce(&LeaseState) -> Result<(), WriteRefused> + Send {
    move |st| st.write_if(&words(7), PAYLOAD_WORDS, |w| w.id() == c.id)
}

/// Pid 20 holds the lease (no preemption, `grace`) and writes 7 through its claim while
/// `other` runs beside it with that claim (pid 30 registered first). Returns the state,
/// the write's result and `other`'s.
fn writer_of_20_beside<B: Send + 'static>(
    grace: u64,
    other: impl FnOnce(&LeaseState, super::LeaseClaim) -> B + Send + 'static,
) -> (Arc<LeaseState>, Result<(), WriteRefused>, B) {
    let (s, c1, _) = held_by_20(NEVER, grace);
    let _ = holder(&s, 30);
    let (first, got) = race(&s, write7(c1), move |s2| other(s2, c1));
    (s, first, got)
}

fn words(v: u64) -> [u64; PAYLOAD_WORDS] {
    [v; PAYLOAD_WORDS]
}

/// L1 + L3: a preemption and a stale release race; the stale release never clears the
/// newer claim, and generations order the claims.
#[test]
fn loom_claim_preempt_release() {
    loom::model(|| {
        let s = Arc::new(LeaseState::new());
        let ((c1, rel1), c2) = race(
            &s,
            move |s1| {
                let c = claim(s1, LOWER, 20, 3, false);
                let released = c.map(|(c, _)| s1.release_id(c.id));
                (c.map(|(c, _)| c), released)
            },
            move |s2| claim(s2, LOWER, 10, 3, false).map(|(c, _)| c),
        );
        let c2 = c2.expect("pid 10 always wins: vacant or preempting pid 20");
        let fin = s.claim.load(Ordering::Acquire);
        match c1 {
            Some(c1) if c1.generation() > c2.generation() => {
                unreachable!("pid 20 cannot claim over a live pid 10 with grace 3")
            }
            Some(c1) => {
                assert!(c1.generation() < c2.generation());
                // L3: pid 20's release came from a superseded claim, or happened before
                // the preemption; either way pid 10's claim survives.
                assert_eq!(
                    fin & ID_MASK,
                    c2.id,
                    "a stale release cleared the current claim"
                );
                if rel1 == Some(true) {
                    // Released before pid 10 claimed: pid 10 found it vacant.
                    assert_eq!(c2.generation(), c1.generation() + 1);
                }
            }
            None => assert_eq!(fin & ID_MASK, c2.id),
        }
        assert_eq!(fin & WRITE_BIT, 0);
    });
}

/// Pid 20 claims (with `policy` and `grace`) and writes 7 through its claim while
/// `take` runs beside it (another claimant). Returns whether the write reported success
/// and what `take` returned (its claim, if it got one).
fn write_beside(
    policy: Policy,
    grace: u64,
    take: impl FnOnce(&LeaseState) -> Option<super::LeaseClaim> + Send + 'static,
) -> (Arc<LeaseState>, bool, Option<super::LeaseClaim>) {
    let (s, c1, _) = held_by_20(policy, grace);
    let (wrote, got) = race(&s, move |s1| write7(c1)(s1).is_ok(), move |s2| take(s2));
    (s, wrote, got)
}

/// The payload `taker` reads after a write that reported `wrote`: the written value if it
/// succeeded, the earlier one if it failed (a failed write is never visible), never torn.
/// Without a takeover, the write must have succeeded.
fn assert_write_outcome(s: &LeaseState, wrote: bool, taker: Option<super::LeaseClaim>) {
    let Some(c2) = taker else {
        // The takeover gave up while the live holder was writing.
        assert!(wrote, "neither the write nor the takeover happened");
        return;
    };
    let read = s
        .read_if(PAYLOAD_WORDS, |w| w.id() == c2.id)
        .expect("the holder can read");
    let expected = if wrote { words(7) } else { words(0) };
    assert_eq!(
        read, expected,
        "write reported {wrote}: the next holder must read exactly its outcome"
    );
}

/// L2 + L4: a holder writes while a lower pid preempts. A write reported successful is
/// the value the new holder reads; a write reported failed is never visible; the value
/// is never torn.
#[test]
fn loom_write_vs_preemption() {
    loom::model(|| {
        let (s, wrote, got) = write_beside(LOWER, 3, |s2| {
            claim(s2, LOWER, 10, 3, false).map(|(c, _)| c)
        });
        assert_write_outcome(&s, wrote, got);
    });
}

/// L6: a claim that just succeeded is never taken as stale by a third party because its
/// heartbeat was not yet refreshed.
#[test]
fn loom_steal_race() {
    loom::model(|| {
        let s = Arc::new(LeaseState::new());
        // The epoch has moved far past the (old) heartbeat of the vacant lease.
        s.epoch.store(100, Ordering::Release);
        let (a, b) = race(
            &s,
            move |s1| claim(s1, NEVER, 5, 3, false).is_some(),
            move |s2| claim(s2, NEVER, 9, 3, false).is_some(),
        );
        assert!(
            a ^ b,
            "exactly one claim: a fresh claim was stolen as stale ({a}, {b})"
        );
    });
}

/// L4 + L5: a writer dies mid-write (its thread stops after filling part of the other
/// buffer) and the OS reports it dead; the takeover inherits the torn flag but reads the
/// last published value.
#[test]
fn loom_writer_dies_mid_write() {
    loom::model(|| {
        let (s, c1, word) = held_by_20(NEVER, 0);
        assert!(
            s.write_if(&words(3), PAYLOAD_WORDS, |w| w.id() == c1.id)
                .is_ok()
        );
        let (_, got) = race(
            &s,
            move |s1| {
                // Start a write and "die" after the first data word.
                if let Ok(w) = s1.start_write(|w| w.id() == c1.id) {
                    let stage = &s1.bufs[w.stage().expect("a staging buffer")];
                    stage.seq.fetch_add(1, Ordering::Relaxed);
                    stage.words[0].store(99, Ordering::Relaxed);
                }
            },
            move |s2| {
                claim_judged(s2, NEVER, 30, 1000, false, pid20_dead)
                    .map(|(c, _)| (c, s2.read_if(PAYLOAD_WORDS, |w| w.id() == c.id)))
            },
        );
        let _ = word;
        if let Some((c2, read)) = got {
            assert_eq!(
                read,
                Some(words(3)),
                "the new holder must read the last published value"
            );
            assert_eq!(pid_of(&s, s.claim.load(Ordering::Acquire)), 30);
            let _ = c2.payload_may_be_inconsistent();
        }
    });
}

/// L2 when a holder without a recorded identity is presumed dead mid-write (stale
/// heartbeat) but is actually only slow: its publication must fail, and it must never
/// overwrite the new claim or publish after losing the lease.
#[test]
fn loom_slow_writer_superseded_as_stale() {
    loom::model(|| {
        let (s, wrote, got) = write_beside(NEVER, 0, |s2| {
            s2.epoch.store(5, Ordering::Release);
            claim(s2, NEVER, 30, 0, false).map(|(c, _)| c)
        });
        if let Some(c2) = got {
            let fin = s.claim.load(Ordering::Acquire);
            assert_eq!(
                fin & ID_MASK,
                c2.id,
                "the superseded writer clobbered the new claim"
            );
            assert_eq!(fin & WRITE_BIT, 0);
        }
        assert_write_outcome(&s, wrote, got);
    });
}

/// L7: a sibling thread releases the claim while a writer of the same claim is between
/// its start and its publication; another claimant then claims and writes. Whatever the
/// interleaving, the stale write is never visible to the new holder, and once the stale
/// writer is done no buffer stays in quarantine.
#[test]
fn loom_sibling_release_during_write() {
    loom::model(|| {
        let (s, first, got) = writer_of_20_beside(3, move |s2, c1| {
            if !s2.release_id(c1.id) {
                return None;
            }
            let (c2, _) = claim(s2, NEVER, 30, 3, false)?;
            let wrote = s2.write_if(&words(100), PAYLOAD_WORDS, |w| w.id() == c2.id);
            let read = s2.read_if(PAYLOAD_WORDS, |w| w.id() == c2.id);
            Some((c2, wrote, read))
        });
        let (c2, wrote, read) = got.expect("the release of a current claim succeeds");
        if wrote.is_ok() {
            assert_eq!(
                read,
                Some(words(100)),
                "a stale write reached the new holder"
            );
        } else {
            assert!(read == Some(words(0)) || read == Some(words(7)));
        }
        let fin = s.word();
        assert_eq!(fin.id(), c2.id);
        let after = s.read_if(PAYLOAD_WORDS, |w| w.id() == c2.id).unwrap();
        if wrote.is_ok() {
            assert_eq!(after, words(100), "a stale write was published later");
        }
        let _ = first;
        assert_eq!(
            fin.quarantine(),
            0,
            "a finished stale writer left its quarantine"
        );
    });
}

/// L5 + L7: a holder's write is superseded by a stale-heartbeat takeover at any point;
/// the new holder writes; the stale writer's value never appears and its publication
/// fails, and its buffer leaves quarantine once it is done.
#[test]
fn loom_stale_writer_resumes_after_takeover() {
    loom::model(|| {
        let (s, first, got) = writer_of_20_beside(0, move |s2, _| {
            s2.epoch.store(5, Ordering::Release);
            let (c2, _) = claim(s2, NEVER, 30, 0, false)?;
            let wrote = s2.write_if(&words(100), PAYLOAD_WORDS, |w| w.id() == c2.id);
            Some((c2, wrote))
        });
        if let Some((c2, wrote)) = got {
            assert!(wrote.is_ok(), "a fresh holder with free buffers writes");
            let read = s.read_if(PAYLOAD_WORDS, |w| w.id() == c2.id).unwrap();
            assert_eq!(read, words(100), "the stale writer's value appeared");
            assert_eq!(s.word().id(), c2.id);
            assert_eq!(s.word().quarantine(), 0);
        } else {
            assert!(first.is_ok());
        }
    });
}

/// L5 + L7 through the sentinel: the holder's process starts to exit (the kernel marks
/// its slot's sentinel word `FUTEX_OWNER_DIED`) while its write is at any point; a
/// claimant whose grace never runs out takes it over as exiting, writes, and the exiting
/// writer's value never appears, its publication fails, and no buffer stays quarantined.
/// (The real claimant also waits until every thread of the holder is in the kernel's
/// exit, an OS check loom does not model; the protocol must be safe without it.)
#[test]
fn loom_exiting_writer_resumes_after_takeover() {
    loom::model(|| {
        let (s, first, got) = writer_of_20_beside(u64::MAX / 2, move |s2, c1| {
            // The "kernel", at the holder's sentinel's exit.
            let slot = &s2.idents[usize::from(Word(c1.id).holder()) - 1];
            slot.sentinel
                .store(super::slot::SENTINEL_EXITING, Ordering::SeqCst);
            let (c2, _) = claim(s2, NEVER, 30, u64::MAX / 2, false)
                .expect("an exiting holder is taken over whatever its heartbeat");
            let wrote = s2.write_if(&words(100), PAYLOAD_WORDS, |w| w.id() == c2.id);
            (c2, wrote)
        });
        let (c2, wrote) = got;
        assert!(wrote.is_ok(), "a fresh holder with free buffers writes");
        let read = s.read_if(PAYLOAD_WORDS, |w| w.id() == c2.id).unwrap();
        assert_eq!(read, words(100), "the exiting writer's value appeared");
        assert_eq!(s.word().id(), c2.id);
        assert_eq!(s.word().quarantine(), 0);
        assert!(first.is_ok() || first == Err(WriteRefused::Lost));
        assert_eq!(
            s.counters[super::state::counter::CLAIM_EXITING].load(Ordering::Relaxed),
            1
        );
    });
}

/// L7 for readers: a reader that loaded the claim word before a publication and a
/// refill of the buffer it names never returns that refill unless it is published. Here
/// the refill's publication fails (the writer is superseded as stale in between), so its
/// value must never be read.
#[test]
fn loom_late_reader_never_sees_an_unpublished_fill() {
    loom::model(|| {
        let (s, c1, _) = held_by_20(NEVER, 0);
        let _ = holder(&s, 30);
        assert!(
            s.write_if(&words(1), PAYLOAD_WORDS, |w| w.id() == c1.id)
                .is_ok()
        );
        let s1 = s.clone();
        let reader = thread::spawn(move || s1.read_if(PAYLOAD_WORDS, |_| true));
        let s2 = s.clone();
        let writer = thread::spawn(move || {
            assert!(
                s2.write_if(&words(2), PAYLOAD_WORDS, |w| w.id() == c1.id)
                    .is_ok()
            );
            let w = s2.start_write(|w| w.id() == c1.id).unwrap();
            s2.fill(w, &words(3), PAYLOAD_WORDS);
            s2.epoch.store(5, Ordering::Release);
            assert!(claim(&s2, NEVER, 30, 0, false).is_some());
            assert!(!s2.publish(w, false), "a superseded write published");
        });
        let read = reader.join().unwrap();
        writer.join().unwrap();
        assert!(
            read.is_none() || read == Some(words(1)) || read == Some(words(2)),
            "a reader saw a fill that was never published: {read:?}"
        );
    });
}

/// The blocking claim's round, as `OwnerLease::acquire` runs it (announce, re-check with
/// an RMW, try, sleep on the announced value), with the model futex: a lost wake-up
/// deadlocks the model.
fn blocking_claim(s: &LeaseState, pid: u32) -> super::LeaseClaim {
    let me = Claimant {
        holder: holder(s, pid),
        pid,
        private: false,
    };
    loop {
        let seq = crate::park::announce(&s.wake);
        s.recheck();
        if let Some(g) = s.try_claim(s.word(), NEVER, me, u64::MAX / 2, 0, unknown, false) {
            return s.claim_for(g.word, g.torn, pid);
        }
        crate::park::sleep(&s.wake, seq, std::time::Duration::ZERO, s.model().as_ref());
    }
}

/// No lost wake-up on the lease's blocking path: a waiter that finds the lease held and
/// sleeps is woken by the release, whatever the interleaving.
#[test]
fn loom_no_lost_wakeup() {
    loom::model(|| {
        let (s, c1, _) = held_by_20(NEVER, u64::MAX / 2);
        let _ = holder(&s, 30);
        let (_, c2) = race(
            &s,
            move |s1| assert!(s1.release_id(c1.id)),
            move |s2| blocking_claim(s2, 30),
        );
        assert_eq!(s.word().id(), c2.id);
    });
}

/// No lost wake-up when the epoch moves instead of the claim: a waiter sleeps behind a
/// fresh holder (grace 1 epoch, manual epochs) and is woken by the `tick_epoch` that
/// makes the holder stale, whatever the interleaving; it then takes the lease over. The
/// waiter reads the epoch after its re-check, as the blocking path and the async
/// reactor's check do.
#[test]
fn loom_tick_wakes_a_waiter_of_a_holder_it_makes_stale() {
    loom::model(|| {
        let (s, c1, _) = held_by_20(NEVER, 1);
        let _ = holder(&s, 30);
        let (_, c2) = race(
            &s,
            |s1| {
                // Two ticks: stale once the epoch is more than 1 past the heartbeat.
                s1.epoch.fetch_add(2, Ordering::SeqCst);
                s1.wake_after_tick();
            },
            |s2| {
                let me = Claimant {
                    holder: holder(s2, 30),
                    pid: 30,
                    private: false,
                };
                loop {
                    let seq = crate::park::announce(&s2.wake);
                    s2.recheck();
                    let now = s2.epoch.load(Ordering::Acquire);
                    if let Some(g) = s2.try_claim(s2.word(), NEVER, me, 1, now, unknown, false) {
                        return s2.claim_for(g.word, g.torn, 30);
                    }
                    crate::park::sleep(
                        &s2.wake,
                        seq,
                        std::time::Duration::ZERO,
                        s2.model().as_ref(),
                    );
                }
            },
        );
        assert_ne!(c2.id, c1.id);
        assert_eq!(s.word().id(), c2.id);
    });
}

/// Two sleepers and two handovers: waking one at a time loses no one (the woken waiter
/// announces again before it claims, so its own release wakes the next).
#[test]
fn loom_two_waiters_no_lost_wakeup() {
    loom::model(|| {
        let (s, c1, _) = held_by_20(NEVER, u64::MAX / 2);
        let _ = holder(&s, 30);
        let _ = holder(&s, 40);
        let waiter = |pid: u32| {
            let s = s.clone();
            thread::spawn(move || {
                let c = blocking_claim(&s, pid);
                assert!(s.release_id(c.id));
            })
        };
        let a = waiter(30);
        let b = waiter(40);
        assert!(s.release_id(c1.id));
        a.join().unwrap();
        b.join().unwrap();
        assert!(s.word().is_vacant());
    });
}

/// A claimant delayed between its claim and its term checkpoint while 2^16 more claims
/// and their checkpoint passed: its late checkpoint must not move the term (its word's
/// low generation bits are behind the term, not 2^40 ahead), while a checkpoint of a word
/// ahead of the term records it.
#[test]
fn loom_late_checkpoint_never_moves_the_term() {
    use super::state::TERM_CHECKPOINT;
    use super::word::GEN_SHIFT;
    loom::model(|| {
        let s = LeaseState::new();
        let late = 5 * TERM_CHECKPOINT;
        let passed = late + TERM_CHECKPOINT;
        s.term.store(passed, Ordering::Release);
        s.checkpoint(late << GEN_SHIFT);
        assert_eq!(
            s.term.load(Ordering::Acquire),
            passed,
            "a late checkpoint moved the term"
        );
        s.checkpoint((passed + TERM_CHECKPOINT) << GEN_SHIFT);
        assert_eq!(s.term.load(Ordering::Acquire), passed + TERM_CHECKPOINT);
    });
}

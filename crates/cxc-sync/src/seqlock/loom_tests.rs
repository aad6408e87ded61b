//! Loom models of the SeqLock protocol (`state.rs`, `docs/seqlock.md`): a writer that dies
//! at every step of its write, a writer that stalls at every step while others publish
//! and then resumes, readers racing publications, a dead writer's slot reclaimed, and
//! updaters superseding a stalled or dead claim holder.
//!
//! Run with `cargo xtask loom`.

use loom::sync::Arc;
use loom::thread;

use super::state::{SeqState, Verdict};
use crate::primitive::Ordering;

/// Payload words used by the models (fewer words, fewer interleavings).
const N: usize = 2;

/// A state holding 3 (published) with writer slots 0 and 1 reserved for processes 1, 2.
fn fresh() -> Arc<SeqState> {
    let s = SeqState::new();
    s.init(&[3; 6]);
    assert_eq!(s.reserve([1, 1, 1, 1], |_, _| Verdict::Alive), Some(0));
    assert_eq!(s.reserve([2, 1, 1, 2], |_, _| Verdict::Alive), Some(1));
    Arc::new(s)
}

/// A whole value (both words equal), and its version.
fn read(s: &SeqState) -> (u64, u64) {
    let (w, p) = s.read_words::<N>();
    assert_eq!(w[0], w[1], "torn read: {w:?}");
    (w[0], p >> 8)
}

/// A reader that reads twice: whole values among `allowed`, a version that never goes
/// back, and never `later` then `earlier` (two publications of one writer, in order).
fn read_twice(s: &SeqState, allowed: [u64; 4], (earlier, later): (u64, u64)) {
    let (v1, p1) = read(s);
    let (v2, p2) = read(s);
    assert!(p2 >= p1, "version went back: {p1} then {p2}");
    for v in [v1, v2] {
        assert!(allowed.contains(&v), "read {v}");
    }
    assert!(
        !(v1 == later && v2 == earlier),
        "read {later} then {earlier}"
    );
}

/// Runs writers `a` and `b` beside a [`read_twice`] reader (`allowed`, `order`), then
/// checks that there were three publications and that the last value is one of `last`.
fn beside_a_reader(
    s: Arc<SeqState>,
    a: impl FnOnce(&SeqState) + Send + 'static,
    b: impl FnOnce(&SeqState) + Send + 'static,
    allowed: [u64; 4],
    order: (u64, u64),
    last: [u64; 2],
) {
    let (s1, s2, s3) = (s.clone(), s.clone(), s.clone());
    let a = thread::spawn(move || a(&s1));
    let b = thread::spawn(move || b(&s2));
    let r = thread::spawn(move || read_twice(&s3, allowed, order));
    a.join().unwrap();
    b.join().unwrap();
    r.join().unwrap();
    let (v, p) = read(&s);
    assert_eq!(p, 3, "three publications");
    assert!(last.contains(&v), "last value {v}");
}

/// The write protocol of `SeqState::write`, stopped after `steps` steps (a writer that
/// dies or stalls there): 0 = before anything, 1 = after choosing its buffer, 2 = after
/// its first word, 3 = after its second word, 4 = published.
fn write_steps(s: &SeqState, slot: usize, v: u64, steps: u32) -> Option<(usize, u64)> {
    if steps == 0 {
        return None;
    }
    let (b, seen) = s.staging(slot);
    if steps == 1 {
        return Some((b, seen));
    }
    crate::primitive::fence(Ordering::Release);
    s.bufs[b].words[0].store(v, Ordering::Relaxed);
    if steps == 2 {
        return Some((b, seen));
    }
    s.bufs[b].words[1].store(v, Ordering::Relaxed);
    if steps == 3 {
        return Some((b, seen));
    }
    let mut seen = seen;
    while let Err(now) = s.publish(b, seen) {
        seen = now;
        loom::thread::yield_now();
    }
    None
}

/// Writer A dies at every step of a write while writer B writes and a reader reads: the
/// reader sees only whole values, never A's; B's write completes; a write after A's
/// death through a reclaimed slot completes and is read back.
#[test]
fn loom_seqlock_writer_dies_at_every_step() {
    for steps in 0..4 {
        // The slot scans after the joins are long but single-threaded.
        let mut b = loom::model::Builder::new();
        b.max_branches = 100_000;
        b.check(move || {
            let s = fresh();
            let (s1, s2) = (s.clone(), s.clone());
            let a = thread::spawn(move || {
                write_steps(&s1, 0, 99, steps);
                // The process is gone: the OS now reports it dead.
                s1.loom_dead.fetch_or(1, Ordering::Release);
            });
            let b = thread::spawn(move || s2.write::<N>(1, &[7, 7]));
            let (v, _) = read(&s);
            assert!(v == 3 || v == 7, "read {v}: A's bytes were exposed");
            a.join().unwrap();
            b.join().unwrap();
            assert_eq!(read(&s).0, 7);
            // A third process finds no free slot among 0..2 only after the 30 others are
            // taken; here it simply reclaims A's slot when asked to judge.
            let dead = |st: &SeqState, i: usize| {
                if st.loom_dead.load(Ordering::Acquire) & (1 << i) != 0 {
                    Verdict::Dead
                } else {
                    Verdict::Alive
                }
            };
            for _ in 2..super::state::SLOTS {
                assert!(s.reserve([9, 1, 1, 9], dead).is_some());
            }
            assert_eq!(
                s.reserve([5, 1, 1, 5], dead),
                Some(0),
                "A's slot is reclaimed"
            );
            s.write::<N>(0, &[8, 8]);
            assert_eq!(read(&s).0, 8);
        });
    }
}

/// Writer A stalls at every step of a write while B publishes twice; then A resumes. A
/// reader racing all of it sees whole values, versions that never go back, and never a
/// value before its publication; A's value is published last (it retried against the
/// newer value it saw).
#[test]
fn loom_seqlock_writer_stalls_at_every_step() {
    for steps in 1..4 {
        loom::model(move || {
            let a = move |s1: &SeqState| {
                let Some((b, seen)) = write_steps(s1, 0, 50, steps) else {
                    return;
                };
                // Stalled here; resumes (loom lets the others run at every point).
                thread::yield_now();
                let words = [50; N];
                s1.fill::<N>(b, &words);
                let mut seen = seen;
                while let Err(now) = s1.publish(b, seen) {
                    seen = now;
                    thread::yield_now();
                }
            };
            let b = |s2: &SeqState| {
                s2.write::<N>(1, &[60, 60]);
                s2.write::<N>(1, &[61, 61]);
            };
            // B publishes 60 before 61: after 61, 60 never comes back.
            beside_a_reader(fresh(), a, b, [3, 50, 60, 61], (60, 61), [50, 61]);
        });
    }
}

/// Writer A writes twice from its lane's `seen` (the handle's fast path: no load of
/// `pub_word` before the CAS; the second write starts from the value the first published)
/// while B publishes, so A's `seen` may be stale and its CAS fail and retry; a reader
/// reads twice. Whole values only, versions never go back, A's values in order, and the
/// last value is the last publication's.
#[test]
fn loom_seqlock_write_from_a_stale_seen() {
    loom::model(|| {
        let a = |s1: &SeqState| {
            let p = s1.write::<N>(0, &[40, 40]);
            s1.write_after::<N>(0, p, &[41, 41]);
        };
        let b = |s2: &SeqState| {
            s2.write::<N>(1, &[60, 60]);
        };
        beside_a_reader(fresh(), a, b, [3, 40, 41, 60], (40, 41), [41, 60]);
    });
}

/// Writer A writes three times, each from the value its previous write published, so
/// its third write refills the buffer its first published, while a reader may still be
/// copying it: the reader never returns a mix, and never a value before its publication.
#[test]
fn loom_seqlock_refill_under_a_late_reader() {
    loom::model(|| {
        let s = fresh();
        let (s1, s2) = (s.clone(), s.clone());
        let a = thread::spawn(move || {
            let p = s1.write::<N>(0, &[40, 40]);
            let p = s1.write_after::<N>(0, p, &[41, 41]);
            s1.write_after::<N>(0, p, &[42, 42]);
        });
        let r = thread::spawn(move || {
            let (v, p) = read(&s2);
            assert_eq!(v, [3, 40, 41, 42][p as usize], "value {v} at version {p}");
        });
        a.join().unwrap();
        r.join().unwrap();
        assert_eq!(read(&s), (42, 3));
    });
}

/// One updater step sequence: claim (superseding `cur` if held), read, add one, publish
/// only over the value read. Returns whether it published.
fn update(s: &SeqState, slot: usize, supersede: bool) -> bool {
    let c = s.claim_word();
    if SeqState::claim_holder(c).is_some() && !supersede {
        return false;
    }
    let Some(mine) = s.try_claim(c, slot) else {
        return false;
    };
    let (w, seen) = s.read_words::<N>();
    assert_eq!(w[0], w[1]);
    let (b, _) = s.staging(slot);
    s.fill::<N>(b, &[w[0] + 1; N]);
    let ok = s.publish(b, seen).is_ok();
    s.release_claim(mine);
    ok
}

/// Two updaters, one of which supersedes whatever claim it finds (as for a holder the OS
/// proved dead or that stalled past the timeout), plus a blind writer: no update is ever
/// published over a value it did not read, so the final value is the blind write's or
/// the initial value plus the number of successful updates after it.
#[test]
fn loom_seqlock_superseded_update_never_publishes_over_newer() {
    loom::model(|| {
        let s = fresh();
        let (s1, s2) = (s.clone(), s.clone());
        let a = thread::spawn(move || update(&s1, 0, false));
        let b = thread::spawn(move || update(&s2, 1, true));
        let (ra, rb) = (a.join().unwrap(), b.join().unwrap());
        let ok = u64::from(ra) + u64::from(rb);
        assert_eq!(read(&s).0, 3 + ok, "an update was lost or applied twice");
        assert!(ok >= 1, "at least one update publishes");
    });
}

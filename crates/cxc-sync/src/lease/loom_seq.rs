//! Loom models of the SeqLock protocol (`seq.rs`, `docs/seqlock.md`): a writer that dies
//! at every step of its write, a stalled writer that resumes at every step after being
//! superseded, and a reader racing two republications.
//!
//! Run with `cargo xtask loom`.

use loom::sync::Arc;
use loom::thread;

use super::ident::pid_word;
use super::os::Identity;
use super::seq::{Patience, Took};
use super::state::{LeaseState, PAYLOAD_WORDS, WriteRefused};
use crate::primitive::Ordering;

/// Outcomes seen across the explored executions (plain std atomics, outside the model):
/// each model asserts that it explored the takeovers it is about.
static SEEN: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

fn saw(i: usize) {
    SEEN[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn seen(i: usize) -> usize {
    SEEN[i].load(std::sync::atomic::Ordering::Relaxed)
}

/// Payload words used by the models (fewer words, fewer interleavings).
const N: usize = 2;

/// The writer slot of the process `pid` (as `SeqLock::writer` registers it).
fn writer(s: &LeaseState, pid: u32) -> u8 {
    let me = Identity {
        pid,
        pidns: 1,
        boot: 1,
        unique: u64::from(pid),
    };
    s.register(pid_word(pid, true), &me).expect("identity slot")
}

fn words(v: u64) -> [u64; PAYLOAD_WORDS] {
    [v; PAYLOAD_WORDS]
}

fn value(w: [u64; N]) -> u64 {
    assert_eq!(w[0], w[1], "torn read: {w:?}");
    w[0]
}

/// A state holding 3 (published) with writer slots for pids 20 and 30.
fn fresh() -> (Arc<LeaseState>, u8, u8) {
    let s = LeaseState::new();
    for w in &s.bufs[0].words[..N] {
        w.store(3, Ordering::Relaxed);
    }
    let a = writer(&s, 20);
    let b = writer(&s, 30);
    (Arc::new(s), a, b)
}

/// Writer A (pid 20) claims and dies after storing the odd sequence and its first word;
/// writer B meets it at every step: before its claim (free), during the fill (B takes
/// over as dead once the OS says so, or as stalled after its patience). A's bytes are
/// never published; B's write always completes, and so does a write after A's death
/// (A may have claimed after B and died holding the lock).
#[test]
fn loom_seq_writer_dies_at_every_step() {
    loom::model(|| {
        let (s, a, b) = fresh();
        let s1 = s.clone();
        let t1 = thread::spawn(move || {
            if let Ok(c) = s1.seq_begin(a, 20, Patience::new) {
                let stage = &s1.bufs[c.word.stage().expect("a staging buffer")];
                stage.seq.fetch_add(1, Ordering::Relaxed);
                stage.words[0].store(99, Ordering::Relaxed);
            }
            // The process is gone: the OS now reports it dead.
            s1.loom_dead.fetch_or(1 << a, Ordering::Release);
        });
        let s2 = s.clone();
        let t2 = thread::spawn(move || {
            let seen = value(s2.seq_read_words::<N>());
            assert!(seen == 3, "a dying writer's bytes were published: {seen}");
            let c = s2
                .seq_begin(b, 30, Patience::new)
                .expect("B always gets the lock");
            s2.seq_finish(c.word, &words(5), N).expect("B publishes");
            c.took
        });
        t1.join().unwrap();
        let took = t2.join().unwrap();
        saw(match took {
            Took::Free => 0,
            Took::Dead => 1,
            Took::Stalled => 2,
        });
        assert_eq!(value(s.seq_read_words::<N>()), 5);
        if took == Took::Stalled {
            // A was alive (stopped) when superseded: its buffer may stay quarantined
            // until someone proves it dead; it is never the published one.
            let fin = s.word();
            assert!(!fin.is_quarantined(fin.published()));
        }
        // A may also have claimed after B and died holding the lock: the next write
        // still completes (A is dead now) and is told.
        let c = s
            .seq_begin(b, 30, Patience::new)
            .expect("the lock is never wedged");
        s.seq_finish(c.word, &words(6), N).expect("published");
        assert_eq!(value(s.seq_read_words::<N>()), 6);
        assert!(s.word().is_vacant());
    });
    assert!(
        seen(0) > 0 && seen(1) > 0 && seen(2) > 0,
        "B took over a dead and a stalled A"
    );
}

/// Writer A is slow (it may be superseded as stalled at any step) and then resumes:
/// either it publishes before B takes the lock, or its publication fails, its value is
/// never visible and it frees its own quarantine. Readers never see a torn value.
#[test]
fn loom_seq_stalled_writer_resumes_at_every_step() {
    loom::model(|| {
        let (s, a, b) = fresh();
        let s1 = s.clone();
        let t1 = thread::spawn(move || {
            let c = s1.seq_begin(a, 20, Patience::new).expect("A gets the lock");
            s1.seq_finish(c.word, &words(7), N)
        });
        let s2 = s.clone();
        let t2 = thread::spawn(move || {
            // B's patience runs out at once: whatever step A is at, it is stalled.
            let c = s2
                .seq_begin(b, 30, Patience::eager)
                .expect("B gets the lock");
            (c.took, s2.seq_finish(c.word, &words(5), N))
        });
        let ra = t1.join().unwrap();
        let (took_b, rb) = t2.join().unwrap();
        let fin = value(s.seq_read_words::<N>());
        match (ra, rb) {
            (Ok(()), Ok(())) => assert!(fin == 5 || fin == 7),
            // A was superseded as stalled by B at some step (or B by A, whose begin came
            // later): the loser's value is never visible.
            (Err(e), Ok(())) => {
                assert_eq!(e, WriteRefused::Lost);
                assert_eq!(took_b, Took::Stalled);
                assert_eq!(fin, 5, "a superseded write was published");
                saw(3);
            }
            (Ok(()), Err(e)) => {
                assert_eq!(e, WriteRefused::Lost);
                assert_eq!(fin, 7, "a superseded write was published");
                saw(3);
            }
            (Err(_), Err(_)) => unreachable!("a writer is superseded only by a later claim"),
        }
        let w = s.word();
        assert!(w.is_vacant());
        assert_eq!(w.quarantine(), 0, "the resumed writer freed its quarantine");
    });
    assert!(seen(3) > 0, "a superseded writer resumed in some execution");
}

/// A reader racing two writes (the second reuses the buffer the reader may still be
/// copying) sees the old or a new value, never a mix.
#[test]
fn loom_seq_reader_never_torn() {
    loom::model(|| {
        let (s, a, _) = fresh();
        let s1 = s.clone();
        let t1 = thread::spawn(move || {
            for v in [7, 9] {
                let c = s1.seq_begin(a, 20, Patience::new).unwrap();
                s1.seq_finish(c.word, &words(v), N).unwrap();
            }
        });
        let seen = value(s.seq_read_words::<N>());
        assert!([3, 7, 9].contains(&seen));
        t1.join().unwrap();
        assert_eq!(value(s.seq_read_words::<N>()), 9);
    });
}

//! Loom model of the handle's guessed fast paths (`docs/owner-lease.md`, "The handle's
//! guess"): claim, held write and release by one CAS that expects a remembered word.

use loom::sync::Arc;
use loom::thread;

use super::super::state::{Claimant, LeaseState};
use super::super::word::{BufferFields, Word};
use super::{NEVER, holder, on, unknown, words};
use crate::primitive::Ordering;

/// The handle's fast paths start from a guess of the claim word (the word the handle's
/// last claim or release left) instead of a load. A claims and releases twice from its
/// own guesses while B claims from a stale guess (the fresh word); each holder writes
/// with `start_write_exact` and releases with `release_exact`: every claim made is
/// exclusive (a claim's release never clears another's), a stale guess never claims,
/// writes or releases anything, and the word ends vacant.
#[test]
fn loom_claim_and_release_from_a_guess() {
    loom::model(|| {
        let s = Arc::new(LeaseState::new());
        let fresh = s.word();
        let run = move |s: Arc<LeaseState>, pid: u32, rounds: u32| {
            let now = s.epoch.load(Ordering::Acquire);
            let me = Claimant {
                holder: holder(&s, pid),
                pid,
                private: false,
            };
            let mut guess = fresh;
            let mut held = 0u32;
            for _ in 0..rounds {
                let Some(g) = s.try_claim(guess, NEVER, me, 3, now, unknown, false) else {
                    continue;
                };
                let w = Word(g.word);
                assert_eq!(w.holder(), me.holder, "claimed for someone else");
                held += 1;
                // Held: nobody else can claim or release it (grace 3, no preemption).
                assert_eq!(s.word().id(), w.id(), "a claim was superseded while held");
                // A held write from the exact word (`write_as_owner`'s fast path).
                let ww = s.start_write_exact(w).expect("the holder's exact WRITE");
                s.fill(ww, &words(u64::from(pid)), 1);
                let w = s.publish_word(ww, false).expect("the holder's publication");
                let left = s.release_exact(w).expect("the holder's exact release");
                assert!(left.is_vacant());
                guess = left;
            }
            held
        };
        let (s1, s2) = (s.clone(), s.clone());
        let a = thread::spawn(move || run(s1, 10, 2));
        let b = thread::spawn(move || run(s2, 20, 1));
        let (ha, hb) = (a.join().unwrap(), b.join().unwrap());
        assert!(ha + hb >= 1, "nobody ever claimed");
        let end = s.word();
        assert!(end.is_vacant());
        assert_eq!(
            end.gen_low(),
            u64::from(ha + hb),
            "one generation per claim"
        );
        // A stale exact release or WRITE changes nothing.
        assert!(s.release_exact(Word(fresh.0 | 1)).is_none());
        assert!(
            s.start_write_exact(Word(fresh.0 | 1).with_stage(Some(1)))
                .is_none()
        );
        // The last publication is the value read back.
        let v = s.read_published_consistent();
        assert!(v[0] == 10 || v[0] == 20, "read {v:?}");
    });
}

/// A guard's write and release go from the word it last installed (no load): pid 20
/// holds a private claim and writes 7, then releases, each from its last word, while
/// pid 30 claims (superseding 20 as stale, or after its release), reads and writes 100.
/// A write of 20 published before 30's claim is what 30 reads; one that was not is never
/// read, its publication fails, and its staging buffer leaves quarantine once 20 is done.
#[test]
fn loom_guard_writes_and_releases_from_its_last_word() {
    loom::model(|| {
        let s = Arc::new(LeaseState::new());
        let now = s.epoch.load(Ordering::Acquire);
        let guard = Claimant {
            holder: holder(&s, 20),
            pid: 20,
            private: true,
        };
        let _ = holder(&s, 30);
        let g = s
            .try_claim(s.word(), NEVER, guard, 0, now, unknown, false)
            .expect("vacant");
        let last = Word(g.word);
        let a = on(s.clone(), move |s| {
            let wrote = s.write_private(last, &words(7), 1);
            let released = s.release_private(wrote.unwrap_or(last));
            (wrote.is_ok(), released.is_some())
        });
        let b = on(s.clone(), move |s| {
            s.epoch.store(5, Ordering::Release);
            let me = Claimant {
                holder: holder(s, 30),
                pid: 30,
                private: false,
            };
            // A try: it may give up while 20's CASes change the word under it.
            let g = s.try_claim(s.word(), NEVER, me, 0, 5, unknown, false)?;
            let id = Word(g.word).id();
            let before = s.read_if(1, |w| w.id() == id).expect("held")[0];
            let wrote = s.write_if(&words(100), 1, |w| w.id() == id);
            Some((before, wrote))
        });
        let (wrote, released) = a.join().unwrap();
        let Some((before, wrote100)) = b.join().unwrap() else {
            // 30 gave up: 20's write and release stand alone.
            assert!(wrote && released, "20 alone failed");
            assert!(s.word().is_vacant());
            assert_eq!(s.read_published_consistent()[0], 7);
            return;
        };
        assert_eq!(
            before,
            if wrote { 7 } else { 0 },
            "30 read a value that was not published before its claim"
        );
        assert!(!released || wrote, "20 released but its write failed");
        assert!(wrote100.is_ok(), "a fresh holder with free buffers writes");
        assert_eq!(s.read_published_consistent()[0], 100);
        assert_eq!(s.word().quarantine(), 0, "a buffer stayed in quarantine");
    });
}

//! Loom model of the handle's guessed fast paths (`docs/owner-lease.md`, "The handle's
//! guess"): claim, held write and release by one CAS that expects a remembered word.

use loom::sync::Arc;
use loom::thread;

use super::super::state::{Claimant, LeaseState};
use super::super::word::Word;
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

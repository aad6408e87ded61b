//! The seed API (pid-based calls) and the fenced-claim API of [`OwnerLease`].

use crate::payload::BufferFields;
use cxc_sidecar::Instrumented;
use cxc_sidecar::OpCode;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::LeaseClaim;
use super::file::*;
use super::state::{Granted, LeaseState, WriteRefused};
use super::word::Word;
use crate::primitive::Ordering;

/// Aborts an unfinished `with_lease` if its closure panics: nothing is published, and a
/// claim the call made is released (`release`). Not in a child the closure forked: the
/// claim and its WRITE are the parent's (`proc`), which goes on with them.
struct AbortOnUnwind<'a> {
    state: &'a LeaseState,
    word: Word,
    armed: bool,
    release: bool,
    proc: u32,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed && my_proc() == self.proc {
            self.state.abort_write(self.word, self.release);
        }
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Seed API: claims the lease for `my_pid` if it is vacant, held by a higher pid
    /// (with [`Preemption::LowerPid`](crate::Preemption::LowerPid)), stale by more than `grace` epochs, or held by a
    /// process that no longer exists. Idempotent for the current holder (the same `pid`
    /// claimed through this process). PID 0 is refused, and so is a claim when the
    /// file's identity table has no free slot (64 slots; one per process and pid).
    #[inline]
    pub fn try_acquire(&self, my_pid: u32, grace: u64) -> bool {
        self.claim_now(my_pid, grace, false).is_some()
    }

    /// Like [`try_acquire`](Self::try_acquire), returning the fenced claim.
    #[inline]
    pub fn try_claim(&self, my_pid: u32, grace: u64) -> Option<LeaseClaim> {
        self.claim_now(my_pid, grace, false)
            .map(|g| self.state().claim_for(g.word, g.torn, my_proc()))
    }

    /// Whether `word` is a claim made by this process for `pid` (no registration).
    #[inline]
    pub(super) fn held_as(&self, word: Word, pid: u32) -> bool {
        // The hot case in one comparison: the handle's first cache entry names this
        // process, `pid` and the word's holder (entries never name holder 0 or pid 0).
        self.cache_hit(pid, word.holder()) || self.held_as_slow(word, pid)
    }

    #[cold]
    #[inline(never)]
    fn held_as_slow(&self, word: Word, pid: u32) -> bool {
        !word.is_vacant() && self.holder(pid, false) == Some(word.holder())
    }

    /// Seed API: releases the lease if `my_pid` holds it (claimed through this process).
    /// Any thread of the process may release it, also while a sibling thread is writing
    /// under the same pid: that write then fails and is never published.
    #[inline]
    pub fn release(&self, my_pid: u32) -> bool {
        // Fast path: the claim this handle made, if it is still the word (the CAS proves
        // it) and no write is in flight (then `release_from` must quarantine). The rest
        // is out of line (`release_slow`, `note_release`).
        let guess = Word(self.hot.load(Ordering::Relaxed));
        if self.cache_hit(my_pid, guess.holder())
            && !guess.may_be_writing()
            && let Some(vacated) = self.state().release_exact(guess)
        {
            self.hot.store(vacated.0, Ordering::Relaxed);
            if self.observed.get() {
                self.note_release(guess);
            }
            return true;
        }
        self.release_slow(my_pid)
    }

    #[cold]
    #[inline(never)]
    fn note_release(&self, released: Word) {
        self.note(
            OpCode::LeaseRelease,
            0,
            self.state().full_generation(released.0),
        );
    }

    /// [`release`](Self::release) from the loaded word (the guess was not this claim, or
    /// a write may be in flight).
    #[cold]
    #[inline(never)]
    fn release_slow(&self, my_pid: u32) -> bool {
        let cur = self.state().word();
        if !self.held_as(cur, my_pid) {
            return false;
        }
        let left = self.state().release_from(cur.id(), cur, false);
        if let Some(vacated) = left {
            self.hot.store(vacated.0, Ordering::Relaxed);
        }
        let ok = left.is_some();
        if self.observed.get() {
            let op = if ok {
                OpCode::LeaseRelease
            } else {
                OpCode::LeaseLossDetected
            };
            self.note(op, 0, self.state().full_generation(cur.0));
        }
        ok
    }

    /// Releases `claim` if it is still the current claim; a stale claim never clears a
    /// newer one. Only the process that made the claim can use it (`false` in a forked
    /// child, or for a token of another process's claim from `current_claim`).
    #[inline]
    pub fn release_claim(&self, claim: &LeaseClaim) -> bool {
        let ok = claim.proc == my_proc() && {
            // From the handle's guess when it names this claim (the CAS proves it).
            let st = self.state();
            let guess = Word(self.hot.load(Ordering::Relaxed));
            let from = if guess.id() == claim.id && !guess.is_vacant() {
                guess
            } else {
                st.word()
            };
            let left = st.release_from(claim.id, from, false);
            if let Some(vacated) = left {
                self.hot.store(vacated.0, Ordering::Relaxed);
            }
            left.is_some()
        };
        self.note(
            if ok {
                OpCode::LeaseRelease
            } else {
                OpCode::LeaseLossDetected
            },
            0,
            claim.generation,
        );
        ok
    }

    /// Seed API: claims the lease (as [`try_acquire`](Self::try_acquire)), runs `f` on a
    /// copy of the payload, publishes the result and releases, in two atomic steps. If
    /// `my_pid` already held the lease it stays held: the update is then one held write,
    /// with the claim's WRITE bit set while `f` runs, so a sibling thread's write of the
    /// same claim waits for it (at most ~100 ms, then that write fails), and a sibling's
    /// write in flight is waited for the same way (then `None`, `f` not run). Returns
    /// `None` if the lease could not be claimed, if the claim was lost before the payload
    /// was copied (`f` not run: `f` always gets a whole published value, never one a
    /// taker was overwriting), or if it was lost while `f` ran —
    /// then nothing is published, ever: a claim superseded or released while `f` runs
    /// cannot publish, and its staging buffer stays in quarantine until this call returns.
    /// If `f` panics nothing is published, and a claim this call made is released.
    ///
    /// If `f` forks, the child's `with_lease` returns `None` and touches nothing shared:
    /// the claim is the parent's, and only the parent publishes `f`'s result or releases.
    pub fn with_lease<R>(&self, my_pid: u32, grace: u64, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let st = self.state();
        // The process that makes (or holds) the claim; checked again after `f`, which
        // may fork (a child must neither fill the staging buffer nor publish).
        let proc = my_proc();
        match self.claim_now(my_pid, grace, true) {
            // We hold the new claim with WRITE set: nobody else writes our staging
            // buffer or republishes. Publishing also releases it.
            Some(Granted { word, .. }) => self.update_written(Word(word), proc, true, f),
            None => {
                // Already held for `my_pid` (by this process): a held update, with WRITE
                // set from the read to the publication, so that a sibling thread's write
                // of the same claim waits for it (or gives up) instead of being lost.
                let ours = |w: Word| self.held_as(w, my_pid);
                if !ours(st.word()) {
                    return None;
                }
                let word = st.start_write(ours).ok()?;
                self.update_written(word, proc, false, f)
            }
        }
    }

    /// The rest of [`with_lease`](Self::with_lease) once this process (`proc`) holds
    /// WRITE on the claim `word`: copy the published payload, run `f`, and — if still in
    /// `proc`, not a child `f` forked — fill the staging buffer and publish (and release
    /// the claim if `release`). A panic in `f` aborts the write (and releases if
    /// `release`).
    #[inline(always)]
    fn update_written<R>(
        &self,
        word: Word,
        proc: u32,
        release: bool,
        f: impl FnOnce(&mut T) -> R,
    ) -> Option<R> {
        let st = self.state();
        let mut guard = AbortOnUnwind {
            state: st,
            word,
            armed: true,
            release,
            proc,
        };
        let mut value: T = from_words(&st.read_published(word, words_for::<T>())?)?;
        let r = f(&mut value);
        guard.armed = false;
        if my_proc() != proc {
            return None;
        }
        st.fill(word, &to_words(&value), words_for::<T>());
        let left = st.publish_word(word, release)?;
        self.hot.store(left.0, Ordering::Relaxed);
        Some(r)
    }

    /// Seed API: the payload, if `my_pid` holds the lease (claimed through this process).
    #[inline]
    pub fn read_as_owner(&self, my_pid: u32) -> Option<T> {
        let words = self
            .state()
            .read_if(words_for::<T>(), |w| self.held_as(w, my_pid))?;
        from_words(&words)
    }

    /// The payload, if `claim` is still current (and this process made it).
    #[inline]
    pub fn read_claimed(&self, claim: &LeaseClaim) -> Option<T> {
        if claim.proc != my_proc() {
            return None;
        }
        let words = self
            .state()
            .read_if(words_for::<T>(), |w| w.id() == claim.id)?;
        from_words(&words)
    }

    /// Seed API: writes the payload if `my_pid` holds the lease. The ownership check and
    /// the publication are one atomic step: a holder that was superseded never publishes.
    #[inline]
    #[must_use = "`false` means the lease was lost: stop the work it guards"]
    pub fn write_as_owner(&self, my_pid: u32, value: T) -> bool {
        self.write_held(&to_words(&value), |w| self.held_as(w, my_pid))
            .is_ok()
    }

    /// Writes the payload if `claim` is still current and this process made it (fenced).
    /// `false` also when every
    /// payload buffer is held in quarantine by stalled writers of earlier claims
    /// (counter `no_buffer`; see `docs/owner-lease.md`).
    #[inline]
    #[must_use = "`false` means the lease was lost: stop the work it guards"]
    pub fn write_claimed(&self, claim: &LeaseClaim, value: T) -> bool {
        if claim.proc != my_proc() {
            return false;
        }
        // Never a guard's (private) claim: its guard is its only writer.
        let r = self.write_held(&to_words(&value), |w| w.id() == claim.id && !w.private());
        if r == Err(WriteRefused::Lost) {
            self.note(OpCode::LeaseStaleWriteRejected, 0, claim.generation);
        }
        r.is_ok()
    }

    /// A held write of the claim that `ours` accepts: WRITE, fill, publish. It starts from
    /// the handle's guess of the word (see `release`) when `ours` accepts the guess and
    /// the guess has a staging buffer and no write in flight: the WRITE CAS then proves
    /// the word was the guess. Otherwise from the loaded word. The word the publication
    /// leaves is the next guess.
    #[inline]
    fn write_held(
        &self,
        words: &[u64; super::state::PAYLOAD_WORDS],
        ours: impl Fn(Word) -> bool,
    ) -> Result<(), WriteRefused> {
        let st = self.state();
        let guess = Word(self.hot.load(Ordering::Relaxed));
        let word = if !guess.is_vacant()
            && !guess.may_be_writing()
            && guess.stage().is_some()
            && ours(guess)
            && let Some(w) = st.start_write_exact(guess)
        {
            w
        } else {
            st.start_write(&ours)?
        };
        st.fill(word, words, words_for::<T>());
        let left = st.publish_word(word, false).ok_or(WriteRefused::Lost)?;
        self.hot.store(left.0, Ordering::Relaxed);
        Ok(())
    }

    /// Seed API: refreshes the heartbeat if `my_pid` holds the lease; `false` means the
    /// lease was lost (preempted or taken over).
    #[inline]
    #[must_use = "`false` means the lease was lost: stop the work it guards"]
    pub fn beat(&self, my_pid: u32) -> bool {
        self.state()
            .beat_if(self.now(), |w| self.held_as(w, my_pid))
    }

    /// Refreshes the heartbeat if `claim` is still current (and this process made it).
    #[inline]
    #[must_use = "`false` means the lease was lost: stop the work it guards"]
    pub fn beat_claimed(&self, claim: &LeaseClaim) -> bool {
        let ok =
            claim.proc == my_proc()
                && self
                    .state()
                    .beat_if(self.now(), |w| w.id() == claim.id && !w.private());
        if !ok {
            self.note(OpCode::LeaseLossDetected, 0, claim.generation);
        }
        ok
    }

    /// Whether `claim` is the current claim.
    #[inline]
    pub fn is_current(&self, claim: &LeaseClaim) -> bool {
        let st = self.state();
        let w = st.word();
        w.id() == claim.id && !w.is_vacant() && st.term.load(Ordering::Acquire) <= claim.generation
    }
}

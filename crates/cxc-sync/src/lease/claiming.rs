//! The claim side of the lease protocol: claim, takeover (preempt, stale, dead),
//! release (see `state.rs` and `docs/owner-lease.md`, L1/L3/L5/L6).

use crate::liveness::Liveness;
use crate::primitive::{Ordering, spin_hint};

use super::state::*;
use super::word::BufferFields;
use super::word::{GEN_SHIFT, Word, quarantine_tag};

impl LeaseState {
    /// Claim protocol (seed 000 + fencing). `now` is the current epoch (read once by the
    /// caller); `owner` judges the holder's OS liveness. With `write` the new claim is
    /// installed with the WRITE bit already set (used by `with_lease`).
    ///
    /// `guess` is the claim word as just loaded, or a value it may hold (the word this
    /// handle's last operation left) instead of a load: the fast path's CAS expects
    /// `guess`, so its success proves the word was `guess` (generations make words
    /// unique), exactly as if a load had returned it; a wrong guess only costs that
    /// failed CAS, whose result the next attempt starts from.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_claim(
        &self,
        guess: Word,
        policy: Policy,
        me: Claimant,
        grace: u64,
        now: u64,
        owner: impl FnMut(&Self, Word) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        // Fast path: a vacant lease whose heartbeat is already current (no write to it).
        let mut cur = guess;
        for attempt in 0..2 {
            match self.try_claim_vacant(cur, me, now, write) {
                Ok(g) => return Some(g),
                Err(Some(actual)) => cur = actual,
                // The guess was not vacant: it may be stale (the handle's guess is the
                // word as it last left it), so look at the word once before the slow path.
                Err(None) if attempt == 0 && !cur.is_vacant() => {
                    cur = self.word();
                    if !cur.is_vacant() {
                        break;
                    }
                }
                Err(None) => break,
            }
        }
        self.try_claim_slow(policy, me, grace, now, owner, write)
    }

    /// The fast path: claims the vacant word `cur` if the heartbeat is current and no
    /// interrupted write is pending. `Err(Some(actual))`: the word was not `cur`;
    /// `Err(None)`: the fast path does not apply.
    #[inline(always)]
    fn try_claim_vacant(
        &self,
        cur: Word,
        me: Claimant,
        now: u64,
        write: bool,
    ) -> Result<Granted, Option<Word>> {
        if cur.is_vacant()
            && me.holder != 0
            && self.heartbeat.load(Ordering::Relaxed) >= now
            && self.torn.load(Ordering::Relaxed) & TORN_NEXT == 0
            && let Some(stage) = cur.free_buffer()
        {
            let next = cur
                .with_holder(me.holder)
                .with_stage(Some(stage))
                .next_gen()
                .with_write(write)
                .with_private(me.private);
            return match self.claim.compare_exchange(
                cur.0,
                next.0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.note_claim(next, ClaimReason::Vacant, false, now);
                    Ok(Granted {
                        word: next.0,
                        torn: false,
                        reason: Some(ClaimReason::Vacant),
                    })
                }
                Err(actual) => Err(Some(Word(actual))),
            };
        }
        Err(None)
    }

    #[cold]
    #[inline(never)]
    fn try_claim_slow(
        &self,
        policy: Policy,
        me: Claimant,
        grace: u64,
        now: u64,
        mut owner: impl FnMut(&Self, Word) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        if me.holder == 0 {
            return None;
        }
        let mut spins = 0u32;
        let mut reaped = false;
        let mut cache: Option<(u64, Liveness)> = None;
        let mut judge = |state: &Self, word: Word| -> Liveness {
            match cache {
                Some((c, v)) if c == word.id() => v,
                _ => {
                    let v = owner(state, word);
                    cache = Some((word.id(), v));
                    v
                }
            }
        };
        let mut cur = self.word();
        loop {
            if cur.holder() == me.holder && !me.private {
                // Idempotent (seed): the caller already holds it.
                if write {
                    // `with_lease` on a held lease goes through the ordinary write path.
                    return None;
                }
                return Some(Granted {
                    word: cur.0,
                    torn: false,
                    reason: None,
                });
            }
            let mut verdict = Liveness::Unknown;
            let reason = if cur.is_vacant() {
                ClaimReason::Vacant
            } else if policy.preempt_lower && !cur.private() && me.pid < self.holder_pid(cur) {
                ClaimReason::Preempt
            } else if now.saturating_sub(self.heartbeat.load(Ordering::Acquire)) > grace {
                ClaimReason::Stale
            } else if self.slot_exiting(cur.holder()) && self.holder_stopped(cur) {
                // The holder's process is exiting (its sentinel ended) and none of its
                // threads can run user code again: taken over as stale, not as dead (the
                // slot is not free until the OS proves the group gone); a staging buffer
                // that may be in use is quarantined below as for any stale holder.
                ClaimReason::Exiting
            } else {
                verdict = judge(self, cur);
                if verdict == Liveness::Dead {
                    ClaimReason::Dead
                } else {
                    return None;
                }
            };
            let mut next = cur;
            let mut torn = cur.writing();
            let marker = self.torn.load(Ordering::Acquire);
            if cur.is_vacant() {
                // A claim vacated with an interrupted update not yet rewritten (a dead
                // holder's, `vacate_dead_holder`, or a release by a holder that inherited
                // one, `pass_torn_on`): the next claim inherits the torn flag.
                torn = marker == TORN_NEXT | cur.gen_low();
            } else if marker == cur.id() || marker == TORN_NEXT | cur.gen_low() {
                // The holder we take over inherited an interrupted update and has not
                // written since (or is releasing it just now): we inherit it too.
                torn = true;
            }
            if cur.may_be_writing() {
                // A write may be in flight: WRITE is set, or the holder is a guard (whose
                // single writer stages without WRITE). A writer the OS proves dead can
                // store nothing more. A live (or unidentifiable, e.g. paused) one with
                // WRITE gets a short while to finish; then a preemption gives up (a live
                // writer is never preempted mid-write), while a stale-heartbeat takeover
                // supersedes it and quarantines its staging buffer (L5, L7).
                if verdict == Liveness::Unknown {
                    verdict = judge(self, cur);
                }
                if cur.private() {
                    // A guard's update was interrupted if its staging buffer is mid-fill.
                    torn = torn
                        || cur
                            .stage()
                            .is_some_and(|s| self.bufs[s].seq.load(Ordering::Acquire) & 1 == 1);
                }
                if verdict != Liveness::Dead {
                    if cur.writing() {
                        if spins < WRITE_SPIN_LIMIT {
                            spins += 1;
                            spin_hint();
                            cur = self.word();
                            continue;
                        }
                        if reason == ClaimReason::Preempt
                            && now.saturating_sub(self.heartbeat.load(Ordering::Acquire)) <= grace
                        {
                            return None;
                        }
                    }
                    next = self.quarantine_stage(cur, next);
                }
            }
            let next = next
                .with_holder(me.holder)
                .with_stage(None)
                .with_write(false)
                .with_private(me.private)
                .next_gen();
            let stage = next.free_buffer();
            if write && stage.is_none() {
                // Every buffer published, staged or in quarantine: free the quarantines of
                // writers that are gone (or going), once, and look again.
                if !reaped {
                    reaped = true;
                    self.reap_quarantine();
                    cur = self.word();
                    continue;
                }
                self.bump(counter::NO_BUFFER, 1);
                return None;
            }
            let next = next.with_stage(stage).with_write(write);
            // L6: refresh the heartbeat *before* the claim becomes visible, so nobody who
            // sees the new claim can find it stale. `fetch_max` never moves it backwards.
            if self.heartbeat.load(Ordering::Relaxed) < now {
                self.heartbeat.fetch_max(now, Ordering::Relaxed);
            }
            match self.install(cur, next) {
                Ok(()) => {
                    self.note_claim(next, reason, torn, now);
                    return Some(Granted {
                        word: next.0,
                        torn,
                        reason: Some(reason),
                    });
                }
                Err(actual) => {
                    cur = actual;
                    spin_hint();
                }
            }
        }
    }

    /// `next` with `cur`'s staging buffer (if any) put into quarantine: its record is
    /// raised to `cur`'s claim first (`fetch_max`), so the Q bit set in the same CAS
    /// that installs `next` always has a record naming the superseded writer (L7).
    fn quarantine_stage(&self, cur: Word, next: Word) -> Word {
        let Some(s) = cur.stage() else { return next };
        self.qowner[s].fetch_max(
            quarantine_tag(self.full_generation(cur.0), cur.holder()),
            Ordering::AcqRel,
        );
        next.with_quarantined(s)
    }

    /// One CAS of the claim word from `cur` to `next`, counting a new quarantine.
    /// `Err(actual)`: the word was not `cur`.
    #[inline(always)]
    fn install(&self, cur: Word, next: Word) -> Result<(), Word> {
        self.claim
            .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            .map_err(Word)?;
        if next.quarantine() != cur.quarantine() {
            self.bump(counter::QUARANTINED, 1);
        }
        Ok(())
    }

    #[inline(always)]
    fn note_claim(&self, word: Word, reason: ClaimReason, torn: bool, now: u64) {
        // Since when the claim is held (for `cxc inspect`): the epoch, tagged with the
        // generation's low bits so a reader can tell it belongs to the current claim.
        self.claimed_at.store(
            now << CLAIMED_AT_SHIFT | (word.gen_low() & ((1 << CLAIMED_AT_SHIFT) - 1)),
            Ordering::Relaxed,
        );
        if word.gen_low().is_multiple_of(TERM_CHECKPOINT) {
            self.checkpoint(word.0);
        }
        match reason {
            ClaimReason::Vacant => {}
            ClaimReason::Preempt => self.bump(counter::CLAIM_PREEMPT, 1),
            ClaimReason::Stale => self.bump(counter::CLAIM_STALE, 1),
            ClaimReason::Dead => self.bump(counter::CLAIM_DEAD, 1),
            ClaimReason::Exiting => self.bump(counter::CLAIM_EXITING, 1),
        }
        if torn {
            self.torn.store(word.id(), Ordering::Release);
            self.bump(counter::TORN_INHERITED, 1);
        } else if self.torn.load(Ordering::Relaxed) & TORN_NEXT != 0 {
            // A marker for a vacant word that another claim went past: stale.
            self.torn.store(0, Ordering::Release);
        }
    }

    /// Vacates the current claim if the OS proves its holder's whole process gone, so
    /// that its identity slot is no longer referenced and can be reused by a claimant
    /// that found the identity table full. An interrupted update is passed on to the next
    /// claim (`TORN_NEXT`). Returns whether it vacated.
    #[cold]
    pub(crate) fn vacate_dead_holder(&self) -> bool {
        let cur = self.word();
        if cur.is_vacant() || self.holder_liveness(cur) != Liveness::Dead {
            return false;
        }
        if !self.vacate(cur) {
            return false;
        }
        self.bump(counter::CLAIM_DEAD, 1);
        true
    }

    /// Vacates the claim `cur`, whose holder can store nothing more, if it is still the
    /// word, passing an interrupted update on to the next claim (`TORN_NEXT`) and waking
    /// the sleepers. Returns whether it vacated.
    fn vacate(&self, cur: Word) -> bool {
        // Interrupted now (WRITE, or a guard mid-fill), or inherited and never rewritten.
        let torn = cur.writing()
            || (cur.private()
                && cur
                    .stage()
                    .is_some_and(|s| self.bufs[s].seq.load(Ordering::Acquire) & 1 == 1))
            || self.torn.load(Ordering::Acquire) == cur.id();
        if torn {
            self.torn
                .store(TORN_NEXT | cur.gen_low(), Ordering::Release);
        }
        if self
            .claim
            .compare_exchange(cur.0, cur.vacated().0, Ordering::SeqCst, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.wake_waiters();
        true
    }

    #[cold]
    pub(super) fn checkpoint(&self, word: u64) {
        let low = word >> GEN_SHIFT;
        let t = self.term.load(Ordering::Acquire);
        let ahead = low.wrapping_sub(t) & (GEN_MOD - 1);
        // A claimant delayed between its claim and here while 2^16 more claims and their
        // checkpoint passed its word would read it as almost 2^40 generations ahead of
        // the term (the low bits wrapped): then the term would jump and every later
        // claim's token with it, and `is_current` would fail for the current claim.
        // Such a word is behind the term: nothing to record.
        if ahead < GEN_MOD / 2 {
            self.term.fetch_max(t.wrapping_add(ahead), Ordering::AcqRel);
        }
    }

    /// Releases the claim if the word is exactly `word` (a claim with no write in flight,
    /// so nothing to quarantine), with one CAS and no load before it. Returns the vacant
    /// word left, or `None` if the word was not `word`.
    #[inline(always)]
    pub(crate) fn release_exact(&self, word: Word) -> Option<Word> {
        debug_assert!(!word.is_vacant() && !word.may_be_writing());
        let next = word.vacated();
        self.pass_torn_on(word);
        self.claim
            .compare_exchange(word.0, next.0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        self.wake_waiters();
        Some(next)
    }

    /// Before releasing `cur`: if it inherited an interrupted update and has not written
    /// since (`torn` names it), the flag goes on to the vacant word the release leaves
    /// (`TORN_NEXT` with its generation bits), so the next claim inherits it too. A CAS,
    /// so it never overwrites the flag of a claim that superseded `cur` meanwhile; a
    /// taker of `cur` that sees the passed-on flag inherits it as well (`try_claim`).
    #[inline]
    pub(crate) fn pass_torn_on(&self, cur: Word) {
        if self.torn.load(Ordering::Acquire) == cur.id() {
            self.pass_torn_on_slow(cur);
        }
    }

    #[cold]
    #[inline(never)]
    fn pass_torn_on_slow(&self, cur: Word) {
        let _ = self.torn.compare_exchange(
            cur.id(),
            TORN_NEXT | cur.gen_low(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Releases the claim `id` (holder + generation bits). A stale id never touches the
    /// current claim (L3).
    #[inline]
    #[cfg(cxc_loom)]
    pub(crate) fn release_id(&self, id: u64) -> bool {
        self.release_from(id, self.word(), false).is_some()
    }

    /// [`release_id`](Self::release_id) starting from an already loaded claim word. A
    /// write of the same claim in flight (a sibling thread's) does not delay the release:
    /// its staging buffer goes into quarantine and its publication will fail.
    /// `by_guard`: the release is the guard's own (its single writer is not writing).
    /// `cur` may also be a guess (the word as the caller last left it): the CAS proves it,
    /// and a failed CAS goes on from the actual word. Returns the vacant word installed.
    #[inline]
    pub(crate) fn release_from(&self, id: u64, mut cur: Word, by_guard: bool) -> Option<Word> {
        loop {
            // Only a guard releases a guard's (private) claim.
            if cur.id() != id || cur.is_vacant() || (cur.private() && !by_guard) {
                self.bump(counter::STALE_OP_REJECTED, 1);
                return None;
            }
            self.pass_torn_on(cur);
            let mut next = cur.vacated();
            if cur.writing() {
                next = self.quarantine_stage(cur, next);
            }
            match self.install(cur, next) {
                Ok(()) => {
                    self.wake_waiters();
                    return Some(next);
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

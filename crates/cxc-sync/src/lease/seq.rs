//! The SeqLock write protocol on the lease state (`docs/seqlock.md`).
//!
//! A `SeqLock` is a lease state whose writers make one **private claim per write**: claim
//! with the writer's identity slot (PRIVATE, like a guard's claim, so whoever supersedes
//! it quarantines its staging buffer), fill the staging buffer as a seqlock writer, then
//! publish *and release* in one CAS ([`LeaseState::publish`] with `release`). Readers read
//! the published buffer without any claim ([`LeaseState::read_if`]). So the SeqLock shares
//! the lease's claim word, buffers, quarantine and identity table, and the lease's L4
//! (no torn data) and L7 (no abandoned write is visible) arguments apply unchanged.
//!
//! What differs from the lease is *when* a writer is superseded: a SeqLock claim lives
//! only for one write, so there is no heartbeat. A waiting writer takes over
//! - at once when the OS proves the claiming process dead (the liveness judge), and
//! - when it saw the *same* claim for longer than its patience (a stalled writer: stopped,
//!   hung, or a slow `update` closure); the takeover quarantines the stalled writer's
//!   staging buffer, so its bytes are never published.
//!
//! The stale takeover reuses the lease's heartbeat rule: the heartbeat word is never
//! refreshed by SeqLock claims (they pass epoch 0), and a takeover passes
//! `now = heartbeat + 1` with grace 0.

use crate::liveness::Liveness;
use crate::primitive::{Ordering, fence, spin_hint};

use super::state::*;
use super::word::Word;

/// SeqLock claims never preempt by pid.
const SEQ_POLICY: Policy = Policy {
    preempt_lower: false,
};

/// How a write took the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Took {
    /// The lock was free.
    Free,
    /// The previous writer's process was proven dead mid-write.
    Dead,
    /// The previous writer held the lock longer than the patience (stalled).
    Stalled,
}

/// A granted write claim: the claim word (PRIVATE, with a staging buffer) and how it
/// was taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqClaim {
    pub(crate) word: Word,
    pub(crate) took: Took,
}

/// A waiting writer's view of the current claim: how long it has seen the same one.
pub(crate) struct Patience {
    id: u64,
    rounds: u32,
    /// Loom models: take any held claim for stalled at once (a loom thread that yields
    /// lets the holder run to completion, so a patience of rounds never elapses while
    /// the holder is mid-write; this stands for "the holder stalled at this step").
    #[cfg(cxc_loom)]
    eager: bool,
    #[cfg(not(cxc_loom))]
    since: std::time::Instant,
    #[cfg(not(cxc_loom))]
    judged: std::time::Instant,
    #[cfg(not(cxc_loom))]
    limit: std::time::Duration,
}

/// What a waiting writer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Keep waiting (the claim is held and young).
    Wait,
    /// Try to claim; a held claim is taken over only if its process is dead.
    Judge,
    /// The same claim was held longer than the patience: supersede it.
    Supersede,
}

impl Patience {
    /// Spins before a waiting writer starts sleeping.
    #[cfg(not(cxc_loom))]
    const SPINS: u32 = 128;
    /// How often a waiting writer asks the OS whether the holder is dead.
    #[cfg(not(cxc_loom))]
    const JUDGE_EVERY: std::time::Duration = std::time::Duration::from_micros(500);

    pub(crate) fn new(#[cfg(not(cxc_loom))] limit: std::time::Duration) -> Self {
        Patience {
            id: u64::MAX,
            rounds: 0,
            #[cfg(cxc_loom)]
            eager: false,
            #[cfg(not(cxc_loom))]
            since: std::time::Instant::now(),
            #[cfg(not(cxc_loom))]
            judged: std::time::Instant::now(),
            #[cfg(not(cxc_loom))]
            limit,
        }
    }

    /// Loom models: a writer that supersedes any held claim at once.
    #[cfg(cxc_loom)]
    pub(crate) fn eager() -> Self {
        Patience {
            eager: true,
            ..Patience::new()
        }
    }

    fn step(&mut self, cur: Word) -> Step {
        if cur.is_vacant() {
            return Step::Judge;
        }
        #[cfg(cxc_loom)]
        if self.eager {
            return Step::Supersede;
        }
        if cur.id() != self.id {
            self.id = cur.id();
            self.rounds = 0;
            #[cfg(not(cxc_loom))]
            {
                self.since = std::time::Instant::now();
                self.judged = self.since;
            }
            return Step::Wait;
        }
        self.rounds += 1;
        #[cfg(cxc_loom)]
        {
            match self.rounds {
                1 => Step::Judge,
                2 => Step::Supersede,
                _ => Step::Wait,
            }
        }
        #[cfg(not(cxc_loom))]
        {
            if self.rounds < Self::SPINS {
                return Step::Wait;
            }
            let now = std::time::Instant::now();
            if self.rounds == Self::SPINS {
                // Done spinning: ask the OS once now (a dead holder is replaced at once),
                // then every `JUDGE_EVERY`.
                self.judged = now;
                return Step::Judge;
            }
            if now.duration_since(self.since) >= self.limit {
                Step::Supersede
            } else if now.duration_since(self.judged) >= Self::JUDGE_EVERY {
                self.judged = now;
                Step::Judge
            } else {
                Step::Wait
            }
        }
    }

    fn pause(&self) {
        #[cfg(not(cxc_loom))]
        if self.rounds >= Self::SPINS {
            std::thread::sleep(std::time::Duration::from_micros(20));
            return;
        }
        spin_hint();
    }
}

impl LeaseState {
    /// Begins a SeqLock write by the writer slot `holder` (registered for `pid`): a
    /// private claim with a staging buffer. Waits for a live writer; takes over a dead
    /// one at once and a stalled one after `patience`.
    #[inline]
    pub(crate) fn seq_begin(
        &self,
        holder: u8,
        pid: u32,
        patience: impl FnOnce() -> Patience,
    ) -> Result<SeqClaim, WriteRefused> {
        let me = Claimant {
            holder,
            pid,
            private: true,
        };
        // Fast path: a free lock (never asks the OS anything).
        let cur = self.word();
        if cur.is_vacant()
            && let Some(g) =
                self.try_claim(SEQ_POLICY, me, u64::MAX, 0, |_, _| Liveness::Unknown, false)
        {
            return self.seq_granted(g);
        }
        self.seq_begin_slow(me, patience())
    }

    #[cold]
    #[inline(never)]
    fn seq_begin_slow(&self, me: Claimant, mut wait: Patience) -> Result<SeqClaim, WriteRefused> {
        loop {
            let cur = self.word();
            let (grace, now) = match wait.step(cur) {
                Step::Wait => {
                    wait.pause();
                    continue;
                }
                Step::Judge => (u64::MAX, 0),
                // Stale by the lease's heartbeat rule: `now - heartbeat > 0`.
                Step::Supersede => (0, self.heartbeat.load(Ordering::Acquire).wrapping_add(1)),
            };
            if let Some(g) = self.try_claim(
                SEQ_POLICY,
                me,
                grace,
                now,
                |s: &Self, w| s.holder_liveness(w),
                false,
            ) {
                return self.seq_granted(g);
            }
            wait.pause();
        }
    }

    /// A granted claim: make sure it has a staging buffer (reaping dead writers'
    /// quarantine if none is free), else give the claim back.
    #[inline]
    fn seq_granted(&self, g: Granted) -> Result<SeqClaim, WriteRefused> {
        let took = match g.reason {
            Some(ClaimReason::Dead) => Took::Dead,
            Some(ClaimReason::Stale) => Took::Stalled,
            // A vacant word left by a dead holder mid-write (`vacate_dead_holder`).
            _ if g.torn => Took::Dead,
            _ => Took::Free,
        };
        let mut word = Word(g.word);
        if word.stage().is_none() {
            match self.stage_for(word.id()) {
                Ok(w) => word = w,
                Err(e) => {
                    self.release_private(word);
                    return Err(e);
                }
            }
        }
        Ok(SeqClaim { word, took })
    }

    /// Fills the claim's staging buffer with `words` and publishes and releases in one
    /// CAS. `Err(Lost)`: the claim was superseded meanwhile (this writer was taken for
    /// stalled); nothing of this write is ever published.
    #[inline]
    pub(crate) fn seq_finish(
        &self,
        claim: Word,
        words: &[u64; PAYLOAD_WORDS],
        n: usize,
    ) -> Result<(), WriteRefused> {
        self.fill(claim, words, n);
        if self.publish(claim, true) {
            Ok(())
        } else {
            Err(WriteRefused::Lost)
        }
    }

    /// Gives up a write claim without publishing (an `update` closure panicked).
    pub(crate) fn seq_abort(&self, claim: Word) {
        self.release_private(claim);
    }

    /// The published value's first `W` words, read as a seqlock reader (the same read as
    /// `read_if`: Acquire `seq`, the words, Acquire fence, `seq` again; `W` is a constant,
    /// so the copy is unrolled). Never waits for a writer: the published buffer is never
    /// the one being written; it retries only if the buffer was republished twice and
    /// rewritten during the copy.
    #[inline]
    pub(crate) fn seq_read_words<const W: usize>(&self) -> [u64; W] {
        const { assert!(W <= PAYLOAD_WORDS) };
        loop {
            let buf = &self.bufs[self.word().published()];
            // SYNC: payload seqlock. Pairs with the Release fence/store in `fill`.
            let s1 = buf.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let words: [u64; W] = std::array::from_fn(|i| buf.words[i].load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if buf.seq.load(Ordering::Relaxed) == s1 {
                    return words;
                }
            }
            spin_hint();
        }
    }
}

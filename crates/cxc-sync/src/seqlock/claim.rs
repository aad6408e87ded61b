//! The update claim of a [`SeqLock`] handle: serialises `update`s, replaces a holder the
//! OS proves dead at once and supersedes one that holds it past the stall timeout
//! (`docs/seqlock.md`, "Update claim").

use std::time::{Duration, Instant};

use super::handle::{Abandoned, SeqLock};
use super::lane::judge_slot;
use super::state::{SeqState, Verdict, counter};

impl<T> SeqLock<T> {
    /// Takes the update claim for `slot`: at once if free; from a holder the OS proves
    /// dead at once; from a holder that keeps the same claim longer than the stall
    /// timeout after that timeout.
    pub(super) fn claim(&self, slot: usize) -> (u64, Option<Abandoned>) {
        let st = self.state();
        let c = st.claim_word();
        if SeqState::claim_holder(c).is_none()
            && let Some(m) = st.try_claim(c, slot)
        {
            return (m, died(c));
        }
        self.claim_slow(slot)
    }

    #[cold]
    fn claim_slow(&self, slot: usize) -> (u64, Option<Abandoned>) {
        const SPINS: u32 = 128;
        const JUDGE_EVERY: Duration = Duration::from_micros(500);
        let st = self.state();
        let mut seen = u64::MAX;
        let mut since = Instant::now();
        let mut judged: Option<Instant> = None;
        let mut rounds = 0u32;
        loop {
            let c = st.claim_word();
            let Some(h) = SeqState::claim_holder(c) else {
                if let Some(m) = st.try_claim(c, slot) {
                    return (m, died(c));
                }
                continue;
            };
            if c != seen {
                (seen, since, judged, rounds) = (c, Instant::now(), None, 0);
            }
            rounds = rounds.saturating_add(1);
            if rounds < SPINS {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if judged.is_none_or(|t| now.duration_since(t) >= JUDGE_EVERY) {
                judged = Some(now);
                if judge_slot(st, h) == Verdict::Dead
                    && let Some(m) = st.try_claim(c, slot)
                {
                    st.bump(counter::CLAIM_DEAD);
                    return (m, Some(Abandoned::Died));
                }
            }
            if now.duration_since(since) >= self.stall
                && let Some(m) = st.try_claim(c, slot)
            {
                st.bump(counter::CLAIM_STALLED);
                return (m, Some(Abandoned::Stalled));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// `Some(Died)` for a free claim word left by a holder that died holding it (its slot was
/// reclaimed, `SeqState::claim_died`).
fn died(c: u64) -> Option<Abandoned> {
    SeqState::claim_died(c).then_some(Abandoned::Died)
}

//! What the async reactor needs of a lease (feature `async`): the wake word, the state,
//! and the check "may a waiter claim now?".

use cxc_mmf::identity::{Identity, Liveness, PidWatch, liveness};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::file::OwnerLease;
use super::state::LeaseState;
use crate::asyncs::reactor::{IDLE_MAX, Next, TICK};
use crate::epoch::{EpochClock, EpochMode};
use crate::primitive::Ordering;
use std::time::Duration;

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Address of the wake word (the key of this handle's reactor groups).
    pub(crate) fn wake_addr(&self) -> usize {
        std::ptr::from_ref(&self.state().wake) as usize
    }

    /// Address of the shared state (valid while this handle lives).
    pub(crate) fn state_addr(&self) -> usize {
        std::ptr::from_ref(self.state()) as usize
    }

    /// The grace of this handle's guards, in epochs.
    pub(crate) fn guard_grace(&self) -> u64 {
        self.guard.grace
    }

    /// The identity-table key of this handle's guards (their pid, as a guard's slot).
    pub(crate) fn guard_slot_key(&self) -> u64 {
        super::slot::pid_word(self.guard_pid(), true)
    }

    /// The epoch source (for the reactor's own clock).
    pub(crate) fn epoch_mode_of(&self) -> EpochMode {
        self.epoch_mode()
    }
}

impl LeaseState {
    /// Whether this process has a slot of the identity table for `key` (no registration).
    pub(crate) fn has_slot(&self, key: u64) -> bool {
        self.lookup(key, &Identity::current()).is_some()
    }

    /// The reactor's check for the lock group, run after `park::announce`: re-checks the
    /// claim word with a read-modify-write (the parking protocol), then says whether a
    /// claim could succeed: vacant, stale by more than `grace`, or the holder's whole
    /// process gone. `watch` caches a pidfd of the current holder, registered with the
    /// reactor's death watch so that the holder's exit wakes the reactor at once.
    ///
    /// If not, the check asks to run again when the heartbeat goes stale by the clock
    /// (clock epochs; manual epochs move only by `tick_epoch()`, which wakes the
    /// sleepers of the word, so then only the reactor's [`IDLE_MAX`] applies), and every
    /// [`TICK`] if the holder's death cannot be watched (no pidfd) but can be polled.
    pub(crate) fn claimable(
        &self,
        clock: &EpochClock,
        grace: u64,
        watch: &mut Option<(Identity, Option<PidWatch>)>,
    ) -> Next {
        let w = self.recheck();
        if w.is_vacant() {
            return Next::Now;
        }
        let now = clock.now(&self.epoch);
        let beat = self.heartbeat.load(Ordering::Acquire);
        if now.saturating_sub(beat) > grace {
            return Next::Now;
        }
        // The holder's process is exiting (its sentinel ended) and none of its threads can
        // run user code again: a claim takes it over as stale. (Exiting but not stopped
        // yet: its pidfd, watched below, turns readable soon.)
        if self.slot_exiting(w.holder()) && self.holder_stopped(w) {
            return Next::Now;
        }
        // Stale once the epoch passes `beat + grace`. A beat meanwhile only moves that
        // later: the reactor then looks once more, early, and waits again.
        let stale_in = clock
            .until(&self.epoch, beat.saturating_add(grace).saturating_add(1))
            .unwrap_or(IDLE_MAX);
        // Sleep on the holder's sentinel word too, if it has one: the kernel wakes the
        // reactor there when the holder's process starts to exit, before its pidfd.
        let within = |d: Duration| match self.sentinel_to_sleep_on(0) {
            Some((word, v)) => Next::WithinOr(d, std::ptr::from_ref(word) as usize, v),
            None => Next::Within(d),
        };
        let Some(id) = self.holder_identity(w) else {
            // No recorded identity (heartbeat path): only staleness (or the sentinel) can
            // free the lease.
            return within(stale_in);
        };
        if watch.as_ref().is_none_or(|(c, _)| *c != id) {
            let pw = PidWatch::open(&id);
            if let Some(p) = &pw {
                crate::asyncs::reactor::reactor().watch_death(p.as_fd());
            }
            *watch = Some((id, pw));
        }
        let dead = match watch {
            Some((_, Some(p))) => p.is_dead(),
            Some((id, None)) => {
                if liveness(id) == Liveness::Dead {
                    true
                } else {
                    // No pidfd: the holder's death is seen only by polling.
                    return within(stale_in.min(TICK));
                }
            }
            None => false,
        };
        if dead { Next::Now } else { within(stale_in) }
    }
}

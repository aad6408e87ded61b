//! What the async reactor needs of a lease (feature `async`): the wake word, the state,
//! and the check "may a waiter claim now?".

use cxc_mmf::identity::{Identity, Liveness, PidWatch, liveness};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::file::OwnerLease;
use super::state::LeaseState;
use crate::epoch::{EpochClock, EpochMode};
use crate::primitive::Ordering;

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

    /// The epoch source (for the reactor's own clock).
    pub(crate) fn epoch_mode_of(&self) -> EpochMode {
        self.epoch_mode()
    }
}

impl LeaseState {
    /// The reactor's check for the lock group, run after `park::announce`: re-checks the
    /// claim word with a read-modify-write (the parking protocol), then says whether a
    /// claim could succeed: vacant, stale by more than `grace`, or the holder's whole
    /// process gone. `watch` caches a pidfd of the current holder, registered with the
    /// reactor's death watch so that the holder's exit wakes the reactor at once.
    pub(crate) fn claimable(
        &self,
        clock: &EpochClock,
        grace: u64,
        watch: &mut Option<(Identity, Option<PidWatch>)>,
    ) -> bool {
        let w = self.recheck();
        if w.is_vacant() {
            return true;
        }
        let now = clock.now(&self.epoch);
        if now.saturating_sub(self.heartbeat.load(Ordering::Acquire)) > grace {
            return true;
        }
        let Some(id) = self.holder_identity(w) else {
            return false;
        };
        if watch.as_ref().is_none_or(|(c, _)| *c != id) {
            let pw = PidWatch::open(&id);
            if let Some(p) = &pw {
                crate::asyncs::reactor::reactor().watch_death(p.as_fd());
            }
            *watch = Some((id, pw));
        }
        match watch {
            Some((_, Some(p))) => p.is_dead(),
            Some((id, None)) => liveness(id) == Liveness::Dead,
            None => false,
        }
    }
}

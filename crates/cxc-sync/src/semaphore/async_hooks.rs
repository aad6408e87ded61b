//! What the async reactor needs of a semaphore (feature `async`).

use std::sync::atomic::Ordering;

use cxc_mmf::identity::{Identity, PidLookup, PidWatch, lookup_pid};

use super::handle::SharedSemaphore;
use super::word::{STATE_ACTIVE, STATE_RECLAIMING, TAG_FALLBACK, identity_tag, owner_parts};

impl SharedSemaphore {
    /// Address of the wake word (the key of this handle's reactor group).
    pub(crate) fn wake_addr(&self) -> usize {
        std::ptr::from_ref(&self.map.head().wake) as usize
    }

    /// Permits available, read with a read-modify-write (the parking protocol's
    /// re-check, see `park.rs`).
    pub(crate) fn recheck_available(&self) -> u32 {
        self.raw().recheck()
    }

    /// Whether this process has its holder slot (without registering).
    pub(crate) fn has_slot(&self) -> bool {
        self.holder.get(crate::liveness::current_proc()).is_some()
    }

    /// Tries to get this process's holder slot now (a forked child that found the table
    /// full); whether it has one.
    pub(crate) fn try_register(&self) -> bool {
        self.holder_slow().is_ok()
    }
}

/// At most this many pidfds per waiter group (a table of up to 1023 holders must not use
/// up the process's file descriptors); holders past it are found by polling the table.
const MAX_WATCHED: usize = 64;

/// The pidfds of a semaphore's other holder processes, kept by an async waiter group's
/// check and registered with the reactor's death watch: a holder's exit wakes the
/// reactor, so its permits are reclaimed at once instead of by polling the table.
#[derive(Debug, Default)]
pub(crate) struct HolderWatch {
    /// Per holder slot: the owner word last seen, and its holder's pidfd if it has one.
    slots: Vec<(u64, Option<PidWatch>)>,
    /// [`Reactor::deaths`](crate::asyncs::reactor::Reactor::deaths) when the pidfds were
    /// last polled.
    deaths: Option<u64>,
}

/// What [`SharedSemaphore::watch_holders`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watched {
    /// A holder process has exited (or its pid names another process now): reclaim.
    pub(crate) died: bool,
    /// Every other holder that a reclaim could judge has a pidfd: nothing but a
    /// watched exit can free a permit, so the table need not be polled.
    pub(crate) all: bool,
}

impl SharedSemaphore {
    /// Brings `watch` up to date with the holder table: a pidfd (opened, then verified
    /// against the slot's identity tag) for each slot held by another process, registered
    /// with the death watch. Polls the pidfds only if the death watch saw an exit since
    /// the last call. Loads every slot's owner word; system calls only for slots that
    /// changed.
    pub(crate) fn watch_holders(&self, watch: &mut HolderWatch) -> Watched {
        if crate::holders::foreign_namespace(self.map.info().layout.params[2]) {
            // A reclaim judges no holder from another pid namespace: nothing to watch.
            return Watched {
                died: false,
                all: true,
            };
        }
        let reactor = crate::asyncs::reactor::reactor();
        // Read before polling, so an exit after the poll changes it again.
        let deaths = reactor.deaths();
        let poll = watch.deaths != Some(deaths);
        watch.deaths = Some(deaths);
        let raw = self.raw();
        watch.slots.resize_with(raw.slots.len(), || (0, None));
        let me = Identity::current();
        let my_tag = identity_tag(&me);
        let mut seen = Watched {
            died: false,
            all: true,
        };
        let mut open = watch.slots.iter().filter(|(_, pw)| pw.is_some()).count();
        for (slot, (last, pw)) in raw.slots.iter().zip(watch.slots.iter_mut()) {
            let owner = slot.owner.load(Ordering::Acquire);
            let (state, pid, tag) = owner_parts(owner);
            let held = (state == STATE_ACTIVE || state == STATE_RECLAIMING)
                && pid != 0
                && tag != 0
                && !(pid == me.pid && tag == my_tag);
            if !held {
                // Free, ours, or of an unknown identity (never reclaimed on a guess).
                *last = owner;
                if pw.take().is_some() {
                    open -= 1;
                }
                continue;
            }
            if *last != owner {
                *last = owner;
                if pw.take().is_some() {
                    open -= 1;
                }
                match lookup_pid(pid, tag & TAG_FALLBACK != 0) {
                    PidLookup::Found(id) if identity_tag(&id) == tag => {
                        if open < MAX_WATCHED {
                            *pw = PidWatch::open(&id);
                        }
                        match pw {
                            Some(p) => {
                                reactor.watch_death(p.as_fd());
                                open += 1;
                            }
                            // Past the limit, gone between the lookup and the open, or
                            // no pidfd: the table is polled.
                            None => seen.all = false,
                        }
                    }
                    // No such process, or the pid names another one now: dead. Not
                    // cached, so the next call looks again if the reclaim this triggers
                    // did not free the slot.
                    PidLookup::NoProcess | PidLookup::Found(_) => {
                        seen.died = true;
                        *last = 0;
                    }
                    PidLookup::Unknown => seen.all = false,
                }
                continue;
            }
            match pw {
                Some(p) => seen.died |= poll && p.is_dead(),
                None => seen.all = false,
            }
        }
        seen
    }
}

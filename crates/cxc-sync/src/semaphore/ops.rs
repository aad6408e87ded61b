//! Acquire, release and the RAII [`Permit`].

use cxc_mmf::identity::current_proc;
use std::time::{Duration, Instant};

use super::handle::SharedSemaphore;
use super::layout::ctr;
use super::raw::Released;
use cxc_sidecar::Instrumented;
use cxc_sidecar::{OpCode, flags};

/// A blocked acquirer looks for dead holders this often.
pub(crate) const RECLAIM_EVERY: Duration = Duration::from_millis(20);

/// One permit of a [`SharedSemaphore`]; dropping it releases the permit.
///
/// To hand a permit across an API boundary inside one process, `mem::forget` it and
/// call [`SharedSemaphore::release`] later (the permit stays held by this process until
/// then). To hand it to another process, use [`Permit::disown`]: the file then counts it
/// as *handed*, and one `release` by a process that holds no permit of its own returns
/// it (see `docs/shared-semaphore.md`).
#[must_use = "dropping a permit releases it at once"]
pub struct Permit<'a> {
    sem: &'a SharedSemaphore,
    /// The process that acquired it: a copy in a forked child (another pid) is the
    /// parent's permit, which the child neither releases nor disowns.
    proc: u32,
}

impl<'a> Permit<'a> {
    /// The semaphore this permit belongs to.
    pub fn semaphore(&self) -> &'a SharedSemaphore {
        self.sem
    }

    /// Forgets the permit and hands it off: it is no longer held by this process (so not
    /// returned if this process dies) but counted as handed in the file; whoever it is
    /// handed to (e.g. another process) must call [`SharedSemaphore::release`] for it.
    pub fn disown(self) {
        let (sem, proc) = (self.sem, self.proc);
        std::mem::forget(self);
        if proc != current_proc() {
            return;
        }
        if let Some(h) = sem.holder()
            && sem.raw().disown(h) {
                sem.raw().bump(ctr::DISOWNED, 1);
            }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        // Cannot fail for a permit acquired from this semaphore; a `false` here means
        // someone released more than they acquired, which `release` already refused.
        if self.proc == current_proc() {
            let _ = self.sem.release();
        }
    }
}

impl std::fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.sem.path())
            .finish()
    }
}

impl SharedSemaphore {
    /// Takes a permit if one is available, without blocking.
    #[inline]
    pub fn try_acquire(&self) -> Option<Permit<'_>> {
        let holder = self.holder();
        self.raw().try_acquire(holder).then(|| Permit { sem: self, proc: current_proc() })
    }

    /// Takes a permit, blocking until one is available. While blocked, the caller
    /// sleeps in the kernel and, every 20 ms, returns the permits of dead holders.
    pub fn acquire(&self) -> Permit<'_> {
        if let Some(p) = self.try_acquire() {
            return p;
        }
        // Without a deadline `acquire_slow` returns only with a permit; were it ever to
        // return without one, the same wait goes on, without spinning again.
        let mut spin = true;
        while !self.acquire_slow(None, spin) {
            spin = false;
        }
        Permit { sem: self, proc: current_proc() }
    }

    /// Takes a permit, blocking at most `timeout`; `None` if none became available. Dead
    /// holders' permits are returned every 20 ms while it waits, and once before it
    /// gives up (also with a zero timeout, when no permit is free).
    pub fn acquire_timeout(&self, timeout: Duration) -> Option<Permit<'_>> {
        self.acquire_timeout_spinning(timeout, true)
    }

    /// [`acquire_timeout`](Self::acquire_timeout), spinning first only if `spin`: a
    /// caller that waits in slices (`acquire_many`) spins on its first slice, not on every
    /// one (docs/sidecar.md: a blocking call spins once).
    pub(crate) fn acquire_timeout_spinning(
        &self,
        timeout: Duration,
        spin: bool,
    ) -> Option<Permit<'_>> {
        if let Some(p) = self.try_acquire() {
            return Some(p);
        }
        // A timeout too large to add to `now` waits forever.
        let deadline = Instant::now().checked_add(timeout);
        self.acquire_slow(deadline, spin)
            .then(|| Permit { sem: self, proc: current_proc() })
    }

    /// Returns one permit (after `mem::forget` of a [`Permit`], or one handed to this
    /// process with [`Permit::disown`]): one this process holds if it holds any, else a
    /// handed-off one. Returns `false`, and changes nothing, if this process holds no
    /// permit and none is handed off, or if the pool already has `max_permits` available:
    /// the count never exceeds `max_permits` and never wraps.
    #[inline]
    pub fn release(&self) -> bool {
        let holder = self.holder();
        let raw = self.raw();
        match raw.release(holder) {
            Released::Held | Released::Handed => {}
            Released::Full => {
                raw.bump(ctr::OVERFLOW_REJECTED, 1);
                self.note(OpCode::SemOverflowRejected, 0, 1);
                return false;
            }
            Released::NotHeld => {
                raw.bump(ctr::NOT_HELD_REJECTED, 1);
                self.note(OpCode::SemOverflowRejected, 0, 0);
                return false;
            }
        }
        if raw.has_sleepers() {
            self.wake_slow();
        }
        true
    }

    #[cold]
    fn wake_slow(&self) {
        self.raw().wake_sleepers(1);
    }

    /// The blocking path: a short spin, then sleep on the wake word, re-checking after
    /// every wake-up and reclaiming dead holders' permits every [`RECLAIM_EVERY`].
    #[cold]
    fn acquire_slow(&self, deadline: Option<Instant>, spin: bool) -> bool {
        // `None` only in a forked child that found the table full: it waits for a slot
        // (looking again with every reclaim) and never takes a permit untracked.
        let mut holder = self.holder();
        let raw = self.raw();
        raw.bump(ctr::CONTENDED, 1);
        let started = Instant::now();
        // Spin first (re-reading the count), if `spin`: the shared strategy's budget, or
        // the default one while this handle's recent waits were short
        // (`park::SpinGauge`), never past the deadline.
        let shared = self.map.head().handshake.spin_budget();
        let gauged = spin && shared.is_none();
        let mut budget = match shared {
            _ if !spin => Duration::ZERO,
            Some(b) => b,
            None => self.spin.budget(crate::park::DEFAULT_SPIN),
        };
        let gauge = |waited: Duration| {
            if gauged {
                self.spin.record(waited, crate::park::DEFAULT_SPIN);
            }
            waited.as_nanos() as u64
        };
        if let Some(d) = deadline {
            budget = budget.min(d.saturating_duration_since(started));
        }
        let spun = crate::park::spin_for(budget, started, || {
            (raw.available() > 0 && raw.try_acquire(holder)).then_some(())
        });
        if spun.is_some() {
            self.note(OpCode::SemContended, flags::WAIT_SPUN, gauge(started.elapsed()));
            return true;
        }
        let mut next_reclaim = Instant::now() + RECLAIM_EVERY;
        // Whether this wait has looked for dead holders: a wait shorter than
        // `RECLAIM_EVERY` looks once before it gives up, so that a dead holder's permit
        // is never refused to a short timeout (`try_acquire` leaves that to the caller).
        let mut reclaimed = false;
        loop {
            let seen = raw.announce_sleeper();
            if raw.recheck() > 0 && raw.try_acquire(holder) {
                raw.pass_on();
                self.note(
                    OpCode::SemContended,
                    flags::WAIT_PARKED,
                    gauge(started.elapsed()),
                );
                return true;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                if !reclaimed {
                    reclaimed = true;
                    if holder.is_none() {
                        holder = self.holder();
                    }
                    if self.reclaim_noted(true) > 0 {
                        continue;
                    }
                }
                raw.bump(ctr::TIMEOUTS, 1);
                raw.pass_on();
                self.note(
                    OpCode::SemTimeout,
                    flags::WAIT_PARKED | flags::WAIT_TIMED_OUT,
                    gauge(started.elapsed()),
                );
                return false;
            }
            if now >= next_reclaim {
                next_reclaim = now + RECLAIM_EVERY;
                reclaimed = true;
                if holder.is_none() {
                    holder = self.holder();
                }
                if self.reclaim_noted(true) > 0 {
                    continue;
                }
            }
            let mut sleep = next_reclaim.saturating_duration_since(now);
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            raw.bump(ctr::SLEEPS, 1);
            crate::futex::wait(&self.map.head().wake, seen, sleep);
        }
    }
}

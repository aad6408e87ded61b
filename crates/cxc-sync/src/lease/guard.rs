//! RAII guards of the owner lease: [`LeaseGuard`] and [`OwnedLeaseGuard`].
//!
//! A guard is a claim with a single writer. Its claim word is marked PRIVATE (see
//! `word.rs`): it publishes a write with one CAS (no WRITE bit), and whoever supersedes or
//! releases it other than the guard itself quarantines its staging buffer. Guards claim
//! through a slot of the identity table that the pid-based seed calls never match, and a
//! guard's claim is never idempotent: a guard excludes every other holder, also of the
//! same process and the same handle.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::file::{OwnerLease, from_words, my_proc, to_words, words_for};
use super::slot::pid_word;
use super::state::{Claimant, Granted, WriteRefused};
use super::word::Word;

/// Why a guard operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The claim was lost: superseded (a stale-heartbeat takeover, or the holder's
    /// process was judged dead) or released by someone else. `successor` is the fencing
    /// token of the claim that holds the lease now, when one does.
    #[error("the lease was lost{}", match .successor {
        Some(t) => format!(" (now held with token {t})"),
        None => String::new(),
    })]
    Lost {
        /// Token of the current claim, if the lease is held.
        successor: Option<u64>,
    },
    /// The payload may be inconsistent: this claim took over from a holder that died or
    /// stalled in the middle of an update (as a robust mutex reports `EOWNERDEAD`).
    /// `read` and `update` refuse until the guard writes a value or calls
    /// `acknowledge_inconsistent`.
    #[error(
        "the payload may be inconsistent: the previous holder died or stalled mid-update; \
         write a value or call acknowledge_inconsistent()"
    )]
    Inconsistent,
    /// Every payload buffer is published, staged or in quarantine for a stalled writer
    /// of an earlier claim (at most six); the write can succeed once one resumes or dies.
    #[error("no payload buffer is free: stalled writers of earlier claims hold them")]
    NoBuffer,
    /// The backend failed (backends that can fail, such as etcd).
    #[error("backend error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The state of one guard's claim (not `Sync`: a guard has one writer at a time).
#[derive(Debug)]
struct Core {
    /// The claim word as this guard last installed or published it.
    last: Cell<u64>,
    generation: u64,
    torn: Cell<bool>,
    done: Cell<bool>,
    /// A write was refused as lost: the staging buffer this guard knew may already be
    /// out of quarantine and staged by the new holder, so the guard never fills again.
    gone: Cell<bool>,
    /// The process that made the claim: a guard copied into a forked child is inert.
    proc: u32,
}

impl Core {
    fn id(&self) -> u64 {
        Word(self.last.get()).id()
    }
}

/// Shared implementation of the two guard types over the lease they borrow or own.
trait Holds<T> {
    fn lease(&self) -> &OwnerLease<T>;
    fn core(&self) -> &Core;
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// The claimant a guard of this handle claims as; `proc` is this process's lineage
    /// token ([`my_proc`]).
    #[inline]
    fn guard_claimant(&self, proc: u32) -> Option<Claimant> {
        let pid = self.guard_pid();
        let holder = self.holder_as_in(proc, pid_word(pid, true), true)?;
        Some(Claimant {
            holder,
            pid,
            private: true,
        })
    }

    /// The pid a guard's claim is made for (shown as the owner, and compared by the
    /// lower-pid preemption rule): the builder's `pid`, else this process's.
    #[inline]
    pub(super) fn guard_pid(&self) -> u32 {
        match self.guard.pid {
            0 => cxc_mmf::identity::current_pid(),
            p => p,
        }
    }

    /// The guard state of the claim `g`, made by this process (`proc`).
    #[inline]
    fn core_for(&self, g: Granted, proc: u32) -> Core {
        Core {
            last: Cell::new(g.word),
            generation: self.state().full_generation(g.word),
            torn: Cell::new(g.torn),
            done: Cell::new(false),
            gone: Cell::new(false),
            proc,
        }
    }

    #[inline]
    fn try_core(&self) -> Option<Core> {
        let proc = my_proc();
        let me = self.guard_claimant(proc)?;
        let g = self.claim_as(me, self.guard.grace, false)?;
        Some(self.core_for(g, proc))
    }

    /// Blocks up to `timeout` (`None`: forever).
    #[inline]
    fn lock_core(&self, timeout: Option<Duration>) -> Option<Core> {
        // Uncontended: one attempt, no clock read beyond the epoch's.
        if let Some(core) = self.try_core() {
            return Some(core);
        }
        self.lock_core_blocking(timeout)
    }

    /// [`lock_core`](Self::lock_core) once the first attempt failed.
    #[cold]
    #[inline(never)]
    fn lock_core_blocking(&self, timeout: Option<Duration>) -> Option<Core> {
        let proc = my_proc();
        let pid = self.guard_pid();
        let started = Instant::now();
        let t = timeout.unwrap_or(Duration::MAX);
        let holder = self.holder_waiting(pid_word(pid, true), t)?;
        let me = Claimant {
            holder,
            pid,
            private: true,
        };
        let left = t.saturating_sub(started.elapsed());
        let g = self.acquire_as(me, self.guard.grace, left, true)?;
        Some(self.core_for(g, proc))
    }

    /// Claims the lease if it is free (or its holder is dead, or stale by more than the
    /// handle's grace), without blocking. `None` if another holder — another process,
    /// another thread, or another guard of this very handle — has it.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lease = cxc_sync::OwnerLease::builder(dir.path().join("l")).create(0u64).unwrap();
    /// let guard = lease.try_lock().expect("free");
    /// assert!(lease.try_lock().is_none(), "a guard excludes every other holder");
    /// drop(guard);
    /// assert!(lease.try_lock().is_some());
    /// ```
    pub fn try_lock(&self) -> Option<LeaseGuard<'_, T>> {
        let core = self.try_core()?;
        Some(LeaseGuard { lease: self, core })
    }

    /// Claims the lease, blocking until it is free (sleeping in the kernel), its holder
    /// dies, or its holder's heartbeat is older than the grace.
    pub fn lock(&self) -> LeaseGuard<'_, T> {
        loop {
            if let Some(core) = self.lock_core(None) {
                return LeaseGuard { lease: self, core };
            }
        }
    }

    /// As [`lock`](Self::lock), giving up after `timeout`.
    pub fn lock_timeout(&self, timeout: Duration) -> Option<LeaseGuard<'_, T>> {
        let core = self.lock_core(Some(timeout))?;
        Some(LeaseGuard { lease: self, core })
    }

    /// As [`try_lock`](Self::try_lock), for a guard that owns its `Arc` (to move into a
    /// thread or task), as tokio's `acquire_owned`.
    pub fn try_lock_owned(self: Arc<Self>) -> Option<OwnedLeaseGuard<T>> {
        let core = self.try_core()?;
        Some(OwnedLeaseGuard { lease: self, core })
    }

    /// As [`lock`](Self::lock), for a guard that owns its `Arc`.
    pub fn lock_owned(self: Arc<Self>) -> OwnedLeaseGuard<T> {
        loop {
            if let Some(core) = self.lock_core(None) {
                return OwnedLeaseGuard { lease: self, core };
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn lost(&self, core: &Core) -> GuardError {
        let st = self.state();
        let w = st.word();
        let successor = (!w.is_vacant() && w.id() != core.id()).then(|| st.full_generation(w.0));
        GuardError::Lost { successor }
    }

    #[inline]
    fn g_read(&self, core: &Core) -> Result<T, GuardError> {
        if core.proc != my_proc() {
            return Err(self.lost(core));
        }
        if core.torn.get() {
            return Err(GuardError::Inconsistent);
        }
        let id = core.id();
        let words = self
            .state()
            .read_if(words_for::<T>(), |w| w.id() == id)
            .ok_or_else(|| self.lost(core))?;
        from_words(&words).ok_or_else(|| self.lost(core))
    }

    #[inline]
    fn g_write(&self, core: &Core, value: &T) -> Result<(), GuardError> {
        if core.proc != my_proc() || core.gone.get() {
            return Err(self.lost(core));
        }
        match self
            .state()
            .write_private(Word(core.last.get()), &to_words(value), words_for::<T>())
        {
            Ok(next) => {
                core.last.set(next.0);
                self.hot.store(next.0, std::sync::atomic::Ordering::Relaxed);
                core.torn.set(false);
                Ok(())
            }
            Err(WriteRefused::NoBuffer) => Err(GuardError::NoBuffer),
            Err(_) => {
                // The failed publication took our staging buffer out of quarantine
                // (`free_own_quarantine`): from now on it may be another claim's.
                core.gone.set(true);
                Err(self.lost(core))
            }
        }
    }

    #[inline]
    fn g_beat(&self, core: &Core) -> Result<(), GuardError> {
        let id = core.id();
        if core.proc == my_proc() && self.state().beat_if(self.now(), |w| w.id() == id) {
            Ok(())
        } else {
            Err(self.lost(core))
        }
    }

    #[inline]
    fn g_release(&self, core: &Core) -> Result<(), GuardError> {
        if core.done.replace(true) {
            return Ok(());
        }
        if core.proc != my_proc() {
            // A copy in a forked child: the claim is the parent's.
            return Err(self.lost(core));
        }
        match self.state().release_private(Word(core.last.get())) {
            Some(vacated) => {
                self.hot.store(vacated.0, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            None => Err(self.lost(core)),
        }
    }
}

macro_rules! guard_methods {
    () => {
        /// The payload.
        ///
        /// # Errors
        /// [`GuardError::Lost`] if the claim was lost; [`GuardError::Inconsistent`] if
        /// this claim took over an interrupted update and has neither written nor
        /// acknowledged it.
        pub fn read(&self) -> Result<T, GuardError> {
            self.lease().g_read(self.core())
        }

        /// Publishes `value` (one atomic step: a superseded guard never publishes).
        ///
        /// # Errors
        /// [`GuardError::Lost`] if the claim was lost (nothing was published);
        /// [`GuardError::NoBuffer`] if stalled writers hold every spare buffer.
        pub fn write(&self, value: T) -> Result<(), GuardError> {
            self.lease().g_write(self.core(), &value)
        }

        /// Reads, applies `f`, publishes.
        ///
        /// # Errors
        /// As [`read`](Self::read) and [`write`](Self::write); nothing is published
        /// on error.
        pub fn update(&self, f: impl FnOnce(&mut T)) -> Result<(), GuardError> {
            let mut v = self.read()?;
            f(&mut v);
            self.write(v)
        }

        /// The fencing token: strictly greater for every later claim of this lease.
        pub fn token(&self) -> u64 {
            self.core().generation
        }

        /// Refreshes the heartbeat (with clock epochs, a holder that stops beating for
        /// longer than the grace is replaced).
        ///
        /// # Errors
        /// [`GuardError::Lost`] if the claim was lost.
        pub fn beat(&self) -> Result<(), GuardError> {
            self.lease().g_beat(self.core())
        }

        /// Whether this guard's claim is still the current one.
        pub fn is_current(&self) -> bool {
            self.lease().state().word().id() == self.core().id()
                && self.core().proc == super::file::my_proc()
        }

        /// Whether this claim took over an interrupted update (and has not written or
        /// acknowledged it since).
        pub fn payload_may_be_inconsistent(&self) -> bool {
            self.core().torn.get()
        }

        /// Accepts the published payload after an interrupted update of the previous
        /// holder (after checking or repairing it), so `read` no longer refuses.
        pub fn acknowledge_inconsistent(&self) {
            self.core().torn.set(false);
        }

        /// Blocks until this guard's claim is lost (superseded or released by someone
        /// else) or `timeout` passes; `true` if it was lost. It looks at once, then
        /// after naps that double from 1 ms (1, 2, 4, 8, 16 ms) up to 25 ms, so from
        /// the 31st ms on it looks every 25 ms: a loss is seen within about 25 ms, and a
        /// thread that waits for the guard's whole life costs 40 short wake-ups a
        /// second. A holder stopped past the grace learns of its loss here once it runs
        /// again; with manual epochs a loss happens only when someone ticks and claims.
        pub fn wait_lost(&self, timeout: std::time::Duration) -> bool {
            const FIRST: std::time::Duration = std::time::Duration::from_millis(1);
            const MAX: std::time::Duration = std::time::Duration::from_millis(25);
            let deadline = std::time::Instant::now().checked_add(timeout);
            let mut nap = FIRST;
            loop {
                if !self.is_current() {
                    return true;
                }
                let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
                if left == Some(std::time::Duration::ZERO) {
                    return false;
                }
                std::thread::sleep(left.map_or(nap, |l| l.min(nap)));
                nap = (nap * 2).min(MAX);
            }
        }

        /// A future that resolves when this guard's claim is lost (feature `async`):
        /// within about 25 ms of the supersession (the reactor's tick).
        #[cfg(feature = "async")]
        pub fn lost(&self) -> crate::asyncs::LeaseLost<'_> {
            let lease = self.lease();
            let id = self.core().id();
            let proc = self.core().proc;
            crate::asyncs::LeaseLost::new(
                lease.wake_addr(),
                id,
                Box::new(move || lease.state().word().id() == id && proc == my_proc()),
            )
        }

        /// Releases the lease, reporting whether the claim was still held (dropping
        /// the guard releases too, but cannot report a loss).
        ///
        /// # Errors
        /// [`GuardError::Lost`] if the claim had already been lost.
        pub fn unlock(self) -> Result<(), GuardError> {
            self.lease().g_release(self.core())
        }
    };
}

/// A held [`OwnerLease`]: released when dropped. Created by [`OwnerLease::lock`],
/// [`OwnerLease::try_lock`] and [`OwnerLease::lock_timeout`].
///
/// `Send` (when `T` is), not `Sync`: a guard has one writer at a time, which is what lets
/// a write publish with one atomic step.
///
/// ```
/// fn moves_between_threads<T: Send>() {}
/// moves_between_threads::<cxc_sync::LeaseGuard<'static, u64>>();
/// ```
///
/// ```compile_fail,E0277
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<cxc_sync::LeaseGuard<'static, u64>>();
/// ```
#[must_use = "the lease is released when the guard is dropped"]
pub struct LeaseGuard<'a, T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lease: &'a OwnerLease<T>,
    core: Core,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Holds<T> for LeaseGuard<'_, T> {
    fn lease(&self) -> &OwnerLease<T> {
        self.lease
    }
    fn core(&self) -> &Core {
        &self.core
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> LeaseGuard<'_, T> {
    guard_methods!();
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Drop for LeaseGuard<'_, T> {
    fn drop(&mut self) {
        let _ = self.lease.g_release(&self.core);
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for LeaseGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("path", &self.lease.path())
            .field("token", &self.core.generation)
            .finish()
    }
}

/// A held [`OwnerLease`] that owns its `Arc`: released when dropped. Created by
/// [`OwnerLease::lock_owned`] and [`OwnerLease::try_lock_owned`].
///
/// `Send` (when `T` is), not `Sync`, as [`LeaseGuard`].
///
/// ```
/// fn moves_between_threads<T: Send>() {}
/// moves_between_threads::<cxc_sync::OwnedLeaseGuard<u64>>();
/// ```
///
/// ```compile_fail,E0277
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<cxc_sync::OwnedLeaseGuard<u64>>();
/// ```
#[must_use = "the lease is released when the guard is dropped"]
pub struct OwnedLeaseGuard<T: FromBytes + IntoBytes + Immutable + KnownLayout> {
    lease: Arc<OwnerLease<T>>,
    core: Core,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Holds<T> for OwnedLeaseGuard<T> {
    fn lease(&self) -> &OwnerLease<T> {
        &self.lease
    }
    fn core(&self) -> &Core {
        &self.core
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnedLeaseGuard<T> {
    guard_methods!();
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Drop for OwnedLeaseGuard<T> {
    fn drop(&mut self) {
        let _ = self.lease.g_release(&self.core);
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> std::fmt::Debug for OwnedLeaseGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedLeaseGuard")
            .field("path", &self.lease.path())
            .field("token", &self.core.generation)
            .finish()
    }
}

//! The RAII guards: [`ReadGuard`] and [`WriteGuard`].

use std::cell::Cell;

use cxc_sidecar::{Instrumented, OpCode};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::error::WriteGuardError;
use super::handle::SharedRwLock;
use super::layout::ctr;
use super::raw::WriteRefused;
use super::word::{BufferFields, Word};
use crate::liveness::current_proc;
use crate::payload::{from_words, to_words, words_of};

/// A read lock of a [`SharedRwLock`]; dropping it unlocks.
#[must_use = "dropping the guard unlocks at once"]
pub struct ReadGuard<'a, T> {
    pub(super) lock: &'a SharedRwLock<T>,
    pub(super) slot: usize,
    pub(super) pid: u32,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> ReadGuard<'_, T> {
    /// The payload (no writer can change it while this guard lives).
    pub fn get(&self) -> T {
        let raw = self.lock.raw();
        let words = raw.copy_published_n(raw.word(), words_of::<T>());
        // `check_payload` ensured `T` fits; zerocopy reads any bit pattern.
        from_words(&words).unwrap_or_else(|| T::new_zeroed())
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // In a forked child the hold is the parent's, counted in the parent's slot.
        if current_proc() == self.pid {
            self.lock.raw().read_unlock(self.slot);
        }
    }
}

impl<T> std::fmt::Debug for ReadGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadGuard")
            .field("lock", &self.lock.path())
            .finish()
    }
}

/// The write lock of a [`SharedRwLock`]; dropping it unlocks.
///
/// Every operation succeeds only while the lock is still this guard's: a guard whose
/// lock was evicted (its process stopped for longer than the grace while others waited)
/// gets [`WriteGuardError::Lost`], and nothing it wrote is ever visible.
#[must_use = "dropping the guard unlocks at once"]
pub struct WriteGuard<'a, T> {
    pub(super) lock: &'a SharedRwLock<T>,
    /// The claim word as this guard last installed it (PUB/STAGE move on every write).
    pub(super) claim: Cell<Word>,
    /// The process that took the lock: a copy of the guard in a child made by `fork`
    /// holds nothing (every operation is refused as [`WriteGuardError::Lost`], and its
    /// drop unlocks nothing).
    pub(super) pid: u32,
}

impl<T> WriteGuard<'_, T> {
    /// Whether this process took the lock (not a copy in a forked child).
    #[inline]
    fn ours(&self) -> bool {
        current_proc() == self.pid
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> WriteGuard<'_, T> {
    /// The error of an operation refused because the claim was evicted (recorded).
    fn lost(&self) -> WriteGuardError {
        let token = self.claim.get().token();
        self.lock.note(OpCode::RwStaleRejected, 0, token);
        WriteGuardError::Lost { token }
    }

    /// The payload.
    ///
    /// # Errors
    /// [`WriteGuardError::Lost`] if the lock was evicted.
    pub fn read(&self) -> Result<T, WriteGuardError> {
        if !self.ours() {
            return Err(self.lost());
        }
        let words = self
            .lock
            .raw()
            .read_as_writer(self.claim.get(), words_of::<T>())
            .ok_or_else(|| self.lost())?;
        Ok(from_words(&words).unwrap_or_else(|| T::new_zeroed()))
    }

    /// Replaces the payload (staged, then published with one CAS that succeeds only
    /// while the lock is this guard's).
    ///
    /// # Errors
    /// [`WriteGuardError::Lost`] if the lock was evicted (nothing was published);
    /// [`WriteGuardError::NoBuffer`] if no buffer is free to stage the write.
    pub fn write(&self, value: T) -> Result<(), WriteGuardError> {
        if !self.ours() {
            return Err(self.lost());
        }
        let raw = self.lock.raw();
        let mut claim = self.claim.get();
        if claim.stage().is_none() {
            claim = match raw.stage_for(claim) {
                Err(WriteRefused::NoBuffer) => {
                    raw.reap_quarantine(|s| self.lock.slot_dead(s));
                    raw.stage_for(claim)
                }
                r => r,
            }
            .map_err(|e| match e {
                WriteRefused::Lost => {
                    raw.free_own_quarantine(claim);
                    self.lost()
                }
                WriteRefused::NoBuffer => WriteGuardError::NoBuffer,
            })?;
            self.claim.set(claim);
        }
        if !raw.is_current(claim) {
            raw.bump(ctr::STALE_REJECTED);
            raw.free_own_quarantine(claim);
            return Err(self.lost());
        }
        raw.fill_n(claim, &to_words(&value), words_of::<T>());
        let next = raw.publish(claim).map_err(|_| self.lost())?;
        self.claim.set(next);
        Ok(())
    }

    /// Reads, changes and writes the payload.
    ///
    /// # Errors
    /// As [`WriteGuard::read`] and [`WriteGuard::write`].
    pub fn update(&self, f: impl FnOnce(&mut T)) -> Result<(), WriteGuardError> {
        let mut v = self.read()?;
        f(&mut v);
        self.write(v)
    }

    /// The fencing token: strictly greater for every later write lock of this file (40
    /// bits, wrapping after 2^40 locks).
    pub fn token(&self) -> u64 {
        self.claim.get().token()
    }

    /// Shows progress, so waiters do not evict this writer for the grace period (call it
    /// during long sections without writes).
    ///
    /// # Errors
    /// [`WriteGuardError::Lost`] if the lock was evicted.
    pub fn beat(&self) -> Result<(), WriteGuardError> {
        let raw = self.lock.raw();
        if !self.ours() || !raw.is_current(self.claim.get()) {
            return Err(self.lost());
        }
        raw.head
            .beat
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Whether the lock is still this guard's.
    pub fn is_current(&self) -> bool {
        self.ours() && self.lock.raw().is_current(self.claim.get())
    }

    /// Unlocks, reporting whether the lock was still this guard's.
    ///
    /// # Errors
    /// [`WriteGuardError::Lost`] if the lock had been evicted.
    pub fn unlock(self) -> Result<(), WriteGuardError> {
        let ok = self.ours() && self.lock.raw().write_unlock(self.claim.get());
        let r = if ok { Ok(()) } else { Err(self.lost()) };
        std::mem::forget(self);
        r
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // A forked child does not own its parent's write lock.
        if self.ours() {
            self.lock.raw().write_unlock(self.claim.get());
        }
    }
}

impl<T> std::fmt::Debug for WriteGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("lock", &self.lock.path())
            .field("token", &self.claim.get().token())
            .finish()
    }
}

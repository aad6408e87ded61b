//! Read and write locking (fast paths, blocking paths) and the RAII guards.

use std::cell::Cell;
use std::time::{Duration, Instant};

use cxc_sidecar::{Instrumented, OpCode, flags};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::error::WriteGuardError;
use super::handle::{SharedRwLock, from_words, to_words, words_of};
use super::layout::ctr;
use super::raw::WriteRefused;
use super::word::Word;
use crate::liveness::current_pid;

/// Spins before the first sleep.
const SPIN_LIMIT: u32 = 100;
/// A blocked caller looks for dead or stalled holders this often (and a draining writer
/// shows it is alive this often).
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(20);

/// What a handle's waiters last saw of the writer they wait behind: its claim and
/// progress counter, since when they have not moved, and when a waiter last looked. Kept in
/// the handle, so back-to-back timed waits (e.g. `write_timeout` in slices) add up to the
/// grace like one long wait; a look more than [`SEEN_FRESH`] ago starts over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    id: u64,
    beat: u64,
    since: Instant,
    last: Instant,
}

/// How recent the last look must be for a waiter to continue the observation.
const SEEN_FRESH: Duration = Duration::from_millis(100);

/// A blocked caller's view of the writer it waits behind: evicts it if its process is
/// dead, or if neither its claim nor its progress counter moved for a grace period while
/// this handle's callers waited.
pub(crate) struct Watch {
    next: Instant,
}

impl Watch {
    pub(crate) fn new() -> Self {
        Watch {
            next: Instant::now() + CHECK_EVERY,
        }
    }

    /// Runs the periodic checks if due; `true` if something was freed (retry at once).
    pub(crate) fn check<T>(&mut self, lock: &SharedRwLock<T>, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + CHECK_EVERY;
        let raw = lock.raw();
        let w = raw.word();
        let Some(writer) = w.writer() else {
            *lock.seen() = None;
            return lock.reclaim_dead() > 0;
        };
        if lock.slot_dead(writer) {
            let freed = lock.reclaim_dead() > 0;
            let now_w = raw.word();
            if raw.evict(now_w) {
                raw.bump(ctr::EVICTED_DEAD);
                lock.note(OpCode::RwEvictDead, 0, now_w.token());
                return true;
            }
            return freed;
        }
        let beat = lock
            .map
            .head()
            .beat
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut seen = lock.seen();
        match *seen {
            Some(s)
                if s.id == w.id()
                    && s.beat == beat
                    && now.saturating_duration_since(s.last) <= SEEN_FRESH =>
            {
                if now.duration_since(s.since) >= lock.grace && raw.evict(w) {
                    *seen = None;
                    drop(seen);
                    raw.bump(ctr::EVICTED_STALE);
                    lock.note(OpCode::RwEvictStale, 0, w.token());
                    return true;
                }
                *seen = Some(Seen { last: now, ..s });
                false
            }
            _ => {
                *seen = Some(Seen {
                    id: w.id(),
                    beat,
                    since: now,
                    last: now,
                });
                false
            }
        }
    }

    fn sleep_for(&self, now: Instant, deadline: Option<Instant>) -> Duration {
        let mut d = self.next.saturating_duration_since(now);
        if let Some(dl) = deadline {
            d = d.min(dl.saturating_duration_since(now));
        }
        d.max(Duration::from_micros(1))
    }
}

/// How long a blocked caller spins before its first sleep: the shared strategy's budget
/// (a time, set by a sidecar policy), or [`SPIN_LIMIT`] iterations.
struct Spin {
    budget: Option<Duration>,
    started: Instant,
    spins: u32,
}

impl Spin {
    fn new<T>(lock: &SharedRwLock<T>, started: Instant) -> Self {
        Spin {
            budget: lock.map.head().handshake.spin_budget(),
            started,
            spins: 0,
        }
    }

    /// `true` while the caller should spin (one `spin_loop` hint done).
    fn again(&mut self) -> bool {
        let more = match self.budget {
            None => self.spins < SPIN_LIMIT,
            Some(b) => self.spins % 16 != 0 || self.started.elapsed() < b,
        };
        if more {
            self.spins += 1;
            std::hint::spin_loop();
        }
        more
    }
}

/// The `flags` of a wait observation.
fn wait_flags(parked: bool, timed_out: bool) -> u16 {
    let mut f = if parked {
        flags::WAIT_PARKED
    } else {
        flags::WAIT_SPUN
    };
    if timed_out {
        f |= flags::WAIT_TIMED_OUT;
    }
    f
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SharedRwLock<T> {
    /// Records a wait (read or write) that missed its first try.
    #[inline]
    fn note_wait(&self, write: bool, started: Instant, parked: bool, timed_out: bool) {
        let op = if write {
            OpCode::RwWriteWait
        } else {
            OpCode::RwReadWait
        };
        self.note(
            op,
            wait_flags(parked, timed_out),
            started.elapsed().as_nanos() as u64,
        );
    }

    /// Takes a read lock if no writer holds or waits.
    #[inline(always)]
    pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let (slot, pid) = self.holder_and_pid()?;
        // Lazily: a guard built for a refused lock would unlock on drop.
        self.raw().try_read(slot).then(|| ReadGuard {
            lock: self,
            slot,
            pid,
        })
    }

    /// Takes a read lock, waiting while a writer holds or waits (writer preference).
    pub fn read(&self) -> ReadGuard<'_, T> {
        loop {
            if let Some(g) = self.read_timeout(Duration::MAX) {
                return g;
            }
        }
    }

    /// As [`read`](Self::read), giving up after `timeout`.
    #[inline]
    pub fn read_timeout(&self, timeout: Duration) -> Option<ReadGuard<'_, T>> {
        if let Some(g) = self.try_read() {
            return Some(g);
        }
        self.read_slow(Instant::now().checked_add(timeout))
    }

    #[cold]
    fn read_slow(&self, deadline: Option<Instant>) -> Option<ReadGuard<'_, T>> {
        let raw = self.raw();
        raw.bump(ctr::READ_CONTENDED);
        let started = Instant::now();
        let mut watch = Watch::new();
        let mut spin = Spin::new(self, started);
        let mut parked = false;
        loop {
            // Look (a plain load) before trying: a failed attempt bumps this process's
            // read count and takes it back, which a draining writer sees as a reader
            // still inside (and may wake it from its sleep for nothing).
            if raw.word().writer().is_none()
                && let Some(g) = self.try_read()
            {
                self.note_wait(false, started, parked, false);
                return Some(g);
            }
            if spin.again() {
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                raw.bump(ctr::TIMEOUTS);
                self.note_wait(false, started, parked, true);
                return None;
            }
            if watch.check(self, now) {
                continue;
            }
            let Some(seen) = raw.reader_park() else {
                continue;
            };
            raw.bump(ctr::SLEEPS);
            parked = true;
            crate::park::sleep(
                &self.map.head().rwake,
                seen,
                watch.sleep_for(now, deadline),
                None,
            );
        }
    }

    /// Takes the write lock if no writer holds and no reader holds.
    #[inline(always)]
    pub fn try_write(&self) -> Option<WriteGuard<'_, T>> {
        let (slot, pid) = self.holder_and_pid()?;
        let raw = self.raw();
        let claim = raw.try_claim(slot)?;
        if raw.reader_left().is_none() {
            return Some(self.guard_of(claim, pid));
        }
        raw.write_unlock(claim);
        None
    }

    /// Takes the write lock, waiting for the writer and then for the readers to leave.
    pub fn write(&self) -> WriteGuard<'_, T> {
        loop {
            if let Some(g) = self.write_timeout(Duration::MAX) {
                return g;
            }
        }
    }

    /// As [`write`](Self::write), giving up after `timeout`.
    #[inline]
    pub fn write_timeout(&self, timeout: Duration) -> Option<WriteGuard<'_, T>> {
        if let Some((slot, pid)) = self.holder_and_pid() {
            let raw = self.raw();
            if let Some(claim) = raw.try_claim(slot) {
                if raw.reader_left().is_none() {
                    return Some(self.guard_of(claim, pid));
                }
                let now = Instant::now();
                return self.drain(claim, now.checked_add(timeout), now, false);
            }
        }
        self.write_slow(Instant::now().checked_add(timeout))
    }

    pub(super) fn write_guard(&self, claim: Word) -> WriteGuard<'_, T> {
        self.guard_of(claim, current_pid())
    }

    /// The guard of `claim`, taken by process `pid` (one pid lookup per write lock on the
    /// fast path, shared with the holder-slot lookup).
    #[inline(always)]
    fn guard_of(&self, claim: Word, pid: u32) -> WriteGuard<'_, T> {
        WriteGuard {
            lock: self,
            claim: Cell::new(claim),
            pid,
        }
    }

    #[cold]
    fn write_slow(&self, deadline: Option<Instant>) -> Option<WriteGuard<'_, T>> {
        self.write_wait(deadline, Instant::now(), false)
    }

    /// Waits for the writer to leave, claims, then drains. `started`/`parked`: the wait
    /// so far (a writer evicted while draining comes back here).
    fn write_wait(
        &self,
        deadline: Option<Instant>,
        started: Instant,
        mut parked: bool,
    ) -> Option<WriteGuard<'_, T>> {
        let raw = self.raw();
        raw.bump(ctr::WRITE_CONTENDED);
        let mut watch = Watch::new();
        let mut spin = Spin::new(self, started);
        loop {
            if let Some(claim) = self.holder().and_then(|s| raw.try_claim(s)) {
                return self.drain(claim, deadline, started, parked);
            }
            if spin.again() {
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                raw.bump(ctr::TIMEOUTS);
                self.note_wait(true, started, parked, true);
                return None;
            }
            if watch.check(self, now) {
                continue;
            }
            let Some(seen) = raw.writer_park() else {
                continue;
            };
            raw.bump(ctr::SLEEPS);
            parked = true;
            crate::park::sleep(
                &self.map.head().wwake,
                seen,
                watch.sleep_for(now, deadline),
                None,
            );
        }
    }

    /// With the claim installed (new readers back off): waits for the readers inside to
    /// leave, reclaiming dead ones and beating so waiters do not take this writer for a
    /// stalled one. Gives the claim up at the deadline.
    #[cold]
    fn drain(
        &self,
        claim: Word,
        deadline: Option<Instant>,
        started: Instant,
        mut parked: bool,
    ) -> Option<WriteGuard<'_, T>> {
        let raw = self.raw();
        let head = self.map.head();
        let mut next = Instant::now() + CHECK_EVERY;
        let mut spin = Spin::new(self, Instant::now());
        loop {
            let Some(i) = raw.reader_left() else {
                if raw.is_current(claim) {
                    self.note_wait(true, started, parked, false);
                    return Some(self.write_guard(claim));
                }
                // Evicted while draining (e.g. stopped for longer than the grace).
                raw.free_own_quarantine(claim);
                return self.write_wait(deadline, started, parked);
            };
            if spin.again() {
                continue;
            }
            let now = Instant::now();
            if !raw.is_current(claim) {
                raw.free_own_quarantine(claim);
                return self.write_wait(deadline, started, parked);
            }
            if deadline.is_some_and(|d| now >= d) {
                raw.bump(ctr::TIMEOUTS);
                raw.write_unlock(claim);
                self.note_wait(true, started, parked, true);
                return None;
            }
            if now >= next {
                next = now + CHECK_EVERY;
                head.beat.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if self.reclaim_dead() > 0 {
                    continue;
                }
            }
            let Some(seen) = raw.drain_park(i) else {
                continue;
            };
            raw.bump(ctr::SLEEPS);
            parked = true;
            let mut d = next.saturating_duration_since(now);
            if let Some(dl) = deadline {
                d = d.min(dl.saturating_duration_since(now));
            }
            crate::park::sleep(&head.dwake, seen, d.max(Duration::from_micros(1)), None);
        }
    }
}

/// A read lock of a [`SharedRwLock`]; dropping it unlocks.
#[must_use = "dropping the guard unlocks at once"]
pub struct ReadGuard<'a, T> {
    lock: &'a SharedRwLock<T>,
    slot: usize,
    pid: u32,
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
        if current_pid() == self.pid {
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
    lock: &'a SharedRwLock<T>,
    /// The claim word as this guard last installed it (PUB/STAGE move on every write).
    claim: Cell<Word>,
    pid: u32,
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
        if !raw.is_current(self.claim.get()) {
            return Err(self.lost());
        }
        raw.head
            .beat
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Whether the lock is still this guard's.
    pub fn is_current(&self) -> bool {
        self.lock.raw().is_current(self.claim.get())
    }

    /// Unlocks, reporting whether the lock was still this guard's.
    ///
    /// # Errors
    /// [`WriteGuardError::Lost`] if the lock had been evicted.
    pub fn unlock(self) -> Result<(), WriteGuardError> {
        let ok = self.lock.raw().write_unlock(self.claim.get());
        let r = if ok { Ok(()) } else { Err(self.lost()) };
        std::mem::forget(self);
        r
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // A forked child does not own its parent's write lock.
        if current_pid() == self.pid {
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

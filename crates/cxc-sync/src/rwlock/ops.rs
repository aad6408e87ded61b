//! Read and write locking: fast paths and blocking paths.

use std::cell::Cell;
use std::time::{Duration, Instant};

use cxc_sidecar::{Instrumented, OpCode};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::guards::{ReadGuard, WriteGuard};
use super::handle::SharedRwLock;
use super::layout::ctr;
use super::wait::{CHECK_EVERY, Spin, Watch, sleep_until, until_some, wait_flags};
use super::word::Word;
use crate::liveness::current_proc;

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
        until_some(|| self.read_timeout(Duration::MAX))
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
        self.raw().bump(ctr::READ_CONTENDED);
        let started = Instant::now();
        self.wait_for_writer(false, deadline, started, false, |parked| {
            // Look (a plain load) before trying: a failed attempt bumps this process's
            // read count and takes it back, which a draining writer sees as a reader
            // still inside (and may wake it from its sleep for nothing).
            if self.raw().word().writer().is_some() {
                return None;
            }
            let g = self.try_read()?;
            self.note_wait(false, started, parked, false);
            Some(Some(g))
        })
    }

    /// The loop of a caller blocked behind a writer (a reader if `!write`, else a
    /// writer): `attempt(parked)` until it returns `Some`, spinning, then sleeping on
    /// the reader or writer wake word, with the periodic [`Watch`] checks; `None` at the
    /// deadline. `started`/`parked`: the wait so far.
    fn wait_for_writer<R>(
        &self,
        write: bool,
        deadline: Option<Instant>,
        started: Instant,
        mut parked: bool,
        mut attempt: impl FnMut(bool) -> Option<Option<R>>,
    ) -> Option<R> {
        let raw = self.raw();
        let mut watch = Watch::new();
        let mut spin = Spin::new(self, started);
        loop {
            if let Some(done) = attempt(parked) {
                return done;
            }
            if spin.again() {
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                raw.bump(ctr::TIMEOUTS);
                self.note_wait(write, started, parked, true);
                return None;
            }
            if watch.check(self, now) {
                continue;
            }
            let (seen, word) = if write {
                (raw.writer_park(), &self.map.head().wwake)
            } else {
                (raw.reader_park(), &self.map.head().rwake)
            };
            let Some(seen) = seen else {
                if !self.has_slot() {
                    // No writer, but no holder slot either (a forked child that found the
                    // table full): nothing can be taken until a slot frees, which the
                    // periodic checks look for (the next attempt registers); sleep until
                    // then instead of spinning.
                    raw.bump(ctr::SLEEPS);
                    parked = true;
                    std::thread::sleep(watch.sleep_for(now, deadline));
                }
                continue;
            };
            raw.bump(ctr::SLEEPS);
            parked = true;
            crate::park::sleep(word, seen, watch.sleep_for(now, deadline), None);
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
        until_some(|| self.write_timeout(Duration::MAX))
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
        self.guard_of(claim, current_proc())
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
        parked: bool,
    ) -> Option<WriteGuard<'_, T>> {
        let raw = self.raw();
        raw.bump(ctr::WRITE_CONTENDED);
        self.wait_for_writer(true, deadline, started, parked, |parked| {
            let claim = self.holder().and_then(|s| raw.try_claim(s))?;
            Some(self.drain(claim, deadline, started, parked))
        })
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
            crate::park::sleep(&head.dwake, seen, sleep_until(next, now, deadline), None);
        }
    }
}

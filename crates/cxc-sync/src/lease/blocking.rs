//! The blocking claim: spin, then sleep on the file's futex, woken by releases and by a
//! death watcher of the holder.

use std::time::{Duration, Instant};

use cxc_sidecar::Instrumented;
use cxc_sidecar::{OpCode, flags as sidecar_flags};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::LeaseClaim;
use super::file::*;
use super::slot::pid_word;
use super::state::{Claimant, Granted, LeaseState, counter};
use super::watch::Cover;
use super::word::Word;
use crate::liveness::Liveness;
use crate::primitive::Ordering;

/// How often a blocked `acquire` re-checks staleness and holder death while asleep, when
/// no death watcher covers the holder (no recorded identity: heartbeat path).
const BLOCKED_POLL: Duration = Duration::from_millis(2);
/// The first sleep of a blocked `acquire`, before a death watcher is started.
const FIRST_NAP: Duration = Duration::from_millis(1);
/// The re-check interval while the holder's death wakes us anyway (a death watcher
/// covers it, or it is this very process), or sooner when its heartbeat goes stale by
/// the clock. It still bounds how late a waiter notices that the lease changed hands
/// while it slept (a release wakes one sleeper; a preemption or a takeover none) and the
/// new holder then died: the watcher watches the holder the waiter last saw.
const WATCHED_POLL: Duration = Duration::from_millis(25);
/// The shortest of those sleeps, so that a staleness moment due but not yet seen (clock
/// rounding) does not make the waiter spin.
const WATCHED_MIN: Duration = Duration::from_millis(1);
/// How long after a waiter first saw the holder's sentinel say its process is exiting,
/// while some thread of it may still run (it takes its signal within microseconds), the
/// waiter looks again after a `yield_now` instead of sleeping (an exec also ends the
/// sentinel, and the process then lives on: the waiter goes back to its usual sleeps).
const EXITING_POLL_FOR: Duration = Duration::from_millis(20);

/// How a blocked waiter learns that the holder's process died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// The handle's death watcher covers it and wakes every sleeper.
    Watched,
    /// The holder is this very process: it cannot die while we run.
    Impossible,
    /// Only by looking (no recorded identity, no watcher): poll.
    Polled,
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Blocks until the lease is claimed for `my_pid` or `timeout` passes. The waiter
    /// spins briefly (not after a long wait of this handle: see docs/owner-lease.md,
    /// "Whether to spin at all"), then sleeps in the kernel (futex on the file) and is
    /// woken by a release. While a death-watcher thread holds a pidfd of the holder (and
    /// wakes it when the holder's process exits), or the holder is this process, it re-checks
    /// every 25 ms, or when the holder's heartbeat goes stale by the clock if that is
    /// sooner; otherwise every 2 ms. So a crashed holder is replaced promptly, and a
    /// stale one at its grace.
    pub fn acquire(&self, my_pid: u32, grace: u64, timeout: Duration) -> Option<LeaseClaim> {
        self.acquire_spinning(my_pid, grace, timeout, true)
    }

    /// [`acquire`](Self::acquire), without the spin phase when `spin` is false: for a
    /// caller that waits in slices (an election campaign), which spun on its first one
    /// and must not burn the spin budget again on every slice.
    pub(crate) fn acquire_spinning(
        &self,
        my_pid: u32,
        grace: u64,
        timeout: Duration,
        spin: bool,
    ) -> Option<LeaseClaim> {
        let holder = self.holder_waiting(pid_word(my_pid, false), timeout)?;
        let me = Claimant {
            holder,
            pid: my_pid,
            private: false,
        };
        self.acquire_as(me, grace, timeout, spin)
            .map(|g| self.state().claim_for(g.word, g.torn, my_proc()))
    }

    /// The holder value for `pid`, waiting up to `timeout` for a free identity slot when
    /// the table is full (every slot held by a live process).
    pub(super) fn holder_waiting(&self, pid: u64, timeout: Duration) -> Option<u8> {
        if let Some(h) = self.holder_as(pid, true) {
            return Some(h);
        }
        if pid as u32 == 0 {
            return None;
        }
        let deadline = Instant::now().checked_add(timeout);
        let mut every = SLOT_POLL;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            std::thread::sleep(left.map_or(every, |l| l.min(every)));
            every = (every * 2).min(SLOT_POLL_MAX);
            if let Some(h) = self.holder_as(pid, true) {
                return Some(h);
            }
        }
    }

    /// The blocking claim behind [`acquire`](Self::acquire) and the guards' `lock`;
    /// spinning first only if `spin`.
    pub(super) fn acquire_as(
        &self,
        me: Claimant,
        grace: u64,
        timeout: Duration,
        spin: bool,
    ) -> Option<Granted> {
        // First attempt without an OS check: the slow path checks holder death cheaply.
        let first = self.try_claim_without_os_check(me, grace);
        if let Some(g) = first {
            self.note_grant(&g);
            return Some(g);
        }
        self.acquire_slow(me, grace, timeout, spin)
    }

    /// One claim attempt that never asks the OS whether the holder lives (the first
    /// attempt of a blocking claim; the slow path checks holder death).
    #[inline]
    fn try_claim_without_os_check(&self, me: Claimant, grace: u64) -> Option<Granted> {
        // From the handle's guess of the word (see `claim_as`).
        self.try_claim_from(Word(self.hot.load(std::sync::atomic::Ordering::Relaxed)), me, grace)
    }

    /// [`try_claim_without_os_check`](Self::try_claim_without_os_check) from the word
    /// `guess`.
    #[inline]
    fn try_claim_from(&self, guess: Word, me: Claimant, grace: u64) -> Option<Granted> {
        let g = self.state().try_claim(
            guess,
            self.policy(),
            me,
            grace,
            self.now(),
            |_: &LeaseState, _| Liveness::Unknown,
            false,
        )?;
        self.hot.store(g.word, std::sync::atomic::Ordering::Relaxed);
        Some(g)
    }

    #[cold]
    fn acquire_slow(
        &self,
        me: Claimant,
        grace: u64,
        timeout: Duration,
        spin: bool,
    ) -> Option<Granted> {
        let st = self.state();
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        // Spin first, without OS checks, for the shared strategy's budget, or the
        // default one while this handle's recent waits were short (`park::SpinGauge`).
        let shared = st.handshake.spin_budget();
        let gauged = spin && shared.is_none();
        let budget = match shared {
            _ if !spin => Duration::ZERO,
            Some(b) => b,
            None => self.spin.budget(crate::park::DEFAULT_SPIN),
        };
        // A spinning attempt loads the word and tries to claim only when there is
        // something to try: the lease is vacant, or held by a claim not yet judged (a
        // preemption or a stale holder can be taken over without the OS), or every 64th
        // attempt (the holder's heartbeat may have gone stale meanwhile). A held lease
        // costs the spinner one load, and the holder's cache line stays where it is
        // until the release (a failing CAS per attempt would pull it away each time).
        let mut judged = None;
        let mut attempts = 0u32;
        if let Some(g) = crate::park::spin_for(budget, started, || {
            let cur = st.word();
            attempts = attempts.wrapping_add(1);
            if !cur.is_vacant() && judged == Some(cur.id()) && !attempts.is_multiple_of(64) {
                return None;
            }
            judged = Some(cur.id());
            self.try_claim_from(cur, me, grace)
        }) {
            let waited = started.elapsed();
            if gauged {
                self.spin.record(waited, crate::park::DEFAULT_SPIN);
            }
            self.note_grant(&g);
            self.note(
                OpCode::LeaseBlockedWait,
                sidecar_flags::WAIT_SPUN,
                waited.as_nanos() as u64,
            );
            return Some(g);
        }
        st.bump(counter::BLOCKED_WAITS, 1);
        let mut watch = super::os::CachedWatch::default();
        // This wait's use of the handle's death watcher (dropped when the wait ends).
        let mut cover: Option<Cover> = None;
        let mut naps = 0u32;
        // The claim whose holder the waiter first saw exiting, and when.
        let mut exiting_since: Option<(u64, Instant)> = None;
        let result = loop {
            st.waiters.fetch_add(1, Ordering::Relaxed);
            // SYNC: park. Announce, then re-check with an RMW on the claim word, so
            // either the releaser sees our flag or we see its release (`park.rs`).
            let seq = crate::park::announce(&st.wake);
            st.recheck();
            // One OS check per wake-up after the first sleep (a quick handoff pays
            // none).
            let check_os = naps > 0;
            let got = st.try_claim(
                st.word(),
                self.policy(),
                me,
                grace,
                self.now(),
                |s: &LeaseState, w| match s.holder_identity(w) {
                    Some(id) if check_os => watch.liveness(&id),
                    _ => Liveness::Unknown,
                },
                false,
            );
            let mut timed_out = false;
            if got.is_none() {
                // A short first sleep starts no watcher thread (most handoffs end within
                // it); a longer wait gets one, and then sleeps long. A watcher this handle
                // kept from an earlier wait on the same holder process covers the first
                // sleep too.
                let mut nap = match self.watched(&mut cover, naps > 0) {
                    Death::Watched | Death::Impossible => self
                        .stale_in(grace)
                        .clamp(WATCHED_MIN, WATCHED_POLL),
                    Death::Polled if naps == 0 => FIRST_NAP,
                    Death::Polled => BLOCKED_POLL,
                };
                let cur = st.word();
                if !cur.is_vacant() && st.slot_exiting(cur.holder()) {
                    let since = match exiting_since {
                        Some((id, t)) if id == cur.id() => t,
                        _ => exiting_since.insert((cur.id(), Instant::now())).1,
                    };
                    if since.elapsed() < EXITING_POLL_FOR {
                        nap = Duration::ZERO;
                    }
                }
                naps += 1;
                match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
                    Some(Duration::ZERO) => timed_out = true,
                    // The holder is exiting: let its threads reach their exit (on this
                    // CPU too) rather than sleep a timer's slack, and look again.
                    _ if nap.is_zero() => std::thread::yield_now(),
                    rem => {
                        let nap = rem.map_or(nap, |r| r.min(nap));
                        // Also on the holder's sentinel word, if it has one: the kernel
                        // wakes a sleeper there as soon as the holder's process starts to
                        // exit (`sentinel.rs`), earlier than any death watcher can.
                        match st.sentinel_to_sleep_on(me.holder) {
                            Some((word, v)) => {
                                crate::futex::wait_either(&st.wake, seq, word, v, nap)
                            }
                            None => crate::park::sleep(&st.wake, seq, nap, None),
                        }
                    }
                }
            }
            st.waiters.fetch_sub(1, Ordering::Relaxed);
            if got.is_some() || timed_out {
                break (got, timed_out);
            }
        };
        let (got, timed_out) = result;
        let waited = started.elapsed();
        if gauged {
            self.spin.record(waited, crate::park::DEFAULT_SPIN);
        }
        let waited = waited.as_nanos() as u64;
        st.bump(counter::BLOCKED_NS, waited);
        let mut flags = sidecar_flags::WAIT_PARKED;
        if timed_out {
            st.bump(counter::TIMEOUTS, 1);
            flags |= sidecar_flags::WAIT_TIMED_OUT;
            // We may have taken a wake-up meant for another sleeper: hand it on (the
            // flag makes the holder's release wake the next one; a vacant lease now).
            crate::park::announce(&st.wake);
            if st.recheck().is_vacant() {
                st.wake_waiters();
            }
        }
        if let Some(g) = &got {
            self.note_grant(g);
        }
        self.note(OpCode::LeaseBlockedWait, flags, waited);
        got
    }

    /// How the current holder's death would be seen: this handle's death watcher covers
    /// its process (keeping `cover`, this wait's use of it, on that process; with
    /// `start`, starting or moving the watcher to cover it if it does not), it is this
    /// very process, or only by polling.
    fn watched(&self, cover: &mut Option<Cover>, start: bool) -> Death {
        let st = self.state();
        let cur = st.word();
        let ident = if cur.is_vacant() {
            None
        } else {
            st.holder_identity(cur)
        };
        let Some(ident) = ident else {
            *cover = None;
            return Death::Polled;
        };
        // A holder in this very process cannot die while we run: no watcher.
        if ident == crate::liveness::Identity::current() {
            *cover = None;
            return Death::Impossible;
        }
        if cover.as_ref().is_some_and(|c| *c.ident() == ident && c.live()) {
            return Death::Watched;
        }
        // The watcher reads this handle's mapping; `self.watch` joins it before the
        // mapping goes.
        *cover = self.watch.cover(st, ident, start);
        if cover.is_some() {
            Death::Watched
        } else {
            Death::Polled
        }
    }

    /// How long until the holder's heartbeat is older than `grace` by the clock alone
    /// (`Duration::MAX` with manual epochs: only `tick_epoch` moves them, and it wakes
    /// the sleepers).
    fn stale_in(&self, grace: u64) -> Duration {
        let st = self.state();
        let beat = st.heartbeat.load(Ordering::Acquire);
        self.clock
            .until(&st.epoch, beat.saturating_add(grace).saturating_add(1))
            .unwrap_or(Duration::MAX)
    }
}

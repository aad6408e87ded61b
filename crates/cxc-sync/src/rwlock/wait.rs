//! The pieces of a blocked caller: [`Watch`] (periodic checks for dead or stalled
//! writers), [`Spin`] (how long to spin before sleeping) and the flags of a wait
//! observation.

use std::time::{Duration, Instant};

use cxc_sidecar::{Instrumented, OpCode, flags};

use super::handle::SharedRwLock;
use super::layout::ctr;
use super::seen::Seen;

/// Spins before the first sleep.
const SPIN_LIMIT: u32 = 100;
/// A blocked caller looks for dead or stalled holders this often (and a draining writer
/// shows it is alive this often).
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(20);

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

    /// Whether the periodic checks are due.
    #[cfg(feature = "async")]
    pub(crate) fn due(&self, now: Instant) -> bool {
        now >= self.next
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
            // Evict only the claim judged dead (`w`): `reclaim_dead` may have evicted it
            // already and a woken writer may hold the lock by now; `evict` refuses any
            // other claim (it compares the claim id, tokens included).
            if raw.evict(w) {
                raw.bump(ctr::EVICTED_DEAD);
                lock.note(OpCode::RwEvictDead, 0, w.token());
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
        if Seen::stalled(&mut seen, w.id(), beat, now, lock.grace) && raw.evict(w) {
            *seen = None;
            drop(seen);
            raw.bump(ctr::EVICTED_STALE);
            lock.note(OpCode::RwEvictStale, 0, w.token());
            return true;
        }
        false
    }

    /// How long to sleep at `now`: until the next check or the deadline, at least 1 µs.
    pub(crate) fn sleep_for(&self, now: Instant, deadline: Option<Instant>) -> Duration {
        sleep_until(self.next, now, deadline)
    }
}

/// The time from `now` to `next` or `deadline`, whichever comes first, at least 1 µs.
pub(crate) fn sleep_until(next: Instant, now: Instant, deadline: Option<Instant>) -> Duration {
    let mut d = next.saturating_duration_since(now);
    if let Some(dl) = deadline {
        d = d.min(dl.saturating_duration_since(now));
    }
    d.max(Duration::from_micros(1))
}

/// How long a blocked caller spins before its first sleep: the shared strategy's budget
/// (a time, set by a sidecar policy), or [`SPIN_LIMIT`] iterations.
pub(crate) struct Spin {
    budget: Option<Duration>,
    started: Instant,
    spins: u32,
}

impl Spin {
    pub(crate) fn new<T>(lock: &SharedRwLock<T>, started: Instant) -> Self {
        Spin {
            budget: lock.map.head().handshake.spin_budget(),
            started,
            spins: 0,
        }
    }

    /// `true` while the caller should spin (one `spin_loop` hint done).
    pub(crate) fn again(&mut self) -> bool {
        let more = match self.budget {
            None => self.spins < SPIN_LIMIT,
            Some(b) => !self.spins.is_multiple_of(16) || self.started.elapsed() < b,
        };
        if more {
            self.spins += 1;
            std::hint::spin_loop();
        }
        more
    }
}

/// The `flags` of a wait observation.
pub(crate) fn wait_flags(parked: bool, timed_out: bool) -> u16 {
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

/// Calls `f` until it returns `Some`: a wait without deadline made of a timed wait (with
/// `Duration::MAX`, which sets no deadline, so normally one call).
pub(crate) fn until_some<G>(mut f: impl FnMut() -> Option<G>) -> G {
    loop {
        if let Some(g) = f() {
            return g;
        }
    }
}

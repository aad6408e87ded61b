//! Parking on a wake word in shared memory: the protocol every blocking path uses.
//!
//! Wake word (a futex word in the file): bit 0 = [`SLEEPERS`] ("someone may be asleep
//! on this word, or about to be"), bits 1..32 = a wake sequence, bumped by every wake so a
//! waiter about to sleep on an old value returns at once.
//!
//! Waiter, per round: [`announce`] (set SLEEPERS, get the value to sleep on), then
//! re-check its condition **with a read-modify-write on the state word the wakers change
//! with a CAS** (`fetch_add(0)` or a CAS), then [`sleep`] on the announced value if the
//! condition still fails. Waker: change the state word with a CAS, then
//! `if has_sleepers(w) { wake(w, n) }` (one load on the fast path).
//!
//! No lost wake-up, with acquire/release reasoning only (loom checks it, see the lease's
//! and the semaphore's `loom_no_lost_wakeup` models): in the state word's modification
//! order either the waker's CAS comes first, and the waiter's re-check sees the change; or
//! the re-check comes first, and then the waker's CAS reads from the re-check's release
//! sequence, so the waiter's SLEEPERS write happens before the waker's load of the wake
//! word, which therefore sees the flag or a later value; a later value means the word
//! changed, so the waiter's futex wait returns at once.
//!
//! A wake clears the flag and wakes `n` sleepers; a woken waiter announces again before it
//! re-checks, and a waiter that leaves without taking what it waited for hands the wake
//! on ([`wake`] again), so waking one at a time loses no one. A flag left by a waiter that
//! died costs one spurious wake system call, once.

use std::time::Duration;

use crate::primitive::{AtomicU32, Ordering};

/// Bit 0 of a wake word: someone may be asleep on it (or about to be).
pub(crate) const SLEEPERS: u32 = 1;
/// The wake sequence lives above the flag.
pub(crate) const WAKE_STEP: u32 = 2;

/// Before sleeping: makes sure the sleepers flag is set; returns the value to sleep on.
#[inline]
pub(crate) fn announce(word: &AtomicU32) -> u32 {
    let mut f = word.load(Ordering::SeqCst);
    loop {
        if f & SLEEPERS != 0 {
            return f;
        }
        // SYNC: park. The flag write is ordered before the re-check RMW that follows.
        match word.compare_exchange(f, f | SLEEPERS, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return f | SLEEPERS,
            Err(now) => f = now,
        }
    }
}

/// After changing the state word: whether someone may be sleeping (one load).
#[inline]
pub(crate) fn has_sleepers(word: &AtomicU32) -> bool {
    // SYNC: park (pairs with `announce` through the state word's RMWs).
    word.load(Ordering::SeqCst) & SLEEPERS != 0
}

/// Clears the flag, bumps the sequence and wakes up to `n` sleepers. Returns whether
/// there were (possibly) sleepers.
#[cold]
pub(crate) fn wake(
    word: &AtomicU32,
    n: u32,
    #[allow(unused)] model: Option<&ModelFutexRef<'_>>,
) -> bool {
    let mut f = word.load(Ordering::SeqCst);
    while f & SLEEPERS != 0 {
        match word.compare_exchange(
            f,
            (f & !SLEEPERS).wrapping_add(WAKE_STEP),
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => {
                #[cfg(cxc_loom)]
                if let Some(m) = model {
                    m.0.wake(n.max(1));
                    return true;
                }
                crate::futex::wake(word, n.max(1));
                return true;
            }
            Err(now) => f = now,
        }
    }
    false
}

/// Wakes every sleeper whatever the flag says, and bumps the sequence (a holder's death:
/// every waiter must look).
pub(crate) fn wake_all(word: &AtomicU32) {
    word.fetch_add(WAKE_STEP, Ordering::SeqCst);
    crate::futex::wake(word, u32::MAX);
}

/// Sleeps while `word == announced`, at most `timeout`. Returns on a wake, a timeout, a
/// signal or a changed value; the caller re-checks in every case.
#[inline]
pub(crate) fn sleep(
    word: &AtomicU32,
    announced: u32,
    timeout: Duration,
    #[allow(unused)] model: Option<&ModelFutexRef<'_>>,
) {
    #[cfg(cxc_loom)]
    if let Some(m) = model {
        let _ = timeout;
        m.0.wait(word, announced);
        return;
    }
    crate::futex::wait(word, announced, timeout);
}

/// How long a blocked caller spins before it sleeps in the kernel, unless the file's
/// shared strategy says otherwise: about what waking a sleeper on another CPU costs on the
/// machines we measured (25–70 µs), so a release within that time hands over with no sleep
/// and no wake-up (docs/BENCHMARKS.md, handoff rows).
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(30);

/// The spin phase of every blocking path: calls `attempt` until it returns `Some` or
/// `budget` has passed since `started`, with an exponential backoff of pause hints (1 to
/// 16) between attempts. An attempt should look (a load) before it writes, so a spinning
/// waiter does not keep pulling the holder's cache line away. A zero budget makes no
/// attempt.
///
/// The cap trades handoff latency for throughput. Cross-process, AMD EPYC VM (family 26),
/// 2026-12-02, `cxc-xbench sidecar throughput`, runs alternating, the lease's attempts
/// loading first: with a cap of 64 pause hints the "always spin" short-hold round trip
/// took 3.7–4.1 µs (raw spin ping-pong 2.2 µs), with 16 2.6–2.8 µs, with 8 2.4–2.5 µs
/// and with 4 2.4–2.8 µs; the contended throughput of blocking `acquire` (medians of 5
/// trials per run, 4 runs each) was 13.6–17.3 M ops/s with 64, 13.9–15.5 M with 16,
/// 6.4–13.5 M with 8 and 5.9–11.2 M with 4 (2 runs): a waiter that looks more often
/// takes the lease in the moment between a release and the holder's next claim, and
/// every such handoff moves the cache lines to the other CPU.
///
/// Measured against `crossbeam_utils::Backoff` in its place (spin 2^0 to 2^6 pause hints,
/// then `yield` until it reports completed, within the same budget): the cross-process
/// handoff round trip (`cargo xtask bench`, handoff case) took 4.7–4.9 µs with it against
/// 0.43–0.47 µs with this loop (alternating runs, same machine): it stops spinning after
/// a few microseconds, before most handoffs arrive, and then sleeps.
#[cfg(not(cxc_loom))]
#[inline]
pub(crate) fn spin_for<T>(
    budget: Duration,
    started: std::time::Instant,
    mut attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    let mut round = 0u32;
    // The clock is read every 4 attempts.
    while !round.is_multiple_of(4) || started.elapsed() < budget {
        for _ in 0..1u32 << round.min(4) {
            std::hint::spin_loop();
        }
        round += 1;
        if let Some(v) = attempt() {
            return Some(v);
        }
    }
    None
}

/// The recent length of one handle's blocked waits, which decides whether its next wait
/// spins at all (the default strategy only; a budget the file's shared strategy sets is
/// used as it is).
///
/// A spin phase pays off only when the lock is released within it. A waiter whose waits
/// are long spins for nothing, and on these machines it is then also woken later: a
/// thread that spun before it slept is not run at once when the releasing process on
/// its CPU wakes it (cross-process, AMD EPYC VM, 2026-12-06, `cxc-xbench wake`: a raw
/// `FUTEX_WAIT` waiter woke in 9.0 µs median, the same waiter after a 30 µs spin in
/// 20.2 µs). So the gauge keeps a moving average of the handle's recent waits (each
/// counted as at most four budgets, the average halved towards each new wait) and a wait
/// spins only while that average is under two budgets: one long wait (four budgets or
/// more) stops the spinning, and waits well under two budgets bring it back (one after a
/// single long wait, two or three each under about 40 µs after many; a wait that slept
/// still ends within tens of microseconds when the lock is released at once).
#[derive(Debug, Default)]
pub(crate) struct SpinGauge {
    /// Moving average of recent waits, in nanoseconds (at most four budgets).
    avg_ns: std::sync::atomic::AtomicU64,
}

impl SpinGauge {
    /// A gauge with no history: the first wait spins.
    pub(crate) const fn new() -> Self {
        SpinGauge {
            avg_ns: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The spin budget of the next wait: `budget`, or zero while recent waits were long.
    #[inline]
    pub(crate) fn budget(&self, budget: Duration) -> Duration {
        let avg = self.avg_ns.load(std::sync::atomic::Ordering::Relaxed);
        if u128::from(avg) < 2 * budget.as_nanos() {
            budget
        } else {
            Duration::ZERO
        }
    }

    /// Records one blocked wait that took `waited` (from its start to its end, spun or
    /// asleep), for waits against `budget`.
    #[inline]
    pub(crate) fn record(&self, waited: Duration, budget: Duration) {
        let cap = budget
            .as_nanos()
            .saturating_mul(4)
            .min(u128::from(u64::MAX)) as u64;
        let sample = (waited.as_nanos().min(u128::from(u64::MAX)) as u64).min(cap);
        let avg = self.avg_ns.load(std::sync::atomic::Ordering::Relaxed);
        // avg = (avg + sample) / 2; a lost update between threads of one handle only
        // drops a sample.
        let next = avg / 2 + sample / 2;
        self.avg_ns
            .store(next.min(cap), std::sync::atomic::Ordering::Relaxed);
    }
}

/// A reference to the loom model futex (an empty type outside loom, so signatures do not
/// change between builds).
#[cfg(cxc_loom)]
pub(crate) struct ModelFutexRef<'a>(pub(crate) &'a ModelFutex);
/// A reference to the loom model futex (an empty type outside loom, so signatures do not
/// change between builds).
#[cfg(not(cxc_loom))]
pub(crate) struct ModelFutexRef<'a>(std::marker::PhantomData<&'a ()>);

/// Loom only: futex semantics (compare-and-sleep atomic with respect to wake; a wake
/// reaches at most `n` of the threads asleep at that moment and is lost if none is; no
/// spurious wake-ups) built from a loom mutex and condvar, so a lost wake-up shows as a
/// deadlock.
#[cfg(cxc_loom)]
pub(crate) struct ModelFutex {
    /// `(asleep, tokens)`: threads asleep, wake-ups handed to them but not yet taken.
    state: loom::sync::Mutex<(u32, u32)>,
    cv: loom::sync::Condvar,
}

#[cfg(cxc_loom)]
impl ModelFutex {
    pub(crate) fn new() -> Self {
        ModelFutex {
            state: loom::sync::Mutex::new((0, 0)),
            cv: loom::sync::Condvar::new(),
        }
    }

    /// Sleeps while `word == expected` until woken.
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32) {
        let mut st = self.state.lock().unwrap();
        if word.load(Ordering::SeqCst) != expected {
            return;
        }
        st.0 += 1;
        while st.1 == 0 {
            st = self.cv.wait(st).unwrap();
        }
        st.1 -= 1;
        st.0 -= 1;
    }

    pub(crate) fn wake(&self, n: u32) {
        let mut st = self.state.lock().unwrap();
        let unwoken = st.0 - st.1;
        st.1 += n.min(unwoken);
        self.cv.notify_all();
    }
}

#[cfg(all(test, not(cxc_loom)))]
mod tests {
    use super::{DEFAULT_SPIN, SpinGauge};
    use std::time::Duration;

    const B: Duration = DEFAULT_SPIN;

    #[test]
    fn a_fresh_gauge_spins() {
        assert_eq!(SpinGauge::new().budget(B), B);
    }

    #[test]
    fn one_long_wait_stops_the_spin_and_short_waits_bring_it_back() {
        let g = SpinGauge::new();
        for _ in 0..20 {
            g.record(Duration::from_nanos(500), B);
            assert_eq!(g.budget(B), B, "short waits keep spinning");
        }
        g.record(Duration::from_millis(2), B);
        assert_eq!(g.budget(B), Duration::ZERO, "a long wait stops it");
        g.record(Duration::from_secs(3600), B);
        assert_eq!(g.budget(B), Duration::ZERO);
        // A wait that slept but ended soon (a release right after the sleep began).
        let mut n = 0;
        while g.budget(B).is_zero() {
            g.record(Duration::from_micros(20), B);
            n += 1;
            assert!(n <= 3, "an hour-long wait counts as at most four budgets");
        }
        assert_eq!(g.budget(B), B);
    }

    #[test]
    fn mixed_waits_spin_while_most_are_short() {
        let g = SpinGauge::new();
        let mut spun = 0;
        for i in 0..100 {
            if !g.budget(B).is_zero() {
                spun += 1;
            }
            let long = i % 4 == 0;
            g.record(if long { B * 100 } else { B / 10 }, B);
        }
        assert!(spun >= 50, "{spun} of 100 waits spun");
    }

    #[test]
    fn a_zero_budget_never_spins_and_never_overflows() {
        let g = SpinGauge::new();
        g.record(Duration::MAX, Duration::ZERO);
        assert_eq!(g.budget(Duration::ZERO), Duration::ZERO);
        g.record(Duration::MAX, Duration::MAX);
        assert_eq!(g.budget(B), Duration::ZERO);
    }
}

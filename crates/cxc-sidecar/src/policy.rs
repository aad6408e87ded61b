//! [`Policy`]: turns observations into strategy decisions; [`Hysteresis`] to keep a policy
//! from flapping; [`AdaptiveSpin`], the built-in spin-before-park policy.

use std::time::Duration;

use crate::handshake::Strategy;
use crate::ring::Observation;
use crate::stats::Stats;

/// Decides, from what an instance recorded, whether its [`Strategy`] should change.
///
/// The [`Sidecar`](crate::Sidecar) calls [`observe`](Self::observe) once per poll with the
/// observations drained since the last poll (possibly none) and the instance's updated
/// [`Stats`] (`stats.strategy` is the strategy currently in the file). Returning
/// `Some(s)` with `s` different from the current strategy makes the sidecar apply it
/// ([`AdaptiveInstance::apply`](crate::AdaptiveInstance::apply)), which every process using
/// the file follows.
///
/// A policy runs on the polling thread with no sidecar lock held: it may register or drop
/// [`SidecarBox`](crate::SidecarBox)es. A policy that panics is removed (and counted in
/// [`Stats::policy_panics`]).
///
/// Good policies decide on enough data and do not flap: collect at least a minimum number
/// of samples before deciding, and require a recommendation to persist over several
/// decisions before acting on it ([`Hysteresis`]). Closures
/// `FnMut(&[Observation], &Stats) -> Option<Strategy>` are policies too.
///
/// # Examples
/// ```
/// use cxc_sidecar::{Hysteresis, Observation, OpCode, Policy, Stats, Strategy};
///
/// /// Park at once after timeouts, seen in three polls in a row.
/// struct ParkOnTimeouts(Hysteresis);
///
/// impl Policy for ParkOnTimeouts {
///     fn name(&self) -> &str { "park-on-timeouts" }
///     fn observe(&mut self, obs: &[Observation], stats: &Stats) -> Option<Strategy> {
///         let timeouts = obs.iter().filter(|o| o.op == OpCode::SemTimeout).count();
///         let want = (timeouts > 0 && stats.strategy != Strategy::Park).then_some(Strategy::Park);
///         self.0.vote(want)
///     }
/// }
/// # let _ = ParkOnTimeouts(Hysteresis::new(3));
/// ```
pub trait Policy: Send + 'static {
    /// A short name, for [`InstanceInfo`](crate::InstanceInfo) and logs.
    fn name(&self) -> &str {
        "policy"
    }

    /// Looks at one poll's observations and the instance's stats; `Some` to change the
    /// strategy.
    fn observe(&mut self, observations: &[Observation], stats: &Stats) -> Option<Strategy>;
}

impl<F> Policy for F
where
    F: FnMut(&[Observation], &Stats) -> Option<Strategy> + Send + 'static,
{
    fn name(&self) -> &str {
        "closure"
    }

    fn observe(&mut self, observations: &[Observation], stats: &Stats) -> Option<Strategy> {
        self(observations, stats)
    }
}

/// Lets a recommendation through only after it was made `required` times in a row.
///
/// Feed it one recommendation per decision (`None` = "keep the current strategy");
/// any different recommendation restarts the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hysteresis {
    required: u32,
    candidate: Option<Strategy>,
    streak: u32,
}

impl Hysteresis {
    /// Requires `required` identical recommendations in a row (at least 1).
    pub const fn new(required: u32) -> Self {
        Hysteresis {
            required: if required == 0 { 1 } else { required },
            candidate: None,
            streak: 0,
        }
    }

    /// Feeds one recommendation; returns it once it has been made `required` times in a
    /// row (and then starts over).
    pub fn vote(&mut self, recommendation: Option<Strategy>) -> Option<Strategy> {
        let Some(rec) = recommendation else {
            self.reset();
            return None;
        };
        if self.candidate == Some(rec) {
            self.streak += 1;
        } else {
            self.candidate = Some(rec);
            self.streak = 1;
        }
        if self.streak >= self.required {
            self.reset();
            Some(rec)
        } else {
            None
        }
    }

    /// Forgets the current streak.
    pub fn reset(&mut self) {
        self.candidate = None;
        self.streak = 0;
    }

    /// How many times in a row the current candidate was recommended.
    pub fn streak(&self) -> u32 {
        self.streak
    }
}

/// Configuration of [`AdaptiveSpin`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSpinConfig {
    /// Wait samples needed for one decision (collected over as many polls as it takes).
    pub min_samples: usize,
    /// Which quantile of the waits the budget must cover (0.0..=1.0).
    pub quantile: f64,
    /// Waits up to this are cheaper to spin through than a futex sleep and wake-up.
    pub short_wait: Duration,
    /// Park only when the quantile exceeds `short_wait` times this (a dead band between
    /// spinning and parking, so a workload near the threshold does not flap).
    pub park_factor: u32,
    /// Smallest spin budget chosen.
    pub min_budget: Duration,
    /// Largest spin budget chosen.
    pub max_budget: Duration,
    /// A new spin budget replaces the current one only if one is at least this many times
    /// the other (the default, 3, ignores moves to a neighbouring power of two).
    pub min_change: u32,
    /// Decisions in a row that must agree before the strategy changes ([`Hysteresis`]).
    pub hysteresis: u32,
    /// Samples kept at most per decision (more are ignored until the next decision).
    pub max_samples: usize,
}

impl Default for AdaptiveSpinConfig {
    fn default() -> Self {
        AdaptiveSpinConfig {
            min_samples: 32,
            quantile: 0.9,
            short_wait: Duration::from_micros(50),
            park_factor: 2,
            min_budget: Duration::from_micros(1),
            max_budget: Duration::from_micros(50),
            min_change: 3,
            hysteresis: 2,
            max_samples: 4096,
        }
    }
}

/// The built-in policy: chooses how long a blocked acquirer spins before it parks, from the
/// observed wait durations (the wait ops: [`OpCode::is_wait`](crate::OpCode::is_wait)).
///
/// Every `min_samples` waits it takes the `quantile` of their durations `q`:
/// - `q <= short_wait`: most waits end sooner than a futex round trip would, so spin:
///   [`Strategy::Spin`] with a budget of `1.5 * q` rounded up to a power of two
///   nanoseconds, clamped to `min_budget..=max_budget`;
/// - `q > short_wait * park_factor`: waits are long, spinning burns CPU for nothing:
///   [`Strategy::Park`];
/// - in between: keep the current strategy.
///
/// A recommendation equal to the current strategy (or a spin budget within `min_change`
/// of the current one) is no recommendation; a change needs `hysteresis` agreeing
/// decisions in a row.
#[derive(Debug, Clone)]
pub struct AdaptiveSpin {
    config: AdaptiveSpinConfig,
    window: Vec<u64>,
    hysteresis: Hysteresis,
    last_quantile: Option<u64>,
}

impl Default for AdaptiveSpin {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveSpin {
    /// With the default configuration.
    pub fn new() -> Self {
        Self::with_config(AdaptiveSpinConfig::default())
    }

    /// With `config`.
    pub fn with_config(config: AdaptiveSpinConfig) -> Self {
        AdaptiveSpin {
            config,
            window: Vec::new(),
            hysteresis: Hysteresis::new(config.hysteresis),
            last_quantile: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AdaptiveSpinConfig {
        &self.config
    }

    /// The wait quantile of the last decision, in nanoseconds.
    pub fn last_quantile_ns(&self) -> Option<u64> {
        self.last_quantile
    }

    /// What one decision on a wait quantile of `q_ns` recommends, given the `current`
    /// strategy (before hysteresis). `None`: keep the current strategy.
    pub fn recommend(&self, q_ns: u64, current: Strategy) -> Option<Strategy> {
        let c = &self.config;
        let short = duration_ns(c.short_wait);
        let target = if q_ns <= short {
            Strategy::Spin {
                budget_ns: self.budget_for(q_ns),
            }
        } else if q_ns > short.saturating_mul(u64::from(c.park_factor.max(1))) {
            Strategy::Park
        } else {
            return None;
        };
        match (target, current.normalized()) {
            (t, cur) if t == cur => None,
            (Strategy::Spin { budget_ns: new }, Strategy::Spin { budget_ns: old }) => {
                let (lo, hi) = (new.min(old), new.max(old));
                (u64::from(hi) >= u64::from(lo).saturating_mul(u64::from(c.min_change.max(1))))
                    .then_some(target)
            }
            _ => Some(target),
        }
    }

    fn budget_for(&self, q_ns: u64) -> u32 {
        let c = &self.config;
        let want = q_ns.saturating_add(q_ns / 2).max(1);
        let rounded = want.checked_next_power_of_two().unwrap_or(u64::MAX);
        let lo = duration_ns(c.min_budget);
        let hi = duration_ns(c.max_budget).max(lo);
        rounded.clamp(lo, hi).min(u64::from(Strategy::MAX_PARAM)) as u32
    }
}

fn duration_ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Policy for AdaptiveSpin {
    fn name(&self) -> &str {
        "adaptive-spin"
    }

    fn observe(&mut self, observations: &[Observation], stats: &Stats) -> Option<Strategy> {
        for ns in observations.iter().filter_map(Observation::wait_ns) {
            if self.window.len() < self.config.max_samples.max(1) {
                self.window.push(ns);
            }
        }
        if self.window.len() < self.config.min_samples.max(1) {
            return None;
        }
        self.window.sort_unstable();
        let q = self.config.quantile.clamp(0.0, 1.0);
        let rank = ((q * self.window.len() as f64).ceil() as usize).clamp(1, self.window.len());
        let q_ns = self.window[rank - 1];
        self.window.clear();
        self.last_quantile = Some(q_ns);
        let rec = self.recommend(q_ns, stats.strategy);
        self.hysteresis.vote(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpCode;

    fn waits(ns: u64, n: usize) -> Vec<Observation> {
        (0..n)
            .map(|i| Observation {
                ticket: i as u64,
                timestamp_ns: 0,
                pid: 1,
                op: OpCode::LeaseBlockedWait,
                flags: 0,
                arg: ns,
            })
            .collect()
    }

    #[test]
    fn hysteresis_needs_a_streak() {
        let mut h = Hysteresis::new(3);
        let p = Some(Strategy::Park);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(None), None);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(Some(Strategy::Default)), None);
        assert_eq!(h.streak(), 1);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(p), None);
        assert_eq!(h.vote(p), p);
        assert_eq!(h.streak(), 0);
        assert_eq!(Hysteresis::new(0).vote(p), p);
    }

    #[test]
    fn short_waits_choose_spin_after_hysteresis() {
        let mut a = AdaptiveSpin::new();
        let stats = Stats::default();
        // Too few samples: no decision.
        assert_eq!(a.observe(&waits(2_000, 31), &stats), None);
        assert_eq!(a.last_quantile_ns(), None);
        // 32 samples: one decision, hysteresis wants two.
        assert_eq!(a.observe(&waits(2_000, 1), &stats), None);
        assert_eq!(a.last_quantile_ns(), Some(2_000));
        assert_eq!(
            a.observe(&waits(2_000, 40), &stats),
            Some(Strategy::Spin { budget_ns: 4096 })
        );
    }

    #[test]
    fn recommendations() {
        let a = AdaptiveSpin::new();
        let spin = |b| Strategy::Spin { budget_ns: b };
        assert_eq!(a.recommend(2_000, Strategy::Default), Some(spin(4096)));
        assert_eq!(a.recommend(2_000, spin(4096)), None);
        // One power of two away from the current budget: no change.
        assert_eq!(a.recommend(3_000, spin(4096)), None);
        assert_eq!(a.recommend(1_000, spin(4096)), None);
        assert_eq!(a.recommend(6_000, spin(4096)), Some(spin(16384)));
        assert_eq!(a.recommend(10, spin(4096)), Some(spin(1000)));
        // Clamped to the maximum budget.
        assert_eq!(a.recommend(45_000, Strategy::Park), Some(spin(50_000)));
        // Dead band: neither spin nor park.
        assert_eq!(a.recommend(80_000, spin(4096)), None);
        assert_eq!(a.recommend(80_000, Strategy::Park), None);
        // Long waits: park.
        assert_eq!(a.recommend(500_000, spin(4096)), Some(Strategy::Park));
        assert_eq!(
            a.recommend(500_000, Strategy::Default),
            Some(Strategy::Park)
        );
        assert_eq!(a.recommend(500_000, Strategy::Park), None);
    }

    #[test]
    fn long_tail_decides_by_quantile() {
        let mut a = AdaptiveSpin::with_config(AdaptiveSpinConfig {
            hysteresis: 1,
            ..AdaptiveSpinConfig::default()
        });
        let mut obs = waits(1_000, 20);
        obs.extend(waits(10_000_000, 20));
        assert_eq!(
            a.observe(&obs, &Stats::default()),
            Some(Strategy::Park),
            "half the waits are long"
        );
        let mut obs = waits(1_000, 38);
        obs.extend(waits(10_000_000, 2));
        assert_eq!(
            a.observe(&obs, &Stats::default()),
            Some(Strategy::Spin { budget_ns: 2048 }),
            "5% long waits do not keep it from spinning"
        );
    }
}

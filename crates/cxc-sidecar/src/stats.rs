//! [`Stats`]: what the sidecar has learnt about one registered instance.

use std::collections::BTreeMap;

use crate::handshake::Strategy;
use crate::op::OpCode;
use crate::ring::{Observation, ReadBatch};

/// Number of buckets of a [`WaitHistogram`].
const BUCKETS: usize = 64;

/// A log2 histogram of wait durations: bucket `i` counts waits in `[2^i, 2^(i+1))` ns
/// (bucket 0 also counts zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitHistogram {
    /// Number of waits.
    pub count: u64,
    /// Sum of all waits in nanoseconds (saturating).
    pub total_ns: u64,
    /// The longest wait in nanoseconds.
    pub max_ns: u64,
    buckets: [u64; BUCKETS],
}

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram {
            count: 0,
            total_ns: 0,
            max_ns: 0,
            buckets: [0; BUCKETS],
        }
    }
}

impl WaitHistogram {
    /// Adds one wait.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        self.buckets[bucket(ns)] += 1;
    }

    /// An upper bound of the `q`-quantile (`0.0..=1.0`) of the waits: the upper edge of the
    /// bucket that holds it (so within a factor of two). 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return upper_edge(i).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// Mean wait in nanoseconds, 0 when empty.
    pub fn mean_ns(&self) -> u64 {
        self.total_ns.checked_div(self.count).unwrap_or(0)
    }

    /// `(upper edge in ns, count)` of every non-empty bucket.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (upper_edge(i), *n))
    }
}

fn bucket(ns: u64) -> usize {
    (63 - (ns | 1).leading_zeros()) as usize
}

fn upper_edge(bucket: usize) -> u64 {
    if bucket >= 63 {
        u64::MAX
    } else {
        (2u64 << bucket) - 1
    }
}

/// Per-instance statistics kept by the [`Sidecar`](crate::Sidecar) and handed to the
/// instance's [`Policy`](crate::Policy) on every poll. Process-local: every process that
/// registers an instance keeps its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Polls that processed this instance.
    pub polls: u64,
    /// Observations drained from the ring since registration.
    pub observed: u64,
    /// Observations lost (overwritten, unfinished or torn) before a poll read them.
    pub lost: u64,
    /// Observations per op code (on-file codes; see [`Stats::op_count`]).
    pub ops: BTreeMap<u16, u64>,
    /// Durations of the wait observations ([`OpCode::is_wait`]).
    pub waits: WaitHistogram,
    /// The instance's cumulative in-file counters at the last poll.
    pub counters: Vec<(&'static str, u64)>,
    /// The strategy in the file at the last poll.
    pub strategy: Strategy,
    /// Its generation.
    pub generation: u32,
    /// Strategies this process's sidecar applied to the instance.
    pub strategy_changes: u64,
    /// Times the instance's policy panicked (it is removed after a panic).
    pub policy_panics: u64,
    /// Timestamp of the newest observation seen (`CLOCK_MONOTONIC` ns), 0 if none.
    pub last_observation_ns: u64,
}

impl Stats {
    /// How many observations of `op` were seen.
    pub fn op_count(&self, op: OpCode) -> u64 {
        self.ops.get(&op.code()).copied().unwrap_or(0)
    }

    /// The value of the in-file counter `name` at the last poll.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// Folds one drained batch in.
    pub(crate) fn absorb(&mut self, batch: &ReadBatch) {
        self.polls += 1;
        self.observed += batch.observations.len() as u64;
        self.lost += batch.lost;
        for o in &batch.observations {
            self.absorb_one(o);
        }
    }

    fn absorb_one(&mut self, o: &Observation) {
        *self.ops.entry(o.op.code()).or_default() += 1;
        if let Some(ns) = o.wait_ns() {
            self.waits.add(ns);
        }
        self.last_observation_ns = self.last_observation_ns.max(o.timestamp_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let mut h = WaitHistogram::default();
        assert_eq!(h.quantile(0.9), 0);
        for _ in 0..90 {
            h.add(1_000);
        }
        for _ in 0..10 {
            h.add(1_000_000);
        }
        assert_eq!(h.count, 100);
        assert!(
            (1_000..2_048).contains(&h.quantile(0.9)),
            "{}",
            h.quantile(0.9)
        );
        assert!(h.quantile(0.95) >= 1_000_000);
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.mean_ns(), (90 * 1_000 + 10 * 1_000_000) / 100);
        h.add(0);
        h.add(u64::MAX);
        assert_eq!(h.max_ns, u64::MAX);
        assert_eq!(h.buckets().count(), 4);
    }
}

//! Epochs: the time base of heartbeats and staleness.
//!
//! - [`EpochMode::Manual`] (the seeds' default): the epoch is a counter in the file,
//!   advanced by `tick_epoch()`, typically from a scheduler's timer.
//! - [`EpochMode::Clock`]: the epoch is `CLOCK_MONOTONIC / tick` plus the counter in the
//!   file, so no external ticker is needed and `tick_epoch()` still works (it skips ahead
//!   by one tick, e.g. in tests). The clock is the machine's: a process in a time
//!   namespace (`unshare --time`, whose monotonic clock is shifted) subtracts its
//!   namespace's offset, so every process of the machine agrees.
//!
//! The clock is read at most once per operation.

use std::time::Duration;

use crate::primitive::{AtomicU64, Ordering};

/// Where epochs come from. Stored in the file, so every process agrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EpochMode {
    /// A counter in the file advanced by `tick_epoch()` (seed behaviour).
    #[default]
    Manual,
    /// `CLOCK_MONOTONIC` divided into ticks of this length (at least 1 µs), plus the
    /// manual counter.
    Clock {
        /// Length of one epoch.
        tick: Duration,
    },
}

/// Smallest tick accepted for [`EpochMode::Clock`].
pub const MIN_TICK: Duration = Duration::from_micros(1);
/// Largest tick accepted for [`EpochMode::Clock`] (one day).
pub const MAX_TICK: Duration = Duration::from_secs(86_400);

impl EpochMode {
    /// The two header parameters `(mode code, tick in ns)`.
    pub(crate) fn encode(self) -> (u64, u64) {
        match self {
            EpochMode::Manual => (0, 0),
            EpochMode::Clock { tick } => (1, tick.as_nanos().min(u128::from(u64::MAX)) as u64),
        }
    }

    /// Decodes header parameters; `None` if they are not a valid mode.
    pub(crate) fn decode(mode: u64, tick_ns: u64) -> Option<EpochMode> {
        match mode {
            0 if tick_ns == 0 => Some(EpochMode::Manual),
            1 if (MIN_TICK.as_nanos() as u64..=MAX_TICK.as_nanos() as u64).contains(&tick_ns) => {
                Some(EpochMode::Clock {
                    tick: Duration::from_nanos(tick_ns),
                })
            }
            _ => None,
        }
    }

    /// Checks a mode a caller asked for.
    pub(crate) fn is_valid(self) -> bool {
        match self {
            EpochMode::Manual => true,
            EpochMode::Clock { tick } => (MIN_TICK..=MAX_TICK).contains(&tick),
        }
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline]
pub fn monotonic_ns() -> u64 {
    #[cfg(not(cxc_loom))]
    {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }
    #[cfg(cxc_loom)]
    {
        0
    }
}

/// Nanoseconds of the machine's `CLOCK_MONOTONIC`: this process's clock less its time
/// namespace's offset (`unshare --time`), so that processes in different time namespaces
/// of one machine read the same time. Epochs and deadlines shared through files use it.
#[inline]
pub(crate) fn machine_monotonic_ns() -> u64 {
    #[cfg(not(cxc_loom))]
    {
        monotonic_ns().wrapping_sub(cxc_mmf::identity::monotonic_offset_ns() as u64)
    }
    #[cfg(cxc_loom)]
    {
        0
    }
}

/// An epoch clock bound to one file's counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpochClock {
    tick_ns: u64,
}

impl EpochClock {
    pub(crate) fn new(mode: EpochMode) -> Self {
        EpochClock {
            tick_ns: match mode {
                EpochMode::Manual => 0,
                EpochMode::Clock { tick } => (tick.as_nanos() as u64).max(1),
            },
        }
    }

    /// The current epoch.
    #[inline]
    pub(crate) fn now(&self, counter: &AtomicU64) -> u64 {
        let manual = counter.load(Ordering::Acquire);
        self.clock_part().wrapping_add(manual)
    }

    /// Advances the counter by one and returns the new current epoch.
    pub(crate) fn tick(&self, counter: &AtomicU64) -> u64 {
        let manual = counter.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        self.clock_part().wrapping_add(manual)
    }

    /// How long until [`now`](Self::now) reaches `epoch` by the clock alone (the counter
    /// as it is now): zero if it has; `None` in manual mode, where only `tick_epoch()`
    /// moves the epoch.
    pub(crate) fn until(&self, counter: &AtomicU64, epoch: u64) -> Option<Duration> {
        if self.tick_ns == 0 {
            return None;
        }
        let Some(clock_epoch) = epoch.checked_sub(counter.load(Ordering::Acquire)) else {
            return Some(Duration::ZERO);
        };
        // Epoch `e` of the clock starts at `e * tick` ns of CLOCK_MONOTONIC.
        let at = clock_epoch.saturating_mul(self.tick_ns);
        Some(Duration::from_nanos(
            at.saturating_sub(machine_monotonic_ns()),
        ))
    }

    /// Clock ticks elapsed (0 in manual mode, without reading the clock).
    #[inline]
    fn clock_part(&self) -> u64 {
        match self.tick_ns {
            0 => 0,
            t => machine_monotonic_ns() / t,
        }
    }

    /// The mode this clock runs in.
    pub(crate) fn mode(&self) -> EpochMode {
        if self.tick_ns == 0 {
            EpochMode::Manual
        } else {
            EpochMode::Clock {
                tick: Duration::from_nanos(self.tick_ns),
            }
        }
    }
}

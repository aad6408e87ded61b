//! [`HandshakeHeader`]: the per-file control block that carries the current [`Strategy`]
//! to every process using the file.
//!
//! Strategy word (`HandshakeHeader::word`), one `u64` so a single load gives a consistent
//! (generation, tag, parameter):
//!
//! | bits   | field      | meaning                                                    |
//! |--------|------------|------------------------------------------------------------|
//! | 0..32  | generation | +1 on every published change; 0 = never published          |
//! | 32..40 | tag        | 0 = [`Strategy::Default`], 1 = [`Strategy::Park`], 2 = [`Strategy::Spin`] |
//! | 40..64 | param      | tag-specific; for `Spin` the budget in nanoseconds (≤ 16.7 ms) |
//!
//! An all-zero word is generation 0, [`Strategy::Default`]: a fresh file needs no
//! initialisation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use zerocopy::{FromBytes, KnownLayout};

use crate::clock::monotonic_ns;

const GEN_MASK: u64 = 0xFFFF_FFFF;
const TAG_SHIFT: u32 = 32;
const TAG_MASK: u64 = 0xFF;
const PARAM_SHIFT: u32 = 40;

const TAG_DEFAULT: u8 = 0;
const TAG_PARK: u8 = 1;
const TAG_SPIN: u8 = 2;

/// How a blocked acquirer of a primitive waits. Shared by every process using the file
/// through its [`HandshakeHeader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// The primitive's built-in behaviour (its compiled-in spin count). The state of a
    /// fresh file.
    #[default]
    Default,
    /// Park in the kernel at once, without spinning.
    Park,
    /// Spin (re-trying) for up to `budget_ns` nanoseconds, then park.
    Spin {
        /// The spin budget in nanoseconds, at most [`Strategy::MAX_PARAM`].
        budget_ns: u32,
    },
    /// A tag this build does not know (published by a newer build); primitives treat it
    /// as [`Strategy::Default`].
    Unknown {
        /// The on-file tag.
        tag: u8,
        /// The on-file parameter.
        param: u32,
    },
}

impl Strategy {
    /// Largest parameter the strategy word holds (24 bits; for `Spin`, about 16.7 ms).
    pub const MAX_PARAM: u32 = (1 << 24) - 1;

    /// A spin budget, clamped to what the file can hold.
    pub fn spin(budget: Duration) -> Strategy {
        Strategy::Spin {
            budget_ns: budget.as_nanos().min(u128::from(Self::MAX_PARAM)) as u32,
        }
    }

    /// The on-file tag.
    pub const fn tag(self) -> u8 {
        match self {
            Strategy::Default => TAG_DEFAULT,
            Strategy::Park => TAG_PARK,
            Strategy::Spin { .. } => TAG_SPIN,
            Strategy::Unknown { tag, .. } => tag,
        }
    }

    /// The on-file parameter (clamped to [`Strategy::MAX_PARAM`]).
    pub const fn param(self) -> u32 {
        let p = match self {
            Strategy::Default | Strategy::Park => 0,
            Strategy::Spin { budget_ns } => budget_ns,
            Strategy::Unknown { param, .. } => param,
        };
        if p > Self::MAX_PARAM {
            Self::MAX_PARAM
        } else {
            p
        }
    }

    /// The strategy for an on-file (tag, parameter). `from_parts(s.tag(), s.param())`
    /// is `s` for every strategy whose parameter fits.
    pub const fn from_parts(tag: u8, param: u32) -> Strategy {
        match tag {
            TAG_DEFAULT if param == 0 => Strategy::Default,
            TAG_PARK if param == 0 => Strategy::Park,
            TAG_SPIN => Strategy::Spin { budget_ns: param },
            tag => Strategy::Unknown { tag, param },
        }
    }

    /// How long a blocked acquirer spins before parking: `None` for "the primitive's
    /// built-in default" ([`Strategy::Default`] and unknown strategies), `Some(ZERO)` for
    /// [`Strategy::Park`].
    #[inline]
    pub fn spin_budget(self) -> Option<Duration> {
        match self {
            Strategy::Park => Some(Duration::ZERO),
            Strategy::Spin { budget_ns } => Some(Duration::from_nanos(u64::from(budget_ns))),
            Strategy::Default | Strategy::Unknown { .. } => None,
        }
    }

    /// Normalised (parameter clamped), as it reads back from a file.
    pub const fn normalized(self) -> Strategy {
        Strategy::from_parts(self.tag(), self.param())
    }

    /// Lower-case name, as the CLI prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::Park => "park",
            Strategy::Spin { .. } => "spin",
            Strategy::Unknown { .. } => "unknown",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Strategy::Spin { budget_ns } => write!(f, "spin({budget_ns}ns)"),
            Strategy::Unknown { tag, param } => write!(f, "unknown(tag {tag}, param {param})"),
            s => f.write_str(s.name()),
        }
    }
}

#[inline]
const fn encode(generation: u32, s: Strategy) -> u64 {
    generation as u64 | (s.tag() as u64) << TAG_SHIFT | (s.param() as u64) << PARAM_SHIFT
}

#[inline]
const fn decode(word: u64) -> (Strategy, u32) {
    let s = Strategy::from_parts(
        ((word >> TAG_SHIFT) & TAG_MASK) as u8,
        (word >> PARAM_SHIFT) as u32,
    );
    (s, (word & GEN_MASK) as u32)
}

cxc_mmf::atomic_layout! {
    /// The per-file control block: the current [`Strategy`] and its generation, so a decision
    /// taken in one process (by a [`Policy`](crate::Policy) run by that process's
    /// [`Sidecar`](crate::Sidecar)) applies to every process using the file.
    ///
    /// An in-file view: `#[repr(C, align(64))]`, only `AtomicU64`s, 64 bytes; all-zero is
    /// generation 0 with [`Strategy::Default`].
    ///
    /// | offset | size | field                                                   |
    /// |-------:|-----:|---------------------------------------------------------|
    /// | 0      | 8    | strategy word (see the module docs)                     |
    /// | 8      | 8    | `CLOCK_MONOTONIC` ns of the last publish (diagnostic)   |
    /// | 16     | 8    | pid of the last publisher (diagnostic)                  |
    /// | 24     | 40   | reserved, zero                                          |
    ///
    /// A primitive reads the strategy on its blocking slow path with one Relaxed load:
    ///
    /// ```
    /// use std::time::Duration;
    /// use cxc_sidecar::{HandshakeHeader, Strategy};
    ///
    /// const DEFAULT_SPIN: Duration = Duration::from_micros(2);
    /// let hs = HandshakeHeader::new(); // in a file: a field of the primitive's fixed block
    /// assert_eq!(hs.spin_budget().unwrap_or(DEFAULT_SPIN), DEFAULT_SPIN);
    /// let generation = hs.publish(Strategy::spin(Duration::from_micros(20)));
    /// assert_eq!(hs.current(), (Strategy::Spin { budget_ns: 20_000 }, generation));
    /// assert_eq!(hs.spin_budget(), Some(Duration::from_micros(20)));
    /// ```
    #[derive(FromBytes, KnownLayout)]
    #[repr(C, align(64))]
    pub struct HandshakeHeader {
        word: AtomicU64,
        updated_ns: AtomicU64,
        updated_by: AtomicU64,
        _reserved: [AtomicU64; 5],
    }
}

const _: () = assert!(size_of::<HandshakeHeader>() == 64);
const _: () = assert!(align_of::<HandshakeHeader>() == 64);

impl Default for HandshakeHeader {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for HandshakeHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, g) = self.current();
        f.debug_struct("HandshakeHeader")
            .field("strategy", &s)
            .field("generation", &g)
            .finish_non_exhaustive()
    }
}

impl HandshakeHeader {
    /// Generation 0, [`Strategy::Default`] (the same state as all-zero bytes in a file).
    pub const fn new() -> Self {
        HandshakeHeader {
            word: AtomicU64::new(0),
            updated_ns: AtomicU64::new(0),
            updated_by: AtomicU64::new(0),
            _reserved: [const { AtomicU64::new(0) }; 5],
        }
    }

    /// The raw strategy word (see the module docs).
    #[inline]
    pub fn word(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// The current strategy and its generation, from one load.
    #[inline]
    pub fn current(&self) -> (Strategy, u32) {
        // SYNC: handshake word. Pairs with the AcqRel CAS in `publish`.
        decode(self.word.load(Ordering::Acquire))
    }

    /// The current strategy (one Relaxed load; for slow paths of primitives).
    #[inline]
    pub fn strategy(&self) -> Strategy {
        decode(self.word.load(Ordering::Relaxed)).0
    }

    /// The generation of the current strategy (0 until the first publish).
    #[inline]
    pub fn generation(&self) -> u32 {
        decode(self.word.load(Ordering::Relaxed)).1
    }

    /// The spin budget of the current strategy (see [`Strategy::spin_budget`]): `None`
    /// means "use the primitive's default". One Relaxed load.
    #[inline]
    pub fn spin_budget(&self) -> Option<Duration> {
        self.strategy().spin_budget()
    }

    /// Makes `strategy` current for every process using the file and returns its
    /// generation. If it already is current, nothing changes and the current generation
    /// is returned.
    pub fn publish(&self, strategy: Strategy) -> u32 {
        self.publish_installed(strategy).0
    }

    /// [`publish`](Self::publish), also returning the word this call installed (`None`
    /// when the strategy was already current): what a `StrategyChanged` record names,
    /// even if another process publishes again at once.
    pub(crate) fn publish_installed(&self, strategy: Strategy) -> (u32, Option<u64>) {
        let strategy = strategy.normalized();
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let (s, g) = decode(cur);
            if s == strategy {
                return (g, None);
            }
            match self.try_install(cur, g, strategy) {
                Ok(g) => return (g, Some(encode(g, strategy))),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Publishes `strategy` only if the current generation is `expected` (for several
    /// processes running policies on one file: a decision based on an outdated strategy
    /// is refused). Returns the new generation, or the current (strategy, generation).
    ///
    /// # Errors
    /// The current strategy and generation when the generation is not `expected`.
    pub fn publish_if(&self, expected: u32, strategy: Strategy) -> Result<u32, (Strategy, u32)> {
        let strategy = strategy.normalized();
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let (s, g) = decode(cur);
            if g != expected {
                return Err((s, g));
            }
            match self.try_install(cur, g, strategy) {
                Ok(g) => return Ok(g),
                Err(actual) => cur = actual,
            }
        }
    }

    fn try_install(&self, cur: u64, generation: u32, strategy: Strategy) -> Result<u32, u64> {
        let next_gen = generation.wrapping_add(1).max(1);
        // SYNC: handshake word. Pairs with the Acquire load in `current`.
        self.word
            .compare_exchange(
                cur,
                encode(next_gen, strategy),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| {
                // Diagnostic only: may lag the word under concurrent publishes.
                self.updated_ns.store(monotonic_ns(), Ordering::Relaxed);
                self.updated_by.store(
                    u64::from(cxc_mmf::identity::current_pid()),
                    Ordering::Relaxed,
                );
                next_gen
            })
    }

    /// When (`CLOCK_MONOTONIC` ns) and by which pid the strategy was last published; zeros
    /// if never. Diagnostic: not updated atomically with the strategy word.
    pub fn last_update(&self) -> (u64, u32) {
        (
            self.updated_ns.load(Ordering::Relaxed),
            self.updated_by.load(Ordering::Relaxed) as u32,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_default() {
        let hs = HandshakeHeader::new();
        assert_eq!(hs.current(), (Strategy::Default, 0));
        assert_eq!(hs.spin_budget(), None);
        assert_eq!(hs.last_update(), (0, 0));
    }

    #[test]
    fn publish_bumps_generation_once_per_change() {
        let hs = HandshakeHeader::new();
        assert_eq!(hs.publish(Strategy::Park), 1);
        assert_eq!(hs.publish(Strategy::Park), 1);
        assert_eq!(hs.spin_budget(), Some(Duration::ZERO));
        assert_eq!(hs.publish(Strategy::Spin { budget_ns: 5000 }), 2);
        assert_eq!(hs.current(), (Strategy::Spin { budget_ns: 5000 }, 2));
        assert_eq!(hs.last_update().1, std::process::id());
        assert_eq!(hs.publish_if(1, Strategy::Park), Err((hs.strategy(), 2)));
        assert_eq!(hs.publish_if(2, Strategy::Park), Ok(3));
        assert_eq!(hs.publish(Strategy::Default), 4);
    }

    #[test]
    fn parts_round_trip_and_clamp() {
        for s in [
            Strategy::Default,
            Strategy::Park,
            Strategy::Spin { budget_ns: 0 },
            Strategy::Spin {
                budget_ns: Strategy::MAX_PARAM,
            },
            Strategy::Unknown { tag: 9, param: 7 },
        ] {
            assert_eq!(Strategy::from_parts(s.tag(), s.param()), s);
            assert_eq!(decode(encode(77, s)), (s, 77));
        }
        assert_eq!(
            Strategy::spin(Duration::from_secs(1)),
            Strategy::Spin {
                budget_ns: Strategy::MAX_PARAM
            }
        );
        assert_eq!(
            Strategy::Spin {
                budget_ns: u32::MAX
            }
            .normalized(),
            Strategy::Spin {
                budget_ns: Strategy::MAX_PARAM
            }
        );
        // Every bit pattern decodes to something.
        for w in [u64::MAX, 0x0000_00FF_0000_0000, 0x0000_0100_0000_0001] {
            let _ = decode(w);
        }
        assert_eq!(
            decode(u64::MAX).0,
            Strategy::Unknown {
                tag: 0xFF,
                param: Strategy::MAX_PARAM
            }
        );
    }

    #[test]
    fn wraps_past_generation_zero() {
        let hs = HandshakeHeader::new();
        hs.word
            .store(encode(u32::MAX, Strategy::Park), Ordering::Relaxed);
        assert_eq!(hs.publish(Strategy::Default), 1);
    }
}

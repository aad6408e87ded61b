//! [`AdaptiveInstance`]: what a primitive exposes to the sidecar.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use cxc_mmf::Kind;

use crate::handshake::{HandshakeHeader, Strategy};
use crate::op::OpCode;
use crate::ring::ObservationRing;

/// A primitive the [`Sidecar`](crate::Sidecar) can observe and tune: `OwnerLease`,
/// `HeartbeatTable` and `SharedSemaphore` implement it over their mapped files.
///
/// The sidecar calls these methods from its polling thread, never while it holds one of
/// its own locks, so an implementation may do anything (including dropping a
/// [`SidecarBox`](crate::SidecarBox)). They should be cheap: a poll calls
/// [`ring`](Self::ring), [`handshake`](Self::handshake), [`counters`](Self::counters) and
/// [`name`](Self::name) once per instance.
///
/// # Examples
/// A primitive keeps the ring, the handshake and its counters in its file's fixed block:
/// ```
/// use std::sync::atomic::AtomicU64;
/// use cxc_mmf::Kind;
/// use cxc_sidecar::{AdaptiveInstance, HandshakeHeader, ObservationRing, counter_values};
///
/// #[repr(C, align(64))]
/// struct MyState {
///     word: AtomicU64,
///     counters: [AtomicU64; 16],
///     handshake: HandshakeHeader,
///     ring: ObservationRing,
/// }
/// const COUNTER_NAMES: [&str; 2] = ["claims", "releases"];
///
/// struct Mine(Box<MyState>); // in a real primitive: `Mapped<MyState>`
///
/// impl AdaptiveInstance for Mine {
///     fn kind(&self) -> Kind { Kind::Test }
///     fn name(&self) -> String { "mine".into() }
///     fn ring(&self) -> &ObservationRing { &self.0.ring }
///     fn handshake(&self) -> &HandshakeHeader { &self.0.handshake }
///     fn counters(&self) -> Vec<(&'static str, u64)> {
///         counter_values(&COUNTER_NAMES, &self.0.counters)
///     }
/// }
/// ```
pub trait AdaptiveInstance: Send + Sync + 'static {
    /// Which primitive this is.
    fn kind(&self) -> Kind;

    /// A human-readable name, unique enough to tell instances apart (the file's path).
    fn name(&self) -> String;

    /// The observation ring in the instance's file.
    fn ring(&self) -> &ObservationRing;

    /// The handshake block in the instance's file.
    fn handshake(&self) -> &HandshakeHeader;

    /// The cumulative in-file counters, as (name, value) pairs.
    fn counters(&self) -> Vec<(&'static str, u64)>;

    /// Turns recording of observations into the ring on or off for this handle.
    /// [`SidecarBox`](crate::SidecarBox) turns it on when it registers the instance and off
    /// when it unregisters it, so a raw instance records nothing and costs nothing extra.
    /// The default does nothing (an instance that always records).
    fn set_observed(&self, observed: bool) {
        let _ = observed;
    }

    /// Makes `strategy` current for every process using the file; returns its generation.
    /// The default publishes it to the [`handshake`](Self::handshake) and, if that changed
    /// anything, records [`OpCode::StrategyChanged`] in the ring. Override to also adjust
    /// process-local state.
    fn apply(&self, strategy: Strategy) -> u32 {
        let (generation, installed) = self.handshake().publish_installed(strategy);
        if let Some(word) = installed {
            // The word this call installed, not a re-read: another process may publish
            // again in between.
            self.ring().record(OpCode::StrategyChanged, 0, word);
        }
        generation
    }
}

/// Pairs counter names with the values of the in-file counters they name (extra counters
/// without a name are left out).
pub fn counter_values(names: &[&'static str], counters: &[AtomicU64]) -> Vec<(&'static str, u64)> {
    names
        .iter()
        .zip(counters)
        .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
        .collect()
}

/// The id of an instance registered with a [`Sidecar`](crate::Sidecar); never reused
/// within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub(crate) u64);

impl InstanceId {
    /// The id as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

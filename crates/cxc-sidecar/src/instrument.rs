//! [`Instrumented`]: the one shape of a primitive's instrumentation — the [`Observed`]
//! switch of its handle and the counters, handshake and ring of its file's fixed block
//! ([`Instruments`]) — with the methods every primitive shares written once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cxc_mmf::Kind;

use crate::handshake::HandshakeHeader;
use crate::instance::{AdaptiveInstance, counter_values};
use crate::op::OpCode;
use crate::ring::ObservationRing;

/// Whether a [`SidecarBox`](crate::SidecarBox) observes a handle: off until one registers
/// it, so a raw handle records nothing and pays one Relaxed load per [`note`].
///
/// [`note`]: Instrumented::note
#[derive(Debug, Default)]
pub struct Observed(AtomicBool);

impl Observed {
    /// Off.
    pub const fn new() -> Self {
        Observed(AtomicBool::new(false))
    }

    /// Turns observation on or off.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether observation is on.
    #[inline]
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The instrumented parts of one primitive handle, borrowed: its [`Observed`] switch
/// (process-local) and the counters, handshake and ring in its file's fixed block.
#[derive(Debug, Clone, Copy)]
pub struct Instruments<'a> {
    /// Whether a sidecar observes the handle.
    pub observed: &'a Observed,
    /// The cumulative in-file counters.
    pub counters: &'a [AtomicU64],
    /// The names of the counters in use, by index (a prefix of `counters`).
    pub counter_names: &'static [&'static str],
    /// The shared strategy block.
    pub handshake: &'a HandshakeHeader,
    /// The observation ring.
    pub ring: &'a ObservationRing,
}

/// A primitive handle with [`Instruments`]. Every `Instrumented` type that is
/// `Send + Sync + 'static` is an [`AdaptiveInstance`] (its ring, handshake, counters and observed switch are the
/// instruments'), and gets [`note`](Self::note) and [`bump`](Self::bump), so the lease,
/// the heartbeat table, the semaphore and the rwlock share one implementation of each.
pub trait Instrumented {
    /// Which primitive this is.
    fn kind(&self) -> Kind;

    /// A human-readable name (the file's path).
    fn name(&self) -> String;

    /// The handle's instruments.
    fn instruments(&self) -> Instruments<'_>;

    /// Records an observation in the ring if a sidecar observes this handle.
    #[inline]
    fn note(&self, op: OpCode, flags: u16, arg: u64) {
        let i = self.instruments();
        if i.observed.get() {
            record_cold(i.ring, op, flags, arg);
        }
    }

    /// Adds `n` to counter `index` (slow paths only); an index past the counters is
    /// ignored.
    #[inline]
    fn bump(&self, index: usize, n: u64) {
        if let Some(c) = self.instruments().counters.get(index) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

#[cold]
fn record_cold(ring: &ObservationRing, op: OpCode, flags: u16, arg: u64) {
    ring.record(op, flags, arg);
}

impl<T: Instrumented + Send + Sync + 'static> AdaptiveInstance for T {
    fn kind(&self) -> Kind {
        Instrumented::kind(self)
    }

    fn name(&self) -> String {
        Instrumented::name(self)
    }

    fn ring(&self) -> &ObservationRing {
        self.instruments().ring
    }

    fn handshake(&self) -> &HandshakeHeader {
        self.instruments().handshake
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let i = self.instruments();
        counter_values(i.counter_names, i.counters)
    }

    fn set_observed(&self, observed: bool) {
        self.instruments().observed.set(observed);
    }
}

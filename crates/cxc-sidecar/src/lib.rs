//! The cxc sidecar: what cxc primitives record about themselves, the strategy they share
//! through their file, and the machinery that observes and tunes them.
//!
//! # In the file (every primitive embeds these in its fixed block)
//!
//! - [`ObservationRing`]: a fixed-size (64 entries), multi-producer, lossy ring of
//!   [`Observation`]s — sequence, `CLOCK_MONOTONIC` timestamp, pid, [`OpCode`], flags,
//!   argument. Any thread of any process records transitions and slow paths with
//!   [`ObservationRing::record`]; any process (or the `cxc` CLI) reads them with
//!   [`ObservationRing::read_since`], which validates every entry and never returns a torn
//!   one.
//! - [`HandshakeHeader`]: the current [`Strategy`] (how a blocked acquirer waits: spin
//!   budget before parking) and its generation, so a decision taken in one process applies
//!   to every process using the file.
//!
//! Both are plain `#[repr(C, align(64))]` structs of atomics whose all-zero state is valid
//! (an empty ring, [`Strategy::Default`]): a zero-filled new file needs no initialisation.
//!
//! # In the process
//!
//! - [`AdaptiveInstance`]: the trait a primitive implements — kind, name, ring, handshake,
//!   counters, [`apply`](AdaptiveInstance::apply) a strategy.
//! - [`Instrumented`]: how the cxc primitives implement it — one [`Instruments`] view
//!   (their handle's [`Observed`] switch, their file's counters, handshake and ring) and
//!   the shared `note`/`bump` methods.
//! - [`SidecarBox`]: owns an instance and keeps it registered with the process-global
//!   [`Sidecar`] until dropped; derefs to it. Raw `create()`/`open()` stay unregistered
//!   and pay nothing extra.
//! - [`Sidecar`]: [`poll`](Sidecar::poll) drains new observations of all registered
//!   instances, updates their [`Stats`] and runs their [`Policy`]s;
//!   [`spawn`](Sidecar::spawn) runs that on a background thread ([`SidecarThread`]);
//!   [`instances`](Sidecar::instances) lists them ([`InstanceInfo`]).
//! - [`Policy`]: turns observations into a strategy; [`Hysteresis`] keeps it from
//!   flapping. Built in: [`AdaptiveSpin`], which sizes the spin budget from observed wait
//!   durations.
//! - Feature `metrics`: every poll also exports the counters and stats through the
//!   [`metrics`](https://docs.rs/metrics) facade.
//!
//! See `docs/sidecar.md` for what each primitive records and how to write a policy.
//!
//! # Examples
//! ```standalone_crate
//! use std::sync::atomic::AtomicU64;
//! use std::time::Duration;
//! use cxc_mmf::Kind;
//! use cxc_sidecar::{
//!     AdaptiveInstance, AdaptiveSpin, HandshakeHeader, ObservationRing, OpCode, Sidecar,
//!     SidecarBox, Strategy, counter_values, flags,
//! };
//!
//! // A primitive's state; in a real primitive it lives in its file (`Mapped<State>`).
//! #[derive(Default)]
//! struct State {
//!     counters: [AtomicU64; 1],
//!     handshake: HandshakeHeader,
//!     ring: ObservationRing,
//! }
//! struct Prim(Box<State>);
//!
//! impl AdaptiveInstance for Prim {
//!     fn kind(&self) -> Kind { Kind::Test }
//!     fn name(&self) -> String { "example".into() }
//!     fn ring(&self) -> &ObservationRing { &self.0.ring }
//!     fn handshake(&self) -> &HandshakeHeader { &self.0.handshake }
//!     fn counters(&self) -> Vec<(&'static str, u64)> {
//!         counter_values(&["blocked_waits"], &self.0.counters)
//!     }
//! }
//!
//! let prim = SidecarBox::with_policy(Prim(Box::default()), AdaptiveSpin::new());
//! // The primitive's blocking slow path: consult the strategy, record the wait.
//! for _ in 0..64 {
//!     let _budget = prim.handshake().spin_budget().unwrap_or(Duration::from_micros(2));
//!     prim.ring().record(OpCode::LeaseBlockedWait, flags::WAIT_SPUN, 3_000);
//!     Sidecar::global().poll();
//! }
//! // Short waits: AdaptiveSpin chose to spin, for every process using the file.
//! assert!(matches!(prim.handshake().strategy(), Strategy::Spin { .. }));
//! assert!(prim.stats().waits.count >= 64);
//! ```

#![deny(unsafe_code)]

mod boxed;
mod clock;
#[cfg(feature = "metrics")]
mod export;
mod handshake;
mod instance;
mod instrument;
mod op;
mod policy;
mod ring;
mod sidecar;
mod stats;

pub use boxed::SidecarBox;
pub use clock::monotonic_ns;
pub use handshake::{HandshakeHeader, Strategy};
pub use instance::{AdaptiveInstance, InstanceId, counter_values};
pub use instrument::{Instrumented, Instruments, Observed};
pub use op::{OpCode, flags};
pub use policy::{AdaptiveSpin, AdaptiveSpinConfig, Hysteresis, Policy};
pub use ring::{Observation, ObservationRing, RING_CAPACITY, ReadBatch};
pub use sidecar::{InstanceInfo, InstanceReport, PollReport, Sidecar, SidecarThread};
pub use stats::{Stats, WaitHistogram};

//! The fenced lease and permit pool of `cxc`, on etcd: the same claims, fencing tokens
//! and crash recovery as the mapped-file primitives, across machines.
//!
//! - [`Etcd`] / [`EtcdOptions`]: a connection (async client + one runtime thread behind a
//!   blocking API), the session TTL and how sessions are kept alive ([`KeepAlive`]).
//! - [`EtcdLease<T>`]: [`FencedLease`] on etcd. A claim is the first contender key
//!   under `<name>/`, created under the holder's session; its create revision is the generation (fencing token);
//!   owner operations are transactions comparing that revision, so etcd itself refuses a
//!   stale claim's write or release. The keys follow etcd's own lock recipe, so
//!   `etcdctl lock` and Go's `concurrency.Mutex` exclude it on the same name.
//! - [`EtcdSemaphore`]: [`PermitPool`] on etcd: at most `max` holder keys, each under its
//!   holder's session, so a dead holder's permits come back when its session expires.
//!   Each [`EtcdPermit`] carries a fencing token, and a loss check tells a holder that
//!   its permit is lost; [`EtcdPermitGuard`] is the RAII form (gives back on drop).
//! - [`EtcdElection`]: leader election ([`ElectionBackend`]) with etcd's own recipe
//!   (`concurrency.Election`, `etcdctl elect`), and [`EtcdFencedKey`], a
//!   [`FencedResource`] that refuses writes with older tokens.
//! - [`EtcdError`]: what can go wrong (contention is not an error).
//!
//! The traits live in [`cxc_sync::backend`]; code written against them runs on
//! [`cxc_sync::MmapLease`] / [`cxc_sync::SharedSemaphore`] or on these types, changing only
//! the constructor (`examples/switch_backend.rs`). When to use which, the fencing argument
//! and measured latencies: `docs/etcd.md`.
#![forbid(unsafe_code)]

mod conn;
mod contend;
mod election;
mod error;
mod fenced_key;
mod lease;
mod permit;
mod semaphore;
mod session;
mod txn;
mod wait;

pub use conn::{Etcd, EtcdOptions, KeepAlive};
pub use cxc_sync::election::{ElectionBackend, FencedResource};
pub use cxc_sync::{FencedLease, PermitPool};
pub use election::{EtcdElection, EtcdTerm};
pub use error::EtcdError;
pub use fenced_key::EtcdFencedKey;
pub use lease::{EtcdClaim, EtcdLease};
pub use permit::EtcdPermitGuard;
pub use semaphore::{EtcdPermit, EtcdSemaphore};
pub use session::KeepAliveStats;

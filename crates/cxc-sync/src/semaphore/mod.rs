//! `SharedSemaphore`: a counting semaphore in one mapped file, with crash recovery.
//!
//! - `word`: bit layouts of the count, book and owner words.
//! - `layout`: the on-file head block and holder slots.
//! - `raw`: the protocol: count-word transitions with helping.
//! - `table`: the holder table: registration, takeover of dead holders, drain, free.
//! - `wake`: the sleepers flag and the sleep/wake handshake.
//! - `handle`: the public type and its file; `holder`: its holder slot and reclaim;
//!   `ops`: acquire, release, [`Permit`]; `stats`: counters and table snapshot;
//!   `snapshot`: the read-only view of a file ([`SharedSemaphore::inspect`]).
//!
//! # State
//!
//! The pool is one 64-bit *count word* `(avail, op, author, seq)`; each process that
//! acquires gets a *holder slot* with a *book* word `(held, applied)`. A transition
//! (acquire, release, reclaim step) is one CAS on the count word naming its author; the
//! author's book is updated afterwards by the author or by whoever touches the count
//! word next ("helping"), so a process killed between the two steps loses nothing.
//!
//! | count word                     | meaning                                          |
//! |--------------------------------|--------------------------------------------------|
//! | `author = 0`                   | no bookkeeping outstanding                       |
//! | `author = a`, `applied(a) = seq` | `a`'s change is recorded in its book           |
//! | `author = a`, `applied(a) ≠ seq` | `a`'s change is pending: the next CAS'er helps |
//!
//! The full protocol and its correctness argument: `docs/shared-semaphore.md`.
#![cfg_attr(cxc_loom, allow(dead_code))]

mod error;
mod layout;
mod raw;
mod table;
mod wake;
pub(crate) mod word;

#[cfg(cxc_loom)]
pub(crate) mod model;

#[cfg(all(feature = "async", not(cxc_loom)))]
mod async_hooks;
crate::macros::not_loom! {
    mod guards;
    mod handle;
    mod holder;
    mod ops;
    mod snapshot;
    mod stats;
}

#[cfg(all(test, cxc_loom))]
mod loom_tests;

pub use error::{SemaphoreError, SemaphoreOptions};
crate::macros::not_loom! {
    pub use guards::{ManyPermits, OwnedPermit};
    pub use handle::SharedSemaphore;
    pub use ops::Permit;
    pub use snapshot::SemaphoreSnapshot;
    pub use stats::{HolderInfo, SemaphoreStats};
}
#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use async_hooks::HolderWatch;
#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use ops::RECLAIM_EVERY;

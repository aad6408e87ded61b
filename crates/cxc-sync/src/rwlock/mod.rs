//! `SharedRwLock<T>`: many readers or one writer across processes, in one mapped file,
//! surviving dead readers and dead or stopped writers (`docs/shared-rwlock.md`).
//!
//! - `word`: the state word (writer, buffers, quarantine, token).
//! - `layout`: the on-file head block and holder slots.
//! - `raw`: the protocol (read counts per process, the writer's claim and drain,
//!   staging, publication); `evict`: eviction, quarantine, dead holders.
//! - `handle`: the public type, its file, the holder table; `ops`: locking; `guards`:
//!   the RAII guards; `wait`, `seen`: the pieces of a blocked caller.
//!
//! # State
//!
//! | state word `WRITER` | Σ `readers[i]` | meaning                                        |
//! |---------------------|----------------|------------------------------------------------|
//! | 0                   | any            | free or read-locked; readers enter             |
//! | `w`                 | > 0            | `w` draining: new readers back off, `w` waits  |
//! | `w`                 | 0 (after drain)| write-locked by `w`                            |
//!
//! A reader's count is visible at an instant when its `try_read` may still back off, so
//! "Σ > 0 with a writer" also covers readers about to leave.
#![cfg_attr(cxc_loom, allow(dead_code))]

mod evict;
mod layout;
mod raw;
mod word;

#[cfg(all(feature = "async", not(cxc_loom)))]
mod async_hooks;
crate::macros::not_loom! {
    mod error;
    mod guards;
    mod handle;
    mod ops;
    mod seen;
    mod snapshot;
    mod wait;
}

#[cfg(all(test, cxc_loom))]
mod loom_tests;

#[cfg(all(feature = "async", not(cxc_loom)))]
pub(crate) use async_hooks::{Claim, Drained};
pub use layout::{PAYLOAD_BYTES, RwLockStats};
crate::macros::not_loom! {
    pub use error::{RwLockError, RwLockOptions, WriteGuardError};
    pub use guards::{ReadGuard, WriteGuard};
    pub use handle::SharedRwLock;
    pub use snapshot::{RwHolderInfo, RwLockSnapshot};
}

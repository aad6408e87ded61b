//! cxc: cross-process synchronization primitives that live in memory-mapped files.
//!
//! This facade re-exports the public API of the cxc crates; it holds no logic.
#![forbid(unsafe_code)]

pub use cxc_mmf as mmf;
pub use cxc_mmf::{Kind, MmfError};
pub use cxc_sync::{
    HolderInfo, Permit, SemaphoreError, SemaphoreOptions, SemaphoreStats, SharedSemaphore,
};

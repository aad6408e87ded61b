//! Cross-process synchronization primitives that live in memory-mapped files.
//!
//! - [`epoch`]: manual or clock-driven epochs, the time base of heartbeats.
//! - [`liveness`]: process identity (pid + start time) and whether it is still alive.
//! - [`SharedSemaphore`]: a counting semaphore with crash recovery (like `SEM_UNDO`).

pub mod epoch;
pub(crate) mod futex;
pub mod liveness;
pub(crate) mod primitive;
mod semaphore;

pub use epoch::EpochMode;
#[cfg(not(cxc_loom))]
pub use semaphore::{HolderInfo, Permit, SemaphoreStats, SharedSemaphore};
pub use semaphore::{SemaphoreError, SemaphoreOptions};

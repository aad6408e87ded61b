//! [`SeqLock<T>`]: a sequence lock whose readers never block and never see a torn value,
//! and whose writers never wait for each other and survive each other's stalls and
//! deaths; [`SharedCell<T>`]: the same in a file of its own (`docs/seqlock.md`,
//! `docs/shared-cell.md`).

#[cfg(not(cxc_loom))]
mod cell;
#[cfg(not(cxc_loom))]
mod claim;
#[cfg(not(cxc_loom))]
mod handle;
#[cfg(not(cxc_loom))]
mod lane;
#[cfg(all(test, cxc_loom))]
mod loom_tests;
#[cfg(not(cxc_loom))]
mod snapshot;
mod state;

#[cfg(not(cxc_loom))]
pub use cell::SharedCell;
#[cfg(not(cxc_loom))]
pub use handle::{Abandoned, DEFAULT_STALL_TIMEOUT, SeqLock, SeqLockError, WriteError, Written};
#[cfg(not(cxc_loom))]
pub use snapshot::CellStatus;

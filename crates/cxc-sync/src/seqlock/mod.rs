//! [`SeqLock<T>`]: a sequence lock whose readers never block and never see a torn value,
//! and whose writers never wait for each other and survive each other's stalls and
//! deaths; [`SharedCell<T>`]: the same in a file of its own (`docs/seqlock.md`,
//! `docs/shared-cell.md`).

mod state;

crate::macros::not_loom! {
    mod cell;
    mod claim;
    mod handle;
    mod lane;
    mod snapshot;
}

#[cfg(all(test, cxc_loom))]
mod loom_tests;

crate::macros::not_loom! {
    pub use cell::SharedCell;
    pub use handle::{Abandoned, DEFAULT_STALL_TIMEOUT, SeqLock, SeqLockError, WriteError, Written};
    pub use snapshot::CellStatus;
}

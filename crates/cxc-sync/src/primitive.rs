//! The atomics shim: core atomics normally, loom's under `cfg(cxc_loom)`.
//!
//! Protocol code uses only these names, so the same code runs in the loom models (on
//! heap-allocated state) and on mapped files.

#[cfg(cxc_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, fence};
#[cfg(not(cxc_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, fence};

pub(crate) use std::sync::atomic::Ordering;

/// Called inside every retry loop: a CPU pause normally, a scheduler yield under loom (so
/// the model checker can explore the other threads).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(cxc_loom)]
    loom::thread::yield_now();
    #[cfg(not(cxc_loom))]
    std::hint::spin_loop();
}

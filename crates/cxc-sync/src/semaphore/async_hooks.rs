//! What the async reactor needs of a semaphore (feature `async`).

use super::handle::SharedSemaphore;

impl SharedSemaphore {
    /// Address of the wake word (the key of this handle's reactor group).
    pub(crate) fn wake_addr(&self) -> usize {
        std::ptr::from_ref(&self.map.head().wake) as usize
    }

    /// Permits available, read with a read-modify-write (the parking protocol's
    /// re-check, see `park.rs`).
    pub(crate) fn recheck_available(&self) -> u32 {
        self.raw().recheck()
    }

    /// Whether this process has its holder slot (without registering).
    pub(crate) fn has_slot(&self) -> bool {
        self.holder.get(crate::liveness::current_proc()).is_some()
    }

    /// Tries to get this process's holder slot now (a forked child that found the table
    /// full); whether it has one.
    pub(crate) fn try_register(&self) -> bool {
        self.holder_slow().is_ok()
    }
}

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
}

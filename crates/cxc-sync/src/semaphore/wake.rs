//! Sleeping and waking: the sleepers flag in the wake word, the waiter's re-check, and
//! waking one sleeper per permit.
//!
//! Wake word (`SemHead::wake`, the futex word): the protocol of `park.rs` (bit 0 =
//! sleepers, bits 1..32 = wake sequence), shared with the lease.

use super::layout::ctr;
use super::raw::RawSemaphore;
use super::word::CountWord;
use crate::primitive::Ordering;

impl RawSemaphore<'_> {
    /// A blocked acquirer's re-check after [`RawSemaphore::announce_sleeper`]: permits
    /// available, read with a read-modify-write (adding 0) so that it is ordered with
    /// every releaser's CAS, see `announce_sleeper`.
    pub(crate) fn recheck(&self) -> u32 {
        // SYNC: sleep/wake (RMW on the count; pairs with the releaser's CAS).
        CountWord(self.head.count.fetch_add(0, Ordering::SeqCst)).avail()
    }

    /// Before sleeping: makes sure the sleepers flag is set and returns the wake-word
    /// value to sleep on. The caller must then [`recheck`](RawSemaphore::recheck) the
    /// count and sleep only if there is still nothing to take.
    ///
    /// No lost wake-up, with acquire/release reasoning only (no reliance on SeqCst
    /// loads, which loom cannot check): every write to the count word is a
    /// read-modify-write, and so is the waiter's re-check. In the count word's
    /// modification order, either the releaser's CAS comes first, and the re-check sees
    /// its permit; or the re-check comes first, and then the releaser's CAS reads from
    /// the re-check's release sequence, so the waiter's flag write (or the load that saw
    /// the flag) happens before the releaser's load of the wake word, which therefore
    /// sees the flag or a later value. A later value means the wake word changed, so the
    /// waiter's futex wait returns at once.
    pub(crate) fn announce_sleeper(&self) -> u32 {
        crate::park::announce(&self.head.wake)
    }

    /// After a release: whether someone may be sleeping (one SeqCst load).
    #[inline]
    pub(crate) fn has_sleepers(&self) -> bool {
        crate::park::has_sleepers(&self.head.wake)
    }

    /// Clears the sleepers flag, bumps the wake sequence and wakes up to `n` sleepers.
    /// A woken waiter sets the flag again before it re-checks, and one that takes a
    /// permit while more remain wakes the next, so waking one per permit loses no one.
    /// A flag left by a waiter that died costs one wake system call, once.
    pub(crate) fn wake_sleepers(&self, n: u32) -> bool {
        #[cfg(cxc_loom)]
        let model = self.futex.map(crate::park::ModelFutexRef);
        #[cfg(not(cxc_loom))]
        let model: Option<crate::park::ModelFutexRef<'_>> = None;
        let woke = crate::park::wake(&self.head.wake, n, model.as_ref());
        if woke {
            self.bump(ctr::WAKES, 1);
        }
        woke
    }

    /// A waiter leaving the blocking path while permits remain wakes the next sleeper:
    /// it may have consumed the wake-up that was meant for it.
    pub(crate) fn pass_on(&self) {
        if self.available() > 0 && self.has_sleepers() {
            self.wake_sleepers(1);
        }
    }
}

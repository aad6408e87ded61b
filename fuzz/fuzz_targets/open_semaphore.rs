//! `SharedSemaphore::open` on arbitrary bytes, then state reads, a try-acquire/release
//! round (registering this process as a holder) and a dead-holder reclaim.
#![no_main]

use cxc_sync::SharedSemaphore;

cxc_fuzz::fuzz_opened!(SharedSemaphore::open, |sem, _path| {
    cxc_fuzz::call_each!(sem; available, max_permits, holder_capacity, holders, stats, strategy,
        recent_observations, reclaim_dead, register);
    if let Some(permit) = sem.try_acquire() {
        let _ = sem.holders();
        drop(permit);
    }
    if let Some(permit) = sem.try_acquire() {
        permit.disown();
        let _ = sem.release();
    }
    cxc_fuzz::call_each!(sem; available, holders);
});

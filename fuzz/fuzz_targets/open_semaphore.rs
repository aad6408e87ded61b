//! `SharedSemaphore::open` on arbitrary bytes, then state reads, a try-acquire/release
//! round (registering this process as a holder) and a dead-holder reclaim.
#![no_main]

use cxc_fuzz::write_input;
use cxc_sync::SharedSemaphore;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = write_input(data);
    let Ok(sem) = SharedSemaphore::open(path) else {
        return;
    };
    let _ = sem.available();
    let _ = sem.max_permits();
    let _ = sem.holder_capacity();
    let _ = sem.holders();
    let _ = sem.stats();
    let _ = sem.strategy();
    let _ = sem.recent_observations();
    let _ = sem.reclaim_dead();
    let _ = sem.register();
    if let Some(permit) = sem.try_acquire() {
        let _ = sem.holders();
        drop(permit);
    }
    if let Some(permit) = sem.try_acquire() {
        permit.disown();
        let _ = sem.release();
    }
    let _ = sem.available();
    let _ = sem.holders();
});

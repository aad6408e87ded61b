//! `OwnerLease::open` (two payload types) and `lease::inspect` on arbitrary bytes, then
//! status reads and a claim/read/write/release round with a fake and with our own pid.
#![no_main]

use cxc_fuzz::{FAKE_PID, write_input};
use cxc_sync::OwnerLease;
use libfuzzer_sys::fuzz_target;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

fn exercise<T: FromBytes + IntoBytes + Immutable + KnownLayout>(path: &std::path::Path) {
    let Ok(lease) = OwnerLease::<T>::open(path) else {
        return;
    };
    cxc_fuzz::call_each!(lease; status, current_owner, current_claim, current_epoch, lease_term,
        payload_torn, epoch_mode, preemption);
    let _ = format!("{lease:?}");
    // A claimant that is not this process (no OS checks of its own identity).
    if let Some(claim) = lease.try_claim(FAKE_PID, 1) {
        let _ = lease.read_claimed(&claim);
        let _ = lease.write_claimed(&claim, T::new_zeroed());
        let _ = lease.beat_claimed(&claim);
        let _ = lease.is_current(&claim);
        let _ = lease.release_claim(&claim);
    }
    let _ = lease.release(FAKE_PID);
    // Pid 1 preempts any other holder under `Preemption::LowerPid`.
    if lease.try_acquire(1, 0) {
        let _ = lease.release(1);
    }
    // This process: registers its identity, judges the holder's liveness.
    let me = std::process::id();
    let _ = lease.with_lease(me, 1, |v| {
        *v = T::new_zeroed();
    });
    if lease.try_acquire(me, 1) {
        let _ = lease.read_as_owner(me);
        let _ = lease.write_as_owner(me, T::new_zeroed());
        let _ = lease.beat(me);
        let _ = lease.release(me);
    }
    let _ = lease.tick_epoch();
    let _ = lease.status();
}

fuzz_target!(|data: &[u8]| {
    let path = write_input(data);
    let _ = cxc_sync::lease::inspect(path);
    exercise::<u64>(path);
    exercise::<[u64; 6]>(path);
});

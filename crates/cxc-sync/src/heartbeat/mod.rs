//! Worker heartbeats with in-flight work tracking ([`HeartbeatTable`]) and failover of
//! dead workers' work ([`FailoverWatchdog`]), in one mapped file.
//!
//! Properties (`docs/design.md` §3):
//! - **H1** snapshots are consistent: pid, generation, FENCED, last seen, start time and
//!   bitmap all belong to one registration; the read retries a bounded number of times
//!   and never waits on a writer, so a crashed process cannot stall it.
//! - **H2** reclaim takes a dead slot's bits atomically (each bit is returned by exactly
//!   one `reclaim`, even with several watchdogs); `clear_dead_bitmap` erases only the
//!   reported bits; neither touches a slot that was re-registered since the scan.
//! - **H3** a fenced worker learns it: its next `beat`/`mark_in_flight`/`clear_in_flight`
//!   return false, and no write of it can reach the slot's next registration.
//! - **H4** dead slots are reused: `register` takes free slots, fenced slots whose bits
//!   were reclaimed, and slots whose process is dead by OS identity and holds no bits.
//!
//! Layout, protocol and pitfalls: `docs/heartbeat.md` and `docs/failover-watchdog.md`.

mod error;
mod layout;
mod slot;
crate::macros::not_loom! {
    mod guard;
    mod snapshot;
    mod table;
    mod watchdog;
}

#[cfg(all(test, cxc_loom))]
mod loom_tests;

pub use error::HeartbeatError;
pub use layout::HeartbeatStats;
pub use layout::MAX_CAPACITY as HEARTBEAT_MAX_CAPACITY;
pub use layout::counter as heartbeat_counter;
pub use slot::HeartbeatSnapshot;
crate::macros::not_loom! {
    pub use guard::{OwnedRegistration, Registration};
    pub use snapshot::HeartbeatTableSnapshot;
    pub use table::{HeartbeatOptions, HeartbeatTable};
    pub use watchdog::{
        DEFAULT_GRACE_EPOCHS, DEFAULT_OS_CHECK_INTERVAL, FailoverWatchdog, InFlightBits,
        ReclaimReport,
    };
}

//! `HeartbeatTable::open_any` on arbitrary bytes, then snapshots of every slot, a
//! register/beat/in-flight/unregister round and a watchdog scan.
#![no_main]

use cxc_fuzz::FAKE_PID;
use cxc_sync::{FailoverWatchdog, HeartbeatTable};

cxc_fuzz::fuzz_opened!(HeartbeatTable::open_any, |table, path| {
    let cap = table.capacity();
    let _ = HeartbeatTable::open(path, cap);
    cxc_fuzz::call_each!(table; epoch_mode, global_epoch, counters, strategy, recent_observations);
    for slot in 0..=cap {
        let _ = table.snapshot(slot);
    }
    if let Ok(slot) = table.register(FAKE_PID) {
        let _ = table.beat(slot);
        let _ = table.mark_in_flight(slot, 63);
        let _ = table.clear_in_flight(slot, 63);
        let _ = table.mark_in_flight(slot, 0);
        let _ = table.unregister(slot);
    }
    let _ = table.beat(cap);
    let _ = table.mark_in_flight(cap, 64);
    let watchdog = FailoverWatchdog::new(&table);
    let report = watchdog.scan();
    for (slot, snap) in &report.dead_slots {
        let _ = FailoverWatchdog::iter_in_flight_bits(snap.in_flight_bitmap).count();
        let _ = watchdog.reclaim_snapshot(*slot, snap);
    }
    let _ = watchdog.sweep_idle();
    let _ = table.tick_global_epoch();
});

//! Unit tests of `HeartbeatTable` and `FailoverWatchdog`: the seed's behaviours and the
//! properties H1-H4 (`docs/design.md` §3), in one process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatError, HeartbeatOptions, HeartbeatTable,
    heartbeat_counter as counter,
};

// ---- allocation counting (per thread, so parallel tests do not disturb each other) ----

struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count_alloc() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are ours; the thread-local counter neither allocates nor unwinds.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        // SAFETY: forwarded contract of `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract of `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_alloc();
        // SAFETY: forwarded contract of `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCS.with(|c| c.get())
}

// ---- helpers ----

/// A pid no process has (above the largest pid_max), so no OS identity is recorded and
/// only staleness applies.
const FAKE: u32 = 4_100_000;

fn table(capacity: usize) -> (tempfile::TempDir, HeartbeatTable) {
    let dir = tempfile::tempdir().unwrap();
    let t = HeartbeatTable::create(dir.path().join("hb.cxc"), capacity).unwrap();
    (dir, t)
}

/// A table of `capacity` slots with one (fake) worker registered, which marked `bits`
/// in flight: the directory, the table, the worker's slot.
fn worker(capacity: usize, bits: &[u8]) -> (tempfile::TempDir, HeartbeatTable, usize) {
    let (d, t) = table(capacity);
    let s = t.register(FAKE).unwrap();
    for &b in bits {
        assert!(t.mark_in_flight(s, b));
    }
    (d, t, s)
}

/// Scans `n` times and returns the last report.
fn scan_n(w: &FailoverWatchdog<'_>, n: usize) -> cxc_sync::ReclaimReport {
    let mut r = w.scan();
    for _ in 1..n {
        r = w.scan();
    }
    r
}

// ---- the seed's behaviours ----

#[test]
fn all_alive_reports_nothing() {
    let (_d, t) = table(8);
    let slots: Vec<usize> = (0..4).map(|i| t.register(FAKE + i).unwrap()).collect();
    let w = FailoverWatchdog::new(&t);
    assert_eq!(w.grace(), 3);
    for round in 0..10 {
        for &s in &slots {
            assert!(t.mark_in_flight(s, (round % 64) as u8));
            assert!(t.beat(s));
        }
        let r = w.scan();
        assert!(r.dead_slots.is_empty(), "round {round}: {:?}", r.dead_slots);
        assert_eq!(r.new_global_epoch, round + 1);
    }
}

#[test]
fn grace_exceeded_is_dead_and_lag_equal_to_grace_is_alive() {
    let (_d, t, s) = worker(4, &[9]);
    let w = FailoverWatchdog::with_grace(&t, 3);
    // Registered at epoch 0; scans tick to 1, 2, 3: lag 3 == grace is still alive.
    let r = scan_n(&w, 3);
    assert_eq!(r.new_global_epoch, 3);
    assert!(r.dead_slots.is_empty());
    let r = w.scan();
    assert_eq!(r.new_global_epoch, 4);
    assert_eq!(r.dead_slots.len(), 1);
    let (slot, snap) = r.dead_slots[0];
    assert_eq!(slot, s);
    assert_eq!(snap.pid, FAKE);
    assert_eq!(snap.last_seen_epoch, 0);
    assert_eq!(snap.in_flight_bitmap, 1 << 9);
    assert!(!snap.fenced);
}

#[test]
fn stale_slot_without_bits_is_not_reported() {
    let (_d, t) = table(2);
    t.register(FAKE).unwrap();
    let w = FailoverWatchdog::with_grace(&t, 1);
    assert!(scan_n(&w, 10).dead_slots.is_empty());
}

#[test]
fn iter_in_flight_bits_yields_set_bits_in_order() {
    let bits: Vec<u8> = FailoverWatchdog::iter_in_flight_bits(0).collect();
    assert!(bits.is_empty());
    let map = (1u64 << 0) | (1 << 5) | (1 << 31) | (1 << 32) | (1 << 63);
    let it = FailoverWatchdog::iter_in_flight_bits(map);
    assert_eq!(it.len(), 5);
    assert_eq!(it.collect::<Vec<_>>(), vec![0, 5, 31, 32, 63]);
    let all: Vec<u8> = FailoverWatchdog::iter_in_flight_bits(u64::MAX).collect();
    assert_eq!(all, (0..64).collect::<Vec<u8>>());
}

#[test]
fn clear_dead_bitmap_silences_re_reports() {
    let (_d, t, s) = worker(4, &[1, 40]);
    let w = FailoverWatchdog::with_grace(&t, 0);
    let r = scan_n(&w, 2);
    assert_eq!(r.dead_slots.len(), 1);
    assert_eq!(w.clear_dead_bitmap(s), (1 << 1) | (1 << 40));
    assert!(w.scan().dead_slots.is_empty());
    assert!(w.scan().dead_slots.is_empty());
    // Clearing fenced the slot: the worker learns it was declared dead.
    assert!(!t.beat(s));
}

// ---- bounds (the seed's beat(50_000_000) segfaulted) ----

#[test]
fn out_of_range_slots_and_bits_are_rejected() {
    let (_d, t, s) = worker(4, &[]);
    assert!(!t.beat(50_000_000));
    assert!(!t.beat(4));
    assert!(!t.beat(usize::MAX));
    assert!(!t.mark_in_flight(50_000_000, 0));
    assert!(!t.clear_in_flight(50_000_000, 0));
    assert!(!t.mark_in_flight(s, 64));
    assert!(!t.mark_in_flight(s, 255));
    assert!(!t.clear_in_flight(s, 64));
    assert!(t.snapshot(4).is_none());
    assert!(t.snapshot(usize::MAX).is_none());
    assert!(!t.unregister(50_000_000));
    let w = FailoverWatchdog::new(&t);
    assert_eq!(w.reclaim(50_000_000), 0);
    assert_eq!(w.clear_dead_bitmap(50_000_000), 0);
    let snap = t.snapshot(s).unwrap();
    assert_eq!(w.reclaim_snapshot(50_000_000, &snap), 0);
    assert_eq!(t.snapshot(s).unwrap().in_flight_bitmap, 0);
    assert!(t.counters()[counter::OUT_OF_RANGE] >= 9);
    // Bit 63 is the last valid bit.
    assert!(t.mark_in_flight(s, 63));
    assert_eq!(t.snapshot(s).unwrap().in_flight_bitmap, 1 << 63);
}

#[test]
fn full_table_invalid_pid_and_capacity_are_errors() {
    let (_d, t) = table(2);
    t.register(FAKE).unwrap();
    t.register(FAKE + 1).unwrap();
    assert!(matches!(
        t.register(FAKE + 2),
        Err(HeartbeatError::TableFull)
    ));
    assert!(matches!(t.register(0), Err(HeartbeatError::InvalidPid)));
    assert_eq!(t.counters()[counter::TABLE_FULL], 1);
    let dir = tempfile::tempdir().unwrap();
    for bad in [0usize, 65_537, usize::MAX] {
        let e = HeartbeatTable::create(dir.path().join("x.cxc"), bad).unwrap_err();
        assert!(matches!(e, HeartbeatError::InvalidCapacity { requested, .. } if requested == bad));
    }
    assert!(!dir.path().join("x.cxc").exists());
}

// ---- H3: fencing ----

#[test]
fn reclaimed_worker_is_fenced_and_can_register_again() {
    let (_d, t, s) = worker(4, &[3]);
    let w = FailoverWatchdog::with_grace(&t, 1);
    let r = scan_n(&w, 2);
    assert_eq!(r.dead_slots.len(), 1);
    assert_eq!(w.reclaim(s), 1 << 3);
    // The worker comes back: everything it tries fails, nothing is resurrected.
    assert!(!t.beat(s));
    assert!(!t.mark_in_flight(s, 4));
    assert!(!t.clear_in_flight(s, 3));
    let snap = t.snapshot(s).unwrap();
    assert!(snap.fenced);
    assert_eq!(snap.in_flight_bitmap, 0);
    assert_eq!(
        snap.last_seen_epoch, 0,
        "a fenced beat must not move last_seen"
    );
    assert!(t.counters()[counter::FENCED_REJECT] >= 3);
    // Re-registering gives a fresh generation.
    let s2 = t.register(FAKE).unwrap();
    let snap2 = t.snapshot(s2).unwrap();
    assert!(!snap2.fenced);
    assert!(t.beat(s2));
    if s2 == s {
        assert_eq!(snap2.generation, snap.generation + 1);
    }
}

#[test]
fn reclaim_takes_bits_marked_after_the_scan() {
    let (_d, t, s) = worker(2, &[1]);
    let w = FailoverWatchdog::with_grace(&t, 0);
    assert_eq!(scan_n(&w, 2).dead_slots.len(), 1);
    t.mark_in_flight(s, 2); // after the scan
    assert_eq!(w.reclaim(s), 0b110);
    assert_eq!(w.reclaim(s), 0, "reclaimed twice");
}

// ---- H2: clear/reclaim act only on what the scan saw ----

#[test]
fn bits_marked_after_the_scan_survive_clear_dead_bitmap() {
    let (_d, t, s) = worker(2, &[1]);
    let w = FailoverWatchdog::with_grace(&t, 0);
    let r = scan_n(&w, 2);
    assert_eq!(r.dead_slots[0].1.in_flight_bitmap, 1 << 1);
    assert!(t.mark_in_flight(s, 2)); // the slow worker marks a new unit after the scan
    assert_eq!(w.clear_dead_bitmap(s), 1 << 1);
    let snap = t.snapshot(s).unwrap();
    assert_eq!(snap.in_flight_bitmap, 1 << 2, "a post-scan bit was erased");
    // The fenced slot is reported again with the surviving bit, and reclaimed.
    let r = w.scan();
    assert_eq!(r.dead_slots.len(), 1);
    assert_eq!(r.dead_slots[0].1.in_flight_bitmap, 1 << 2);
    assert!(r.dead_slots[0].1.fenced);
    assert_eq!(w.reclaim(s), 1 << 2);
    assert!(w.scan().dead_slots.is_empty());
}

#[test]
fn re_registered_slot_is_untouched_by_stale_clear_and_reclaim() {
    let (_d, t, s) = worker(1, &[7]);
    let a = FailoverWatchdog::with_grace(&t, 0);
    let b = FailoverWatchdog::with_grace(&t, 0);
    assert_eq!(scan_n(&a, 2).dead_slots.len(), 1);
    assert_eq!(b.scan().dead_slots.len(), 1);
    assert_eq!(b.reclaim(s), 1 << 7);
    // A new worker takes the reclaimed slot (capacity 1: it must be this one).
    let s2 = t.register(FAKE + 1).unwrap();
    assert_eq!(s2, s);
    assert!(t.mark_in_flight(s2, 7));
    assert!(t.mark_in_flight(s2, 8));
    // Watchdog A still holds its stale report of the old registration.
    assert_eq!(a.clear_dead_bitmap(s), 0);
    assert_eq!(a.reclaim(s), 0);
    let snap = t.snapshot(s2).unwrap();
    assert_eq!(snap.pid, FAKE + 1);
    assert!(!snap.fenced);
    assert_eq!(snap.in_flight_bitmap, (1 << 7) | (1 << 8));
    assert!(t.beat(s2));
}

#[test]
fn two_watchdogs_reclaim_exactly_once() {
    let (_d, t, s) = worker(2, &[0, 50]);
    let a = FailoverWatchdog::with_grace(&t, 0);
    let b = FailoverWatchdog::with_grace(&t, 0);
    assert_eq!(scan_n(&a, 2).dead_slots.len(), 1);
    assert_eq!(b.scan().dead_slots.len(), 1);
    let (ra, rb) = (a.reclaim(s), b.reclaim(s));
    assert_eq!(ra | rb, (1 << 0) | (1 << 50));
    assert_eq!(ra & rb, 0);
    assert!(ra == 0 || rb == 0, "the bits went to one caller");
    assert_eq!(t.counters()[counter::FENCE], 1);
}

#[test]
fn two_watchdog_threads_race_reclaim_exactly_once() {
    let (_d, t) = table(1);
    for round in 0..200u32 {
        let s = t.register(FAKE + round).unwrap();
        let bits = (u64::from(round) * 0x9E37_79B9) | 1;
        for b in FailoverWatchdog::iter_in_flight_bits(bits) {
            assert!(t.mark_in_flight(s, b));
        }
        let snap = t.snapshot(s).unwrap();
        let go = AtomicBool::new(false);
        let (ra, rb) = std::thread::scope(|sc| {
            let run = || {
                let w = FailoverWatchdog::new(&t);
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                w.reclaim_snapshot(s, &snap)
            };
            let ha = sc.spawn(run);
            let hb = sc.spawn(run);
            go.store(true, Ordering::Release);
            (ha.join().unwrap(), hb.join().unwrap())
        });
        assert_eq!(ra | rb, bits, "round {round}");
        assert_eq!(ra & rb, 0, "round {round}");
    }
}

// ---- H4: reuse ----

#[test]
fn dead_slot_is_reused_by_register() {
    let (_d, t, s) = worker(1, &[5]);
    assert!(matches!(
        t.register(FAKE + 1),
        Err(HeartbeatError::TableFull)
    ));
    let w = FailoverWatchdog::with_grace(&t, 2);
    let r = scan_n(&w, 3);
    assert_eq!(r.dead_slots.len(), 1);
    assert_eq!(w.reclaim(s), 1 << 5);
    assert_eq!(t.register(FAKE + 1).unwrap(), s);
    assert_eq!(t.counters()[counter::REUSE_FENCED], 1);
}

#[test]
fn fenced_slot_with_bits_is_not_reused_until_reclaimed() {
    let (_d, t, s) = worker(1, &[1]);
    let w = FailoverWatchdog::with_grace(&t, 0);
    scan_n(&w, 2);
    t.mark_in_flight(s, 2);
    assert_eq!(w.clear_dead_bitmap(s), 1 << 1); // bit 2 survives, slot fenced
    assert!(matches!(
        t.register(FAKE + 1),
        Err(HeartbeatError::TableFull)
    ));
    w.scan();
    assert_eq!(w.reclaim(s), 1 << 2);
    assert_eq!(t.register(FAKE + 1).unwrap(), s);
}

#[test]
fn unregister_frees_the_slot_or_leaves_bits_for_the_watchdog() {
    let (_d, t, s) = worker(1, &[]);
    assert!(t.unregister(s));
    assert!(!t.unregister(s), "unregistered twice");
    assert!(!t.beat(s));
    assert_eq!(t.snapshot(s).unwrap().pid, 0);
    let s = t.register(FAKE + 1).unwrap();
    assert!(t.mark_in_flight(s, 12));
    assert!(t.unregister(s));
    // The abandoned unit is reported at once (fenced with bits), whatever the lag.
    let w = FailoverWatchdog::with_grace(&t, 1000);
    let r = w.scan();
    assert_eq!(r.dead_slots.len(), 1);
    assert!(r.dead_slots[0].1.fenced);
    assert_eq!(w.reclaim(s), 1 << 12);
    assert_eq!(t.register(FAKE + 2).unwrap(), s);
}

#[test]
fn sweep_idle_frees_stale_empty_slots() {
    let (_d, t) = table(2);
    let idle = t.register(FAKE).unwrap();
    let busy = t.register(FAKE + 1).unwrap();
    let w = FailoverWatchdog::with_grace(&t, 2);
    assert_eq!(w.sweep_idle(), 0);
    for _ in 0..3 {
        t.tick_global_epoch();
        assert!(t.beat(busy));
    }
    assert_eq!(w.sweep_idle(), 1);
    assert!(t.snapshot(idle).unwrap().fenced);
    assert!(!t.beat(idle));
    assert!(t.beat(busy));
    assert_eq!(t.register(FAKE + 2).unwrap(), idle);
}

// ---- H1: consistent snapshots ----

#[test]
fn snapshots_never_mix_registrations() {
    let (_d, t) = table(1);
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // Registration of pid FAKE + k marks exactly bit k % 64.
                let pid = FAKE + (n % 640);
                let s = t.register(pid).unwrap();
                let bit = ((pid - FAKE) % 64) as u8;
                assert!(t.mark_in_flight(s, bit));
                t.tick_global_epoch();
                assert!(t.beat(s));
                assert!(t.clear_in_flight(s, bit));
                assert!(t.unregister(s));
                n += 1;
            }
        });
        let mut seen = 0;
        // 200k snapshots, and more until one caught a registration (on a loaded 2-core
        // machine the registering thread may not run during the first 200k), for at
        // most 20 s.
        let started = std::time::Instant::now();
        let mut looks = 0u32;
        while looks < 200_000 || (seen == 0 && started.elapsed() < Duration::from_secs(20)) {
            looks += 1;
            let Some(snap) = t.snapshot(0) else { continue };
            if snap.pid == 0 {
                assert_eq!(snap.in_flight_bitmap, 0);
                continue;
            }
            seen += 1;
            let bit = (snap.pid - FAKE) % 64;
            assert_eq!(snap.in_flight_bitmap & !(1u64 << bit), 0, "{snap:?}");
        }
        stop.store(true, Ordering::Relaxed);
        assert!(seen > 0, "no snapshot in {looks} caught a registration");
    });
}

// ---- scan cost ----

#[test]
fn scan_allocates_nothing_when_nobody_is_dead() {
    let (_d, t) = table(64);
    for i in 0..64 {
        let s = t.register(FAKE + i).unwrap();
        t.mark_in_flight(s, (i % 64) as u8);
    }
    let w = FailoverWatchdog::with_grace(&t, 3);
    w.scan();
    for s in 0..64 {
        t.beat(s);
    }
    let before = allocations();
    let r = w.scan();
    assert_eq!(allocations(), before, "scan allocated with no dead slot");
    assert!(r.dead_slots.is_empty());
    // Busy slots of a live process with a recorded identity that did not beat between
    // two scans make the scan ask the OS; that is allocation-free too.
    let own = t.register(std::process::id());
    assert!(own.is_err(), "table is full");
    let (_d2, t2) = table(4);
    let s = t2.register(std::process::id()).unwrap();
    t2.mark_in_flight(s, 1);
    let w2 = FailoverWatchdog::with_grace(&t2, 100).with_os_check_interval(Duration::ZERO);
    w2.scan();
    let before = allocations();
    assert!(w2.scan().dead_slots.is_empty());
    assert_eq!(allocations(), before, "the OS identity check allocated");
    // The counter does count.
    let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(8));
    assert!(allocations() > before);
    drop(v);
}

// ---- files and options ----

#[test]
fn open_validates_capacity_kind_and_params() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hb.cxc");
    let t = HeartbeatTable::create(&path, 16).unwrap();
    let s = t.register(FAKE).unwrap();
    t.mark_in_flight(s, 33);
    let o = HeartbeatTable::open(&path, 16).unwrap();
    assert_eq!(o.capacity(), 16);
    assert_eq!(o.snapshot(s).unwrap().in_flight_bitmap, 1 << 33);
    assert_eq!(HeartbeatTable::open_any(&path).unwrap().capacity(), 16);
    assert!(matches!(
        HeartbeatTable::open(&path, 17),
        Err(HeartbeatError::File(cxc_mmf::MmfError::ParamMismatch {
            name: "capacity",
            ..
        }))
    ));
    assert!(matches!(
        HeartbeatTable::open(&path, 0),
        Err(HeartbeatError::InvalidCapacity { .. })
    ));
    assert!(matches!(
        HeartbeatTable::create(&path, 16),
        Err(HeartbeatError::File(
            cxc_mmf::MmfError::AlreadyExists { .. }
        ))
    ));
    assert!(matches!(
        HeartbeatTable::open(dir.path().join("missing"), 16),
        Err(HeartbeatError::File(cxc_mmf::MmfError::NotFound { .. }))
    ));
    // A garbage file is an error, not a crash.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0xA5u8; 4096]).unwrap();
    assert!(matches!(
        HeartbeatTable::open_any(&junk),
        Err(HeartbeatError::File(_))
    ));
    // Epochs are shared through the file.
    t.tick_global_epoch();
    assert_eq!(o.global_epoch(), 1);
}

#[test]
fn file_mode_and_clock_epochs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p1 = dir.path().join("a.cxc");
    HeartbeatTable::create(&p1, 1).unwrap();
    assert_eq!(
        std::fs::metadata(&p1).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let p2 = dir.path().join("b.cxc");
    let opts = HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        mode: 0o640,
    };
    let t = HeartbeatTable::create_with(&p2, 2, &opts).unwrap();
    assert_eq!(
        std::fs::metadata(&p2).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let o = HeartbeatTable::open(&p2, 2).unwrap();
    assert_eq!(o.epoch_mode(), opts.epoch);
    let e0 = t.global_epoch();
    std::thread::sleep(Duration::from_millis(20));
    assert!(t.global_epoch() >= e0 + 10);
    // In clock mode the scan compares against the clock and does not tick.
    let s = t.register(FAKE).unwrap();
    t.mark_in_flight(s, 0);
    let w = FailoverWatchdog::with_grace(&t, 1_000_000);
    let r = w.scan();
    assert!(r.dead_slots.is_empty());
    assert!(r.new_global_epoch >= e0 + 10);
    let bad = HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_nanos(1),
        },
        ..HeartbeatOptions::default()
    };
    assert!(matches!(
        HeartbeatTable::create_with(dir.path().join("c.cxc"), 1, &bad),
        Err(HeartbeatError::InvalidEpochMode(_))
    ));
}

#[test]
fn a_second_handle_acts_only_for_this_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hb.cxc");
    let a = HeartbeatTable::create(&path, 4).unwrap();
    let b = HeartbeatTable::open(&path, 4).unwrap();
    let mine = a.register(std::process::id()).unwrap();
    let other = a.register(FAKE).unwrap();
    assert!(
        b.beat(mine),
        "own-pid registration is adopted by another handle"
    );
    assert!(b.mark_in_flight(mine, 1));
    assert!(!b.beat(other), "another pid's registration is not");
    assert!(!b.mark_in_flight(other, 1));
    let snap = a.snapshot(mine).unwrap();
    assert_eq!(
        snap.identity,
        cxc_sync::liveness::Identity::current(),
        "own-pid registration records this process's identity"
    );
    assert!(snap.identity.is_known());
    assert!(!a.snapshot(other).unwrap().identity.is_known());
    assert_eq!(a.snapshot(other).unwrap().start_time, 0);
}

#[test]
fn watchdogs_share_a_table_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(HeartbeatTable::create(dir.path().join("hb.cxc"), 8).unwrap());
    let w = FailoverWatchdog::new(&t);
    let s = t.register(FAKE).unwrap();
    t.mark_in_flight(s, 2);
    let t2 = Arc::clone(&t);
    std::thread::spawn(move || {
        for _ in 0..10 {
            t2.tick_global_epoch();
        }
    })
    .join()
    .unwrap();
    let r = w.scan();
    assert_eq!(r.new_global_epoch, 11);
    assert_eq!(r.dead_slots.len(), 1);
    let c = t.counters();
    assert_eq!(c[counter::SCAN], 1);
    assert_eq!(c[counter::DEAD_REPORTED], 1);
    assert_eq!(c[counter::REGISTER], 1);
}

#[test]
fn registering_for_another_pid_records_that_process() {
    use cxc_sync::liveness::{Identity, Liveness, liveness};
    let dir = tempfile::tempdir().unwrap();
    let t = HeartbeatTable::create(dir.path().join("hb.cxc"), 2).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let s = t.register(child.id()).unwrap();
    assert!(
        t.mark_in_flight(s, 4),
        "the registering handle acts for its registration"
    );
    let recorded = t.snapshot(s).unwrap().identity;
    assert_eq!(Some(recorded), Identity::of_pid(child.id()));
    assert_ne!(recorded, Identity::current());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(liveness(&recorded), Liveness::Dead);
    // Within grace, the OS identity alone reports the dead process.
    let w = FailoverWatchdog::with_grace(&t, 1_000_000);
    let t0 = std::time::Instant::now();
    loop {
        let r = w.scan();
        if !r.dead_slots.is_empty() {
            assert_eq!(r.dead_slots[0].0, s);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never reported");
        std::thread::sleep(Duration::from_millis(12));
    }
    assert_eq!(w.reclaim(s), 1 << 4);
}

#[test]
fn a_forked_child_cannot_act_for_its_parents_registration() {
    let dir = tempfile::tempdir().unwrap();
    let t = HeartbeatTable::create(dir.path().join("hb.cxc"), 2).unwrap();
    let s = t.register(std::process::id()).unwrap();
    assert!(t.mark_in_flight(s, 1));
    // SAFETY: the child only calls the table's worker API (allocation-free: atomics on
    // the mapping, the identity cache, /proc read into stack buffers) and leaves with
    // _exit; it takes no lock another thread of the parent may hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let acted = t.beat(s) || t.mark_in_flight(s, 2) || t.clear_in_flight(s, 1);
        // SAFETY: ends the forked child at once, running no destructors or atexit hooks.
        unsafe { libc::_exit(i32::from(acted)) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child with a valid pointer for the status.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "a forked child acted for its parent's registration"
    );
    assert_eq!(t.snapshot(s).unwrap().in_flight_bitmap, 1 << 1);
    assert!(t.beat(s), "the parent still owns its registration");
}

/// Fences the registration in `slot` (the watchdog declares it dead: it must have work in
/// flight) and takes its bits.
fn fence(table: &HeartbeatTable, slot: usize) {
    let dog = FailoverWatchdog::with_grace(table, 1);
    for _ in 0..10 {
        table.tick_global_epoch();
        if dog.scan().dead_slots.iter().any(|(s, _)| *s == slot) {
            let _ = dog.reclaim(slot);
            return;
        }
    }
    panic!("slot {slot} was never declared dead");
}

/// An owned registration (and a borrowed one) acts only for the registration it made:
/// once fenced, it never beats, marks or unregisters a later registration of its slot by
/// the same process, which is what a worker told "stop and register again" makes. (The
/// Python binding acted through the slot before it used `OwnedRegistration`: a fenced
/// worker's old registration, collected, unregistered its new one.)
#[test]
fn a_fenced_owned_registration_never_acts_for_a_later_one_in_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(HeartbeatTable::create(dir.path().join("w.hb"), 1).unwrap());
    let old = table.clone().join_owned().unwrap();
    let slot = old.slot();
    old.mark_in_flight(2).unwrap();
    fence(&table, slot);
    let new = table.clone().join_owned().unwrap();
    assert_eq!(new.slot(), slot, "one slot: the fenced one is reused");
    new.mark_in_flight(7).unwrap();
    // The old guard acts for nothing now.
    assert!(matches!(old.beat(), Err(HeartbeatError::Fenced { .. })));
    assert!(matches!(
        old.mark_in_flight(5),
        Err(HeartbeatError::Fenced { .. })
    ));
    assert!(matches!(
        old.clear_in_flight(7),
        Err(HeartbeatError::Fenced { .. })
    ));
    assert_eq!(old.in_flight(), None);
    assert!(!old.unregister(), "unregistered a later registration");
    // The new registration is intact and works from another thread.
    let snap = table.snapshot(slot).unwrap();
    assert_eq!(snap.pid, std::process::id());
    assert_eq!(snap.in_flight_bitmap, 1 << 7);
    let new = std::thread::spawn(move || {
        new.beat().unwrap();
        new.clear_in_flight(7).unwrap();
        assert_eq!(new.in_flight(), Some(0));
        new.mark_in_flight(1).unwrap();
        new
    })
    .join()
    .unwrap();
    // A borrowed registration behaves the same.
    fence(&table, slot);
    let newer = table.join().unwrap();
    assert!(matches!(new.beat(), Err(HeartbeatError::Fenced { .. })));
    drop(new);
    newer.beat().unwrap();
    assert_eq!(table.snapshot(slot).unwrap().pid, std::process::id());
    drop(newer);
    assert_eq!(table.snapshot(slot).unwrap().pid, 0, "unregistered on drop");
}

//! Attack 15: the seed documents' stated behaviours of the seed API (`seeds/000`,
//! `seeds/002`, `seeds/004`), tested single-process with made-up pids and manual epochs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cxc_sync::{FailoverWatchdog, HeartbeatError, HeartbeatTable, OwnerLease, SharedSemaphore};

/// Made-up pids above Linux's `pid_max` (4194304): they name no process, so only the
/// seed's own rules (vacant, lower pid, staleness) decide.
const P100: u32 = 5_000_100;
const P200: u32 = 5_000_200;
const P300: u32 = 5_000_300;

fn lease() -> (tempfile::TempDir, PathBuf, OwnerLease<u64>) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("lease.bin");
    let l = OwnerLease::create(&p, 0).unwrap();
    (d, p, l)
}

fn ticks<T>(l: &OwnerLease<T>, n: u64)
where
    T: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable + zerocopy::KnownLayout,
{
    for _ in 0..n {
        l.tick_epoch();
    }
}

// ---------------------------------------------------------------- OwnerLease (seeds/000)

// seeds/000 "Worked examples / Held lease": try_acquire(my_pid, 3); 1000 x
// `read_as_owner(..).unwrap()` + `write_as_owner(.., v + 1)`; `release(my_pid)`.
#[test]
fn worked_example_held_lease_counts_to_1000() {
    let (_d, _p, l) = lease();
    let me = std::process::id();
    assert!(l.try_acquire(me, 3));
    for _ in 0..1000 {
        let v = l.read_as_owner(me).unwrap();
        assert!(l.write_as_owner(me, v + 1));
    }
    assert!(l.release(me));
    assert_eq!(l.current_owner(), None);
    assert!(l.try_acquire(me, 3));
    assert_eq!(l.read_as_owner(me), Some(1000));
}

// seeds/000 "Closure-based RAII": `with_lease(my_pid, 3, |v| { let prev = *v; *v = prev * 2;
// prev })` -- "Lease released on return; result is Some(prev_value) or None."
#[test]
fn worked_example_with_lease_doubles_returns_prev_and_releases() {
    let d = tempfile::tempdir().unwrap();
    let l: OwnerLease<u64> = OwnerLease::create(d.path().join("l"), 21).unwrap();
    let r = l.with_lease(P200, 3, |v| {
        let prev = *v;
        *v = prev * 2;
        prev
    });
    assert_eq!(r, Some(21));
    assert_eq!(l.current_owner(), None, "released on return");
    assert!(!l.am_i_owner(P200));
    assert!(l.try_acquire(P300, 3));
    assert_eq!(l.read_as_owner(P300), Some(42));
}

// seeds/000 "Closure-based RAII": "result is Some(prev_value) or None" -- None when the
// acquire fails (held by a lower pid that is not stale); the closure must not run.
#[test]
fn with_lease_refused_returns_none_and_does_not_run() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P100, 3));
    let mut ran = false;
    let r = l.with_lease(P200, 3, |v| {
        ran = true;
        *v = 99;
    });
    assert_eq!(r, None);
    assert!(!ran);
    assert_eq!(l.current_owner(), Some(P100));
    assert_eq!(l.read_as_owner(P100), Some(0));
}

// seeds/000 API: "`with_lease(my_pid, grace, |&mut T| ...)` | RAII-style
// acquire+mutate+release" and "Lease released on return". docs/owner-lease.md states the
// one deliberate difference: called by the pid that already holds the lease, `with_lease`
// runs, publishes and leaves the lease held (a seed-literal release would end the
// caller's own hold from inside a nested update). A vacant lease is released on return.
#[test]
fn with_lease_by_current_holder_publishes_and_keeps_the_documented_hold() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P200, 3));
    let r = l.with_lease(P200, 3, |v| {
        *v += 5;
        *v
    });
    assert_eq!(r, Some(5));
    assert_eq!(
        l.current_owner(),
        Some(P200),
        "documented: the holder keeps its hold"
    );
    assert_eq!(l.read_as_owner(P200), Some(5), "the update was published");
    assert!(l.release(P200));
    assert_eq!(l.with_lease(P200, 3, |v| *v), Some(5));
    assert_eq!(
        l.current_owner(),
        None,
        "a claim made by with_lease is released on return"
    );
}

// seeds/000 protocol: "elif cur == my_pid: return true # idempotent" -- no CAS, so no
// `lease_term.fetch_add(1)`.
#[test]
fn idempotent_try_acquire_does_not_advance_lease_term() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P200, 3));
    let t = l.lease_term();
    for _ in 0..5 {
        assert!(l.try_acquire(P200, 3));
    }
    assert_eq!(l.lease_term(), t);
    assert_eq!(l.current_owner(), Some(P200));
}

// seeds/000 API: "`lease_term()` | Counter incremented on every handover"; protocol: only
// a successful claim CAS does `lease_term.fetch_add(1)` (release does not).
#[test]
fn lease_term_plus_one_per_claim_and_unchanged_by_release_or_refusal() {
    let (_d, _p, l) = lease();
    let t0 = l.lease_term();
    assert!(l.try_acquire(P300, 3)); // vacant
    assert_eq!(l.lease_term(), t0 + 1);
    assert!(!l.try_acquire(P300 + 1, 3)); // refused
    assert_eq!(l.lease_term(), t0 + 1);
    assert!(l.try_acquire(P200, 3)); // preemption
    assert_eq!(l.lease_term(), t0 + 2);
    assert!(l.try_acquire(P100, 3)); // preemption
    assert_eq!(l.lease_term(), t0 + 3);
    ticks(&l, 4);
    assert!(l.try_acquire(P300, 3)); // stale takeover
    assert_eq!(l.lease_term(), t0 + 4);
    assert!(l.release(P300));
    assert_eq!(l.lease_term(), t0 + 4, "release is not a claim");
    assert!(!l.release(P300));
    assert_eq!(l.lease_term(), t0 + 4);
}

// seeds/000: "the lease's failover criterion is `global_epoch - heartbeat_epoch > grace`"
// (strict), and the claim stores `heartbeat_epoch.store(global)`.
#[test]
fn stale_boundary_is_strictly_greater_than_grace() {
    for grace in [0u64, 1, 3, 7] {
        let (_d, _p, l) = lease();
        ticks(&l, 10); // claim at a non-zero epoch: staleness counts from the claim
        assert!(l.try_acquire(P100, grace));
        ticks(&l, grace);
        assert!(
            !l.try_acquire(P200, grace),
            "lag == grace ({grace}) is not stale"
        );
        assert_eq!(l.current_owner(), Some(P100));
        l.tick_epoch();
        assert!(l.try_acquire(P200, grace), "lag == grace + 1 is stale");
        assert_eq!(l.current_owner(), Some(P200));
        assert!(!l.am_i_owner(P100));
    }
}

// seeds/000: the new owner's heartbeat is the claim epoch (`heartbeat_epoch.store(global)`),
// so a third party must again wait more than `grace` epochs after a stale takeover.
#[test]
fn stale_takeover_restarts_the_heartbeat_clock() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P100, 2));
    ticks(&l, 3);
    assert!(l.try_acquire(P300, 2));
    assert!(!l.try_acquire(P300 + 5, 2));
    ticks(&l, 2);
    assert!(!l.try_acquire(P300 + 5, 2));
    l.tick_epoch();
    assert!(l.try_acquire(P300 + 5, 2));
}

// seeds/000: "`beat(my_pid)` | Refresh heartbeat to current global epoch"; a holder that
// beats stays alive; beat returns true while owner.
#[test]
fn beat_refreshes_to_current_epoch_and_keeps_holder() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P100, 3));
    for _ in 0..10 {
        ticks(&l, 3);
        assert!(l.beat(P100));
        assert!(!l.try_acquire(P200, 3));
    }
    ticks(&l, 3);
    assert!(!l.try_acquire(P200, 3));
    l.tick_epoch();
    assert!(l.try_acquire(P200, 3));
}

// seeds/000 pitfalls: "Calling `beat` after preemption. Returns false"; also a pid that
// never held it.
#[test]
fn beat_by_non_owner_is_false_and_does_not_refresh() {
    let (_d, _p, l) = lease();
    assert!(!l.beat(P100), "vacant lease");
    assert!(l.try_acquire(P200, 3));
    assert!(!l.beat(P300));
    ticks(&l, 4);
    assert!(
        !l.beat(P300),
        "a non-owner's beat must not refresh the holder"
    );
    assert!(
        l.try_acquire(P300, 3),
        "holder stale despite the non-owner beat"
    );
    assert!(!l.beat(P200), "beat after (stale) takeover");
    assert!(l.try_acquire(P100, 3));
    assert!(!l.beat(P300), "beat after (lower-pid) preemption");
}

// seeds/000: "`release(my_pid)` | CAS owner back to NO_OWNER; returns true if I was owner";
// pitfalls: "`release` only succeeds if the caller is the current owner. After
// preemption, `release(my_pid)` returns false."
#[test]
fn release_by_non_holder_is_false_and_changes_nothing() {
    let (_d, _p, l) = lease();
    assert!(!l.release(P100), "vacant");
    assert!(l.try_acquire(P200, 3));
    assert!(!l.release(P300));
    assert!(!l.release(P100));
    assert_eq!(l.current_owner(), Some(P200));
    assert!(l.am_i_owner(P200));
    assert!(l.try_acquire(P100, 3));
    assert!(!l.release(P200), "after preemption");
    assert_eq!(l.current_owner(), Some(P100));
    assert!(l.release(P100));
    assert_eq!(l.current_owner(), None);
}

// seeds/000: "Owner-only writes: `write_as_owner` returns `false` if the caller has been
// preempted; same for `read_as_owner` (use `Option<T>` return)."
#[test]
fn owner_only_read_write_after_preemption_and_for_strangers() {
    let (_d, _p, l) = lease();
    assert!(!l.write_as_owner(P100, 7), "vacant: nobody owns");
    assert_eq!(l.read_as_owner(P100), None);
    assert!(l.try_acquire(P200, 3));
    assert!(l.write_as_owner(P200, 11));
    assert!(!l.write_as_owner(P300, 13));
    assert_eq!(l.read_as_owner(P300), None);
    assert!(l.try_acquire(P100, 3));
    assert!(!l.write_as_owner(P200, 17), "preempted");
    assert_eq!(l.read_as_owner(P200), None, "preempted");
    assert_eq!(l.read_as_owner(P100), Some(11), "payload survives handover");
}

// seeds/000: "(b) `my_pid < current owner` (preemption)" -- independent of grace and of a
// fresh heartbeat; a higher pid never preempts a fresh holder even with grace = u64::MAX.
#[test]
fn lower_pid_preempts_regardless_of_grace_and_higher_never() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P300, u64::MAX));
    assert!(l.beat(P300));
    assert!(!l.try_acquire(P300 + 1, 0), "fresh (lag 0 == grace 0)");
    assert!(l.try_acquire(P200, u64::MAX));
    assert_eq!(l.current_owner(), Some(P200));
    ticks(&l, 100);
    assert!(
        !l.try_acquire(P300, u64::MAX),
        "never stale with grace u64::MAX"
    );
    assert!(l.try_acquire(P100, u64::MAX));
    assert_eq!(l.current_owner(), Some(P100));
}

// seeds/000: "`current_owner()` | Snapshot of who holds; None if vacant";
// "`am_i_owner(my_pid)` | One atomic load".
#[test]
fn current_owner_and_am_i_owner_track_every_transition() {
    let (_d, _p, l) = lease();
    assert_eq!(l.current_owner(), None);
    assert!(!l.am_i_owner(P100));
    assert!(l.try_acquire(P200, 3));
    assert_eq!(l.current_owner(), Some(P200));
    assert!(l.am_i_owner(P200));
    assert!(!l.am_i_owner(P100));
    assert!(l.try_acquire(P100, 3));
    assert_eq!(l.current_owner(), Some(P100));
    assert!(l.am_i_owner(P100));
    assert!(!l.am_i_owner(P200));
    assert!(l.release(P100));
    assert_eq!(l.current_owner(), None);
    assert!(!l.am_i_owner(P100));
}

// seeds/000: "`read_as_owner(my_pid)` | Returns Some(T) if I own; None otherwise";
// "`write_as_owner(my_pid, T)` | Writes payload if I own; returns bool" -- after release.
#[test]
fn read_write_after_own_release_are_refused() {
    let (_d, _p, l) = lease();
    assert!(l.try_acquire(P200, 3));
    assert!(l.write_as_owner(P200, 9));
    assert!(l.release(P200));
    assert_eq!(l.read_as_owner(P200), None);
    assert!(!l.write_as_owner(P200, 10));
    assert!(!l.am_i_owner(P200));
    assert!(l.try_acquire(P300, 3));
    assert_eq!(l.read_as_owner(P300), Some(9));
}

// seeds/000: "`tick_epoch()` | Advance global epoch"; criterion uses it, one per call.
#[test]
fn tick_epoch_advances_by_exactly_one() {
    let (_d, _p, l) = lease();
    let e0 = l.current_epoch();
    assert_eq!(l.tick_epoch(), e0 + 1);
    assert_eq!(l.tick_epoch(), e0 + 2);
    assert_eq!(l.current_epoch(), e0 + 2);
}

// seeds/000: "`PID 0` reserved for `NO_OWNER`: callers cannot use PID 0" (asserts);
// docs/owner-lease.md: "PID 0 (`cxc::lease::NO_OWNER`, the seed's name) is refused".
#[test]
fn pid_zero_never_becomes_owner() {
    let (_d, _p, l) = lease();
    assert_eq!(cxc_sync::lease::NO_OWNER, 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.try_acquire(0, 3)));
    assert!(matches!(r, Ok(false) | Err(_)));
    assert_eq!(l.current_owner(), None);
    assert!(l.try_acquire(P300, 3));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.try_acquire(0, 3)));
    assert!(
        matches!(r, Ok(false) | Err(_)),
        "0 < any pid must not preempt"
    );
    assert_eq!(l.current_owner(), Some(P300));
}

// seeds/000 "What the numbers do NOT show": "Process B's `try_acquire` returns false
// unless A releases, A's heartbeat goes stale, or B has lower PID" -- across handles of
// one file ("Cross-process backed by MMF").
#[test]
fn second_handle_sees_owner_and_follows_the_rules() {
    let (_d, p, a) = lease();
    let b: OwnerLease<u64> = OwnerLease::open(&p).unwrap();
    assert!(a.try_acquire(P200, 3));
    assert!(a.write_as_owner(P200, 5));
    assert_eq!(b.current_owner(), Some(P200));
    assert!(!b.try_acquire(P300, 3));
    b.tick_epoch();
    b.tick_epoch();
    b.tick_epoch();
    assert!(!b.try_acquire(P300, 3));
    assert!(a.beat(P200));
    b.tick_epoch();
    assert!(!b.try_acquire(P300, 3), "a's beat reset the lag");
    assert!(a.release(P200));
    assert!(b.try_acquire(P300, 3));
    assert_eq!(b.read_as_owner(P300), Some(5));
    assert_eq!(a.current_owner(), Some(P300));
}

// ---------------------------------------------------------------- HeartbeatTable + watchdog (seeds/002)

fn table(cap: usize) -> (tempfile::TempDir, HeartbeatTable) {
    let d = tempfile::tempdir().unwrap();
    let t = HeartbeatTable::create(d.path().join("hb.bin"), cap).unwrap();
    (d, t)
}

// seeds/002 "scan()": "`new_epoch = table.tick_global_epoch()` ... return ReclaimReport {
// dead_slots, new_global_epoch: new_epoch }" -- "each scan call advances the comparison
// baseline" by one.
#[test]
fn scan_ticks_global_epoch_by_one_and_reports_it() {
    let (_d, t) = table(4);
    let w = FailoverWatchdog::with_grace(&t, 3);
    let e0 = t.global_epoch();
    for i in 1..=5u64 {
        let r = w.scan();
        assert_eq!(r.new_global_epoch, e0 + i);
        assert_eq!(t.global_epoch(), e0 + i);
        assert!(r.dead_slots.is_empty());
    }
    assert_eq!(t.tick_global_epoch(), e0 + 6);
}

// seeds/002: "a slot must miss STRICTLY MORE than `grace_epochs` beats to be reclaimed. At
// lag == grace, the slot is still considered alive." `lag = new_epoch - last_seen_epoch`.
#[test]
fn scan_lag_equal_grace_alive_grace_plus_one_dead() {
    for grace in [0u64, 1, 3, 5] {
        let (_d, t) = table(4);
        t.tick_global_epoch();
        t.tick_global_epoch();
        let s = t.register(P100).unwrap();
        assert!(t.beat(s));
        assert!(t.mark_in_flight(s, 5));
        let last = t.snapshot(s).unwrap().last_seen_epoch;
        assert_eq!(last, t.global_epoch(), "beat sets last_seen to the epoch");
        let w = FailoverWatchdog::with_grace(&t, grace).with_os_check_interval(Duration::MAX);
        for _ in 0..grace {
            let r = w.scan();
            assert!(
                r.dead_slots.is_empty(),
                "lag {} <= grace {grace}",
                r.new_global_epoch - last
            );
        }
        let r = w.scan();
        assert_eq!(r.new_global_epoch - last, grace + 1);
        assert_eq!(r.dead_slots.len(), 1, "grace {grace}");
        let (slot, snap) = &r.dead_slots[0];
        assert_eq!(*slot, s);
        assert_eq!(snap.pid, P100);
        assert_eq!(snap.in_flight_bitmap, 1 << 5);
        assert_eq!(snap.last_seen_epoch, last);
    }
}

// seeds/002: "identifies every slot with `last_seen_epoch < global - grace_epochs` AND a
// non-zero in-flight bitmap" -- a stale slot with no bits is never reported; empty slots
// are skipped.
#[test]
fn stale_slot_without_bits_is_not_reported() {
    let (_d, t) = table(4);
    let s = t.register(P100).unwrap();
    let w = FailoverWatchdog::with_grace(&t, 1);
    for _ in 0..10 {
        assert!(w.scan().dead_slots.is_empty());
    }
    assert!(t.mark_in_flight(s, 0));
    assert!(t.clear_in_flight(s, 0));
    assert!(w.scan().dead_slots.is_empty());
}

// seeds/002 "Dead-slot reports are one-shot: clear the bitmap after reassignment;
// otherwise the next scan re-reports the same slot." and "`clear_dead_bitmap` silences
// re-reports".
#[test]
fn dead_slot_is_re_reported_until_clear_dead_bitmap() {
    let (_d, t) = table(4);
    let s = t.register(P100).unwrap();
    assert!(t.mark_in_flight(s, 1));
    assert!(t.mark_in_flight(s, 63));
    let w = FailoverWatchdog::with_grace(&t, 2);
    w.scan();
    w.scan();
    for _ in 0..3 {
        let r = w.scan();
        assert_eq!(r.dead_slots.len(), 1);
        assert_eq!(r.dead_slots[0].0, s);
        assert_eq!(r.dead_slots[0].1.in_flight_bitmap, (1 << 1) | (1 << 63));
    }
    w.clear_dead_bitmap(s);
    assert_eq!(t.snapshot(s).unwrap().in_flight_bitmap, 0);
    for _ in 0..3 {
        assert!(w.scan().dead_slots.is_empty());
    }
}

// seeds/002 "scan()": "for each slot i in 0..capacity ... dead.push((i, snap))" -- every
// dead slot, in slot order; a live (beating) slot is not among them.
#[test]
fn scan_reports_all_dead_slots_in_slot_order_and_skips_beating_ones() {
    let (_d, t) = table(8);
    let slots: Vec<usize> = (0..6).map(|i| t.register(P100 + i).unwrap()).collect();
    for (i, &s) in slots.iter().enumerate() {
        assert!(t.mark_in_flight(s, i as u8));
    }
    let w = FailoverWatchdog::with_grace(&t, 1);
    let mut last = None;
    for _ in 0..3 {
        assert!(t.beat(slots[1]));
        assert!(t.beat(slots[4]));
        last = Some(w.scan());
    }
    let r = last.unwrap();
    let got: Vec<(usize, u32, u64)> = r
        .dead_slots
        .iter()
        .map(|(i, s)| (*i, s.pid, s.in_flight_bitmap))
        .collect();
    let mut want: Vec<(usize, u32, u64)> = [0usize, 2, 3, 5]
        .iter()
        .map(|&i| (slots[i], P100 + i as u32, 1u64 << i))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

// seeds/002 "iter_in_flight_bits(bitmap)": "for b in 0..64: if (bitmap >> b) & 1 == 1:
// yield b" -- every set bit, ascending.
#[test]
fn iter_in_flight_bits_yields_set_bits_ascending() {
    let it = |b: u64| -> Vec<u32> {
        FailoverWatchdog::iter_in_flight_bits(b)
            .map(u32::from)
            .collect()
    };
    assert!(it(0).is_empty());
    assert_eq!(it(1), vec![0]);
    assert_eq!(it(1 << 63), vec![63]);
    assert_eq!(it(0b1010_0110), vec![1, 2, 5, 7]);
    assert_eq!(it(u64::MAX), (0..64).collect::<Vec<_>>());
    let b = 0x8000_0001_0000_8421u64;
    let want: Vec<u32> = (0..64).filter(|i| (b >> i) & 1 == 1).collect();
    assert_eq!(it(b), want);
}

// seeds/002 "In-flight bitmap caps at 64 bits per slot" and the worked example's
// `mark_in_flight(slot, work_id as u8)`: bits 0..64 work, 64.. are out of range; docs:
// "every slot index and bit is bounds-checked".
#[test]
fn mark_and_clear_bounds_bits_and_slots() {
    let (_d, t) = table(2);
    let s = t.register(P100).unwrap();
    for b in [0u8, 31, 32, 63] {
        assert!(t.mark_in_flight(s, b));
    }
    assert_eq!(
        t.snapshot(s).unwrap().in_flight_bitmap,
        1 | (1 << 31) | (1 << 32) | (1 << 63)
    );
    for b in [64u8, 100, 255] {
        assert!(!t.mark_in_flight(s, b));
        assert!(!t.clear_in_flight(s, b));
    }
    assert!(t.clear_in_flight(s, 31));
    assert_eq!(
        t.snapshot(s).unwrap().in_flight_bitmap,
        1 | (1 << 32) | (1 << 63)
    );
    assert!(!t.beat(2));
    assert!(!t.beat(50_000_000));
    assert!(!t.mark_in_flight(2, 0));
    assert!(!t.clear_in_flight(usize::MAX, 0));
    assert!(t.snapshot(2).is_none());
    assert!(t.snapshot(usize::MAX).is_none());
}

// seeds/002 worked example: `table.register(std::process::id()).unwrap()` returns a slot;
// snapshot(i) yields `pid`, `last_seen_epoch`, `in_flight_bitmap`; capacity limits
// registrations (docs: `register(pid) -> Result<usize, _> // seed: TableFull, InvalidPid`).
#[test]
fn register_fills_distinct_slots_then_table_full_and_pid_zero_invalid() {
    let (_d, t) = table(3);
    let a = t.register(P100).unwrap();
    let b = t.register(P200).unwrap();
    let c = t.register(P300).unwrap();
    let mut v = vec![a, b, c];
    v.sort();
    assert_eq!(v, vec![0, 1, 2]);
    assert!(matches!(
        t.register(P300 + 1),
        Err(HeartbeatError::TableFull)
    ));
    assert!(matches!(t.register(0), Err(HeartbeatError::InvalidPid)));
    for (s, p) in [(a, P100), (b, P200), (c, P300)] {
        let snap = t.snapshot(s).unwrap();
        assert_eq!(snap.pid, p);
        assert_eq!(snap.in_flight_bitmap, 0);
        assert!(!snap.fenced);
    }
}

// seeds/002 "scan()": "if snap.pid != EMPTY" -- a never-registered in-range slot
// snapshots as empty (pid 0, no bits) and is never reported.
#[test]
fn unregistered_slot_snapshot_is_empty_and_never_reported() {
    let (_d, t) = table(3);
    let s = t.register(P100).unwrap();
    let other = (0..3).find(|&i| i != s).unwrap();
    let snap = t.snapshot(other).unwrap();
    assert_eq!(snap.pid, 0);
    assert_eq!(snap.in_flight_bitmap, 0);
    assert!(!t.beat(other));
    assert!(!t.mark_in_flight(other, 0));
    let w = FailoverWatchdog::with_grace(&t, 0);
    for _ in 0..3 {
        assert!(w.scan().dead_slots.is_empty());
    }
}

// seeds/002: beat refreshes `last_seen` to the global epoch; a beating worker is never
// dead ("lag = new_epoch - snap.last_seen_epoch").
#[test]
fn beat_sets_last_seen_to_global_epoch() {
    let (_d, t) = table(2);
    let s = t.register(P100).unwrap();
    for _ in 0..5 {
        t.tick_global_epoch();
    }
    assert!(t.beat(s));
    assert_eq!(t.snapshot(s).unwrap().last_seen_epoch, t.global_epoch());
    assert!(t.mark_in_flight(s, 9));
    let w = FailoverWatchdog::new(&t);
    assert_eq!(w.grace(), 3, "default grace is 3 (DEFAULT_GRACE_EPOCHS)");
    for _ in 0..20 {
        assert!(w.scan().dead_slots.is_empty());
        assert!(t.beat(s));
    }
}

// ---------------------------------------------------------------- SharedSemaphore (seeds/004)

fn sem(initial: u32, max: u32) -> (tempfile::TempDir, PathBuf, SharedSemaphore) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("sem");
    let s = SharedSemaphore::create(&p, initial, max).unwrap();
    (d, p, s)
}

// seeds/004: "`try_acquire` is one CAS decrement; non-blocking", "RAII `Permit` guard:
// drop releases automatically", "available() ... One atomic load".
#[test]
fn try_acquire_decrements_until_empty_and_drop_restores() {
    let (_d, _p, s) = sem(4, 4);
    assert_eq!(s.available(), 4);
    let ps: Vec<_> = (0..4).map(|_| s.try_acquire().unwrap()).collect();
    assert_eq!(s.available(), 0);
    assert!(s.try_acquire().is_none());
    assert_eq!(s.available(), 0);
    drop(ps);
    assert_eq!(s.available(), 4);
}

// seeds/004: "`release` is one CAS increment; rolls back if the increment exceeds
// `max_permits`" -- count stays bounded; "Releasing more than acquired ... the permit count
// stays bounded".
#[test]
fn release_at_max_is_refused_and_count_stays_bounded() {
    let (_d, _p, s) = sem(3, 3);
    assert!(!s.release());
    assert_eq!(s.available(), 3);
    let p = s.try_acquire().unwrap();
    drop(p);
    assert!(!s.release());
    assert_eq!(s.available(), 3);
}

// seeds/004: "Use `mem::forget(permit)` + manual `release()` to transfer ownership across
// an API boundary."
#[test]
fn forget_then_manual_release_returns_the_permit() {
    let (_d, _p, s) = sem(2, 2);
    let p = s.acquire();
    std::mem::forget(p);
    assert_eq!(s.available(), 1);
    assert!(s.release());
    assert_eq!(s.available(), 2);
    assert!(!s.release());
}

// seeds/004: "`initial` and `max_permits` set at create" -- initial < max: the missing
// permits can be released up to max (docs: "`create(path, 0, 1)` followed by `release()`
// works as in the seed"); initial > max is rejected.
#[test]
fn initial_below_max_can_be_released_up_to_max_and_above_max_rejected() {
    let (_d, p, s) = sem(1, 3);
    assert_eq!(s.available(), 1);
    assert_eq!(s.max_permits(), 3);
    assert!(s.release());
    assert!(s.release());
    assert_eq!(s.available(), 3);
    assert!(!s.release());
    assert_eq!(s.available(), 3);
    let o = SharedSemaphore::open(&p).unwrap();
    assert_eq!(o.max_permits(), 3);
    assert_eq!(o.available(), 3);
    let d = tempfile::tempdir().unwrap();
    assert!(SharedSemaphore::create(d.path().join("x"), 5, 4).is_err());
}

// seeds/004: "Optional `acquire` blocks ... on the `wakeup` ... bumped on release";
// worked example: `sem.acquire()` returns an RAII permit.
#[test]
fn acquire_blocks_until_a_permit_is_released_from_another_handle() {
    let (_d, p, s) = sem(1, 1);
    let held = s.try_acquire().unwrap();
    let p2 = p.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let h = std::thread::spawn(move || {
        let o = SharedSemaphore::open(&p2).unwrap();
        let permit = o.acquire();
        done2.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(o.available(), 0);
        drop(permit);
    });
    std::thread::sleep(Duration::from_millis(150));
    assert!(!done.load(std::sync::atomic::Ordering::SeqCst));
    drop(held);
    h.join().unwrap();
    assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(s.available(), 1);
}

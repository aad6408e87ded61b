//! Attack 9: the heartbeat table + failover watchdog (docs/heartbeat.md,
//! docs/failover-watchdog.md) and the shared semaphore (docs/shared-semaphore.md), with
//! real processes: a registrant SIGSTOPped inside `register` after its owner CAS, a
//! watchdog SIGSTOPped between its scan and its reclaim, many processes racing into an
//! almost-full heartbeat table, a permit handed off with `disown` whose giver is
//! SIGKILLed, a SIGSTOPped permit holder, a permit copied into a forked child, and two
//! sibling threads releasing one forgotten permit while another process tries too.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cxc_sync::liveness::Identity;
use cxc_sync::{
    FailoverWatchdog, HeartbeatError, HeartbeatTable, SemaphoreOptions, SharedSemaphore,
};
use cxc_testkit::{
    Rng, RoleCommand, flag, num, path_arg, play_role, read_word, report, serial, sleep_forever,
    wait_for_path,
};

/// File offset of heartbeat slot 0 (128-byte header + 2880-byte head; docs/heartbeat.md).
const HB_SLOT0: u64 = 3008;
/// Offsets of the words inside a heartbeat slot.
const HB_OWNER: u64 = 0;
const HB_LO: u64 = 16;
const HB_HI: u64 = 24;
const HB_ID_GEN: u64 = 56;
/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);

fn me() -> u32 {
    std::process::id()
}

fn touch(path: &Path) {
    std::fs::write(path, b"go").unwrap();
}

fn wait_go(path: &Path) {
    assert!(
        wait_for_path(path, Duration::from_secs(60)),
        "{} never appeared",
        path.display()
    );
}

/// The live tag of generation `g` in a bitmap half (docs/heartbeat.md: `g << 1`).
fn live_tag(g: u64) -> u64 {
    (g & 0x7FFF_FFFF) << 1
}

// ---------------------------------------------------------------------------------------
// Heartbeat: a registrant stalled between its owner CAS and its half retag.
// ---------------------------------------------------------------------------------------

const HB_STALL: &str =
    "hb_registrant_stalled_after_its_owner_cas_never_erases_the_next_owners_bits";

/// A process loops `register`/`unregister` on a one-slot table and is SIGSTOPped at
/// random until it is caught between its owner CAS and its retag of the bitmap halves
/// (owner word LIVE for it, a half still carrying the old tag). Its slot is idle and
/// stale, so `sweep_idle` fences it (as documented for a registrant that stalls there);
/// the parent registers the fenced slot and marks units 5 (low half) and 40 (high half).
/// Then the stalled registrant is continued. Promise (heartbeat.md, Register step 2):
/// "From here no one can add bits: a worker's write is a CAS that needs its live tag",
/// and failover-watchdog.md: every unit is reclaimed exactly once, none lost. The
/// stalled registrant's late stores must not touch the new registration: its bits, its
/// identity and its ability to clear them stay.
// Found (fixed since; failed 7/7 runs): a registrant stalled after its owner CAS, once continued, wiped the next owner's in-flight bits and identity (heartbeat.md Register step 2: "From here no one can add bits: a worker's write is a CAS that needs its live tag"; failover-watchdog.md: each bit reclaimed exactly once)
#[test]
fn hb_registrant_stalled_after_its_owner_cas_never_erases_the_next_owners_bits() {
    fn role_churn() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        report("READY");
        loop {
            if let Ok(s) = t.register(me()) {
                let _ = t.unregister(s);
            }
        }
    }
    play_role!(role_churn);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let mut kid = RoleCommand::new(HB_STALL, "churn")
        .arg("path", &path)
        .spawn();
    kid.next_report(REPORT_WAIT);
    let kpid = u64::from(kid.pid());
    let mut rng = Rng::for_test();
    let started = Instant::now();
    let mut tries = 0u32;
    let caught = loop {
        std::thread::sleep(Duration::from_micros(rng.range(50, 1500)));
        kid.stop();
        kid.wait_state('T', Duration::from_secs(5));
        tries += 1;
        let owner = read_word(&path, HB_SLOT0 + HB_OWNER);
        let lo = read_word(&path, HB_SLOT0 + HB_LO);
        let hi = read_word(&path, HB_SLOT0 + HB_HI);
        let id_gen = read_word(&path, HB_SLOT0 + HB_ID_GEN);
        let g = (owner >> 1) & 0x7FFF_FFFF;
        let live = owner >> 32 == kpid && owner & 1 == 0;
        if live && ((lo >> 32) != live_tag(g) || (hi >> 32) != live_tag(g)) {
            break Some((owner, lo, hi, id_gen));
        }
        kid.cont();
        if started.elapsed() > Duration::from_secs(20) {
            break None;
        }
    };
    let Some((owner, lo, hi, id_gen)) = caught else {
        panic!("never caught the registrant inside its window in {tries} stops");
    };
    println!("caught after {tries} stops: owner={owner:#x} lo={lo:#x} hi={hi:#x} id_gen={id_gen}");
    // The stalled registration is idle and, two epochs later, stale: swept (fenced).
    table.tick_global_epoch();
    table.tick_global_epoch();
    let w = FailoverWatchdog::with_grace(&table, 0).with_os_check_interval(Duration::MAX);
    assert_eq!(
        w.sweep_idle(),
        1,
        "the stale idle registration was not swept"
    );
    let slot = table.register(me()).expect("the fenced slot is reusable");
    assert_eq!(slot, 0);
    let units = (1u64 << 5) | (1u64 << 40);
    assert!(table.mark_in_flight(slot, 5));
    assert!(table.mark_in_flight(slot, 40));
    assert_eq!(table.snapshot(slot).unwrap().in_flight_bitmap, units);
    // The stalled registrant finishes its `register` (and fails its `unregister`).
    kid.cont();
    std::thread::sleep(Duration::from_millis(100));
    kid.kill();
    let snap = table.snapshot(slot).unwrap();
    let clear5 = table.clear_in_flight(slot, 5);
    let clear40 = table.clear_in_flight(slot, 40);
    let beat = table.beat(slot);
    println!(
        "after the stalled registrant ran on: {snap:?} clear5={clear5} clear40={clear40} beat={beat}"
    );
    let mut broken = Vec::new();
    if !(snap.pid == me() && !snap.fenced && beat) {
        broken.push("the new registration lost its slot".to_string());
    }
    if snap.in_flight_bitmap != units {
        broken.push(format!(
            "its in-flight units {units:#x} became {:#x} (no scan can ever report them)",
            snap.in_flight_bitmap
        ));
    }
    if !(clear5 && clear40) {
        broken.push("it can no longer clear its own units (told 'fenced' while live)".into());
    }
    if snap.identity != Identity::current() {
        broken.push(format!("its identity was overwritten: {:?}", snap.identity));
    }
    assert!(
        broken.is_empty(),
        "a registrant continued after its stall corrupted the next registration: {broken:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// Heartbeat: fork without exec of a worker.
// ---------------------------------------------------------------------------------------

const HB_FORK: &str = "hb_forked_worker_child_is_a_new_identity_and_only_its_units_are_reclaimed";

/// A worker (registered with `join`, unit 3 in flight) forks without exec. In the child,
/// beat/mark/clear/unregister of the parent's slot, the inherited guard's calls and its
/// drop must all fail and change nothing; the child registers itself, marks unit 9 and
/// exits. Promise (heartbeat.md): "The handle's memory of its registrations is valid only
/// in the process that made them: a child made by `fork` starts afresh"; a dead process is
/// reported by OS identity within grace and `reclaim` returns exactly its units. The
/// watchdog reports the child's slot only, with unit 9; the parent keeps unit 3.
#[test]
fn hb_forked_worker_child_is_a_new_identity_and_only_its_units_are_reclaimed() {
    fn role_forker() {
        let t = HeartbeatTable::open(path_arg("path"), 4).unwrap();
        let reg = t.join().unwrap();
        let slot = reg.slot();
        reg.mark_in_flight(3).unwrap();
        // SAFETY: the forked child only calls this crate and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let beat = t.beat(slot);
            let mark = t.mark_in_flight(slot, 4);
            let clear = t.clear_in_flight(slot, 3);
            let guard = reg.beat().is_ok() || reg.mark_in_flight(5).is_ok();
            drop(reg);
            let unreg = t.unregister(slot);
            let own = t.register(me()).unwrap();
            let own_mark = t.mark_in_flight(own, 9) && t.beat(own);
            report(format!(
                "child beat={beat} mark={mark} clear={clear} guard={guard} unreg={unreg} \
                 own={own} own_mark={own_mark}"
            ));
            // SAFETY: ends the forked child at once, with unit 9 in flight.
            unsafe { libc::_exit(0) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let snap = t.snapshot(slot).unwrap();
        report(format!(
            "parent slot={slot} bits={} fenced={} beat={}",
            snap.in_flight_bitmap,
            snap.fenced,
            reg.beat().is_ok()
        ));
        std::mem::forget(reg);
        sleep_forever();
    }
    play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 4).unwrap();
    let mut forker = RoleCommand::new(HB_FORK, "forker")
        .arg("path", &path)
        .spawn();
    let child = forker.next_report(REPORT_WAIT);
    let parent = forker.next_report(REPORT_WAIT);
    println!("{child}\n{parent}");
    for key in ["beat", "mark", "clear", "guard", "unreg"] {
        assert!(
            !flag(&child, key),
            "the forked child's {key} acted for the parent: {child}"
        );
    }
    assert!(flag(&child, "own_mark"));
    assert_eq!(num(&parent, "bits"), 1 << 3, "{parent}");
    assert!(
        !flag(&parent, "fenced") && flag(&parent, "beat"),
        "{parent}"
    );
    let pslot = num(&parent, "slot") as usize;
    let cslot = num(&child, "own") as usize;
    assert_ne!(pslot, cslot);
    let w = FailoverWatchdog::with_grace(&table, 1 << 40).with_os_check_interval(Duration::ZERO);
    let mut reported = Vec::new();
    for _ in 0..5 {
        reported.extend(
            w.scan()
                .dead_slots
                .into_iter()
                .map(|(s, snap)| (s, snap.in_flight_bitmap)),
        );
        if !reported.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        reported,
        vec![(cslot, 1 << 9)],
        "only the dead child is dead"
    );
    assert_eq!(w.reclaim(cslot), 1 << 9);
    let snap = table.snapshot(pslot).unwrap();
    assert!(!snap.fenced && snap.in_flight_bitmap == 1 << 3, "{snap:?}");
    forker.kill();
}

// ---------------------------------------------------------------------------------------
// Heartbeat: registration on behalf of another process, which dies.
// ---------------------------------------------------------------------------------------

const HB_PROXY: &str = "hb_registration_for_another_pid_is_reported_when_that_process_dies";

/// The parent registers a slot for a child's pid (`register(pid)`), marks unit 3 and
/// does not beat; grace is huge. While the child lives, no scan reports the slot; once
/// the child is dead, the OS-identity pass reports it within grace, `reclaim` returns
/// unit 3 exactly once, and the registering handle is fenced ("told so"). Promise
/// (heartbeat.md, Pitfalls): "register(pid) looks up the identity of the process pid
/// names at that moment"; failover-watchdog.md: reported as dead when the recorded
/// identity is dead "even if its lag is within grace".
#[test]
fn hb_registration_for_another_pid_is_reported_when_that_process_dies() {
    fn role_sleeper() {
        report("up");
        sleep_forever();
    }
    play_role!(role_sleeper);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let table = HeartbeatTable::create(d.path().join("hb"), 4).unwrap();
    let mut kid = RoleCommand::new(HB_PROXY, "sleeper").spawn();
    kid.next_report(REPORT_WAIT);
    let slot = table.register(kid.pid()).unwrap();
    assert!(table.mark_in_flight(slot, 3));
    let snap = table.snapshot(slot).unwrap();
    assert_eq!(snap.identity.pid, kid.pid());
    assert!(snap.identity.is_known(), "{snap:?}");
    assert_ne!(snap.identity, Identity::current());
    let w = FailoverWatchdog::with_grace(&table, 1 << 40).with_os_check_interval(Duration::ZERO);
    for _ in 0..10 {
        assert!(
            w.scan().dead_slots.is_empty(),
            "reported while its process lives"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    kid.kill();
    let mut got = 0;
    for _ in 0..10 {
        for (s, _) in w.scan().dead_slots {
            assert_eq!(s, slot);
            got |= w.reclaim(s);
        }
        if got != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(got, 1 << 3, "the dead process's unit was not reclaimed");
    assert!(
        !table.beat(slot),
        "the registering handle was not told it was fenced"
    );
    assert!(!table.mark_in_flight(slot, 4));
    assert_eq!(w.reclaim(slot), 0);
    assert!(w.scan().dead_slots.is_empty());
}

// ---------------------------------------------------------------------------------------
// Watchdog: SIGSTOPped between its scan and its reclaim.
// ---------------------------------------------------------------------------------------

const HB_WD_STOP: &str = "hb_watchdog_stopped_between_scan_and_reclaim_takes_nothing_twice";

/// Watchdog A (a child) scans and reports a dead worker's slot, then stops itself
/// (SIGSTOP) before `reclaim`. Watchdog B (the parent) reclaims the units, the slot is
/// re-registered by a new worker (the parent) which marks units of its own, and A is
/// continued. Promise (failover-watchdog.md): "Each bit is returned by exactly one
/// `reclaim` call"; "A slot unregistered or re-registered since the scan has another
/// owner word or generation, so it is never touched." A's reclaim returns 0 and the new
/// registration keeps its units and its slot.
#[test]
fn hb_watchdog_stopped_between_scan_and_reclaim_takes_nothing_twice() {
    fn role_worker() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        let slot = t.register(me()).unwrap();
        assert!(t.mark_in_flight(slot, 1));
        assert!(t.mark_in_flight(slot, 33));
        report(format!("slot={slot}"));
        sleep_forever();
    }
    fn role_watchdog() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        let w = FailoverWatchdog::with_grace(&t, 2).with_os_check_interval(Duration::MAX);
        let dead = loop {
            let r = w.scan();
            if let Some((slot, snap)) = r.dead_slots.first() {
                break (*slot, snap.in_flight_bitmap);
            }
        };
        report(format!("scanned slot={} bits={}", dead.0, dead.1));
        // SAFETY: raise has no memory-safety preconditions.
        unsafe { libc::raise(libc::SIGSTOP) };
        let got = w.reclaim(dead.0);
        let cleared = w.clear_dead_bitmap(dead.0);
        report(format!("reclaimed bits={got} cleared={cleared}"));
    }
    play_role!(role_worker, role_watchdog);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let mut worker = RoleCommand::new(HB_WD_STOP, "worker")
        .arg("path", &path)
        .spawn();
    let slot = num(&worker.next_report(REPORT_WAIT), "slot") as usize;
    let units = (1u64 << 1) | (1u64 << 33);
    let mut a = RoleCommand::new(HB_WD_STOP, "watchdog")
        .arg("path", &path)
        .spawn();
    let scanned = a.next_report(REPORT_WAIT);
    assert_eq!(num(&scanned, "slot") as usize, slot);
    assert_eq!(num(&scanned, "bits"), units);
    a.wait_state('T', Duration::from_secs(5));
    // Watchdog B.
    let b = FailoverWatchdog::with_grace(&table, 2).with_os_check_interval(Duration::MAX);
    let r = b.scan();
    assert_eq!(r.dead_slots.len(), 1, "{r:?}");
    assert_eq!(
        b.reclaim(slot),
        units,
        "B did not get the dead worker's units"
    );
    worker.kill();
    // A new worker takes the slot over and marks units of its own.
    let mine = table
        .register(me())
        .expect("the reclaimed slot is reusable");
    assert_eq!(mine, slot);
    assert!(table.mark_in_flight(mine, 1));
    assert!(table.mark_in_flight(mine, 50));
    let new_units = (1u64 << 1) | (1u64 << 50);
    a.cont();
    let fin = a.next_report(REPORT_WAIT);
    println!("{fin}");
    assert_eq!(
        num(&fin, "bits"),
        0,
        "A reclaimed units twice / from the new owner"
    );
    assert_eq!(num(&fin, "cleared"), 0, "A erased the new owner's units");
    let snap = table.snapshot(mine).unwrap();
    assert!(
        !snap.fenced && snap.pid == me(),
        "A fenced the new owner: {snap:?}"
    );
    assert_eq!(snap.in_flight_bitmap, new_units);
    assert!(table.beat(mine) && table.clear_in_flight(mine, 50));
    assert_eq!(b.reclaim(slot), 0, "B reclaimed twice");
}

// ---------------------------------------------------------------------------------------
// Heartbeat: many processes racing into an almost-full table.
// ---------------------------------------------------------------------------------------

const HB_RACE: &str = "hb_racing_registrations_into_an_almost_full_table_get_distinct_slots";

/// Capacity 8, two slots taken by the (live) parent; 12 processes released at once all
/// `register` their own pid. Promise (heartbeat.md): register takes a free slot or
/// fails with `TableFull`; one registration per slot (owner CAS). Exactly 6 win, on 6
/// distinct free slots, each recorded with its own pid and identity; 6 get `TableFull`
/// (counted).
#[test]
fn hb_racing_registrations_into_an_almost_full_table_get_distinct_slots() {
    fn role_racer() {
        let t = HeartbeatTable::open(path_arg("path"), 8).unwrap();
        let go = path_arg("go");
        report("READY");
        while !go.exists() {
            std::hint::spin_loop();
        }
        match t.register(me()) {
            Ok(s) => {
                let ok = t.beat(s) && t.mark_in_flight(s, 7) && t.clear_in_flight(s, 7);
                report(format!("won=true slot={s} ok={ok}"));
            }
            Err(e) => report(format!(
                "won=false full={}",
                matches!(e, HeartbeatError::TableFull)
            )),
        }
        sleep_forever();
    }
    play_role!(role_racer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let go = d.path().join("go");
    let table = HeartbeatTable::create(&path, 8).unwrap();
    let a = table.register(me()).unwrap();
    let b = table.register(me()).unwrap();
    let mut kids: Vec<_> = (0..12)
        .map(|_| {
            RoleCommand::new(HB_RACE, "racer")
                .arg("path", &path)
                .arg("go", &go)
                .spawn()
        })
        .collect();
    for k in &mut kids {
        k.next_report(REPORT_WAIT);
    }
    touch(&go);
    let mut won = Vec::new();
    let mut lost = 0;
    for k in &mut kids {
        let line = k.next_report(REPORT_WAIT);
        if flag(&line, "won") {
            assert!(flag(&line, "ok"), "a winner could not use its slot: {line}");
            won.push((num(&line, "slot") as usize, k.pid()));
        } else {
            assert!(flag(&line, "full"), "{line}");
            lost += 1;
        }
    }
    println!("won {won:?}, lost {lost}");
    let mut slots: Vec<usize> = won.iter().map(|w| w.0).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), won.len(), "two winners share a slot: {won:?}");
    assert_eq!(won.len(), 6, "winners {won:?}");
    assert_eq!(lost, 6);
    for &(s, pid) in &won {
        assert!(s != a && s != b, "a racer took a live slot of the parent");
        let snap = table.snapshot(s).unwrap();
        assert_eq!(snap.pid, pid, "slot {s} names another pid: {snap:?}");
        assert!(!snap.fenced);
        assert_eq!(snap.identity.pid, pid);
        assert!(
            snap.identity.is_known(),
            "slot {s}: identity unknown {snap:?}"
        );
    }
    assert_eq!(table.stats().table_full, 6);
    for k in &mut kids {
        k.kill();
    }
}

// ---------------------------------------------------------------------------------------
// Semaphore: hand-off with disown, then the giver is SIGKILLed.
// ---------------------------------------------------------------------------------------

const SEM_HANDOFF: &str = "sem_handed_off_permit_survives_its_givers_death_and_returns_once";

/// Max 3. The giver acquires 2 permits, disowns one (hand-off) and keeps the other
/// (forgotten), then is SIGKILLed. A receiver holding none releases the handed permit;
/// `reclaim_dead` returns exactly the giver's held one. Promise (shared-semaphore.md,
/// Pitfalls): "call `Permit::disown()` in the giver, then the receiver's `release()`
/// returns it"; the disown "moves the permit from the holder's `held` to the `handed`
/// book atomically (so the disowner's death no longer returns it)"; S4: permits of a
/// dead holder return exactly once; never more than `max_permits`.
#[test]
fn sem_handed_off_permit_survives_its_givers_death_and_returns_once() {
    fn role_giver() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let a = sem.try_acquire().unwrap();
        let b = sem.try_acquire().unwrap();
        a.disown();
        std::mem::forget(b);
        report(format!("gave avail={}", sem.available()));
        sleep_forever();
    }
    fn role_receiver() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let first = sem.release();
        let second = sem.release();
        report(format!(
            "first={first} second={second} avail={}",
            sem.available()
        ));
    }
    play_role!(role_giver, role_receiver);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 3, 3).unwrap();
    let mut giver = RoleCommand::new(SEM_HANDOFF, "giver")
        .arg("path", &path)
        .spawn();
    let gave = giver.next_report(REPORT_WAIT);
    assert_eq!(num(&gave, "avail"), 1);
    giver.kill();
    // The giver is dead: only its held permit comes back, not the handed one.
    let back = sem.reclaim_dead();
    assert_eq!(
        back, 1,
        "reclaim returned {back} of the dead giver's 1 held permit"
    );
    assert_eq!(sem.available(), 2);
    let fin = RoleCommand::new(SEM_HANDOFF, "receiver")
        .arg("path", &path)
        .spawn()
        .finish(REPORT_WAIT);
    println!("{fin:?}");
    let fin = &fin[0];
    assert!(
        flag(fin, "first"),
        "the receiver could not return the handed permit"
    );
    assert!(!flag(fin, "second"), "the handed permit was returned twice");
    assert_eq!(num(fin, "avail"), 3);
    assert!(!sem.release(), "a non-holder released beyond the hand-off");
    assert_eq!(sem.reclaim_dead(), 0);
    assert_eq!(sem.available(), 3);
}

// ---------------------------------------------------------------------------------------
// Semaphore: a SIGSTOPped holder keeps its permit.
// ---------------------------------------------------------------------------------------

const SEM_STOPPED: &str = "sem_stopped_holder_keeps_its_permit_and_releases_after_sigcont";

/// Max 1. A holder takes the permit and is SIGSTOPped. A blocked acquirer (which
/// reclaims dead holders every 20 ms) and `reclaim_dead` must not take it: a stopped
/// process is alive (shared-semaphore.md: dead means "no process has it, ... or its whole
/// thread group has exited"; "never reclaim on a guess"). After SIGCONT the holder's
/// release works and the waiter gets the permit.
#[test]
fn sem_stopped_holder_keeps_its_permit_and_releases_after_sigcont() {
    fn role_holder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let p = sem.acquire();
        report("held");
        wait_go(&path_arg("go"));
        drop(p);
        report(format!("released avail={}", sem.available()));
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let go = d.path().join("go");
    let sem = SharedSemaphore::create(&path, 1, 1).unwrap();
    let mut holder = RoleCommand::new(SEM_STOPPED, "holder")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    holder.next_report(REPORT_WAIT);
    holder.stop();
    holder.wait_state('T', Duration::from_secs(5));
    assert!(
        sem.acquire_timeout(Duration::from_millis(300)).is_none(),
        "a waiter took a SIGSTOPped holder's permit"
    );
    assert_eq!(
        sem.reclaim_dead(),
        0,
        "reclaim took a stopped holder's permit"
    );
    assert_eq!(sem.available(), 0);
    let held: Vec<_> = sem
        .holders()
        .into_iter()
        .filter(|h| h.pid == holder.pid())
        .collect();
    assert!(
        held.len() == 1 && held[0].held == 1 && !held[0].reclaiming,
        "{held:?}"
    );
    holder.cont();
    touch(&go);
    let rel = holder.next_report(REPORT_WAIT);
    assert_eq!(num(&rel, "avail"), 1, "{rel}");
    let p = sem.acquire_timeout(Duration::from_secs(5));
    assert!(p.is_some(), "the released permit never came");
    drop(p);
    holder.kill();
    assert_eq!(
        sem.reclaim_dead(),
        0,
        "a holder that released had permits reclaimed"
    );
    assert_eq!(sem.available(), 1);
}

// ---------------------------------------------------------------------------------------
// Semaphore: a permit copied into a forked child (non-full table).
// ---------------------------------------------------------------------------------------

const SEM_FORK: &str = "sem_permit_copied_by_fork_is_still_the_parents";

/// Max 2, 8 holder slots. The forker holds one permit and forks. In the child, dropping
/// the inherited `Permit` and an explicit `release()` return nothing (the child is a new
/// holder that holds nothing); the child then takes a permit of its own and exits
/// without releasing it. Promise (shared-semaphore.md, Pitfalls, "fork with live
/// permits"): "A `Permit` copied into a forked child is still the parent's: the child is
/// a new holder (its own slot ...) that holds nothing, so dropping the copy there is a
/// release by a non-holder. It returns nothing". `reclaim_dead` then returns exactly the
/// child's permit; the forker still holds its own until it dies.
#[test]
fn sem_permit_copied_by_fork_is_still_the_parents() {
    fn role_forker() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let p = sem.acquire();
        // SAFETY: the forked child only calls this crate and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let before = sem.available();
            drop(p);
            let after_drop = sem.available();
            let release = sem.release();
            let own = sem.try_acquire().map(std::mem::forget).is_some();
            let after_own = sem.available();
            report(format!(
                "child before={before} after_drop={after_drop} release={release} own={own} \
                 after_own={after_own}"
            ));
            // SAFETY: ends the forked child at once, holding its own permit.
            unsafe { libc::_exit(0) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!("parent child={child} avail={}", sem.available()));
        std::mem::forget(p);
        sleep_forever();
    }
    play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let opts = SemaphoreOptions::default();
    let sem = SharedSemaphore::create_with(&path, 2, 2, &opts).unwrap();
    let mut forker = RoleCommand::new(SEM_FORK, "forker")
        .arg("path", &path)
        .spawn();
    let child = forker.next_report(REPORT_WAIT);
    let parent = forker.next_report(REPORT_WAIT);
    println!("{child}\n{parent}");
    assert_eq!(num(&child, "before"), 1);
    assert_eq!(
        num(&child, "after_drop"),
        1,
        "dropping the copied permit in the child returned the parent's permit"
    );
    assert!(!flag(&child, "release"), "a child holding nothing released");
    assert!(flag(&child, "own"));
    assert_eq!(num(&child, "after_own"), 0);
    assert_eq!(num(&parent, "avail"), 0);
    // The child is dead holding one permit; the forker holds its own.
    assert_eq!(
        sem.reclaim_dead(),
        1,
        "not exactly the dead child's permit came back"
    );
    assert_eq!(sem.available(), 1);
    let forker_holds: u32 = sem
        .holders()
        .iter()
        .filter(|h| h.pid == forker.pid())
        .map(|h| h.held)
        .sum();
    assert_eq!(forker_holds, 1, "{:?}", sem.holders());
    forker.kill();
    assert_eq!(sem.reclaim_dead(), 1);
    assert_eq!(sem.available(), 2);
}

// ---------------------------------------------------------------------------------------
// Semaphore: one forgotten permit released by two sibling threads, with an intruder.
// ---------------------------------------------------------------------------------------

const SEM_TWICE: &str = "sem_forgotten_permit_released_by_two_threads_returns_once";

/// Max 1. 2000 rounds: take the permit, `mem::forget` it, and let two threads call
/// `release()` at once. Meanwhile another process that holds nothing calls `release()`
/// in a loop. Promise (shared-semaphore.md): "Within one process, `mem::forget` +
/// `release()` is fine (all handles and threads of a process share one slot)"; a release
/// by a process that holds none returns `false` and changes nothing; "`avail` stays in
/// `0..=max_permits`". Each round exactly one of the two releases succeeds; the intruder
/// never succeeds.
#[test]
fn sem_forgotten_permit_released_by_two_threads_returns_once() {
    fn role_intruder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let stop = path_arg("stop");
        report("READY");
        let (mut tries, mut wins) = (0u64, 0u64);
        while !stop.exists() {
            for _ in 0..64 {
                tries += 1;
                wins += u64::from(sem.release());
            }
        }
        report(format!("tries={tries} wins={wins}"));
    }
    play_role!(role_intruder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let stop = d.path().join("stop");
    let sem = Arc::new(SharedSemaphore::create(&path, 1, 1).unwrap());
    let mut intruder = RoleCommand::new(SEM_TWICE, "intruder")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    intruder.next_report(REPORT_WAIT);
    let other = Arc::new(SharedSemaphore::open(&path).unwrap());
    let rounds = 2000;
    let barrier = Arc::new(Barrier::new(3));
    let wins = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [sem.clone(), other.clone()]
        .into_iter()
        .map(|s| {
            let (barrier, wins, done) = (barrier.clone(), wins.clone(), done.clone());
            std::thread::spawn(move || {
                loop {
                    barrier.wait();
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    if s.release() {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut bad = Vec::new();
    for round in 0..rounds {
        let p = sem
            .acquire_timeout(Duration::from_secs(5))
            .expect("the permit is back");
        std::mem::forget(p);
        wins.store(0, Ordering::SeqCst);
        barrier.wait();
        barrier.wait();
        let w = wins.load(Ordering::SeqCst);
        let avail = sem.available();
        if w != 1 || avail != 1 {
            bad.push((round, w, avail));
        }
    }
    done.store(true, Ordering::SeqCst);
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    touch(&stop);
    let fin = intruder.next_report(REPORT_WAIT);
    println!("{fin}; bad rounds {:?}", &bad[..bad.len().min(10)]);
    assert!(
        bad.is_empty(),
        "rounds with wins != 1 or avail != 1: {bad:?}"
    );
    assert!(num(&fin, "tries") > 0);
    assert_eq!(
        num(&fin, "wins"),
        0,
        "a process holding nothing released a permit"
    );
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.reclaim_dead(), 0);
}

// ---------------------------------------------------------------------------------------
// Semaphore: many processes racing `open` into an almost-full holder table.
// ---------------------------------------------------------------------------------------

const SEM_RACE: &str = "sem_racing_opens_into_an_almost_full_holder_table";

/// 4 holder slots, one taken by the (live) creator; 10 processes released at once all
/// `open` and take one permit (max 16). Promise (shared-semaphore.md): "A process that
/// finds every slot held by a live process is refused at `open` with `TableFull`";
/// registration CASes a free slot, one process per slot; no process runs untracked.
/// Exactly 3 open, on 3 distinct slots each holding its one permit; 7 get `TableFull`
/// (counted). One winner is SIGKILLed: a new opener then gets its slot, and exactly its
/// permit comes back.
#[test]
fn sem_racing_opens_into_an_almost_full_holder_table() {
    fn role_racer() {
        let path = path_arg("path");
        let go = path_arg("go");
        report("READY");
        while !go.exists() {
            std::hint::spin_loop();
        }
        match SharedSemaphore::open(&path) {
            Ok(sem) => {
                let took = sem.try_acquire().map(std::mem::forget).is_some();
                report(format!("won=true took={took}"));
                sleep_forever();
            }
            Err(e) => {
                let full = matches!(e, cxc_sync::SemaphoreError::TableFull { .. });
                report(format!("won=false full={full}"));
            }
        }
    }
    play_role!(role_racer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let go = d.path().join("go");
    let opts = SemaphoreOptions::default().holders(4);
    let sem = SharedSemaphore::create_with(&path, 16, 16, &opts).unwrap();
    let mut kids: Vec<_> = (0..10)
        .map(|_| {
            RoleCommand::new(SEM_RACE, "racer")
                .arg("path", &path)
                .arg("go", &go)
                .spawn()
        })
        .collect();
    for k in &mut kids {
        k.next_report(REPORT_WAIT);
    }
    touch(&go);
    let mut winners = Vec::new();
    let mut full = 0;
    for (i, k) in kids.iter_mut().enumerate() {
        let line = k.next_report(REPORT_WAIT);
        if flag(&line, "won") {
            assert!(flag(&line, "took"), "{line}");
            winners.push(i);
        } else {
            assert!(flag(&line, "full"), "{line}");
            full += 1;
        }
    }
    let holders = sem.holders();
    println!("winners {winners:?} full {full} holders {holders:?}");
    assert_eq!(winners.len(), 3, "{holders:?}");
    assert_eq!(full, 7);
    assert_eq!(sem.stats().table_full, 7);
    assert_eq!(sem.available(), 13);
    for &i in &winners {
        let pid = kids[i].pid();
        let mine: Vec<_> = holders.iter().filter(|h| h.pid == pid).collect();
        assert!(mine.len() == 1 && mine[0].held == 1, "{pid}: {holders:?}");
    }
    kids[winners[0]].kill();
    let fresh = RoleCommand::new(SEM_RACE, "racer")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    let mut fresh = fresh;
    fresh.next_report(REPORT_WAIT);
    let line = fresh.next_report(REPORT_WAIT);
    assert!(
        flag(&line, "won"),
        "the dead winner's slot was not reused: {line}"
    );
    assert_eq!(
        sem.available(),
        13,
        "not exactly the dead winner's permit came back"
    );
    for k in &mut kids {
        k.kill();
    }
    fresh.kill();
    assert_eq!(sem.reclaim_dead(), 3);
    assert_eq!(sem.available(), 16);
}

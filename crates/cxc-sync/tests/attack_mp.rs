//! Attacks on the documented promises of the owner lease, the shared semaphore, the
//! heartbeat table and the failover watchdog (docs/owner-lease.md, shared-semaphore.md,
//! heartbeat.md, failover-watchdog.md), with real processes: another process writing
//! garbage into a live file, a claim word with a WRITE or PRIVATE bit nobody will ever
//! clear, timeouts of zero and `Duration::MAX`, a forked child facing a full holder table,
//! a worker whose main thread exited, a SIGSTOPped worker, pids above `i32::MAX`, and a
//! process acting on another process's claim.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock) so the timing-sensitive ones do not compete
//! for the CPU.
#![cfg(not(cxc_loom))]

mod vandal;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatOptions, HeartbeatTable, LeaseOptions, OwnerLease,
    Preemption, SemaphoreOptions, SharedSemaphore,
};
use vandal::{op, role_vandal, stall_detector, vandalize};

use cxc_testkit::{
    RoleCommand, arg, fields, flag, num, path_arg, play_role, read_word, report, serial,
    sleep_forever,
};

/// The cxc file header's length: a primitive's block starts right after it.
const HEADER_LEN: u64 = 128;
/// Lease block size (docs/owner-lease.md, "Layout").
const LEASE_BLOCK: u64 = 7552;
/// `claim` word of the lease block.
const LEASE_CLAIM: u64 = HEADER_LEN;
/// Claim word bits (docs/owner-lease.md and lease/word.rs).
const LEASE_WRITE_BIT: u64 = 1 << 14;
const LEASE_PRIVATE_BIT: u64 = 1 << 23;
/// A grace no heartbeat exceeds (manual epochs that nobody ticks).
const BIG: u64 = 1 << 40;
/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// How long a child may take to finish once started.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn me() -> u32 {
    std::process::id()
}

fn never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

fn write_word(path: &Path, offset: u64, value: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_ne_bytes(), offset).unwrap();
}

/// Runs `f` on a thread and fails the test if it does not return within `limit`.
fn returns_within<R: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not return within {limit:?}"))
}

// ---------------------------------------------------------------------------------------
// Hostile bytes: a vandal process writes garbage into a live file while a victim process
// calls every operation. Promise: "hostile/corrupt files give a typed error, never a
// panic"; "nothing read from the file is trusted". No operation may panic or hang.
// ---------------------------------------------------------------------------------------

const VANDAL_LEASE: &str = "lease_garbage_from_another_process_never_panics_or_hangs";

const LEASE_OPS: &[&str] = &[
    "status",
    "try_claim",
    "read_claimed",
    "write_claimed",
    "beat_claimed",
    "release_claim",
    "try_acquire(fake)",
    "write_as_owner(fake)",
    "release(fake)",
    "with_lease",
    "acquire(2ms)",
    "try_lock",
    "guard.write",
    "guard drop",
    "tick_epoch",
    "inspect",
    "try_acquire(1)",
];

fn role_victim_lease() {
    let path = path_arg("path");
    let stop = path_arg("stop");
    let lease = OwnerLease::<u64>::open(&path).unwrap();
    let me = me();
    stall_detector(LEASE_OPS, Duration::from_secs(5));
    report("VICTIM started");
    let mut i = 0u64;
    while !stop.exists() {
        i += 1;
        let fake = 4_000_000 + (i % 3) as u32;
        op(0);
        let _ = (lease.status(), lease.current_claim(), lease.lease_term());
        let _ = (lease.payload_torn(), lease.stats(), lease.current_owner());
        op(1);
        if let Some(c) = lease.try_claim(me, 3) {
            op(2);
            let _ = lease.read_claimed(&c);
            op(3);
            let _ = lease.write_claimed(&c, i);
            op(4);
            let _ = lease.beat_claimed(&c);
            op(5);
            let _ = lease.release_claim(&c);
        }
        op(6);
        if lease.try_acquire(fake, 1) {
            op(7);
            let _ = lease.write_as_owner(fake, i);
            let _ = lease.read_as_owner(fake);
            op(8);
            let _ = lease.release(fake);
        }
        op(9);
        let _ = lease.with_lease(me, 3, |v| *v = v.wrapping_add(1));
        op(10);
        if let Some(c) = lease.acquire(me, 3, Duration::from_millis(2)) {
            let _ = lease.release_claim(&c);
        }
        op(11);
        if let Some(g) = lease.try_lock() {
            op(12);
            let _ = g.write(i);
            let _ = g.read();
            op(13);
            drop(g);
        }
        op(14);
        let _ = lease.tick_epoch();
        op(15);
        let _ = cxc_sync::lease::inspect(&path);
        op(16);
        if lease.try_acquire(1, 0) {
            let _ = lease.release(1);
        }
    }
    report(format!("VICTIM ops={}", vandal::ops()));
}

#[test]
fn lease_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        role_victim_lease()
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    drop(OwnerLease::<u64>::create(&path, 0).unwrap());
    let from = HEADER_LEN;
    vandalize(
        VANDAL_LEASE,
        d.path(),
        &path,
        from,
        from + LEASE_BLOCK,
        Duration::from_secs(3),
    );
}

/// Only the claim word, the heartbeat, the term and the identity table (the fields the
/// protocol decides on), so that nearly every write hits one.
#[test]
fn lease_garbage_in_claim_and_identity_words_never_panics_or_hangs() {
    fn role_victim() {
        role_victim_lease()
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    drop(OwnerLease::<u64>::create(&path, 0).unwrap());
    vandalize(
        "lease_garbage_in_claim_and_identity_words_never_panics_or_hangs",
        d.path(),
        &path,
        HEADER_LEN,
        HEADER_LEN + 64,
        Duration::from_secs(2),
    );
    vandalize(
        "lease_garbage_in_claim_and_identity_words_never_panics_or_hangs",
        d.path(),
        &path,
        HEADER_LEN + 768,
        HEADER_LEN + 768 + 4096,
        Duration::from_secs(2),
    );
}

const SEM_OPS: &[&str] = &[
    "available",
    "try_acquire",
    "acquire_timeout(1ms)",
    "release",
    "try_acquire_many(2)",
    "acquire_many_timeout(2, 1ms)",
    "reclaim_dead",
    "holders/stats",
    "disown",
    "inspect",
    "drop permit",
];

#[test]
fn semaphore_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let sem = SharedSemaphore::open(&path).unwrap();
        let max = sem.max_permits();
        stall_detector(SEM_OPS, Duration::from_secs(5));
        report("VICTIM started");
        let mut i = 0u64;
        while !stop.exists() {
            i += 1;
            op(0);
            assert!(sem.available() <= max, "available above max_permits");
            op(1);
            if let Some(p) = sem.try_acquire() {
                op(10);
                drop(p);
            }
            op(2);
            if let Some(p) = sem.acquire_timeout(Duration::from_millis(1)) {
                if i.is_multiple_of(7) {
                    op(8);
                    p.disown();
                } else {
                    std::mem::forget(p);
                    op(3);
                    let _ = sem.release();
                }
            }
            op(3);
            let _ = sem.release();
            op(4);
            drop(sem.try_acquire_many(2));
            op(5);
            drop(sem.acquire_many_timeout(2, Duration::from_millis(1)));
            op(6);
            let _ = sem.reclaim_dead();
            op(7);
            let _ = (sem.holders(), sem.stats());
            op(9);
            let _ = SharedSemaphore::inspect(&path);
        }
        report(format!("VICTIM ops={}", vandal::ops()));
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let opts = SemaphoreOptions::default().holders(8);
    drop(SharedSemaphore::create_with(&path, 3, 4, &opts).unwrap());
    // The count word, the handed book, and the holder table (owner and book words).
    let test = "semaphore_garbage_from_another_process_never_panics_or_hangs";
    vandalize(
        test,
        d.path(),
        &path,
        HEADER_LEN,
        HEADER_LEN + 24,
        Duration::from_secs(2),
    );
    vandalize(
        test,
        d.path(),
        &path,
        3008,
        3008 + 64 * 8,
        Duration::from_secs(2),
    );
}

const HB_OPS: &[&str] = &[
    "register",
    "beat",
    "mark_in_flight",
    "clear_in_flight",
    "snapshot",
    "scan",
    "reclaim",
    "clear_dead_bitmap",
    "sweep_idle",
    "unregister",
    "inspect",
    "join",
];

#[test]
fn heartbeat_garbage_from_another_process_never_panics_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let t = HeartbeatTable::open_any(&path).unwrap();
        stall_detector(HB_OPS, Duration::from_secs(5));
        report("VICTIM started");
        let w = FailoverWatchdog::with_grace(&t, 2).with_os_check_interval(Duration::ZERO);
        let mut i = 0u64;
        while !stop.exists() {
            i += 1;
            op(0);
            let slot = t.register(me()).ok();
            let fake = t.register(4_000_000 + (i % 5) as u32).ok();
            for s in slot.into_iter().chain(fake) {
                op(1);
                let _ = t.beat(s);
                op(2);
                let _ = t.mark_in_flight(s, (i % 64) as u8);
                op(3);
                let _ = t.clear_in_flight(s, ((i + 7) % 64) as u8);
            }
            op(4);
            for s in 0..t.capacity() + 1 {
                let _ = t.snapshot(s);
            }
            op(5);
            let r = w.scan();
            for (s, _) in &r.dead_slots {
                op(if i.is_multiple_of(2) { 6 } else { 7 });
                if i.is_multiple_of(2) {
                    let _ = w.reclaim(*s);
                } else {
                    let _ = w.clear_dead_bitmap(*s);
                }
            }
            op(8);
            let _ = w.sweep_idle();
            op(9);
            for s in slot.into_iter().chain(fake) {
                let _ = t.unregister(s);
            }
            op(10);
            let _ = HeartbeatTable::inspect(&path);
            op(11);
            if let Ok(r) = t.join() {
                let _ = r.mark_in_flight(3);
                let _ = r.beat();
                let _ = r.in_flight();
            }
        }
        report(format!("VICTIM ops={}", vandal::ops()));
    }
    play_role!(role_victim, role_vandal);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    drop(HeartbeatTable::create(&path, 8).unwrap());
    let test = "heartbeat_garbage_from_another_process_never_panics_or_hangs";
    vandalize(
        test,
        d.path(),
        &path,
        3008,
        3008 + 64 * 8,
        Duration::from_secs(3),
    );
}

// ---------------------------------------------------------------------------------------
// A claim word with an in-flight-write mark that nothing will ever clear.
// ---------------------------------------------------------------------------------------

/// The fuzz regression `release_of_claim_with_orphaned_write_bit_returns` sets bit 33,
/// the WRITE bit of an older claim-word layout (now a generation bit). Here with today's
/// WRITE bit (14) and PRIVATE bit (23): a claim made by this process for a pid, the
/// handle dropped, the bit set by a hostile writer, the file reopened. `try_acquire` +
/// `release` for that pid, `with_lease` and a takeover attempt by another pid must all
/// return (the doc: a live writer is waited for "briefly", at most ~100 ms).
#[test]
fn orphaned_write_or_private_bit_never_hangs_the_holders_own_calls() {
    let _s = serial();
    for bit in [
        LEASE_WRITE_BIT,
        LEASE_PRIVATE_BIT,
        LEASE_WRITE_BIT | LEASE_PRIVATE_BIT,
    ] {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("l");
        let pid = 4_000_000;
        let lease = OwnerLease::<u64>::create_with(&p, 5, &never()).unwrap();
        assert!(lease.try_acquire(pid, 1));
        drop(lease);
        let w = read_word(&p, LEASE_CLAIM);
        write_word(&p, LEASE_CLAIM, w | bit);
        let lease = OwnerLease::<u64>::open(&p).unwrap();
        assert_eq!(lease.current_owner(), Some(pid));
        let (again, released, after) =
            returns_within(&format!("bit {bit:#x}: release"), Duration::from_secs(5), {
                let lease = OwnerLease::<u64>::open(&p).unwrap();
                move || {
                    let again = lease.try_acquire(pid, 1);
                    let released = lease.release(pid);
                    (again, released, lease.current_owner())
                }
            });
        println!("bit {bit:#x}: try_acquire={again} release={released} owner={after:?}");
        let r = returns_within(
            &format!("bit {bit:#x}: with_lease"),
            Duration::from_secs(5),
            {
                let lease = OwnerLease::<u64>::open(&p).unwrap();
                move || lease.with_lease(pid, 1, |v| *v += 1)
            },
        );
        println!("bit {bit:#x}: with_lease={r:?}");
        let t = Instant::now();
        let got = returns_within(&format!("bit {bit:#x}: acquire"), Duration::from_secs(5), {
            let lease = OwnerLease::<u64>::open(&p).unwrap();
            move || {
                let c = lease.acquire(me(), 1, Duration::from_millis(200));
                c.map(|c| (c.generation(), lease.release_claim(&c)))
            }
        });
        println!("bit {bit:#x}: acquire={got:?} in {:?}", t.elapsed());
    }
}

// ---------------------------------------------------------------------------------------
// Timeouts of zero and `Duration::MAX`.
// ---------------------------------------------------------------------------------------

const LEASE_TIMEOUTS: &str = "lease_timeouts_of_zero_and_duration_max";

/// A zero timeout on a held lease returns `None` at once; `Duration::MAX` (too large to
/// add to `now`) waits, and takes over when the holder is SIGKILLed; a grace of
/// `u64::MAX` never makes a stopped holder stale, however often the epoch is ticked.
#[test]
fn lease_timeouts_of_zero_and_duration_max() {
    fn role_holder() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        let c = lease.acquire(me(), BIG, Duration::from_secs(5)).unwrap();
        assert!(lease.write_claimed(&c, 42));
        report(format!("HELD gen={}", c.generation()));
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).unwrap();
    let mut holder = RoleCommand::new(LEASE_TIMEOUTS, "holder")
        .arg("path", &path)
        .spawn();
    let held = holder.next_report(REPORT_WAIT);
    let held_gen = num(&held, "gen");

    let t = Instant::now();
    assert!(lease.acquire(me(), BIG, Duration::ZERO).is_none());
    assert!(lease.lock_timeout(Duration::ZERO).is_none());
    let zero = t.elapsed();
    assert!(
        zero < Duration::from_millis(200),
        "a zero timeout took {zero:?}"
    );

    // grace u64::MAX: a stopped holder is never stale.
    holder.stop();
    holder.wait_state('T', Duration::from_secs(5));
    for _ in 0..1000 {
        lease.tick_epoch();
    }
    assert!(
        !lease.try_acquire(me(), u64::MAX),
        "grace u64::MAX: a holder judged stale"
    );
    assert!(
        lease
            .acquire(me(), u64::MAX, Duration::from_millis(50))
            .is_none(),
        "grace u64::MAX: a holder judged stale"
    );
    holder.cont();

    // Duration::MAX waits, then takes over the killed holder.
    let waiter = std::thread::spawn({
        let path = path.clone();
        move || {
            let lease = OwnerLease::<u64>::open(&path).unwrap();
            let c = lease.acquire(me(), u64::MAX, Duration::MAX);
            let at = Instant::now();
            let v = c.as_ref().and_then(|c| lease.read_claimed(c));
            (c.map(|c| c.generation()), v, at)
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "acquire(Duration::MAX) returned early"
    );
    let killed = Instant::now();
    holder.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !waiter.is_finished() {
        assert!(
            Instant::now() < deadline,
            "acquire(Duration::MAX) never took over a SIGKILLed holder"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (g, v, at) = waiter.join().unwrap();
    assert_eq!(g, Some(held_gen + 1));
    assert_eq!(v, Some(42));
    println!("took over {:?} after the kill", at.duration_since(killed));
}

const SEM_TIMEOUTS: &str = "semaphore_timeouts_of_zero_and_duration_max";

/// `acquire_timeout(ZERO)` on an empty pool returns `None` at once and changes nothing;
/// `acquire_many` of 0 or more than `max_permits` is `None`; `Duration::MAX` waits and
/// gets the permit of a SIGKILLed holder (blocked acquirers reclaim); the `_owned`
/// variant too.
#[test]
fn semaphore_timeouts_of_zero_and_duration_max() {
    fn role_holder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let p = sem.acquire_many(2).unwrap();
        std::mem::forget(p);
        report("HELD");
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = std::sync::Arc::new(SharedSemaphore::create(&path, 2, 2).unwrap());
    assert!(sem.acquire_many(0).is_none());
    assert!(sem.acquire_many(3).is_none());
    assert!(sem.try_acquire_many(u32::MAX).is_none());
    assert!(sem.acquire_many_timeout(0, Duration::MAX).is_none());
    assert_eq!(sem.available(), 2);
    // (`acquire_many_timeout(n, Duration::MAX)`: see
    // `semaphore_acquire_many_gets_a_killed_holders_permits`.)
    for round in [0, 2] {
        let mut holder = RoleCommand::new(SEM_TIMEOUTS, "holder")
            .arg("path", &path)
            .spawn();
        assert_eq!(holder.next_report(REPORT_WAIT), "HELD");
        assert_eq!(sem.available(), 0);
        let t = Instant::now();
        assert!(sem.acquire_timeout(Duration::ZERO).is_none());
        assert!(sem.acquire_many_timeout(1, Duration::ZERO).is_none());
        assert!(sem.clone().acquire_owned_timeout(Duration::ZERO).is_none());
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(sem.available(), 0);
        let waiter = std::thread::spawn({
            let sem = sem.clone();
            move || match round {
                0 => sem
                    .acquire_timeout(Duration::MAX)
                    .map(std::mem::forget)
                    .is_some(),
                _ => sem
                    .clone()
                    .acquire_owned_timeout(Duration::MAX)
                    .map(std::mem::forget)
                    .is_some(),
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "round {round}: returned early");
        holder.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !waiter.is_finished() {
            assert!(
                Instant::now() < deadline,
                "round {round}: Duration::MAX never got the killed holder's permit"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(waiter.join().unwrap(), "round {round}");
        // Give back what the waiter took (forgotten) and what the dead holder left.
        while sem.release() {}
        let _ = sem.reclaim_dead();
        assert_eq!(sem.available(), 2, "round {round}: permits lost or doubled");
    }
}

// ---------------------------------------------------------------------------------------
// fork without exec against a full semaphore holder table.
// ---------------------------------------------------------------------------------------

const SEM_FORK_FULL: &str = "semaphore_forked_child_facing_a_full_table_never_runs_untracked";

/// Two holder slots: the parent's and the forker's. The forker's child (fork without
/// exec) finds the table full: it must not take a permit (`try_acquire`, `acquire_timeout`),
/// must not return one (`release`, dropping a `Permit` it inherited), and max_permits
/// holds throughout.
#[test]
fn semaphore_forked_child_facing_a_full_table_never_runs_untracked() {
    fn role_forker() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let p = sem.try_acquire().expect("a permit");
        let before = sem.available();
        // SAFETY: the child only makes semaphore calls, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let took = sem.try_acquire().map(std::mem::forget).is_some();
            let waited = sem
                .acquire_timeout(Duration::from_millis(100))
                .map(std::mem::forget)
                .is_some();
            let released = sem.release();
            drop(p); // the parent's permit, inherited
            let reg = sem.register().is_ok();
            report(format!(
                "CHILD took={took} waited={waited} released={released} registered={reg} \
                 avail={}",
                sem.available()
            ));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!(
            "FORKER before={before} after={} still_held={}",
            sem.available(),
            sem.holders().iter().any(|h| h.pid == me() && h.held == 1)
        ));
        std::mem::forget(p);
        sleep_forever();
    }
    play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let opts = SemaphoreOptions::default().holders(2);
    let sem = SharedSemaphore::create_with(&path, 2, 2, &opts).unwrap();
    let mut forker = RoleCommand::new(SEM_FORK_FULL, "forker")
        .arg("path", &path)
        .spawn();
    let child = forker.next_report(REPORT_WAIT);
    let parent = forker.next_report(REPORT_WAIT);
    println!("{child}\n{parent}");
    assert!(
        !flag(&child, "took"),
        "an unregistered forked child took a permit: {child}"
    );
    assert!(
        !flag(&child, "waited"),
        "an unregistered forked child took a permit: {child}"
    );
    assert!(
        !flag(&child, "released"),
        "a forked child returned a permit: {child}"
    );
    assert!(
        !flag(&child, "registered"),
        "a third process registered in 2 slots: {child}"
    );
    assert_eq!(num(&child, "avail"), 1, "{child}");
    assert_eq!(num(&parent, "after"), 1, "{parent}");
    assert!(flag(&parent, "still_held"), "{parent}");
    // Exactly one permit left for this process; max 2 never exceeded.
    let a = sem.try_acquire().expect("one permit left");
    assert!(sem.try_acquire().is_none(), "max_permits exceeded");
    drop(a);
    forker.kill();
    assert_eq!(sem.reclaim_dead(), 1);
    assert_eq!(sem.available(), 2);
}

// ---------------------------------------------------------------------------------------
// Heartbeat: a worker whose main thread exited; a stopped worker; odd pids.
// ---------------------------------------------------------------------------------------

fn main_thread_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

const HB_HALF_EXIT: &str = "heartbeat_worker_whose_main_thread_exited_is_never_reported";

/// A busy worker (a unit in flight) whose main thread exited while its worker thread
/// lives on, silent (no beats). The watchdog asks the OS on every scan (interval ZERO);
/// grace never expires. Promise: "a main thread that exited while other threads run is
/// *not* dead". Once the process is killed it is reported and its unit reclaimed. On the
/// pidfs and on the fallback identity path.
#[test]
fn heartbeat_worker_whose_main_thread_exited_is_never_reported() {
    fn role_worker() {
        let t = HeartbeatTable::open_any(path_arg("path")).unwrap();
        let slot = t.register(me()).unwrap();
        assert!(t.mark_in_flight(slot, 5));
        let idle = t.register(me()).unwrap();
        std::thread::spawn(move || {
            report(format!("SLOT slot={slot} idle={idle}"));
            let _t = t; // keeps the mapping
            sleep_forever();
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(cxc_testkit::exit_main_thread());
        sleep_forever();
    }
    play_role!(role_worker);
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create(&path, 4).unwrap();
        let w = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::ZERO);
        let mut cmd = RoleCommand::new(HB_HALF_EXIT, "worker").arg("path", &path);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        let line = kid.next_report(REPORT_WAIT);
        let (slot, idle) = (num(&line, "slot") as usize, num(&line, "idle") as usize);
        assert_ne!(slot, idle);
        assert!(
            cxc_testkit::wait_until(Duration::from_secs(5), || main_thread_state(kid.pid())
                == Some('Z')),
            "the main thread did not exit"
        );
        // Fill the table: a newcomer may not take the half-exited worker's idle slot.
        let fillers: Vec<usize> = (0..2)
            .map(|i| table.register(4_100_000 + i).unwrap())
            .collect();
        assert!(
            table.register(4_100_009).is_err(),
            "fallback={fallback}: a live (half-exited) worker's idle slot was reused"
        );
        let snap = table.snapshot(slot).unwrap();
        assert_eq!(snap.identity.is_fallback(), fallback);
        for i in 0..40 {
            let r = w.scan();
            assert!(
                r.dead_slots.is_empty(),
                "fallback={fallback}, scan {i}: a live worker whose main thread exited \
                 was reported dead: {:?}",
                r.dead_slots
            );
            assert_eq!(w.sweep_idle(), 0);
            std::thread::sleep(Duration::from_millis(2));
        }
        kid.kill();
        // Reported within two scans (one to see the heartbeat unmoved, one to ask).
        let dead: Vec<usize> = (0..2)
            .flat_map(|_| w.scan().dead_slots)
            .map(|(s, _)| s)
            .collect();
        assert!(
            dead.contains(&slot),
            "fallback={fallback}: the killed worker was not reported"
        );
        assert_eq!(w.reclaim(slot), 1 << 5);
        // Now dead: its idle slot (or the reclaimed one) is reused.
        let reused = table.register(4_100_009).expect("a dead worker's slot");
        assert!(reused == idle || reused == slot, "{reused}");
        assert!(!fillers.contains(&reused));
    }
}

const HB_STOPPED: &str = "heartbeat_stopped_worker_is_fenced_after_grace_never_before";

/// Clock epochs of 1 ms, grace 300 epochs. A worker beats every millisecond with a unit
/// in flight: never reported while it runs. SIGSTOPped: reported once its lag exceeds
/// the grace (not before), its unit reclaimed; SIGCONTed: its beat, mark and clear
/// return false ("a worker declared dead is fenced and told so").
#[test]
fn heartbeat_stopped_worker_is_fenced_after_grace_never_before() {
    fn role_worker() {
        let t = HeartbeatTable::open_any(path_arg("path")).unwrap();
        let slot = t.register(me()).unwrap();
        assert!(t.mark_in_flight(slot, 7));
        report(format!("SLOT slot={slot}"));
        let mut beats = 0u64;
        while t.beat(slot) {
            beats += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        let mark = t.mark_in_flight(slot, 8);
        let clear = t.clear_in_flight(slot, 7);
        let unreg = t.unregister(slot);
        report(format!(
            "FENCED beats={beats} mark={mark} clear={clear} unregister={unreg}"
        ));
        sleep_forever();
    }
    play_role!(role_worker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let opts = HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..HeartbeatOptions::default()
    };
    let table = HeartbeatTable::create_with(&path, 4, &opts).unwrap();
    let grace = 300;
    let w = FailoverWatchdog::with_grace(&table, grace).with_os_check_interval(Duration::ZERO);
    let mut kid = RoleCommand::new(HB_STOPPED, "worker")
        .arg("path", &path)
        .spawn();
    let slot = num(&kid.next_report(REPORT_WAIT), "slot") as usize;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(400) {
        let r = w.scan();
        assert!(
            r.dead_slots.is_empty(),
            "a beating worker was reported: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    kid.stop();
    kid.wait_state('T', Duration::from_secs(5));
    let stopped = Instant::now();
    let last_seen = table.snapshot(slot).unwrap().last_seen_epoch;
    let reported_at = loop {
        let r = w.scan();
        if !r.dead_slots.is_empty() {
            assert_eq!(r.dead_slots[0].0, slot);
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "never reported"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let lag = table.global_epoch().saturating_sub(last_seen);
    assert!(lag > grace, "reported with lag {lag} <= grace {grace}");
    assert!(
        reported_at >= Duration::from_millis(grace - 20),
        "a stopped worker was reported {reported_at:?} after its stop (grace {grace} ms)"
    );
    assert_eq!(w.reclaim(slot), 1 << 7);
    kid.cont();
    let fin = kid.next_report(REPORT_WAIT);
    println!("reported {reported_at:?} after the stop; {fin}");
    for key in ["mark", "clear", "unregister"] {
        assert!(!flag(&fin, key), "a fenced worker's {key} succeeded: {fin}");
    }
    let snap = table.snapshot(slot).unwrap();
    assert!(snap.fenced);
    assert_eq!(snap.in_flight_bitmap, 0, "a fenced worker set a bit");
    kid.kill();
}

/// Pids above `i32::MAX` ("negative" as `pid_t`) and `u32::MAX`: plain numbers to the
/// lease and the heartbeat table, no panic, an unknown identity that is never judged
/// dead by the OS, and round trips.
#[test]
fn pids_above_i32_max_are_plain_numbers() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let table = HeartbeatTable::create(d.path().join("hb"), 4).unwrap();
    let w = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::ZERO);
    let pids = [0x8000_0000u32, u32::MAX, i32::MAX as u32];
    let mut slots = Vec::new();
    for pid in pids {
        let s = table.register(pid).expect("register");
        assert!(table.mark_in_flight(s, 1));
        assert!(table.beat(s));
        let snap = table.snapshot(s).unwrap();
        assert_eq!(snap.pid, pid);
        assert!(
            !snap.identity.is_known(),
            "pid {pid:#x}: {:?}",
            snap.identity
        );
        slots.push(s);
    }
    for _ in 0..5 {
        assert!(w.scan().dead_slots.is_empty());
    }
    assert_eq!(w.sweep_idle(), 0);
    assert!(table.register(0).is_err());
    for s in slots {
        assert!(table.clear_in_flight(s, 1));
        assert!(table.unregister(s));
    }

    let lease = OwnerLease::<u64>::create_with(d.path().join("l"), 0, &never()).unwrap();
    for pid in pids {
        let c = lease.try_claim(pid, BIG).expect("claim");
        assert_eq!(lease.current_owner(), Some(pid));
        assert!(lease.write_as_owner(pid, u64::from(pid)));
        assert_eq!(lease.read_claimed(&c), Some(u64::from(pid)));
        assert!(lease.am_i_owner(pid));
        assert!(lease.release(pid));
        assert!(!lease.release(pid));
    }
}

// ---------------------------------------------------------------------------------------
// Another process against the holder's claim.
// ---------------------------------------------------------------------------------------

const LEASE_INTRUDER: &str = "another_process_cannot_act_on_the_holders_claim";

/// The parent holds the lease for its own pid. Another process calls everything with the
/// holder's pid and with the holder's token read through `current_claim()`: every call
/// returns false / None ("release by a non-holder returns false and changes nothing"; "a
/// token of another process's claim ... cannot write, read, beat or release"), and the
/// holder's claim, generation and value are unchanged.
#[test]
fn another_process_cannot_act_on_the_holders_claim() {
    fn role_intruder() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        let holder: u32 = arg("holder").parse().unwrap();
        let c = lease.current_claim().expect("a current claim");
        let res = [
            ("is_current", lease.is_current(&c)),
            ("release", lease.release(holder)),
            ("write_claimed", lease.write_claimed(&c, 666)),
            ("read_claimed", lease.read_claimed(&c).is_some()),
            ("beat_claimed", lease.beat_claimed(&c)),
            ("write_as_owner", lease.write_as_owner(holder, 667)),
            ("read_as_owner", lease.read_as_owner(holder).is_some()),
            ("beat", lease.beat(holder)),
            ("am_i_owner", lease.am_i_owner(holder)),
            ("try_acquire", lease.try_acquire(holder, BIG)),
            (
                "with_lease",
                lease.with_lease(holder, BIG, |v| *v = 668).is_some(),
            ),
            ("release_claim", lease.release_claim(&c)),
            (
                "acquire",
                lease
                    .acquire(holder, BIG, Duration::from_millis(50))
                    .is_some(),
            ),
            ("try_lock", lease.try_lock().is_some()),
        ];
        let line: Vec<String> = res.iter().map(|(k, v)| format!("{k}={v}")).collect();
        report(format!("INTRUDER {}", line.join(" ")));
    }
    play_role!(role_intruder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).unwrap();
    let c = lease.acquire(me(), BIG, Duration::from_secs(1)).unwrap();
    assert!(lease.write_claimed(&c, 42));
    let before = lease.status();
    let mut kid = RoleCommand::new(LEASE_INTRUDER, "intruder")
        .arg("path", &path)
        .arg("holder", me().to_string())
        .spawn();
    let line = kid.finish(CHILD_DEADLINE).pop().unwrap();
    println!("{line}");
    assert!(flag(&line, "is_current"), "{line}");
    for (k, v) in fields(&line) {
        if k != "is_current" {
            assert_eq!(
                v, "false",
                "another process's {k} acted on the holder's claim: {line}"
            );
        }
    }
    assert!(lease.is_current(&c));
    assert_eq!(
        lease.lease_term(),
        before.generation.max(lease.lease_term())
    );
    assert_eq!(
        lease.current_claim().map(|x| x.generation()),
        Some(c.generation())
    );
    assert_eq!(lease.read_claimed(&c), Some(42));
    assert!(lease.write_claimed(&c, 43));
    assert_eq!(lease.read_claimed(&c), Some(43));
    assert!(lease.release_claim(&c));
}

const SEM_MANY_RECLAIM: &str = "semaphore_acquire_many_gets_a_killed_holders_permits";

/// docs/shared-semaphore.md: permits of a process that dies are returned "by blocked
/// acquirers on their own ... a SIGKILLed holder's permits come back within ~20 ms of its
/// death without any call from the application"; guards.rs: `acquire_many` waits for
/// one permit "reclaiming dead holders while asleep". A holder takes permits and is
/// SIGKILLed; nobody calls `reclaim_dead`; a blocked `acquire_many_timeout(n, 1 s)` must
/// get them. (Control: `acquire_timeout` in the same situation.)
#[test]
fn semaphore_acquire_many_gets_a_killed_holders_permits() {
    fn role_holder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let n: u32 = arg("n").parse().unwrap();
        std::mem::forget(sem.acquire_many(n).unwrap());
        report("HELD");
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 2, 2).unwrap();
    let mut failures = Vec::new();
    // (permits the victim holds, permits wanted, use acquire_many)
    let cases = [(2, 2, true), (2, 1, true), (1, 2, true), (2, 1, false)];
    for (held, want, many) in cases {
        let mut holder = RoleCommand::new(SEM_MANY_RECLAIM, "holder")
            .arg("path", &path)
            .arg("n", held.to_string())
            .spawn();
        assert_eq!(holder.next_report(REPORT_WAIT), "HELD");
        holder.kill();
        let t = Instant::now();
        let got = if many {
            sem.acquire_many_timeout(want, Duration::from_secs(1))
                .map(|g| g.count())
        } else {
            sem.acquire_timeout(Duration::from_secs(1)).map(|p| {
                drop(p);
                1
            })
        };
        let took = t.elapsed();
        println!("held={held} want={want} many={many}: got {got:?} after {took:?}");
        if got.is_none() {
            failures.push(format!(
                "held={held} want={want} acquire_many={many}: nothing after {took:?}"
            ));
        }
        // Restore: whatever the dead holder still has comes back.
        let _ = sem.reclaim_dead();
        assert_eq!(sem.available(), 2);
    }
    assert!(
        failures.is_empty(),
        "a blocked acquirer never got a SIGKILLed holder's permits: {failures:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Sibling threads and forked children against guards and `with_lease`.
// ---------------------------------------------------------------------------------------

/// docs/owner-lease.md, Pitfalls: "`with_lease` of one thread and `write_as_owner` of
/// another on the same pid are serialised by the WRITE bit (a writer waits at most ~100 ms
/// for a sibling's write, then `write_as_owner` returns false)". A closure that runs
/// 600 ms: the sibling's write returns false well before the closure ends, and its value
/// is never published; the closure's value is.
#[test]
fn sibling_write_during_a_long_with_lease_fails_fast_and_never_publishes() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let lease = OwnerLease::<u64>::create_with(d.path().join("l"), 1, &never()).unwrap();
    let pid = me();
    let (in_tx, in_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let closure = s.spawn(|| {
            lease.with_lease(pid, BIG, |v| {
                in_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(600));
                *v = 7;
            })
        });
        in_rx.recv().unwrap();
        let t = Instant::now();
        let wrote = lease.write_as_owner(pid, 666);
        let took = t.elapsed();
        let closure_done = closure.is_finished();
        println!("sibling write_as_owner={wrote} after {took:?}");
        assert!(!wrote, "a sibling's write overlapped a with_lease closure");
        assert!(
            !closure_done && took < Duration::from_millis(450),
            "the sibling's write waited {took:?} (doc: at most ~100 ms)"
        );
        assert_eq!(closure.join().unwrap(), Some(()));
    });
    let c = lease.try_claim(pid, BIG).unwrap();
    assert_eq!(lease.read_claimed(&c), Some(7));
    assert!(lease.release_claim(&c));
}

/// A guard superseded as stale (manual epochs, a claimant for another pid with grace 0
/// after a tick; the guard's process alive, so its staging buffer is quarantined): the
/// guard's later write fails and is never published, and the quarantined buffer comes
/// back when the guard learns of the loss (write or drop) — 20 rounds, more than the
/// eight buffers, and the taker's writes still work. A sibling's `release(pid)` never
/// drops a guard's claim.
#[test]
fn superseded_guards_never_publish_and_leak_no_buffer() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).unwrap();
    let taker = OwnerLease::<u64>::open(&path).unwrap();
    let pid = me();
    let other = 4_000_000;
    for i in 0..20u64 {
        let g = lease.try_lock().expect("vacant");
        g.write(i).unwrap();
        let released = std::thread::scope(|s| s.spawn(|| lease.release(pid)).join().unwrap());
        assert!(
            !released,
            "round {i}: a pid release dropped a guard's claim"
        );
        taker.tick_epoch();
        let c = taker.try_claim(other, 0).expect("stale guard taken over");
        let learned_by_write = i % 2 == 0;
        if learned_by_write {
            assert!(
                g.write(1000 + i).is_err(),
                "round {i}: a superseded guard wrote"
            );
        }
        assert!(!g.is_current());
        drop(g);
        assert_eq!(taker.read_claimed(&c), Some(i), "round {i}");
        assert!(
            taker.write_claimed(&c, 2000 + i),
            "round {i}: the taker has no staging buffer (quarantines leaked)"
        );
        assert_eq!(taker.read_claimed(&c), Some(2000 + i));
        assert!(taker.release_claim(&c));
        let c = taker.try_claim(other, BIG).unwrap();
        assert!(taker.write_claimed(&c, i), "round {i}");
        assert!(taker.release_claim(&c));
    }
    let q = read_word(&path, LEASE_CLAIM) & (0xFF << 15);
    assert_eq!(
        q, 0,
        "buffers still quarantined after every guard learned of its loss"
    );
}

const GUARD_FORK: &str = "guard_inherited_by_a_forked_child_neither_writes_nor_releases";

/// A guard copied into a child by `fork` (no exec): the child's `write`, `unlock` and
/// drop must neither publish nor release the parent's claim ("A `LeaseClaim` token or a
/// guard copied into a forked child ... cannot write, read, beat or release"); the
/// parent's guard keeps working.
#[test]
fn guard_inherited_by_a_forked_child_neither_writes_nor_releases() {
    fn role_forker() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        let g = lease.try_lock().expect("vacant");
        g.write(11).unwrap();
        // SAFETY: the child only makes lease calls, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let w = g.write(666).is_ok();
            let r = g.read().is_ok();
            let b = g.beat().is_ok();
            let cur = g.is_current();
            let u = g.unlock().is_ok();
            report(format!(
                "CHILD write={w} read={r} beat={b} current={cur} unlock={u}"
            ));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let cur = g.is_current();
        let read = g.read().ok();
        let wrote = g.write(12).is_ok();
        report(format!(
            "PARENT current={cur} read={} wrote={wrote} unlock={}",
            read.unwrap_or(0),
            g.unlock().is_ok()
        ));
    }
    play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).unwrap();
    let mut kid = RoleCommand::new(GUARD_FORK, "forker")
        .arg("path", &path)
        .spawn();
    let reports = kid.finish(CHILD_DEADLINE);
    println!("{reports:?}");
    let child = reports.iter().find(|l| l.starts_with("CHILD")).unwrap();
    let parent = reports.iter().find(|l| l.starts_with("PARENT")).unwrap();
    for k in ["write", "read", "beat", "unlock"] {
        assert!(
            !flag(child, k),
            "a forked child's copy of a guard could {k}: {child}"
        );
    }
    assert!(flag(parent, "current"), "{parent}");
    assert_eq!(num(parent, "read"), 11, "{parent}");
    assert!(flag(parent, "wrote") && flag(parent, "unlock"), "{parent}");
    let c = lease.try_claim(me(), BIG).expect("released by the forker");
    assert_eq!(lease.read_claimed(&c), Some(12));
}

const GUARD_KILLED: &str = "blocked_lock_takes_over_a_killed_holder_at_once";

/// A guard blocked in `lock_timeout` (and `lock`) takes over a SIGKILLed holder at once
/// (OS identity), long before any heartbeat grace (manual epochs nobody ticks).
#[test]
fn blocked_lock_takes_over_a_killed_holder_at_once() {
    fn role_holder() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        let g = lease.try_lock().expect("vacant");
        g.write(5).unwrap();
        report("HELD");
        std::mem::forget(g);
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let lease = std::sync::Arc::new(OwnerLease::<u64>::create_with(&path, 0, &never()).unwrap());
    for blocking in [false, true] {
        let mut h = RoleCommand::new(GUARD_KILLED, "holder")
            .arg("path", &path)
            .spawn();
        assert_eq!(h.next_report(REPORT_WAIT), "HELD");
        let waiter = std::thread::spawn({
            let lease = lease.clone();
            move || {
                let g = if blocking {
                    Some(lease.lock())
                } else {
                    lease.lock_timeout(Duration::from_secs(3))
                };
                let at = Instant::now();
                let v = g
                    .as_ref()
                    .map(|g| (g.read().ok(), g.payload_may_be_inconsistent()));
                (v, at)
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished(), "took a live holder's lease");
        let killed = Instant::now();
        h.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !waiter.is_finished() {
            assert!(
                Instant::now() < deadline,
                "blocking={blocking}: never took over"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let (v, at) = waiter.join().unwrap();
        let took = at.duration_since(killed);
        println!("blocking={blocking}: {v:?} {took:?} after the kill");
        assert!(v.is_some(), "blocking={blocking}: timed out");
        assert!(
            took < Duration::from_secs(1),
            "blocking={blocking}: {took:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Old formats.
// ---------------------------------------------------------------------------------------

/// Old files are refused: a cxc header of format version 1 or 2 (offset 8) on a
/// semaphore and a heartbeat file (the lease has its own test), and a heartbeat file of
/// heartbeat format version 1 (`params[2]`): `open`, `open_any` and the read-only
/// `inspect` give a typed error, the version one naming both versions.
#[test]
fn old_format_semaphore_and_heartbeat_files_are_refused() {
    use cxc_mmf::MmfError;
    use cxc_sync::{HeartbeatError, SemaphoreError};
    let d = tempfile::tempdir().unwrap();
    for old in [1u32, 2] {
        let s = d.path().join(format!("sem{old}"));
        drop(SharedSemaphore::create(&s, 1, 1).unwrap());
        let h = d.path().join(format!("hb{old}"));
        drop(HeartbeatTable::create(&h, 2).unwrap());
        for p in [&s, &h] {
            let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            f.write_all_at(&old.to_ne_bytes(), 8).unwrap();
        }
        let sem_errs = [
            SharedSemaphore::open(&s).map(|_| ()),
            SharedSemaphore::open_unregistered(&s).map(|_| ()),
            SharedSemaphore::inspect(&s).map(|_| ()),
        ];
        for e in sem_errs {
            assert!(
                matches!(
                    e,
                    Err(SemaphoreError::File(MmfError::UnsupportedVersion { found, .. })) if found == old
                ),
                "semaphore file of format {old}: {e:?}"
            );
        }
        let hb_errs = [
            HeartbeatTable::open(&h, 2).map(|_| ()),
            HeartbeatTable::open_any(&h).map(|_| ()),
            HeartbeatTable::inspect(&h).map(|_| ()),
        ];
        for e in hb_errs {
            assert!(
                matches!(
                    e,
                    Err(HeartbeatError::File(MmfError::UnsupportedVersion { found, .. })) if found == old
                ),
                "heartbeat file of format {old}: {e:?}"
            );
        }
    }
    // Heartbeat format version 1 in params[2], with a valid header.
    use std::sync::atomic::AtomicU64;
    let p = d.path().join("hbv1");
    let layout = cxc_mmf::Layout {
        kind: cxc_mmf::Kind::Heartbeat,
        head_size: 2880,
        slot_size: 64,
        capacity: 2,
        payload: cxc_mmf::TypeFingerprint::NONE,
        params: [0, 0, 1, 0],
    };
    drop(
        cxc_mmf::Mapped::<[AtomicU64; 360], [AtomicU64; 8]>::create(
            &p,
            layout,
            &cxc_mmf::CreateOptions::default(),
            |_, _| {},
        )
        .unwrap(),
    );
    let errs = [
        HeartbeatTable::open(&p, 2).map(|_| ()),
        HeartbeatTable::open_any(&p).map(|_| ()),
        HeartbeatTable::inspect(&p).map(|_| ()),
    ];
    for e in errs {
        match e {
            Err(HeartbeatError::File(e @ MmfError::ParamMismatch { .. })) => {
                let text = e.to_string();
                assert!(text.contains('1') && text.contains('2'), "{text}");
            }
            other => panic!("heartbeat format version 1 accepted or odd error: {other:?}"),
        }
    }
}

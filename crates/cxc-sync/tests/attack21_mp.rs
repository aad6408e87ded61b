//! attack21: process identity (pid reuse, pid namespaces, fork, half-exited processes,
//! exec) across the primitives, with real processes.
//!
//! Two families need root (pid namespaces, `ns_last_pid`) and say "SKIPPED: needs root"
//! otherwise:
//!
//! - **The heir**: a process P (pid X) holds something through its handles and forks a
//!   child C that never touches them. P is SIGKILLed; C then forks a grandchild G that
//!   gets pid X back (a fresh pid namespace whose `ns_last_pid` the scenario sets). G is a
//!   new process with a dead holder's pid that happens to have copies of the dead
//!   holder's handles (and guards) in memory, as any process made by `fork` without
//!   `exec` does. The identity model says it is another identity and inherits nothing.
//! - **The namespace hop**: a process opens a file in its own pid namespace (accepted),
//!   then `unshare(CLONE_NEWPID)` and `fork`: the child runs in a new pid namespace with
//!   the handle it inherited, without ever calling `open` (which is where the semaphore
//!   and the rwlock refuse a foreign namespace).
//!
//! The others need nothing special.
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionConfig, Elector, EpochMode, FailoverWatchdog, HeartbeatTable, LeaseOptions,
    MmapElection, OwnerLease, Preemption, RwLockOptions, SharedRwLock, SharedSemaphore,
};
use cxc_testkit::{
    Proc, RoleCommand, child_wait_for_path, flag, num, path_arg, serial, sleep_forever,
    wait_for_path, wait_until,
};
use procs::*;

/// A heartbeat grace no test reaches: only the OS identity can end a claim.
const HUGE_GRACE: u64 = 1 << 40;

fn me() -> u32 {
    std::process::id()
}

/// The scenario dies with its `nsroot` parent (and, as pid 1 of its namespace, takes
/// every process of the namespace with it), so a killed or timed-out test leaves nothing
/// behind.
fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

// ---------------------------------------------------------------------------------------
// The heir: a fork descendant that gets a dead holder's pid back.
// ---------------------------------------------------------------------------------------

/// In holder P (pid X), after it took its hold: forks C, which leaves every handle
/// alone, waits for `fork_now`, and forks G; G (given pid X by the scenario) runs `act`
/// and writes `pid=<its pid> <act's line>` to `result`, then lives on (so pid X keeps
/// naming it). P reports `HELD` and sleeps until killed.
fn fork_heir(act: impl FnOnce() -> String) -> ! {
    let d = dir();
    // SAFETY: the child only waits for a file, forks, and runs `act` in the grandchild.
    let c = unsafe { libc::fork() };
    assert!(c >= 0, "fork: {}", std::io::Error::last_os_error());
    if c == 0 {
        child_wait_for_path(&d.join("fork_now"), Duration::from_secs(30));
        // SAFETY: as above; the grandchild runs `act` and writes a file.
        let g = unsafe { libc::fork() };
        if g == 0 {
            let line = format!("pid={} {}", me(), act());
            let tmp = d.join("result.tmp");
            std::fs::write(&tmp, line).expect("write the result");
            std::fs::rename(&tmp, d.join("result")).expect("publish the result");
        }
        sleep_forever();
    }
    report(format!("HELD heir={c}"));
    sleep_forever();
}

/// In the scenario (pid 1 of its namespace): SIGKILLs holder P (and reaps it), waits past
/// the fallback path's same-tick window, makes P's pid the next one of the namespace and
/// lets P's child fork the grandchild G. Returns G's line, after checking that G got P's
/// pid.
fn heir_with_the_holders_pid(holder: &mut Proc) -> String {
    let x = holder.pid();
    holder.kill();
    std::thread::sleep(Duration::from_millis(30));
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", x - 1))
        .expect("write ns_last_pid");
    std::fs::write(dir().join("fork_now"), b"").unwrap();
    let res = dir().join("result");
    assert!(
        wait_for_path(&res, Duration::from_secs(10)),
        "the grandchild never reported"
    );
    let line = std::fs::read_to_string(&res).unwrap();
    assert_eq!(
        num(&line, "pid"),
        u64::from(x),
        "harness: the grandchild did not get the dead holder's pid: {line}"
    );
    println!("grandchild with the dead holder's pid {x}: {line}");
    line
}

/// Runs a heir test: the parent side (root check, new namespace), `nsroot`, or the
/// scenario and holder roles given.
fn heir_test(test: &str, fallback: bool, scenario: fn(&str), holder: fn()) {
    match role().as_deref() {
        Some("nsroot") => nsroot(test),
        Some("scenario") => {
            die_with_parent();
            mount_own_proc();
            assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
            scenario(test);
        }
        Some("holder") => holder(),
        Some(other) => panic!("unknown role {other}"),
        None => run_reuse_test(test, fallback),
    }
}

fn lease_opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..LeaseOptions::default()
    }
}

// Found (fixed since): the grandchild with the dead holder's pid is taken for it through the
// inherited handle's cache (keyed by pid alone): am_i_owner, write_as_owner and release
// all succeed, and its 666 is published under the dead holder's claim.
/// owner-lease.md, Identity: "PID reuse: with pidfs, a new process with a dead holder's
/// pid is a different identity: it never inherits the claim, and the dead holder's claim
/// is taken over as dead"; "The cache is correct after `fork` without `exec`: the child
/// is a new identity and registers its own slot."
#[test]
fn lease_heir_with_a_dead_holders_pid_never_inherits_its_claim() {
    heir_test(
        "lease_heir_with_a_dead_holders_pid_never_inherits_its_claim",
        false,
        |_| {
            let path = dir().join("lease");
            let lease = OwnerLease::<u64>::create_with(&path, 0, &lease_opts()).unwrap();
            let mut holder = spawn(
                "lease_heir_with_a_dead_holders_pid_never_inherits_its_claim",
                "holder",
                &dir(),
                &[],
            );
            wait_line(&mut holder, "HELD");
            let line = heir_with_the_holders_pid(&mut holder);
            let c = lease
                .try_claim(1, HUGE_GRACE)
                .expect("the dead holder's claim is taken over at once");
            let value = lease.read_claimed(&c);
            assert_eq!(
                (
                    flag(&line, "owner"),
                    flag(&line, "wrote"),
                    flag(&line, "released")
                ),
                (false, false, false),
                "a new process with the dead holder's pid acted as the holder: {line}"
            );
            assert_eq!(value, Some(1), "the heir's write was published");
        },
        || {
            let lease: &'static OwnerLease<u64> =
                Box::leak(Box::new(OwnerLease::open(dir().join("lease")).unwrap()));
            let x = me();
            assert!(lease.try_acquire(x, HUGE_GRACE));
            assert!(lease.write_as_owner(x, 1));
            fork_heir(move || {
                let owner = lease.am_i_owner(x);
                let wrote = lease.write_as_owner(x, 666);
                let released = lease.release(x);
                format!("owner={owner} wrote={wrote} released={released}")
            })
        },
    );
}

fn sem_heir_scenario(test: &str) {
    let sem = SharedSemaphore::create(dir().join("sem"), 1, 1).unwrap();
    let mut holder = spawn(test, "holder", &dir(), &[]);
    wait_line(&mut holder, "HELD");
    assert_eq!(sem.available(), 0);
    let line = heir_with_the_holders_pid(&mut holder);
    // The dead holder's permit comes back once; then this process takes it.
    let reclaimed = sem.reclaim_dead();
    let mine = sem.try_acquire();
    let in_use = u32::from(flag(&line, "took")) + u32::from(mine.is_some());
    assert!(
        in_use <= 1,
        "S1: {in_use} permits in use with max_permits 1 (the heir's permit was reclaimed \
         as the dead holder's while the heir holds it): {line}, reclaimed {reclaimed}"
    );
    assert!(
        !flag(&line, "released"),
        "a new process with the dead holder's pid released the dead holder's permit: {line}"
    );
    assert_eq!(reclaimed, 1, "the dead holder's permit, once");
}

fn sem_heir_holder() {
    let sem: &'static SharedSemaphore =
        Box::leak(Box::new(SharedSemaphore::open(dir().join("sem")).unwrap()));
    std::mem::forget(sem.acquire());
    fork_heir(move || {
        let released = sem.release();
        let took = sem.try_acquire().map(std::mem::forget).is_some();
        format!("released={released} took={took}")
    })
}

// Found (fixed since): the grandchild uses the dead holder's holder slot (the handle's slot
// cache is keyed by pid alone): its release() returns the dead holder's permit, its
// try_acquire is booked to the dead holder, and reclaim_dead then takes that permit back
// while the grandchild holds it (2 in use, max 1).
/// shared-semaphore.md: "Pid reuse. A new process that got a dead holder's pid has
/// another identity tag: it registers a slot of its own, holds nothing, cannot release
/// the dead holder's permits (`release()` → `false`)"; S1 "never more than max_permits
/// in use".
#[test]
fn sem_heir_with_a_dead_holders_pid_neither_releases_nor_shares_its_slot() {
    heir_test(
        "sem_heir_with_a_dead_holders_pid_neither_releases_nor_shares_its_slot",
        false,
        sem_heir_scenario,
        sem_heir_holder,
    );
}

// Found (fixed since): as the pidfs variant (the slot cache does not depend on the identity
// form).
/// As above, on the fallback identity path (pid + start time), reused well past the
/// same-tick window: shared-semaphore.md "On the fallback path (no pidfs), a pid reused
/// within the same start-time tick (10 ms) gives the same tag" is the only exception.
#[test]
fn sem_heir_with_a_dead_holders_pid_neither_releases_nor_shares_its_slot_fallback() {
    heir_test(
        "sem_heir_with_a_dead_holders_pid_neither_releases_nor_shares_its_slot_fallback",
        true,
        sem_heir_scenario,
        sem_heir_holder,
    );
}

fn rw_opts() -> RwLockOptions {
    RwLockOptions::default().grace(Duration::from_secs(20))
}

// Found (fixed since): the grandchild's copy of the dead writer's guard is current there
// (guards check the pid alone): it publishes 666 under the dead writer's lock and
// unlocks it.
/// shared-rwlock.md, Pitfalls: "Guards copied into a forked child hold nothing there
/// ... a write guard's read, write, update, beat and unlock return
/// `WriteGuardError::Lost` (`is_current` is false), so the child can neither publish
/// under nor release its parent's write lock"; "Dead writer: waiters see WRITER naming a
/// slot whose process is gone and evict it at once".
#[test]
fn rwlock_heir_with_a_dead_writers_pid_cannot_use_its_write_guard() {
    heir_test(
        "rwlock_heir_with_a_dead_writers_pid_cannot_use_its_write_guard",
        false,
        |test| {
            let lock = SharedRwLock::<u64>::create_with(dir().join("rw"), 0, &rw_opts()).unwrap();
            let mut holder = spawn(test, "holder", &dir(), &[]);
            wait_line(&mut holder, "HELD");
            let line = heir_with_the_holders_pid(&mut holder);
            assert_eq!(
                (
                    flag(&line, "current"),
                    flag(&line, "wrote"),
                    flag(&line, "unlocked")
                ),
                (false, false, false),
                "a new process with the dead writer's pid used its write guard: {line}"
            );
            let r = lock
                .read_timeout(Duration::from_secs(3))
                .expect("the dead writer is evicted at once");
            assert_eq!(r.get(), 1, "the heir's write was published");
        },
        || {
            let lock: &'static SharedRwLock<u64> =
                Box::leak(Box::new(SharedRwLock::open(dir().join("rw")).unwrap()));
            let w = lock.write();
            w.write(1).unwrap();
            fork_heir(move || {
                let current = w.is_current();
                let wrote = w.write(666).is_ok();
                let unlocked = w.unlock().is_ok();
                format!("current={current} wrote={wrote} unlocked={unlocked}")
            })
        },
    );
}

// Found (fixed since): the grandchild's read hold is counted in the dead reader's holder slot
// (slot cache keyed by pid alone); a writer reclaims that slot as dead and gets the
// write lock while the grandchild still reads.
/// shared-rwlock.md: "There are no untracked readers: a read hold is always counted in
/// the holder's slot"; "Dead reader ... a slot whose owner process is gone (... whole
/// thread group gone or pid reused) is taken over, its count zeroed"; "many readers or
/// one writer".
#[test]
fn rwlock_heir_with_a_dead_readers_pid_keeps_its_own_read_hold() {
    heir_test(
        "rwlock_heir_with_a_dead_readers_pid_keeps_its_own_read_hold",
        false,
        |test| {
            let lock = SharedRwLock::<u64>::create_with(dir().join("rw"), 0, &rw_opts()).unwrap();
            let mut holder = spawn(test, "holder", &dir(), &[]);
            wait_line(&mut holder, "HELD");
            let line = heir_with_the_holders_pid(&mut holder);
            assert!(flag(&line, "reading"), "{line}");
            let w = lock.write_timeout(Duration::from_millis(800));
            assert!(
                w.is_none(),
                "a writer got the lock while a live process (with a dead reader's pid) \
                 holds a read lock: {line}"
            );
        },
        || {
            let lock: &'static SharedRwLock<u64> =
                Box::leak(Box::new(SharedRwLock::open(dir().join("rw")).unwrap()));
            std::mem::forget(lock.read());
            fork_heir(move || {
                let r = lock.try_read();
                let reading = r.is_some();
                std::mem::forget(r);
                format!("reading={reading}")
            })
        },
    );
}

// Found (fixed since): the grandchild acts for the dead worker's slot through the handle it
// inherited (the handle remembers its registrations by pid alone): beat, marks, clears
// and unregisters succeed and the dead worker's unit is lost.
/// heartbeat.md: "Pid reuse: a new process that got a dead worker's pid has another
/// identity. It cannot adopt the dead worker's slot, so its beat, mark_in_flight,
/// clear_in_flight and unregister of that slot return false and change nothing; the
/// watchdog still reports the dead worker and reclaim returns exactly its units, once";
/// "a child made by `fork` starts afresh".
#[test]
fn heartbeat_heir_with_a_dead_workers_pid_cannot_act_for_its_slot() {
    heir_test(
        "heartbeat_heir_with_a_dead_workers_pid_cannot_act_for_its_slot",
        false,
        |test| {
            let table = HeartbeatTable::create(dir().join("hb"), 4).unwrap();
            let mut holder = spawn(test, "holder", &dir(), &[]);
            let held = wait_line(&mut holder, "HELD");
            drop(held);
            let slot = (0..4)
                .find(|&i| table.snapshot(i).is_some_and(|s| s.pid == holder.pid()))
                .expect("the worker's slot");
            let line = heir_with_the_holders_pid(&mut holder);
            let snap = table.snapshot(slot).unwrap();
            assert_eq!(
                (
                    flag(&line, "beat"),
                    flag(&line, "mark"),
                    flag(&line, "clear"),
                    flag(&line, "guard"),
                    flag(&line, "unregister")
                ),
                (false, false, false, false, false),
                "a new process with the dead worker's pid acted for its slot: {line}"
            );
            assert_eq!(snap.in_flight_bitmap, 1 << 3, "{snap:?}");
            let wd = FailoverWatchdog::with_grace(&table, HUGE_GRACE)
                .with_os_check_interval(Duration::ZERO);
            let t0 = Instant::now();
            let dead = loop {
                let r = wd.scan();
                if !r.dead_slots.is_empty() {
                    break r.dead_slots;
                }
                assert!(t0.elapsed() < Duration::from_secs(5), "never reported");
                std::thread::sleep(Duration::from_millis(10));
            };
            assert_eq!(dead.len(), 1);
            assert_eq!(wd.reclaim(slot), 1 << 3, "exactly the dead worker's unit");
        },
        || {
            let table: &'static HeartbeatTable =
                Box::leak(Box::new(HeartbeatTable::open(dir().join("hb"), 4).unwrap()));
            let reg = table.join().unwrap();
            let slot = reg.slot();
            reg.mark_in_flight(3).unwrap();
            reg.beat().unwrap();
            fork_heir(move || {
                let guard = reg.beat().is_ok();
                let beat = table.beat(slot);
                let mark = table.mark_in_flight(slot, 7);
                let clear = table.clear_in_flight(slot, 3);
                let unregister = table.unregister(slot);
                std::mem::forget(reg);
                format!(
                    "beat={beat} mark={mark} clear={clear} guard={guard} unregister={unregister}"
                )
            })
        },
    );
}

// Found (fixed since): the grandchild's copy of the dead leader's Leadership is current and
// renews (pid compared alone), so the dead leader's term goes on in a process that never
// campaigned.
/// leader-election.md: "A leader whose process dies is replaced at once (the OS proves it
/// dead: pidfd)"; "`fork` without `exec` (mapped file): the child's copy of a
/// `Leadership` is not the leader there: `is_current` is `false` and `renew` fails";
/// `observe()` is `None` "once ... its process is gone".
#[test]
fn election_heir_with_a_dead_leaders_pid_is_not_the_leader() {
    heir_test(
        "election_heir_with_a_dead_leaders_pid_is_not_the_leader",
        false,
        |test| {
            let backend =
                MmapElection::create_or_open(dir().join("el"), Duration::from_secs(20)).unwrap();
            let standby = Elector::new(
                backend,
                ElectionConfig::new("standby").lease_duration(Duration::from_secs(20)),
            )
            .unwrap();
            let mut holder = spawn(test, "holder", &dir(), &[]);
            wait_line(&mut holder, "HELD");
            let line = heir_with_the_holders_pid(&mut holder);
            let seen = standby.observe().unwrap();
            assert_eq!(
                (flag(&line, "current"), flag(&line, "renewed")),
                (false, false),
                "a new process with the dead leader's pid acts as the leader: {line}"
            );
            assert!(
                seen.is_none(),
                "the dead leader is still observed: {seen:?}"
            );
            let t0 = Instant::now();
            let won = standby.campaign(Duration::from_secs(3)).unwrap();
            assert!(won.is_some(), "the dead leader was not replaced");
            assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        },
        || {
            let backend =
                MmapElection::create_or_open(dir().join("el"), Duration::from_secs(20)).unwrap();
            let elector: &'static Elector<MmapElection> = Box::leak(Box::new(
                Elector::new(
                    backend,
                    ElectionConfig::new("leader").lease_duration(Duration::from_secs(20)),
                )
                .unwrap(),
            ));
            let l = elector
                .campaign(Duration::from_secs(5))
                .unwrap()
                .expect("elected");
            fork_heir(move || {
                let current = l.is_current().unwrap_or(false);
                let renewed = l.renew().is_ok();
                std::mem::forget(l);
                format!("current={current} renewed={renewed}")
            })
        },
    );
}

// ---------------------------------------------------------------------------------------
// The namespace hop: a handle carried into a new pid namespace by `fork`.
// ---------------------------------------------------------------------------------------

/// In role `hopper` (which opened its handles in the test's pid namespace): makes a new
/// pid namespace for its children and forks one (pid 1 there) that runs `act` with the
/// inherited handles, reports `HOPPED pid=<its pid> <act's line>` and lives on until the
/// hopper dies (parent-death signal), as does the hopper until the test kills it.
fn hop_into_a_new_pid_namespace(act: impl FnOnce() -> String) -> ! {
    // SAFETY: unshare(CLONE_NEWPID) only changes the namespace of future children.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWPID) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    // SAFETY: the child only makes calls of this crate and reports.
    let c = unsafe { libc::fork() };
    assert!(c >= 0, "fork: {}", std::io::Error::last_os_error());
    if c == 0 {
        die_with_parent();
        let line = act();
        report(format!("HOPPED pid={} {line}", me()));
    }
    sleep_forever();
}

/// The parent side of a hop test: `None` (and SKIPPED) unless root, else a fresh
/// directory with `setup` run in it, then the holder (role `holder`, reporting `HELD`)
/// and the hopper; returns the hopped child's line (checked to be pid 1 of its
/// namespace) with the directory and the two processes (killed on drop).
fn hop_test<H>(
    test: &str,
    setup: impl FnOnce(&std::path::Path) -> H,
) -> Option<(String, H, tempfile::TempDir, Proc, Proc)> {
    if skip_unless_root(test) {
        return None;
    }
    let d = tempfile::tempdir().unwrap();
    let h = setup(d.path());
    let mut holder = spawn(test, "holder", d.path(), &[]);
    wait_line(&mut holder, "HELD");
    let mut hopper = spawn(test, "hopper", d.path(), &[]);
    let line = wait_line(&mut hopper, "HOPPED");
    println!("{line}");
    assert_eq!(
        num(&line, "pid"),
        1,
        "harness: the hopped child is not pid 1 of a new namespace"
    );
    Some((line, h, d, holder, hopper))
}

const SEM_HOP: &str = "sem_handle_carried_into_another_pid_namespace_never_reclaims_live_holders";

// Found (fixed since): the child in the new namespace (never refused: it did not `open`)
// judges the live holder of the parent namespace dead (its pid names no process there),
// reclaims its permit and takes it: 2 permits in use with max_permits 1.
/// shared-semaphore.md, Pid namespaces: "A process of another pid namespace is refused
/// at `open` with `SemaphoreError::ForeignPidNamespace`: its pids (and the holders'
/// pids) would mean different processes on each side, so neither side could judge the
/// other's holders"; S1 "never more than `max_permits` in use".
#[test]
fn sem_handle_carried_into_another_pid_namespace_never_reclaims_live_holders() {
    match role().as_deref() {
        Some("holder") => {
            let sem = SharedSemaphore::open(dir().join("sem")).unwrap();
            std::mem::forget(sem.acquire());
            report("HELD");
            sleep_forever();
        }
        Some("hopper") => {
            let sem = SharedSemaphore::open(dir().join("sem")).unwrap();
            hop_into_a_new_pid_namespace(move || {
                let reclaimed = sem.reclaim_dead();
                let took = sem.try_acquire().map(std::mem::forget).is_some();
                format!("reclaimed={reclaimed} took={took}")
            })
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let Some((line, sem, _d, _holder, _hopper)) = hop_test(SEM_HOP, |d| {
                SharedSemaphore::create(d.join("sem"), 1, 1).unwrap()
            }) else {
                return;
            };
            assert_eq!(
                (num(&line, "reclaimed"), flag(&line, "took")),
                (0, false),
                "a process of another pid namespace reclaimed a live holder's permit and \
                 took it (max_permits 1): {line}"
            );
            assert_eq!(sem.available(), 0);
        }
    }
}

const RW_HOP: &str = "rwlock_handle_carried_into_another_pid_namespace_never_evicts_live_readers";

// Found (fixed since): the writer in the new namespace reclaims the parent namespace's live
// reader as dead (its pid names no process there) and gets the write lock while it reads.
/// shared-rwlock.md: "a process in another pid namespace than `params[2]` gets
/// `RwLockError::ForeignPidNamespace`"; reclaim only of "a slot whose owner process is
/// gone"; "many readers or one writer".
#[test]
fn rwlock_handle_carried_into_another_pid_namespace_never_evicts_live_readers() {
    match role().as_deref() {
        Some("holder") => {
            let lock = SharedRwLock::<u64>::open(dir().join("rw")).unwrap();
            std::mem::forget(lock.read());
            report("HELD");
            sleep_forever();
        }
        Some("hopper") => {
            let lock = SharedRwLock::<u64>::open(dir().join("rw")).unwrap();
            hop_into_a_new_pid_namespace(move || {
                let w = lock.write_timeout(Duration::from_millis(600));
                let wrote = w.is_some();
                std::mem::forget(w);
                format!("wrote={wrote}")
            })
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let Some((line, _lock, _d, _holder, _hopper)) = hop_test(RW_HOP, |d| {
                SharedRwLock::<u64>::create_with(d.join("rw"), 0, &rw_opts()).unwrap()
            }) else {
                return;
            };
            assert!(
                !flag(&line, "wrote"),
                "a process of another pid namespace got the write lock while a live reader \
                 reads: {line}"
            );
        }
    }
}

const LEASE_HOP: &str =
    "lease_handle_carried_into_another_pid_namespace_never_takes_over_a_live_holder";

/// owner-lease.md: "Pid namespaces: an identity recorded in another pid namespace than
/// the observer's is `Unknown` — never judged dead from there; its claims fail over by
/// heartbeat staleness only. A lease shared across pid namespaces therefore keeps L1–L7".
#[test]
fn lease_handle_carried_into_another_pid_namespace_never_takes_over_a_live_holder() {
    match role().as_deref() {
        Some("holder") => {
            let lease = OwnerLease::<u64>::open(dir().join("lease")).unwrap();
            assert!(lease.try_acquire(me(), HUGE_GRACE));
            report("HELD");
            sleep_forever();
        }
        Some("hopper") => {
            let lease = OwnerLease::<u64>::open(dir().join("lease")).unwrap();
            hop_into_a_new_pid_namespace(move || {
                let took = lease.try_acquire(me(), HUGE_GRACE);
                let waited = lease
                    .acquire(me(), HUGE_GRACE, Duration::from_millis(300))
                    .is_some();
                format!("took={took} waited={waited}")
            })
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let Some((line, lease, _d, holder, _hopper)) = hop_test(LEASE_HOP, |d| {
                OwnerLease::<u64>::create_with(d.join("lease"), 0, &lease_opts()).unwrap()
            }) else {
                return;
            };
            assert_eq!(
                (flag(&line, "took"), flag(&line, "waited")),
                (false, false),
                "a process of another pid namespace took a live holder's lease: {line}"
            );
            assert_eq!(lease.current_owner(), Some(holder.pid()));
        }
    }
}

const HB_HOP: &str =
    "heartbeat_watchdog_in_another_pid_namespace_never_declares_a_live_worker_dead";

/// heartbeat.md: "Pid namespaces: a slot's identity names its pid namespace. A process in
/// another namespace gets `Liveness::Unknown` for it ... such slots are never declared
/// dead or adopted by OS identity from the other namespace".
#[test]
fn heartbeat_watchdog_in_another_pid_namespace_never_declares_a_live_worker_dead() {
    match role().as_deref() {
        Some("holder") => {
            let table = HeartbeatTable::open(dir().join("hb"), 2).unwrap();
            let reg = table.join().unwrap();
            reg.mark_in_flight(3).unwrap();
            report("HELD");
            std::mem::forget(reg);
            sleep_forever();
        }
        Some("hopper") => {
            let table = HeartbeatTable::open(dir().join("hb"), 2).unwrap();
            hop_into_a_new_pid_namespace(move || {
                let wd = FailoverWatchdog::with_grace(&table, HUGE_GRACE)
                    .with_os_check_interval(Duration::ZERO);
                let mut dead = 0;
                for _ in 0..5 {
                    dead += wd.scan().dead_slots.len();
                    std::thread::sleep(Duration::from_millis(20));
                }
                let swept = wd.sweep_idle();
                // The table has 2 slots: the worker's and a free one.
                let a = table.register(me()).is_ok();
                let b = table.register(me()).is_ok();
                format!("dead={dead} swept={swept} second_register={}", a && b)
            })
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let Some((line, table, _d, holder, _hopper)) =
                hop_test(HB_HOP, |d| HeartbeatTable::create(d.join("hb"), 2).unwrap())
            else {
                return;
            };
            assert_eq!(
                (num(&line, "dead"), num(&line, "swept")),
                (0, 0),
                "a watchdog of another pid namespace declared a live worker dead: {line}"
            );
            assert!(
                !flag(&line, "second_register"),
                "a live worker's slot was reused from another pid namespace: {line}"
            );
            let snap = (0..2)
                .filter_map(|i| table.snapshot(i))
                .find(|s| s.pid == holder.pid())
                .expect("the worker's slot");
            assert!(!snap.fenced && snap.in_flight_bitmap == 1 << 3, "{snap:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// A half-exited writer, and exec.
// ---------------------------------------------------------------------------------------

fn main_thread_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

const RW_HALF_WRITER: &str = "rwlock_writer_whose_main_thread_exited_is_not_evicted_as_dead";

/// shared-rwlock.md: "Dead writer: waiters see `WRITER` naming a slot whose process is
/// gone and evict it at once"; design.md: "Dead means the whole thread group is gone. A
/// process whose main thread exited while other threads run is alive". A writer (grace
/// 10 s) whose main thread exited while a worker thread holds the write lock must keep
/// it (readers and writers wait), on the pidfs and the fallback identity path; once the
/// process is killed it is evicted at once.
#[test]
fn rwlock_writer_whose_main_thread_exited_is_not_evicted_as_dead() {
    if cxc_testkit::in_role("writer") {
        let lock: &'static SharedRwLock<u64> = Box::leak(Box::new(
            SharedRwLock::<u64>::open(path_arg("path")).unwrap(),
        ));
        std::thread::spawn(move || {
            let w = lock.write();
            w.write(7).unwrap();
            report("HELD");
            std::mem::forget(w);
            sleep_forever();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(cxc_testkit::exit_main_thread());
        sleep_forever();
    }
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("rw");
        let opts = RwLockOptions::default().grace(Duration::from_secs(10));
        let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
        let mut cmd = RoleCommand::new(RW_HALF_WRITER, "writer").arg("path", &path);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        assert_eq!(kid.next_report(Duration::from_secs(20)), "HELD");
        assert!(
            wait_until(Duration::from_secs(5), || main_thread_state(kid.pid())
                == Some('Z')),
            "the main thread did not exit"
        );
        let read = lock
            .read_timeout(Duration::from_millis(400))
            .map(|r| r.get());
        let wrote = lock.write_timeout(Duration::from_millis(400)).is_some();
        assert_eq!(
            (read, wrote),
            (None, false),
            "fallback={fallback}: a live writer (main thread exited) was evicted as dead"
        );
        kid.kill();
        let t = Instant::now();
        let r = lock.read_timeout(Duration::from_secs(3));
        assert_eq!(r.map(|r| r.get()), Some(7), "fallback={fallback}: wedged");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}

const SEM_EXEC: &str = "sem_holder_that_execs_keeps_its_permits_until_it_dies";

/// shared-semaphore.md, Pitfalls: "`exec` keeps the pid and identity (pidfs inode, start
/// time), so the new image reuses the old image's slot; permits the old image held stay
/// held until the process dies." The new image finds no second slot of its own, nobody
/// reclaims the permits while it runs (max 2, both held), and they come back once it is
/// killed; on the pidfs and the fallback path.
#[test]
fn sem_holder_that_execs_keeps_its_permits_until_it_dies() {
    match role().as_deref() {
        Some("execer") => {
            use std::os::unix::process::CommandExt;
            let sem = SharedSemaphore::open(dir().join("sem")).unwrap();
            std::mem::forget(sem.acquire());
            std::mem::forget(sem.acquire());
            let err = RoleCommand::new(SEM_EXEC, "execd")
                .arg("dir", dir())
                .into_command()
                .exec();
            panic!("exec: {err}");
        }
        Some("execd") => {
            let sem = SharedSemaphore::open(dir().join("sem")).unwrap();
            let slots = sem.holders().iter().filter(|h| h.pid == me()).count();
            let held: u32 = sem
                .holders()
                .iter()
                .filter(|h| h.pid == me())
                .map(|h| h.held)
                .sum();
            report(format!("EXECD slots={slots} held={held}"));
            sleep_forever();
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let _s = serial();
            for fallback in [false, true] {
                let d = tempfile::tempdir().unwrap();
                let sem = SharedSemaphore::create(d.path().join("sem"), 2, 2).unwrap();
                let mut cmd = RoleCommand::new(SEM_EXEC, "execer").arg("dir", d.path());
                if fallback {
                    cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
                }
                let mut kid = cmd.spawn();
                let line = wait_line(&mut kid, "EXECD");
                println!("fallback={fallback}: {line}");
                assert_eq!(
                    (num(&line, "slots"), num(&line, "held")),
                    (1, 2),
                    "fallback={fallback}: the new image does not use the old image's slot"
                );
                for _ in 0..3 {
                    assert_eq!(
                        sem.reclaim_dead(),
                        0,
                        "fallback={fallback}: the exec'd holder's permits were reclaimed"
                    );
                    assert!(sem.try_acquire().is_none(), "fallback={fallback}: S1");
                    std::thread::sleep(Duration::from_millis(20));
                }
                kid.kill();
                assert_eq!(sem.reclaim_dead(), 2, "fallback={fallback}");
                assert_eq!(sem.available(), 2);
            }
        }
    }
}

const LEASE_EXEC: &str = "lease_holder_that_execs_is_not_taken_over_while_it_lives";

/// design.md: "Process identity is never reused while the machine is up" (`exec` keeps
/// it: same pidfs inode, same start time) and L5 "a holder whose whole process is gone is
/// replaced at once"; owner-lease.md: a claim "names the process that made it". A holder
/// that execs is the same live process: nobody takes its claim over while it runs (huge
/// grace, so only a wrong proof of death could), and it is taken over at once when it is
/// killed; on the pidfs and the fallback path. The exec ends the holder's sentinel thread
/// (docs/owner-lease.md, "The sentinel"): a waiter blocked across it is woken and must
/// not take the claim (the process's threads are not all in the kernel's exit).
#[test]
fn lease_holder_that_execs_is_not_taken_over_while_it_lives() {
    match role().as_deref() {
        Some("execer") => {
            use std::os::unix::process::CommandExt;
            let lease = OwnerLease::<u64>::open(dir().join("lease")).unwrap();
            assert!(lease.try_acquire(me(), HUGE_GRACE));
            assert!(lease.write_as_owner(me(), 5));
            report("HELD");
            // A waiter of the parent is blocked by now, and stays so across the exec,
            // whose end of the sentinel thread wakes it.
            std::thread::sleep(Duration::from_millis(200));
            let err = RoleCommand::new(LEASE_EXEC, "execd")
                .arg("dir", dir())
                .into_command()
                .exec();
            panic!("exec: {err}");
        }
        Some("execd") => {
            let lease = OwnerLease::<u64>::open(dir().join("lease")).unwrap();
            report(format!("EXECD owner={}", lease.am_i_owner(me())));
            sleep_forever();
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let _s = serial();
            for fallback in [false, true] {
                let d = tempfile::tempdir().unwrap();
                let lease =
                    OwnerLease::<u64>::create_with(d.path().join("lease"), 0, &lease_opts())
                        .unwrap();
                let mut cmd = RoleCommand::new(LEASE_EXEC, "execer").arg("dir", d.path());
                if fallback {
                    cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
                }
                let mut kid = cmd.spawn();
                wait_line(&mut kid, "HELD");
                // Blocked when the exec ends the holder's sentinel thread: woken, it must
                // find a live process (not every thread in the kernel's exit) and wait on.
                assert!(
                    lease
                        .acquire(me(), HUGE_GRACE, Duration::from_millis(600))
                        .is_none(),
                    "fallback={fallback}: a waiter blocked across the exec took the lease"
                );
                let line = wait_line(&mut kid, "EXECD");
                println!("fallback={fallback}: {line}");
                assert!(
                    flag(&line, "owner"),
                    "fallback={fallback}: the exec'd holder is not the owner: {line}"
                );
                assert!(
                    !lease.try_acquire(me(), HUGE_GRACE),
                    "fallback={fallback}: the exec'd (live) holder was taken over"
                );
                assert!(
                    lease
                        .acquire(me(), HUGE_GRACE, Duration::from_millis(300))
                        .is_none(),
                    "fallback={fallback}: a waiter took the exec'd (live) holder's lease"
                );
                assert_eq!(lease.current_owner(), Some(kid.pid()));
                kid.kill();
                let t = Instant::now();
                let c = lease
                    .acquire(me(), HUGE_GRACE, Duration::from_secs(3))
                    .expect("the killed holder is taken over");
                assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
                assert_eq!(lease.read_claimed(&c), Some(5));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The fallback path's same-tick window.
// ---------------------------------------------------------------------------------------

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks), also of a zombie.
fn start_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = s.rsplit(')').next().expect("stat format");
    rest.split_whitespace()
        .nth(19)
        .expect("field 22")
        .parse()
        .expect("a number")
}

const SAME_TICK: &str = "lease_fallback_same_tick_reuse_still_fails_over_after_the_grace";

/// owner-lease.md, Identity: "On the fallback path a pid reused *within one start-time
/// tick* (10 ms) is indistinguishable: the new process is taken for the old one (it
/// inherits the claim, and the dead holder is judged alive, so failover waits for the
/// heartbeat grace)" — for a holder whose sentinel was not armed when it died (it had
/// dropped its handle). What remains must hold: a holder W forked, claiming, dropping its
/// handle and dying, and a process Q given W's pid with W's very start time (forced;
/// retried until the ticks match), which never beats. The claim is not taken over at once
/// (documented), but is after the grace (300 epochs of 1 ms), with a new generation, while
/// Q lives. (With its handle kept, W's sentinel makes the takeover immediate whatever the
/// identity says: `ownership_mp::pid_reuse_in_pid_namespace_fallback_identity`.)
#[test]
fn lease_fallback_same_tick_reuse_still_fails_over_after_the_grace() {
    heir_test(
        SAME_TICK,
        true,
        |_| {
            const GRACE: u64 = 300;
            let lease =
                OwnerLease::<u64>::create_with(dir().join("lease"), 0, &lease_opts()).unwrap();
            for attempt in 0..100 {
                // SAFETY: the child claims through this crate and `_exit`s.
                let w = unsafe { libc::fork() };
                if w == 0 {
                    // A handle of its own, dropped before the exit: the claim stays, the
                    // sentinel is disarmed.
                    let own = OwnerLease::<u64>::open(dir().join("lease")).unwrap();
                    let ok = own.try_acquire(me(), GRACE) && own.write_as_owner(me(), 1);
                    drop(own);
                    // SAFETY: ends the forked child at once.
                    unsafe { libc::_exit(if ok { 0 } else { 3 }) };
                }
                assert!(w > 0);
                // SAFETY: waits for our child's exit without reaping it (its stat stays).
                let rc = unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    libc::waitid(
                        libc::P_PID,
                        w as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOWAIT,
                    )
                };
                assert_eq!(rc, 0);
                let w_start = start_ticks(w);
                let mut status = 0;
                // SAFETY: reaps our child.
                unsafe { libc::waitpid(w, &mut status, 0) };
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
                std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", w - 1)).unwrap();
                // SAFETY: the child only sleeps until the namespace ends.
                let q = unsafe { libc::fork() };
                if q == 0 {
                    sleep_forever();
                }
                assert_eq!(
                    q, w,
                    "harness: the newcomer did not get the dead holder's pid"
                );
                if start_ticks(q) != w_start {
                    // Another tick: the newcomer is told apart; try again.
                    // SAFETY: kills and reaps our own child.
                    unsafe {
                        libc::kill(q, libc::SIGKILL);
                        libc::waitpid(q, &mut status, 0);
                    }
                    continue;
                }
                println!("same tick reached at attempt {attempt} (pid {w}, start {w_start})");
                let term = lease.lease_term();
                assert!(
                    !lease.try_acquire(1, GRACE),
                    "documented: the dead holder is taken for the newcomer (alive)"
                );
                let t0 = Instant::now();
                let c = lease
                    .acquire(1, GRACE, Duration::from_secs(5))
                    .expect("L5: the claim failed over after the grace");
                let took = t0.elapsed();
                assert!(took < Duration::from_secs(3), "{took:?}");
                assert!(c.generation() > term, "{} <= {term}", c.generation());
                assert_eq!(lease.read_claimed(&c), Some(1));
                assert_eq!(start_ticks(q), w_start, "the newcomer still lives");
                return;
            }
            panic!("harness: no same-tick reuse in 100 attempts");
        },
        || unreachable!("no holder role"),
    );
}

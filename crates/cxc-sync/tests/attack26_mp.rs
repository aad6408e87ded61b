#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack26: identity tables under pressure, half-exited processes and pid reuse, with
//! real processes.
//!
//! 1. Lease: a full identity table whose only non-live slot belongs to a *dead* writer
//!    that a stale takeover put in quarantine (its slot is named by a quarantine record,
//!    not by a claim), with the lease vacant: can a newcomer claim?
//! 2. Lease: a full identity table whose current holder is half-exited (main thread `Z`,
//!    a worker thread alive): a newcomer must not vacate it, and gets it once the whole
//!    group is gone.
//! 3. Semaphore: a full holder table with a half-exited holder, a SIGKILLed holder and
//!    live ones; the half-exited holder disowns one permit from its worker thread, then
//!    is SIGKILLed: exact permit accounting throughout.
//! 4. Heartbeat: `register(pid)` on behalf of a process whose main thread already exited
//!    (root: then its pid is reused in a fresh pid namespace): never reported while it
//!    lives, an impostor with its pid cannot act for nor adopt the slot, the watchdog
//!    reclaims exactly its units once, and the registrant is fenced.
//! 5. Semaphore: two processes blocked in `acquire_many(3)` with 3 available (one must
//!    win, the loser never keeps part of its set), then the winner SIGKILLed holding its
//!    set: the blocked loser gets it back on its own.
//!
//! Tests 1 (both variants) failed before a process that finds the identity table full
//! also freed the quarantined buffers of superseded writers that are gone (whose records
//! kept their slots referenced): a newcomer was refused a vacant lease.

mod procs;

use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::liveness::{Liveness, fallback_active, liveness};
use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatTable, LeaseOptions, OwnerLease, Preemption,
    SemaphoreError, SemaphoreOptions, SharedSemaphore,
};
use cxc_testkit::{
    Proc, RoleCommand, all_threads_in_state, child_wait_for_path, exit_main_thread, fields, flag,
    path_arg, read_word, serial, sleep_forever, wait_until,
};
// `report` and `role` come from here (cxc_testkit's, re-exported).
use procs::{report, role};

/// A heartbeat grace no test reaches: only the OS identity can end a claim.
const BIG: u64 = 1 << 40;
/// How long a child may take to report.
const REPORT_WAIT: Duration = Duration::from_secs(30);

fn me() -> u32 {
    std::process::id()
}

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("touch a marker");
}

// ---------------------------------------------------------------------------------------
// Lease file layout (docs/owner-lease.md, "Layout"): the 128-byte header, then the block.
// ---------------------------------------------------------------------------------------

/// File offset of the claim word.
const CLAIM_OFF: u64 = 128;
/// File offset of `qowner[0]`.
const QOWNER_OFF: u64 = 128 + 64;
/// File offset of identity slot 0 (64 bytes a slot, `state` first).
const IDENTS_OFF: u64 = 128 + 768;
const IDENT_SLOTS: u64 = 64;

/// The Q bits (one per buffer in quarantine) of the claim word.
fn quarantine_bits(path: &Path) -> u64 {
    (read_word(path, CLAIM_OFF) >> 15) & 0xFF
}

/// The holder field of the claim word (identity slot + 1, 0 = vacant).
fn claim_holder(path: &Path) -> u64 {
    read_word(path, CLAIM_OFF) & 0xFF
}

/// Number of identity slots in a valid state (`2 | version << 2`).
fn valid_ident_slots(path: &Path) -> u64 {
    (0..IDENT_SLOTS)
        .filter(|i| read_word(path, IDENTS_OFF + 64 * i) & 2 != 0)
        .count() as u64
}

/// The pid word of identity slot `holder - 1`.
fn ident_pid(path: &Path, holder: u64) -> u64 {
    read_word(path, IDENTS_OFF + 64 * (holder - 1) + 8)
}

/// Manual epochs, no preemption: only staleness (by our ticks) or the OS ends a claim.
fn manual_never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Manual,
        ..LeaseOptions::default()
    }
}

/// Pids the filler claims for: one identity slot each (docs: "A process registers one
/// slot per pid it claims for").
const FILL_BASE: u32 = 3_000_000;

/// Role: tries to claim (and releases) for `n` distinct pids, so this one live process
/// registers and pins `n` identity slots through its handle; reports, and lives until
/// killed.
fn role_filler() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let n: u32 = cxc_testkit::arg("n").parse().unwrap();
    for k in 0..n {
        // A claim attempt registers the slot first, whether or not it claims (the lease
        // may be held by someone else).
        if lease.try_acquire(FILL_BASE + k, BIG) {
            assert!(lease.release(FILL_BASE + k), "filler release {k}");
        }
    }
    report(format!("filled={n}"));
    sleep_forever();
}

/// Role: a process without a slot tries to claim for its own pid: `try_acquire`, then
/// `acquire` with the timeout `wait_ms`.
fn role_newcomer() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let wait = Duration::from_millis(cxc_testkit::arg("wait_ms").parse().unwrap());
    let tried = lease.try_acquire(me(), BIG);
    let t = Instant::now();
    let acquired = tried || lease.acquire(me(), BIG, wait).is_some();
    report(format!(
        "try={tried} acquire={acquired} waited_ms={} owner={:?}",
        t.elapsed().as_millis(),
        lease.current_owner()
    ));
}

// ---------------------------------------------------------------------------------------
// 1. A dead superseded writer's slot, named only by a quarantine record, in a full table.
// ---------------------------------------------------------------------------------------

const T1: &str =
    "lease_full_table_whose_spare_slot_is_a_dead_quarantined_writers_admits_a_newcomer";
const T1K: &str = "lease_full_table_whose_spare_slot_is_a_killed_guard_holders_taken_over_via_its_sentinel_admits_a_newcomer";

/// Role: locks a guard (its claim is PRIVATE: whoever supersedes it quarantines its
/// staging buffer), writes once, reports, and holds it, never beating, until killed.
fn role_guard_holder() {
    let lease: OwnerLease<u64> = OwnerLease::builder(path_arg("path"))
        .grace_epochs(1)
        .open()
        .unwrap();
    let g = lease
        .try_lock()
        .expect("the guard holder locks a vacant lease");
    g.write(7).expect("a held guard writes");
    report("locked");
    let _keep = g;
    sleep_forever();
}

/// How the guard holder V loses the lease to this process before it dies.
#[derive(Clone, Copy, Debug)]
enum Supersede {
    /// V stops beating; this process takes it over as stale (two ticks past grace 1),
    /// releases, then V is SIGKILLed.
    StaleThenKilled,
    /// This process blocks in `acquire`; V is SIGKILLed and taken over through its
    /// sentinel (`claim_exiting`: as stale, not as dead), then released.
    KilledWhileAwaited,
}

/// The common part of the two tests below: after V lost the lease (`how`) and died, with
/// its staging buffer quarantined under its slot and the lease vacant, a filler pins 62
/// slots (table: this process, the filler's 62, dead V's); a newcomer tries to claim.
fn dead_quarantined_writer_in_full_table(test: &str, how: Supersede) {
    cxc_testkit::play_role!(role_guard_holder, role_filler, role_newcomer);
    let _s = serial();
    let mut round = 0;
    let (_dir, path, lease, vpid, victim_holder) = loop {
        round += 1;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease");
        let lease: OwnerLease<u64> = OwnerLease::create_with(&path, 0, &manual_never()).unwrap();
        let mut victim = RoleCommand::new(test, "guard_holder")
            .arg("path", &path)
            .spawn();
        assert_eq!(victim.next_report(REPORT_WAIT), "locked");
        assert_eq!(lease.current_owner(), Some(victim.pid()));
        let victim_holder = claim_holder(&path);
        assert_eq!(quarantine_bits(&path), 0, "nothing quarantined yet");
        let vpid = victim.pid();
        let claim = match how {
            Supersede::StaleThenKilled => {
                lease.tick_epoch();
                lease.tick_epoch();
                lease
                    .try_claim(me(), 1)
                    .expect("stale takeover of a silent guard holder")
            }
            Supersede::KilledWhileAwaited => std::thread::scope(|s| {
                let waiter = s.spawn(|| lease.acquire(me(), BIG, Duration::from_secs(20)));
                // Past the spin phase and the first nap: asleep in the kernel.
                std::thread::sleep(Duration::from_millis(200));
                assert!(!waiter.is_finished(), "took a live guard holder's lease");
                victim.kill();
                waiter
                    .join()
                    .unwrap()
                    .expect("the waiter took the lease over")
            }),
        };
        let st = lease.stats();
        let q = quarantine_bits(&path);
        println!("round {round} ({how:?}): Q bits {q:#x}, stats {st:?}");
        if q == 0 {
            // A takeover whose verdict found the holder already dead quarantines nothing
            // (the sentinel woke us, but the OS proved the group gone by the time the
            // claim looked): not the case under attack; try again.
            assert!(
                matches!(how, Supersede::KilledWhileAwaited),
                "a superseded live guard's staging buffer was not quarantined: {st:?}"
            );
            assert!(
                round < 60,
                "60 rounds without a quarantining takeover of a killed guard holder"
            );
            continue;
        }
        let b = u64::from(q.trailing_zeros());
        assert_eq!(
            read_word(&path, QOWNER_OFF + 8 * b) & 0xFF,
            victim_holder,
            "the quarantine record names the guard holder's slot"
        );
        assert!(lease.release_claim(&claim));
        // StaleThenKilled: the superseded writer dies without ever learning of its loss.
        victim.kill();
        break (dir, path, lease, vpid, victim_holder);
    };
    assert_eq!(lease.current_owner(), None, "the lease is vacant");
    assert_ne!(
        quarantine_bits(&path),
        0,
        "nobody reaped the dead writer's buffer"
    );

    // Fill the table: this process 1, V 1 (dead), filler 62.
    let mut filler = RoleCommand::new(test, "filler")
        .arg("path", &path)
        .arg("n", "62")
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "filled=62");
    assert_eq!(valid_ident_slots(&path), 64, "all 64 identity slots valid");
    assert_eq!(
        ident_pid(&path, victim_holder) & 0xFFFF_FFFF,
        u64::from(vpid),
        "V's slot still names V"
    );

    let mut newcomer = RoleCommand::new(test, "newcomer")
        .arg("path", &path)
        .arg("wait_ms", "2000")
        .spawn();
    let line = newcomer.finish(REPORT_WAIT).remove(0);
    println!(
        "newcomer with a vacant lease, 63 live slots and a dead quarantined writer's slot: \
         {line}; Q bits {:#x}; stats {:?}",
        quarantine_bits(&path),
        lease.stats()
    );
    // Control: once the filler's slots are free, a newcomer gets in at once.
    filler.kill();
    let mut control = RoleCommand::new(test, "newcomer")
        .arg("path", &path)
        .arg("wait_ms", "1000")
        .spawn();
    let control_line = control.finish(REPORT_WAIT).remove(0);
    println!("control after the filler died: {control_line}");
    assert!(flag(&control_line, "acquire"), "{control_line}");
    assert!(
        flag(&line, "acquire"),
        "a vacant lease refused a newcomer although the only slot not held by a live \
         process belongs to a dead process no claim names (it is named only by the \
         quarantine record of a writer superseded before it died): {line}"
    );
}

/// owner-lease.md, Identity: "**A full table** (64 slots held by live processes or named
/// by claims): a process without a slot first vacates the current claim if its holder's
/// process is dead (...), which frees that slot for it; otherwise it cannot claim";
/// "Slots of a process whose whole thread group is gone are reused"; ident.rs: "a full
/// table can only refuse new claimants (...), never make a dead holder look alive".
///
/// A guard holder V stops beating; this process takes the lease over as stale (V's
/// staging buffer goes into quarantine, its record naming V's slot) and releases it. V
/// is SIGKILLed. A filler pins 62 slots, so the table is: this process (live), the
/// filler's 62 (live), V's (dead, named by no claim: the lease is vacant). By the
/// documented definition the table is not full; a newcomer must be able to claim.
#[test]
fn lease_full_table_whose_spare_slot_is_a_dead_quarantined_writers_admits_a_newcomer() {
    dead_quarantined_writer_in_full_table(T1, Supersede::StaleThenKilled);
}

/// As above, through the everyday failover: a guard holder SIGKILLed while this process
/// waits in `acquire` is taken over through its sentinel (as stale, so its staging buffer
/// is quarantined: docs "The sentinel", "Quarantine: an exiting holder's staging buffer
/// is quarantined where a dead one's is not"); then the lease is released.
#[test]
fn lease_full_table_whose_spare_slot_is_a_killed_guard_holders_taken_over_via_its_sentinel_admits_a_newcomer()
 {
    dead_quarantined_writer_in_full_table(T1K, Supersede::KilledWhileAwaited);
}

// ---------------------------------------------------------------------------------------
// 2. A half-exited holder in a full table.
// ---------------------------------------------------------------------------------------

const T2: &str = "lease_full_table_never_vacates_a_half_exited_holder_and_admits_after_it_is_gone";

/// owner-lease.md, Identity: "A process whose main thread exited while other threads run
/// (`/proc/PID/stat` says `Z`) is **alive**"; "A full table ...: a process without a slot
/// first vacates the current claim if its holder's process is dead (...), which frees
/// that slot for it; otherwise it cannot claim (`try_acquire` false; `acquire` and `lock`
/// wait for a slot until their timeout)".
///
/// Holder H claims, then its main thread exits (a worker thread lives on). The table is
/// filled (this process 1, H 1, filler 62). A newcomer must be refused (H is alive), and
/// this process (it has a slot) must not take H's claim over either. Then H's last
/// application thread ends (the process ends through its sentinel's orphan look); a
/// newcomer blocked in `acquire` gets the lease, and only once every thread of H is gone.
#[test]
fn lease_full_table_never_vacates_a_half_exited_holder_and_admits_after_it_is_gone() {
    fn role_half_holder() {
        let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
        assert!(lease.try_acquire(me(), BIG), "H claims a vacant lease");
        assert!(lease.write_as_owner(me(), 41));
        assert!(exit_main_thread(), "the main thread did not exit");
        report("half");
        child_wait_for_path(&path_arg("end"), Duration::from_secs(60));
        // Returning ends this, the last application thread: the process is then gone
        // (the sentinel's orphan look ends it) with its claim held.
        std::mem::forget(lease);
    }
    fn role_blocked_newcomer() {
        let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
        let hpid: u32 = cxc_testkit::arg("hpid").parse().unwrap();
        let tried = lease.try_acquire(me(), BIG);
        let short = lease
            .acquire(me(), BIG, Duration::from_millis(300))
            .is_some();
        report(format!("try={tried} short={short}"));
        let t = Instant::now();
        let got = lease.acquire(me(), BIG, Duration::from_secs(20));
        let waited = t.elapsed();
        // At the moment the claim is ours, no thread of H may still run.
        let h_gone =
            all_threads_in_state(hpid, 'Z') || !Path::new(&format!("/proc/{hpid}")).exists();
        let value = got.as_ref().and_then(|c| lease.read_claimed(c));
        report(format!(
            "got={} h_gone={h_gone} waited_ms={} value={value:?} torn={}",
            got.is_some(),
            waited.as_millis(),
            got.as_ref()
                .is_some_and(|c| c.payload_may_be_inconsistent())
        ));
    }
    cxc_testkit::play_role!(role_half_holder, role_filler, role_blocked_newcomer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let end = dir.path().join("end");
    let lease: OwnerLease<u64> = OwnerLease::create_with(&path, 0, &manual_never()).unwrap();
    // This process registers its slot (and keeps it: the handle lives).
    assert!(lease.try_acquire(me(), BIG));
    assert!(lease.release(me()));

    let mut h = RoleCommand::new(T2, "half_holder")
        .arg("path", &path)
        .arg("end", &end)
        .spawn();
    assert_eq!(h.next_report(REPORT_WAIT), "half");
    assert_eq!(h.state(), Some('Z'), "H's main thread exited");
    assert_eq!(lease.current_owner(), Some(h.pid()));
    let mut filler = RoleCommand::new(T2, "filler")
        .arg("path", &path)
        .arg("n", "62")
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "filled=62");
    assert_eq!(valid_ident_slots(&path), 64);

    // A process with a slot: H is alive, its heartbeat current (grace BIG).
    assert!(
        !lease.try_acquire(me(), BIG),
        "a half-exited holder was taken over"
    );
    assert!(
        lease
            .acquire(me(), BIG, Duration::from_millis(200))
            .is_none(),
        "a half-exited holder was taken over by a blocked acquire"
    );

    let mut n = RoleCommand::new(T2, "blocked_newcomer")
        .arg("path", &path)
        .arg("hpid", h.pid().to_string())
        .spawn();
    let first = n.next_report(REPORT_WAIT);
    assert_eq!(
        first, "try=false short=false",
        "a newcomer vacated a half-exited holder's claim in a full table"
    );
    assert_eq!(lease.current_owner(), Some(h.pid()));
    // Let the newcomer block in its long acquire, then end H's last thread.
    std::thread::sleep(Duration::from_millis(100));
    touch(&end);
    let hs = h.wait_timeout(Duration::from_secs(10));
    let line = n.next_report(REPORT_WAIT);
    println!("H ended with {hs:?}; newcomer: {line}");
    assert!(hs.is_some_and(|s| s.success()), "H did not end: {hs:?}");
    assert!(
        flag(&line, "got"),
        "the newcomer never got the lease: {line}"
    );
    assert!(flag(&line, "h_gone"), "claimed while H still ran: {line}");
    assert_eq!(fields(&line)["value"], "Some(41)", "{line}");
    assert!(!flag(&line, "torn"), "H was not writing: {line}");
    n.finish(REPORT_WAIT);
    filler.kill();
}

// ---------------------------------------------------------------------------------------
// 3. Semaphore: full table with half-exited, dead and live holders; disown from a
//    half-exited holder, then its death.
// ---------------------------------------------------------------------------------------

const T3: &str = "sem_full_table_half_exited_holder_disowns_then_dies_permits_exact";

/// shared-semaphore.md: "A main thread that exited while a worker thread holds permits
/// leaves `Z` in `/proc/<pid>/stat`; that process is alive and keeps its permits";
/// "Registration ...: find a slot ..., else CAS a free slot ..., else reclaim dead
/// holders and retry, else fail: `open` returns `SemaphoreError::TableFull`"; "A
/// **hand-off** to another process is recorded by `Permit::disown()`: ... (so the
/// disowner's death no longer returns it); the next `release()` by a process that holds
/// no permit takes it from there"; Invariant B: `avail + Σ held + handed = max_permits`.
#[test]
fn sem_full_table_half_exited_holder_disowns_then_dies_permits_exact() {
    fn role_sem_half() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let keep = sem.try_acquire().expect("first permit");
        std::mem::forget(sem.try_acquire().expect("second permit"));
        assert!(exit_main_thread(), "the main thread did not exit");
        report("held=2");
        child_wait_for_path(&path_arg("disown"), Duration::from_secs(60));
        keep.disown();
        report("disowned");
        sleep_forever();
    }
    fn role_sem_dead() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        std::mem::forget(sem.try_acquire().expect("a permit"));
        report("held=1");
        sleep_forever();
    }
    fn role_sem_live() {
        let _sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("up");
        sleep_forever();
    }
    fn role_sem_newcomer() {
        match SharedSemaphore::open(path_arg("path")) {
            Ok(sem) => {
                report(format!("open=ok avail={}", sem.available()));
                sleep_forever();
            }
            Err(SemaphoreError::TableFull { capacity }) => {
                report(format!("open=full capacity={capacity}"));
            }
            Err(e) => panic!("open: {e:?}"),
        }
    }
    cxc_testkit::play_role!(
        role_sem_half,
        role_sem_dead,
        role_sem_live,
        role_sem_newcomer
    );
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let disown = dir.path().join("disown");
    const MAX: u32 = 5;
    let sem =
        SharedSemaphore::create_with(&path, MAX, MAX, &SemaphoreOptions::default().holders(4))
            .unwrap();
    let spawn = |r: &str| -> Proc {
        RoleCommand::new(T3, r)
            .arg("path", &path)
            .arg("disown", &disown)
            .spawn()
    };
    let held_by = |pid: u32| -> Option<u32> {
        sem.holders()
            .into_iter()
            .find(|h| h.pid == pid && !h.reclaiming)
            .map(|h| h.held)
    };
    let conserved = |what: &str| {
        let st = sem.stats();
        let held: u32 = sem.holders().iter().map(|h| h.held).sum();
        assert_eq!(
            sem.available() + held + st.handed,
            MAX,
            "{what}: avail {} + held {held} + handed {} != max",
            sem.available(),
            st.handed
        );
        assert!(sem.available() <= MAX);
    };

    let mut half = spawn("sem_half");
    assert_eq!(half.next_report(REPORT_WAIT), "held=2");
    assert_eq!(half.state(), Some('Z'), "the holder's main thread exited");
    let mut dead = spawn("sem_dead");
    assert_eq!(dead.next_report(REPORT_WAIT), "held=1");
    let mut live = spawn("sem_live");
    assert_eq!(live.next_report(REPORT_WAIT), "up");
    assert_eq!(sem.holders().len(), 4, "the table is full");
    assert_eq!(sem.available(), 2);
    conserved("full table");

    let dpid = dead.pid();
    dead.kill();
    // Newcomer 1: the table is full; registration reclaims the dead holder (only).
    let mut n1 = spawn("sem_newcomer");
    let l1 = n1.next_report(REPORT_WAIT);
    assert_eq!(
        l1, "open=ok avail=3",
        "the newcomer must get the dead holder's slot, its one permit back"
    );
    assert_eq!(held_by(dpid), None, "the dead holder's slot was reused");
    assert_eq!(
        held_by(half.pid()),
        Some(2),
        "the half-exited holder keeps 2"
    );
    // Newcomer 2: every slot's process is alive (one of them half-exited).
    let l2 = spawn("sem_newcomer").finish(REPORT_WAIT).remove(0);
    assert_eq!(
        l2, "open=full capacity=4",
        "a half-exited holder was reclaimed"
    );
    assert_eq!(sem.reclaim_dead(), 0, "a half-exited holder was reclaimed");
    assert_eq!(held_by(half.pid()), Some(2));
    conserved("after newcomers");

    // The half-exited holder's worker thread disowns one permit.
    touch(&disown);
    assert_eq!(half.next_report(REPORT_WAIT), "disowned");
    assert_eq!(held_by(half.pid()), Some(1));
    assert_eq!(sem.stats().handed, 1);
    assert_eq!(sem.available(), 3);
    conserved("after disown");

    // Its whole group dies: only the permit it still holds comes back.
    let hpid = half.pid();
    half.kill();
    assert_eq!(
        sem.reclaim_dead(),
        1,
        "exactly the one permit it still held"
    );
    assert_eq!(sem.reclaim_dead(), 0, "returned twice");
    assert_eq!(held_by(hpid), None);
    assert_eq!(sem.stats().handed, 1, "the disowned permit stays handed");
    assert_eq!(sem.available(), 4);
    conserved("after the half-exited holder died");

    // This process holds none: it may return the handed permit, once.
    assert!(sem.release(), "the handed permit could not be returned");
    assert!(!sem.release(), "a permit came back from nobody");
    assert_eq!(sem.available(), MAX);
    assert_eq!(sem.stats().handed, 0);
    conserved("end");
    n1.kill();
    live.kill();
}

// ---------------------------------------------------------------------------------------
// 4. Heartbeat: registration on behalf of a half-exited process, whose pid is then reused.
// ---------------------------------------------------------------------------------------

const UNITS: u64 = (1 << 3) | (1 << 5);

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

fn hb_proxy_run(test: &str, fallback: bool) {
    match role().as_deref() {
        Some("nsroot") => procs::nsroot(test),
        Some("scenario") => {
            die_with_parent();
            procs::mount_own_proc();
            assert_eq!(fallback_active(), fallback);
            hb_proxy_scenario(test, fallback);
        }
        Some("half_target") => {
            assert!(exit_main_thread(), "the main thread did not exit");
            report("HALF");
            procs::park();
        }
        Some("impostor") => {
            let slot: usize = cxc_testkit::arg("slot").parse().unwrap();
            let table = HeartbeatTable::open(procs::dir().join("hb"), 1).unwrap();
            let beat = table.beat(slot);
            let mark = table.mark_in_flight(slot, 7);
            let clear = table.clear_in_flight(slot, 3);
            let unregister = table.unregister(slot);
            let register = match table.register(me()) {
                Ok(s) => format!("slot{s}"),
                Err(e) => format!("{e:?}").replace(' ', ""),
            };
            report(format!(
                "RESULT beat={beat} mark={mark} clear={clear} unregister={unregister} \
                 register={register}"
            ));
            procs::park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => procs::run_reuse_test(test, fallback),
    }
}

/// heartbeat.md: "`register(pid)` looks up the identity of the process `pid` names at
/// that moment"; "A main thread that exited while other threads run leaves `Z` in
/// `/proc/<pid>/stat`; such a worker is alive"; "Pid reuse: a new process that got a dead
/// worker's pid has another identity. It cannot adopt the dead worker's slot, so its
/// `beat`, `mark_in_flight`, `clear_in_flight` and `unregister` of that slot return
/// `false` and change nothing; the watchdog still reports the dead worker and `reclaim`
/// returns exactly its units, once"; register pass 2 reuses only "a LIVE slot with no
/// bits whose recorded identity is dead"; H3: "a worker declared dead is fenced and told
/// so".
///
/// In a one-slot table, this process registers for target X *after* X's main thread
/// exited, and marks two units. A watchdog (huge grace, OS check on every scan) scans 40
/// times: never reported. X is SIGKILLed; a new process gets X's pid: it cannot act for
/// the slot nor register into it. The watchdog then reports the slot, `reclaim` returns
/// exactly the units once, and the registrant's own calls are refused (fenced).
fn hb_proxy_scenario(test: &str, fallback: bool) {
    let table = HeartbeatTable::create(procs::dir().join("hb"), 1).unwrap();
    let mut target = procs::spawn(test, "half_target", &procs::dir(), &[]);
    procs::wait_line(&mut target, "HALF");
    assert_eq!(target.state(), Some('Z'), "X's main thread exited");
    let xpid = target.pid();
    let slot = table.register(xpid).expect("register on behalf of X");
    let recorded = table.snapshot(slot).unwrap().identity;
    assert!(recorded.is_known(), "{recorded:?}");
    assert_eq!(recorded.pid, xpid);
    assert_eq!(recorded.is_fallback(), fallback);
    assert_eq!(
        liveness(&recorded),
        Liveness::Alive,
        "half-exited X is alive"
    );
    for bit in [3, 5] {
        assert!(table.mark_in_flight(slot, bit));
    }
    let wd = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::ZERO);
    for i in 0..40 {
        let r = wd.scan();
        assert!(
            r.dead_slots.is_empty(),
            "scan {i}: the half-exited X was reported dead: {:?}",
            r.dead_slots
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(wd.sweep_idle(), 0);

    target.kill();
    // Past the fallback path's same-tick window.
    std::thread::sleep(Duration::from_millis(30));
    let slot_arg = slot.to_string();
    let mut imp = procs::spawn_with_pid(xpid, test, "impostor", &[("slot", &slot_arg)]);
    let line = procs::wait_line(&mut imp, "RESULT");
    println!("impostor with X's pid {xpid}: {line}");
    assert_eq!(
        line, "RESULT beat=false mark=false clear=false unregister=false register=TableFull",
        "a process with X's pid acted for or adopted the slot registered for X"
    );
    let snap = table.snapshot(slot).unwrap();
    assert_eq!(
        (snap.in_flight_bitmap, snap.fenced),
        (UNITS, false),
        "{snap:?}"
    );
    assert_eq!(snap.identity, recorded);

    let t0 = Instant::now();
    let report = loop {
        let r = wd.scan();
        if !r.dead_slots.is_empty() {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dead X (pid now reused) was never reported"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let dead: Vec<usize> = report.dead_slots.iter().map(|(i, _)| *i).collect();
    assert_eq!(dead, vec![slot]);
    assert_eq!(wd.reclaim(slot), UNITS, "exactly X's units");
    assert_eq!(wd.reclaim(slot), 0, "units reclaimed twice");
    assert!(!table.beat(slot), "the fenced registrant's beat succeeded");
    assert!(
        !table.mark_in_flight(slot, 1),
        "the fenced registrant marked"
    );
    println!("reported {:?} after X's death and pid reuse", t0.elapsed());
    imp.kill();
}

#[test]
fn hb_registration_for_a_half_exited_process_survives_until_death_then_pid_reuse_is_caught() {
    hb_proxy_run(
        "hb_registration_for_a_half_exited_process_survives_until_death_then_pid_reuse_is_caught",
        false,
    );
}

#[test]
fn hb_registration_for_a_half_exited_process_survives_until_death_then_pid_reuse_is_caught_fallback()
 {
    hb_proxy_run(
        "hb_registration_for_a_half_exited_process_survives_until_death_then_pid_reuse_is_caught_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 5. Semaphore: two `acquire_many` callers in two processes, and kills.
// ---------------------------------------------------------------------------------------

const T5: &str =
    "sem_two_acquire_many_processes_never_deadlock_and_a_killed_winners_set_comes_back";

/// shared-semaphore.md, API: "n permits, all or none (never waits holding part of them:
/// no deadlock between two callers; others may briefly see fewer available while an
/// attempt runs)"; guards.rs: "a holder that dies in between is reclaimed like any other";
/// "At most `max_permits` permits are out at any time".
///
/// max 4; K holds 1. W1 and W2 (two processes) each block in `acquire_many(3)`: exactly
/// one wins (a caller keeping part of its set would deadlock both). K is SIGKILLed (1
/// available: the loser still cannot have 3, and never holds more than the one it
/// probes with). The winner is SIGKILLed holding its set: the loser, blocked, gets its 3
/// with no call from anyone else.
#[test]
fn sem_two_acquire_many_processes_never_deadlock_and_a_killed_winners_set_comes_back() {
    fn role_many_k() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        std::mem::forget(sem.try_acquire().expect("a permit"));
        report("held");
        sleep_forever();
    }
    fn role_many_w() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("waiting");
        let t = Instant::now();
        let g = sem.acquire_many_timeout(3, Duration::from_secs(25));
        report(format!(
            "got={} ms={}",
            g.as_ref().map_or(0, |g| g.count()),
            t.elapsed().as_millis()
        ));
        let _keep = g;
        sleep_forever();
    }
    cxc_testkit::play_role!(role_many_k, role_many_w);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let sem = SharedSemaphore::create(&path, 4, 4).unwrap();
    let spawn = |r: &str| RoleCommand::new(T5, r).arg("path", &path).spawn();
    let held_by = |pid: u32| -> u32 {
        sem.holders()
            .into_iter()
            .filter(|h| h.pid == pid && !h.reclaiming)
            .map(|h| h.held)
            .sum()
    };
    let mut k = spawn("many_k");
    assert_eq!(k.next_report(REPORT_WAIT), "held");
    let mut w = [spawn("many_w"), spawn("many_w")];
    for p in &mut w {
        assert_eq!(p.next_report(REPORT_WAIT), "waiting");
    }
    let pids = [w[0].pid(), w[1].pid()];
    assert!(
        wait_until(Duration::from_secs(10), || pids
            .iter()
            .any(|&p| held_by(p) == 3)),
        "two acquire_many(3) callers with 3 available: neither got its set (deadlock?), \
         holding {:?}",
        pids.map(held_by)
    );
    let win = usize::from(held_by(pids[1]) == 3);
    let lose = 1 - win;
    assert!(w[win].next_report(REPORT_WAIT).starts_with("got=3 "));
    // The loser probes one permit at a time and gives it back: never more than one.
    let observe = |what: &str, ms: u64| {
        let end = Instant::now() + Duration::from_millis(ms);
        let mut max_loser = 0;
        while Instant::now() < end {
            let l = held_by(pids[lose]);
            max_loser = max_loser.max(l);
            std::thread::sleep(Duration::from_micros(300));
        }
        assert!(
            max_loser <= 1,
            "{what}: the waiting acquire_many held {max_loser} of its 3 while it waited"
        );
    };
    observe("after the win", 300);
    assert_eq!(held_by(pids[win]), 3);
    k.kill();
    observe("after K died", 300);
    assert_eq!(held_by(pids[win]), 3, "the winner's set was touched");
    let t = Instant::now();
    w[win].kill();
    let line = w[lose].next_report(Duration::from_secs(10));
    println!(
        "loser after the winner's SIGKILL: {line} ({:?})",
        t.elapsed()
    );
    assert!(line.starts_with("got=3 "), "{line}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the killed winner's set came back late: {:?}",
        t.elapsed()
    );
    assert_eq!(held_by(pids[lose]), 3);
    assert_eq!(sem.available(), 1);
    w[lose].kill();
    assert_eq!(sem.reclaim_dead(), 3);
    assert_eq!(sem.available(), 4);
}

//! attack39: the owner lease against holders that `exec` (docs/owner-lease.md, Identity:
//! "Exiting", "Dead"; The sentinel: "Exec keeps the claims"; L2, L4, L5, L7).
//!
//! An exec ends every thread of the process but the one that called it, the sentinel
//! thread too, so the holder slot's sentinel word says `FUTEX_OWNER_DIED` while the
//! process lives on with the same pid and identity. The only thing that then stands
//! between a claimant and an "exiting" takeover of a live holder is the scan of
//! `/proc/PID/task` ("every thread `/proc/PID/task` lists is in the kernel's exit").
//!
//! 1. A holder execs into an image that never touches the lease (a launcher that claims
//!    and execs its worker), whose main thread exits (`pthread_exit` pattern) while its
//!    work is handed from thread to thread (each starts the next and ends: always one
//!    live application thread). The sentinel's mark stays (no handle of the new image
//!    re-arms it). A claimant with a huge grace loops `try_claim`: the holder lives, so
//!    it must never get the lease. Each control ends with a SIGKILL of the holder, after
//!    which the claim is taken over at once and reads the last published value.
//! 2. A holder of many threads execs from its last-started thread (not the main thread)
//!    while a waiter is blocked in `acquire` and another thread loops `try_claim`: the
//!    kernel kills the main thread and gives the exec'ing thread the main thread's tid
//!    in the middle of the exec; a scan that read the old main thread (in its exit) and
//!    then the exec'ing thread's old tid (by then the old main thread, or gone) must not
//!    conclude that every thread is exiting.
//! 3. A sibling thread execs while another thread of the holder is inside a `with_lease`
//!    closure; the new image holds the claim but cannot publish; a stale takeover (ticks)
//!    is told the payload may be inconsistent, never sees the abandoned value, writes on,
//!    and fences the new image.
//!
//! 1 and 2 failed before `procfs::all_tasks_flagged` (behind
//! `cxc_mmf::identity::threads_stopped`) took a thread gone since the listing for one in
//! its exit: a thread that started a successor and then ended normally (1), or the
//! exec'ing thread's old tid, which after the exec's tid exchange names the old main
//! thread or nothing (2), passed for an exiting thread, and the live holder was taken
//! over as exiting (`claim_exiting` 1) within milliseconds (1) or the first rounds (2),
//! every run. A vanished thread now means "not known to be stopped" (look again later),
//! and a second listing after the reads must name no new thread.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{EpochMode, LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, RoleCommand, child_wait_for_path, exit_main_thread, intact, path_arg, play_role, report,
    sealed, serial, sleep_forever,
};

type P = [u64; 6];

/// A heartbeat grace no test reaches: only the OS identity (or the sentinel) ends a claim.
const BIG: u64 = 1 << 40;
const REPORT_WAIT: Duration = Duration::from_secs(20);
const PATIENCE: Duration = Duration::from_secs(60);

fn me() -> u32 {
    std::process::id()
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

fn manual_never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Manual,
        ..LeaseOptions::default()
    }
}

/// Ends the calling thread only (the thread-only `exit(2)` system call), without
/// unwinding: the process lives on in its other threads.
fn end_this_thread() -> ! {
    // SAFETY: the thread-only exit system call ends this thread; nothing of it is used
    // again (its stack is not freed, which a test process does not mind).
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("SYS_exit returned")
}

/// The value the holder published before its exec.
const HELD_VAL: u64 = 0x5EED_0005;

/// In a role: opens the lease at `path`, claims it for this process's pid with a huge
/// grace and publishes `sealed(HELD_VAL)`.
fn claim_and_publish(path: &Path) -> OwnerLease<P> {
    let lease: OwnerLease<P> = OwnerLease::open(path).unwrap();
    assert!(lease.try_acquire(me(), BIG), "the holder could not claim");
    assert!(lease.write_as_owner(me(), sealed(HELD_VAL)));
    lease
}

/// After the holder was killed: the claim is taken over at once and the last published
/// value is read back.
fn take_over_after_kill(lease: &OwnerLease<P>, kid: &mut Proc, what: &str) {
    kid.kill();
    let c = lease
        .acquire(me(), BIG, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: the killed holder was not taken over"));
    let v = lease.read_claimed(&c).expect("we hold it");
    assert!(intact(&v), "{what}: torn payload {v:x?}");
    assert_eq!(
        v,
        sealed(HELD_VAL),
        "{what}: not the holder's last published value"
    );
    assert!(lease.release_claim(&c));
}

// ---------------------------------------------------------------------------------------
// 1. An exec'd holder whose new image hands its work from thread to thread.
// ---------------------------------------------------------------------------------------

const CHAIN: &str = "exec_d_holder_handing_work_between_threads_is_never_taken_over_as_exiting";
/// How long the new image's hand-off chain runs (the parent kills it before).
const CHAIN_FOR: Duration = Duration::from_secs(30);
/// How long the claimant loops.
const CLAIM_FOR: Duration = Duration::from_secs(6);

/// Role: claims, publishes, then execs into role `chain` (same process, same claim).
fn role_exec_chain() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let _lease = claim_and_publish(&path);
    report("held");
    child_wait_for_path(&dir.join("exec"), PATIENCE);
    let err = RoleCommand::new(CHAIN, "chain")
        .arg("path", &path)
        .arg("dir", &dir)
        .into_command()
        .exec();
    panic!("exec: {err}");
}

fn link(deadline: Instant, links: Arc<AtomicU64>) {
    let n = links.fetch_add(1, Ordering::Relaxed) + 1;
    if Instant::now() >= deadline {
        report(format!("done links={n}"));
        return;
    }
    let l = Arc::clone(&links);
    std::thread::Builder::new()
        .name("chain".into())
        .spawn(move || link(deadline, l))
        .expect("spawn the next link");
    // Returns at once: the next link runs, this one ends.
}

/// Role: the new image. It never opens the lease (the claim it inherited stays held:
/// "Exec keeps the claims"). Its main thread exits, and its work goes from thread to
/// thread; the test thread starts the chain and ends itself.
fn role_chain() {
    assert!(exit_main_thread(), "the main thread did not exit");
    let links = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + CHAIN_FOR;
    report("chaining");
    link(deadline, links);
    end_this_thread();
}

/// Docs, Identity: "**Exiting** is a third verdict, earlier than dead: the holder's
/// sentinel says its process is exiting, **and** every thread `/proc/PID/task` lists is
/// in the kernel's exit ..., so no thread of it can be in a critical section any more.
/// The sentinel alone is not enough: ... an exec fires it while the process lives on."
/// Identity: "A process whose main thread exited while other threads run (`/proc/PID/stat`
/// says `Z`) is **alive**." The sentinel: "**Exec keeps the claims** (the same process:
/// same pid and identity). The exec ends the sentinel thread, so a waiter is woken and
/// finds the mark, but the process's threads are not in their exit: it waits on."
/// L5: a holder is replaced when its whole process is gone, or a stopped or hung one
/// after the grace (here: never).
#[test]
fn exec_d_holder_handing_work_between_threads_is_never_taken_over_as_exiting() {
    play_role!(role_exec_chain, role_chain);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease: OwnerLease<P> = OwnerLease::create_with(&path, sealed(1), &manual_never()).unwrap();
    let mut kid = RoleCommand::new(CHAIN, "exec_chain")
        .arg("path", &path)
        .arg("dir", d.path())
        .spawn();
    assert_eq!(kid.next_report(REPORT_WAIT), "held");
    touch(&d.path().join("exec"));
    assert_eq!(kid.next_report(REPORT_WAIT), "chaining");
    assert_eq!(lease.current_owner(), Some(kid.pid()));
    let t0 = Instant::now();
    let mut tries = 0u64;
    let mut taken = None;
    while t0.elapsed() < CLAIM_FOR {
        tries += 1;
        if let Some(c) = lease.try_claim(me(), BIG) {
            taken = Some((c, t0.elapsed()));
            break;
        }
        if tries.is_multiple_of(256) {
            assert!(kid.try_wait().is_none(), "the chain process ended early");
        }
    }
    let alive = kid.try_wait().is_none();
    let stats = lease.stats();
    eprintln!("{tries} claims tried; holder alive={alive}; stats={stats:?}");
    if let Some((c, at)) = taken {
        let v = lease.read_claimed(&c);
        let torn = c.payload_may_be_inconsistent();
        let _ = lease.release_claim(&c);
        panic!(
            "the live exec'd holder (its new image handing work between threads, main \
             thread exited) was taken over after {at:?} and {tries} tries: holder alive \
             = {alive}, taker read {:x?}, told torn = {torn}, claim_exiting = {}",
            v.map(|v| v[0]),
            stats.claim_exiting
        );
    }
    assert!(alive, "the holder process must still run");
    assert_eq!(lease.current_owner(), Some(kid.pid()));
    take_over_after_kill(&lease, &mut kid, "chain");
}

// ---------------------------------------------------------------------------------------
// 2. Exec from a non-main thread of a many-threaded holder, with takers scanning.
// ---------------------------------------------------------------------------------------

const THREAD_EXEC: &str = "holder_execing_from_a_worker_thread_is_never_taken_over_mid_exec";
/// Threads the holder starts (asleep) before the exec'ing one: they make a scan of its
/// task list long, with the main thread first and the exec'ing thread last.
const FILLERS: usize = 48;
const ROUNDS: usize = 20;

/// Role: claims, publishes, starts `FILLERS` sleeping threads, then one more thread that
/// waits for the marker `exec` and execs into role `execd`. The test thread (not the
/// main thread either) waits.
fn role_thread_execer() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = claim_and_publish(&path);
    for _ in 0..FILLERS {
        std::thread::spawn(sleep_forever);
    }
    let marker = dir.join("exec");
    let execer = std::thread::spawn(move || {
        child_wait_for_path(&marker, PATIENCE);
        let err = RoleCommand::new(THREAD_EXEC, "execd")
            .arg("path", &path)
            .arg("dir", &dir)
            .into_command()
            .exec();
        panic!("exec: {err}");
    });
    report("held");
    let _ = execer.join();
    drop(lease);
}

/// Role: the new image; it does not touch the lease (the claim stays held) and says so
/// by a marker file.
fn role_execd() {
    touch(&path_arg("dir").join("execd"));
    sleep_forever();
}

/// Docs, The sentinel: "**Exec keeps the claims** ... The exec ends the sentinel thread,
/// so a waiter is woken and finds the mark, but the process's threads are not in their
/// exit: it waits on." Identity, Exiting: "every thread `/proc/PID/task` lists is in the
/// kernel's exit ... The sentinel alone is not enough: ... an exec fires it while the
/// process lives on."
#[test]
fn holder_execing_from_a_worker_thread_is_never_taken_over_mid_exec() {
    play_role!(role_thread_execer, role_execd);
    let _s = serial();
    let mut scans = 0u64;
    for round in 0..ROUNDS {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lease");
        let lease: Arc<OwnerLease<P>> =
            Arc::new(OwnerLease::create_with(&path, sealed(1), &manual_never()).unwrap());
        let mut kid = RoleCommand::new(THREAD_EXEC, "thread_execer")
            .arg("path", &path)
            .arg("dir", d.path())
            .spawn();
        assert_eq!(kid.next_report(REPORT_WAIT), "held");
        // A waiter blocked across the exec (woken by the sentinel's end).
        let stop = Arc::new(AtomicBool::new(false));
        let execd = d.path().join("execd");
        let waiter = {
            let lease = Arc::clone(&lease);
            let execd = execd.clone();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Some(c) = lease.acquire(me(), BIG, Duration::from_millis(300)) {
                        // Kept (not released): one takeover is the evidence.
                        got.push((c.generation(), execd.exists()));
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                got
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        touch(&d.path().join("exec"));
        // Claim attempts all through the exec, and a while after it.
        let mut taken = Vec::new();
        let mut seen_at: Option<Instant> = None;
        let t0 = Instant::now();
        loop {
            scans += 1;
            if taken.is_empty()
                && let Some(c) = lease.try_claim(me(), BIG)
            {
                // Kept (not released): one takeover is the evidence.
                taken.push((c.generation(), kid.try_wait().is_none(), execd.exists()));
                stop.store(true, Ordering::Relaxed);
            }
            if seen_at.is_none() && execd.exists() {
                seen_at = Some(Instant::now());
            }
            if seen_at.is_some_and(|t| t.elapsed() > Duration::from_millis(150)) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "round {round}: the new image never started"
            );
        }
        stop.store(true, Ordering::Relaxed);
        let waited = waiter.join().unwrap();
        let alive = kid.try_wait().is_none();
        let stats = lease.stats();
        assert!(
            taken.is_empty() && waited.is_empty(),
            "round {round}: the live holder that exec'd from a worker thread was taken over \
             (try_claim got {taken:?}, the blocked waiter got {waited:?}: (generation, [holder alive,] new image started)); holder alive = \
             {alive}, claim_exiting = {}, stats = {stats:?}",
            stats.claim_exiting
        );
        assert!(alive, "round {round}: the exec'd holder must still run");
        assert_eq!(lease.current_owner(), Some(kid.pid()), "round {round}");
        if round == ROUNDS - 1 {
            take_over_after_kill(&lease, &mut kid, "thread exec");
        } else {
            kid.kill();
        }
    }
    eprintln!("{ROUNDS} rounds, {scans} try_claims");
}

// ---------------------------------------------------------------------------------------
// 3. A sibling thread execs while another thread of the holder is inside `with_lease`.
// ---------------------------------------------------------------------------------------

const SIB: &str = "exec_by_a_sibling_mid_with_lease_never_publishes_and_a_stale_takeover_recovers";
/// The value the old image's `with_lease` closure sets and never returns from.
const ABANDONED: u64 = 0xDEAD_0001;
/// The value the new image tries to write under the inherited claim.
const NEW_IMAGE: u64 = 0xDEAD_0002;
/// The grace (manual epochs) of the holder's claim.
const SIB_GRACE: u64 = 5;

/// Role: one thread runs `with_lease` (which claims) and, inside the closure, sets the
/// value to `sealed(ABANDONED)` and blocks; another thread then execs (on the marker
/// `exec`) into role `sib_after`, which ends the closure's thread mid-update.
fn role_sib_execer() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = Arc::new(OwnerLease::<P>::open(&path).unwrap());
    let l = Arc::clone(&lease);
    std::thread::spawn(move || {
        l.with_lease(me(), SIB_GRACE, |v| {
            *v = sealed(ABANDONED);
            report("inside");
            sleep_forever()
        })
    });
    child_wait_for_path(&dir.join("exec"), PATIENCE);
    let err = RoleCommand::new(SIB, "sib_after")
        .arg("path", &path)
        .arg("dir", &dir)
        .into_command()
        .exec();
    panic!("exec: {err}");
}

/// Role: the new image: it holds the claim (same process), tries to write under it (the
/// abandoned update's WRITE is still set), and, after the parent's stale takeover, tries
/// again (fenced).
fn role_sib_after() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    let owner = lease.am_i_owner(me());
    let wrote = lease.write_as_owner(me(), sealed(NEW_IMAGE));
    let nested = lease.with_lease(me(), SIB_GRACE, |v| *v = sealed(NEW_IMAGE + 1));
    report(format!(
        "owner={owner} wrote={wrote} nested={}",
        nested.is_some()
    ));
    child_wait_for_path(&dir.join("again"), PATIENCE);
    let owner2 = lease.am_i_owner(me());
    let wrote2 = lease.write_as_owner(me(), sealed(NEW_IMAGE + 2));
    let nested2 = lease.with_lease(me(), SIB_GRACE, |v| *v = sealed(NEW_IMAGE + 3));
    let released = lease.release(me());
    report(format!(
        "owner={owner2} wrote={wrote2} nested={} released={released}",
        nested2.is_some()
    ));
    sleep_forever();
}

fn quarantined(path: &Path) -> u32 {
    ((cxc_testkit::read_word(path, 128) >> 15) & 0xFF).count_ones()
}

/// Docs, The sentinel: "A write or `with_lease` update that the exec cut short is never
/// published: the claim keeps WRITE, the new image's writes of that claim give up after
/// ~100 ms". Identity: "A claim of an exiting holder is taken over **as stale** ...: its
/// staging buffer is quarantined if a write may be in flight, the payload is flagged torn
/// if the write was interrupted (L4), and the new claim fences the old one (L2)"; L5: a
/// stopped or hung holder "after the grace"; L7: "no byte of an abandoned write is ever
/// published". Here the exec is made by a sibling of the thread inside `with_lease`, and
/// the claim ends by a stale takeover (ticks), not by the new image's release.
#[test]
fn exec_by_a_sibling_mid_with_lease_never_publishes_and_a_stale_takeover_recovers() {
    play_role!(role_sib_execer, role_sib_after);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease: OwnerLease<P> = OwnerLease::create_with(&path, sealed(1), &manual_never()).unwrap();
    let mut kid = RoleCommand::new(SIB, "sib_execer")
        .arg("path", &path)
        .arg("dir", d.path())
        .spawn();
    assert_eq!(kid.next_report(REPORT_WAIT), "inside");
    touch(&d.path().join("exec"));
    let r = kid.next_report(REPORT_WAIT);
    eprintln!("new image: {r}");
    assert_eq!(
        r, "owner=true wrote=false nested=false",
        "the new image holds the claim, but neither its write nor its nested with_lease \
         may publish while the cut update's WRITE is set"
    );
    let st = lease.status();
    assert!(st.writing, "the cut update's WRITE stays");
    assert_eq!(st.payload_words, sealed(1), "nothing was published");
    assert_eq!(lease.current_owner(), Some(kid.pid()));
    // The new image does not beat: after the grace (our ticks) the claim is stale.
    assert!(lease.try_claim(me(), SIB_GRACE).is_none(), "fresh: not yet");
    for _ in 0..=SIB_GRACE {
        lease.tick_epoch();
    }
    let c = lease
        .try_claim(me(), SIB_GRACE)
        .expect("the stale exec'd holder is taken over");
    assert!(
        c.payload_may_be_inconsistent(),
        "the takeover of a claim whose update was cut short is told"
    );
    let v = lease.read_claimed(&c).expect("we hold it");
    assert_eq!(v, sealed(1), "the abandoned value was never published");
    assert_eq!(
        quarantined(&path),
        1,
        "the cut update's buffer is quarantined"
    );
    assert!(lease.write_claimed(&c, sealed(2)), "the lease is not stuck");
    touch(&d.path().join("again"));
    let r2 = kid.next_report(REPORT_WAIT);
    eprintln!("new image after the takeover: {r2}");
    assert_eq!(
        r2, "owner=false wrote=false nested=false released=false",
        "the superseded new image is fenced"
    );
    assert_eq!(lease.read_claimed(&c), Some(sealed(2)));
    assert!(lease.write_claimed(&c, sealed(3)));
    assert!(lease.release_claim(&c));
    assert_eq!(lease.status().payload_words, sealed(3));
    // Its process gone, the buffer is freed (a writer that finds no free buffer reaps;
    // here we only check nothing of it was published and the lease works on).
    kid.kill();
    let c = lease
        .acquire(me(), SIB_GRACE, Duration::from_secs(10))
        .expect("vacant");
    for k in 0..20u64 {
        assert!(lease.write_claimed(&c, sealed(100 + k)), "write {k}");
        let got = lease.read_claimed(&c).expect("held");
        assert_eq!(got, sealed(100 + k), "write {k} read back");
    }
    assert!(lease.release_claim(&c));
}

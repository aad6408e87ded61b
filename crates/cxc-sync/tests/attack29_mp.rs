#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack29: `SharedSemaphore` promises (docs/shared-semaphore.md) not attacked before,
//! with real processes.
//!
//! 1. A process that ends its main thread *before* it first touches the semaphore, then
//!    takes permits from a worker thread: kept while it lives, returned once it dies
//!    (pidfs and fallback identity paths).
//! 2. The same with its pid handed to another such process (root, new pid namespace):
//!    the heir inherits neither slot nor permits.
//! 3. An independent ledger (4 two-thread workers, one half-exited, and 2 takers of
//!    handed permits) under seeded SIGKILL/SIGSTOP, stop-the-world samples.
//! 4. `Permit`, `OwnedPermit` and `ManyPermits` copied by `fork` while a hand-off is out.
//! 5. An `open_unregistered` process facing a full holder table.
//! 6. A blocked `acquire_many` and a stopped, half-exited holder, then killed.
//!
//! Both fallback variants of 1 and 2 failed before the fix: on the fallback path
//! `cxc_mmf::identity` gave a process whose main thread had already exited start time 0,
//! an unknown identity (tag 0): its permits were never reclaimed, and a later process
//! with the same pid and the same condition was taken for it.

mod procs;

use procs::words;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cxc_mmf::identity::Identity;
use cxc_sync::{SemaphoreOptions, SharedSemaphore};
use cxc_testkit::{
    Proc, RoleCommand, exit_main_thread, path_arg, serial, sleep_forever, wait_until,
};
use procs::{report, role};

/// How long a child may take to report.
const REPORT_WAIT: Duration = Duration::from_secs(20);

fn held_by(sem: &SharedSemaphore, pid: u32) -> Option<u32> {
    sem.holders()
        .into_iter()
        .find(|h| h.pid == pid && !h.reclaiming)
        .map(|h| h.held)
}

// ---------------------------------------------------------------------------------------
// 1. A process whose main thread exited *before* it first touched the semaphore.
// ---------------------------------------------------------------------------------------

/// Role: ends its main thread first, then (from the test's thread) opens the semaphore
/// and takes `n` permits, reports its identity, and lives on until killed.
fn role_late_half() {
    assert!(exit_main_thread(), "the main thread did not exit");
    let sem = SharedSemaphore::open(path_arg("path")).unwrap();
    let n: u32 = cxc_testkit::arg("n").parse().unwrap();
    for _ in 0..n {
        std::mem::forget(sem.try_acquire().expect("a permit"));
    }
    let id = Identity::current();
    report(format!(
        "held={n} unique={:#x} known={}",
        id.unique,
        id.is_known()
    ));
    sleep_forever();
}

fn late_half_scenario(test: &str, fallback: bool) {
    cxc_testkit::play_role!(role_late_half);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    const MAX: u32 = 3;
    let sem = SharedSemaphore::create(&path, MAX, MAX).unwrap();
    let mut cmd = RoleCommand::new(test, "late_half")
        .arg("path", &path)
        .arg("n", "2");
    if fallback {
        cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
    }
    let mut kid: Proc = cmd.spawn();
    let line = kid.next_report(REPORT_WAIT);
    eprintln!("child: {line}");
    assert_eq!(kid.state(), Some('Z'), "the main thread exited");
    assert_eq!(
        held_by(&sem, kid.pid()),
        Some(2),
        "its two permits are tracked"
    );
    // Alive (a worker thread runs): never reclaimed.
    assert_eq!(
        sem.reclaim_dead(),
        0,
        "a live half-exited holder was reclaimed"
    );
    assert_eq!(sem.available(), 1);
    kid.kill();
    // Dead: its permits come back.
    let back = sem.reclaim_dead();
    assert_eq!(
        (back, sem.available(), held_by(&sem, kid.pid())),
        (2, MAX, None),
        "a dead holder that registered after its main thread exited kept its permits \
         (child said: {line})"
    );
}

/// "Permits held by a process that dies are returned, like SysV `SEM_UNDO`"; "A main
/// thread that exited while a worker thread holds permits leaves `Z`...; that process is
/// alive and keeps its permits" — here the process *first* touches the semaphore after
/// its main thread exited (pidfs identity path).
#[test]
fn sem_holder_registered_after_its_main_thread_exited_is_reclaimed_once_dead() {
    late_half_scenario(
        "sem_holder_registered_after_its_main_thread_exited_is_reclaimed_once_dead",
        false,
    );
}

/// As above, on the fallback identity path (pid + start time).
#[test]

fn sem_holder_registered_after_its_main_thread_exited_is_reclaimed_once_dead_fallback() {
    late_half_scenario(
        "sem_holder_registered_after_its_main_thread_exited_is_reclaimed_once_dead_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 2. The same, with the dead holder's pid handed to another such process (root).
// ---------------------------------------------------------------------------------------

fn late_reuse(test: &str, fallback: bool) {
    match role().as_deref() {
        Some("nsroot") => procs::nsroot(test),
        Some("scenario") => late_reuse_scenario(test, fallback),
        Some("holder") => {
            assert!(exit_main_thread(), "the main thread did not exit");
            let sem = SharedSemaphore::open(procs::dir().join("sem")).unwrap();
            std::mem::forget(sem.try_acquire().expect("first permit"));
            std::mem::forget(sem.try_acquire().expect("second permit"));
            report("HELD");
            sleep_forever();
        }
        Some("impostor") => {
            assert!(exit_main_thread(), "the main thread did not exit");
            let sem = SharedSemaphore::open(procs::dir().join("sem")).unwrap();
            let me = std::process::id();
            // The held counts of the slots naming this pid: its own (0) and the dead
            // holder's (2), unless it was taken for the dead holder.
            let mut mine: Vec<u32> = sem
                .holders()
                .iter()
                .filter(|h| h.pid == me)
                .map(|h| h.held)
                .collect();
            mine.sort_unstable();
            let released = sem.release();
            report(format!(
                "RESULT released={released} slots={mine:?} avail={}",
                sem.available()
            ));
            sleep_forever();
        }
        Some(other) => panic!("unknown role {other}"),
        None => procs::run_reuse_test(test, fallback),
    }
}

fn late_reuse_scenario(test: &str, fallback: bool) {
    procs::mount_own_proc();
    assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
    let sem = SharedSemaphore::create(procs::dir().join("sem"), 2, 2).unwrap();
    let mut holder = procs::spawn(test, "holder", &procs::dir(), &[]);
    procs::wait_line(&mut holder, "HELD");
    let hpid = holder.pid();
    assert_eq!(sem.available(), 0);
    holder.kill();
    // Past the fallback path's same-tick window.
    std::thread::sleep(Duration::from_millis(30));
    let mut imp = procs::spawn_with_pid(hpid, test, "impostor", &[]);
    let line = procs::wait_line(&mut imp, "RESULT");
    assert_eq!(
        line, "RESULT released=false slots=[0, 2] avail=0",
        "a process given a dead holder's pid inherited its slot or permits"
    );
    assert_eq!(sem.reclaim_dead(), 2, "the dead holder's permits");
    assert_eq!(sem.available(), 2);
    imp.kill();
}

/// "A new process that got a dead holder's pid has another identity tag: it registers a
/// slot of its own, holds nothing, cannot release the dead holder's permits (`release()`
/// → `false`), and the dead holder's permits are reclaimed" — both processes ended their
/// main thread before first touching the semaphore (pidfs path).
#[test]
fn sem_late_half_exited_heir_of_a_late_half_exited_holders_pid_inherits_nothing() {
    late_reuse(
        "sem_late_half_exited_heir_of_a_late_half_exited_holders_pid_inherits_nothing",
        false,
    );
}

/// As above, on the fallback identity path.
#[test]

fn sem_late_half_exited_heir_of_a_late_half_exited_holders_pid_inherits_nothing_fallback() {
    late_reuse(
        "sem_late_half_exited_heir_of_a_late_half_exited_holders_pid_inherits_nothing_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 3. An independent ledger under SIGKILL and SIGSTOP: hand-offs, sibling threads.
// ---------------------------------------------------------------------------------------
/// Ledger layout. Word `L_OUT` packs one 8-bit field per worker (permits it confirmed it
/// holds: added right after an acquire, taken off right before a release or disown) and
/// field `HANDED_FIELD` (hand-offs confirmed: added after a disown, reserved by a taker
/// before its release). Every field under-counts the truth, so the sum of the fields
/// never exceeds the permits really out of the pool, at any instant.
const L_OUT: usize = 0;
/// First violation seen by a child (0 = none): code, then a detail word.
const L_BAD: usize = 1;
const L_BAD_DETAIL: usize = 2;
/// Operations completed (all children), for progress.
const L_OPS: usize = 3;
/// In-flight operation of worker `w`, thread `t`: `L_FLIGHT + 2 * w + t`, as
/// `kind << 8 | k` (0 = none).
const L_FLIGHT: usize = 8;
const L_WORDS: usize = 64;
const HANDED_FIELD: usize = 7;
const K_ACQ: u64 = 1;
const K_REL: u64 = 2;
const K_DIS: u64 = 3;
const K_TAKE: u64 = 4;
const CHAOS_MAX: u64 = 4;
const WORKERS: usize = 4;
const TAKERS: usize = 2;

fn field(l: u64, f: usize) -> u64 {
    (l >> (8 * f)) & 0xFF
}

fn fields_sum(l: u64) -> u64 {
    (0..8).map(|f| field(l, f)).sum()
}

fn violation(led: &[AtomicU64], code: u64, detail: u64) {
    if led[L_BAD]
        .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        led[L_BAD_DETAIL].store(detail, Ordering::SeqCst);
    }
}

/// One thread of a chaos worker: records each operation in the ledger around it.
struct Ledger {
    led: &'static [AtomicU64],
    w: usize,
    flight: &'static AtomicU64,
}

impl Ledger {
    fn begin(&self, kind: u64, k: u64) {
        self.flight.store(kind << 8 | k, Ordering::SeqCst);
    }
    fn end(&self) {
        self.flight.store(0, Ordering::SeqCst);
        self.led[L_OPS].fetch_add(1, Ordering::Relaxed);
    }
    /// After an acquire of `k`: add, then check the cap.
    fn got(&self, k: u64) {
        let l =
            self.led[L_OUT].fetch_add(k << (8 * self.w), Ordering::SeqCst) + (k << (8 * self.w));
        if fields_sum(l) > CHAOS_MAX {
            violation(self.led, 1, l);
        }
    }
    /// Before a release (or disown) of `k`.
    fn giving(&self, k: u64) {
        self.led[L_OUT].fetch_sub(k << (8 * self.w), Ordering::SeqCst);
    }
}

enum Hand {
    Forgotten,
    Guard(cxc_sync::Permit<'static>),
}

/// One thread's loop of random operations; `rx` (thread 1 only) receives permits or
/// forgotten permits from thread 0 to return.
fn chaos_thread(
    sem: &'static SharedSemaphore,
    owned: &std::sync::Arc<SharedSemaphore>,
    lg: &Ledger,
    rng: &mut cxc_testkit::Rng,
    tx: Option<&std::sync::mpsc::Sender<Hand>>,
    rx: Option<&std::sync::mpsc::Receiver<Hand>>,
) -> ! {
    let hold = |rng: &mut cxc_testkit::Rng| {
        std::thread::sleep(Duration::from_micros(rng.below(1500)));
    };
    loop {
        if let Some(rx) = rx {
            while let Ok(h) = rx.try_recv() {
                // A sibling's permit, returned by this thread.
                lg.begin(K_REL, 1);
                lg.giving(1);
                match h {
                    Hand::Guard(p) => drop(p),
                    Hand::Forgotten => {
                        if !sem.release() {
                            violation(lg.led, 2, lg.w as u64);
                        }
                    }
                }
                lg.end();
            }
        }
        let op = rng.below(if tx.is_some() { 8 } else { 6 });
        let wait = Duration::from_micros(rng.below(20_000));
        match op {
            0 | 1 => {
                lg.begin(K_ACQ, 1);
                let p = if op == 0 {
                    sem.try_acquire()
                } else {
                    sem.acquire_timeout(wait)
                };
                let Some(p) = p else {
                    lg.end();
                    continue;
                };
                lg.got(1);
                lg.end();
                hold(rng);
                lg.begin(K_REL, 1);
                lg.giving(1);
                drop(p);
                lg.end();
            }
            2 => {
                let k = rng.range(1, 4);
                lg.begin(K_ACQ, k);
                let Some(g) = sem.acquire_many_timeout(k as u32, wait) else {
                    lg.end();
                    continue;
                };
                lg.got(k);
                lg.end();
                hold(rng);
                lg.begin(K_REL, k);
                lg.giving(k);
                drop(g);
                lg.end();
            }
            3 => {
                lg.begin(K_ACQ, 1);
                let Some(p) = owned.clone().acquire_owned_timeout(wait) else {
                    lg.end();
                    continue;
                };
                lg.got(1);
                lg.end();
                hold(rng);
                lg.begin(K_REL, 1);
                lg.giving(1);
                drop(p);
                lg.end();
            }
            4 | 5 => {
                // A hand-off to another process (a taker).
                lg.begin(K_ACQ, 1);
                let Some(p) = sem.acquire_timeout(wait) else {
                    lg.end();
                    continue;
                };
                lg.got(1);
                lg.end();
                hold(rng);
                lg.begin(K_DIS, 1);
                lg.giving(1);
                p.disown();
                lg.led[L_OUT].fetch_add(1 << (8 * HANDED_FIELD), Ordering::SeqCst);
                lg.end();
            }
            _ => {
                // To the sibling thread: a guard, or a forgotten permit.
                lg.begin(K_ACQ, 1);
                let Some(p) = sem.acquire_timeout(wait) else {
                    lg.end();
                    continue;
                };
                lg.got(1);
                lg.end();
                let h = if op == 6 {
                    Hand::Guard(p)
                } else {
                    std::mem::forget(p);
                    Hand::Forgotten
                };
                tx.expect("thread 0 hands over").send(h).unwrap();
            }
        }
    }
}

fn role_chaos_worker() {
    let w: usize = cxc_testkit::arg("idx").parse().unwrap();
    let seed: u64 = cxc_testkit::arg("seed").parse().unwrap();
    if cxc_testkit::arg("half") == "1" {
        assert!(exit_main_thread(), "the main thread did not exit");
    }
    let led = words(&path_arg("ledger"), L_WORDS);
    let owned = std::sync::Arc::new(SharedSemaphore::open(path_arg("path")).unwrap());
    let sem: &'static SharedSemaphore =
        Box::leak(Box::new(SharedSemaphore::open(path_arg("path")).unwrap()));
    let (tx, rx) = std::sync::mpsc::channel::<Hand>();
    let owned1 = owned.clone();
    std::thread::spawn(move || {
        let lg = Ledger {
            led,
            w,
            flight: &led[L_FLIGHT + 2 * w + 1],
        };
        let mut rng = cxc_testkit::Rng::derive(seed, w as u64, 1, 0);
        chaos_thread(sem, &owned1, &lg, &mut rng, None, Some(&rx));
    });
    report("ready");
    let lg = Ledger {
        led,
        w,
        flight: &led[L_FLIGHT + 2 * w],
    };
    let mut rng = cxc_testkit::Rng::derive(seed, w as u64, 0, 0);
    chaos_thread(sem, &owned, &lg, &mut rng, Some(&tx), None);
}

/// Role: holds no permit ever; returns handed-off permits it reserved in the ledger.
fn role_chaos_taker() {
    let w: usize = cxc_testkit::arg("idx").parse().unwrap();
    let led = words(&path_arg("ledger"), L_WORDS);
    let sem = SharedSemaphore::open(path_arg("path")).unwrap();
    let flight = &led[L_FLIGHT + 2 * w];
    report("ready");
    loop {
        let l = led[L_OUT].load(Ordering::SeqCst);
        if field(l, HANDED_FIELD) == 0 {
            std::thread::sleep(Duration::from_micros(300));
            continue;
        }
        flight.store(K_TAKE << 8 | 1, Ordering::SeqCst);
        if led[L_OUT]
            .compare_exchange(
                l,
                l - (1 << (8 * HANDED_FIELD)),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
            && !sem.release()
        {
            // A confirmed hand-off that no process holding nothing could return.
            violation(led, 3, l);
        }
        flight.store(0, Ordering::SeqCst);
        led[L_OPS].fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether every thread of `pid` is stopped (or, for a main thread that exited, a zombie).
fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        let s = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if !matches!(s, Some('T' | 't' | 'Z')) {
            return false;
        }
        any = true;
    }
    any
}

/// "At most `max_permits` permits are out at any time, across all processes"; Invariant
/// B: `avail + Σ held + handed = max_permits`; "A permit leaves the pool only to a
/// registered holder ... and comes back only from one"; "`Permit::disown()` ... moves the
/// permit from the holder's `held` to the `handed` book atomically (so the disowner's
/// death no longer returns it)"; "all handles and threads of a process share its slot,
/// so `mem::forget` + `release()` within a process works"; permits of a process that
/// dies are returned. 4 workers (2 threads each, one of them half-exited) and 2 takers
/// keep an independent ledger while SIGKILL and SIGSTOP hit them at random; every sample
/// stops all of them and compares the file with the ledger.
#[test]
fn sem_ledger_chaos_with_handoffs_sibling_threads_kills_and_stops() {
    const T: &str = "sem_ledger_chaos_with_handoffs_sibling_threads_kills_and_stops";
    cxc_testkit::play_role!(role_chaos_worker, role_chaos_taker);
    let _s = serial();
    let mut rng = cxc_testkit::Rng::for_test();
    let seed = rng.seed();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sem");
    let ledger = dir.path().join("ledger");
    let led = words(&ledger, L_WORDS);
    let max = CHAOS_MAX as u32;
    let sem =
        SharedSemaphore::create_with(&path, max, max, &SemaphoreOptions::default().holders(16))
            .unwrap();
    let mut generation = 0u64;
    let spawn = |i: usize, generation: &mut u64| -> Proc {
        *generation += 1;
        let role = if i < WORKERS {
            "chaos_worker"
        } else {
            "chaos_taker"
        };
        let mut p = RoleCommand::new(T, role)
            .arg("path", &path)
            .arg("ledger", &ledger)
            .arg("idx", i.to_string())
            .arg("seed", cxc_testkit::mix(seed ^ *generation).to_string())
            .arg("half", if i == 0 { "1" } else { "0" })
            .spawn();
        assert_eq!(p.next_report(REPORT_WAIT), "ready");
        p
    };
    let mut procs: Vec<Proc> = (0..WORKERS + TAKERS)
        .map(|i| spawn(i, &mut generation))
        .collect();
    // Hand-offs whose disowner or taker died mid-operation: each may or may not be in
    // the handed book.
    let mut dead_handed_slack = 0u64;
    let mut dead_pids: Vec<u32> = Vec::new();
    let flight = |i: usize, t: usize| led[L_FLIGHT + 2 * i + t].load(Ordering::SeqCst);
    let (mut kills, mut stops, mut samples) = (0, 0, 0);
    let start = std::time::Instant::now();
    let check_bad = || {
        let bad = led[L_BAD].load(Ordering::SeqCst);
        assert_eq!(
            bad,
            0,
            "seed {seed:#x}: a child saw a violation (1: over max, 2: sibling release \
             refused, 3: handed permit not returnable), detail {:#x}",
            led[L_BAD_DETAIL].load(Ordering::SeqCst)
        );
    };
    while start.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        let i = rng.below(procs.len() as u64) as usize;
        match rng.below(10) {
            0..=2 => {
                // SIGKILL at a random point: stopped there first, so that its ledger
                // entries are taken off while its permits are still its own (once it is
                // dead, a waiter of another process may reclaim and take them at once,
                // and the ledger would count them twice).
                procs[i].stop();
                assert!(
                    wait_until(Duration::from_secs(5), || all_stopped(procs[i].pid())),
                    "pid {} did not stop",
                    procs[i].pid()
                );
                for t in 0..2 {
                    let f = flight(i, t);
                    if matches!(f >> 8, K_DIS | K_TAKE) {
                        dead_handed_slack += 1;
                    }
                    led[L_FLIGHT + 2 * i + t].store(0, Ordering::SeqCst);
                }
                if i < WORKERS {
                    // Its confirmed permits stay out until reclaimed: an under-count
                    // from now on, never an over-count.
                    let mine = field(led[L_OUT].load(Ordering::SeqCst), i);
                    led[L_OUT].fetch_sub(mine << (8 * i), Ordering::SeqCst);
                }
                procs[i].kill();
                kills += 1;
                dead_pids.push(procs[i].pid());
                procs[i] = spawn(i, &mut generation);
            }
            3..=5 => {
                // A hostile scheduler: one process stopped for a while.
                procs[i].stop();
                stops += 1;
                std::thread::sleep(Duration::from_micros(rng.below(30_000)));
                procs[i].cont();
            }
            _ => {
                // Stop the world and compare.
                samples += 1;
                for p in &procs {
                    p.stop();
                }
                for p in &procs {
                    assert!(
                        wait_until(Duration::from_secs(5), || all_stopped(p.pid())),
                        "pid {} did not stop",
                        p.pid()
                    );
                }
                // Nobody runs: finish the pending transition and reclaim the dead.
                sem.reclaim_dead();
                let raw_avail = cxc_testkit::read_word(&path, 128) & 0xFF_FFFF;
                let hs = sem.holders();
                let handed = u64::from(sem.stats().handed);
                let books: u64 = hs.iter().map(|h| u64::from(h.held)).sum();
                let ctx = format!(
                    "seed {seed:#x} sample {samples}: avail {raw_avail} books {books} \
                     handed {handed} holders {hs:?}"
                );
                assert!(raw_avail <= CHAOS_MAX, "{ctx}: above max");
                assert_eq!(
                    raw_avail + books + handed,
                    CHAOS_MAX,
                    "{ctx}: not conserved"
                );
                let l = led[L_OUT].load(Ordering::SeqCst);
                assert!(
                    fields_sum(l) + raw_avail <= CHAOS_MAX,
                    "{ctx}: ledger {l:#x}"
                );
                let mut handed_slack = dead_handed_slack;
                for (i, p) in procs.iter().enumerate() {
                    let mine: Vec<&cxc_sync::HolderInfo> = hs
                        .iter()
                        .filter(|h| h.pid == p.pid() && !h.reclaiming)
                        .collect();
                    assert_eq!(mine.len(), 1, "{ctx}: process {i} has one slot");
                    let book = u64::from(mine[0].held);
                    let mut slack = 0;
                    for t in 0..2 {
                        let f = flight(i, t);
                        match f >> 8 {
                            K_ACQ | K_REL => slack += f & 0xFF,
                            K_DIS => {
                                slack += 1;
                                handed_slack += 1;
                            }
                            K_TAKE => handed_slack += 1,
                            _ => {}
                        }
                    }
                    let confirmed = if i < WORKERS { field(l, i) } else { 0 };
                    assert!(
                        (confirmed..=confirmed + slack).contains(&book),
                        "{ctx}: process {i} (pid {}) holds {book} by its book, {confirmed} \
                         (+{slack} in flight) by the ledger",
                        p.pid()
                    );
                }
                let hl = field(l, HANDED_FIELD);
                assert!(
                    (hl..=hl + handed_slack).contains(&handed),
                    "{ctx}: handed {handed}, ledger {hl} (+{handed_slack} in flight)"
                );
                for d in &dead_pids {
                    assert!(
                        !hs.iter().any(|h| h.pid == *d && !h.reclaiming),
                        "{ctx}: dead pid {d} still registered after reclaim_dead"
                    );
                }
                check_bad();
                for p in &procs {
                    p.cont();
                }
            }
        }
    }
    check_bad();
    let ops = led[L_OPS].load(Ordering::Relaxed);
    for p in &mut procs {
        p.kill();
    }
    // Everyone is gone: every permit comes back, the handed ones from this process (which
    // holds none).
    sem.reclaim_dead();
    let handed = sem.stats().handed;
    assert_eq!(
        sem.available() + handed,
        max,
        "seed {seed:#x}: after all died"
    );
    for _ in 0..handed {
        assert!(sem.release(), "seed {seed:#x}: a handed permit");
    }
    assert!(!sem.release(), "seed {seed:#x}: a permit from nobody");
    assert_eq!(sem.available(), max);
    let st = sem.stats();
    eprintln!(
        "seed {seed:#x}: {ops} ops, {kills} kills, {stops} stops, {samples} samples, \
         {handed} handed at the end, {} disowned, {} reclaimed",
        st.disowned, st.reclaimed_permits
    );
    assert!(ops > 1000 && samples > 10, "too little happened: {ops} ops");
    assert!(
        st.disowned > 0 && st.reclaimed_permits > 0,
        "no hand-off or no reclaim: {st:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Guards copied by fork, with a hand-off outstanding.
// ---------------------------------------------------------------------------------------

/// Pitfalls, "`fork` with live permits": "A `Permit`, `OwnedPermit` or `ManyPermits`
/// copied into a forked child is still the parent's: ... dropping (or `disown`ing) the
/// copy in the child does nothing, so it never returns a permit the child took itself
/// nor one handed to the child. A plain `release()` in the child is the child's own";
/// "the next `release()` by a process that holds no permit takes it from there". The
/// parent holds a `Permit`, an `OwnedPermit` and a `ManyPermits(2)` and has disowned one
/// more, then forks: the child disowns/drops every copy (nothing changes), then its
/// plain `release()` returns the handed permit once, and its own permit comes back when it
/// dies, the parent's four only when the parent dies.
#[test]
fn sem_guards_copied_by_fork_neither_disown_nor_return_a_handed_permit() {
    fn role_forker() {
        let path = path_arg("path");
        let sem = SharedSemaphore::open(&path).unwrap();
        let arc = std::sync::Arc::new(SharedSemaphore::open(&path).unwrap());
        let p = sem.try_acquire().expect("permit");
        let q = sem.try_acquire().expect("permit to disown");
        let owned = arc.clone().try_acquire_owned().expect("owned permit");
        let many = sem.try_acquire_many(2).expect("two permits");
        q.disown();
        let before = format!("avail={} handed={}", sem.available(), sem.stats().handed);
        // SAFETY: the forked child only calls this crate, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mut steps = Vec::new();
            let mut look = |what: &str| {
                steps.push(format!("{what}:{}/{}", sem.available(), sem.stats().handed))
            };
            p.disown();
            look("disown");
            drop(owned);
            look("owned");
            drop(many);
            look("many");
            let first = sem.release();
            let second = sem.release();
            look("released");
            let own = sem.try_acquire().map(std::mem::forget).is_some();
            look("own");
            report(format!(
                "child {} first={first} second={second} own={own}",
                steps.join(",")
            ));
            // SAFETY: ends the forked child at once, holding its own permit.
            unsafe { libc::_exit(0) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!("parent {before} child={child}"));
        std::mem::forget((p, owned, many));
        sleep_forever();
    }
    cxc_testkit::play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 6, 6).unwrap();
    let mut forker = RoleCommand::new(
        "sem_guards_copied_by_fork_neither_disown_nor_return_a_handed_permit",
        "forker",
    )
    .arg("path", &path)
    .spawn();
    let child = forker.next_report(REPORT_WAIT);
    let parent = forker.next_report(REPORT_WAIT);
    eprintln!("{child}\n{parent}");
    assert!(parent.starts_with("parent avail=1 handed=1 "), "{parent}");
    assert_eq!(
        child,
        "child disown:1/1,owned:1/1,many:1/1,released:2/0,own:1/0 first=true second=false \
         own=true",
        "copies in the child changed the pool, or the handed permit was not returned once"
    );
    let forker_pid = forker.pid();
    assert_eq!(held_by(&sem, forker_pid), Some(4), "{:?}", sem.holders());
    // The dead child held exactly its own permit.
    assert_eq!(sem.reclaim_dead(), 1, "{:?}", sem.holders());
    assert_eq!(sem.available(), 2);
    forker.kill();
    assert_eq!(sem.reclaim_dead(), 4);
    assert_eq!((sem.available(), sem.stats().handed), (6, 0));
}

// ---------------------------------------------------------------------------------------
// 5. A slotless process facing a full table.
// ---------------------------------------------------------------------------------------

/// Holder table: "No process runs untracked: ... `open_unregistered` (for inspection
/// tools) registers lazily on first use under the same rules" ("`try_acquire` gives
/// `None` and `acquire` waits, re-trying registration every 20 ms"); "The handed book says
/// how many permits are in transit, not to whom: any process that holds none may return
/// one". Max 3, 3 slots (this process, A holding 2 of which it disowns 1, B holding
/// none): C opens unregistered, is refused a permit although one is free, returns the
/// handed permit (once), then blocks in `acquire_timeout` until B is killed, and gets a
/// slot and a permit.
#[test]
fn sem_unregistered_process_in_a_full_table_waits_untracked_never_and_returns_handed() {
    const T: &str =
        "sem_unregistered_process_in_a_full_table_waits_untracked_never_and_returns_handed";
    fn role_a() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let keep = sem.try_acquire().expect("permit");
        sem.try_acquire().expect("permit to disown").disown();
        report("ready");
        std::mem::forget(keep);
        sleep_forever();
    }
    fn role_b() {
        let _sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("ready");
        sleep_forever();
    }
    fn role_c() {
        let sem = SharedSemaphore::open_unregistered(path_arg("path")).unwrap();
        let avail = sem.available();
        let try_got = sem.try_acquire().map(std::mem::forget).is_some();
        let timed = sem
            .acquire_timeout(Duration::from_millis(100))
            .map(std::mem::forget)
            .is_some();
        let many = sem.try_acquire_many(1).map(std::mem::forget).is_some();
        let r1 = sem.release();
        let r2 = sem.release();
        report(format!(
            "avail={avail} try={try_got} timed={timed} many={many} r1={r1} r2={r2} after={}",
            sem.available()
        ));
        let t = std::time::Instant::now();
        let got = sem.acquire_timeout(Duration::from_secs(15));
        report(format!(
            "got={} ms={} avail={}",
            got.is_some(),
            t.elapsed().as_millis(),
            sem.available()
        ));
        std::mem::forget(got);
        sleep_forever();
    }
    cxc_testkit::play_role!(role_a, role_b, role_c);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem =
        SharedSemaphore::create_with(&path, 3, 3, &SemaphoreOptions::default().holders(3)).unwrap();
    let spawn = |r: &str| RoleCommand::new(T, r).arg("path", &path).spawn();
    let mut a = spawn("a");
    assert_eq!(a.next_report(REPORT_WAIT), "ready");
    let mut b = spawn("b");
    assert_eq!(b.next_report(REPORT_WAIT), "ready");
    assert_eq!(sem.holders().len(), 3, "the table is full");
    assert_eq!((sem.available(), sem.stats().handed), (1, 1));
    let mut c = spawn("c");
    let line = c.next_report(REPORT_WAIT);
    assert_eq!(
        line, "avail=1 try=false timed=false many=false r1=true r2=false after=2",
        "a slotless process took a permit untracked, or could not return the handed one"
    );
    assert!(
        !sem.holders().iter().any(|h| h.pid == c.pid()),
        "C got a slot in a full table"
    );
    // C now waits in acquire_timeout: nothing free is taken untracked meanwhile.
    for _ in 0..20 {
        assert_eq!(sem.available(), 2, "a slotless waiter took a permit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = std::time::Instant::now();
    b.kill();
    let line = c.next_report(REPORT_WAIT);
    let waited = killed.elapsed();
    eprintln!("{line} (after {waited:?})");
    assert!(line.starts_with("got=true "), "{line}");
    assert!(line.ends_with(" avail=1"), "{line}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(held_by(&sem, c.pid()), Some(1), "{:?}", sem.holders());
    a.kill();
    assert_eq!(
        sem.reclaim_dead(),
        1,
        "A's kept permit, not the returned hand-off"
    );
    assert_eq!((sem.available(), sem.stats().handed), (2, 0));
}

// ---------------------------------------------------------------------------------------
// 6. A blocked acquire_many waiter and a half-exited holder, stopped, then killed.
// ---------------------------------------------------------------------------------------

/// "A main thread that exited while a worker thread holds permits leaves `Z` ...; that
/// process is alive and keeps its permits"; "Permits held by a process that dies are
/// returned ... by blocked acquirers on their own". Max 3; the holder takes 2 then ends
/// its main thread, and is SIGSTOPped for a while; a waiter blocked in
/// `acquire_many_timeout(3, 10 s)` must not get its set while the holder lives (stopped
/// or running), and gets it on its own soon after the holder is SIGKILLed.
#[test]
fn sem_blocked_acquire_many_waits_out_a_stopped_half_exited_holder_then_gets_its_permits() {
    const T: &str =
        "sem_blocked_acquire_many_waits_out_a_stopped_half_exited_holder_then_gets_its_permits";
    fn role_half() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        std::mem::forget(sem.try_acquire_many(2).expect("two permits"));
        assert!(exit_main_thread(), "the main thread did not exit");
        report("held=2");
        sleep_forever();
    }
    fn role_waiter() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("waiting");
        let t = std::time::Instant::now();
        let got = sem.acquire_many_timeout(3, Duration::from_secs(10));
        report(format!(
            "got={} ms={}",
            got.as_ref().map_or(0, |g| g.count()),
            t.elapsed().as_millis()
        ));
        std::mem::forget(got);
        sleep_forever();
    }
    cxc_testkit::play_role!(role_half, role_waiter);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 3, 3).unwrap();
    let spawn = |r: &str| RoleCommand::new(T, r).arg("path", &path).spawn();
    let mut half = spawn("half");
    assert_eq!(half.next_report(REPORT_WAIT), "held=2");
    assert_eq!(half.state(), Some('Z'));
    let mut waiter = spawn("waiter");
    assert_eq!(waiter.next_report(REPORT_WAIT), "waiting");
    let live_for = |ms: u64| {
        // The waiter reclaims every 20 ms: many chances to wrongly take the holder's.
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(ms) {
            let held: u32 = sem.holders().iter().map(|h| h.held).sum();
            assert!(held <= 3 && sem.available() <= 1, "{:?}", sem.holders());
            assert_eq!(
                held_by(&sem, half.pid()),
                Some(2),
                "a live holder was reclaimed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    live_for(300);
    half.stop();
    assert!(wait_until(Duration::from_secs(5), || all_stopped(
        half.pid()
    )));
    live_for(300);
    half.cont();
    live_for(100);
    let killed = std::time::Instant::now();
    half.kill();
    let line = waiter.next_report(REPORT_WAIT);
    let waited = killed.elapsed();
    eprintln!("{line} (after {waited:?})");
    assert!(line.starts_with("got=3 "), "{line}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(held_by(&sem, waiter.pid()), Some(3));
    assert_eq!(sem.available(), 0);
}

//! Attack 14: the heartbeat table + failover watchdog (docs/heartbeat.md,
//! docs/failover-watchdog.md) and the blocking paths of the shared semaphore
//! (docs/shared-semaphore.md), with real processes: a holder SIGKILLed right after its
//! count CAS (before its book CAS) while a blocked acquirer waits, three reclaimers (one
//! SIGKILLed mid-drain) after a holder of 3,000,000 permits died, a disowned permit
//! whose receiver died, `acquire_many` timeouts of zero and `Duration::MAX`, a chaos run
//! of `acquire_many` against single acquires under SIGSTOP/SIGKILL, a heartbeat chaos
//! run (4 workers, 2 watchdogs, all stopped and killed at random) with a per-unit
//! ledger, a watchdog SIGKILLed between its fence and its retag, `clear_dead_bitmap` and
//! `sweep_idle` racing a worker's late marks and clears, and the `Registration` guard
//! of a fenced worker.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]

mod procs;

use procs::words;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatError, HeartbeatOptions, HeartbeatTable, SharedSemaphore,
};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, fields, flag, num, path_arg, play_role, read_word, report, serial,
    sleep_forever, wait_for_path,
};

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

/// A child's own generator: seeded from the parent's seed (if any) and its pid.
fn child_rng() -> Rng {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::new(cxc_testkit::mix(u64::from(me()) ^ (t << 20) ^ 0x5eed))
}
// ---------------------------------------------------------------------------------------
// Semaphore file layout (docs/shared-semaphore.md, "Memory layout").
// ---------------------------------------------------------------------------------------

const SEM_COUNT: u64 = 128;
const SEM_SLOT0: u64 = 3008;

fn sem_owner(path: &Path, i: usize) -> u64 {
    read_word(path, SEM_SLOT0 + 64 * i as u64)
}

fn sem_book(path: &Path, i: usize) -> u64 {
    read_word(path, SEM_SLOT0 + 64 * i as u64 + 8)
}

/// The active holder slot of `pid` (owner word state 1, pid in bits 0..32).
fn sem_slot_of(path: &Path, pid: u32, holders: usize) -> Option<usize> {
    (0..holders).find(|&i| {
        let o = sem_owner(path, i);
        o & 0xFFFF_FFFF == u64::from(pid) && o >> 62 == 1
    })
}

fn sem_avail(path: &Path) -> u64 {
    read_word(path, SEM_COUNT) & ((1 << 24) - 1)
}

// ---------------------------------------------------------------------------------------
// S-1: a holder SIGKILLed between its count CAS and its book CAS, a blocked acquirer.
// ---------------------------------------------------------------------------------------

const SEM_PENDING: &str =
    "sem_blocked_acquirer_gets_the_permit_of_a_holder_killed_right_after_its_count_cas";

/// A process cycles `acquire`/drop on a one-permit semaphore and is SIGSTOPped at random
/// until it is caught right after the count CAS of an acquire, before its book CAS
/// (count word: author = its slot, op = acquire, avail 0; its book's `applied` is not the
/// word's `seq`: the transition is *pending*, docs "Crash atomicity"). It is SIGKILLed
/// there. Then another process blocks in `acquire_timeout(3 s)` (or `acquire_many`).
/// Promise (docs/shared-semaphore.md, Holder table): "A **blocked acquirer** scans every
/// 20 ms, skipping active slots that hold nothing, so a SIGKILLed holder's permits come
/// back within ~20 ms of its death without any call from the application." and
/// "Crash atomicity ... after it but before step 5, its change is pending ... the next
/// transition by anyone, or the reclaimer's drain, applies it".
// Found (fixed since): a holder SIGKILLed between its acquire's count CAS and its book CAS has book held=0, so a blocked acquirer's 20 ms reclaim skips it ("skipping active slots that hold nothing") and nobody ever helps: the waiter times out after 3 s while reclaim_dead() returns the permit at once (shared-semaphore.md: "a SIGKILLed holder's permits come back within ~20 ms of its death without any call from the application")
#[test]
fn sem_blocked_acquirer_gets_the_permit_of_a_holder_killed_right_after_its_count_cas() {
    fn role_cycler() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("READY");
        loop {
            let p = sem.acquire();
            drop(p);
        }
    }
    fn role_waiter() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let many = arg("many") == "1";
        let t0 = Instant::now();
        let got = if many {
            sem.acquire_many_timeout(1, Duration::from_secs(3))
                .map(std::mem::forget)
                .is_some()
        } else {
            sem.acquire_timeout(Duration::from_secs(3))
                .map(std::mem::forget)
                .is_some()
        };
        report(format!("got={got} ms={}", t0.elapsed().as_millis()));
    }
    play_role!(role_cycler, role_waiter);
    let _s = serial();
    let mut rng = Rng::for_test();
    let mut failures = Vec::new();
    for many in ["0", "1"] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sem");
        let sem = SharedSemaphore::create(&path, 1, 1).unwrap();
        let mut kid = RoleCommand::new(SEM_PENDING, "cycler")
            .arg("path", &path)
            .spawn();
        kid.next_report(REPORT_WAIT);
        let slot = sem_slot_of(&path, kid.pid(), 64).expect("the cycler's holder slot");
        let started = Instant::now();
        let mut tries = 0u32;
        let caught = loop {
            std::thread::sleep(Duration::from_micros(rng.range(20, 900)));
            kid.stop();
            kid.wait_state('T', Duration::from_secs(5));
            tries += 1;
            let c = read_word(&path, SEM_COUNT);
            let book = sem_book(&path, slot);
            let (avail, op, author, seq) =
                (c & 0xFF_FFFF, (c >> 24) & 3, (c >> 26) & 0x3FF, c >> 36);
            if author == slot as u64 + 1 && op == 0 && avail == 0 && book >> 32 != seq {
                break Some((c, book));
            }
            kid.cont();
            if started.elapsed() > Duration::from_secs(10) {
                break None;
            }
        };
        let Some((c, book)) = caught else {
            panic!(
                "never caught the holder between its count CAS and its book CAS in {tries} stops"
            );
        };
        kid.kill();
        println!("many={many}: caught after {tries} stops: count={c:#x} book={book:#x}");
        let mut w = RoleCommand::new(SEM_PENDING, "waiter")
            .arg("path", &path)
            .arg("many", many)
            .spawn();
        let line = w.next_report(REPORT_WAIT);
        let got = flag(&line, "got");
        let ms = num(&line, "ms");
        // For the message: what an explicit reclaim returns now.
        let back = sem.reclaim_dead();
        println!("many={many}: waiter {line}; reclaim_dead() afterwards returned {back}");
        if !got || ms > 1000 {
            failures.push(format!(
                "{}: the blocked waiter {} after {ms} ms (a later reclaim_dead() returned {back})",
                if many == "1" {
                    "acquire_many_timeout(1, 3 s)"
                } else {
                    "acquire_timeout(3 s)"
                },
                if got {
                    "got the permit only"
                } else {
                    "timed out"
                },
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "a holder SIGKILLed with its acquire pending (count CAS done, book not yet): {}",
        failures.join("; ")
    );
}

// ---------------------------------------------------------------------------------------
// S-2: three reclaimers after a big holder died; one of them SIGKILLed mid-drain.
// ---------------------------------------------------------------------------------------

const SEM_RECLAIM3: &str =
    "sem_reclaimers_racing_and_one_killed_mid_drain_return_a_dead_holders_permits_once";

/// A holder takes 3,000,000 of 16,000,000 permits and is SIGKILLed. Reclaimer A starts
/// `reclaim_dead()` and is SIGSTOPped mid-drain (owner word `reclaiming` by A, some
/// permits back), then SIGKILLed. Then B, C and the parent call `reclaim_dead()` at once.
/// Promise (docs/shared-semaphore.md, Holder table): "A reclaimer that dies mid-drain
/// leaves (reclaiming, dead reclaimer), which the next scan takes over; because B keeps
/// held(d) exact, the total returned over all reclaimers is exactly what d held."
#[test]
fn sem_reclaimers_racing_and_one_killed_mid_drain_return_a_dead_holders_permits_once() {
    fn role_holder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let k: u64 = arg("k").parse().unwrap();
        for _ in 0..k {
            std::mem::forget(sem.try_acquire().expect("a permit"));
        }
        report(format!("held={k}"));
        sleep_forever();
    }
    fn role_reclaimer() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("READY");
        wait_go(&path_arg("go"));
        let n = sem.reclaim_dead();
        report(format!("n={n}"));
    }
    play_role!(role_holder, role_reclaimer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let max = 16_000_000u32;
    let k = 3_000_000u64;
    let sem = SharedSemaphore::create(&path, max, max).unwrap();
    let mut holder = RoleCommand::new(SEM_RECLAIM3, "holder")
        .arg("path", &path)
        .arg("k", k.to_string())
        .spawn();
    holder.next_report(Duration::from_secs(60));
    let hslot = sem_slot_of(&path, holder.pid(), 64).expect("holder slot");
    holder.kill();
    let base = sem_avail(&path);
    assert_eq!(base, u64::from(max) - k);
    let go_a = d.path().join("go_a");
    let mut a = RoleCommand::new(SEM_RECLAIM3, "reclaimer")
        .arg("path", &path)
        .arg("go", &go_a)
        .spawn();
    a.next_report(REPORT_WAIT);
    touch(&go_a);
    assert!(
        cxc_testkit::wait_until(Duration::from_secs(10), || sem_avail(&path) > base + 1000),
        "reclaimer A never started draining"
    );
    a.stop();
    a.wait_state('T', Duration::from_secs(5));
    let owner = sem_owner(&path, hslot);
    let a_back = sem_avail(&path) - base;
    assert!(
        owner >> 62 == 2 && owner & 0xFFFF_FFFF == u64::from(a.pid()) && a_back < k,
        "setup: A was not caught mid-drain (owner {owner:#x}, {a_back} of {k} back)"
    );
    a.kill();
    let go = d.path().join("go_bc");
    let mut others: Vec<Proc> = (0..2)
        .map(|_| {
            let mut p = RoleCommand::new(SEM_RECLAIM3, "reclaimer")
                .arg("path", &path)
                .arg("go", &go)
                .spawn();
            p.next_report(REPORT_WAIT);
            p
        })
        .collect();
    touch(&go);
    let mine = u64::from(sem.reclaim_dead());
    let theirs: Vec<u64> = others
        .iter_mut()
        .map(|p| num(&p.next_report(Duration::from_secs(60)), "n"))
        .collect();
    let total: u64 = mine + theirs.iter().sum::<u64>();
    println!("A returned {a_back} before its death; then parent {mine}, B+C {theirs:?}");
    assert_eq!(
        total,
        k - a_back,
        "after A died mid-drain having returned {a_back}, the three racing reclaimers returned {total}, not {}",
        k - a_back
    );
    assert_eq!(sem.available(), max, "not every permit is back");
    assert_eq!(sem.reclaim_dead(), 0, "a later reclaim returned more");
    assert_eq!(
        sem_owner(&path, hslot),
        0,
        "the dead holder's slot was not freed"
    );
}

// ---------------------------------------------------------------------------------------
// S-3: a disowned permit whose receiver died.
// ---------------------------------------------------------------------------------------

const SEM_DISOWN: &str =
    "sem_disowned_permit_whose_receiver_died_stays_handed_until_a_holderless_release";

/// A giver disowns a permit and exits; the receiver is SIGKILLed without releasing it.
/// Promise (docs/shared-semaphore.md, Pitfalls): "A disowned permit whose receiver never
/// releases it stays out for good" — not reclaimed (the handed book says how many are in
/// transit, not to whom) — and "the next `release()` by a process that holds no permit
/// takes it from there", once; nothing goes above max.
#[test]
fn sem_disowned_permit_whose_receiver_died_stays_handed_until_a_holderless_release() {
    fn role_giver() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        sem.acquire().disown();
        report("disowned");
    }
    fn role_receiver() {
        let _sem = SharedSemaphore::open(path_arg("path")).unwrap();
        report("READY");
        sleep_forever();
    }
    fn role_returner() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let r1 = sem.release();
        let r2 = sem.release();
        report(format!("r1={r1} r2={r2} avail={}", sem.available()));
    }
    play_role!(role_giver, role_receiver, role_returner);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 2, 2).unwrap();
    let mut g = RoleCommand::new(SEM_DISOWN, "giver")
        .arg("path", &path)
        .spawn();
    g.finish(REPORT_WAIT);
    let mut r = RoleCommand::new(SEM_DISOWN, "receiver")
        .arg("path", &path)
        .spawn();
    r.next_report(REPORT_WAIT);
    r.kill();
    let back = sem.reclaim_dead();
    let st = sem.stats();
    assert_eq!(back, 0, "reclaim returned a permit in transit");
    assert_eq!(sem.available(), 1);
    assert_eq!(st.handed, 1, "the handed book lost the disowned permit");
    let mut ret = RoleCommand::new(SEM_DISOWN, "returner")
        .arg("path", &path)
        .spawn();
    let line = ret.next_report(REPORT_WAIT);
    assert!(
        flag(&line, "r1"),
        "the holderless release was refused: {line}"
    );
    assert!(
        !flag(&line, "r2"),
        "a second holderless release returned another: {line}"
    );
    assert_eq!(num(&line, "avail"), 2);
    assert_eq!(sem.stats().handed, 0);
    assert!(!sem.release(), "a release above max was accepted");
    assert_eq!(sem.available(), 2);
}

// ---------------------------------------------------------------------------------------
// S-4: acquire_many timeouts of zero and Duration::MAX.
// ---------------------------------------------------------------------------------------

const SEM_MANY_TO: &str = "sem_acquire_many_timeouts_of_zero_and_duration_max";

/// Promise (docs/shared-semaphore.md, API): `acquire_many` is "all or none ... never waits
/// holding part of them"; `None: n = 0 or > max`; a timeout of zero gives up at once
/// without leaking a partial grab; `Duration::MAX` waits until all n are free.
#[test]
fn sem_acquire_many_timeouts_of_zero_and_duration_max() {
    fn role_holder() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let g = sem.acquire_many(2).unwrap();
        report("held=2");
        std::thread::sleep(Duration::from_millis(400));
        drop(g);
        report("released");
        sleep_forever();
    }
    play_role!(role_holder);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let sem = SharedSemaphore::create(&path, 3, 3).unwrap();
    let t0 = Instant::now();
    assert!(sem.acquire_many(0).is_none());
    assert!(sem.acquire_many(4).is_none());
    assert!(sem.acquire_many_timeout(4, Duration::MAX).is_none());
    assert!(sem.acquire_many_timeout(0, Duration::MAX).is_none());
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "invalid n waited"
    );
    let mut h = RoleCommand::new(SEM_MANY_TO, "holder")
        .arg("path", &path)
        .spawn();
    h.next_report(REPORT_WAIT);
    let t0 = Instant::now();
    assert!(sem.acquire_many_timeout(2, Duration::ZERO).is_none());
    assert!(sem.try_acquire_many(2).is_none());
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_millis(50),
        "timeout 0 waited {waited:?}"
    );
    assert_eq!(
        sem.available(),
        1,
        "a failed attempt leaked part of its grab"
    );
    let one = sem
        .acquire_many_timeout(1, Duration::ZERO)
        .expect("one is free");
    assert_eq!(one.count(), 1);
    drop(one);
    let t0 = Instant::now();
    let all = sem
        .acquire_many_timeout(3, Duration::MAX)
        .expect("Duration::MAX gave up");
    let waited = t0.elapsed();
    assert_eq!(all.count(), 3);
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(3),
        "acquire_many(3, MAX) returned after {waited:?} (the holder released after ~400 ms)"
    );
    assert_eq!(sem.available(), 0);
    drop(all);
    assert_eq!(sem.available(), 3);
}

// ---------------------------------------------------------------------------------------
// S-5: chaos: acquire_many against single acquires under SIGSTOP/SIGKILL.
// ---------------------------------------------------------------------------------------

const SEM_CHAOS: &str = "sem_chaos_acquire_many_and_singles_under_kills_never_exceed_max";
const CHAOS_MAX: u32 = 5;
const CHAOS_WORKERS: usize = 5;

/// Sum of the 10-bit per-worker fields of the in-use word.
fn in_use_total(v: u64) -> u64 {
    (0..6).map(|i| (v >> (10 * i)) & 0x3FF).sum()
}

/// Five processes loop over `acquire_many` (blocking and with timeouts), `try_acquire_many`,
/// `acquire`, `acquire_timeout(0)` and `acquire_owned_timeout`, holding what they got
/// briefly, while the parent SIGSTOPs and SIGKILLs them at random for 10 s. Each process
/// counts what it holds in its own 10-bit field of one shared word (a killed process's
/// field is zeroed while it is stopped, before the kill), so the word's total is never
/// more than the permits really out. Promises (docs/shared-semaphore.md): "At most
/// `max_permits` permits are out at any time, across all processes", acquire_many
/// "all or none", and dead holders' permits come back: at the end, after every worker
/// is dead and `reclaim_dead()`, all `max_permits` are available.
#[test]
fn sem_chaos_acquire_many_and_singles_under_kills_never_exceed_max() {
    fn role_worker() {
        let sem = Arc::new(SharedSemaphore::open(path_arg("path")).unwrap());
        let w = words(&path_arg("ledger"), 32);
        let idx: usize = arg("idx").parse().unwrap();
        let shift = 10 * idx as u32;
        let mut rng = child_rng();
        report("READY");
        let hold = |n: u32, rng: &mut Rng| {
            let v =
                w[0].fetch_add(u64::from(n) << shift, Ordering::SeqCst) + (u64::from(n) << shift);
            let total = in_use_total(v);
            w[1].fetch_max(total, Ordering::SeqCst);
            if total > u64::from(CHAOS_MAX) {
                w[2].fetch_add(1, Ordering::SeqCst);
            }
            let t = rng.below(300);
            if t < 150 {
                std::hint::black_box((0..t * 20).sum::<u64>());
            } else {
                std::thread::sleep(Duration::from_micros(t));
            }
            w[0].fetch_sub(u64::from(n) << shift, Ordering::SeqCst);
        };
        loop {
            let n = rng.range(1, 4) as u32;
            match rng.below(7) {
                0 => {
                    let g = sem.acquire_many(n).unwrap();
                    hold(n, &mut rng);
                    drop(g);
                    w[3 + idx].fetch_add(1, Ordering::Relaxed);
                }
                1 => {
                    let to = Duration::from_micros(rng.below(10_000));
                    if let Some(g) = sem.acquire_many_timeout(n, to) {
                        assert_eq!(g.count(), n);
                        hold(n, &mut rng);
                        drop(g);
                        w[3 + idx].fetch_add(1, Ordering::Relaxed);
                    }
                }
                2 => {
                    if let Some(g) = sem.try_acquire_many(n) {
                        hold(n, &mut rng);
                        drop(g);
                        w[3 + idx].fetch_add(1, Ordering::Relaxed);
                    }
                }
                3 => {
                    let p = sem.acquire();
                    hold(1, &mut rng);
                    drop(p);
                    w[10 + idx].fetch_add(1, Ordering::Relaxed);
                }
                4 => {
                    if let Some(p) = sem.acquire_timeout(Duration::ZERO) {
                        hold(1, &mut rng);
                        drop(p);
                        w[10 + idx].fetch_add(1, Ordering::Relaxed);
                    }
                }
                5 => {
                    if let Some(p) =
                        Arc::clone(&sem).acquire_owned_timeout(Duration::from_millis(5))
                    {
                        hold(1, &mut rng);
                        drop(p);
                        w[10 + idx].fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {
                    let g = sem.acquire_many_timeout(n, Duration::MAX).unwrap();
                    hold(n, &mut rng);
                    drop(g);
                    w[3 + idx].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    play_role!(role_worker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let ledger = d.path().join("ledger");
    let w = words(&ledger, 32);
    let sem = SharedSemaphore::create(&path, CHAOS_MAX, CHAOS_MAX).unwrap();
    let spawn = |i: usize| {
        let mut p = RoleCommand::new(SEM_CHAOS, "worker")
            .arg("path", &path)
            .arg("ledger", &ledger)
            .arg("idx", i.to_string())
            .spawn();
        p.next_report(REPORT_WAIT);
        p
    };
    let mut kids: Vec<Proc> = (0..CHAOS_WORKERS).map(spawn).collect();
    // Zero a stopped worker's field (it cannot be inside its one fetch_add/fetch_sub).
    let zero_field = |i: usize| {
        let shift = 10 * i as u32;
        let mut cur = w[0].load(Ordering::SeqCst);
        loop {
            let f = (cur >> shift) & 0x3FF;
            match w[0].compare_exchange(cur, cur - (f << shift), Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
    };
    let mut rng = Rng::for_test();
    let started = Instant::now();
    let (mut kills, mut stops) = (0, 0);
    while started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(rng.range(10, 60)));
        let i = rng.below(CHAOS_WORKERS as u64) as usize;
        if rng.percent(50) {
            kids[i].stop();
            kids[i].wait_state('T', Duration::from_secs(5));
            zero_field(i);
            kids[i].kill();
            kids[i] = spawn(i);
            kills += 1;
        } else {
            kids[i].stop();
            std::thread::sleep(Duration::from_millis(rng.range(1, 40)));
            kids[i].cont();
            stops += 1;
        }
    }
    for (i, k) in kids.iter_mut().enumerate() {
        k.stop();
        k.wait_state('T', Duration::from_secs(5));
        zero_field(i);
        k.kill();
    }
    let back = sem.reclaim_dead();
    let many: u64 = (0..CHAOS_WORKERS)
        .map(|i| w[3 + i].load(Ordering::SeqCst))
        .sum();
    let singles: u64 = (0..CHAOS_WORKERS)
        .map(|i| w[10 + i].load(Ordering::SeqCst))
        .sum();
    println!(
        "kills={kills} stops={stops} many={many} singles={singles} max_in_use={} over={} \
         final reclaim={back} stats={:?}",
        w[1].load(Ordering::SeqCst),
        w[2].load(Ordering::SeqCst),
        sem.stats()
    );
    assert_eq!(
        w[2].load(Ordering::SeqCst),
        0,
        "more than max_permits ({CHAOS_MAX}) were in use at once (max seen {})",
        w[1].load(Ordering::SeqCst)
    );
    assert_eq!(
        sem.available(),
        CHAOS_MAX,
        "after every worker died and reclaim_dead(), permits are missing"
    );
    assert!(
        many > 100 && singles > 100,
        "too little progress: many={many} singles={singles}"
    );
}

// ---------------------------------------------------------------------------------------
// Heartbeat: file layout (docs/heartbeat.md).
// ---------------------------------------------------------------------------------------

const HB_SLOT0: u64 = 3008;

fn hb_word(path: &Path, slot: usize, off: u64) -> u64 {
    read_word(path, HB_SLOT0 + 64 * slot as u64 + off)
}

// ---------------------------------------------------------------------------------------
// H-1: chaos run with a per-unit ledger.
// ---------------------------------------------------------------------------------------

const HB_CHAOS: &str =
    "hb_chaos_workers_and_watchdogs_stopped_and_killed_every_unit_accounted_once";

/// Ledger of units ("tokens"): one token per `mark_in_flight` attempt.
const L_COUNTER: usize = 0;
const L_ORPHAN: usize = 1;
const L_LIVE_RECLAIM: usize = 2;
const L_INTENT: usize = 8; // one word per watchdog index
const L_ENTRIES: usize = 64;
const L_TOKENS: usize = 400_000;
const L_WORDS: usize = L_ENTRIES + 2 * L_TOKENS;

const ST_MARKING: u64 = 1;
const ST_MARKED: u64 = 2;
const ST_MARK_FAILED: u64 = 3;
const ST_CLEARING: u64 = 4;
const ST_CLEARED: u64 = 5;
const ST_CLEAR_FAILED: u64 = 6;

fn entry(state: u64, slot: usize, generation: u64, bit: u8) -> u64 {
    state | (u64::from(bit) << 4) | ((slot as u64) << 12) | (generation << 20)
}

fn entry_key(e: u64) -> u64 {
    e >> 4
}

/// Credits the reclaim of `bits` of registration (`slot`, `generation`) to the tokens
/// that set them: for each bit the newest token of that (slot, generation, bit).
fn record_reclaim(l: &[AtomicU64], slot: usize, generation: u64, bits: u64) {
    let n = (l[L_COUNTER].load(Ordering::SeqCst) as usize).min(L_TOKENS);
    for bit in FailoverWatchdog::iter_in_flight_bits(bits) {
        let key = entry_key(entry(0, slot, generation, bit));
        let found = (0..n)
            .rev()
            .find(|&t| entry_key(l[L_ENTRIES + t].load(Ordering::SeqCst)) == key);
        match found {
            Some(t) => {
                l[L_ENTRIES + L_TOKENS + t].fetch_add(1, Ordering::SeqCst);
            }
            None => {
                l[L_ORPHAN].fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

fn chaos_table_options() -> HeartbeatOptions {
    HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..HeartbeatOptions::default()
    }
}

/// Four worker processes take units (tokens in a shared ledger), mark each unit's bit
/// (up to three at once, bits spread over both halves), work, clear; sometimes they
/// unregister with units in flight. Two watchdog processes scan, reclaim and credit
/// every reclaimed bit to the unit that set it, and sweep idle slots. The parent
/// SIGSTOPs workers (short and past grace), SIGKILLs workers and watchdogs, for 12 s;
/// then kills every worker and reclaims the rest itself. Every unit must be accounted
/// for exactly once: a unit whose `clear_in_flight` returned true is never reclaimed;
/// a unit whose mark succeeded and whose clear did not (or never ran) is reclaimed
/// exactly once; a failed mark is never reclaimed; a reclaim never leaves its
/// registration live; every reclaimed bit belongs to some unit.
/// Promises: failover-watchdog.md "Each bit is returned by exactly one `reclaim` call";
/// heartbeat.md "every bit set by a successful `mark` is either cleared by its owner or
/// taken by exactly one watchdog" (slot.rs) / "a bit is either written before the
/// retag (and taken by it) or refused after it"; "Bits left behind stay in the FENCED
/// slot, which the next scan reports at once".
#[test]
fn hb_chaos_workers_and_watchdogs_stopped_and_killed_every_unit_accounted_once() {
    fn role_worker() {
        let t = HeartbeatTable::open(path_arg("path"), 8).unwrap();
        let l = words(&path_arg("ledger"), L_WORDS);
        let mut rng = child_rng();
        report("READY");
        'register: loop {
            let slot = match t.register(me()) {
                Ok(s) => s,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            };
            let Some(snap) = t.snapshot(slot) else {
                continue;
            };
            if snap.pid != me() || snap.fenced {
                continue;
            }
            let generation = snap.generation;
            // (token, bit) in flight.
            let mut out: Vec<(usize, u8)> = Vec::new();
            loop {
                // Not every time: a worker resumed after a long stop must also meet its
                // fence in mark_in_flight / clear_in_flight.
                if rng.percent(50) && !t.beat(slot) {
                    continue 'register;
                }
                if rng.percent(1) {
                    // Leave with units in flight: they must be reported and reclaimed.
                    t.unregister(slot);
                    continue 'register;
                }
                if out.len() < 3 && (out.is_empty() || rng.percent(50)) {
                    let bit = loop {
                        let b = rng.below(64) as u8;
                        if out.iter().all(|&(_, x)| x != b) {
                            break b;
                        }
                    };
                    let tok = l[L_COUNTER].fetch_add(1, Ordering::SeqCst) as usize;
                    if tok >= L_TOKENS {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    let e = &l[L_ENTRIES + tok];
                    e.store(entry(ST_MARKING, slot, generation, bit), Ordering::SeqCst);
                    let ok = t.mark_in_flight(slot, bit);
                    let st = if ok { ST_MARKED } else { ST_MARK_FAILED };
                    e.store(entry(st, slot, generation, bit), Ordering::SeqCst);
                    if !ok {
                        continue 'register;
                    }
                    out.push((tok, bit));
                } else {
                    let (tok, bit) = out.swap_remove(rng.below(out.len() as u64) as usize);
                    let e = &l[L_ENTRIES + tok];
                    e.store(entry(ST_CLEARING, slot, generation, bit), Ordering::SeqCst);
                    let ok = t.clear_in_flight(slot, bit);
                    let st = if ok { ST_CLEARED } else { ST_CLEAR_FAILED };
                    e.store(entry(st, slot, generation, bit), Ordering::SeqCst);
                    if !ok {
                        continue 'register;
                    }
                }
                // Work.
                std::thread::sleep(Duration::from_micros(rng.below(400)));
            }
        }
    }
    fn role_watchdog() {
        let t = HeartbeatTable::open(path_arg("path"), 8).unwrap();
        let l = words(&path_arg("ledger"), L_WORDS);
        let idx: usize = arg("idx").parse().unwrap();
        let w =
            FailoverWatchdog::with_grace(&t, 40).with_os_check_interval(Duration::from_millis(5));
        let mut rng = child_rng();
        report("READY");
        loop {
            for (slot, snap) in w.scan().dead_slots {
                l[L_INTENT + idx].store(
                    ((slot as u64) << 32) | (snap.generation + 1),
                    Ordering::SeqCst,
                );
                let bits = w.reclaim(slot);
                if bits != 0 {
                    if let Some(after) = t.snapshot(slot)
                        && after.generation == snap.generation
                        && !after.fenced
                    {
                        l[L_LIVE_RECLAIM].fetch_add(1, Ordering::SeqCst);
                    }
                    record_reclaim(l, slot, snap.generation, bits);
                }
                l[L_INTENT + idx].store(0, Ordering::SeqCst);
            }
            if rng.percent(5) {
                w.sweep_idle();
            }
            std::thread::sleep(Duration::from_micros(rng.range(500, 3000)));
        }
    }
    play_role!(role_worker, role_watchdog);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let ledger = d.path().join("ledger");
    let l = words(&ledger, L_WORDS);
    let table = HeartbeatTable::create_with(&path, 8, &chaos_table_options()).unwrap();
    let spawn_worker = || {
        let mut p = RoleCommand::new(HB_CHAOS, "worker")
            .arg("path", &path)
            .arg("ledger", &ledger)
            .spawn();
        p.next_report(REPORT_WAIT);
        p
    };
    let spawn_watchdog = |i: usize| {
        let mut p = RoleCommand::new(HB_CHAOS, "watchdog")
            .arg("path", &path)
            .arg("ledger", &ledger)
            .arg("idx", i.to_string())
            .spawn();
        p.next_report(REPORT_WAIT);
        p
    };
    let mut workers: Vec<Proc> = (0..4).map(|_| spawn_worker()).collect();
    let mut dogs: Vec<Proc> = (0..2).map(spawn_watchdog).collect();
    // Registrations a killed watchdog may have taken bits of without crediting them.
    let mut excused: Vec<(usize, u64)> = Vec::new();
    let kill_dog = |p: &mut Proc, i: usize, excused: &mut Vec<(usize, u64)>| {
        p.stop();
        p.wait_state('T', Duration::from_secs(5));
        let intent = l[L_INTENT + i].swap(0, Ordering::SeqCst);
        if intent != 0 {
            excused.push(((intent >> 32) as usize, (intent & 0xFFFF_FFFF) - 1));
        }
        p.kill();
    };
    let mut rng = Rng::for_test();
    let started = Instant::now();
    let mut actions = [0u32; 4];
    while started.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_millis(rng.range(10, 50)));
        match rng.below(10) {
            0..=3 => {
                let i = rng.below(4) as usize;
                workers[i].stop();
                // Short (within grace) or long (past grace: fenced and reclaimed).
                let ms = if rng.percent(50) {
                    rng.range(1, 20)
                } else {
                    rng.range(60, 200)
                };
                std::thread::sleep(Duration::from_millis(ms));
                workers[i].cont();
                actions[0] += 1;
            }
            4..=6 => {
                let i = rng.below(4) as usize;
                workers[i].kill();
                workers[i] = spawn_worker();
                actions[1] += 1;
            }
            7 | 8 => {
                let i = rng.below(2) as usize;
                kill_dog(&mut dogs[i], i, &mut excused);
                dogs[i] = spawn_watchdog(i);
                actions[2] += 1;
            }
            _ => {
                let i = rng.below(2) as usize;
                dogs[i].stop();
                std::thread::sleep(Duration::from_millis(rng.range(1, 60)));
                dogs[i].cont();
                actions[3] += 1;
            }
        }
    }
    for p in workers.iter_mut() {
        p.kill();
    }
    for (i, p) in dogs.iter_mut().enumerate() {
        kill_dog(p, i, &mut excused);
    }
    // Final pass: reclaim everything left (dead workers by OS identity, fenced slots).
    let w = FailoverWatchdog::with_grace(&table, 40).with_os_check_interval(Duration::ZERO);
    let busy = |table: &HeartbeatTable| {
        (0..8).any(|s| {
            table
                .snapshot(s)
                .is_some_and(|x| x.pid != 0 && x.in_flight_bitmap != 0)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while busy(&table) && Instant::now() < deadline {
        for (slot, snap) in w.scan().dead_slots {
            let bits = w.reclaim(slot);
            if bits != 0 {
                record_reclaim(l, slot, snap.generation, bits);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let left: Vec<_> = (0..8)
        .filter_map(|s| {
            table
                .snapshot(s)
                .filter(|x| x.in_flight_bitmap != 0)
                .map(|x| (s, x))
        })
        .collect();
    // Check every unit.
    let n = (l[L_COUNTER].load(Ordering::SeqCst) as usize).min(L_TOKENS);
    let mut problems: Vec<String> = Vec::new();
    let mut tally = [0u64; 8];
    let mut reclaimed_total = 0;
    let mut excused_units = 0;
    for t in 0..n {
        let e = l[L_ENTRIES + t].load(Ordering::SeqCst);
        if e == 0 {
            continue;
        }
        let r = l[L_ENTRIES + L_TOKENS + t].load(Ordering::SeqCst);
        reclaimed_total += r;
        let st = e & 0xF;
        tally[st as usize] += 1;
        let slot = ((e >> 12) & 0xFF) as usize;
        let generation = e >> 20;
        let bit = (e >> 4) & 0xFF;
        let what = format!("unit {t} (slot {slot} gen {generation} bit {bit})");
        if r > 1 {
            problems.push(format!("{what}: reclaimed {r} times"));
        }
        match st {
            ST_CLEARED if r > 0 => problems.push(format!(
                "{what}: its worker's clear_in_flight returned true, yet it was reclaimed"
            )),
            ST_MARK_FAILED if r > 0 => problems.push(format!(
                "{what}: its mark_in_flight failed, yet it was reclaimed"
            )),
            ST_MARKED | ST_CLEAR_FAILED if r == 0 => {
                if excused.contains(&(slot, generation)) {
                    excused_units += 1;
                } else {
                    problems.push(format!(
                        "{what}: marked, never cleared (state {st}), never reclaimed: lost"
                    ));
                }
            }
            _ => {}
        }
    }
    let orphans = l[L_ORPHAN].load(Ordering::SeqCst);
    let live = l[L_LIVE_RECLAIM].load(Ordering::SeqCst);
    println!(
        "units={n} by state {tally:?} reclaimed={reclaimed_total} excused={excused_units} \
         (killed watchdogs mid-reclaim: {}) actions [stop worker, kill worker, kill dog, stop dog]={actions:?} \
         counters={:?}",
        excused.len(),
        table.counters()
    );
    if orphans > 0 {
        problems.push(format!("{orphans} reclaimed bits belonged to no unit"));
    }
    if live > 0 {
        problems.push(format!("{live} reclaims left their registration live"));
    }
    if !left.is_empty() {
        problems.push(format!(
            "bits never reclaimed after every worker died: {left:?}"
        ));
    }
    assert!(n > 2000, "too little work: {n} units");
    assert!(
        tally[ST_CLEAR_FAILED as usize] + tally[ST_MARKED as usize] > 10,
        "too few units were ever reclaimed: {tally:?}"
    );
    assert!(
        problems.is_empty(),
        "{} broken units, first: {:?}",
        problems.len(),
        &problems[..problems.len().min(8)]
    );
}

// ---------------------------------------------------------------------------------------
// H-2: a watchdog SIGKILLed between its fence and its retag.
// ---------------------------------------------------------------------------------------

const HB_FENCE_KILL: &str =
    "hb_watchdog_killed_between_fence_and_retag_leaves_bits_for_the_next_reclaim_once";

/// A process loops: `register`, mark units 3 (low half) and 40 (high half), reclaim its
/// own registration with a watchdog. It is SIGSTOPped at random until caught after the
/// fencing CAS of a reclaim and before the retag of one or both halves (owner FENCED,
/// a half still with the live tag of that generation and its bit), then SIGKILLed.
/// Promise (failover-watchdog.md, reclaim): "if that watchdog died between its two
/// steps, the slot stays FENCED with bits, is reported again, and the next `reclaim` of
/// that report collects them"; "Each bit is returned by exactly one `reclaim` call".
/// The next watchdog's reclaim must return exactly the bits still in live-tagged halves,
/// a third watchdog nothing, and the slot must be reusable afterwards.
#[test]
fn hb_watchdog_killed_between_fence_and_retag_leaves_bits_for_the_next_reclaim_once() {
    fn role_selfreclaim() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        let w = FailoverWatchdog::with_grace(&t, 0);
        report("READY");
        loop {
            let Ok(slot) = t.register(me()) else { continue };
            assert!(t.mark_in_flight(slot, 3) && t.mark_in_flight(slot, 40));
            let snap = t.snapshot(slot).unwrap();
            let got = w.reclaim_snapshot(slot, &snap);
            assert_eq!(got, (1 << 3) | (1 << 40));
        }
    }
    play_role!(role_selfreclaim);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let mut rng = Rng::for_test();
    let mut results = Vec::new();
    // The window is a few instructions, so a stop lands in it rarely (5 to 30,000 stops,
    // varying with the machine); after 10 s a round fences by hand (below).
    for round in 0..3 {
        let mut kid = RoleCommand::new(HB_FENCE_KILL, "selfreclaim")
            .arg("path", &path)
            .spawn();
        kid.next_report(REPORT_WAIT);
        let started = Instant::now();
        let mut tries = 0;
        let caught = loop {
            std::thread::sleep(Duration::from_micros(rng.range(20, 900)));
            kid.stop();
            kid.wait_state('T', Duration::from_secs(5));
            tries += 1;
            let owner = hb_word(&path, 0, 0);
            let lo = hb_word(&path, 0, 16);
            let hi = hb_word(&path, 0, 24);
            let g = (owner >> 1) & 0x7FFF_FFFF;
            let live_tag = g << 1;
            let mut expect = 0u64;
            if lo >> 32 == live_tag {
                expect |= lo & 0xFFFF_FFFF;
            }
            if hi >> 32 == live_tag {
                expect |= (hi & 0xFFFF_FFFF) << 32;
            }
            if owner >> 32 == u64::from(kid.pid()) && owner & 1 == 1 && expect != 0 {
                break Some((owner, lo, hi, expect));
            }
            // The window is a few instructions: after 10 s of trying, catch the much
            // wider "marked, not yet fenced" state and do the killed watchdog's first
            // step ourselves (the fencing CAS: set FENCED in the owner word; the process
            // is stopped, so a plain write of the word is that CAS).
            if started.elapsed() > Duration::from_secs(10)
                && owner >> 32 == u64::from(kid.pid())
                && owner & 1 == 0
                && expect != 0
            {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.write_all_at(&(owner | 1).to_ne_bytes(), HB_SLOT0)
                    .unwrap();
                println!("round {round}: fenced by hand after {tries} stops");
                break Some((owner | 1, lo, hi, expect));
            }
            kid.cont();
            if started.elapsed() > Duration::from_secs(20) {
                break None;
            }
        };
        let Some((owner, lo, hi, expect)) = caught else {
            panic!("round {round}: the worker was never caught with marked bits in {tries} stops");
        };
        kid.kill();
        let w2 = FailoverWatchdog::with_grace(&table, 1000).with_os_check_interval(Duration::ZERO);
        let w3 = FailoverWatchdog::with_grace(&table, 1000).with_os_check_interval(Duration::ZERO);
        let rep2 = w2.scan();
        let rep3 = w3.scan();
        let got2 = w2.reclaim(0);
        let got3 = w3.reclaim(0);
        let snap = table.snapshot(0).unwrap();
        println!(
            "round {round}: caught after {tries} stops owner={owner:#x} lo={lo:#x} hi={hi:#x}; \
             reports {} {}; reclaimed {got2:#x} then {got3:#x}; now {snap:?}",
            rep2.dead_slots.len(),
            rep3.dead_slots.len()
        );
        results.push((expect, got2, got3, snap.in_flight_bitmap));
        let again = table.register(me());
        assert_eq!(
            again.ok(),
            Some(0),
            "round {round}: the slot was not reusable"
        );
        assert!(table.unregister(0));
    }
    for (round, (expect, got2, got3, left)) in results.iter().enumerate() {
        assert_eq!(
            (*got2, *got3, *left),
            (*expect, 0, 0),
            "round {round}: bits {expect:#x} were left by the killed watchdog; the next \
             reclaim returned {got2:#x}, a third {got3:#x}, {left:#x} stayed"
        );
    }
}

// ---------------------------------------------------------------------------------------
// H-3: clear_dead_bitmap and sweep_idle racing a worker's marks and clears.
// ---------------------------------------------------------------------------------------

const HB_CLEAR_RACE: &str =
    "hb_clear_dead_bitmap_and_sweep_idle_racing_late_marks_and_clears_account_every_bit";

/// A worker on a one-slot table (manual epochs, so it is always a little stale) toggles
/// random bits as fast as it can (marks and clears, a beat now and then), keeping the set
/// it believes it holds, until a call fails (it was fenced); it reports that set `h`
/// and registers again. The parent alternates between `scan` + `clear_dead_bitmap`
/// and `sweep_idle`, then reclaims what is left (`R`). Promises
/// (failover-watchdog.md): clear_dead_bitmap "erases only the bits the scan reported.
/// Bits set after the scan survive; the FENCED slot holding them is reported by the
/// next scan"; sweep_idle: "bits that raced in stay and make the slot reportable";
/// heartbeat.md: "a bit is either written before the retag (and taken by it) or refused
/// after it". So: erased ⊆ reported, erased ∩ R = ∅, erased ∪ R = h (nothing lost,
/// nothing twice, nothing the worker had cleared).
#[test]
fn hb_clear_dead_bitmap_and_sweep_idle_racing_late_marks_and_clears_account_every_bit() {
    fn role_toggler() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        let mut rng = child_rng();
        report("READY");
        loop {
            let Ok(slot) = t.register(me()) else {
                std::thread::yield_now();
                continue;
            };
            let generation = t.snapshot(slot).unwrap().generation;
            let mut h = 0u64;
            loop {
                // Four bits at the edges of both halves, so the slot is often idle
                // (sweep_idle's case).
                let b = [0u8, 31, 32, 63][rng.below(4) as usize];
                let ok = if h & (1 << b) != 0 {
                    let ok = t.clear_in_flight(slot, b);
                    if ok {
                        h &= !(1 << b);
                    }
                    ok
                } else {
                    let ok = t.mark_in_flight(slot, b);
                    if ok {
                        h |= 1 << b;
                    }
                    ok
                };
                if !ok || (rng.percent(5) && !t.beat(slot)) {
                    break;
                }
            }
            report(format!("gen={generation} h={h}"));
        }
    }
    play_role!(role_toggler);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let mut kid = RoleCommand::new(HB_CLEAR_RACE, "toggler")
        .arg("path", &path)
        .spawn();
    kid.next_report(REPORT_WAIT);
    let w = FailoverWatchdog::with_grace(&table, 0).with_os_check_interval(Duration::MAX);
    let mut problems = Vec::new();
    let (mut clear_rounds, mut sweep_rounds, mut raced_in, mut survived) = (0, 0, 0, 0);
    let started = Instant::now();
    let mut round = 0u32;
    while started.elapsed() < Duration::from_secs(12) && round < 200 {
        round += 1;
        // Wait for the worker's live registration.
        let mut snap = None;
        assert!(
            cxc_testkit::wait_until(Duration::from_secs(5), || {
                snap = table
                    .snapshot(0)
                    .filter(|s| s.pid == kid.pid() && !s.fenced);
                snap.is_some()
            }),
            "the worker never registered again"
        );
        let g = snap.unwrap().generation;
        let sweep = round.is_multiple_of(2);
        let mut erased = 0u64;
        let mut reported = 0u64;
        let fenced_it = if sweep {
            // Retry until a sweep finds the slot idle and fences it.
            let t0 = Instant::now();
            loop {
                table.tick_global_epoch();
                table.tick_global_epoch();
                if w.sweep_idle() == 1 {
                    break true;
                }
                if t0.elapsed() > Duration::from_secs(2) {
                    break false;
                }
            }
        } else {
            let t0 = Instant::now();
            loop {
                table.tick_global_epoch();
                let rep = w.scan();
                if let Some((_, s)) = rep
                    .dead_slots
                    .iter()
                    .find(|(i, s)| *i == 0 && s.generation == g)
                {
                    reported = s.in_flight_bitmap;
                    erased = w.clear_dead_bitmap(0);
                    break true;
                }
                if t0.elapsed() > Duration::from_secs(2) {
                    break false;
                }
            }
        };
        if !fenced_it {
            continue;
        }
        let line = kid.next_report(REPORT_WAIT);
        let (rg, h) = (num(&line, "gen"), num(&line, "h"));
        if rg != g {
            problems.push(format!(
                "round {round}: the worker reported gen {rg}, fenced {g}"
            ));
            break;
        }
        // What is left is in the FENCED slot: the next scan reports it, reclaim takes it.
        let mut rest = 0u64;
        table.tick_global_epoch();
        for (i, s) in w.scan().dead_slots {
            if i == 0 && s.generation == g {
                rest = w.reclaim(0);
            }
        }
        if sweep {
            sweep_rounds += 1;
            if h != 0 {
                raced_in += 1;
            }
        } else {
            clear_rounds += 1;
            if rest != 0 {
                survived += 1;
            }
        }
        if erased & !reported != 0 || erased & rest != 0 || erased | rest != h {
            problems.push(format!(
                "round {round} ({}): reported {reported:#x}, erased {erased:#x}, reclaimed \
                 after {rest:#x}, but the worker held {h:#x} when fenced",
                if sweep {
                    "sweep_idle"
                } else {
                    "clear_dead_bitmap"
                }
            ));
        }
    }
    println!(
        "rounds: clear {clear_rounds} (bits survived the clear in {survived}), sweep \
         {sweep_rounds} (bits raced in {raced_in}); counters {:?}",
        table.counters()
    );
    kid.kill();
    assert!(clear_rounds > 5 && sweep_rounds > 5, "too few rounds");
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// H-4: the Registration guard of a fenced worker.
// ---------------------------------------------------------------------------------------

const HB_GUARD: &str =
    "hb_fenced_registration_guard_errors_and_its_drop_leaves_the_next_owner_alone";

/// A worker `join`s a one-slot table and marks unit 7; it stalls; a watchdog reclaims
/// unit 7; the parent `join`s the reused slot and marks unit 3. The worker then resumes:
/// its guard's calls must return `Err(Fenced { slot })`, `in_flight()` `None`, and its
/// drop (unregister) must not touch the new registration. Promise (heartbeat.md API):
/// `join ... // guard: unregisters on drop`; `beat / mark_in_flight / clear_in_flight ->
/// Result<(), HeartbeatError> // Fenced { slot }`; "so it never erases the newer
/// registration's bits".
// Found (fixed since): a fenced Registration's in_flight() returns the units of the registration that reused its slot (Some(1 << 3)) instead of None (guard.rs Registration::in_flight: "The in-flight bitmap of this registration; `None` once it was fenced or reused.")
#[test]
fn hb_fenced_registration_guard_errors_and_its_drop_leaves_the_next_owner_alone() {
    fn role_joiner() {
        let t = HeartbeatTable::open(path_arg("path"), 1).unwrap();
        let reg = t.join().unwrap();
        reg.mark_in_flight(7).unwrap();
        report(format!("slot={}", reg.slot()));
        wait_go(&path_arg("go"));
        let mark = reg.mark_in_flight(8);
        let clear = reg.clear_in_flight(7);
        let beat = reg.beat();
        let inflight = reg.in_flight();
        let oob = reg.mark_in_flight(64);
        let fenced =
            |r: &Result<(), HeartbeatError>| matches!(r, Err(HeartbeatError::Fenced { slot: 0 }));
        drop(reg);
        report(format!(
            "mark={} clear={} beat={} inflight_none={} inflight={inflight:?} oob={}",
            fenced(&mark),
            fenced(&clear),
            fenced(&beat),
            inflight.is_none(),
            matches!(oob, Err(HeartbeatError::BitOutOfRange { bit: 64 }))
        ));
    }
    play_role!(role_joiner);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let go = d.path().join("go");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let mut kid = RoleCommand::new(HB_GUARD, "joiner")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    let line = kid.next_report(REPORT_WAIT);
    assert_eq!(num(&line, "slot"), 0);
    for _ in 0..3 {
        table.tick_global_epoch();
    }
    let w = FailoverWatchdog::with_grace(&table, 1).with_os_check_interval(Duration::MAX);
    assert_eq!(w.scan().dead_slots.len(), 1);
    assert_eq!(w.reclaim(0), 1 << 7);
    let mine = table.join().expect("the reclaimed slot is reusable");
    assert_eq!(mine.slot(), 0);
    mine.mark_in_flight(3).unwrap();
    touch(&go);
    let line = kid.next_report(REPORT_WAIT);
    kid.finish(REPORT_WAIT);
    let mut broken = Vec::new();
    for key in ["mark", "clear", "beat", "oob"] {
        if !flag(&line, key) {
            broken.push(format!(
                "the fenced guard's {key} was not Err(Fenced/BitOutOfRange)"
            ));
        }
    }
    if !flag(&line, "inflight_none") {
        broken.push(format!(
            "the fenced guard's in_flight() was {} (the new owner's units), not None",
            fields(&line)["inflight"]
        ));
    }
    if mine.beat().is_err() {
        broken.push("the new registration was fenced by the old guard's drop".into());
    }
    if mine.in_flight() != Some(1 << 3) {
        broken.push(format!(
            "the new registration's units became {:?}",
            mine.in_flight()
        ));
    }
    if mine.clear_in_flight(3).is_err() {
        broken.push("the new registration cannot clear its unit".into());
    }
    drop(mine);
    if table.snapshot(0).unwrap().pid != 0 {
        broken.push("the new guard's drop did not free the slot".into());
    }
    assert!(broken.is_empty(), "{line}: {broken:#?}");
}

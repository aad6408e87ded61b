#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack38: process identity promises of `SharedSemaphore` (docs/shared-semaphore.md)
//! and of `HeartbeatTable` + `FailoverWatchdog` (docs/heartbeat.md,
//! docs/failover-watchdog.md), with real processes, from angles earlier attack files did
//! not combine:
//!
//! 1. **Seats.** An independent ledger that needs no stop-the-world sample: `max_permits`
//!    seat words in a shared mapping. A process takes a seat (CAS `0 → pid`, or over the
//!    pid of a process whose every thread is gone) *after* it got a permit and gives it
//!    back *before* it returns the permit, so live seated processes never outnumber the
//!    permits out. A process holding a permit that finds every seat held by a live
//!    process (persistently, 10 s) proves more than `max_permits` permits out. Chaos: a
//!    small holder table (`TableFull` churn), workers of two threads (some half-exited
//!    before or after they open), SIGKILL and SIGSTOP at random, `fork` without `exec`
//!    of children that drop or disown the parent's permit copy, call `release()`, take
//!    permits of their own and die holding them, hand-offs (`disown`, takes by holderless
//!    processes), `mem::forget` + `release()`, `acquire_many`, and a reaper process
//!    calling `reclaim_dead()` all the time. At the end every permit must come back.
//! 2. **Full table, forked child.** A forked child of a holder that finds the holder table
//!    full of live processes takes nothing (not even with permits available) and returns
//!    nothing, then gets a slot and a permit of its own once a holder dies.
//! 3. **Release by a non-holder, in disguises.** A forked child and grandchild of a holder
//!    (also of a half-exited holder, forked from its worker thread), a sibling thread
//!    after the process's permits were dropped, a receiver of a hand-off that already
//!    returned it and its forked child: `release()` returns `false` and changes nothing
//!    (available, every book, the handed count); the guard copies in children do nothing.
//! 4. **Heartbeat, forked children of workers.** Workers fork children (without `exec`)
//!    that try every slot call on the parent's slots (the seed's slot API on the copied
//!    table and the copied registration guard) while watchdog processes reclaim and the
//!    parent SIGSTOPs/SIGKILLs workers; a ledger per unit checks H2 (each unit either
//!    cleared by its worker or reclaimed, exactly once) and that no child call acted.
//! 5. **A stopped reclaimer.** A holder of 3,000,000 permits is SIGKILLed; a third
//!    process in `reclaim_dead()` is SIGSTOPped mid-drain. While it is stopped the rest
//!    of the dead holder's permits stay out (a blocked acquirer and other reclaimers get
//!    none: the documented limit, "A reclaimer stopped mid-drain"); once it continues,
//!    every permit comes back.
//! 6. **A reclaimer whose process execs.** The same with the reclaiming thread ended by
//!    another thread's `execve`: the process lives on as the new image with the same
//!    identity. Before the new image's `reclaim_dead()` finished drains its identity had
//!    left (no thread of the image running them), the dead holder's permits stayed out
//!    for the new image's whole life; now its first scan returns them.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).

mod procs;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{
    FailoverWatchdog, HeartbeatError, HeartbeatTable, SemaphoreError, SemaphoreOptions,
    SharedSemaphore,
};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, exit_main_thread, path_arg, play_role, report, serial,
    sleep_forever, wait_until,
};
use procs::words;

const REPORT_WAIT: Duration = Duration::from_secs(30);

fn me() -> u32 {
    std::process::id()
}

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

/// Forks; the child runs `f` and `_exit`s with its result (running no destructor of the
/// parent's state). Returns the child's pid in the parent. `f` must capture guards by
/// reference only (the child takes its copy with [`copy_of`]): the parent drops `f`
/// without running it.
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the parent's pid, read before the fork, to notice a parent already gone.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork in a test role process; the child uses only the library (atomics on
    // shared mappings, its fork-safe registration lock), /proc reads and plain
    // allocations, then leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        die_with_parent();
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != parent {
            // SAFETY: leaving the child at once.
            unsafe { libc::_exit(0) };
        }
        let code = f();
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// The forked child's own copy of a value of its parent's memory (what `fork` gives it):
/// a bitwise copy, dropped or kept by the child as it likes.
fn copy_of<T>(v: &T) -> T {
    // SAFETY: called only in a forked child on a value of the parent's memory image that
    // the child never uses otherwise: the copy is the only one the child acts on.
    unsafe { std::ptr::read(v) }
}

/// Waits at most `timeout` for our child `pid`; SIGKILLs it past that. Its exit code
/// (`None` if killed or stopped past the deadline).
fn wait_child(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if r < 0 {
            return None;
        }
        if Instant::now() > deadline {
            // SAFETY: our own unreaped child: its pid cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Whether any thread of process `pid` is still alive (its state is not `Z`/`X`), read
/// from `/proc/<pid>/task/*/stat`: independent of the library's liveness. A process whose
/// main thread exited while others run is alive; a killed one (zombie or reaped) is not.
fn alive(pid: u64) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    for e in rd.flatten() {
        let Ok(s) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some((_, rest)) = s.rsplit_once(')')
            && let Some(c) = rest.trim_start().chars().next()
            && c != 'Z'
            && c != 'X'
        {
            return true;
        }
    }
    false
}

fn held_by(sem: &SharedSemaphore, pid: u32) -> u32 {
    sem.holders()
        .into_iter()
        .filter(|h| h.pid == pid && !h.reclaiming)
        .map(|h| h.held)
        .sum()
}

// ---------------------------------------------------------------------------------------
// 1. Seats: chaos with forks, hand-offs, half-exited workers, a small table, a reaper.
// ---------------------------------------------------------------------------------------

const SEATS_MAX: u32 = 3;
/// Seat words 0..SEATS_MAX.
const W_SEAT: usize = 0;
const W_VIOL: usize = 8;
const W_VWHY: usize = 9;
const W_VPID: usize = 10;
/// Copies of the seat words at the first violation.
const W_VSEATS: usize = 11;
const W_OPS: usize = 16;
const W_HANDED: usize = 17;
const W_FORKS: usize = 18;
const W_CHILD_OWN: usize = 19;
const W_TAKES: usize = 20;
const W_DIED_HOLDING: usize = 21;
const W_STOP: usize = 22;
const W_RECLAIMED: usize = 23;
const W_FORGET: usize = 24;
const W_WORDS: usize = 32;

/// Why a seat violation was recorded.
const WHY_NO_SEAT: u64 = 1;
const WHY_FORGET_RELEASE: u64 = 2;
const WHY_SEAT_STOLEN: u64 = 3;

fn violation(w: &[AtomicU64], why: u64) {
    if w[W_VIOL].fetch_add(1, Ordering::SeqCst) == 0 {
        w[W_VWHY].store(why, Ordering::SeqCst);
        w[W_VPID].store(u64::from(me()), Ordering::SeqCst);
        for i in 0..SEATS_MAX as usize {
            let v = w[W_SEAT + i].load(Ordering::SeqCst);
            w[W_VSEATS + i].store(v, Ordering::SeqCst);
        }
    }
}

/// Takes a seat for a permit this process holds: a free one, or one of a process that
/// is gone. `None` (and a violation) if every seat stays held by live processes.
fn take_seat(w: &[AtomicU64]) -> Option<usize> {
    let mine = u64::from(me());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut scans = 0u64;
    loop {
        for i in 0..SEATS_MAX as usize {
            let v = w[W_SEAT + i].load(Ordering::SeqCst);
            if (v == 0 || (v != mine && !alive(v)))
                && w[W_SEAT + i]
                    .compare_exchange(v, mine, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                return Some(i);
            }
        }
        scans += 1;
        if Instant::now() > deadline && scans > 2000 {
            violation(w, WHY_NO_SEAT);
            return None;
        }
        std::thread::sleep(Duration::from_micros(300));
    }
}

fn leave_seat(w: &[AtomicU64], seat: Option<usize>) {
    if let Some(i) = seat
        && w[W_SEAT + i]
            .compare_exchange(u64::from(me()), 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        violation(w, WHY_SEAT_STOLEN);
    }
}

fn hold(rng: &mut Rng) {
    match rng.below(4) {
        0 => {}
        1 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(rng.below(3000))),
    }
}

/// Reserves one handed-off permit in the ledger (the giver counted it after `disown`).
fn reserve_handed(w: &[AtomicU64]) -> bool {
    let mut n = w[W_HANDED].load(Ordering::SeqCst);
    while n > 0 {
        match w[W_HANDED].compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
    false
}

/// What a forked child of a seated holder does; `p` is its copy of the parent's guard.
fn seat_child(
    sem: &SharedSemaphore,
    w: &[AtomicU64],
    p: cxc_sync::Permit<'_>,
    choice: u64,
    seed: u64,
) -> i32 {
    let mut rng = Rng::new(seed);
    match choice {
        // The parent's guard, copied: dropping or disowning it must do nothing.
        0 => drop(p),
        1 => p.disown(),
        // A holderless release, reserved in the ledger (it takes a handed permit).
        2 => {
            std::mem::forget(p);
            if reserve_handed(w) && sem.release() {
                w[W_TAKES].fetch_add(1, Ordering::SeqCst);
            }
        }
        // Permits of its own: returned, or held when it dies.
        _ => {
            if choice == 3 {
                drop(p);
            } else {
                std::mem::forget(p);
            }
            let Some(own) = sem.acquire_timeout(Duration::from_millis(rng.below(30))) else {
                return 0;
            };
            w[W_CHILD_OWN].fetch_add(1, Ordering::SeqCst);
            let seat = take_seat(w);
            hold(&mut rng);
            if choice == 4 {
                // Dies holding it (the seat names a dead pid from now on).
                w[W_DIED_HOLDING].fetch_add(1, Ordering::SeqCst);
                std::mem::forget(own);
                return 0;
            }
            if choice == 5 {
                // A grandchild with copies of both guards: drops them.
                let or = &own;
                let g = fork_child(|| {
                    drop(copy_of(or));
                    0
                });
                let _ = wait_child(g, Duration::from_secs(10));
            }
            leave_seat(w, seat);
            drop(own);
        }
    }
    0
}

fn seat_chaos(sem: &'static SharedSemaphore, w: &'static [AtomicU64], mut rng: Rng) -> ! {
    loop {
        if w[W_STOP].load(Ordering::SeqCst) != 0 {
            sleep_forever();
        }
        let wait = Duration::from_millis(rng.below(30));
        match rng.below(12) {
            0..=2 => {
                if let Some(p) = sem.acquire_timeout(wait) {
                    let s = take_seat(w);
                    hold(&mut rng);
                    leave_seat(w, s);
                    drop(p);
                }
            }
            3 => {
                let k = rng.range(1, 3) as u32;
                if let Some(g) = sem.acquire_many_timeout(k, wait) {
                    let seats: Vec<_> = (0..k).map(|_| take_seat(w)).collect();
                    hold(&mut rng);
                    for s in seats {
                        leave_seat(w, s);
                    }
                    drop(g);
                }
            }
            4 => {
                // Within one process, `mem::forget` + `release()` is fine.
                if let Some(p) = sem.acquire_timeout(wait) {
                    let s = take_seat(w);
                    std::mem::forget(p);
                    hold(&mut rng);
                    leave_seat(w, s);
                    if !sem.release() {
                        violation(w, WHY_FORGET_RELEASE);
                    }
                    w[W_FORGET].fetch_add(1, Ordering::SeqCst);
                }
            }
            5 => {
                // A hand-off: out of the seat, disowned, then counted for a taker.
                if let Some(p) = sem.acquire_timeout(wait) {
                    let s = take_seat(w);
                    hold(&mut rng);
                    leave_seat(w, s);
                    p.disown();
                    w[W_HANDED].fetch_add(1, Ordering::SeqCst);
                }
            }
            6 => {
                if reserve_handed(w) && sem.release() {
                    w[W_TAKES].fetch_add(1, Ordering::SeqCst);
                }
            }
            7..=9 => {
                let Some(p) = sem.acquire_timeout(wait) else {
                    continue;
                };
                let s = take_seat(w);
                let (choice, seed) = (rng.below(6), rng.next_u64());
                w[W_FORKS].fetch_add(1, Ordering::SeqCst);
                let pr = &p;
                let child = fork_child(|| seat_child(sem, w, copy_of(pr), choice, seed));
                hold(&mut rng);
                let _ = wait_child(child, Duration::from_secs(15));
                leave_seat(w, s);
                drop(p);
            }
            _ => {
                let n = sem.reclaim_dead();
                w[W_RECLAIMED].fetch_add(u64::from(n), Ordering::SeqCst);
            }
        }
        w[W_OPS].fetch_add(1, Ordering::SeqCst);
    }
}

fn seat_open(path: &Path) -> SharedSemaphore {
    match SharedSemaphore::open(path) {
        Ok(s) => s,
        // "registration fails clearly ... never runs untracked": a lazy handle instead.
        Err(SemaphoreError::TableFull { .. }) => SharedSemaphore::open_unregistered(path).unwrap(),
        Err(e) => panic!("open: {e:?}"),
    }
}

/// "At most `max_permits` permits are out at any time, across all processes. Permits held
/// by a process that dies are returned"; "A `Permit` ... copied into a forked child is
/// still the parent's ... dropping (or `disown`ing) the copy in the child does nothing";
/// "Within one process, `mem::forget` + `release()` is fine"; "No process runs untracked";
/// "A main thread that exited while a worker thread holds permits ... is alive and keeps
/// its permits".
#[test]
fn sem_seats_never_outnumber_max_under_forks_handoffs_half_exits_kills_and_a_full_table() {
    fn role_seat_worker() {
        let half = arg("half");
        let seed: u64 = arg("seed").parse().unwrap();
        if half == "1" {
            assert!(exit_main_thread(), "the main thread did not exit");
        }
        let w = words(&path_arg("board"), W_WORDS);
        let sem: &'static SharedSemaphore = Box::leak(Box::new(seat_open(&path_arg("path"))));
        let mut rng = Rng::new(seed);
        let other = Rng::new(rng.next_u64());
        std::thread::spawn(move || seat_chaos(sem, w, other));
        if half == "2" {
            assert!(exit_main_thread(), "the main thread did not exit");
        }
        report("ready");
        seat_chaos(sem, w, rng);
    }
    fn role_seat_taker() {
        let w = words(&path_arg("board"), W_WORDS);
        let sem = seat_open(&path_arg("path"));
        report("ready");
        loop {
            if reserve_handed(w) && sem.release() {
                w[W_TAKES].fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    fn role_seat_reaper() {
        let w = words(&path_arg("board"), W_WORDS);
        let path = path_arg("path");
        let sem = seat_open(&path);
        report("ready");
        let mut rng = Rng::new(u64::from(me()));
        loop {
            let n = sem.reclaim_dead();
            w[W_RECLAIMED].fetch_add(u64::from(n), Ordering::SeqCst);
            if rng.percent(5) {
                // Another handle of this process (same slot) or a refused one.
                let _ = SharedSemaphore::open(&path);
            }
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
        }
    }
    play_role!(role_seat_worker, role_seat_taker, role_seat_reaper);
    let _s = serial();
    const TEST: &str =
        "sem_seats_never_outnumber_max_under_forks_handoffs_half_exits_kills_and_a_full_table";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seats.sem");
    let board = dir.path().join("board");
    // The parent takes one of 8 slots; 3 workers, a taker and a reaper 5 more: forked
    // children and dead holders fight over the last 2.
    let sem = SharedSemaphore::create_with(
        &path,
        SEATS_MAX,
        SEATS_MAX,
        &SemaphoreOptions::default().holders(8),
    )
    .unwrap();
    let w = words(&board, W_WORDS);
    let mut rng = Rng::for_test();
    let spawn = |role: &str, rng: &mut Rng| -> Proc {
        let mut p = RoleCommand::new(TEST, role)
            .arg("path", &path)
            .arg("board", &board)
            .arg("half", rng.below(3).to_string())
            .arg("seed", rng.next_u64().to_string())
            .spawn();
        let _ = p.next_report(REPORT_WAIT);
        p
    };
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn("seat_worker", &mut rng)).collect();
    let mut taker = spawn("seat_taker", &mut rng);
    let mut reaper = spawn("seat_reaper", &mut rng);
    let (mut kills, mut stops) = (0, 0);
    let end = Instant::now() + Duration::from_secs(12);
    while Instant::now() < end && w[W_VIOL].load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(rng.range(40, 250)));
        match rng.below(10) {
            0..=3 => {
                let i = rng.below(3) as usize;
                workers[i].kill();
                kills += 1;
                workers[i] = spawn("seat_worker", &mut rng);
            }
            4..=6 => {
                let i = rng.below(3) as usize;
                workers[i].stop();
                std::thread::sleep(Duration::from_millis(rng.range(5, 150)));
                workers[i].cont();
                stops += 1;
            }
            7 => {
                taker.kill();
                kills += 1;
                taker = spawn("seat_taker", &mut rng);
            }
            8 => {
                reaper.kill();
                kills += 1;
                reaper = spawn("seat_reaper", &mut rng);
            }
            _ => {}
        }
        assert!(sem.available() <= SEATS_MAX);
    }
    w[W_STOP].store(1, Ordering::SeqCst);
    for p in workers.iter_mut().chain([&mut taker, &mut reaper]) {
        p.kill();
    }
    let load = |i: usize| w[i].load(Ordering::SeqCst);
    let summary = format!(
        "seed={} ops={} forks={} child_own={} died_holding={} takes={} forget={} reclaimed={} \
         kills={kills} stops={stops} stats={:?}",
        rng.seed(),
        load(W_OPS),
        load(W_FORKS),
        load(W_CHILD_OWN),
        load(W_DIED_HOLDING),
        load(W_TAKES),
        load(W_FORGET),
        load(W_RECLAIMED),
        sem.stats()
    );
    println!("{summary}");
    assert_eq!(
        load(W_VIOL),
        0,
        "why={} by pid {} (alive {}) seats at the time: {:?}; {summary}",
        load(W_VWHY),
        load(W_VPID),
        alive(load(W_VPID)),
        (0..SEATS_MAX as usize)
            .map(|i| (load(W_VSEATS + i), alive(load(W_VSEATS + i))))
            .collect::<Vec<_>>()
    );
    // "Permits held by a process that dies are returned": everyone is gone (forked
    // children die with their parents); a holderless release returns what was handed.
    let back = wait_until(Duration::from_secs(30), || {
        sem.reclaim_dead();
        while sem.release() {}
        sem.available() == SEATS_MAX
    });
    assert!(
        back,
        "permits lost for good: available {} of {SEATS_MAX}, holders {:?}, stats {:?}; {summary}",
        sem.available(),
        sem.holders(),
        sem.stats()
    );
    assert_eq!(sem.stats().over_held, 0, "{summary}");
    assert_eq!(sem.stats().handed, 0, "{summary}");
    assert!(
        load(W_OPS) > 100 && load(W_FORKS) > 5,
        "too little happened: {summary}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A forked child facing a full holder table.
// ---------------------------------------------------------------------------------------

/// "No process runs untracked: a forked child that finds the table full gets `None` from
/// `try_acquire` and waits in `acquire` (re-trying registration every 20 ms)"; a
/// holderless `release()` "returns `false`, changes nothing".
#[test]
fn sem_forked_child_facing_a_full_table_takes_and_returns_nothing_until_a_holder_dies() {
    fn role_filler() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        std::mem::forget(sem.try_acquire().expect("a permit"));
        report(format!("pid={}", me()));
        sleep_forever();
    }
    fn role_forker() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let p = sem.try_acquire().expect("a permit");
        let go = path_arg("go");
        let out = path_arg("out");
        let pr = &p;
        let child = fork_child(|| {
            let mut bad: Vec<String> = Vec::new();
            let before = sem_state(&sem);
            // "a forked child that finds the table full gets `None` from `try_acquire`"
            if sem.try_acquire().is_some() {
                bad.push("try_acquire_took_a_permit_untracked".into());
            }
            // It holds nothing and nothing is handed: refused, nothing changes.
            if sem.release() {
                bad.push("release_returned_true".into());
            }
            // "... and waits in `acquire`": a timed wait ends without a permit although
            // permits are available.
            if sem.acquire_timeout(Duration::from_millis(300)).is_some() {
                bad.push("acquire_timeout_took_a_permit_untracked".into());
            }
            drop(copy_of(pr)); // the parent's guard, copied: nothing
            let after = sem_state(&sem);
            if before != after {
                bad.push(format!("state_changed:{before:?}->{after:?}").replace(' ', ""));
            }
            let _ = std::fs::write(&out, format!("phase1 bad={}\n", bad.join(";")));
            // Now wait for a slot: the parent kills the filler.
            let deadline = Instant::now() + Duration::from_secs(20);
            while !go.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let got = sem.acquire_timeout(Duration::from_secs(15));
            let held = held_by(&sem, me());
            let line = format!("phase2 got={} held={held} pid={}\n", got.is_some(), me());
            let _ = std::fs::write(&out, line);
            std::mem::forget(got);
            0
        });
        report(format!("child={child}"));
        let code = wait_child(child, Duration::from_secs(40));
        report(format!("code={code:?} held={}", held_by(&sem, me())));
        sleep_forever();
    }
    play_role!(role_filler, role_forker);
    let _s = serial();
    const TEST: &str =
        "sem_forked_child_facing_a_full_table_takes_and_returns_nothing_until_a_holder_dies";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sem");
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    // Three slots: the parent, the filler and the forker.
    let sem =
        SharedSemaphore::create_with(&path, 3, 3, &SemaphoreOptions::default().holders(3)).unwrap();
    let mut filler = RoleCommand::new(TEST, "filler").arg("path", &path).spawn();
    let fline = filler.next_report(REPORT_WAIT);
    let mut forker = RoleCommand::new(TEST, "forker")
        .arg("path", &path)
        .arg("go", &go)
        .arg("out", &out)
        .spawn();
    let _ = forker.next_report(REPORT_WAIT);
    let read = || std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        wait_until(REPORT_WAIT, || read().starts_with("phase1")),
        "the child never finished phase 1: {}",
        read()
    );
    let phase1 = read();
    assert_eq!(phase1.trim(), "phase1 bad=", "{phase1} (filler {fline})");
    assert_eq!(sem.available(), 1, "filler and forker hold one each");
    assert!(sem.stats().table_full > 0, "{:?}", sem.stats());
    filler.kill();
    std::fs::write(&go, b"go").unwrap();
    assert!(
        wait_until(REPORT_WAIT, || read().starts_with("phase2")),
        "the child never finished phase 2: {}",
        read()
    );
    let line = forker.next_report(REPORT_WAIT);
    let phase2 = read();
    // "No process runs untracked": the child's permit is in its own slot.
    assert!(
        phase2.contains("got=true held=1"),
        "{phase2}; forker: {line}"
    );
    assert!(line.contains("held=1"), "the forker's own permit: {line}");
    // Filler's permit came back, the forker and its (exited) child hold one each until
    // the child's is reclaimed.
    assert!(
        wait_until(Duration::from_secs(10), || {
            sem.reclaim_dead();
            sem.available() == 2
        }),
        "available {} holders {:?}",
        sem.available(),
        sem.holders()
    );
    forker.kill();
    assert!(wait_until(Duration::from_secs(10), || {
        sem.reclaim_dead();
        sem.available() == 3
    }));
}

// ---------------------------------------------------------------------------------------
// 3. Release by a non-holder in disguises.
// ---------------------------------------------------------------------------------------

/// What the semaphore looks like to an observer: available, handed, and each holder's
/// (pid, held).
fn sem_state(sem: &SharedSemaphore) -> (u32, u32, Vec<(u32, u32)>) {
    let mut h: Vec<(u32, u32)> = sem
        .holders()
        .into_iter()
        .filter(|h| h.held > 0 || h.reclaiming)
        .map(|h| (h.pid, h.held))
        .collect();
    h.sort_unstable();
    (sem.available(), sem.stats().handed, h)
}

/// In a forked child: `release()` and the guard copies must change nothing; also in a
/// grandchild. Returns the anomalies.
fn non_holder_child_checks(
    sem: &SharedSemaphore,
    p: cxc_sync::Permit<'_>,
    q: cxc_sync::Permit<'_>,
) -> Vec<String> {
    let mut bad = Vec::new();
    let before = sem_state(sem);
    let rej = sem.stats().not_held_rejected;
    if sem.release() {
        bad.push("child_release_true".to_string());
    }
    drop(p);
    q.disown();
    if sem.release() {
        bad.push("child_release_after_copies_true".to_string());
    }
    // A grandchild, with the copies of nothing but the handle.
    let g = fork_child(|| i32::from(sem.release()));
    if wait_child(g, Duration::from_secs(10)) != Some(0) {
        bad.push("grandchild_release_true".to_string());
    }
    let after = sem_state(sem);
    if before != after {
        bad.push(format!("changed:{before:?}->{after:?}").replace(' ', ""));
    }
    if sem.stats().not_held_rejected < rej + 3 {
        bad.push("not_held_rejected_not_counted".to_string());
    }
    bad
}

/// "`release()` returns a permit the calling process holds ..., else a permit recorded as
/// *handed*, else it returns `false`, changes nothing, and counts `not_held_rejected`";
/// "dropping (or `disown`ing) the copy in the child does nothing"; "A plain `release()` in
/// the child is the child's own (a new holder, with its own slot)".
#[test]
fn sem_release_by_a_non_holder_in_every_disguise_is_refused_and_changes_nothing() {
    fn role_holder() {
        let half = arg("half") == "1";
        let sem: &'static SharedSemaphore =
            Box::leak(Box::new(SharedSemaphore::open(path_arg("path")).unwrap()));
        let out = path_arg("out");
        let body = move || {
            let mut bad: Vec<String> = Vec::new();
            let p = sem.try_acquire().expect("permit 1");
            let q = sem.try_acquire().expect("permit 2");
            let before = sem_state(sem);
            let child = fork_child(|| {
                let bad = non_holder_child_checks(sem, copy_of(&p), copy_of(&q));
                let _ = std::fs::write(&out, bad.join(";"));
                0
            });
            if wait_child(child, Duration::from_secs(20)) != Some(0) {
                bad.push("child_failed".into());
            }
            if let Ok(s) = std::fs::read_to_string(&out)
                && !s.is_empty()
            {
                bad.push(format!("child:{s}"));
            }
            if sem_state(sem) != before || held_by(sem, me()) != 2 {
                bad.push(format!("parent_changed:{:?}", sem_state(sem)).replace(' ', ""));
            }
            drop(p);
            drop(q);
            // A sibling thread after this process's permits were dropped.
            let t = std::thread::spawn(move || {
                let r = sem.try_acquire().expect("permit 3");
                drop(r);
            });
            t.join().unwrap();
            let before = sem_state(sem);
            let sibling = std::thread::spawn(move || sem.release()).join().unwrap();
            if sibling || sem_state(sem) != before {
                bad.push(
                    format!("sibling_release:{sibling}:{:?}", sem_state(sem)).replace(' ', ""),
                );
            }
            report(format!("bad={} held={}", bad.join(";"), held_by(sem, me())));
        };
        if half {
            assert!(exit_main_thread(), "the main thread did not exit");
            // All of it on a worker thread of a half-exited process.
            std::thread::spawn(body).join().unwrap();
        } else {
            body();
        }
        sleep_forever();
    }
    fn role_giver() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        sem.try_acquire().expect("a permit").disown();
        report(format!("handed={}", sem.stats().handed));
        sleep_forever();
    }
    fn role_receiver() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let mut bad: Vec<String> = Vec::new();
        // The hand-off comes back through this process once...
        if !sem.release() {
            bad.push("take_refused".into());
        }
        let before = sem_state(&sem);
        // ... and only once: here, in a forked child, and in the giver.
        if sem.release() {
            bad.push("second_release_true".into());
        }
        let c = fork_child(|| i32::from(sem.release()));
        if wait_child(c, Duration::from_secs(10)) != Some(0) {
            bad.push("forked_receiver_release_true".into());
        }
        if sem_state(&sem) != before {
            bad.push(format!("changed:{before:?}->{:?}", sem_state(&sem)).replace(' ', ""));
        }
        report(format!("bad={}", bad.join(";")));
        sleep_forever();
    }
    play_role!(role_holder, role_giver, role_receiver);
    let _s = serial();
    const TEST: &str =
        "sem_release_by_a_non_holder_in_every_disguise_is_refused_and_changes_nothing";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disguise.sem");
    let sem = SharedSemaphore::create(&path, 4, 4).unwrap();
    for half in ["0", "1"] {
        let out = dir.path().join(format!("out{half}"));
        let mut h = RoleCommand::new(TEST, "holder")
            .arg("path", &path)
            .arg("half", half)
            .arg("out", &out)
            .spawn();
        let line = h.next_report(REPORT_WAIT);
        assert_eq!(line, "bad= held=0", "half={half}: {line}");
        assert_eq!(sem.available(), 4, "half={half}: {:?}", sem.holders());
        h.kill();
    }
    // The receiver of a hand-off that already returned it.
    let mut giver = RoleCommand::new(TEST, "giver").arg("path", &path).spawn();
    let gline = giver.next_report(REPORT_WAIT);
    assert_eq!(gline, "handed=1");
    let mut recv = RoleCommand::new(TEST, "receiver")
        .arg("path", &path)
        .spawn();
    let rline = recv.next_report(REPORT_WAIT);
    assert_eq!(rline, "bad=", "{rline}");
    // The giver is refused too (it holds none any more, none is handed).
    assert!(
        !sem.release(),
        "a holderless parent returned a permit: {:?}",
        sem.stats()
    );
    assert_eq!(sem.available(), 4);
    assert_eq!(sem.stats().handed, 0);
    giver.kill();
    recv.kill();
    assert_eq!(
        sem.reclaim_dead(),
        0,
        "nothing was held: {:?}",
        sem.holders()
    );
    assert_eq!(sem.available(), 4);
}

// ---------------------------------------------------------------------------------------
// 4. Heartbeat: forked children of workers poke the parent's slots while watchdogs reclaim.
// ---------------------------------------------------------------------------------------

const HB_CAP: usize = 8;
const HB_WORKERS: usize = 3;
/// Ledger: per (pid mod 1024, bit) the unit a process marked there, `pid << 32 | unit`
/// (keyed by pid, which a watchdog's snapshot names, not by slot: a slot changes hands).
const L_PENDING: usize = 0;
const L_KEYS: usize = 1024 * 64;
/// Then one outcome word per unit.
const L_OUT: usize = L_KEYS;
const L_UNITS: usize = 1 << 17;
const L_VIOL: usize = L_OUT + L_UNITS;
const L_VWHY: usize = L_VIOL + 1;
const L_CHILD_ACTED: usize = L_VIOL + 2;
const L_CHILD_CALLS: usize = L_VIOL + 3;
const L_DONE: usize = L_VIOL + 4;
const L_RECL: usize = L_VIOL + 5;
const L_NEXT: usize = L_VIOL + 6;
const L_VUNIT: usize = L_VIOL + 7;
const L_VPREV: usize = L_VIOL + 8;
const L_WORDS: usize = L_VIOL + 16;

/// Outcome of a unit: being marked (its worker may die before or after the bit is set),
/// marked, cleared by its worker, reclaimed by a watchdog.
const U_CLAIMING: u64 = 1;
const U_MARKED: u64 = 2;
const U_DONE: u64 = 3;
const U_RECLAIMED: u64 = 4;

fn hb_violation(l: &[AtomicU64], why: u64, unit: u64, prev: u64) {
    if l[L_VIOL].fetch_add(1, Ordering::SeqCst) == 0 {
        l[L_VWHY].store(why, Ordering::SeqCst);
        l[L_VUNIT].store(unit, Ordering::SeqCst);
        l[L_VPREV].store(prev, Ordering::SeqCst);
    }
}

/// The ledger word of bit `bit` marked by process `pid`.
fn pend(pid: u32, bit: u8) -> usize {
    L_PENDING + (pid as usize % 1024) * 64 + bit as usize
}

/// "The handle's memory of its registrations is valid only in the process that made them:
/// a child made by `fork` starts afresh"; "A handle that did not register a slot acts for
/// it only when the slot is a live registration whose recorded identity is this very
/// process's"; H2: "reclaim is atomic and exactly-once, even with several watchdogs";
/// H3: "a worker declared dead is fenced and told so".
#[test]
fn hb_forked_children_of_workers_never_act_and_every_unit_is_accounted_once() {
    fn role_hb_worker() {
        let l = words(&path_arg("ledger"), L_WORDS);
        let t = Arc::new(HeartbeatTable::open(path_arg("path"), HB_CAP).unwrap());
        let mut rng = Rng::new(arg("seed").parse().unwrap());
        if arg("half") == "1" {
            assert!(exit_main_thread(), "the main thread did not exit");
        }
        report("ready");
        loop {
            let Ok(reg) = Arc::clone(&t).join_owned() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let slot = reg.slot();
            let pid = me();
            let mut fenced = false;
            while !fenced {
                let bit = rng.below(64) as u8;
                let key = pend(pid, bit);
                if l[key].load(Ordering::SeqCst) != 0 {
                    // A unit of an earlier (fenced) registration of ours still pending
                    // there: not reused until a watchdog accounts for it.
                    fenced = reg.beat().is_err();
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                let n = l[L_NEXT].fetch_add(1, Ordering::SeqCst) as usize;
                if n + 1 >= L_UNITS {
                    sleep_forever();
                }
                let unit = (n + 1) as u64;
                // Ledger first ("mark before you commit a claim").
                l[L_OUT + unit as usize].store(U_CLAIMING, Ordering::SeqCst);
                l[key].store(u64::from(pid) << 32 | unit, Ordering::SeqCst);
                if reg.mark_in_flight(bit).is_err() {
                    // Refused: never marked.
                    l[key].store(0, Ordering::SeqCst);
                    l[L_OUT + unit as usize].store(0, Ordering::SeqCst);
                    fenced = true;
                    continue;
                }
                // Fails only if a watchdog reclaimed it already (this process was stopped).
                let _ = l[L_OUT + unit as usize].compare_exchange(
                    U_CLAIMING,
                    U_MARKED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                if rng.percent(30) {
                    // A forked child tries every call on our slot.
                    let t2 = &t;
                    let reg_ref = &reg;
                    let c = fork_child(|| {
                        let mut acted = 0u64;
                        let mut calls = 0u64;
                        let mut count = |ok: bool| {
                            calls += 1;
                            acted += u64::from(ok);
                        };
                        count(t2.beat(slot));
                        count(t2.clear_in_flight(slot, bit));
                        count(t2.mark_in_flight(slot, (bit + 1) % 64));
                        count(reg_ref.beat().is_ok());
                        count(reg_ref.clear_in_flight(bit).is_ok());
                        count(reg_ref.mark_in_flight((bit + 2) % 64).is_ok());
                        count(reg_ref.in_flight().is_some());
                        // A handle of its own, opened in the child.
                        if let Ok(t3) = HeartbeatTable::open(path_arg("path"), HB_CAP) {
                            count(t3.beat(slot));
                            count(t3.clear_in_flight(slot, bit));
                            count(t3.unregister(slot));
                        }
                        count(t2.unregister(slot));
                        l[L_CHILD_CALLS].fetch_add(calls, Ordering::SeqCst);
                        l[L_CHILD_ACTED].fetch_add(acted, Ordering::SeqCst);
                        0
                    });
                    let _ = wait_child(c, Duration::from_secs(10));
                }
                if reg.beat().is_err() {
                    fenced = true;
                }
                std::thread::sleep(Duration::from_micros(rng.below(2000)));
                match reg.clear_in_flight(bit) {
                    Ok(()) => {
                        // Cleared by us: done. Reclaimed as well would be counted twice.
                        let prev = l[L_OUT + unit as usize].swap(U_DONE, Ordering::SeqCst);
                        if prev != U_MARKED && prev != U_CLAIMING {
                            hb_violation(l, 1, unit, prev);
                        }
                        l[key].store(0, Ordering::SeqCst);
                        l[L_DONE].fetch_add(1, Ordering::SeqCst);
                    }
                    Err(HeartbeatError::Fenced { .. }) => fenced = true,
                    Err(e) => panic!("clear: {e:?}"),
                }
            }
            drop(reg);
        }
    }
    fn role_hb_dog() {
        let l = words(&path_arg("ledger"), L_WORDS);
        let t = HeartbeatTable::open(path_arg("path"), HB_CAP).unwrap();
        let dog = FailoverWatchdog::with_grace(&t, 60).with_os_check_interval(Duration::ZERO);
        report("ready");
        loop {
            for (slot, snap) in dog.scan().dead_slots {
                let bits = dog.reclaim(slot);
                for bit in FailoverWatchdog::iter_in_flight_bits(bits) {
                    let key = pend(snap.pid, bit);
                    let v = l[key].load(Ordering::SeqCst);
                    let unit = v & 0xffff_ffff;
                    if v >> 32 != u64::from(snap.pid) || unit == 0 {
                        // A reclaimed bit nobody had marked.
                        hb_violation(l, 2, u64::from(snap.pid) << 32 | u64::from(bit), v);
                        continue;
                    }
                    let prev = l[L_OUT + unit as usize].swap(U_RECLAIMED, Ordering::SeqCst);
                    if prev != U_MARKED && prev != U_CLAIMING {
                        // Already done by its worker, or reclaimed before.
                        hb_violation(l, 3, unit, prev);
                    }
                    l[key].store(0, Ordering::SeqCst);
                    l[L_RECL].fetch_add(1, Ordering::SeqCst);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    play_role!(role_hb_worker, role_hb_dog);
    let _s = serial();
    const TEST: &str = "hb_forked_children_of_workers_never_act_and_every_unit_is_accounted_once";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hb.cxc");
    let ledger = dir.path().join("ledger");
    let t = HeartbeatTable::create(&path, HB_CAP).unwrap();
    let l = words(&ledger, L_WORDS);
    let mut rng = Rng::for_test();
    let spawn = |role: &str, rng: &mut Rng| -> Proc {
        let mut p = RoleCommand::new(TEST, role)
            .arg("path", &path)
            .arg("ledger", &ledger)
            .arg("half", rng.below(2).to_string())
            .arg("seed", rng.next_u64().to_string())
            .spawn();
        let _ = p.next_report(REPORT_WAIT);
        p
    };
    let mut workers: Vec<Proc> = (0..HB_WORKERS)
        .map(|_| spawn("hb_worker", &mut rng))
        .collect();
    let mut dogs: Vec<Proc> = (0..2).map(|_| spawn("hb_dog", &mut rng)).collect();
    let end = Instant::now() + Duration::from_secs(10);
    let (mut kills, mut stops) = (0, 0);
    while Instant::now() < end && l[L_VIOL].load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(rng.range(50, 300)));
        match rng.below(8) {
            0..=2 => {
                let i = rng.below(HB_WORKERS as u64) as usize;
                workers[i].kill();
                kills += 1;
                workers[i] = spawn("hb_worker", &mut rng);
            }
            3..=5 => {
                // Long enough (many scans of two dogs) to be fenced now and then.
                let i = rng.below(HB_WORKERS as u64) as usize;
                workers[i].stop();
                std::thread::sleep(Duration::from_millis(rng.range(5, 200)));
                workers[i].cont();
                stops += 1;
            }
            6 => {
                let i = rng.below(2) as usize;
                dogs[i].kill();
                kills += 1;
                dogs[i] = spawn("hb_dog", &mut rng);
            }
            _ => {}
        }
    }
    for p in workers.iter_mut() {
        p.kill();
    }
    let load = |i: usize| l[i].load(Ordering::SeqCst);
    // Every unit still pending is reclaimed once its worker is gone (by OS identity).
    let settled = wait_until(Duration::from_secs(30), || {
        (1..L_UNITS).all(|u| load(L_OUT + u) != U_MARKED) || load(L_VIOL) != 0
    });
    // A unit left `U_CLAIMING` by a worker killed around its mark: the bit may never have
    // been set; not counted as lost.
    for p in dogs.iter_mut() {
        p.kill();
    }
    let summary = format!(
        "seed={} done={} reclaimed={} child_calls={} child_acted={} kills={kills} stops={stops} \
         stats={:?}",
        rng.seed(),
        load(L_DONE),
        load(L_RECL),
        load(L_CHILD_CALLS),
        load(L_CHILD_ACTED),
        t.stats()
    );
    println!("{summary}");
    // "The handle's memory of its registrations is valid only in the process that made
    // them: a child made by `fork` starts afresh"; "a process that merely has the pid of
    // a dead worker has another identity and adopts nothing".
    assert_eq!(
        load(L_CHILD_ACTED),
        0,
        "a forked child acted for its parent's slot: {summary}"
    );
    // H2: "reclaim is atomic and exactly-once"; each unit cleared by its worker or
    // reclaimed, never both, never lost.
    assert_eq!(
        load(L_VIOL),
        0,
        "why={} unit={:#x} prev={:#x}: {summary}",
        load(L_VWHY),
        load(L_VUNIT),
        load(L_VPREV)
    );
    let stuck: Vec<usize> = (1..L_UNITS)
        .filter(|&u| load(L_OUT + u) == U_MARKED)
        .collect();
    assert!(
        settled && stuck.is_empty(),
        "units never accounted for: {stuck:?}; {summary}"
    );
    assert!(
        load(L_DONE) > 50 && load(L_CHILD_CALLS) > 20,
        "too little happened: {summary}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. A dead holder's permits behind a reclaimer that is stopped (alive) mid-drain.
// ---------------------------------------------------------------------------------------

/// "Permits held by a process that dies are returned, like SysV `SEM_UNDO`: by
/// `reclaim_dead()`, and by blocked acquirers on their own"; "A **blocked acquirer** scans
/// every 20 ms ..., so a SIGKILLed holder's permits come back within ~20 ms of its death
/// without any call from the application". Here a third process, R, called
/// `reclaim_dead()` after the holder died and is SIGSTOPped in the middle of the drain
/// (a shell's Ctrl-Z, a debugger, a cgroup freeze): R is alive, so its `(reclaiming, R)`
/// owner word is never taken over ("A reclaimer that *dies* mid-drain ... the next scan
/// takes over"), and the dead holder's remaining permits stay out for as long as R is
/// stopped, whoever waits and whoever calls `reclaim_dead()`. Nothing is lost for good:
/// once R continues, every permit comes back (checked too).
#[test]
fn sem_dead_holders_permits_pinned_by_a_stopped_reclaimer_come_back_when_it_continues() {
    fn role_big() {
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
        report("ready");
        let go = path_arg("go");
        while !go.exists() {
            std::thread::sleep(Duration::from_micros(200));
        }
        let n = sem.reclaim_dead();
        report(format!("n={n}"));
        sleep_forever();
    }
    play_role!(role_big, role_reclaimer);
    let _s = serial();
    const TEST: &str =
        "sem_dead_holders_permits_pinned_by_a_stopped_reclaimer_come_back_when_it_continues";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pinned.sem");
    let go = dir.path().join("go");
    let (max, k) = (3_000_016u32, 3_000_000u32);
    let sem = SharedSemaphore::create(&path, max, max).unwrap();
    let mut big = RoleCommand::new(TEST, "big")
        .arg("path", &path)
        .arg("k", k.to_string())
        .spawn();
    big.next_report(Duration::from_secs(60));
    let mut r = RoleCommand::new(TEST, "reclaimer")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    r.next_report(REPORT_WAIT);
    big.kill();
    let base = sem.available();
    assert_eq!(base, max - k);
    std::fs::write(&go, b"go").unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || sem.available() > base + 1000),
        "the reclaimer never started draining"
    );
    r.stop();
    r.wait_state('T', Duration::from_secs(5));
    let pinned_by_r = sem
        .holders()
        .into_iter()
        .any(|h| h.reclaiming && h.pid == r.pid() && h.held > 0);
    let at_stop = sem.available();
    assert!(
        pinned_by_r && at_stop < max,
        "setup: the reclaimer was not caught mid-drain ({at_stop} of {max} back): {:?}",
        sem.holders()
    );
    // Take what is in the pool, then wait for one more like any blocked acquirer: only
    // the dead holder's permits are out besides ours.
    let mut taken = 0u32;
    while let Some(p) = sem.try_acquire() {
        std::mem::forget(p);
        taken += 1;
    }
    let t0 = Instant::now();
    let got = sem.acquire_timeout(Duration::from_secs(3));
    let waited = t0.elapsed();
    let mine = sem.reclaim_dead();
    let evidence = format!(
        "a blocked acquire_timeout(3 s) got {} after {waited:?} (reclaim_dead() then returned \
         {mine}); available {} of {max}, this process holds {taken}, the dead holder (held \
         {k}) still {} behind the stopped reclaimer {}: holders {:?}",
        if got.is_some() { "a permit" } else { "nothing" },
        sem.available(),
        held_by(&sem, big.pid()).max(
            sem.holders()
                .iter()
                .filter(|h| h.reclaiming)
                .map(|h| h.held)
                .sum()
        ),
        r.pid(),
        sem.holders()
    );
    // The documented limit (docs/shared-semaphore.md, "A reclaimer stopped mid-drain"):
    // while R is stopped the rest of the dead holder's permits stay out.
    eprintln!("while stopped: {evidence}");
    drop(got);
    for _ in 0..taken {
        assert!(sem.release());
    }
    // Not lost for good: R continues and finishes.
    r.cont();
    let back = wait_until(Duration::from_secs(30), || {
        sem.reclaim_dead();
        sem.available() == max
    });
    assert!(
        back,
        "not every permit came back after the reclaimer continued: {:?}",
        sem.holders()
    );
}

// ---------------------------------------------------------------------------------------
// 6. The same behind a reclaimer thread whose process exec'd mid-drain (it lives on).
// ---------------------------------------------------------------------------------------

/// "Permits held by a process that dies are returned, like SysV `SEM_UNDO`"; "`exec`
/// keeps the pid and identity ..., so the new image reuses the old image's slot; permits
/// the old image held stay held until the process dies"; "`reclaim_dead()` ... Also
/// finishes reclaims abandoned by reclaimers that died". A process R whose thread is in
/// `reclaim_dead()` (or in a blocked `acquire`, which reclaims every 20 ms) while another
/// of its threads calls `execve` (a daemon re-executing itself to upgrade): the kernel
/// ends the reclaiming thread mid-drain, R lives on as the new image with the same
/// identity, so nobody may take its `(reclaiming, R)` owner word over, not even R's new
/// image (`reclaim_dead()` there skips its own pid and tag). The permits of a holder that
/// *died* stay out for as long as R's new image runs.
#[test]
fn sem_dead_holders_permits_come_back_after_a_reclaimers_process_execs_mid_drain() {
    const TEST: &str =
        "sem_dead_holders_permits_come_back_after_a_reclaimers_process_execs_mid_drain";
    fn role_big2() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let k: u64 = arg("k").parse().unwrap();
        for _ in 0..k {
            std::mem::forget(sem.try_acquire().expect("a permit"));
        }
        report(format!("held={k}"));
        sleep_forever();
    }
    fn role_execer() {
        use std::os::unix::process::CommandExt;
        let sem: &'static SharedSemaphore =
            Box::leak(Box::new(SharedSemaphore::open(path_arg("path")).unwrap()));
        let base: u32 = arg("base").parse().unwrap();
        let go = path_arg("go");
        std::thread::spawn(move || {
            while !go.exists() {
                std::thread::sleep(Duration::from_micros(200));
            }
            let n = sem.reclaim_dead();
            report(format!("finished n={n}"));
        });
        report("ready");
        let mid = wait_until(Duration::from_secs(30), || {
            sem.available() > base + 1000
                && sem
                    .holders()
                    .iter()
                    .any(|h| h.reclaiming && h.pid == me() && h.held > 0)
        });
        assert!(mid, "never saw this process's reclaim mid-drain");
        let exe = std::env::current_exe().unwrap();
        let err = std::process::Command::new(exe)
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(cxc_testkit::ROLE_VAR, "after_exec")
            .exec();
        panic!("exec failed: {err}");
    }
    fn role_after_exec() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let n = sem.reclaim_dead();
        report(format!("pid={} n={n}", me()));
        sleep_forever();
    }
    play_role!(role_big2, role_execer, role_after_exec);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exec.sem");
    let go = dir.path().join("go");
    let (max, k) = (3_000_016u32, 3_000_000u32);
    let sem = SharedSemaphore::create(&path, max, max).unwrap();
    let mut big = RoleCommand::new(TEST, "big2")
        .arg("path", &path)
        .arg("k", k.to_string())
        .spawn();
    big.next_report(Duration::from_secs(60));
    big.kill();
    let base = sem.available();
    assert_eq!(base, max - k);
    let mut r = RoleCommand::new(TEST, "execer")
        .arg("path", &path)
        .arg("go", &go)
        .arg("base", base.to_string())
        .spawn();
    r.next_report(REPORT_WAIT);
    std::fs::write(&go, b"go").unwrap();
    let line = r.next_report(Duration::from_secs(60));
    assert!(
        line.starts_with("pid="),
        "setup: the drain finished before the exec ({line}): {:?}",
        sem.holders()
    );
    assert_eq!(
        cxc_testkit::num(&line, "pid"),
        u64::from(r.pid()),
        "the new image is the same process"
    );
    // The new image finished the drain its old image's thread left: every permit is back
    // (this process holds none, the dead holder none).
    assert_eq!(
        sem.available(),
        max,
        "R's new image: {line}; still out behind R's reclaiming slot: {}; holders {:?}",
        sem.holders()
            .iter()
            .filter(|h| h.reclaiming)
            .map(|h| h.held)
            .sum::<u32>(),
        sem.holders()
    );
    assert!(
        cxc_testkit::num(&line, "n") > 0,
        "the new image's reclaim_dead() returned nothing: {line}"
    );
    r.kill();
}

//! How early can a waiter learn that a SIGKILLed holder's process is going? (#18's
//! failover question; not part of the default run: `cxc-xbench death`.)
//!
//! Each trial starts a holder process and one waiter process, lets the waiter block,
//! takes a `CLOCK_MONOTONIC` timestamp and SIGKILLs the holder; the sample is the time
//! until the waiter is woken (its own timestamp). The kinds take turns trial by trial, so
//! a burst of load on the shared machine hits all of them alike.
//!
//! - `robust_sentinel`: a helper thread of the holder registers, as its robust futex list
//!   (`set_robust_list(2)`), one entry for a word of the shared page that holds the
//!   helper's thread id. The helper only sleeps, so it exits only when the whole process
//!   does (a fatal signal or `exit_group`) or execs; the kernel then marks the word
//!   `FUTEX_OWNER_DIED` and wakes a waiter early in that thread's exit (`exit_mm`). The
//!   waiter `FUTEX_WAIT`s on the word with `FUTEX_WAITERS` set.
//! - `flock`: the holder holds an `flock`, released when its last thread closes its files.
//! - `pidfd`: the waiter `poll`s a pidfd of the holder, readable once the whole thread
//!   group has exited (`exit_notify`, last).
//! - `lease_os`: the lease's own failover (`OwnerLease::acquire`, as in the `failover`
//!   section), for reference.
//!
//! The sentinel tells that the holder's process *is exiting*, not that it is gone: its
//! other threads may still be running user code for a few microseconds (until they take
//! their SIGKILL), which is why the lease takes it as a stale claim, not as a death
//! certificate (`lease_os` uses it; see `benches/notes.md`, section
//! `xproc.failover_vs_flock`, and docs/owner-lease.md, "The sentinel").

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cxc::OwnerLease;

use super::locks::lease_options;
use super::{Config, arg, arg_path, finish, page_in, row_ns, scratch, spawn, wait_flag, wanted};
use crate::baseline::Flock;
use crate::clock::now_ns;
use crate::shm::{SharedPage, flag};

const KINDS: [&str; 4] = ["robust_sentinel", "flock", "pidfd", "lease_os"];
/// The waiter sets this flag just before it blocks.
const WAITING: usize = flag::START;
/// The lock cell whose first word is the sentinel.
const SENTINEL_CELL: usize = 0;
/// `FUTEX_WAITERS` and `FUTEX_OWNER_DIED` of a robust futex word (`futex(2)`).
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

/// Parent side.
pub(crate) fn run(cfg: &Config) {
    let kinds: Vec<&str> = KINDS
        .into_iter()
        .filter(|k| wanted(&format!("death/{k}")))
        .collect();
    let mut samples = vec![Vec::new(); kinds.len()];
    for _ in 0..cfg.failover_trials {
        for (k, s) in kinds.iter().zip(samples.iter_mut()) {
            s.push(trial(k));
        }
    }
    for (k, s) in kinds.iter().zip(&samples) {
        row_ns(&format!("death/{k}"), s);
    }
}

fn trial(kind: &str) -> f64 {
    let dir = scratch();
    let page = page_in(dir.path());
    if kind == "lease_os" {
        OwnerLease::<u64>::create_with(dir.path().join("d.lease"), 0, &lease_options())
            .expect("create lease");
    }
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let mut holder = spawn("death-holder", &[kind, dir_s]);
    wait_flag(&page, flag::READY, 1);
    let pid = holder.id().to_string();
    let waiter = spawn("death-waiter", &[kind, dir_s, &pid]);
    wait_flag(&page, WAITING, 1);
    // Let the waiter fall asleep.
    std::thread::sleep(Duration::from_millis(20));
    let t0 = now_ns();
    holder.kill().expect("SIGKILL holder");
    let out = finish(waiter, "death-waiter");
    let _ = holder.wait();
    let t1: u64 = out.trim().parse().expect("waiter prints its timestamp");
    t1.saturating_sub(t0) as f64
}

/// A robust futex list head (`struct robust_list_head` of the kernel ABI).
#[repr(C)]
struct RobustHead {
    next: *mut RobustEntry,
    futex_offset: libc::c_long,
    pending: *mut RobustEntry,
}

/// An entry of the list (`struct robust_list`).
#[repr(C)]
struct RobustEntry {
    next: *mut RobustHead,
}

/// Makes the calling thread's robust list the one entry for `word`, which must hold the
/// thread's id.
fn register_sentinel(word: &'static AtomicU32) {
    let head: &'static mut RobustHead = Box::leak(Box::new(RobustHead {
        next: std::ptr::null_mut(),
        futex_offset: 0,
        pending: std::ptr::null_mut(),
    }));
    let entry: &'static mut RobustEntry = Box::leak(Box::new(RobustEntry { next: head }));
    // The kernel finds the word at `entry + futex_offset` (any distance: the entry is in
    // private memory, the word in the shared page).
    head.futex_offset =
        (std::ptr::from_ref(word) as libc::c_long) - (std::ptr::from_mut(entry) as libc::c_long);
    head.next = entry;
    // SAFETY: `head` and `entry` are leaked, so they live as long as this thread; the
    // list is circular (the entry points back at the head), as the kernel expects; the
    // word lies in a mapping the caller keeps for the life of the process. This thread
    // holds no pthread robust mutex (glibc's own list for it is replaced), and the kernel
    // reads the list only when this thread exits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            std::ptr::from_mut(head),
            size_of::<RobustHead>(),
        )
    };
    assert_eq!(r, 0, "set_robust_list");
}

/// Holder: `<kind> <dir>`; takes the lock (or sets up its sentinel), says so, and waits to
/// be killed.
pub(crate) fn role_holder(args: &[String]) {
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    // Kept for the life of the process (it ends by SIGKILL): the sentinel word lives in it.
    let page: &'static SharedPage = Box::leak(Box::new(page_in(&dir)));
    let park = || -> ! {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    // Leaked with the page, so they are held until the kill.
    match kind {
        "robust_sentinel" => {
            let word = page.cell_u32(SENTINEL_CELL);
            std::thread::spawn(move || {
                let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
                word.store(tid, Ordering::SeqCst);
                register_sentinel(word);
                page.flag(flag::READY).store(1, Ordering::Release);
                park()
            });
            park()
        }
        "flock" => {
            let f = Box::leak(Box::new(
                Flock::open(&dir.join("d.flock")).expect("open flock file"),
            ));
            f.lock();
        }
        "pidfd" => {}
        "lease_os" => {
            let lease = Box::leak(Box::new(
                OwnerLease::<u64>::open(dir.join("d.lease")).expect("open lease"),
            ));
            let claim = lease.acquire(std::process::id(), u64::MAX, Duration::from_secs(5));
            assert!(claim.is_some(), "holder could not claim");
        }
        other => panic!("unknown death kind {other:?}"),
    }
    page.flag(flag::READY).store(1, Ordering::Release);
    park()
}

/// Waiter: `<kind> <dir> <holder pid>`; blocks until told the holder is going and prints
/// `CLOCK_MONOTONIC` ns.
pub(crate) fn role_waiter(args: &[String]) {
    use rustix::thread::futex;
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    let holder: i32 = arg(args, 2);
    let page = page_in(&dir);
    let waiting = || page.flag(WAITING).store(1, Ordering::Release);
    let t1 = match kind {
        "robust_sentinel" => {
            let w = page.cell_u32(SENTINEL_CELL);
            waiting();
            loop {
                let v = w.load(Ordering::SeqCst);
                if v & FUTEX_OWNER_DIED != 0 {
                    break;
                }
                // The kernel wakes a waiter only if the word says there is one.
                if v & FUTEX_WAITERS == 0
                    && w.compare_exchange(v, v | FUTEX_WAITERS, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err()
                {
                    continue;
                }
                let _ = futex::wait(w, futex::Flags::empty(), v | FUTEX_WAITERS, None);
            }
            now_ns()
        }
        "flock" => {
            let f = Flock::open(&dir.join("d.flock")).expect("open flock file");
            waiting();
            f.lock();
            now_ns()
        }
        "pidfd" => {
            use rustix::event::{PollFd, PollFlags, poll};
            let pid = rustix::process::Pid::from_raw(holder).expect("holder pid");
            let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
                .expect("pidfd_open");
            waiting();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            while poll(&mut fds, None).unwrap_or(0) == 0 {}
            now_ns()
        }
        "lease_os" => {
            let lease = OwnerLease::<u64>::open(dir.join("d.lease")).expect("open lease");
            waiting();
            let claim = lease.acquire(std::process::id(), u64::MAX, Duration::from_secs(10));
            let t = now_ns();
            assert!(claim.is_some(), "lease_os: waiter timed out");
            t
        }
        other => panic!("unknown death kind {other:?}"),
    };
    println!("{t1}");
}

//! CPU burned by a waiter that stays blocked: the parent holds the lock (or the pool is
//! empty), a child blocks with a timeout and reports its `getrusage` CPU time (user +
//! system) over the blocked call, as a percentage of one core.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc::OwnerLease;

use super::locks::lease_options;
use super::{Config, arg, arg_path, finish, page_in, row, scratch, spawn, wanted};
use crate::baseline::{Locked, RobustMutex, SysvSem};
use crate::clock::{cpu_time, now_ns};
use crate::shm::flag;
use crate::stats::summarize;

fn kinds() -> Vec<&'static str> {
    vec!["lease", "semaphore", "robust_pthread", "sysv"]
}

/// Parent side.
pub(crate) fn run(cfg: &Config) {
    for kind in kinds()
        .into_iter()
        .filter(|k| wanted(&format!("blocked_cpu/{k}")))
    {
        let pct: Vec<f64> = (0..cfg.cpu_trials).map(|_| trial(kind, cfg)).collect();
        row(&format!("blocked_cpu/{kind}"), "pct", summarize(&pct));
    }
}

fn trial(kind: &str, cfg: &Config) -> f64 {
    let dir = scratch();
    let page = page_in(dir.path());
    let me = std::process::id();
    // What the parent holds while the child waits (kept alive to the end of the trial).
    let mut _lease = None;
    let mut _sysv = None;
    let mut _sem = None;
    let mut extra = String::new();
    match kind {
        "lease" => {
            let l =
                OwnerLease::<u64>::create_with(dir.path().join("cpu.lease"), 0, &lease_options())
                    .expect("create lease");
            assert!(l.try_acquire(me, u64::MAX));
            _lease = Some(l);
        }
        "semaphore" => {
            _sem = Some(
                cxc::SharedSemaphore::create(dir.path().join("cpu.sem"), 0, 1)
                    .expect("create semaphore"),
            );
        }
        "robust_pthread" => {
            // SAFETY: cell 0 of the fresh page is aligned, sized for a mutex and unused;
            // the page outlives the child.
            let m = unsafe { RobustMutex::init(page.cell(0)) }.expect("init robust mutex");
            m.lock();
        }
        "sysv" => {
            let s = SysvSem::create(1).expect("semget");
            extra = s.id().to_string();
            _sysv = Some(s);
        }
        other => panic!("unknown cpu kind {other:?}"),
    }
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let ms = cfg.cpu_block.as_millis().to_string();
    let child = spawn("cpu-waiter", &[kind, dir_s, &ms, &extra]);
    let out = finish(child, "cpu-waiter");
    let mut it = out
        .split_whitespace()
        .map(|w| w.parse::<f64>().expect("cpu numbers"));
    let (cpu_ns, wall_ns) = (it.next().expect("cpu"), it.next().expect("wall"));
    drop(page);
    100.0 * cpu_ns / wall_ns
}

/// Waiter: `<kind> <dir> <block ms> [sysv id]`; prints `cpu_ns wall_ns` of the blocked call.
pub(crate) fn role(args: &[String]) {
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    let block = Duration::from_millis(arg(args, 2));
    let page = page_in(&dir);
    page.flag(flag::READY).store(1, Ordering::Release);
    let me = std::process::id();
    let (c0, w0);
    match kind {
        "lease" => {
            let lease = OwnerLease::<u64>::open(dir.join("cpu.lease")).expect("open lease");
            (c0, w0) = (cpu_time(), now_ns());
            assert!(
                lease.acquire(me, u64::MAX, block).is_none(),
                "lease was free"
            );
        }
        "semaphore" => {
            let sem = cxc::SharedSemaphore::open(dir.join("cpu.sem")).expect("open semaphore");
            (c0, w0) = (cpu_time(), now_ns());
            assert!(sem.acquire_timeout(block).is_none(), "a permit was free");
        }
        "robust_pthread" => {
            // SAFETY: the parent initialised a robust mutex in cell 0; `page` outlives `m`.
            let m = unsafe { RobustMutex::at(page.cell(0)) };
            (c0, w0) = (cpu_time(), now_ns());
            assert_eq!(m.lock_timeout(block), Locked::TimedOut, "mutex was free");
        }
        "sysv" => {
            let s = SysvSem::attach(arg(args, 3));
            (c0, w0) = (cpu_time(), now_ns());
            assert!(!s.down_timeout(0, block), "semaphore was free");
        }
        other => panic!("unknown cpu kind {other:?}"),
    }
    let (c1, w1) = (cpu_time(), now_ns());
    println!("{} {}", (c1 - c0).as_nanos(), w1 - w0);
}

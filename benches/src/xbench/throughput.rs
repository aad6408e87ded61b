//! Contended throughput: two processes lock, read-modify-write the protected value and
//! unlock, as fast as they can, for a fixed time.

use std::sync::atomic::Ordering;

use super::locks::{LockKind, Locks};
use super::{Config, arg, arg_path, finish, row, scratch, spawn, wait_flag, wanted};
use crate::clock::now_ns;
use crate::shm::flag;
use crate::stats::summarize;

/// The variants measured: row name, lock kind, and for the lease whether the operation
/// is one `with_lease` call (falling back to a blocking acquire when the lease is held)
/// instead of `acquire` + `read_claimed` + `write_claimed` + `release_claim`.
const VARIANTS: [(&str, LockKind, bool); 5] = [
    ("lease", LockKind::Lease, false),
    ("lease_with_lease", LockKind::Lease, true),
    ("futex_mutex", LockKind::FutexMutex, false),
    ("robust_pthread", LockKind::Robust, false),
    ("flock", LockKind::Flock, false),
];

/// Parent side: every variant, trials interleaved.
pub(crate) fn run(cfg: &Config) {
    let variants: Vec<_> = VARIANTS
        .into_iter()
        .filter(|(name, _, _)| wanted(&format!("throughput/{name}")))
        .collect();
    let mut rates = vec![Vec::new(); variants.len()];
    for _ in 0..cfg.tput_trials {
        for ((_, kind, with), r) in variants.iter().zip(rates.iter_mut()) {
            r.push(trial(*kind, *with, cfg));
        }
    }
    for ((name, _, _), r) in variants.iter().zip(&rates) {
        row(&format!("throughput/{name}"), "ops/s", summarize(r));
    }
}

fn trial(kind: LockKind, with_lease: bool, cfg: &Config) -> f64 {
    let dir = scratch();
    let locks = Locks::create(kind, dir.path(), 1);
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let mode = if with_lease { "with_lease" } else { "lock" };
    let children = [
        spawn("tput", &[kind.name(), dir_s, mode]),
        spawn("tput", &[kind.name(), dir_s, mode]),
    ];
    let page = locks.page();
    wait_flag(page, flag::READY, 2);
    let t0 = now_ns();
    page.flag(flag::START).store(1, Ordering::Release);
    std::thread::sleep(cfg.tput_time);
    page.flag(flag::STOP).store(1, Ordering::Release);
    let t1 = now_ns();
    let mut total = 0u64;
    for c in children {
        let out = finish(c, "tput");
        total += out
            .trim()
            .parse::<u64>()
            .expect("tput child prints its count");
    }
    let value = locks.value();
    assert_eq!(
        value,
        total,
        "{}: protected value {value} != operations {total}: lost updates",
        kind.name()
    );
    total as f64 / ((t1 - t0) as f64 / 1e9)
}

/// Child: `<kind> <dir> <lock|with_lease>`; prints the number of operations it completed.
pub(crate) fn role(args: &[String]) {
    let kind: LockKind = arg(args, 0);
    let dir = arg_path(args, 1);
    let with_lease = args.get(2).is_some_and(|m| m == "with_lease");
    let mut locks = Locks::open(kind, &dir, 1);
    locks
        .page()
        .flag(flag::READY)
        .fetch_add(1, Ordering::AcqRel);
    while locks.page().flag(flag::START).load(Ordering::Acquire) == 0 {
        std::hint::spin_loop();
    }
    let mut n = 0u64;
    while locks.page().flag(flag::STOP).load(Ordering::Relaxed) == 0 {
        if with_lease {
            locks.with_lease_increment();
        } else {
            locks.locked_increment();
        }
        n += 1;
    }
    println!("{n}");
}

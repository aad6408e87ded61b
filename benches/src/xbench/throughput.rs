//! Contended throughput: two processes lock, read-modify-write the protected value and
//! unlock, as fast as they can, for a fixed time.

use std::sync::atomic::Ordering;

use super::locks::{LockKind, Locks};
use super::{Config, arg, arg_path, finish, row, scratch, spawn, wait_flag, wanted};
use crate::clock::now_ns;
use crate::shm::flag;
use crate::stats::summarize;

/// How a lease process does one operation.
#[derive(Clone, Copy)]
enum Mode {
    /// `acquire` + `read_claimed` + `write_claimed` + `release_claim` (the others: lock,
    /// read, write, unlock).
    Lock,
    /// A guard: `lock()`, `read()`, `write()`, drop.
    Guard,
    /// One `with_lease` call, falling back to a blocking round of `Lock` when the lease is
    /// held.
    WithLease,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Lock => "lock",
            Mode::Guard => "guard",
            Mode::WithLease => "with_lease",
        }
    }
}

/// The variants measured: row name, lock kind, and how a lease process operates.
const VARIANTS: [(&str, LockKind, Mode); 6] = [
    ("lease", LockKind::Lease, Mode::Lock),
    ("lease_guard", LockKind::Lease, Mode::Guard),
    ("lease_with_lease", LockKind::Lease, Mode::WithLease),
    ("futex_mutex", LockKind::FutexMutex, Mode::Lock),
    ("robust_pthread", LockKind::Robust, Mode::Lock),
    ("flock", LockKind::Flock, Mode::Lock),
];

/// Parent side: every variant, trials interleaved.
pub(crate) fn run(cfg: &Config) {
    let variants: Vec<_> = VARIANTS
        .into_iter()
        .filter(|(name, _, _)| wanted(&format!("throughput/{name}")))
        .collect();
    let mut rates = vec![Vec::new(); variants.len()];
    for _ in 0..cfg.tput_trials {
        for ((_, kind, mode), r) in variants.iter().zip(rates.iter_mut()) {
            r.push(trial(*kind, *mode, cfg));
        }
    }
    for ((name, _, _), r) in variants.iter().zip(&rates) {
        row(&format!("throughput/{name}"), "ops/s", summarize(r));
    }
}

fn trial(kind: LockKind, mode: Mode, cfg: &Config) -> f64 {
    let dir = scratch();
    let locks = Locks::create(kind, dir.path(), 1);
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let mode = mode.name();
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

/// Child: `<kind> <dir> <lock|guard|with_lease>`; prints the number of operations it
/// completed.
pub(crate) fn role(args: &[String]) {
    let kind: LockKind = arg(args, 0);
    let dir = arg_path(args, 1);
    let mode = match args.get(2).map(String::as_str) {
        Some("with_lease") => Mode::WithLease,
        Some("guard") => Mode::Guard,
        _ => Mode::Lock,
    };
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
        match mode {
            Mode::Lock => locks.locked_increment(),
            Mode::Guard => locks.guard_increment(),
            Mode::WithLease => locks.with_lease_increment(),
        }
        n += 1;
    }
    println!("{n}");
}

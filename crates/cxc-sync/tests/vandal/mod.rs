//! Hostile bytes from another process, for the attack suites (`attack_mp.rs`,
//! `attack2_mp.rs`): a *vandal* process overwrites random words of a live file while a
//! *victim* process calls every operation of the primitive. No operation may panic or
//! hang.
//!
//! A suite's test plays `play_role!(role_victim, role_vandal)`: its own `role_victim`
//! marks each operation with [`op`] and starts a [`stall_detector`]; the parent side calls
//! [`vandalize`].
#![allow(dead_code, unreachable_pub, unsafe_code)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cxc_testkit::{Rng, RoleCommand, arg, path_arg, report};

/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// How long a child may take to finish once stopped.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// The operation a victim is in, for the stall report.
static OP: AtomicUsize = AtomicUsize::new(0);
static OP_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Marks the start of operation `i` of the victim.
pub fn op(i: usize) {
    OP.store(i, Ordering::Relaxed);
    OP_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// How many operations the victim started.
pub fn ops() -> usize {
    OP_COUNT.load(Ordering::Relaxed)
}

/// In the victim: a thread that reports `STUCK op=NAME` and exits 3 if no operation
/// starts for `limit`.
pub fn stall_detector(names: &'static [&'static str], limit: Duration) {
    std::thread::spawn(move || {
        let mut last = OP_COUNT.load(Ordering::Relaxed);
        loop {
            std::thread::sleep(limit);
            let now = OP_COUNT.load(Ordering::Relaxed);
            if now == last {
                let i = OP.load(Ordering::Relaxed);
                report(format!("STUCK op={}", names.get(i).copied().unwrap_or("?")));
                // SAFETY: `_exit` ends the process at once, with no unwinding or handlers
                // (the stuck thread may hold any lock).
                unsafe { libc::_exit(3) };
            }
            last = now;
        }
    });
}

/// Role `vandal`: until the file `stop` exists, overwrites random words of `path`
/// between byte `from` and `to` (bit flips of the current value, all ones, zero, random
/// bytes), every ~50 µs.
pub fn role_vandal() {
    let path = path_arg("path");
    let stop = path_arg("stop");
    let from: u64 = arg("from").parse().unwrap();
    let to: u64 = arg("to").parse().unwrap();
    let mut rng = Rng::for_test();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut writes = 0u64;
    report("VANDAL started");
    while !stop.exists() {
        for _ in 0..64 {
            let off = from + (rng.next_u64() % ((to - from) / 8)) * 8;
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, off).unwrap();
            let cur = u64::from_ne_bytes(b);
            let new = match rng.next_u64() % 6 {
                0 | 1 => cur ^ (1 << (rng.next_u64() % 64)),
                2 => u64::MAX,
                3 => 0,
                4 => cur.wrapping_add(1),
                _ => rng.next_u64(),
            };
            f.write_all_at(&new.to_ne_bytes(), off).unwrap();
            writes += 1;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    report(format!("VANDAL writes={writes} seed={}", rng.seed()));
}

/// Parent side of a vandal test: starts the victim (role `victim`), waits until it runs,
/// lets the vandal damage `[from, to)` of `path` for `dur`, stops both and checks that the
/// victim neither panicked nor hung.
pub fn vandalize(test: &str, dir: &Path, path: &Path, from: u64, to: u64, dur: Duration) {
    let stop = dir.join("stop");
    let _ = std::fs::remove_file(&stop);
    let mut victim = RoleCommand::new(test, "victim")
        .arg("path", path)
        .arg("stop", &stop)
        .spawn();
    assert_eq!(victim.next_report(REPORT_WAIT), "VICTIM started");
    let mut vandal = RoleCommand::new(test, "vandal")
        .arg("path", path)
        .arg("stop", &stop)
        .arg("from", from.to_string())
        .arg("to", to.to_string())
        .spawn();
    assert_eq!(vandal.next_report(REPORT_WAIT), "VANDAL started");
    std::thread::sleep(dur);
    std::fs::write(&stop, b"").unwrap();
    let v = vandal.finish(CHILD_DEADLINE);
    let reports = victim.finish(CHILD_DEADLINE);
    let last = reports.last().expect("the victim reported");
    assert!(last.starts_with("VICTIM ops="), "victim: {reports:?}");
    println!("{test}: {last}; {v:?}");
}

//! Handoff round trip between two processes.
//!
//! Locks: three locks rotate between process A (the parent, which times) and B, so every
//! lock operation is a real blocking handoff and neither side can barge: A holds {0, 1},
//! B holds {2} and waits for 0. Step k of A: unlock `k % 3`, lock `(k + 2) % 3`; step k of
//! B: unlock `(k + 2) % 3`, lock `(k + 1) % 3`. One A step (timed) is one round trip:
//! A's unlock wakes B, B's unlock wakes A — two sleeping handoffs, like the raw futex
//! ping-pong it is compared with (A stores 1 and wakes, B stores 0 and wakes).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::locks::{LockKind, Locks};
use super::{Config, arg, arg_path, finish, page_in, row_ns, scratch, spawn, wait_flag, wanted};
use crate::baseline::{futex_wait, futex_wake};
use crate::clock::now_ns;
use crate::shm::flag;

/// Rounds the measurements are split into; the kinds take turns within each round, so
/// a burst of load on the (shared, noisy) machine hits all of them alike.
const ROUNDS: usize = 4;

/// Parent side: every lock kind and the raw futex ping-pong, interleaved in rounds.
pub(crate) fn run(cfg: &Config) {
    let mut ids: Vec<(String, Option<LockKind>)> = LockKind::ALL
        .into_iter()
        .map(|k| (format!("handoff/{}", k.name()), Some(k)))
        .collect();
    ids.push(("handoff/raw_futex".into(), None));
    ids.retain(|(id, _)| wanted(id));
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ids.len()];
    let per = cfg.rtt_iters.div_ceil(ROUNDS);
    for _ in 0..ROUNDS {
        for ((_, kind), s) in ids.iter().zip(samples.iter_mut()) {
            s.extend(match kind {
                Some(k) => rotation(*k, per),
                None => pingpong(per),
            });
        }
    }
    for ((id, _), s) in ids.iter().zip(&samples) {
        row_ns(id, s);
    }
}

/// Drops the first 5 % of samples (page faults, first wake-ups).
fn steady(mut v: Vec<f64>) -> Vec<f64> {
    let skip = v.len() / 20;
    v.drain(..skip);
    v
}

fn rotation(kind: LockKind, iters: usize) -> Vec<f64> {
    let dir = scratch();
    let mut locks = Locks::create(kind, dir.path(), 3);
    locks.lock(0);
    locks.lock(1);
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let iters_s = iters.to_string();
    let child = spawn("handoff-b", &[kind.name(), dir_s, &iters_s]);
    wait_flag(locks.page(), flag::READY, 1);
    // Let B fall asleep on lock 0.
    std::thread::sleep(Duration::from_millis(5));
    let mut samples = Vec::with_capacity(iters);
    for k in 0..iters {
        let t0 = now_ns();
        locks.unlock(k % 3);
        locks.lock((k + 2) % 3);
        samples.push((now_ns() - t0) as f64);
    }
    locks.unlock_all();
    finish(child, "handoff-b");
    steady(samples)
}

/// Child B of the rotation: `<kind> <dir> <iters>`.
pub(crate) fn role_b(args: &[String]) {
    let kind: LockKind = arg(args, 0);
    let dir = arg_path(args, 1);
    let iters: usize = arg(args, 2);
    let mut locks = Locks::open(kind, &dir, 3);
    locks.lock(2);
    locks.page().flag(flag::READY).store(1, Ordering::Release);
    locks.lock(0);
    for k in 0..iters {
        locks.unlock((k + 2) % 3);
        locks.lock((k + 1) % 3);
    }
    locks.unlock_all();
}

fn pingpong(iters: usize) -> Vec<f64> {
    let dir = scratch();
    let page = page_in(dir.path());
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let iters_s = iters.to_string();
    let child = spawn("pingpong-b", &[dir_s, &iters_s]);
    wait_flag(&page, flag::READY, 1);
    std::thread::sleep(Duration::from_millis(5));
    let w = page.flag(flag::PING);
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = now_ns();
        w.store(1, Ordering::Release);
        futex_wake(w, 1);
        while w.load(Ordering::Acquire) == 1 {
            futex_wait(w, 1);
        }
        samples.push((now_ns() - t0) as f64);
    }
    finish(child, "pingpong-b");
    steady(samples)
}

/// Child B of the raw futex ping-pong: `<dir> <iters>`.
pub(crate) fn role_pingpong(args: &[String]) {
    let dir = arg_path(args, 0);
    let iters: usize = arg(args, 1);
    let page = page_in(&dir);
    let w = page.flag(flag::PING);
    page.flag(flag::READY).store(1, Ordering::Release);
    for _ in 0..iters {
        while w.load(Ordering::Acquire) == 0 {
            futex_wait(w, 0);
        }
        w.store(0, Ordering::Release);
        futex_wake(w, 1);
    }
}

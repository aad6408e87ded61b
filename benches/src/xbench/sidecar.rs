//! Sidecar strategies on the lease handoff with a hold time.
//!
//! The three-lock rotation of [`handoff`](super::handoff), where each process holds a lock
//! for `hold` (busy) before passing it on, under three strategies published in the leases'
//! `HandshakeHeader`s (so both processes follow them): always park, always spin (the
//! largest budget the header holds), and AdaptiveSpin (a sidecar thread in the parent
//! picks the budget from the observed waits of both processes; measured after a warm-up).
//! The floor is a raw spin ping-pong with the same hold. A round trip (timed by A) is
//! A's handoff to B, B's hold, B's handoff back.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc::{AdaptiveInstance, Sidecar, Strategy};

use super::locks::{LockKind, Locks, Observe};
use super::{Config, arg, arg_path, finish, note, page_in, row, scratch, spawn, wait_flag, wanted};
use crate::clock::{cpu_time, now_ns};
use crate::shm::flag;
use crate::stats::summarize;

const HOLDS: [(&str, Duration); 2] = [
    ("short", Duration::from_micros(2)),
    ("long", Duration::from_micros(200)),
];
const STRATEGIES: [&str; 4] = ["adaptive", "park", "spin", "raw_spin"];
/// How often the parent's sidecar thread polls.
const POLL: Duration = Duration::from_millis(5);
/// B's CPU time at START, in ns (written by B).
const B_CPU0: usize = 1;
/// B's CPU time at STOP, in ns (written by B).
const B_CPU1: usize = 2;

fn busy(d: Duration) {
    let end = now_ns() + d.as_nanos() as u64;
    while now_ns() < end {
        std::hint::spin_loop();
    }
}

/// Parent side.
pub(crate) fn run(cfg: &Config) {
    note(
        "sidecar",
        &format!(
            "holds: short {} us, long {} us; warm-up {} ms before measuring; sidecar poll every {} ms",
            HOLDS[0].1.as_micros(),
            HOLDS[1].1.as_micros(),
            warmup(cfg).as_millis(),
            POLL.as_millis()
        ),
    );
    for (hold_name, hold) in HOLDS {
        for s in STRATEGIES {
            let id = format!("sidecar/{hold_name}/{s}");
            if !wanted(&id) {
                continue;
            }
            // About half a second (full) of measured round trips.
            let per = 2 * hold.as_nanos() as usize + 20_000;
            let budget = if cfg.rtt_iters > 5_000 {
                500_000_000
            } else {
                150_000_000
            };
            let iters = (budget / per).clamp(200, cfg.rtt_iters);
            let (samples, cpu) = trial(s, hold, iters, cfg);
            row(&id, "ns", summarize(&samples));
            row(
                &format!("sidecar_cpu/{hold_name}/{s}"),
                "pct",
                summarize(&[cpu]),
            );
        }
    }
}

fn warmup(cfg: &Config) -> Duration {
    if cfg.rtt_iters > 5_000 {
        Duration::from_millis(500)
    } else {
        Duration::from_millis(200)
    }
}

fn trial(strategy: &str, hold: Duration, iters: usize, cfg: &Config) -> (Vec<f64>, f64) {
    let dir = scratch();
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let hold_s = hold.as_nanos().to_string();
    if strategy == "raw_spin" {
        let page = page_in(dir.path());
        let child = spawn("sidecar-b", &[strategy, dir_s, &hold_s]);
        wait_flag(&page, flag::READY, 1);
        let w = page.flag(flag::PING);
        let ping = |n: usize, samples: &mut Vec<f64>| {
            for _ in 0..n {
                let t0 = now_ns();
                w.store(1, Ordering::Release);
                while w.load(Ordering::Acquire) == 1 {
                    std::hint::spin_loop();
                }
                samples.push((now_ns() - t0) as f64);
                busy(hold);
            }
        };
        ping(iters / 10, &mut Vec::new());
        let mut samples = Vec::with_capacity(iters);
        let (c0, w0) = (cpu_time(), now_ns());
        page.flag(flag::START).store(1, Ordering::Release);
        ping(iters, &mut samples);
        page.flag(flag::STOP).store(1, Ordering::Release);
        let (c1, w1) = (cpu_time(), now_ns());
        finish(child, "sidecar-b");
        let cpu = cpu_pct(&page, (c1 - c0).as_nanos() as f64, (w1 - w0) as f64);
        return (samples, cpu);
    }
    let locks = Locks::create(LockKind::Lease, dir.path(), 3);
    drop(locks);
    let observe = if strategy == "adaptive" {
        Observe::Adaptive
    } else {
        Observe::Plain
    };
    let mut locks = Locks::open_observed(LockKind::Lease, dir.path(), 3, observe);
    let fixed = match strategy {
        "park" => Some(Strategy::Park),
        "spin" => Some(Strategy::spin(Duration::from_nanos(u64::from(
            Strategy::MAX_PARAM,
        )))),
        _ => None,
    };
    for i in 0..3 {
        if let Some(s) = fixed {
            locks.lease(i).handshake().publish(s);
        }
    }
    let thread =
        (strategy == "adaptive").then(|| Sidecar::global().spawn(POLL).expect("spawn sidecar"));
    locks.lock(0);
    locks.lock(1);
    let child = spawn("sidecar-b", &[strategy, dir_s, &hold_s]);
    wait_flag(locks.page(), flag::READY, 1);
    std::thread::sleep(Duration::from_millis(5));
    let mut k = 0usize;
    let mut step = |locks: &mut Locks, samples: Option<&mut Vec<f64>>| {
        let t0 = now_ns();
        locks.unlock(k % 3);
        locks.lock((k + 2) % 3);
        if let Some(s) = samples {
            s.push((now_ns() - t0) as f64);
        }
        busy(hold);
        k += 1;
    };
    let warm_end = now_ns() + warmup(cfg).as_nanos() as u64;
    while now_ns() < warm_end {
        step(&mut locks, None);
    }
    let mut samples = Vec::with_capacity(iters);
    let (c0, w0) = (cpu_time(), now_ns());
    locks.page().flag(flag::START).store(1, Ordering::Release);
    for _ in 0..iters {
        step(&mut locks, Some(&mut samples));
    }
    locks.page().flag(flag::STOP).store(1, Ordering::Release);
    let (c1, w1) = (cpu_time(), now_ns());
    let chosen = locks.lease(0).handshake().strategy();
    locks.unlock_all();
    finish(child, "sidecar-b");
    drop(thread);
    if strategy == "adaptive" {
        eprintln!(
            "xbench: sidecar hold {} us: AdaptiveSpin chose {chosen:?}",
            hold.as_micros()
        );
    }
    let cpu = cpu_pct(locks.page(), (c1 - c0).as_nanos() as f64, (w1 - w0) as f64);
    (samples, cpu)
}

/// Both processes' CPU over the measured phase, in % of one core.
fn cpu_pct(page: &crate::shm::SharedPage, a_cpu_ns: f64, wall_ns: f64) -> f64 {
    let b0 = page.counter(B_CPU0).load(Ordering::Acquire) as f64;
    let b1 = page.counter(B_CPU1).load(Ordering::Acquire) as f64;
    100.0 * (a_cpu_ns + (b1 - b0).max(0.0)) / wall_ns
}

/// Child B: `<strategy> <dir> <hold ns>`; runs until the parent's STOP.
pub(crate) fn role_b(args: &[String]) {
    let strategy = args.first().expect("strategy").as_str();
    let dir = arg_path(args, 1);
    let hold = Duration::from_nanos(arg(args, 2));
    let mut started = false;
    let mut track = |page: &crate::shm::SharedPage| {
        if !started && page.flag(flag::START).load(Ordering::Acquire) != 0 {
            started = true;
            page.counter(B_CPU0)
                .store(cpu_time().as_nanos() as u64, Ordering::Release);
        }
    };
    if strategy == "raw_spin" {
        let page = page_in(&dir);
        let w = page.flag(flag::PING);
        page.flag(flag::READY).store(1, Ordering::Release);
        'outer: loop {
            while w.load(Ordering::Acquire) == 0 {
                if page.flag(flag::STOP).load(Ordering::Acquire) != 0 {
                    break 'outer;
                }
                std::hint::spin_loop();
            }
            track(&page);
            busy(hold);
            w.store(0, Ordering::Release);
        }
        page.counter(B_CPU1)
            .store(cpu_time().as_nanos() as u64, Ordering::Release);
        return;
    }
    let observe = if strategy == "adaptive" {
        Observe::Recorded
    } else {
        Observe::Plain
    };
    let mut locks = Locks::open_observed(LockKind::Lease, &dir, 3, observe);
    locks.lock(2);
    locks.page().flag(flag::READY).store(1, Ordering::Release);
    locks.lock(0);
    let mut k = 0usize;
    while locks.page().flag(flag::STOP).load(Ordering::Acquire) == 0 {
        track(locks.page());
        busy(hold);
        locks.unlock((k + 2) % 3);
        locks.lock((k + 1) % 3);
        k += 1;
    }
    locks
        .page()
        .counter(B_CPU1)
        .store(cpu_time().as_nanos() as u64, Ordering::Release);
    locks.unlock_all();
}

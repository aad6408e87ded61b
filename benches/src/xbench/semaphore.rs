//! Permit handoff between two processes: two semaphores `s1`, `s2` (0 of 1 permits)
//! used as a ping-pong. A releases `s1` and blocks acquiring `s2`; B blocks acquiring
//! `s1` and releases `s2`. One A iteration (timed) is a round trip of two permit
//! handoffs, each to a sleeping acquirer. Baseline: the same with SysV `semop`.

use cxc::SharedSemaphore;

use super::{Config, arg, arg_path, finish, page_in, row_ns, scratch, spawn, wait_flag, wanted};
use crate::baseline::SysvSem;
use crate::clock::now_ns;
use crate::shm::flag;

/// Parent side.
pub(crate) fn run(cfg: &Config) {
    for kind in ["semaphore", "sysv"] {
        let id = format!("sem_handoff/{kind}");
        if wanted(&id) {
            row_ns(&id, &pingpong(kind, cfg.rtt_iters));
        }
    }
}

fn pingpong(kind: &str, iters: usize) -> Vec<f64> {
    let dir = scratch();
    let page = page_in(dir.path());
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let iters_s = iters.to_string();
    let mut samples = Vec::with_capacity(iters);
    match kind {
        "semaphore" => {
            let s1 = SharedSemaphore::create(dir.path().join("s1.sem"), 0, 1).expect("create");
            let s2 = SharedSemaphore::create(dir.path().join("s2.sem"), 0, 1).expect("create");
            let child = spawn("sem-b", &[kind, dir_s, &iters_s, ""]);
            wait_flag(&page, flag::READY, 1);
            std::thread::sleep(std::time::Duration::from_millis(5));
            for _ in 0..iters {
                let t0 = now_ns();
                assert!(s1.release());
                s2.acquire().disown();
                samples.push((now_ns() - t0) as f64);
            }
            finish(child, "sem-b");
        }
        _ => {
            let set = SysvSem::create(2).expect("semget");
            let id = set.id().to_string();
            let child = spawn("sem-b", &[kind, dir_s, &iters_s, &id]);
            wait_flag(&page, flag::READY, 1);
            std::thread::sleep(std::time::Duration::from_millis(5));
            for _ in 0..iters {
                let t0 = now_ns();
                set.op(0, 1);
                set.op(1, -1);
                samples.push((now_ns() - t0) as f64);
            }
            finish(child, "sem-b");
        }
    }
    let skip = samples.len() / 20;
    samples.drain(..skip);
    samples
}

/// Child B: `<kind> <dir> <iters> <sysv id>`.
pub(crate) fn role_b(args: &[String]) {
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    let iters: usize = arg(args, 2);
    let page = page_in(&dir);
    match kind {
        "semaphore" => {
            let s1 = SharedSemaphore::open(dir.join("s1.sem")).expect("open");
            let s2 = SharedSemaphore::open(dir.join("s2.sem")).expect("open");
            page.flag(flag::READY)
                .store(1, std::sync::atomic::Ordering::Release);
            for _ in 0..iters {
                s1.acquire().disown();
                assert!(s2.release());
            }
        }
        _ => {
            let set = SysvSem::attach(arg(args, 3));
            page.flag(flag::READY)
                .store(1, std::sync::atomic::Ordering::Release);
            for _ in 0..iters {
                set.op(0, -1);
                set.op(1, 1);
            }
        }
    }
}

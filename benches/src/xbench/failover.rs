//! Failover latency: a holder process is SIGKILLed while another process is blocked
//! waiting for the lock; the latency is from just before `kill` (parent's
//! `CLOCK_MONOTONIC`) to the waiter's lock call returning (waiter's `CLOCK_MONOTONIC`).
//!
//! - `lease_os`: the holder claimed the lease for its own pid; the waiter's blocked
//!   `acquire` is woken by the kernel when the holder's sentinel thread ends (the
//!   process starts to exit) and takes the claim over as stale (docs/owner-lease.md,
//!   "The sentinel"); its OS identity's death is the fallback.
//! - `lease_heartbeat`: the holder claimed for a pid that is not its own and beats every
//!   [`BEAT`]; epochs are `CLOCK_MONOTONIC` ticks of [`TICK`] and the waiter's grace is
//!   [`GRACE`] epochs. The claim still names the process that made it (the identity
//!   table records the registering process, `docs/owner-lease.md`), so the waiter sees
//!   that process die as in `lease_os`; staleness alone would take the grace.
//! - `robust_pthread`: `pthread_mutex_lock` returns `EOWNERDEAD` to the waiter.
//! - `flock`: the kernel drops the dead holder's lock when its files are closed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc::{EpochMode, LeaseOptions, OwnerLease};

use super::locks::lease_options;
use super::{Config, arg_path, finish, note, page_in, row_ns, scratch, spawn, wait_flag, wanted};
use crate::baseline::{Flock, Locked, RobustMutex};
use crate::clock::now_ns;
use crate::shm::flag;

/// Epoch tick of the heartbeat path.
pub(crate) const TICK: Duration = Duration::from_millis(1);
/// Grace of the heartbeat path, in epochs.
pub(crate) const GRACE: u64 = 5;
/// Beat interval of the heartbeat-path holder.
pub(crate) const BEAT: Duration = Duration::from_micros(200);
/// Added to the holder's pid for the heartbeat path: beyond `pid_max`, never a process.
const FAKE_PID_BASE: u32 = 10_000_000;

const KINDS: [&str; 4] = ["lease_os", "lease_heartbeat", "robust_pthread", "flock"];
/// The waiter sets this flag just before it blocks.
const WAITING: usize = flag::START;

/// Parent side.
pub(crate) fn run(cfg: &Config) {
    note(
        "failover_heartbeat",
        &format!(
            "lease_heartbeat: clock epochs of {} ms, grace {GRACE} epochs, holder beats every {} us",
            TICK.as_millis(),
            BEAT.as_micros()
        ),
    );
    for kind in KINDS
        .into_iter()
        .filter(|k| wanted(&format!("failover/{k}")))
    {
        let samples: Vec<f64> = (0..cfg.failover_trials).map(|_| trial(kind)).collect();
        row_ns(&format!("failover/{kind}"), &samples);
    }
}

fn trial(kind: &str) -> f64 {
    let dir = scratch();
    let page = page_in(dir.path());
    let lease = dir.path().join("fo.lease");
    match kind {
        "lease_os" => {
            OwnerLease::<u64>::create_with(&lease, 0, &lease_options()).expect("create lease");
        }
        "lease_heartbeat" => {
            let opts = LeaseOptions {
                epoch: EpochMode::Clock { tick: TICK },
                ..lease_options()
            };
            OwnerLease::<u64>::create_with(&lease, 0, &opts).expect("create lease");
        }
        "robust_pthread" => {
            // SAFETY: cell 0 of the fresh page is aligned, sized for a mutex and unused;
            // the page file outlives both children.
            unsafe { RobustMutex::init(page.cell(0)) }.expect("init robust mutex");
        }
        _ => {}
    }
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let mut holder = spawn("fo-holder", &[kind, dir_s]);
    wait_flag(&page, flag::READY, 1);
    let waiter = spawn("fo-waiter", &[kind, dir_s]);
    wait_flag(&page, WAITING, 1);
    // Let the waiter fall asleep in its lock call.
    std::thread::sleep(Duration::from_millis(20));
    let t0 = now_ns();
    holder.kill().expect("SIGKILL holder");
    let out = finish(waiter, "fo-waiter");
    // Reap only now: until then the holder is a zombie, which counts as dead.
    let _ = holder.wait();
    let t1: u64 = out.trim().parse().expect("waiter prints its timestamp");
    t1.saturating_sub(t0) as f64
}

/// Holder: `<kind> <dir>`; takes the lock, says so, and waits to be killed.
pub(crate) fn role_holder(args: &[String]) {
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    let page = page_in(&dir);
    let ready = || page.flag(flag::READY).store(1, Ordering::Release);
    let park = || -> ! {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    match kind {
        "lease_os" => {
            let lease = OwnerLease::<u64>::open(dir.join("fo.lease")).expect("open lease");
            let me = std::process::id();
            let _claim = lease.acquire(me, u64::MAX, Duration::from_secs(5));
            ready();
            park()
        }
        "lease_heartbeat" => {
            let lease = OwnerLease::<u64>::open(dir.join("fo.lease")).expect("open lease");
            let fake = FAKE_PID_BASE + std::process::id();
            assert!(lease.try_acquire(fake, GRACE));
            ready();
            loop {
                // Keeps the heartbeat fresh until this process is killed; a lost claim
                // would show in the measurement, not here.
                let _ = lease.beat(fake);
                std::thread::sleep(BEAT);
            }
        }
        "robust_pthread" => {
            // SAFETY: the parent initialised a robust mutex in cell 0; `page` lives until
            // this process is killed.
            let m = unsafe { RobustMutex::at(page.cell(0)) };
            m.lock();
            ready();
            park()
        }
        "flock" => {
            let f = Flock::open(&dir.join("fo.flock")).expect("open flock file");
            f.lock();
            ready();
            park()
        }
        other => panic!("unknown failover kind {other:?}"),
    }
}

/// Waiter: `<kind> <dir>`; blocks on the lock and prints `CLOCK_MONOTONIC` ns when it
/// has it.
pub(crate) fn role_waiter(args: &[String]) {
    let kind = args.first().expect("kind").as_str();
    let dir = arg_path(args, 1);
    let page = page_in(&dir);
    let waiting = || page.flag(WAITING).store(1, Ordering::Release);
    let me = std::process::id();
    let t1 = match kind {
        "lease_os" | "lease_heartbeat" => {
            let lease = OwnerLease::<u64>::open(dir.join("fo.lease")).expect("open lease");
            let grace = if kind == "lease_os" { u64::MAX } else { GRACE };
            waiting();
            let claim = lease.acquire(me, grace, Duration::from_secs(10));
            let t = now_ns();
            assert!(claim.is_some(), "{kind}: waiter timed out");
            t
        }
        "robust_pthread" => {
            // SAFETY: the parent initialised a robust mutex in cell 0; `page` outlives `m`.
            let m = unsafe { RobustMutex::at(page.cell(0)) };
            waiting();
            let r = m.lock();
            let t = now_ns();
            assert_eq!(r, Locked::OwnerDied, "expected EOWNERDEAD");
            t
        }
        "flock" => {
            let f = Flock::open(&dir.join("fo.flock")).expect("open flock file");
            waiting();
            f.lock();
            now_ns()
        }
        other => panic!("unknown failover kind {other:?}"),
    };
    println!("{t1}");
}

//! Fourth round of attacks on documented promises, with real processes: async
//! cancellation (docs/async.md, "Cancellation": a dropped future leaves no claim, no
//! permit, no registered waiter, and swallows no wake-up) and the failover watchdog's
//! exactly-once reclaim with several watchdog processes, SIGKILLed workers and a watchdog
//! SIGKILLed mid-scan (docs/failover-watchdog.md).
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::{FailoverWatchdog, HeartbeatTable};
use cxc_testkit::{Proc, Rng, RoleCommand, num, path_arg, play_role, report, serial, sigkill};

/// A grace no heartbeat exceeds (manual epochs): death is found by OS identity only.
const BIG: u64 = 1 << 40;
const REPORT_WAIT: Duration = Duration::from_secs(20);

#[cfg(feature = "async")]
mod asyncs {
    use super::*;
    use cxc_testkit::{child_wait_for_path, sleep_forever};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake, Waker};

    use cxc_sync::{OwnerLease, SharedSemaphore, async_waiters};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap()
    }

    /// A waker that records when it was first woken.
    #[derive(Default)]
    struct Flag {
        woken: AtomicBool,
        at: Mutex<Option<Instant>>,
    }

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let mut at = self.at.lock().unwrap();
            if at.is_none() {
                *at = Some(Instant::now());
            }
            self.woken.store(true, Ordering::SeqCst);
        }
    }

    fn wait_woken(f: &Flag, t: Duration) -> bool {
        let start = Instant::now();
        while !f.woken.load(Ordering::SeqCst) {
            if start.elapsed() > t {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }

    /// Child: takes the lease (blocking), reports, releases it when `go` appears, then
    /// stays alive (the wake-up must come from the release, not from a death).
    fn role_lease_holder() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        let g = lease.lock();
        report("held=1");
        child_wait_for_path(&path_arg("go"), Duration::from_secs(30));
        drop(g);
        report("released=1");
        sleep_forever();
    }

    /// Two waiters on one handle; the holder (another process) releases; the first
    /// waiter is woken and dropped before it is polled. Promise: "a waiter that was woken
    /// but dropped before polling hands its turn to the next one" — promptly (the drop
    /// kicks the reactor; not a tick later), and nothing stays registered.
    #[test]
    fn async_lease_woken_waiter_dropped_unpolled_hands_turn_on_promptly() {
        play_role!(role_lease_holder);
        let _s = serial();
        let mut worst = Duration::ZERO;
        for round in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("lease");
            let lease = OwnerLease::create(&path, 0u64).unwrap();
            let go = dir.path().join("go");
            let mut kid = RoleCommand::new(
                "asyncs::async_lease_woken_waiter_dropped_unpolled_hands_turn_on_promptly",
                "lease_holder",
            )
            .arg("path", &path)
            .arg("go", &go)
            .spawn();
            kid.next_report(REPORT_WAIT);
            let (fa, fb) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
            let (wa, wb) = (Waker::from(fa.clone()), Waker::from(fb.clone()));
            let mut a = Box::pin(lease.lock_async());
            let mut b = Box::pin(lease.lock_async());
            assert!(a.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
            assert!(b.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
            assert_eq!(async_waiters(), 2);
            std::fs::write(&go, b"").unwrap();
            assert!(
                wait_woken(&fa, Duration::from_secs(2)),
                "round {round}: first waiter never woken after the release"
            );
            let dropped_at = Instant::now();
            drop(a);
            assert!(
                wait_woken(&fb, Duration::from_secs(2)),
                "round {round}: the second waiter was never woken after the woken first \
                 one was dropped unpolled (a swallowed wake-up)"
            );
            let gap = fb
                .at
                .lock()
                .unwrap()
                .unwrap()
                .saturating_duration_since(dropped_at);
            worst = worst.max(gap);
            match b.as_mut().poll(&mut Context::from_waker(&wb)) {
                Poll::Ready(g) => drop(g),
                Poll::Pending => panic!("round {round}: woken second waiter could not claim"),
            }
            drop(b);
            assert_eq!(
                async_waiters(),
                0,
                "round {round}: a waiter stayed registered"
            );
            assert!(
                lease.try_lock().is_some(),
                "round {round}: lease not vacant"
            );
            kid.kill();
        }
        println!("worst hand-on delay {worst:?}");
        assert!(
            worst < Duration::from_millis(15),
            "a dropped woken waiter handed its turn on only after {worst:?} (a reactor tick is 25 ms)"
        );
    }

    /// Many tasks wait (owned futures, 2-worker runtime) on a lease held by another
    /// process; half of them are cancelled at random times around the release. Promise:
    /// every surviving waiter gets the lease, promptly, one after another (no gap of a
    /// reactor tick: no wake-up swallowed), the lease is vacant after, no waiter stays
    /// registered, never two holders.
    #[test]
    fn async_lease_tasks_cancelled_around_the_release_swallow_no_wakeup() {
        play_role!(role_lease_holder);
        let _s = serial();
        let mut rng = Rng::for_test();
        let rt = runtime();
        let mut worst_gap = Duration::ZERO;
        let mut gaps_over = 0usize;
        let mut total = 0usize;
        for round in 0..4 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("lease");
            let lease = Arc::new(OwnerLease::create(&path, 0u64).unwrap());
            let go = dir.path().join("go");
            let mut kid = RoleCommand::new(
                "asyncs::async_lease_tasks_cancelled_around_the_release_swallow_no_wakeup",
                "lease_holder",
            )
            .arg("path", &path)
            .arg("go", &go)
            .spawn();
            kid.next_report(REPORT_WAIT);
            let spans = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
            let inside = Arc::new(AtomicU32::new(0));
            let released_at = rt.block_on(async {
                let mut tasks = Vec::new();
                for _ in 0..40 {
                    let (l, spans, inside) = (lease.clone(), spans.clone(), inside.clone());
                    let cancel = if rng.below(2) == 0 {
                        Some(Duration::from_micros(10_000 + rng.below(30_000)))
                    } else {
                        None
                    };
                    tasks.push(tokio::spawn(async move {
                        let g = match cancel {
                            Some(d) => match tokio::time::timeout(d, l.lock_owned_async()).await {
                                Ok(g) => g,
                                Err(_) => return false,
                            },
                            None => l.lock_owned_async().await,
                        };
                        let t0 = Instant::now();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let t1 = Instant::now();
                        drop(g);
                        spans.lock().unwrap().push((t0, t1));
                        true
                    }));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                std::fs::write(&go, b"").unwrap();
                let released_at = Instant::now();
                let all = async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                };
                tokio::time::timeout(Duration::from_secs(3), all)
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "round {round}: surviving waiters never got the lease ({} did): \
                             a swallowed wake-up or leaked claim",
                            spans.lock().unwrap().len()
                        )
                    });
                released_at
            });
            let mut s = spans.lock().unwrap().clone();
            s.sort();
            total += s.len();
            let mut prev = released_at;
            for (a, b) in &s {
                let gap = a.saturating_duration_since(prev);
                worst_gap = worst_gap.max(gap);
                if gap >= Duration::from_millis(20) {
                    gaps_over += 1;
                }
                prev = *b;
            }
            assert!(
                cxc_testkit::wait_until(Duration::from_secs(1), || async_waiters() == 0),
                "round {round}: {} waiters stayed registered",
                async_waiters()
            );
            assert!(
                lease.try_lock().is_some(),
                "round {round}: lease not vacant"
            );
            kid.kill();
        }
        println!("acquisitions {total}, worst gap {worst_gap:?}, gaps >= 20 ms: {gaps_over}");
        assert_eq!(
            gaps_over, 0,
            "{gaps_over} hand-overs took a reactor tick or more (worst {worst_gap:?}) out of {total}"
        );
    }

    /// Child: opens the semaphore and takes every permit, reports, and waits to be
    /// SIGKILLed (its permits must come back to the parent's async waiters).
    fn role_permit_hog() {
        let sem = SharedSemaphore::open(path_arg("path")).unwrap();
        let n = sem.available();
        let permits: Vec<_> = (0..n).map(|_| sem.try_acquire().unwrap()).collect();
        report(format!("held={}", permits.len()));
        sleep_forever();
    }

    /// A child holds both permits of a semaphore and is SIGKILLed while 40 tasks wait in
    /// `acquire_async`, half of them cancelled at random times (before, around and after
    /// the kill). Promise: a dropped `acquire_async` leaves no permit and no waiter behind;
    /// every survivor gets a permit; never more than 2 inside; both permits available
    /// at the end.
    #[test]
    fn async_semaphore_cancelled_waiters_leak_no_permit_after_a_holder_kill() {
        play_role!(role_permit_hog);
        let _s = serial();
        let mut rng = Rng::for_test();
        let rt = runtime();
        for round in 0..4 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sem");
            let sem = Arc::new(SharedSemaphore::create(&path, 2, 2).unwrap());
            let mut kid = RoleCommand::new(
                "asyncs::async_semaphore_cancelled_waiters_leak_no_permit_after_a_holder_kill",
                "permit_hog",
            )
            .arg("path", &path)
            .spawn();
            assert_eq!(num(&kid.next_report(REPORT_WAIT), "held"), 2);
            let inside = Arc::new(AtomicU32::new(0));
            let got = Arc::new(AtomicU32::new(0));
            let kid_pid = kid.pid();
            let survivors = rt.block_on(async {
                let mut tasks = Vec::new();
                let mut survivors = 0;
                for _ in 0..40 {
                    let (sem, inside, got) = (sem.clone(), inside.clone(), got.clone());
                    let cancel = if rng.below(2) == 0 {
                        Some(Duration::from_micros(5_000 + rng.below(60_000)))
                    } else {
                        survivors += 1;
                        None
                    };
                    tasks.push(tokio::spawn(async move {
                        let p = match cancel {
                            Some(d) => match tokio::time::timeout(d, sem.acquire_async()).await {
                                Ok(p) => p,
                                Err(_) => return,
                            },
                            None => sem.acquire_async().await,
                        };
                        assert!(inside.fetch_add(1, Ordering::SeqCst) < 2, "above max");
                        tokio::time::sleep(Duration::from_micros(300)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        got.fetch_add(1, Ordering::SeqCst);
                        drop(p);
                    }));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                sigkill(kid_pid);
                let all = async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                };
                if tokio::time::timeout(Duration::from_secs(3), all)
                    .await
                    .is_err()
                {
                    panic!(
                        "round {round}: survivors stuck: {} acquisitions, available {}",
                        got.load(Ordering::SeqCst),
                        sem.available()
                    );
                }
                survivors
            });
            assert!(got.load(Ordering::SeqCst) >= survivors);
            assert!(
                cxc_testkit::wait_until(Duration::from_secs(1), || async_waiters() == 0),
                "round {round}: {} waiters stayed registered",
                async_waiters()
            );
            assert_eq!(sem.available(), 2, "round {round}: a permit leaked");
            kid.kill();
        }
    }
}

/// Worker: registers its own pid, marks `bits`, reports its slot, then beats forever.
fn role_hb_worker() {
    let t = HeartbeatTable::open_any(path_arg("path")).unwrap();
    let bits: u64 = cxc_testkit::arg("bits").parse().unwrap();
    let slot = t.register(std::process::id()).unwrap();
    for b in FailoverWatchdog::iter_in_flight_bits(bits) {
        assert!(t.mark_in_flight(slot, b));
    }
    report(format!("slot={slot}"));
    loop {
        t.beat(slot);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Watchdog: scans and reclaims in a tight loop until `stop` exists; every non-zero
/// reclaim is appended (one write) to `log` as `SLOT BITS`.
fn role_hb_watchdog() {
    let t = HeartbeatTable::open_any(path_arg("path")).unwrap();
    let stop = path_arg("stop");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path_arg("log"))
        .unwrap();
    let w = FailoverWatchdog::with_grace(&t, BIG).with_os_check_interval(Duration::ZERO);
    report("scanning=1");
    while !stop.exists() {
        for (slot, _) in w.scan().dead_slots {
            // Intent first: a watchdog SIGKILLed after `reclaim` returned and before its
            // log line owned those bits when it died (they are its work, as the API
            // says); the test accepts such a loss only for a slot with an open intent.
            log.write_all(format!("? {slot}\n").as_bytes()).unwrap();
            let bits = w.reclaim(slot);
            log.write_all(format!("{slot} {bits}\n").as_bytes())
                .unwrap();
        }
    }
    report("stopped=1");
}

fn reclaimed(dir: &Path) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with("wd") {
            continue;
        }
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let mut f = line.split_whitespace();
            let (Some(s), Some(b)) = (f.next(), f.next()) else {
                continue;
            };
            if s == "?" {
                continue;
            }
            let bits: u64 = b.parse().unwrap();
            if bits != 0 {
                out.push((s.parse().unwrap(), bits));
            }
        }
    }
    out
}

/// Slots a watchdog announced it was about to reclaim (`? SLOT`) with no result line
/// after: it was SIGKILLed inside `reclaim` or between its return and the log write.
fn open_intents(dir: &Path) -> Vec<usize> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with("wd") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        if let Some(slot) = text.lines().last().and_then(|l| l.strip_prefix("? ")) {
            out.push(slot.parse().unwrap());
        }
    }
    out
}

/// Two watchdog processes scan one table without pause; worker processes holding
/// in-flight units are SIGKILLed one by one, and for each a third watchdog process is
/// started and SIGKILLed a few hundred microseconds later (mid-scan or mid-reclaim).
/// Promise (docs/failover-watchdog.md): any number of watchdogs in any processes,
/// `reclaim` returns each bit exactly once; a reclaimer that died mid-way leaves the slot
/// FENCED and reported again. Every dead worker's units must be reclaimed exactly once
/// overall, a live worker's never.
#[test]
fn watchdog_two_scanners_and_a_killed_one_reclaim_every_unit_exactly_once() {
    play_role!(role_hb_worker, role_hb_watchdog);
    let _s = serial();
    let mut rng = Rng::for_test();
    const TEST: &str = "watchdog_two_scanners_and_a_killed_one_reclaim_every_unit_exactly_once";
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hb");
        let table = HeartbeatTable::create(&path, 16).unwrap();
        let stop = dir.path().join("stop");
        let mut workers: Vec<(Proc, usize, u64)> = Vec::new();
        for i in 0..6u64 {
            let bits = (rng.below(u64::MAX) | 1) ^ (i << 7);
            let mut w = RoleCommand::new(TEST, "hb_worker")
                .arg("path", &path)
                .arg("bits", bits.to_string())
                .spawn();
            let slot = num(&w.next_report(REPORT_WAIT), "slot") as usize;
            workers.push((w, slot, bits));
        }
        let wd = |name: &str| {
            RoleCommand::new(TEST, "hb_watchdog")
                .arg("path", &path)
                .arg("stop", &stop)
                .arg("log", dir.path().join(name))
                .spawn()
        };
        let mut a = wd("wd-a");
        let mut b = wd("wd-b");
        a.next_report(REPORT_WAIT);
        b.next_report(REPORT_WAIT);
        let mut victims = Vec::new();
        for (k, (w, _, _)) in workers.iter_mut().take(4).enumerate() {
            let mut v = wd(&format!("wd-victim-{k}"));
            v.next_report(REPORT_WAIT);
            std::thread::sleep(Duration::from_micros(rng.below(1_000)));
            w.kill();
            std::thread::sleep(Duration::from_micros(rng.below(1_500)));
            sigkill(v.pid());
            victims.push(v);
        }
        let dead: BTreeMap<usize, u64> = workers.iter().take(4).map(|w| (w.1, w.2)).collect();
        let t = Instant::now();
        loop {
            let mut got: BTreeMap<usize, u64> = BTreeMap::new();
            for (s, b) in reclaimed(dir.path()) {
                *got.entry(s).or_default() |= b;
            }
            if dead.iter().all(|(s, b)| got.get(s) == Some(b))
                || t.elapsed() > Duration::from_secs(3)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(&stop, b"").unwrap();
        a.next_report(REPORT_WAIT);
        b.next_report(REPORT_WAIT);
        let logs = reclaimed(dir.path());
        for (s, bits) in &dead {
            let mine: Vec<u64> = logs.iter().filter(|l| l.0 == *s).map(|l| l.1).collect();
            let union = mine.iter().fold(0, |acc, b| acc | b);
            let sum: u32 = mine.iter().map(|b| b.count_ones()).sum();
            assert_eq!(
                union & !bits,
                0,
                "round {round}: dead slot {s}: reclaimed bits it never held ({mine:x?})"
            );
            if union != *bits {
                // Only a watchdog killed inside `reclaim`, or after it returned and before
                // its log line, can explain missing bits; and they must have left the
                // table (taken by it, not stuck in the slot).
                let left = table.snapshot(*s).map_or(0, |x| x.in_flight_bitmap);
                assert!(
                    open_intents(dir.path()).contains(s) && left & bits & !union == 0,
                    "round {round}: dead slot {s}: reclaimed {union:#x} of {bits:#x} \
                     ({mine:x?}), {left:#x} left in the slot"
                );
                eprintln!(
                    "round {round}: slot {s}: {:#x} taken by a watchdog killed before it \
                     logged them",
                    bits & !union
                );
            }
            assert_eq!(
                sum,
                union.count_ones(),
                "round {round}: dead slot {s}: a unit was reclaimed twice ({mine:x?})"
            );
        }
        for (_, s, _) in workers.iter().skip(4) {
            assert!(
                logs.iter().all(|l| l.0 != *s),
                "round {round}: live worker's slot {s} was reclaimed: {logs:?}"
            );
        }
        for (mut w, _, _) in workers {
            w.kill();
        }
    }
}

#[cfg(feature = "async")]
mod fork {
    use super::*;
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    use cxc_sync::OwnerLease;

    struct Nop;
    impl Wake for Nop {
        fn wake(self: Arc<Self>) {}
    }

    /// Role: opens the lease (held by the test process); if `warm` is 1, first uses the
    /// async API once (a waiter polled and dropped: this process's reactor starts); then
    /// forks. The forked child awaits `lock_async` under `cxc_sync::block_on` and exits 0
    /// once it holds the lease, 3 if it waited 3 s in vain. Reports `status=CODE`.
    fn role_async_forker() {
        let lease = OwnerLease::<u64>::open(path_arg("path")).unwrap();
        if cxc_testkit::arg("warm") == "1" {
            let w = Waker::from(Arc::new(Nop));
            let mut f = Box::pin(lease.lock_async());
            assert!(f.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
            drop(f);
            std::thread::sleep(Duration::from_millis(30));
        }
        // SAFETY: fork(2); the child only starts a timer thread, awaits the lease and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_secs(3));
                // SAFETY: _exit(2) ends the forked child.
                unsafe { libc::_exit(3) };
            });
            let g = cxc_sync::block_on(lease.lock_async());
            drop(g);
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        report(format!("forked={pid}"));
        let mut status = 0;
        // SAFETY: waitpid(2) of our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        };
        report(format!("status={code}"));
    }

    fn forked_child_awaits(warm: bool) -> i64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease");
        let lease = OwnerLease::create(&path, 0u64).unwrap();
        let g = lease.lock();
        let mut kid = RoleCommand::new(
            "fork::async_lock_in_a_forked_child_of_a_process_whose_reactor_ran",
            "async_forker",
        )
        .arg("path", &path)
        .arg("warm", if warm { "1" } else { "0" })
        .spawn();
        kid.next_report(REPORT_WAIT);
        std::thread::sleep(Duration::from_millis(50));
        drop(g);
        let code = num(&kid.next_report(REPORT_WAIT), "status") as i64;
        kid.finish(REPORT_WAIT);
        code
    }

    /// docs/owner-lease.md: "`fork` without `exec`: the child is a new identity"; the
    /// blocking waits of a forked child work (attack3). docs/async.md: the reactor is
    /// "started on first use". A child forked from a process whose reactor already ran
    /// (e.g. a pre-forking server) awaits `lock_async` on a lease the test process
    /// releases 50 ms later: it must get it. Control: the same child forked before the
    /// reactor ever ran.
    #[test]
    fn async_lock_in_a_forked_child_of_a_process_whose_reactor_ran() {
        play_role!(role_async_forker);
        let _s = serial();
        let cold = forked_child_awaits(false);
        let warm = forked_child_awaits(true);
        assert_eq!(
            cold, 0,
            "control (reactor not started before fork) failed: {cold}"
        );
        assert_eq!(
            warm, 0,
            "the forked child never got the released lease through lock_async \
             (exit {warm}; 3 = waited 3 s): its inherited reactor has no thread"
        );
    }
}

#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack47: exhaustion the last round (attack43_mp) did not try, with real processes.
//!
//! 1. **RLIMIT_AS small** in a child before `create` and the first use of each primitive
//!    (lease, semaphore, rwlock, heartbeat table, election): a typed error or success,
//!    never a panic (101) or abort (134), and never a half-made file that wedges a second
//!    process (which must then create/open and use the primitive normally).
//! 2. **Descriptors run out after open**: a lease claimant, rwlock writer, watchdog and
//!    elector with no descriptor left judge a live holder whose main thread exited
//!    (`exit_main_thread`) and a SIGKILLed one: the live one is never judged dead; the
//!    dead one's claim/units/term come back once descriptors are free again.
//! 3. **A full holder table** (semaphore `holders = 2`): one holder alive and half-exited,
//!    one SIGKILLed; a newcomer with no descriptor gets `TableFull` (or a slot), never a
//!    permit of the live holder; once it has descriptors, it opens and the dead holder's
//!    permits come back while the live one keeps its own.
//! 4. **A lease holder with more than 512 threads** (the exiting scan's limit), SIGKILLed,
//!    reaped or a zombie: docs/owner-lease.md "More than 512 threads cannot be followed:
//!    such a holder fails over when it is dead"; "a holder whose whole process is gone is
//!    replaced at once".
//!
//! Results: 1 HELD (every primitive, margins 0 B..16 MiB: `mmap` ENOMEM is an `Io` error,
//! a second process then creates and uses the file). 2 HELD for the rwlock writer, the
//! watchdog and the elector (live half-exited never taken, starved or not; dead taken at
//! once) and for a dead lease holder, and for a live lease holder whose main thread exited,
//! its guard on a worker thread that beats every 5 ms, with or without descriptors
//! (`lease_claimant_spares_a_live_beating_holder_whose_main_thread_exited`; a first
//! version with 1 ms ticks looked like a break, but a guard's grace is 3 epochs, 3 ms,
//! so a holder beating every 5 ms was stale by the documented rule: the ticks are 50 ms
//! now, a 150 ms grace). 3 HELD.
//! 4 HELD (600 threads, reaped or a zombie: failover in 6-11 ms).
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionConfig, Elector, EpochMode, FailoverWatchdog, HeartbeatTable, LeaseOptions,
    MmapElection, OwnerLease, Preemption, RwLockOptions, SemaphoreOptions, SharedRwLock,
    SharedSemaphore,
};
use cxc_testkit::{
    RoleCommand, arg, child_wait_for_path, exit_main_thread, fd_free, fields, path_arg, play_role,
    report, serial, sleep_forever, use_up_fds, wait_until,
};

const REPORT_WAIT: Duration = Duration::from_secs(20);

/// The soft `RLIMIT_NOFILE` a role lowers itself to before it uses up its descriptors.
const FD_LIMIT: u64 = 128;

fn lease_opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(50),
        },
        ..LeaseOptions::default()
    }
}

fn rw_opts() -> RwLockOptions {
    RwLockOptions::default().grace(Duration::from_secs(600))
}

/// Election lease: long, so a live silent leader keeps its term through the test.
const ELECTION_LEASE: Duration = Duration::from_secs(10);

fn elector(path: &Path, name: &str) -> Result<Elector<MmapElection>, String> {
    let backend =
        MmapElection::create_or_open(path, ELECTION_LEASE).map_err(|e| format!("{e:?}"))?;
    Elector::new(
        backend,
        ElectionConfig::new(name)
            .lease_duration(ELECTION_LEASE)
            .retry_period(Duration::from_millis(20)),
    )
    .map_err(|e| format!("{e:?}"))
}

const HB_CAP: usize = 4;

fn word(s: impl std::fmt::Debug) -> String {
    format!("{s:?}")
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .take(120)
        .collect()
}

/// Creates (or opens, `create=false`) primitive `prim` at `path` and uses it once:
/// `Ok(what happened)` or `Err(the typed error)`.
fn create_and_use(prim: &str, path: &Path, create: bool) -> Result<String, String> {
    match prim {
        "lease" => {
            let l = if create {
                OwnerLease::<u64>::create_with(path, 0, &lease_opts())
            } else {
                OwnerLease::<u64>::open(path)
            }
            .map_err(word)?;
            let g = l.try_lock().ok_or("busy")?;
            g.write(7).map_err(word)?;
            g.unlock().map_err(word)?;
            Ok("locked".into())
        }
        "sem" => {
            let s = if create {
                SharedSemaphore::create(path, 2, 2)
            } else {
                SharedSemaphore::open(path)
            }
            .map_err(word)?;
            let p = s.try_acquire().ok_or("no_permit")?;
            drop(p);
            Ok(format!("available={}", s.available()))
        }
        "rw" => {
            let r = if create {
                SharedRwLock::<u64>::create_with(path, 0, &rw_opts())
            } else {
                SharedRwLock::<u64>::open(path)
            }
            .map_err(word)?;
            let w = r.try_write().ok_or("busy")?;
            w.write(3).map_err(word)?;
            drop(w);
            let v = r.try_read().ok_or("busy_read")?.get();
            Ok(format!("value={v}"))
        }
        "hb" => {
            let t = if create {
                HeartbeatTable::create(path, HB_CAP)
            } else {
                HeartbeatTable::open(path, HB_CAP)
            }
            .map_err(word)?;
            let reg = t.join().map_err(word)?;
            reg.mark_in_flight(1).map_err(word)?;
            reg.clear_in_flight(1).map_err(word)?;
            drop(reg);
            Ok("joined".into())
        }
        "election" => {
            let e = elector(path, &format!("p{}", std::process::id()))?;
            let l = e
                .campaign(Duration::from_millis(500))
                .map_err(word)?
                .ok_or("not_elected")?;
            let t = l.token();
            l.step_down().map_err(word)?;
            Ok(format!("token={t}"))
        }
        _ => unreachable!(),
    }
}

// ---------------------------------------------------------------------------------------
// 1. RLIMIT_AS small before create and first use.
// ---------------------------------------------------------------------------------------

const AS_TEST: &str = "small_address_space_at_create_is_a_typed_error_and_leaves_nothing_wedged";

fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    kb * 1024
}

/// Role: limits its address space to its current size plus `margin` bytes, creates `prim`
/// at `path` and uses it once, catching panics; reports through a file opened first.
fn role_as_creator() {
    use std::io::Write;
    let prim = arg("prim");
    let path = path_arg("path");
    let margin: u64 = arg("margin").parse().unwrap();
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .open(path_arg("ledger"))
        .unwrap();
    let mut line = String::with_capacity(8192);
    let lim = vm_size() + margin;
    let rl = libc::rlimit {
        rlim_cur: lim,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall on a local struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
    let r = std::panic::catch_unwind(|| create_and_use(&prim, &path, true));
    use std::fmt::Write as _;
    let _ = match &r {
        Ok(Ok(s)) => writeln!(line, "prim={prim} margin={margin} ok={s}"),
        Ok(Err(e)) => writeln!(line, "prim={prim} margin={margin} err={e}"),
        Err(_) => writeln!(line, "prim={prim} margin={margin} PANIC"),
    };
    let _ = out.write_all(line.as_bytes());
    if r.is_err() {
        std::process::exit(101);
    }
}

/// Docs (owner-lease.md): "a fact of this process's own identity that cannot be read for
/// such a passing reason (`EMFILE`, `ENFILE`, `ENOMEM`, ...) is not cached, and
/// `create`/`open` of every primitive fail with an `Io` error"; (design.md) "never a
/// panic". Memory is the other passing shortage.
#[test]
fn small_address_space_at_create_is_a_typed_error_and_leaves_nothing_wedged() {
    play_role!(role_as_creator);
    let _s = serial();
    let mut bad = Vec::new();
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    std::fs::write(&ledger, "").unwrap();
    for prim in ["lease", "sem", "rw", "hb", "election"] {
        for margin in [0u64, 64 << 10, 1 << 20, 4 << 20, 16 << 20] {
            let path = d.path().join(format!("{prim}-{margin}"));
            let out = RoleCommand::new(AS_TEST, "as_creator")
                .arg("prim", prim)
                .arg("path", &path)
                .arg("margin", margin.to_string())
                .arg("ledger", &ledger)
                .spawn()
                .output(REPORT_WAIT);
            let st = out.status;
            if st.signal().is_some() || st.code() == Some(101) || st.code() == Some(134) {
                bad.push(format!(
                    "{prim} margin={margin}: the child died: {st:?} {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .filter(|l| l.contains("panicked") || l.contains("alloc"))
                        .collect::<Vec<_>>()
                        .join(" | ")
                ));
            }
            // A second process (this one) must then use the file normally.
            let again = if path.exists() {
                create_and_use(prim, &path, false)
            } else {
                create_and_use(prim, &path, true)
            };
            if let Err(e) = &again {
                bad.push(format!(
                    "{prim} margin={margin}: afterwards a second process failed: {e}"
                ));
            }
            let leftovers: Vec<String> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".cxc-tmp."))
                .collect();
            if !leftovers.is_empty() {
                bad.push(format!(
                    "{prim} margin={margin}: temp files left: {leftovers:?}"
                ));
            }
        }
    }
    println!("{}", std::fs::read_to_string(&ledger).unwrap());
    assert!(bad.is_empty(), "{bad:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. Judges with no descriptor left: a live half-exited holder, a dead one.
// ---------------------------------------------------------------------------------------

const FD_TEST: &str = "judges_without_descriptors_spare_the_live_and_recover_the_dead";

/// Role: takes `prim` at `path` (lease lock, rwlock write, heartbeat units, election
/// term), reports, then (mode `half`) ends its main thread with a worker alive, or
/// (mode `hold`) sleeps until killed.
fn role_fd_holder() {
    let prim = arg("prim");
    let path = path_arg("path");
    match prim.as_str() {
        "lease" => {
            let l: &'static OwnerLease<u64> =
                Box::leak(Box::new(OwnerLease::<u64>::open(&path).unwrap()));
            beat_forever(l);
        }
        "rw" => {
            let r: &'static SharedRwLock<u64> =
                Box::leak(Box::new(SharedRwLock::<u64>::open(&path).unwrap()));
            std::mem::forget(r.try_write().expect("rw free"));
        }
        "hb" => {
            let t: &'static HeartbeatTable =
                Box::leak(Box::new(HeartbeatTable::open(&path, HB_CAP).unwrap()));
            let reg = t.join().unwrap();
            reg.mark_in_flight(5).unwrap();
            reg.mark_in_flight(40).unwrap();
            std::mem::forget(reg);
        }
        "election" => {
            let e: &'static Elector<MmapElection> =
                Box::leak(Box::new(elector(&path, "holder").unwrap()));
            let l = e
                .campaign(Duration::from_secs(5))
                .unwrap()
                .expect("elected");
            std::mem::forget(l);
        }
        _ => unreachable!(),
    }
    report(format!("held pid={}", std::process::id()));
    if arg("mode") == "half" {
        std::thread::spawn(|| sleep_forever());
        assert!(exit_main_thread());
    }
    sleep_forever();
}

/// Takes the lease on a worker thread and keeps its claim fresh from it every 5 ms (a silent
/// holder is legitimately taken over after the grace), for the process's life.
fn beat_forever(l: &'static OwnerLease<u64>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let g = l.try_lock().expect("lease free");
        tx.send(()).unwrap();
        loop {
            let _ = g.beat();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    rx.recv().unwrap();
}

/// One attempt of a judge to take `prim` over (bounded by `within`): whether it got it.
struct Judge {
    prim: String,
    lease: Option<OwnerLease<u64>>,
    rw: Option<SharedRwLock<u64>>,
    hb: Option<HeartbeatTable>,
    el: Option<Elector<MmapElection>>,
}

impl Judge {
    fn open(prim: &str, path: &Path) -> Judge {
        let mut j = Judge {
            prim: prim.into(),
            lease: None,
            rw: None,
            hb: None,
            el: None,
        };
        match prim {
            "lease" => j.lease = Some(OwnerLease::<u64>::open(path).unwrap()),
            "rw" => j.rw = Some(SharedRwLock::<u64>::open(path).unwrap()),
            "hb" => j.hb = Some(HeartbeatTable::open(path, HB_CAP).unwrap()),
            "election" => j.el = Some(elector(path, "judge").unwrap()),
            _ => unreachable!(),
        }
        j
    }

    fn attempt(&self, within: Duration) -> bool {
        match self.prim.as_str() {
            "lease" => match self.lease.as_ref().unwrap().lock_timeout(within) {
                Some(g) => {
                    let _ = g.unlock();
                    true
                }
                None => false,
            },
            "rw" => self.rw.as_ref().unwrap().write_timeout(within).is_some(),
            "hb" => {
                let t = self.hb.as_ref().unwrap();
                let wd = FailoverWatchdog::with_grace(t, u64::MAX / 4)
                    .with_os_check_interval(Duration::ZERO);
                let t0 = Instant::now();
                loop {
                    let r = wd.scan();
                    if !r.dead_slots.is_empty() {
                        return true;
                    }
                    if t0.elapsed() >= within {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            "election" => match self.el.as_ref().unwrap().campaign(within) {
                Ok(Some(l)) => {
                    let _ = l.step_down();
                    true
                }
                _ => false,
            },
            _ => unreachable!(),
        }
    }
}

/// Role: opens `prim` (identity warm), reports, waits for marker `go`, uses up its
/// descriptors and tries for 1 s; frees them and tries for 2 s more.
fn role_fd_judge() {
    let path = path_arg("path");
    let j = Judge::open(&arg("prim"), &path);
    report("ready");
    child_wait_for_path(&path_arg("dir").join("go"), REPORT_WAIT);
    let fds = if arg("starve") == "1" {
        use_up_fds(FD_LIMIT)
    } else {
        Vec::new()
    };
    assert!(arg("starve") != "1" || !fd_free());
    let starved = j.attempt(Duration::from_secs(1));
    drop(fds);
    let t0 = Instant::now();
    let later = starved || j.attempt(Duration::from_secs(2));
    report(format!(
        "starved={starved} later={later} ms={}",
        t0.elapsed().as_millis()
    ));
}

/// Docs (owner-lease.md): "A judge short of descriptors answers 'cannot tell' (alive),
/// never dead"; "A process whose main thread exited while other threads run ... is
/// **alive**"; "a holder whose whole process is gone is replaced at once";
/// (failover-watchdog.md) "a main thread that exited while other threads run is *not*
/// dead"; (leader-election.md) a dead leader "mapped file: at once (pidfd)".
#[test]
fn judges_without_descriptors_spare_the_live_and_recover_the_dead() {
    play_role!(role_fd_holder, role_fd_judge);
    let _s = serial();
    let mut cases = vec![("lease", "dead", "1")];
    for prim in ["rw", "hb", "election"] {
        for (mode, starve) in [("half", "1"), ("half", "0"), ("dead", "1")] {
            cases.push((prim, mode, starve));
        }
    }
    let bad = judge_cases(FD_TEST, &cases);
    assert!(bad.is_empty(), "{bad:#?}");
}

const LEASE_HALF_TEST: &str =
    "lease_claimant_spares_a_live_beating_holder_whose_main_thread_exited";

/// Docs (owner-lease.md): "A process whose main thread exited while other threads run
/// (`/proc/PID/stat` says `Z`) is **alive**"; a holder is replaced at once only when
/// "its whole process is gone", a stopped or hung one after the grace. Here the holder's
/// guard lives on a worker thread that beats every 5 ms (its heartbeat is fresh), the
/// main thread (which opened the lease) has exited, and a claimant, with and without
/// descriptors to spare, must not take it (the grace is 3 epochs of 50 ms).
#[test]
fn lease_claimant_spares_a_live_beating_holder_whose_main_thread_exited() {
    play_role!(role_fd_holder, role_fd_judge);
    let _s = serial();
    let bad = judge_cases(
        LEASE_HALF_TEST,
        &[("lease", "half", "0"), ("lease", "half", "1")],
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Runs each `(prim, mode, starve)` case: a holder (`half`: main thread exited; `dead`:
/// SIGKILLed and reaped) and a judge (`starve=1`: first with no descriptor left).
fn judge_cases(test: &str, cases: &[(&str, &str, &str)]) -> Vec<String> {
    let mut bad = Vec::new();
    for &(prim, mode, starve) in cases {
        {
            let d = tempfile::tempdir().unwrap();
            let path = d.path().join(prim);
            match prim {
                "lease" => drop(OwnerLease::<u64>::create_with(&path, 0, &lease_opts()).unwrap()),
                "rw" => drop(SharedRwLock::<u64>::create_with(&path, 0, &rw_opts()).unwrap()),
                "hb" => drop(HeartbeatTable::create(&path, HB_CAP).unwrap()),
                _ => {}
            }
            let mut holder = RoleCommand::new(test, "fd_holder")
                .arg("prim", prim)
                .arg("path", &path)
                .arg("mode", if mode == "half" { "half" } else { "hold" })
                .spawn();
            let h = holder.next_report(REPORT_WAIT);
            if mode == "half" {
                assert!(wait_until(REPORT_WAIT, || holder.state() == Some('Z')));
            }
            if prim == "lease" {
                let l = OwnerLease::<u64>::open(&path).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                println!(
                    "lease {mode}: owner={:?} holder_pid={} state={:?} status={:?}",
                    l.current_owner(),
                    holder.pid(),
                    holder.state(),
                    l.status()
                );
            }
            let mut judge = RoleCommand::new(test, "fd_judge")
                .arg("prim", prim)
                .arg("path", &path)
                .arg("dir", d.path())
                .arg("starve", starve)
                .spawn();
            assert_eq!(judge.next_report(REPORT_WAIT), "ready");
            if mode == "dead" {
                holder.kill();
            }
            std::fs::write(d.path().join("go"), "").unwrap();
            let out = judge.output(REPORT_WAIT);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text
                .lines()
                .filter_map(|l| l.split_once(cxc_testkit::REPORT_PREFIX).map(|x| x.1))
                .next_back()
                .unwrap_or("")
                .to_owned();
            println!(
                "{prim} {mode} starve={starve}: holder {h}; judge {:?} {line}",
                out.status
            );
            if !out.status.success() || !line.contains("later=") {
                bad.push(format!(
                    "{prim} {mode}: judge failed {:?}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
                holder.kill();
                continue;
            }
            let f = fields(&line);
            if mode == "half" {
                let alive = holder.try_wait().is_none();
                if alive && (f["starved"] == "true" || f["later"] == "true") {
                    bad.push(format!(
                        "{prim} starve={starve}: a live half-exited holder was taken over: {line}"
                    ));
                }
            } else if f["later"] != "true" {
                bad.push(format!(
                    "{prim}: the dead holder's hold never came back once fds were free: {line}"
                ));
            }
            holder.kill();
        }
    }
    bad
}

// ---------------------------------------------------------------------------------------
// 3. A full semaphore holder table, a newcomer short of descriptors.
// ---------------------------------------------------------------------------------------

const FULL_TEST: &str = "full_holder_table_and_no_descriptors_never_give_a_wrong_verdict";

/// Role: opens the semaphore, takes one permit, reports; `half`: ends its main thread.
fn role_full_holder() {
    let s: &'static SharedSemaphore =
        Box::leak(Box::new(SharedSemaphore::open(path_arg("path")).unwrap()));
    std::mem::forget(s.try_acquire().expect("a permit"));
    report(format!("held pid={}", std::process::id()));
    if arg("mode") == "half" {
        std::thread::spawn(|| sleep_forever());
        assert!(exit_main_thread());
    }
    sleep_forever();
}

/// Role: no descriptor left: opens the semaphore (reports the result and, if open, what
/// a 500 ms `acquire_many_timeout(2)` got); then with descriptors: opens again and waits
/// up to 2 s for one permit (the dead holder's).
fn role_full_newcomer() {
    let path = path_arg("path");
    // Warm the identity first (a scratch semaphore in the directory).
    drop(SharedSemaphore::create(path_arg("dir").join("scratch"), 1, 1).unwrap());
    let fds = use_up_fds(FD_LIMIT);
    let starved = match SharedSemaphore::open(&path) {
        Ok(s) => {
            let got = s.try_acquire_many(2).is_some()
                || s.acquire_many_timeout(2, Duration::from_millis(500))
                    .is_some();
            format!("open_got2={got}")
        }
        Err(e) => format!("err={}", word(e)),
    };
    drop(fds);
    let later = match SharedSemaphore::open(&path) {
        Ok(s) => {
            let got = s
                .acquire_timeout(Duration::from_secs(2))
                .map(std::mem::forget);
            format!("later_got={}", got.is_some())
        }
        Err(e) => format!("later_err={}", word(e)),
    };
    report(format!("starved={starved} {later}"));
}

/// Docs (shared-semaphore.md): registration takes a free slot, "else reclaim dead holders
/// and retry, else fail: `open` returns `SemaphoreError::TableFull { capacity }`"; "An
/// unknown identity or an OS that cannot tell means alive (never reclaim on a guess)".
#[test]
fn full_holder_table_and_no_descriptors_never_give_a_wrong_verdict() {
    play_role!(role_full_holder, role_full_newcomer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sem");
    let opts = SemaphoreOptions::default().holders(3);
    drop(SharedSemaphore::create_with(&path, 2, 2, &opts).unwrap());
    let mut live = RoleCommand::new(FULL_TEST, "full_holder")
        .arg("path", &path)
        .arg("mode", "half")
        .spawn();
    let l = live.next_report(REPORT_WAIT);
    assert!(wait_until(REPORT_WAIT, || live.state() == Some('Z')));
    let mut dead = RoleCommand::new(FULL_TEST, "full_holder")
        .arg("path", &path)
        .arg("mode", "hold")
        .spawn();
    let k = dead.next_report(REPORT_WAIT);
    dead.kill();
    let r = RoleCommand::new(FULL_TEST, "full_newcomer")
        .arg("path", &path)
        .arg("dir", d.path())
        .spawn()
        .finish(REPORT_WAIT);
    println!("live {l}; dead {k}; newcomer {r:?}");
    let f = fields(&r[0]);
    // Never both permits: one belongs to the live holder.
    assert_ne!(f["starved"], "open_got2=true", "{r:?}");
    assert_eq!(f.get("later_got").copied(), Some("true"), "{r:?}");
    assert!(live.try_wait().is_none());
    let s = SharedSemaphore::open_unregistered(&path).unwrap();
    // The newcomer (exited) held the dead holder's permit: it comes back; the live
    // holder keeps its own.
    s.reclaim_dead();
    assert_eq!(s.available(), 1, "the live holder's permit was at stake");
    live.kill();
}

// ---------------------------------------------------------------------------------------
// 4. A lease holder with more than 512 threads, SIGKILLed.
// ---------------------------------------------------------------------------------------

const MANY_TEST: &str = "lease_holder_with_600_threads_fails_over_when_dead";

/// Role: starts 600 sleeping threads, takes the lease, reports, sleeps until killed.
fn role_many_holder() {
    let l: &'static OwnerLease<u64> =
        Box::leak(Box::new(OwnerLease::<u64>::open(path_arg("path")).unwrap()));
    for _ in 0..600 {
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(|| sleep_forever())
            .unwrap();
    }
    beat_forever(l);
    report(format!("held pid={}", std::process::id()));
    sleep_forever();
}

/// Docs (owner-lease.md): "More than 512 threads cannot be followed: such a holder fails
/// over when it is dead"; "a holder whose whole process is gone is replaced at once".
#[test]
fn lease_holder_with_600_threads_fails_over_when_dead() {
    play_role!(role_many_holder);
    let _s = serial();
    let mut bad = Vec::new();
    for reaped in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lease");
        let lease = OwnerLease::<u64>::create_with(&path, 0, &lease_opts()).unwrap();
        let mut h = RoleCommand::new(MANY_TEST, "many_holder")
            .arg("path", &path)
            .spawn();
        let r = h.next_report(REPORT_WAIT);
        assert!(lease.try_lock().is_none(), "{r}");
        let t0 = Instant::now();
        if reaped {
            h.kill();
        } else {
            h.kill_unreaped();
        }
        let got = lease.lock_timeout(Duration::from_secs(5));
        let ms = t0.elapsed().as_millis();
        println!("reaped={reaped}: {r}; got={} after {ms} ms", got.is_some());
        if got.is_none() {
            bad.push(format!(
                "reaped={reaped}: no failover within 5 s of SIGKILL"
            ));
        } else if ms > 1500 {
            bad.push(format!("reaped={reaped}: failover took {ms} ms"));
        }
        drop(got);
        h.kill();
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

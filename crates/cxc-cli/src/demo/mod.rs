//! `cxc demo`: a self-contained failover scenario on real processes.
//!
//! A primary and a standby coordinator share an `OwnerLease`; workers registered in a
//! `HeartbeatTable` take numbered work units under a `SharedSemaphore` cap; the lease
//! holder runs a `FailoverWatchdog`. Midway the demo SIGKILLs a worker that is in the
//! middle of a unit, and the primary coordinator. It then checks that the standby took
//! over, the dead worker's unit was reclaimed and redone, every unit was done, and no
//! invariant broke.
//!
//! Interrupted (SIGINT, SIGTERM, SIGHUP), it stops its processes and removes its
//! temporary directory before it exits (130); killed outright, its processes notice that
//! their parent is gone and end by themselves.

mod board;
mod events;
mod roles;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cxc::{
    EpochMode, HeartbeatOptions, HeartbeatTable, LeaseOptions, OwnerLease, Preemption,
    SharedSemaphore,
};

use crate::CliError;
use board::Board;
use roles::Files;

/// Arguments of `cxc demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct Demo {
    /// Worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=32))]
    workers: u32,
    /// Work units.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(4..=4096))]
    units: u64,
    /// Keep the demo's files in this directory instead of a temporary one.
    #[arg(long)]
    keep: Option<PathBuf>,
}

/// A demo child role (hidden subcommand).
#[derive(clap::Args, Debug)]
pub(crate) struct Role {
    /// coordinator | worker
    role: String,
    /// The demo directory.
    dir: PathBuf,
    /// Display name.
    name: String,
}

pub(crate) fn run_role(r: Role) -> Result<u8, CliError> {
    match r.role.as_str() {
        "coordinator" => roles::coordinator(&r.dir, &r.name),
        "worker" => roles::worker(&r.dir, &r.name, (20, 60)),
        other => Err(CliError::usage(format!("unknown demo role {other}"))),
    }
}

struct Proc {
    name: String,
    child: Child,
}

fn spawn(dir: &Path, role: &str, name: &str) -> Result<Proc, CliError> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["__demo-role", role])
        .arg(dir)
        .arg(name)
        .env(board::PARENT_VAR, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(Proc {
        name: name.to_string(),
        child,
    })
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<(), CliError> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > timeout {
            return Err(CliError::usage(format!(
                "demo: timed out waiting for {what}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn progress(done: u64, total: u64, note: &str) {
    use std::io::IsTerminal;
    let width = 30usize;
    let filled = (done as usize * width) / total.max(1) as usize;
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(width - filled));
    if std::io::stderr().is_terminal() {
        cxc_cli::write_stderr(&format!("\r[{bar}] {done:>4}/{total} units  {note:<40}"));
    }
}

pub(crate) fn run(args: Demo) -> Result<u8, CliError> {
    let tmp;
    let dir = match &args.keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let f = Files { dir: dir.clone() };
    let cap = (args.workers - 1).max(1);
    let lease_opts = LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(10),
        },
        ..LeaseOptions::default()
    };
    let lease = OwnerLease::<[u64; 6]>::create_with(f.lease(), [0; 6], &lease_opts)?;
    let table = HeartbeatTable::create_with(
        f.table(),
        args.workers as usize + 4,
        &HeartbeatOptions::default(),
    )?;
    let sem = SharedSemaphore::create(f.sem(), cap, cap)?;
    let board = Board::create(&f.board(), args.units, cap)?;
    cxc_cli::report!(
        "cxc demo: {} workers, {} units, at most {cap} at once; files in {}",
        args.workers,
        args.units,
        dir.display()
    );
    events::log(
        &dir,
        "demo",
        "created lease, heartbeat table, semaphore and work board",
    );

    // A signal ends the run early, but through the same clean-up as its normal end.
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // One the caller ignores (`nohup`) stays ignored, as for `lease run`.
        if !crate::dispositions::is_ignored(sig) {
            signal_hook::flag::register(sig, Arc::clone(&interrupted))?;
        }
    }
    let mut primary = Some(spawn(&dir, "coordinator", "coordinator-A")?);
    let primary_pid = primary.as_ref().map_or(0, |p| p.child.id());
    wait_until(
        "the primary to take the lease",
        Duration::from_secs(10),
        || lease.current_owner() == Some(primary_pid),
    )?;
    let standby = spawn(&dir, "coordinator", "coordinator-B")?;
    let standby_pid = standby.child.id();
    let mut workers: Vec<Proc> = (1..=args.workers)
        .map(|i| spawn(&dir, "worker", &format!("worker-{i}")))
        .collect::<Result<_, _>>()?;

    let started = Instant::now();
    let mut killed_worker: Option<(String, u32, Vec<usize>)> = None;
    let mut kill_coord_ns = 0u64;
    let mut next_worker = args.workers + 1;
    let total = args.units;
    loop {
        let done = board.head(board::DONE).load(Ordering::Acquire);
        let owner = lease.current_owner();
        let note = match owner {
            Some(p) if p == primary_pid => "lease: coordinator-A".to_string(),
            Some(p) if p == standby_pid => "lease: coordinator-B".to_string(),
            Some(p) => format!("lease: pid {p}"),
            None => "lease: vacant".to_string(),
        };
        progress(done, total, &note);
        if done >= total || interrupted.load(Ordering::Relaxed) {
            break;
        }
        if killed_worker.is_none() && done >= total / 3 {
            // A worker in the middle of a unit, and the primary coordinator.
            let victim = workers.iter().position(|w| {
                (0..table.capacity()).any(|s| {
                    table.snapshot(s).is_some_and(|snap| {
                        snap.pid == w.child.id() && snap.in_flight_bitmap != 0 && !snap.fenced
                    })
                })
            });
            // Stopped first, so that the board's in-use count can drop before the kill: a
            // blocked acquirer reclaims the permit the moment the worker is gone, and must
            // not count it as still in use (a false "cap" violation). If it finished its
            // unit (and gave its permit back) before the stop, try again later.
            let victim = victim.filter(|&i| {
                let pid = workers[i].child.id();
                let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
                    return false;
                };
                let _ = rustix::process::kill_process(p, rustix::process::Signal::STOP);
                let t = Instant::now();
                while crate::supervise::stat_state_pgrp(&format!("/proc/{pid}/stat"))
                    .is_some_and(|(st, _)| st != 'T')
                    && t.elapsed() < Duration::from_secs(1)
                {
                    std::thread::sleep(Duration::from_micros(200));
                }
                let busy = (0..table.capacity()).any(|s| {
                    table.snapshot(s).is_some_and(|snap| {
                        snap.pid == pid && snap.in_flight_bitmap != 0 && !snap.fenced
                    })
                });
                if !busy {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::CONT);
                }
                busy
            });
            if let Some(i) = victim {
                let mut w = workers.remove(i);
                let pid = w.child.id();
                let busy: Vec<usize> = (0..board.units())
                    .filter(|&u| {
                        let st = board.unit(u, board::STATE).load(Ordering::Acquire);
                        st != 0 && st != board::DONE_STATE && {
                            (0..table.capacity()).any(|s| {
                                table.snapshot(s).is_some_and(|snap| {
                                    snap.pid == pid && st == board::taken(s, snap.generation)
                                })
                            })
                        }
                    })
                    .collect();
                events::log(
                    &dir,
                    "demo",
                    &format!(
                        "SIGKILL {} (pid {pid}) while it works on units {busy:?}",
                        w.name
                    ),
                );
                // It holds a permit (it is stopped mid-unit): the board's live in-use count
                // drops now; the permit itself comes back when a blocked acquirer reclaims
                // it, once the worker is gone.
                board.head(board::IN_USE).fetch_sub(1, Ordering::AcqRel);
                let _ = w.child.kill();
                let _ = w.child.wait();
                events::log(
                    &dir,
                    "demo",
                    &format!("SIGKILL coordinator-A (pid {primary_pid}), the lease holder"),
                );
                kill_coord_ns = cxc::sidecar::monotonic_ns();
                if let Some(mut p) = primary.take() {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                }
                killed_worker = Some((w.name.clone(), pid, busy));
                // A replacement worker joins (it may reuse the dead worker's slot).
                let name = format!("worker-{next_worker}");
                next_worker += 1;
                workers.push(spawn(&dir, "worker", &name)?);
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            board.head(board::SHUTDOWN).store(1, Ordering::Release);
            return Err(CliError::usage("demo: did not finish within 120 s"));
        }
        // Look often while waiting for a busy worker to kill, so the moment is not missed.
        let looking = killed_worker.is_none() && done >= total / 3;
        std::thread::sleep(Duration::from_millis(if looking { 1 } else { 20 }));
    }
    cxc_cli::say!("");
    board.head(board::SHUTDOWN).store(1, Ordering::Release);
    let mut all = workers;
    all.push(standby);
    all.extend(primary);
    for p in &mut all {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = p.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Ok(None) = p.child.try_wait() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
    events::log(&dir, "demo", "all processes stopped");
    if interrupted.load(Ordering::Relaxed) {
        cxc_cli::say!("cxc demo: interrupted; its processes were stopped");
        return Ok(130);
    }
    let ok = summary(
        &dir,
        &board,
        &sem,
        &lease,
        killed_worker,
        kill_coord_ns,
        standby_pid,
    )?;
    Ok(if ok { 0 } else { 1 })
}

fn summary(
    dir: &Path,
    board: &Board,
    sem: &SharedSemaphore,
    lease: &OwnerLease<[u64; 6]>,
    killed: Option<(String, u32, Vec<usize>)>,
    kill_coord_ns: u64,
    standby_pid: u32,
) -> Result<bool, CliError> {
    let evs = events::read(dir);
    let t0 = evs.first().map_or(0, |e| e.t_ns);
    cxc_cli::report!("\ntimeline (ms since start):");
    for e in &evs {
        let interesting = !e.what.starts_with("took unit") && !e.what.starts_with("done unit");
        if interesting {
            cxc_cli::report!(
                "  {:>8.1}  {:<14} {}",
                (e.t_ns - t0) as f64 / 1e6,
                e.who,
                e.what
            );
        }
    }
    let takeover = evs
        .iter()
        .find(|e| e.who == "coordinator-B" && e.what.starts_with("holds the lease"))
        .map(|e| e.t_ns);
    let units = board.units();
    let mut missing = Vec::new();
    let mut redone = Vec::new();
    let mut reclaimed = Vec::new();
    for u in 0..units {
        let st = board.unit(u, board::STATE).load(Ordering::Acquire);
        let done = board.unit(u, board::UNIT_DONE).load(Ordering::Acquire);
        let starts = board.unit(u, board::UNIT_STARTS).load(Ordering::Acquire);
        let recl = board.unit(u, board::UNIT_RECLAIMED).load(Ordering::Acquire);
        if st != board::DONE_STATE || done == 0 {
            missing.push(u);
        }
        if starts > 1 {
            redone.push(u);
        }
        if recl > 0 {
            reclaimed.push(u);
        }
    }
    let redone_unreclaimed: Vec<usize> = redone
        .iter()
        .copied()
        .filter(|u| !reclaimed.contains(u))
        .collect();
    let completions = board.head(board::COMPLETIONS).load(Ordering::Acquire);
    let max_in_use = board.head(board::MAX_IN_USE).load(Ordering::Acquire);
    let cap = board.head(board::CAP).load(Ordering::Acquire);
    let violations = board.head(board::VIOLATIONS).load(Ordering::Acquire);
    // Whatever a blocked acquirer did not already return during the run, then the
    // file's cumulative count: permits reclaimed from dead holders over the whole run.
    sem.reclaim_dead();
    let reclaimed_permits = sem.stats().reclaimed_permits;
    let permits_back = sem.available() == sem.max_permits();
    let lease_state = lease.status();

    cxc_cli::report!("\nsummary:");
    let mut ok = true;
    let mut check = |good: bool, text: String| {
        cxc_cli::report!("  [{}] {text}", if good { " ok " } else { "FAIL" });
        ok &= good;
    };
    let listing: Vec<String> = (0..units)
        .map(|u| {
            let n = board.unit(u, board::UNIT_DONE).load(Ordering::Acquire);
            let starts = board.unit(u, board::UNIT_STARTS).load(Ordering::Acquire);
            match (n, starts) {
                (0, _) => format!("{u}:MISSING"),
                (_, s) if s > 1 => format!("{u}:done(redone)"),
                _ => format!("{u}:done"),
            }
        })
        .collect();
    cxc_cli::report!("  units: {}", listing.join(" "));
    check(
        missing.is_empty(),
        format!(
            "every unit done: {}/{units} (missing {missing:?})",
            units - missing.len()
        ),
    );
    check(
        completions == units as u64,
        format!("each unit completed exactly once: {completions} accepted completions"),
    );
    check(
        redone_unreclaimed.is_empty(),
        format!("units redone only where reclaimed: redone {redone:?}, reclaimed {reclaimed:?}"),
    );
    if let Some((name, pid, busy)) = &killed {
        let all_reclaimed = busy.iter().all(|u| reclaimed.contains(u));
        check(
            all_reclaimed,
            format!(
                "{name} (pid {pid}) was killed holding units {busy:?}; all were reclaimed and redone"
            ),
        );
        match takeover {
            Some(t) => check(
                t >= kill_coord_ns,
                format!(
                    "standby coordinator-B (pid {standby_pid}) took over the lease {:.2} ms after coordinator-A was killed",
                    t.saturating_sub(kill_coord_ns) as f64 / 1e6
                ),
            ),
            None => check(false, "standby coordinator-B never took over".into()),
        }
    } else {
        check(false, "the demo never found a busy worker to kill".into());
    }
    check(
        max_in_use <= cap && violations == 0,
        format!("semaphore cap held: at most {max_in_use} of {cap} permits in use at once"),
    );
    check(
        permits_back,
        format!(
            "all permits back after the run ({} of {} available; {reclaimed_permits} reclaimed from the dead worker during the run)",
            sem.available(),
            sem.max_permits()
        ),
    );
    check(
        lease_state.generation >= 2,
        format!(
            "lease fencing tokens increased across the handover (last generation {})",
            lease_state.generation
        ),
    );
    cxc_cli::report!(
        "\n{}",
        if ok {
            "demo passed: every invariant held"
        } else {
            "demo FAILED"
        }
    );
    Ok(ok)
}

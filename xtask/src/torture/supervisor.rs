//! The supervisor: creates the shared files, spawns the workers, runs the chaos loop
//! (SIGKILL, SIGSTOP/SIGCONT, restarts) and the live checks, then stops everything, runs
//! the end-of-run checks and prints the summary.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use super::control::{self, Ctx, Stat};
use super::opts::{LeaseMode, Options, Role, WorkerOptions};
use super::{cell, heartbeat, lease, rwlock, semaphore};
use cxc_testkit::Rng;

/// Chaos actions come every 20 ms to `2 * CHAOS_MEAN_MS` (uniform; mean about 160 ms).
const CHAOS_MEAN_MS: u64 = 150;
/// Share of chaos actions that are kills (the rest are pauses).
const KILL_PERCENT: u64 = 70;
/// A paused worker stays stopped this long (the grace window is 50 ms).
const PAUSE_MS: (u64, u64) = (100, 400);
/// A killed worker is restarted after this long.
const RESTART_MS: (u64, u64) = (0, 50);
/// How long workers get to finish and exit once STOP is set.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused(Instant),
    Down(Instant),
}

struct Proc {
    role: Role,
    id: usize,
    inc: u64,
    /// The lease mode of the current incarnation (`Plain` for other roles).
    mode: LeaseMode,
    child: Option<Child>,
    state: State,
}

impl Proc {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Chaos {
    kills: u64,
    holder_kills: u64,
    pauses: u64,
    holder_pauses: u64,
    write_kills: u64,
    write_pauses: u64,
    churns: u64,
    restarts: u64,
    crashes: u64,
    /// Workers killed because they did not exit after STOP.
    hung: u64,
}

/// Per lease mode: processes started, and chaos actions on them.
#[derive(Debug, Default, Clone, Copy)]
struct ModeCount {
    started: u64,
    kills: u64,
    pauses: u64,
    holder_kills: u64,
    write_kills: u64,
}

struct Supervisor {
    opts: Options,
    ctx: Ctx,
    exe: PathBuf,
    procs: Vec<Proc>,
    chaos: BTreeMap<Role, Chaos>,
    modes: BTreeMap<LeaseMode, ModeCount>,
    rng: Rng,
}

fn stderr_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n    ")
}

impl Supervisor {
    fn err_path(&self, role: Role, id: usize) -> PathBuf {
        self.ctx
            .dir
            .join(format!("worker-{}-{id}.stderr", role.name()))
    }

    /// Spawns a worker; a lease worker gets a random mode (plain, half-exited, sibling
    /// threads, or both), drawn again for every incarnation.
    fn spawn(&mut self, role: Role, id: usize, inc: u64) -> Result<(Child, LeaseMode), String> {
        let mode = match role {
            Role::Lease => LeaseMode::all()[self.rng.below(LeaseMode::all().len() as u64) as usize],
            _ => LeaseMode::Plain,
        };
        let child = self.spawn_with(role, id, inc, false, mode)?;
        if role == Role::Lease {
            self.modes.entry(mode).or_default().started += 1;
        }
        Ok((child, mode))
    }

    fn spawn_with(
        &self,
        role: Role,
        id: usize,
        inc: u64,
        open_only: bool,
        lease_mode: LeaseMode,
    ) -> Result<Child, String> {
        let wo = WorkerOptions {
            role,
            dir: self.ctx.dir.clone(),
            seed: self.opts.seed,
            id,
            inc,
            open_only,
            lease_mode,
        };
        let path = self.err_path(role, id);
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        Command::new(&self.exe)
            .arg("torture-worker")
            .args(wo.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.exe.display()))
    }

    fn signal(child: &Child, sig: Signal) {
        // The child is not reaped yet, so its pid cannot have been reused.
        let _ = kill_process(Pid::from_child(child), sig);
    }

    /// Restarts due workers, resumes due paused workers, and notices unexpected exits.
    fn housekeeping(&mut self, now: Instant) -> Result<(), String> {
        for i in 0..self.procs.len() {
            let (role, id) = (self.procs[i].role, self.procs[i].id);
            match self.procs[i].state {
                State::Down(at) if at <= now => {
                    let inc = self.procs[i].inc + 1;
                    let (child, mode) = self.spawn(role, id, inc)?;
                    let p = &mut self.procs[i];
                    p.inc = inc;
                    p.mode = mode;
                    p.child = Some(child);
                    p.state = State::Running;
                    self.chaos.entry(role).or_default().restarts += 1;
                }
                State::Paused(until) if until <= now => {
                    if let Some(c) = &self.procs[i].child {
                        Self::signal(c, Signal::CONT);
                    }
                    self.procs[i].state = State::Running;
                }
                State::Running => {
                    let exited = match self.procs[i].child.as_mut().map(Child::try_wait) {
                        Some(Ok(Some(status))) => Some(status.to_string()),
                        Some(Err(e)) => Some(e.to_string()),
                        _ => None,
                    };
                    if let Some(status) = exited {
                        self.chaos.entry(role).or_default().crashes += 1;
                        self.ctx.violate(
                            "worker crash",
                            format_args!(
                                "{} worker {id} exited unexpectedly ({status}):\n    {}",
                                role.name(),
                                stderr_tail(&self.err_path(role, id))
                            ),
                        );
                        self.procs[i].child = None;
                        self.procs[i].state = State::Down(now + Duration::from_millis(10));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One chaos action on a random running worker (for the lease and the rwlock, half of
    /// the time a current holder).
    fn chaos(
        &mut self,
        now: Instant,
        lease: Option<&lease::Monitor>,
        rw: Option<&rwlock::Monitor>,
    ) {
        let running: Vec<usize> = (0..self.procs.len())
            .filter(|&i| self.procs[i].state == State::Running && self.procs[i].child.is_some())
            .collect();
        if running.is_empty() {
            return;
        }
        let mut victim = running[self.rng.below(running.len() as u64) as usize];
        let kill = self.rng.percent(KILL_PERCENT);
        let mut holder = false;
        let mut in_write = false;
        if let Some(m) = lease.filter(|_| self.procs[victim].role == Role::Lease)
            && self.rng.percent(50)
        {
            // Half of these wait (briefly) for a holder in the middle of a write.
            let writing = self.rng.percent(50);
            let found = m.holder(writing, Duration::from_millis(20));
            if let Some((pid, w)) = found
                && let Some(&h) = running.iter().find(|&&i| {
                    self.procs[i].role == Role::Lease && self.procs[i].pid() == Some(pid)
                })
            {
                victim = h;
                holder = true;
                in_write = w;
            }
        }
        if let Some(m) = rw.filter(|_| self.procs[victim].role == Role::Rwlock)
            && self.rng.percent(50)
        {
            let writing = self.rng.percent(50);
            if let Some(pid) = m.holder(writing)
                && let Some(&h) = running.iter().find(|&&i| {
                    self.procs[i].role == Role::Rwlock && self.procs[i].pid() == Some(pid)
                })
            {
                victim = h;
                holder = true;
                in_write = writing;
            }
        }
        let restart = Duration::from_millis(self.rng.range(RESTART_MS.0, RESTART_MS.1));
        let pause = Duration::from_millis(self.rng.range(PAUSE_MS.0, PAUSE_MS.1));
        let p = &mut self.procs[victim];
        let c = self.chaos.entry(p.role).or_default();
        let m = (p.role == Role::Lease).then(|| self.modes.entry(p.mode).or_default());
        if kill {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            p.state = State::Down(now + restart);
            c.kills += 1;
            c.holder_kills += u64::from(holder);
            c.write_kills += u64::from(in_write);
            if let Some(m) = m {
                m.kills += 1;
                m.holder_kills += u64::from(holder);
                m.write_kills += u64::from(in_write);
            }
            if in_write && self.opts.ident_churn {
                self.ident_churn(now, pause);
            }
        } else if let Some(child) = &p.child {
            Self::signal(child, Signal::STOP);
            p.state = State::Paused(now + pause);
            c.pauses += 1;
            c.holder_pauses += u64::from(holder);
            c.write_pauses += u64::from(in_write);
            if let Some(m) = m {
                m.pauses += 1;
            }
        }
    }

    /// `--ident-churn`: right after a holder died inside a write, stop the other lease
    /// workers and let 16 short-lived processes open the lease before anyone can take
    /// over. Each once took an entry of the lease's (then 16-entry) identity table and
    /// could evict a dead holder's entry (docs/RELIABILITY.md, fixed); a regression check.
    fn ident_churn(&mut self, now: Instant, pause: Duration) {
        let mut stopped = 0;
        for p in &mut self.procs {
            if p.role == Role::Lease
                && p.state == State::Running
                && let Some(c) = &p.child
            {
                Self::signal(c, Signal::STOP);
                p.state = State::Paused(now + pause);
                stopped += 1;
                self.modes.entry(p.mode).or_default().pauses += 1;
            }
        }
        let c = self.chaos.entry(Role::Lease).or_default();
        c.pauses += stopped;
        c.churns += 1;
        for i in 0..16 {
            if let Ok(mut child) = self.spawn_with(Role::Lease, 1000 + i, 0, true, LeaseMode::Plain)
            {
                let _ = child.wait();
            }
        }
    }

    fn live_workers(&self, role: Role) -> usize {
        self.procs
            .iter()
            .filter(|p| p.role == role && p.state == State::Running)
            .count()
    }

    fn progress_line(&self, elapsed: Duration, rw_ops: u64) -> String {
        let kills: u64 = self.chaos.values().map(|c| c.kills).sum();
        let pauses: u64 = self.chaos.values().map(|c| c.pauses).sum();
        format!(
            "torture: {:>4}s  ops lease={} heartbeat={} semaphore={} cell={} rwlock={rw_ops}  kills={kills} pauses={pauses}  violations={}",
            elapsed.as_secs(),
            self.ctx.stat(Stat::LeaseOps),
            self.ctx.stat(Stat::HbOps),
            self.ctx.stat(Stat::SemOps),
            self.ctx.stat(Stat::CellOps),
            self.ctx.violations()
        )
    }

    /// Resumes paused workers, sets STOP and waits for every worker to exit.
    fn stop_all(&mut self) {
        for p in &mut self.procs {
            if let (State::Paused(_), Some(c)) = (p.state, &p.child) {
                Self::signal(c, Signal::CONT);
                p.state = State::Running;
            }
        }
        self.ctx.set_flag(control::STOP);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            let mut waiting = 0;
            for i in 0..self.procs.len() {
                let (role, id) = (self.procs[i].role, self.procs[i].id);
                let Some(child) = self.procs[i].child.as_mut() else {
                    continue;
                };
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            self.ctx.violate(
                                "worker crash",
                                format_args!(
                                    "{} worker {id} failed at shutdown ({status}):\n    {}",
                                    role.name(),
                                    stderr_tail(&self.err_path(role, id))
                                ),
                            );
                        }
                        self.procs[i].child = None;
                    }
                    Ok(None) if Instant::now() >= deadline => {
                        self.ctx.violate(
                            "progress",
                            format_args!(
                                "{} worker {id} (pid {}) did not exit within {STOP_TIMEOUT:?} of STOP (hung)",
                                role.name(),
                                child.id()
                            ),
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        self.procs[i].child = None;
                        self.chaos.entry(role).or_default().hung += 1;
                    }
                    _ => waiting += 1,
                }
            }
            if waiting == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn work_dir(opts: &Options) -> Result<(PathBuf, bool), String> {
    let (dir, fresh) = match &opts.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("cxc-torture-{}", std::process::id())),
            true,
        ),
    };
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .next()
            .is_some()
    {
        return Err(format!("{} exists and is not empty", dir.display()));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok((dir, fresh))
}

/// `xtask torture-supervise`: the whole run. Exit code 1 on any violation.
pub(crate) fn supervise(opts: Options) -> ExitCode {
    match run(opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("torture: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(opts: Options) -> Result<ExitCode, String> {
    let (dir, fresh) = work_dir(&opts)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let roles = opts.roles.clone();
    eprintln!(
        "torture: seed {:#x}, {} s, {} workers per primitive ({}), dir {}",
        opts.seed,
        opts.seconds,
        opts.procs,
        roles
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(", "),
        dir.display()
    );
    eprintln!(
        "torture: reproduce with: cargo xtask torture {}",
        opts.to_args().join(" ")
    );
    let ctx = Ctx::create(&dir)?;
    let has = |r: Role| roles.contains(&r);
    let units = (opts.seconds as usize * 15_000).clamp(100_000, 16 << 20);
    if has(Role::Lease) {
        lease::setup(&dir)?;
    }
    if has(Role::Heartbeat) {
        heartbeat::setup(&dir, units)?;
    }
    if has(Role::Semaphore) {
        semaphore::setup(&dir, opts.procs)?;
    }
    if has(Role::Cell) {
        cell::setup(&dir)?;
    }
    if has(Role::Rwlock) {
        rwlock::setup(&dir, opts.procs)?;
    }
    let mut lease_mon = has(Role::Lease)
        .then(|| lease::Monitor::open(&dir))
        .transpose()?;
    let mut watch = has(Role::Heartbeat)
        .then(|| heartbeat::Watch::open(&dir))
        .transpose()?;
    let mut sem_mon = has(Role::Semaphore)
        .then(|| semaphore::Monitor::open(&dir))
        .transpose()?;
    let mut cell_mon = has(Role::Cell)
        .then(|| cell::Monitor::open(&dir))
        .transpose()?;
    let mut rw_mon = has(Role::Rwlock)
        .then(|| rwlock::Monitor::open(&dir))
        .transpose()?;

    let mut sup = Supervisor {
        rng: Rng::derive(opts.seed, 0, 0, 0),
        opts,
        ctx,
        exe,
        procs: Vec::new(),
        chaos: BTreeMap::new(),
        modes: BTreeMap::new(),
    };
    for &role in &roles {
        for id in 0..sup.opts.procs {
            let (child, mode) = sup.spawn(role, id, 0)?;
            sup.procs.push(Proc {
                role,
                id,
                inc: 0,
                mode,
                child: Some(child),
                state: State::Running,
            });
        }
    }

    let start = Instant::now();
    let deadline = start + Duration::from_secs(sup.opts.seconds);
    let mut next_chaos = start + Duration::from_millis(sup.rng.range(20, 2 * CHAOS_MEAN_MS));
    let mut next_report = start + Duration::from_secs(10);
    let mut next_slow = start;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if let Err(e) = sup.housekeeping(now) {
            for p in &mut sup.procs {
                if let Some(c) = p.child.as_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            return Err(e);
        }
        if now >= next_chaos {
            sup.chaos(now, lease_mon.as_ref(), rw_mon.as_ref());
            next_chaos = now + Duration::from_millis(sup.rng.range(20, 2 * CHAOS_MEAN_MS));
        }
        if let Some(w) = watch.as_mut() {
            w.step(&sup.ctx);
        }
        if now >= next_slow {
            next_slow = now + Duration::from_millis(20);
            if let Some(m) = lease_mon.as_mut() {
                let live = sup.live_workers(Role::Lease);
                m.check(&sup.ctx, live);
            }
            if let Some(m) = sem_mon.as_mut() {
                m.check(&sup.ctx);
            }
            if let Some(m) = cell_mon.as_mut() {
                m.check(&sup.ctx);
            }
            if let Some(m) = rw_mon.as_mut() {
                let live = sup.live_workers(Role::Rwlock);
                m.check(&sup.ctx, live);
            }
        }
        if now >= next_report {
            next_report = now + Duration::from_secs(10);
            let rw_ops = rw_mon.as_ref().map_or(0, rwlock::Monitor::ops);
            eprintln!("{}", sup.progress_line(now - start, rw_ops));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "torture: chaos over after {:?}; stopping workers",
        start.elapsed()
    );
    sup.stop_all();

    let ctx = &sup.ctx;
    let lease_report = lease_mon
        .map(|_| {
            let c = sup.chaos.get(&Role::Lease).copied().unwrap_or_default();
            lease::final_check(ctx, c.kills + c.crashes + c.hung)
        })
        .transpose()?;
    let hb_report = watch.as_mut().map(|w| w.finish(ctx)).transpose()?;
    let sem_report = sem_mon.as_mut().map(|m| m.final_check(ctx)).transpose()?;
    let cell_report = cell_mon.as_mut().map(|m| m.final_check(ctx)).transpose()?;
    let rw_report = rw_mon
        .as_mut()
        .map(|m| Ok::<_, String>((m.final_check(ctx, sup.opts.procs)?, m.figures())))
        .transpose()?;
    let reports = Reports {
        lease: lease_report,
        hb: hb_report,
        sem: sem_report,
        rw: rw_report,
    };
    let mut summary = summary(&sup, start.elapsed(), reports);
    if let Some(r) = &cell_report {
        summary = cell_summary(&sup.ctx, summary, r);
    }
    println!("{summary}");
    let violations = control::read_violations(&dir);
    let n = sup.ctx.violations();
    if n > 0 {
        println!("violations ({n}):");
        for v in violations.iter().take(30) {
            println!("  {v}");
        }
        println!(
            "torture: FAILED; files kept in {}; reproduce with: cargo xtask torture {}",
            dir.display(),
            sup.opts.to_args().join(" ")
        );
        return Ok(ExitCode::FAILURE);
    }
    if fresh && !sup.opts.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("torture: passed");
    Ok(ExitCode::SUCCESS)
}

/// The end-of-run reports of the primitives that ran.
struct Reports {
    lease: Option<lease::Report>,
    hb: Option<heartbeat::Report>,
    sem: Option<semaphore::Report>,
    rw: Option<(rwlock::Report, rwlock::Figures)>,
}

fn summary(sup: &Supervisor, elapsed: Duration, reports: Reports) -> String {
    use std::fmt::Write;
    let Reports { lease, hb, sem, rw } = reports;
    let ctx = &sup.ctx;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "torture summary: seed {:#x}, {} s chaos ({:.0} s total), {} workers per primitive",
        sup.opts.seed,
        sup.opts.seconds,
        elapsed.as_secs_f64(),
        sup.opts.procs
    );
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>6} {:>7} {:>8} {:>9} {:>9} {:>10}",
        "primitive", "ops", "kills", "pauses", "restarts", "takeovers", "reclaims", "violations"
    );
    let count = |role: Role| {
        ctx.stat(match role {
            Role::Lease => Stat::LeaseViolations,
            Role::Heartbeat => Stat::HbViolations,
            Role::Semaphore => Stat::SemViolations,
            Role::Cell => Stat::CellViolations,
            Role::Rwlock => Stat::RwlockViolations,
        })
    };
    let mut total = Chaos::default();
    let mut total_ops = 0;
    for &role in &sup.opts.roles {
        let c = sup.chaos.get(&role).copied().unwrap_or_default();
        let (ops, takeovers, reclaims) = match role {
            Role::Lease => (
                ctx.stat(Stat::LeaseOps),
                lease.as_ref().map_or(0, |r| r.takeovers),
                None,
            ),
            Role::Heartbeat => (
                ctx.stat(Stat::HbOps),
                hb.as_ref().map_or(0, |r| r.dead_slots),
                Some(hb.as_ref().map_or(0, |r| r.reclaimed_bits)),
            ),
            Role::Semaphore => (
                ctx.stat(Stat::SemOps),
                0,
                Some(sem.as_ref().map_or(0, |r| r.reclaimed_permits)),
            ),
            Role::Cell => (ctx.stat(Stat::CellOps), ctx.stat(Stat::CellTakeovers), None),
            Role::Rwlock => rw.as_ref().map_or((0, 0, Some(0)), |(r, _)| {
                (
                    r.reads + r.writes,
                    counter_of(&r.counters, "evicted_dead")
                        + counter_of(&r.counters, "evicted_stale"),
                    Some(counter_of(&r.counters, "reclaimed")),
                )
            }),
        };
        total_ops += ops;
        total.kills += c.kills;
        total.pauses += c.pauses;
        total.restarts += c.restarts;
        let _ = writeln!(
            s,
            "{:<10} {:>10} {:>6} {:>7} {:>8} {:>9} {:>9} {:>10}",
            role.name(),
            ops,
            c.kills,
            c.pauses,
            c.restarts,
            if role == Role::Semaphore {
                "-".to_string()
            } else {
                takeovers.to_string()
            },
            reclaims.map_or("-".to_string(), |r| r.to_string()),
            count(role)
        );
    }
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>6} {:>7} {:>8} {:>9} {:>9} {:>10}",
        "total",
        total_ops,
        total.kills,
        total.pauses,
        total.restarts,
        "",
        "",
        ctx.violations()
    );
    if let Some(r) = &lease {
        let c = sup.chaos.get(&Role::Lease).copied().unwrap_or_default();
        let _ = writeln!(
            s,
            "lease: {} claims ({} failed), {} owner writes + {} with_lease accepted, {} logged, final seq {}; \
             {} ops refused as fenced ({} by holders resumed after > grace), {} stale entries, {} A-B-A stale-claim probes; \
             {} torn-claim inheritances seen by workers; holder kills {} ({} inside a write, {} followed by identity churn) / pauses {} ({} inside a write); partial log records {}",
            ctx.stat(Stat::LeaseClaims),
            ctx.stat(Stat::LeaseClaimFail),
            ctx.stat(Stat::LeaseWrites),
            ctx.stat(Stat::LeaseWithLease),
            r.logged,
            r.final_seq,
            ctx.stat(Stat::LeaseFenced),
            ctx.stat(Stat::LeaseResumedFenced),
            ctx.stat(Stat::LeaseStaleEntry),
            ctx.stat(Stat::LeaseStaleProbes),
            ctx.stat(Stat::LeaseTornClaims),
            c.holder_kills,
            c.write_kills,
            c.churns,
            c.holder_pauses,
            c.write_pauses,
            r.partial_records,
        );
        let _ = writeln!(
            s,
            "  sibling releases by pid: {} ({} while the sibling was writing); claim_dead_owner {} + claim_exiting {} (at most {}: lease processes that died)",
            ctx.stat(Stat::LeaseSibReleases),
            ctx.stat(Stat::LeaseSibReleasesWriting),
            counter_of(&r.counters, "claim_dead_owner"),
            counter_of(&r.counters, "claim_exiting"),
            r.deaths,
        );
        for (mode, m) in &sup.modes {
            let _ = writeln!(
                s,
                "  lease {:<21} {:>5} started, {:>5} kills ({} of the holder, {} inside a write), {:>5} pauses",
                format!("{}:", mode.name()),
                m.started,
                m.kills,
                m.holder_kills,
                m.write_kills,
                m.pauses,
            );
        }
        let _ = writeln!(
            s,
            "  lease quarantine: quarantined {} quarantine_freed {} quarantine_reaped {} no_buffer {}",
            counter_of(&r.counters, "quarantined"),
            counter_of(&r.counters, "quarantine_freed"),
            counter_of(&r.counters, "quarantine_reaped"),
            counter_of(&r.counters, "no_buffer"),
        );
        let _ = writeln!(s, "  lease counters: {}", fmt_counters(&r.counters));
    }
    if let Some(r) = &hb {
        let _ = writeln!(
            s,
            "heartbeat: {} units handed out, {} done by workers ({} accepted but unrecorded, {} finished by the supervisor); \
             {} dead slots, {} bits reclaimed, {} units requeued, {} empty bits; {} registrations, {} fenced workers, {} completions refused",
            r.handed_out,
            r.done,
            r.accepted_unrecorded,
            r.finished_by_supervisor,
            r.dead_slots,
            r.reclaimed_bits,
            r.requeued,
            r.empty_bits,
            ctx.stat(Stat::HbRegister),
            ctx.stat(Stat::HbFenced),
            ctx.stat(Stat::HbRejected),
        );
        let _ = writeln!(s, "  heartbeat counters: {}", fmt_counters(&r.counters));
    }
    if let Some(r) = &sem {
        let _ = writeln!(
            s,
            "semaphore: max {} permits; {} acquired, {} timeouts; {} live checks ({} skipped), max in use seen {}; \
             {} permits reclaimed from dead holders ({} by the final reclaim_dead); final available {}/{}; \
             overflow_rejected {}, over_held {}",
            r.max_permits,
            ctx.stat(Stat::SemAcquired),
            ctx.stat(Stat::SemTimeouts),
            ctx.stat(Stat::SemChecks),
            ctx.stat(Stat::SemCheckSkipped),
            ctx.stat(Stat::SemMaxInUse),
            r.reclaimed_permits,
            r.final_reclaimed,
            r.final_available,
            r.max_permits,
            r.overflow_rejected,
            r.over_held,
        );
    }
    if let Some((r, f)) = &rw {
        let c = sup.chaos.get(&Role::Rwlock).copied().unwrap_or_default();
        let _ = writeln!(
            s,
            "rwlock: {} read and {} write sections logged and checked ({} fenced writer sections, {} partial log lines); \
             {} writes accepted, {} refused as fenced, {} unlocks refused, {} no-buffer; {} long holds (beating), {} beats refused; \
             {} try_* refused; max wait read {} ms, write {} ms; holder kills {} ({} of a writer) / pauses {} ({} of a writer); \
             final reclaim_dead {}",
            r.reads,
            r.writes,
            r.fenced_sections,
            r.partial_lines,
            f.accepted,
            f.refused,
            f.unlock_refused,
            f.no_buffer,
            f.long_holds,
            f.beats_refused,
            f.try_fail,
            f.max_read_wait_us / 1000,
            f.max_write_wait_us / 1000,
            c.holder_kills,
            c.write_kills,
            c.holder_pauses,
            c.write_pauses,
            r.final_reclaimed,
        );
        let _ = writeln!(s, "  rwlock counters: {}", fmt_counters(&r.counters));
    }
    let crashes: u64 = sup.chaos.values().map(|c| c.crashes).sum();
    let _ = write!(
        s,
        "violations: {} (worker crashes: {crashes}, other: {})",
        ctx.violations(),
        ctx.stat(Stat::OtherViolations)
    );
    s
}

/// The cell's summary line, inserted before the final violations line of `s`.
fn cell_summary(ctx: &Ctx, s: String, r: &cell::Report) -> String {
    let line = format!(
        "cell: {} stores, {} updates ({} refused as superseded: another writer published first), {} loads checked; \
         {} takeovers of dead or stalled writers; {} supervisor checks, {} supervisor stores (slowest {:?}, final {:?}), {} supervisor updates (slowest {:?})\n  cell counters: {}\n",
        ctx.stat(Stat::CellStores),
        ctx.stat(Stat::CellUpdates),
        ctx.stat(Stat::CellSuperseded),
        ctx.stat(Stat::CellLoads),
        ctx.stat(Stat::CellTakeovers),
        ctx.stat(Stat::CellChecks),
        r.supervisor_stores,
        r.slowest_store,
        r.final_store,
        r.supervisor_updates,
        r.slowest_update,
        fmt_counters(&r.counters),
    );
    match s.rfind("violations: ") {
        Some(i) => format!("{}{line}{}", &s[..i], &s[i..]),
        None => s + &line,
    }
}

fn counter_of(c: &[(&str, u64)], name: &str) -> u64 {
    c.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v)
}

fn fmt_counters(c: &[(&str, u64)]) -> String {
    c.iter()
        .filter(|(_, v)| *v != 0)
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

//! SharedRwLock torture: reader processes (two threads each) and writer processes take
//! read and write locks (blocking with a timeout, or `try_*`), hold them briefly (some
//! writers for longer than the grace, beating), while the chaos loop kills and pauses
//! them. A paused writer is evicted after the grace (50 ms) and fenced.
//!
//! Independent check: every process appends one line per critical section to its own log
//! file (one `write` per line, `O_APPEND`), with CLOCK_MONOTONIC times taken *inside*
//! the section (after the lock returned, before it is released). At the end the logs
//! are merged and checked:
//!
//! - **R1 exclusion**: no interval during which a writer provably held the lock overlaps
//!   any other section. A writer held the lock from its `start` up to the last time it
//!   was proven current: its `end` if its unlock was accepted, else the time taken just
//!   before its last accepted write or validated read (the accepting CAS came after it;
//!   eviction is permanent, so it was current up to there). An evicted writer's later
//!   time is not a section: it is fenced.
//! - **R2 torn payload**: every read sees the same token in all 8 words.
//! - **R5 fenced writes invisible**: no read ever sees the token of a write that was
//!   refused (`Lost`).
//! - **R6 no stale read**: a read that starts after an accepted write returned sees that
//!   write's token or a later one (tokens strictly increase).
//!
//! Live: a read or write lock not obtained within [`WEDGE`] is a violation (**R3**
//! wedged; for writers **R4** starved, as readers overlap all the time); the
//! supervisor flags a run in which no section completes for [`WEDGE`] (**R3**); at the
//! end, with every worker gone, the write lock and a read lock must be free at once.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc::{RwLockOptions, SharedRwLock, WriteGuardError};
use cxc_testkit::Rng;

use super::control::Ctx;
use super::shm::Words;

pub(crate) const FILE: &str = "rwlock.cxc";
const STATS_FILE: &str = "rwlock-stats.cxc";
const STATS_TAG: u64 = 0x5257_4c4b; // "RWLK"
/// The payload: the writer's token in every word (a torn copy shows as unequal words).
type P = [u64; 8];
/// Grace before a writer that makes no progress while others wait is evicted.
pub(crate) const GRACE: Duration = Duration::from_millis(50);
/// A lock not obtained within this long, or a run in which no section completes for
/// this long, is a violation.
pub(crate) const WEDGE: Duration = Duration::from_secs(10);
/// Reader threads per reader process.
const READER_THREADS: usize = 2;

/// Counter slots of the stats file (the per-thread state words follow them).
mod st {
    pub(super) const READS: usize = 0;
    pub(super) const WRITES: usize = 1;
    pub(super) const TRY_FAIL: usize = 2;
    pub(super) const WRITES_ACCEPTED: usize = 3;
    pub(super) const WRITES_REFUSED: usize = 4;
    pub(super) const UNLOCK_REFUSED: usize = 5;
    pub(super) const NO_BUFFER: usize = 6;
    pub(super) const LONG_HOLDS: usize = 7;
    pub(super) const BEATS_REFUSED: usize = 8;
    pub(super) const MAX_READ_WAIT_US: usize = 9;
    pub(super) const MAX_WRITE_WAIT_US: usize = 10;
    pub(super) const COUNTERS: usize = 16;
    /// First state word: `pid << 32 | 1 (reading) / 2 (writing)`, per worker thread.
    pub(super) const STATE: usize = COUNTERS;
}

const READING: u64 = 1;
const WRITING: u64 = 2;

/// How a worker takes one side of the lock.
struct Side {
    /// Share of `try_*` attempts (the rest wait up to [`WEDGE`]).
    try_percent: u64,
    /// The stats word of the longest wait, in µs.
    max_wait: usize,
    /// The invariant a wait past [`WEDGE`] violates.
    wedged: &'static str,
    kind: &'static str,
}

const READ: Side = Side {
    try_percent: 20,
    max_wait: st::MAX_READ_WAIT_US,
    wedged: "R3 wedged",
    kind: "read",
};

const WRITE: Side = Side {
    try_percent: 15,
    max_wait: st::MAX_WRITE_WAIT_US,
    wedged: "R4 writer starved",
    kind: "write",
};

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn state_slots(procs: usize) -> usize {
    procs * READER_THREADS
}

/// Whether worker `id` is a reader process (the others are writers that also read).
pub(crate) fn is_reader(id: usize) -> bool {
    id.is_multiple_of(2)
}

/// Creates the lock (holder table of 64, grace 50 ms) and the stats file.
pub(crate) fn setup(dir: &Path, procs: usize) -> Result<(), String> {
    let opts = RwLockOptions::default().grace(GRACE).holders(64);
    SharedRwLock::<P>::create_with(dir.join(FILE), [0; 8], &opts)
        .map_err(|e| format!("create rwlock: {e}"))?;
    Words::create(
        &dir.join(STATS_FILE),
        STATS_TAG,
        st::STATE + state_slots(procs),
    )?;
    Ok(())
}

fn log_path(dir: &Path, id: usize) -> std::path::PathBuf {
    dir.join(format!("rwlock-{id}.log"))
}

/// One worker thread's view: the lock, the shared stats, its log and state word.
struct Worker<'a> {
    ctx: &'a Ctx,
    lock: &'a SharedRwLock<P>,
    stats: &'a Words,
    log: &'a File,
    state: &'a AtomicU64,
    pid: u64,
}

impl Worker<'_> {
    fn bump(&self, i: usize) {
        self.stats.word(i).fetch_add(1, Ordering::Relaxed);
    }

    fn violate(&self, invariant: &str, msg: std::fmt::Arguments<'_>) {
        self.ctx.violate(invariant, msg);
    }

    fn line(&self, s: &str) {
        // One `write` per line: O_APPEND keeps lines whole; a kill lands between lines.
        let _ = (&*self.log).write_all(s.as_bytes());
    }

    fn set_state(&self, s: u64) {
        self.state.store(
            if s == 0 { 0 } else { self.pid << 32 | s },
            Ordering::SeqCst,
        );
    }

    fn torn(&self, v: &P, what: &str) {
        if v.iter().any(|x| *x != v[0]) {
            self.violate(
                "R2 torn payload",
                format_args!("{what} saw {v:x?} (words differ)"),
            );
        }
    }

    fn hold(&self, rng: &mut Rng) {
        match rng.below(100) {
            0..70 => {
                let until = Instant::now() + Duration::from_micros(rng.below(200));
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            70..96 => std::thread::sleep(Duration::from_micros(rng.range(200, 2_000))),
            _ => std::thread::sleep(Duration::from_micros(rng.range(2_000, 10_000))),
        }
    }

    /// Takes a guard: with `side.try_percent` % `try_now()` (a refusal is counted and
    /// ends the section after a short sleep), else `timed(WEDGE)` (not obtained: the
    /// side's violation); records the wait in the side's longest-wait word.
    fn obtain<G>(
        &self,
        rng: &mut Rng,
        side: &Side,
        try_now: impl FnOnce() -> Option<G>,
        timed: impl FnOnce(Duration) -> Option<G>,
    ) -> Option<G> {
        let t0 = Instant::now();
        let g = if rng.percent(side.try_percent) {
            let g = try_now();
            if g.is_none() {
                self.bump(st::TRY_FAIL);
                std::thread::sleep(Duration::from_micros(rng.below(500)));
            }
            g
        } else {
            let g = timed(WEDGE);
            if g.is_none() {
                let kind = side.kind;
                self.violate(
                    side.wedged,
                    format_args!("{kind} lock not obtained within {WEDGE:?}"),
                );
            }
            g
        }?;
        let waited = t0.elapsed().as_micros() as u64;
        self.stats
            .word(side.max_wait)
            .fetch_max(waited, Ordering::Relaxed);
        Some(g)
    }

    fn read_section(&self, rng: &mut Rng) {
        let lock = self.lock;
        let Some(g) = self.obtain(rng, &READ, || lock.try_read(), |t| lock.read_timeout(t)) else {
            return;
        };
        self.set_state(READING);
        let start = now_ns();
        let v = g.get();
        self.torn(&v, "a reader");
        self.hold(rng);
        let end = now_ns();
        self.set_state(0);
        drop(g);
        self.bump(st::READS);
        self.line(&format!("R {} {start} {end} {} .\n", self.pid, v[0]));
    }

    fn write_section(&self, rng: &mut Rng) {
        let lock = self.lock;
        let Some(g) = self.obtain(rng, &WRITE, || lock.try_write(), |t| lock.write_timeout(t))
        else {
            return;
        };
        self.set_state(WRITING);
        let start = now_ns();
        let token = g.token();
        // `held`: the last time this writer is proven to have held the lock.
        let mut held = 0;
        let before_read = now_ns();
        let seen = match g.read() {
            Ok(v) => {
                self.torn(&v, "a writer");
                held = before_read;
                v[0]
            }
            Err(_) => u64::MAX,
        };
        if rng.percent(3) {
            // Longer than the grace: only beating keeps the lock.
            self.bump(st::LONG_HOLDS);
            let until = Instant::now() + Duration::from_millis(rng.range(60, 150));
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                if g.beat().is_err() {
                    self.bump(st::BEATS_REFUSED);
                    break;
                }
            }
        } else {
            self.hold(rng);
        }
        let before_write = now_ns();
        let (wrote, wafter) = match g.write([token; 8]) {
            Ok(()) => {
                held = before_write;
                self.bump(st::WRITES_ACCEPTED);
                (1, now_ns())
            }
            Err(WriteGuardError::Lost { .. }) => {
                self.bump(st::WRITES_REFUSED);
                (0, 0)
            }
            Err(_) => {
                self.bump(st::NO_BUFFER);
                (3, 0)
            }
        };
        if rng.percent(50) {
            self.hold(rng);
        }
        let end = now_ns();
        self.set_state(0);
        let unlocked = g.unlock().is_ok();
        if unlocked {
            held = end;
        } else {
            self.bump(st::UNLOCK_REFUSED);
        }
        self.bump(st::WRITES);
        let seen = if seen == u64::MAX {
            "-".to_string()
        } else {
            seen.to_string()
        };
        self.line(&format!(
            "W {} {start} {held} {token} {seen} {wrote} {} {wafter} .\n",
            self.pid,
            u8::from(unlocked)
        ));
    }
}

/// A worker process: readers run two reader threads, writers one thread that writes
/// 80 % of the time and reads otherwise.
pub(crate) fn worker(ctx: &Ctx, rng: Rng, id: usize) -> Result<(), String> {
    let lock =
        SharedRwLock::<P>::open(ctx.dir.join(FILE)).map_err(|e| format!("open rwlock: {e}"))?;
    let stats = Words::open(&ctx.dir.join(STATS_FILE), STATS_TAG)?;
    let path = log_path(&ctx.dir, id);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let pid = u64::from(std::process::id());
    let threads = if is_reader(id) { READER_THREADS } else { 1 };
    // One control handle per thread (a handle counts its own violations, unshared).
    let mut per_thread = Vec::with_capacity(threads);
    for t in 0..threads {
        let c = Ctx::open(&ctx.dir, format!("{} thread {t}", ctx.who()))?;
        per_thread.push((c, Rng::derive(rng.seed(), 0x5257, id as u64, t as u64)));
    }
    std::thread::scope(|s| {
        for (t, (tctx, mut rng)) in per_thread.into_iter().enumerate() {
            let lock = &lock;
            let (stats, log) = (&stats, &log);
            s.spawn(move || {
                let w = Worker {
                    ctx: &tctx,
                    lock,
                    stats,
                    log,
                    state: stats.word(st::STATE + id * READER_THREADS + t),
                    pid,
                };
                while !tctx.stopping() {
                    if is_reader(id) || rng.percent(20) {
                        w.read_section(&mut rng);
                    } else {
                        w.write_section(&mut rng);
                    }
                    std::thread::sleep(Duration::from_micros(rng.below(300)));
                }
            });
        }
    });
    Ok(())
}

/// Rwlock figures for the summary.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) partial_lines: u64,
    pub(crate) fenced_sections: u64,
    pub(crate) counters: Vec<(&'static str, u64)>,
    pub(crate) final_reclaimed: u32,
}

/// One logged section, as the checker uses it.
#[derive(Debug, Clone, Copy)]
struct Interval {
    start: u64,
    end: u64,
    write: bool,
    pid: u32,
}

/// The supervisor's view: progress watch, holders for the chaos loop, end-of-run check.
pub(crate) struct Monitor {
    stats: Words,
    dir: std::path::PathBuf,
    last_sections: u64,
    last_progress: Instant,
}

impl Monitor {
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        Ok(Monitor {
            stats: Words::open(&dir.join(STATS_FILE), STATS_TAG)?,
            dir: dir.to_path_buf(),
            last_sections: 0,
            last_progress: Instant::now(),
        })
    }

    /// Sections completed so far (reads + writes).
    pub(crate) fn ops(&self) -> u64 {
        self.stat(st::READS) + self.stat(st::WRITES)
    }

    fn stat(&self, i: usize) -> u64 {
        self.stats.word(i).load(Ordering::Relaxed)
    }

    fn violate(&self, ctx: &Ctx, invariant: &str, msg: std::fmt::Arguments<'_>) {
        ctx.violate(invariant, msg);
    }

    /// The pid of a process holding the lock (`writing`: the write lock), if any.
    pub(crate) fn holder(&self, writing: bool) -> Option<u32> {
        let want = if writing { WRITING } else { READING };
        (st::STATE..self.stats.len())
            .map(|i| self.stats.word(i).load(Ordering::SeqCst))
            .find(|w| w & 0xFFFF_FFFF == want)
            .map(|w| (w >> 32) as u32)
    }

    /// Live check: some section must complete within [`WEDGE`] while workers run.
    pub(crate) fn check(&mut self, ctx: &Ctx, live_workers: usize) {
        let now = Instant::now();
        let n = self.ops();
        if n != self.last_sections || live_workers == 0 {
            self.last_sections = n;
            self.last_progress = now;
        } else if now.duration_since(self.last_progress) >= WEDGE {
            self.violate(
                ctx,
                "R3 wedged",
                format_args!(
                    "no read or write section completed for {WEDGE:?} with {live_workers} workers running"
                ),
            );
            self.last_progress = now;
        }
    }

    /// After every worker exited: the lock is free, and the logs pass R1, R5 and R6.
    pub(crate) fn final_check(&mut self, ctx: &Ctx, procs: usize) -> Result<Report, String> {
        let lock = SharedRwLock::<P>::open(self.dir.join(FILE))
            .map_err(|e| format!("open rwlock: {e}"))?;
        let final_reclaimed = lock.reclaim_dead();
        match lock.write_timeout(Duration::from_secs(3)) {
            Some(g) => {
                if let Err(e) = g.unlock() {
                    self.violate(ctx, "R3 wedged", format_args!("final unlock refused: {e}"));
                }
            }
            None => self.violate(
                ctx,
                "R3 wedged",
                format_args!("with every worker gone, the write lock was not free within 3 s"),
            ),
        }
        if lock.read_timeout(Duration::from_secs(1)).is_none() {
            self.violate(
                ctx,
                "R3 wedged",
                format_args!("with every worker gone, a read lock was not free within 1 s"),
            );
        }
        let mut report = self.check_logs(ctx, procs)?;
        report.counters = lock.counters();
        report.final_reclaimed = final_reclaimed;
        Ok(report)
    }

    fn check_logs(&self, ctx: &Ctx, procs: usize) -> Result<Report, String> {
        let mut report = Report::default();
        let mut sections: Vec<Interval> = Vec::new();
        // (time the write returned, token) of accepted writes; refused tokens.
        let mut accepted: Vec<(u64, u64)> = Vec::new();
        let mut refused: std::collections::HashSet<u64> = std::collections::HashSet::new();
        // (start, token seen) of every read (readers' and writers' validated reads).
        let mut seen: Vec<(u64, u64, u32)> = Vec::new();
        for id in 0..procs {
            let path = log_path(&self.dir, id);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("read {}: {e}", path.display())),
            };
            for l in text.lines() {
                let f: Vec<&str> = l.split(' ').collect();
                let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
                match (f.first(), f.last()) {
                    (Some(&"R"), Some(&".")) if f.len() == 6 => {
                        let (Some(pid), Some(start), Some(end), Some(tok)) =
                            (num(1), num(2), num(3), num(4))
                        else {
                            report.partial_lines += 1;
                            continue;
                        };
                        report.reads += 1;
                        sections.push(Interval {
                            start,
                            end,
                            write: false,
                            pid: pid as u32,
                        });
                        seen.push((start, tok, pid as u32));
                    }
                    (Some(&"W"), Some(&".")) if f.len() == 10 => {
                        let (Some(pid), Some(start), Some(held), Some(token)) =
                            (num(1), num(2), num(3), num(4))
                        else {
                            report.partial_lines += 1;
                            continue;
                        };
                        let (wrote, unlocked, wafter) = (num(6), num(7), num(8));
                        report.writes += 1;
                        if held >= start {
                            sections.push(Interval {
                                start,
                                end: held,
                                write: true,
                                pid: pid as u32,
                            });
                        }
                        if let Some(s) = num(5) {
                            seen.push((start, s, pid as u32));
                        }
                        match wrote {
                            Some(1) => accepted.push((wafter.unwrap_or(u64::MAX), token)),
                            Some(0) => {
                                refused.insert(token);
                            }
                            _ => {}
                        }
                        if unlocked == Some(0) {
                            report.fenced_sections += 1;
                        }
                    }
                    _ => report.partial_lines += 1,
                }
            }
        }
        // R1: sweep in start order; an overlap with a writer shows as a start before the
        // latest end of an earlier section (a writer starting) or of an earlier writer.
        // (Times are taken inside the sections, so touching ends are not overlaps.)
        sections.sort_by_key(|s| (s.start, s.end));
        let mut any: Option<Interval> = None;
        let mut writer: Option<Interval> = None;
        let mut r1 = 0u64;
        for s in &sections {
            let clash = if s.write {
                any.filter(|a| s.start < a.end)
            } else {
                writer.filter(|w| s.start < w.end)
            };
            if let Some(o) = clash {
                r1 += 1;
                if r1 <= 10 {
                    self.violate(
                        ctx,
                        "R1 exclusion",
                        format_args!(
                            "{} pid {} [{}, {}] overlaps {} pid {} [{}, {}]",
                            if o.write { "writer" } else { "reader" },
                            o.pid,
                            o.start,
                            o.end,
                            if s.write { "writer" } else { "reader" },
                            s.pid,
                            s.start,
                            s.end
                        ),
                    );
                }
            }
            if any.is_none_or(|a| s.end > a.end) {
                any = Some(*s);
            }
            if s.write && writer.is_none_or(|w| s.end > w.end) {
                writer = Some(*s);
            }
        }
        self.more(ctx, "R1 exclusion", r1);
        // R5: a refused write's token is never seen.
        let mut r5 = 0u64;
        for &(start, tok, pid) in &seen {
            if refused.contains(&tok) {
                r5 += 1;
                if r5 <= 10 {
                    self.violate(
                        ctx,
                        "R5 fenced write visible",
                        format_args!(
                            "pid {pid} read token {tok} at {start}, whose write was refused"
                        ),
                    );
                }
            }
        }
        self.more(ctx, "R5 fenced write visible", r5);
        // R6: a read starting after an accepted write returned sees that token or later.
        accepted.sort_unstable();
        seen.sort_unstable();
        let (mut i, mut newest, mut r6) = (0, 0u64, 0u64);
        for &(start, tok, pid) in &seen {
            while i < accepted.len() && accepted[i].0 < start {
                newest = newest.max(accepted[i].1);
                i += 1;
            }
            if tok < newest {
                r6 += 1;
                if r6 <= 10 {
                    self.violate(
                        ctx,
                        "R6 stale read",
                        format_args!(
                            "pid {pid} read token {tok} at {start}, after the write of token {newest} returned"
                        ),
                    );
                }
            }
        }
        self.more(ctx, "R6 stale read", r6);
        Ok(report)
    }

    /// One violation for the cases of `invariant` beyond the 10 listed.
    fn more(&self, ctx: &Ctx, invariant: &str, n: u64) {
        if n > 10 {
            self.violate(
                ctx,
                invariant,
                format_args!("{} more cases not listed", n - 10),
            );
        }
    }

    /// Counter for the summary.
    pub(crate) fn figures(&self) -> Figures {
        Figures {
            try_fail: self.stat(st::TRY_FAIL),
            accepted: self.stat(st::WRITES_ACCEPTED),
            refused: self.stat(st::WRITES_REFUSED),
            unlock_refused: self.stat(st::UNLOCK_REFUSED),
            no_buffer: self.stat(st::NO_BUFFER),
            long_holds: self.stat(st::LONG_HOLDS),
            beats_refused: self.stat(st::BEATS_REFUSED),
            max_read_wait_us: self.stat(st::MAX_READ_WAIT_US),
            max_write_wait_us: self.stat(st::MAX_WRITE_WAIT_US),
        }
    }
}

/// Live figures of the run (from the stats file).
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) try_fail: u64,
    pub(crate) accepted: u64,
    pub(crate) refused: u64,
    pub(crate) unlock_refused: u64,
    pub(crate) no_buffer: u64,
    pub(crate) long_holds: u64,
    pub(crate) beats_refused: u64,
    pub(crate) max_read_wait_us: u64,
    pub(crate) max_write_wait_us: u64,
}

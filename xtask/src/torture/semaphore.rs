//! Semaphore torture: workers acquire one or two permits of a `SharedSemaphore` (try or
//! with a timeout), hold them briefly and release them, while the chaos loop kills and
//! pauses them; dead holders' permits come back through blocked acquirers and
//! `reclaim_dead`.
//!
//! In-use accounting: each worker id has a record `(pid, version, count)` in a shared
//! file, incremented *after* an acquire and decremented *before* a release, so a record
//! never over-counts what its process holds. The live check takes a consistent snapshot
//! of all records (double collect: two identical passes, versions rule out ABA), drops
//! the records of processes that are gone (by pid + start time; a stopped process is
//! alive and keeps its permits), and requires the sum to be at most `max_permits` (S1).
//! At the end, after every worker exited, `reclaim_dead` must bring `available()` back
//! to `max_permits()` (S4), no release may have been refused as an overflow, and one more
//! release must be refused (S2).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc::SharedSemaphore;
use cxc_mmf::identity::{ProcStatus, proc_status};

use super::control::{Ctx, Stat};
use super::shm::Words;
use cxc_testkit::Rng;

pub(crate) const FILE: &str = "semaphore.cxc";
const RECORDS_FILE: &str = "sem-records.cxc";
const RECORDS_TAG: u64 = 0x5345_4d41; // "SEMA"
/// Head word 0 of the records file: max permits.
const MAX: usize = 0;

/// Permits for `procs` workers: contended, but not a mutex.
fn max_permits(procs: usize) -> u32 {
    (procs as u32 / 2).max(2)
}

fn pack(pid: u32, version: u64, count: u64) -> u64 {
    u64::from(pid) << 32 | (version & 0xFF_FFFF) << 8 | (count & 0xFF)
}

fn unpack(w: u64) -> (u32, u64, u64) {
    ((w >> 32) as u32, (w >> 8) & 0xFF_FFFF, w & 0xFF)
}

/// Creates the semaphore (all permits available) and the records file.
pub(crate) fn setup(dir: &Path, procs: usize) -> Result<(), String> {
    let max = max_permits(procs);
    SharedSemaphore::create(dir.join(FILE), max, max)
        .map_err(|e| format!("create semaphore: {e}"))?;
    let records = Words::create(&dir.join(RECORDS_FILE), RECORDS_TAG, 2 * procs)?;
    records.head(MAX).store(u64::from(max), Ordering::Release);
    Ok(())
}

/// The shared records, and the consistent-snapshot check over them.
struct Records {
    words: Words,
    max: u64,
}

impl Records {
    fn open(dir: &Path) -> Result<Self, String> {
        let words = Words::open(&dir.join(RECORDS_FILE), RECORDS_TAG)?;
        let max = words.head(MAX).load(Ordering::Acquire);
        Ok(Records { words, max })
    }

    fn workers(&self) -> usize {
        self.words.len() / 2
    }

    /// Permits held by live processes at one instant (a lower bound), or `None` if the
    /// records kept changing.
    fn in_use(&self) -> Option<u64> {
        let n = self.workers();
        let mut a = vec![0u64; n];
        let mut starts = vec![0u64; n];
        for _ in 0..16 {
            for (i, v) in a.iter_mut().enumerate() {
                *v = self.words.word(2 * i).load(Ordering::SeqCst);
            }
            for (i, s) in starts.iter_mut().enumerate() {
                *s = self.words.word(2 * i + 1).load(Ordering::SeqCst);
            }
            let same = (0..n).all(|i| self.words.word(2 * i).load(Ordering::SeqCst) == a[i]);
            if !same {
                std::hint::spin_loop();
                continue;
            }
            // Every record held its value `a[i]` at one instant between the two passes.
            // A process alive now was alive then; a record of a process that is gone is
            // dropped (its permits may have been reclaimed legitimately).
            let sum = a
                .iter()
                .zip(&starts)
                .filter_map(|(&w, &start)| {
                    let (pid, _, count) = unpack(w);
                    let alive = count > 0
                        && matches!(proc_status(pid), ProcStatus::Live { start_time } if start_time == start);
                    alive.then_some(count)
                })
                .sum();
            return Some(sum);
        }
        None
    }

    fn check(&self, ctx: &Ctx) {
        match self.in_use() {
            Some(n) => {
                ctx.bump(Stat::SemChecks, 1);
                ctx.max(Stat::SemMaxInUse, n);
                if n > self.max {
                    ctx.violate(
                        "S1 max permits",
                        format_args!(
                            "{n} permits held by live processes at once, max_permits is {}",
                            self.max
                        ),
                    );
                }
            }
            None => ctx.bump(Stat::SemCheckSkipped, 1),
        }
    }
}

/// A worker process.
pub(crate) fn worker(ctx: &Ctx, mut rng: Rng, id: usize) -> Result<(), String> {
    let sem =
        SharedSemaphore::open(ctx.dir.join(FILE)).map_err(|e| format!("open semaphore: {e}"))?;
    let records = Records::open(&ctx.dir)?;
    if u64::from(sem.max_permits()) != records.max {
        ctx.violate(
            "S3 max_permits in the file",
            format_args!(
                "opened with max_permits {}, created with {}",
                sem.max_permits(),
                records.max
            ),
        );
    }
    let me = (
        cxc_mmf::identity::current_pid(),
        cxc_mmf::identity::self_start_time(),
    );
    let (main, start) = (records.words.word(2 * id), records.words.word(2 * id + 1));
    let mut version = unpack(main.load(Ordering::Acquire)).1 + 1;
    // Start word first, then the main word: a reader that sees our pid sees our start.
    start.store(me.1, Ordering::SeqCst);
    main.store(pack(me.0, version, 0), Ordering::SeqCst);
    let mut set = |count: usize| {
        version += 1;
        main.store(pack(me.0, version, count as u64), Ordering::SeqCst);
    };
    while !ctx.stopping() {
        ctx.bump(Stat::SemOps, 1);
        let want = if rng.percent(20) { 2 } else { 1 };
        let mut permits = Vec::with_capacity(2);
        for _ in 0..want {
            let p = if rng.percent(40) {
                sem.try_acquire()
            } else {
                sem.acquire_timeout(Duration::from_micros(rng.range(500, 30_000)))
            };
            match p {
                Some(p) => {
                    permits.push(p);
                    // After the acquire: the record never over-counts.
                    set(permits.len());
                    ctx.bump(Stat::SemAcquired, 1);
                    records.check(ctx);
                }
                None => ctx.bump(Stat::SemTimeouts, 1),
            }
        }
        let hold = match rng.below(100) {
            0..70 => rng.below(500),
            70..97 => rng.range(500, 3_000),
            _ => rng.range(3_000, 20_000),
        };
        std::thread::sleep(Duration::from_micros(hold));
        while let Some(p) = permits.pop() {
            // Before the release: the record never over-counts.
            set(permits.len());
            drop(p);
        }
        std::thread::sleep(Duration::from_micros(rng.below(300)));
    }
    Ok(())
}

/// Semaphore figures for the summary.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) max_permits: u32,
    pub(crate) reclaimed_permits: u64,
    pub(crate) final_reclaimed: u32,
    pub(crate) final_available: u32,
    pub(crate) overflow_rejected: u64,
    pub(crate) over_held: u64,
}

/// The supervisor's view: periodic live checks and the end-of-run check.
pub(crate) struct Monitor {
    records: Records,
    dir: std::path::PathBuf,
}

impl Monitor {
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        Ok(Monitor {
            records: Records::open(dir)?,
            dir: dir.to_path_buf(),
        })
    }

    pub(crate) fn check(&mut self, ctx: &Ctx) {
        self.records.check(ctx);
    }

    /// After every worker exited.
    pub(crate) fn final_check(&mut self, ctx: &Ctx) -> Result<Report, String> {
        let sem = SharedSemaphore::open(self.dir.join(FILE))
            .map_err(|e| format!("open semaphore: {e}"))?;
        let final_reclaimed = sem.reclaim_dead();
        let available = sem.available();
        if available != sem.max_permits() {
            ctx.violate(
                "S4 reclaim",
                format_args!(
                    "after every worker exited and reclaim_dead returned {final_reclaimed}, available() is {available}, max_permits() is {}",
                    sem.max_permits()
                ),
            );
        }
        let stats = sem.stats();
        if stats.overflow_rejected != 0 {
            ctx.violate(
                "S2 release",
                format_args!(
                    "{} releases of held permits were refused as overflows",
                    stats.overflow_rejected
                ),
            );
        }
        // S2: with every permit back, one more release must be refused (and change
        // nothing): the count never exceeds max_permits.
        if sem.release() {
            ctx.violate(
                "S2 release",
                format_args!(
                    "release() with all {} permits available was accepted (available now {})",
                    sem.max_permits(),
                    sem.available()
                ),
            );
        }
        Ok(Report {
            max_permits: sem.max_permits(),
            reclaimed_permits: stats.reclaimed_permits,
            final_reclaimed,
            final_available: available,
            overflow_rejected: stats.overflow_rejected,
            over_held: stats.over_held,
        })
    }
}

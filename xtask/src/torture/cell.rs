//! `SharedCell` torture: every worker process stores and updates a 48-byte sealed value
//! (five words derived from one tag, plus a checksum) and loads it in bursts, while the
//! chaos loop kills and pauses them, mid-store or not.
//!
//! Invariants checked live, by every worker and by the supervisor:
//! - **C1 whole value**: every loaded value (and the value an `update` closure is given)
//!   is one a writer stored whole: its words match the tag and the checksum.
//! - **C2 no going back**: a writer's stores are published in order, so a loader that saw
//!   a writer's `n`-th store never loads an earlier one of the same writer incarnation.
//! - **C3 progress**: a store by the supervisor completes within [`STORE_BOUND`] while
//!   workers are stopped or killed mid-store (a stopped writer never wedges the cell),
//!   and an update by the supervisor within [`UPDATE_BOUND`]: its stall timeout is
//!   [`SUPERVISOR_STALL`], longer than the bound, so an update-claim holder that was
//!   killed must be judged dead by the OS, not waited out (pauses are 100–400 ms).
//!
//! At the end (every worker exited): a store completes at once and is loaded back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc::{SharedCell, WriteError, Written};

use super::control::{Ctx, Stat};
use cxc_testkit::Rng;

pub(crate) const FILE: &str = "cell.cxc";
/// A store by the supervisor must complete within this, whatever the workers do.
const STORE_BOUND: Duration = Duration::from_millis(500);
/// An update by the supervisor must complete within this.
const UPDATE_BOUND: Duration = Duration::from_millis(1000);
/// The supervisor's stall timeout (longer than `UPDATE_BOUND`).
const SUPERVISOR_STALL: Duration = Duration::from_secs(2);
/// The supervisor stores, then updates, every this often.
const SUPERVISOR_STORE_EVERY: Duration = Duration::from_millis(100);
/// The supervisor's writer id in a tag.
const SUPERVISOR_ID: u64 = 0xFF;

type Value = [u64; 6];

/// Tag: `id << 56 | incarnation << 40 | n` (n counts the writer's stores).
fn tag(id: u64, inc: u64, n: u64) -> u64 {
    id << 56 | (inc & 0xFFFF) << 40 | (n & 0xFF_FFFF_FFFF)
}

/// The writer part of a tag (id and incarnation) and its store number.
fn split(tag: u64) -> (u64, u64) {
    (tag >> 40, tag & 0xFF_FFFF_FFFF)
}

/// Five words derived from `t` and their checksum: a torn or mixed copy fails the check.
fn sealed(t: u64) -> Value {
    let mut w = [
        t,
        t ^ 0x5555_aaaa_5555_aaaa,
        t.rotate_left(17),
        !t,
        t.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        0,
    ];
    w[5] = w[..5].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x).wrapping_mul(0x100_0000_01b3)
    });
    w
}

fn intact(v: &Value) -> bool {
    sealed(v[0]) == *v
}

/// A loader's C1/C2 checks.
#[derive(Default)]
struct Loader {
    /// Per writer incarnation: the highest store number loaded.
    last: HashMap<u64, u64>,
}

impl Loader {
    fn check(&mut self, ctx: &Ctx, v: &Value, what: &str) {
        if !intact(v) {
            ctx.violate(
                "C1 whole value",
                format_args!("{what} returned a torn value {v:x?}"),
            );
            return;
        }
        let (writer, n) = split(v[0]);
        let last = self.last.entry(writer).or_insert(0);
        if n < *last {
            ctx.violate(
                "C2 no going back",
                format_args!(
                    "{what} returned store {n} of writer {writer:#x} after its store {}",
                    *last
                ),
            );
        } else {
            *last = n;
        }
    }
}

/// Creates the cell.
pub(crate) fn setup(dir: &Path) -> Result<(), String> {
    SharedCell::create(dir.join(FILE), sealed(tag(SUPERVISOR_ID, 0, 0)))
        .map(drop)
        .map_err(|e| format!("create cell: {e}"))
}

fn note(ctx: &Ctx, w: Written) {
    if w.abandoned.is_some() {
        ctx.bump(Stat::CellTakeovers, 1);
    }
}

/// A worker process: stores (70 %), updates (10 %) and bursts of loads (20 %).
pub(crate) fn worker(ctx: &Ctx, mut rng: Rng, id: usize, inc: u64) -> Result<(), String> {
    let cell =
        SharedCell::<Value>::open(ctx.dir.join(FILE)).map_err(|e| format!("open cell: {e}"))?;
    let mut loader = Loader::default();
    let mut n = 0u64;
    while !ctx.stopping() {
        let ops = rng.range(50, 500);
        match rng.below(100) {
            0..70 => {
                for _ in 0..ops {
                    n += 1;
                    match cell.store(sealed(tag(id as u64, inc, n))) {
                        Ok(w) => note(ctx, w),
                        Err(e) => ctx.violate("C3 progress", format_args!("store failed: {e}")),
                    }
                }
                ctx.bump(Stat::CellStores, ops);
            }
            70..80 => {
                let mut superseded = 0;
                for _ in 0..ops {
                    n += 1;
                    let mut given = None;
                    let r = cell.update(|v| {
                        given = Some(*v);
                        *v = sealed(tag(id as u64, inc, n));
                    });
                    if let Some(g) = given {
                        loader.check(ctx, &g, "the value given to update");
                    }
                    match r {
                        Ok(w) => note(ctx, w),
                        // Another writer published between this update's read and its
                        // publication (a store, or an updater that superseded this one
                        // while it was stopped): the result was discarded, as documented.
                        Err(WriteError::Superseded) => superseded += 1,
                        Err(e) => ctx.violate("C3 progress", format_args!("update failed: {e}")),
                    }
                }
                ctx.bump(Stat::CellUpdates, ops);
                ctx.bump(Stat::CellSuperseded, superseded);
            }
            _ => {
                let ops = ops * 20;
                for _ in 0..ops {
                    let v = cell.load();
                    loader.check(ctx, &v, "load");
                }
                ctx.bump(Stat::CellLoads, ops);
            }
        }
        ctx.bump(Stat::CellOps, 1);
    }
    Ok(())
}

/// Cell figures for the summary.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) supervisor_stores: u64,
    pub(crate) slowest_store: Duration,
    pub(crate) supervisor_updates: u64,
    pub(crate) slowest_update: Duration,
    pub(crate) final_store: Duration,
    pub(crate) counters: Vec<(&'static str, u64)>,
}

/// The supervisor's view: a load (C1, C2) every check and a timed store (C3) every
/// [`SUPERVISOR_STORE_EVERY`].
pub(crate) struct Monitor {
    cell: SharedCell<Value>,
    dir: PathBuf,
    loader: Loader,
    n: u64,
    next_store: Instant,
    slowest: Duration,
    updates: u64,
    slowest_update: Duration,
}

impl Monitor {
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        let mut cell = SharedCell::open(dir.join(FILE)).map_err(|e| format!("open cell: {e}"))?;
        cell.set_stall_timeout(SUPERVISOR_STALL);
        Ok(Monitor {
            cell,
            dir: dir.to_path_buf(),
            loader: Loader::default(),
            n: 0,
            next_store: Instant::now(),
            slowest: Duration::ZERO,
            updates: 0,
            slowest_update: Duration::ZERO,
        })
    }

    fn update(&mut self, ctx: &Ctx) {
        self.n += 1;
        let (n, t) = (self.n, Instant::now());
        let mut given = None;
        let r = self.cell.update(|v| {
            given = Some(*v);
            *v = sealed(tag(SUPERVISOR_ID, 0, n));
        });
        let took = t.elapsed();
        if let Some(g) = given {
            self.loader
                .check(ctx, &g, "the value given to the supervisor's update");
        }
        match r {
            Ok(w) => note(ctx, w),
            Err(WriteError::Superseded) => {}
            Err(e) => ctx.violate("C3 progress", format_args!("supervisor update failed: {e}")),
        }
        if took > UPDATE_BOUND {
            ctx.violate(
                "C3 progress",
                format_args!("a supervisor update took {took:?} (bound {UPDATE_BOUND:?})"),
            );
        }
        self.updates += 1;
        self.slowest_update = self.slowest_update.max(took);
    }

    fn store(&mut self, ctx: &Ctx) -> Duration {
        self.n += 1;
        let t = Instant::now();
        let r = self.cell.store(sealed(tag(SUPERVISOR_ID, 0, self.n)));
        let took = t.elapsed();
        match r {
            Ok(w) => note(ctx, w),
            Err(e) => ctx.violate("C3 progress", format_args!("supervisor store failed: {e}")),
        }
        if took > STORE_BOUND {
            ctx.violate(
                "C3 progress",
                format_args!("a supervisor store took {took:?} (bound {STORE_BOUND:?})"),
            );
        }
        self.slowest = self.slowest.max(took);
        took
    }

    pub(crate) fn check(&mut self, ctx: &Ctx) {
        let v = self.cell.load();
        self.loader.check(ctx, &v, "supervisor load");
        ctx.bump(Stat::CellChecks, 1);
        if Instant::now() >= self.next_store {
            self.store(ctx);
            self.update(ctx);
            self.next_store = Instant::now() + SUPERVISOR_STORE_EVERY;
        }
    }

    /// After every worker exited (or was killed): a store completes at once and is
    /// loaded back; the file opens again.
    pub(crate) fn final_check(&mut self, ctx: &Ctx) -> Result<Report, String> {
        let final_store = self.store(ctx);
        let want = sealed(tag(SUPERVISOR_ID, 0, self.n));
        let again = SharedCell::<Value>::open(self.dir.join(FILE))
            .map_err(|e| format!("open cell: {e}"))?;
        let got = again.load();
        if got != want {
            ctx.violate(
                "C3 progress",
                format_args!("after the final store of {want:x?}, a load returned {got:x?}"),
            );
        }
        Ok(Report {
            supervisor_stores: self.n - self.updates,
            slowest_store: self.slowest,
            supervisor_updates: self.updates,
            slowest_update: self.slowest_update,
            final_store,
            counters: self.cell.counters(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_detects_mixed_words() {
        let (a, b) = (sealed(tag(1, 2, 3)), sealed(tag(1, 2, 4)));
        assert!(intact(&a) && intact(&b));
        for i in 0..6 {
            let mut m = a;
            m[i] = b[i];
            assert!(!intact(&m), "word {i} of another value went unnoticed");
        }
        assert_eq!(split(tag(7, 9, 11)), (7 << 16 | 9, 11));
    }
}

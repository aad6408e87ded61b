//! The demo's work board: a small mapped file shared by every demo process, holding the
//! work units' states and the counters the final checks use.
//!
//! It is a `Kind::Test` cxc file: a 64-byte head of eight `u64` words and one 32-byte
//! slot of four `u64` words per unit, accessed only through atomics.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use cxc::mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};

/// Head word: number of units.
pub(crate) const UNITS: usize = 0;
/// Head word: distinct units done.
pub(crate) const DONE: usize = 1;
/// Head word: non-zero once the demo is shutting down.
pub(crate) const SHUTDOWN: usize = 2;
/// Head word: semaphore permits in use right now (as counted by the workers).
pub(crate) const IN_USE: usize = 3;
/// Head word: the most permits ever in use at once.
pub(crate) const MAX_IN_USE: usize = 4;
/// Head word: invariant violations seen live.
pub(crate) const VIOLATIONS: usize = 5;
/// Head word: total accepted completions.
pub(crate) const COMPLETIONS: usize = 6;
/// Head word: the semaphore's permit cap.
pub(crate) const CAP: usize = 7;

/// Unit word: state (0 todo, `TAKEN | slot | generation`, `DONE_STATE`).
pub(crate) const STATE: usize = 0;
/// Unit word: accepted completions.
pub(crate) const UNIT_DONE: usize = 1;
/// Unit word: times its in-flight bit was reclaimed from a dead worker.
pub(crate) const UNIT_RECLAIMED: usize = 2;
/// Unit word: times a worker started it.
pub(crate) const UNIT_STARTS: usize = 3;

const TAKEN: u64 = 1 << 63;
pub(crate) const DONE_STATE: u64 = 1 << 62;

/// The `STATE` value of a unit taken by the registration (`slot`, `generation`).
pub(crate) fn taken(slot: usize, generation: u64) -> u64 {
    TAKEN | ((slot as u64 & 0xFFFF) << 40) | (generation & 0xFF_FFFF_FFFF)
}

type Head = [AtomicU64; 8];
type Unit = [AtomicU64; 4];

/// An open board.
pub(crate) struct Board {
    map: Mapped<Head, Unit>,
}

fn layout(units: u64) -> Layout {
    Layout {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 32,
        capacity: units,
        payload: TypeFingerprint::NONE,
        params: [0; 4],
    }
}

impl Board {
    pub(crate) fn create(path: &Path, units: u64, cap: u32) -> Result<Self, MmfError> {
        let map = Mapped::create(
            path,
            layout(units),
            &CreateOptions::default(),
            |h: &Head, _| {
                h[UNITS].store(units, Ordering::Relaxed);
                h[CAP].store(u64::from(cap), Ordering::Relaxed);
            },
        )?;
        Ok(Board { map })
    }

    pub(crate) fn open(path: &Path) -> Result<Self, MmfError> {
        let expect = Expect {
            kind: Kind::Test,
            head_size: 64,
            slot_size: 32,
            capacity: None,
            max_capacity: 1 << 20,
            payload: TypeFingerprint::NONE,
            check_params: &|_| Ok(()),
        };
        Ok(Board {
            map: Mapped::open(path, &expect)?,
        })
    }

    pub(crate) fn head(&self, word: usize) -> &AtomicU64 {
        &self.map.head()[word]
    }

    pub(crate) fn units(&self) -> usize {
        self.map.slots().len()
    }

    pub(crate) fn unit(&self, u: usize, word: usize) -> &AtomicU64 {
        &self.map.slots()[u][word]
    }

    /// Takes the first todo unit for (`slot`, `generation`).
    pub(crate) fn take(&self, slot: usize, generation: u64) -> Option<usize> {
        (0..self.units()).find(|&u| {
            self.unit(u, STATE)
                .compare_exchange(
                    0,
                    taken(slot, generation),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        })
    }

    /// Marks unit `u` done if it is still taken by (`slot`, `generation`).
    pub(crate) fn complete(&self, u: usize, slot: usize, generation: u64) -> bool {
        let ok = self
            .unit(u, STATE)
            .compare_exchange(
                taken(slot, generation),
                DONE_STATE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if ok {
            self.unit(u, UNIT_DONE).fetch_add(1, Ordering::AcqRel);
            self.head(COMPLETIONS).fetch_add(1, Ordering::AcqRel);
            self.head(DONE).fetch_add(1, Ordering::AcqRel);
        }
        ok
    }

    /// Puts the units taken by (`slot`, `generation`) whose bit is in `bits` back to todo;
    /// returns them.
    pub(crate) fn requeue(&self, slot: usize, generation: u64, bits: u64) -> Vec<usize> {
        let tag = taken(slot, generation);
        (0..self.units())
            .filter(|&u| bits & (1u64 << (u % 64)) != 0)
            .filter(|&u| {
                self.unit(u, STATE)
                    .compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .inspect(|&u| {
                self.unit(u, UNIT_RECLAIMED).fetch_add(1, Ordering::AcqRel);
            })
            .collect()
    }

    pub(crate) fn all_done(&self) -> bool {
        self.head(DONE).load(Ordering::Acquire) >= self.units() as u64
    }

    /// The demo asked its processes to stop, or (in a role process) the demo that
    /// started it is gone: killed outright, it could not ask.
    pub(crate) fn shutting_down(&self) -> bool {
        self.head(SHUTDOWN).load(Ordering::Acquire) != 0 || parent_gone()
    }
}

/// The environment variable that gives a role process the demo's pid.
pub(crate) const PARENT_VAR: &str = "CXC_DEMO_PARENT";

/// Whether this process was started by a demo (its pid in [`PARENT_VAR`]) that is no
/// longer its parent: the demo died and the process was re-parented.
fn parent_gone() -> bool {
    static PARENT: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    let parent = PARENT.get_or_init(|| std::env::var(PARENT_VAR).ok()?.parse().ok());
    parent.is_some_and(|p| rustix::process::getppid().map(|q| q.as_raw_pid()) != Some(p))
}

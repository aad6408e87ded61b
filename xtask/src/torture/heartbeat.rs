//! Heartbeat torture: workers register in a `HeartbeatTable`, take work units, mark them
//! in flight, beat while working and complete them with `clear_in_flight`; the supervisor
//! runs a `FailoverWatchdog` (scan → reclaim → requeue) while the chaos loop kills and
//! pauses workers.
//!
//! Unit bookkeeping lives in a shared file, one word per unit:
//! `FREE` → `TAKEN(slot, gen, bit)` (worker CAS, after `mark_in_flight`) →
//! `COMPLETING(..)` (worker, before `clear_in_flight`) → `DONE(..)` (worker, only if
//! `clear_in_flight` returned true). The watchdog moves a unit whose bit it reclaimed
//! from `TAKEN`/`COMPLETING` back to `FREE` (requeue). Since each in-flight bit is either
//! cleared by its owner or returned by exactly one `reclaim` (H2/H3), every handed-out
//! unit ends `DONE` (or `COMPLETING` with its bit cleared: accepted, then killed before
//! recording it), no unit is requeued twice for one registration, and a unit whose bit was
//! reclaimed never reaches `DONE` through the fenced registration.
//!
//! Before marking a bit the worker writes a hint `(gen, unit)` for `(slot, bit)`, so the
//! watchdog finds the unit of a reclaimed bit without a scan.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cxc::{
    EpochMode, FailoverWatchdog, HeartbeatError, HeartbeatOptions, HeartbeatTable,
    heartbeat_counter,
};

use super::control::{Ctx, Stat};
use super::shm::Words;
use cxc_testkit::Rng;

pub(crate) const FILE: &str = "heartbeat.cxc";
const UNITS_FILE: &str = "hb-units.cxc";
const UNITS_TAG: u64 = 0x554e_4954; // "UNIT"
const HINTS_FILE: &str = "hb-hints.cxc";
const HINTS_TAG: u64 = 0x4849_4e54; // "HINT"
/// Units head words.
const NEXT: usize = 0;
const LOW: usize = 1;

const CAPACITY: usize = 64;
const TICK: Duration = Duration::from_millis(5);
/// Watchdog grace in epochs (50 ms).
const GRACE: u64 = 10;
/// How far past `low` a worker looks for a requeued unit.
const WINDOW: u64 = 256;

/// Where a unit is (the top two bits of its word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    Taken,
    Completing,
    Done,
}

/// The word of a free unit (phase `Free`, no holder).
const FREE: u64 = 0;

fn enc(phase: Phase, slot: usize, generation: u64, bit: u8) -> u64 {
    (phase as u64) << 62 | (generation & 0x7FFF_FFFF) << 22 | u64::from(bit) << 16 | slot as u64
}

/// `(phase, slot, generation, bit)`.
fn dec(w: u64) -> (Phase, usize, u64, u8) {
    const PHASES: [Phase; 4] = [Phase::Free, Phase::Taken, Phase::Completing, Phase::Done];
    (
        PHASES[(w >> 62) as usize],
        (w & 0xFFFF) as usize,
        (w >> 22) & 0x7FFF_FFFF,
        ((w >> 16) & 0x3F) as u8,
    )
}

/// Creates the table and bookkeeping files; `units` bounds how many units are handed out.
pub(crate) fn setup(dir: &Path, units: usize) -> Result<(), String> {
    let opts = HeartbeatOptions {
        epoch: EpochMode::Clock { tick: TICK },
        ..HeartbeatOptions::default()
    };
    HeartbeatTable::create_with(dir.join(FILE), CAPACITY, &opts)
        .map_err(|e| format!("create heartbeat table: {e}"))?;
    Words::create(&dir.join(UNITS_FILE), UNITS_TAG, units)?;
    Words::create(&dir.join(HINTS_FILE), HINTS_TAG, CAPACITY * 64)?;
    Ok(())
}

/// A unit held by a worker.
struct Held {
    bit: u8,
    unit: u64,
    due: Instant,
}

enum Take {
    Got(Held),
    NoWork,
    Fenced,
}

/// The worker-side protocol (also used by the supervisor to finish leftover units).
struct Units<'a> {
    ctx: &'a Ctx,
    table: &'a HeartbeatTable,
    units: Words,
    hints: Words,
    rng: Rng,
}

impl<'a> Units<'a> {
    fn open(ctx: &'a Ctx, table: &'a HeartbeatTable, rng: Rng) -> Result<Self, String> {
        Ok(Units {
            ctx,
            table,
            units: Words::open(&ctx.dir.join(UNITS_FILE), UNITS_TAG)?,
            hints: Words::open(&ctx.dir.join(HINTS_FILE), HINTS_TAG)?,
            rng,
        })
    }

    fn limit(&self) -> u64 {
        self.units.len() as u64
    }

    fn state(&self, u: u64) -> &std::sync::atomic::AtomicU64 {
        self.units.word(u as usize)
    }

    /// A unit that looks free: a requeued one near `low`, else a fresh one.
    fn candidate(&mut self, fresh: bool) -> Option<u64> {
        let next = self
            .units
            .head(NEXT)
            .load(Ordering::Acquire)
            .min(self.limit());
        let low = self.units.head(LOW).load(Ordering::Acquire);
        let end = next.min(low + WINDOW);
        if low < end {
            let start = low + self.rng.below(end - low);
            for u in (start..end).chain(low..start) {
                if self.state(u).load(Ordering::Acquire) == FREE {
                    return Some(u);
                }
            }
        }
        if !fresh {
            return None;
        }
        let u = self.units.head(NEXT).fetch_add(1, Ordering::AcqRel);
        (u < self.limit()).then_some(u)
    }

    fn take(&mut self, slot: usize, generation: u64, held: &[Held], fresh: bool) -> Take {
        let bit = loop {
            let b = self.rng.below(64) as u8;
            if !held.iter().any(|h| h.bit == b) {
                break b;
            }
        };
        for _ in 0..4 {
            let Some(u) = self.candidate(fresh) else {
                return Take::NoWork;
            };
            self.hints
                .word(slot * 64 + usize::from(bit))
                .store(generation << 32 | (u + 1), Ordering::Release);
            if !self.table.mark_in_flight(slot, bit) {
                return Take::Fenced;
            }
            let taken = enc(Phase::Taken, slot, generation, bit);
            if self
                .state(u)
                .compare_exchange(FREE, taken, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.ctx.bump(Stat::HbTaken, 1);
                let us = match self.rng.below(100) {
                    0..70 => self.rng.range(50, 1_000),
                    70..97 => self.rng.range(1_000, 5_000),
                    _ => self.rng.range(5_000, 20_000),
                };
                return Take::Got(Held {
                    bit,
                    unit: u,
                    due: Instant::now() + Duration::from_micros(us),
                });
            }
            self.ctx.bump(Stat::HbTakeRace, 1);
            if !self.table.clear_in_flight(slot, bit) {
                return Take::Fenced;
            }
        }
        Take::NoWork
    }

    /// Completes a held unit; false if the completion was refused (we were fenced).
    fn complete(&self, slot: usize, generation: u64, h: &Held) -> bool {
        let taken = enc(Phase::Taken, slot, generation, h.bit);
        let completing = enc(Phase::Completing, slot, generation, h.bit);
        let state = self.state(h.unit);
        if let Err(v) =
            state.compare_exchange(taken, completing, Ordering::AcqRel, Ordering::Acquire)
        {
            // The watchdog reclaimed the bit and requeued the unit: we are fenced.
            if self.table.clear_in_flight(slot, h.bit) {
                self.ctx.violate(
                    "H3 fencing",
                    format_args!(
                        "unit {} was requeued after its bit (slot {slot} gen {generation} bit {}) was reclaimed (state now {:?}), yet clear_in_flight accepted its completion",
                        h.unit,
                        h.bit,
                        dec(v)
                    ),
                );
            }
            self.ctx.bump(Stat::HbRejected, 1);
            return false;
        }
        let before = self.table.snapshot(slot);
        if !self.table.clear_in_flight(slot, h.bit) {
            self.ctx.bump(Stat::HbRejected, 1);
            return false;
        }
        if before.is_some_and(|s| s.generation == generation && s.fenced) {
            self.ctx.violate(
                "H3 fencing",
                format_args!(
                    "clear_in_flight of unit {} accepted although slot {slot} gen {generation} was already fenced",
                    h.unit
                ),
            );
        }
        let done = enc(Phase::Done, slot, generation, h.bit);
        if let Err(v) =
            state.compare_exchange(completing, done, Ordering::AcqRel, Ordering::Acquire)
        {
            self.ctx.violate(
                "H2/H3 reclaim",
                format_args!(
                    "clear_in_flight accepted the completion of unit {} (slot {slot} gen {generation} bit {}), but the watchdog had reclaimed it (state now {:?})",
                    h.unit,
                    h.bit,
                    dec(v)
                ),
            );
        }
        self.ctx.bump(Stat::HbDone, 1);
        true
    }
}

fn registration(table: &HeartbeatTable, me: u32) -> Result<Option<(usize, u64)>, String> {
    let slot = match table.register(me) {
        Ok(s) => s,
        Err(HeartbeatError::TableFull) => return Ok(None),
        Err(e) => return Err(format!("register: {e}")),
    };
    match table.snapshot(slot) {
        Some(s) if s.pid == me => Ok(Some((slot, s.generation))),
        _ => {
            table.unregister(slot);
            Ok(None)
        }
    }
}

/// Completes the held units that are due (all with `all`); false if a completion was
/// refused (the registration was fenced).
fn complete_due(
    u: &Units<'_>,
    slot: usize,
    generation: u64,
    held: &mut Vec<Held>,
    all: bool,
) -> bool {
    let now = Instant::now();
    let mut i = 0;
    while i < held.len() {
        if held[i].due <= now || all {
            let h = held.swap_remove(i);
            if !u.complete(slot, generation, &h) {
                return false;
            }
        } else {
            i += 1;
        }
    }
    true
}

/// A worker process.
pub(crate) fn worker(ctx: &Ctx, rng: Rng) -> Result<(), String> {
    let me = std::process::id();
    let table = HeartbeatTable::open(ctx.dir.join(FILE), CAPACITY)
        .map_err(|e| format!("open heartbeat table: {e}"))?;
    let mut u = Units::open(ctx, &table, rng)?;
    'register: loop {
        if ctx.stopping() {
            return Ok(());
        }
        let Some((slot, generation)) = registration(&table, me)? else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        ctx.bump(Stat::HbRegister, 1);
        let want = u.rng.range(1, 5) as usize;
        let mut held: Vec<Held> = Vec::new();
        loop {
            ctx.bump(Stat::HbOps, 1);
            // Half of the rounds finish due work before beating, as a worker that was
            // stopped mid-unit would: the fence must hold at `clear_in_flight` itself.
            let complete_first = u.rng.percent(50);
            if complete_first && !complete_due(&u, slot, generation, &mut held, false) {
                ctx.bump(Stat::HbFenced, 1);
                continue 'register;
            }
            let before = table.snapshot(slot);
            if !table.beat(slot) {
                // Declared dead (fenced): the watchdog reclaims what we held.
                ctx.bump(Stat::HbFenced, 1);
                continue 'register;
            }
            if before.is_some_and(|s| s.pid == me && s.generation == generation && s.fenced) {
                ctx.violate(
                    "H3 fencing",
                    format_args!(
                        "beat on slot {slot} gen {generation} accepted although the slot was already fenced"
                    ),
                );
            }
            let stopping = ctx.stopping();
            if stopping && held.is_empty() {
                table.unregister(slot);
                return Ok(());
            }
            if !stopping && held.len() < want {
                match u.take(slot, generation, &held, true) {
                    Take::Got(h) => held.push(h),
                    Take::NoWork => {}
                    Take::Fenced => {
                        ctx.bump(Stat::HbFenced, 1);
                        continue 'register;
                    }
                }
            }
            if !complete_first && !complete_due(&u, slot, generation, &mut held, stopping) {
                ctx.bump(Stat::HbFenced, 1);
                continue 'register;
            }
            std::thread::sleep(Duration::from_micros(u.rng.range(50, 500)));
        }
    }
}

/// The supervisor's watchdog and the end-of-run check.
pub(crate) struct Watch {
    table: &'static HeartbeatTable,
    watchdog: FailoverWatchdog<'static>,
    units: Words,
    hints: Words,
    /// `(slot, generation, bit)` returned by `reclaim`.
    reclaimed_bits: HashSet<(usize, u64, u8)>,
    /// `(unit, slot, generation)` requeued.
    requeued: HashSet<(u64, usize, u64)>,
    pub(crate) report: Report,
}

/// Heartbeat figures for the summary.
#[derive(Debug, Default, Clone)]
pub(crate) struct Report {
    pub(crate) dead_slots: u64,
    pub(crate) reclaimed_bits: u64,
    pub(crate) requeued: u64,
    pub(crate) empty_bits: u64,
    pub(crate) fallback_scans: u64,
    pub(crate) handed_out: u64,
    pub(crate) done: u64,
    pub(crate) accepted_unrecorded: u64,
    pub(crate) finished_by_supervisor: u64,
    pub(crate) counters: Vec<(&'static str, u64)>,
}

impl Watch {
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        let table = HeartbeatTable::open(dir.join(FILE), CAPACITY)
            .map_err(|e| format!("open heartbeat table: {e}"))?;
        // The watchdog borrows the table for the rest of the (short-lived) supervisor.
        let table: &'static HeartbeatTable = Box::leak(Box::new(table));
        Ok(Watch {
            table,
            watchdog: FailoverWatchdog::with_grace(table, GRACE),
            units: Words::open(&dir.join(UNITS_FILE), UNITS_TAG)?,
            hints: Words::open(&dir.join(HINTS_FILE), HINTS_TAG)?,
            reclaimed_bits: HashSet::new(),
            requeued: HashSet::new(),
            report: Report::default(),
        })
    }

    fn next(&self) -> u64 {
        self.units
            .head(NEXT)
            .load(Ordering::Acquire)
            .min(self.units.len() as u64)
    }

    /// One watchdog round: scan, reclaim every dead slot, requeue the units of the
    /// reclaimed bits, advance `low`. Returns the number of dead slots found.
    pub(crate) fn step(&mut self, ctx: &Ctx) -> usize {
        let report = self.watchdog.scan();
        for (slot, snap) in &report.dead_slots {
            self.report.dead_slots += 1;
            let bits = self.watchdog.reclaim(*slot);
            for bit in FailoverWatchdog::iter_in_flight_bits(bits) {
                self.report.reclaimed_bits += 1;
                if !self.reclaimed_bits.insert((*slot, snap.generation, bit)) {
                    ctx.violate(
                        "H2 reclaim",
                        format_args!(
                            "bit {bit} of slot {slot} gen {} was returned by reclaim twice",
                            snap.generation
                        ),
                    );
                }
                self.requeue(ctx, *slot, snap.generation, bit);
            }
        }
        self.advance_low();
        report.dead_slots.len()
    }

    fn requeue(&mut self, ctx: &Ctx, slot: usize, generation: u64, bit: u8) {
        let holds = |w: u64| {
            let (phase, s, g, b) = dec(w);
            matches!(phase, Phase::Taken | Phase::Completing)
                && (s, g, b) == (slot, generation, bit)
        };
        let hint = self
            .hints
            .get(slot * 64 + usize::from(bit))
            .map_or(0, |h| h.load(Ordering::Acquire));
        let mut found = None;
        if hint >> 32 == generation && hint & 0xFFFF_FFFF != 0 {
            let u = (hint & 0xFFFF_FFFF) - 1;
            if let Some(w) = self.units.get(u as usize) {
                let v = w.load(Ordering::Acquire);
                if holds(v) {
                    found = Some(u);
                } else if v == enc(Phase::Done, slot, generation, bit) {
                    ctx.violate(
                        "H2/H3 reclaim",
                        format_args!(
                            "reclaim returned bit {bit} of slot {slot} gen {generation}, but its unit {u} was already completed through that bit"
                        ),
                    );
                }
            }
        }
        if found.is_none() {
            // The hint was overwritten (a fenced worker resumed) or never matched (killed
            // between marking the bit and taking the unit): scan.
            self.report.fallback_scans += 1;
            found = (0..self.next())
                .find(|&u| holds(self.units.word(u as usize).load(Ordering::Acquire)));
        }
        let Some(u) = found else {
            self.report.empty_bits += 1;
            return;
        };
        let w = self.units.word(u as usize);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if !holds(cur) {
                ctx.violate(
                    "H2/H3 reclaim",
                    format_args!(
                        "unit {u} of reclaimed bit {bit} (slot {slot} gen {generation}) moved to {:?} after the reclaim",
                        dec(cur)
                    ),
                );
                return;
            }
            match w.compare_exchange(cur, FREE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        if !self.requeued.insert((u, slot, generation)) {
            ctx.violate(
                "H2 reclaim",
                format_args!("unit {u} reclaimed twice from slot {slot} gen {generation}"),
            );
        }
        self.report.requeued += 1;
        self.units.head(LOW).fetch_min(u, Ordering::AcqRel);
    }

    fn advance_low(&self) {
        let next = self.next();
        let mut l = self.units.head(LOW).load(Ordering::Acquire);
        let mut budget = 4096;
        while l < next && budget > 0 && self.units.word(l as usize).load(Ordering::Acquire) != FREE
        {
            l += 1;
            budget -= 1;
        }
        // Only the supervisor writes LOW (requeue lowers it, this raises it).
        self.units.head(LOW).store(l, Ordering::Release);
    }

    /// After every worker exited: reclaim what is left, finish requeued units in the
    /// supervisor, and check every unit that was handed out.
    pub(crate) fn finish(&mut self, ctx: &Ctx) -> Result<Report, String> {
        // Killed workers' slots go stale within the grace (50 ms): reclaim until quiet.
        let mut quiet = 0;
        for _ in 0..200 {
            if self.step(ctx) == 0 {
                quiet += 1;
                if quiet >= 20 {
                    break;
                }
            } else {
                quiet = 0;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let next = self.next();
        let mut u = Units::open(ctx, self.table, Rng::new(0))?;
        let me = std::process::id();
        let reg = registration(self.table, me)?;
        if let Some((slot, generation)) = reg {
            loop {
                match u.take(slot, generation, &[], false) {
                    Take::Got(h) => {
                        if !u.complete(slot, generation, &h) {
                            ctx.violate(
                                "H3 fencing",
                                format_args!("the supervisor's own completion was refused"),
                            );
                            break;
                        }
                        self.report.finished_by_supervisor += 1;
                    }
                    Take::NoWork => {
                        // `candidate` looks at a window past `low`: move it on.
                        let low = self.units.head(LOW).load(Ordering::Acquire);
                        self.advance_low();
                        if self.units.head(LOW).load(Ordering::Acquire) == low {
                            break;
                        }
                    }
                    Take::Fenced => {
                        ctx.violate(
                            "H3 fencing",
                            format_args!("the supervisor's registration was fenced"),
                        );
                        break;
                    }
                }
            }
            self.table.unregister(slot);
        } else {
            ctx.violate(
                "H4 reuse",
                format_args!("no slot free for the supervisor after all workers exited"),
            );
        }
        let mut r = self.report.clone();
        r.handed_out = next;
        let mut bad = 0;
        for unit in 0..next {
            let (phase, slot, generation, bit) =
                dec(self.units.word(unit as usize).load(Ordering::Acquire));
            let verdict = match phase {
                Phase::Done => {
                    r.done += 1;
                    None
                }
                Phase::Completing => {
                    let in_flight = self.table.snapshot(slot).is_some_and(|s| {
                        s.generation == generation && s.in_flight_bitmap >> bit & 1 == 1
                    });
                    if in_flight {
                        Some("still in flight after every worker exited and the watchdog ran")
                    } else {
                        r.accepted_unrecorded += 1;
                        None
                    }
                }
                Phase::Taken => Some("taken but neither completed nor reclaimed (lost)"),
                Phase::Free => Some("never completed"),
            };
            if let Some(v) = verdict {
                bad += 1;
                if bad <= 10 {
                    ctx.violate(
                        "H2 every unit completes",
                        format_args!("unit {unit} (slot {slot} gen {generation} bit {bit}): {v}"),
                    );
                }
            }
        }
        if bad > 10 {
            ctx.violate(
                "H2 every unit completes",
                format_args!("{bad} units did not complete"),
            );
        }
        let c = self.table.counters();
        r.counters = heartbeat_counter::NAMES
            .iter()
            .zip(c)
            .filter(|(n, _)| !n.is_empty())
            .map(|(n, v)| (*n, v))
            .collect();
        Ok(r)
    }
}

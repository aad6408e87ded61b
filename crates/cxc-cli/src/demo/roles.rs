//! The demo's child processes: coordinators (holding the lease, running the watchdog) and
//! workers (registered in the heartbeat table, working units under the semaphore cap).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc::{FailoverWatchdog, HeartbeatTable, OwnerLease, SharedSemaphore};

use super::board::{self, Board};
use super::events::log;
use crate::CliError;

/// Epochs (heartbeat table: watchdog scans) a worker may miss before it is declared dead.
pub(crate) const WORKER_GRACE: u64 = 5;
/// Epochs (lease clock ticks) a coordinator may miss.
pub(crate) const LEASE_GRACE: u64 = 20;
const SCAN_EVERY: Duration = Duration::from_millis(20);

pub(crate) struct Files {
    pub(crate) dir: PathBuf,
}

impl Files {
    pub(crate) fn lease(&self) -> PathBuf {
        self.dir.join("coordinator.lease")
    }
    pub(crate) fn table(&self) -> PathBuf {
        self.dir.join("workers.hb")
    }
    pub(crate) fn sem(&self) -> PathBuf {
        self.dir.join("cap.sem")
    }
    pub(crate) fn board(&self) -> PathBuf {
        self.dir.join("board")
    }
}

/// A coordinator: waits for the lease, then scans the heartbeat table, reclaims dead
/// workers' units and puts them back on the board, until shutdown.
pub(crate) fn coordinator(dir: &Path, name: &str) -> Result<u8, CliError> {
    let f = Files {
        dir: dir.to_path_buf(),
    };
    let lease = OwnerLease::<[u64; 6]>::open(f.lease())?;
    let table = HeartbeatTable::open_any(f.table())?;
    let board = Board::open(&f.board())?;
    let me = std::process::id();
    log(
        dir,
        name,
        &format!("started, pid {me}, waiting for the lease"),
    );
    let claim = loop {
        if board.shutting_down() {
            return Ok(0);
        }
        if let Some(c) = lease.acquire(me, LEASE_GRACE, Duration::from_millis(200)) {
            break c;
        }
    };
    log(
        dir,
        name,
        &format!(
            "holds the lease: generation {} (fencing token){}",
            claim.generation(),
            if claim.payload_may_be_inconsistent() {
                ", previous holder died mid-update"
            } else {
                ""
            }
        ),
    );
    let watchdog = FailoverWatchdog::with_grace(&table, WORKER_GRACE);
    let mut scans = 0u64;
    let mut reclaimed = 0u64;
    while !board.shutting_down() {
        if !lease.beat_claimed(&claim) {
            log(dir, name, "lost the lease; stepping down");
            return Ok(3);
        }
        let report = watchdog.scan();
        scans += 1;
        for (slot, snap) in &report.dead_slots {
            let bits = watchdog.reclaim(*slot);
            if bits == 0 {
                continue;
            }
            let units = board.requeue(*slot, snap.generation, bits);
            reclaimed += units.len() as u64;
            log(
                dir,
                name,
                &format!(
                    "worker pid {} (slot {slot}) is dead: reclaimed units {units:?}",
                    snap.pid
                ),
            );
        }
        // The coordinator's own state, written with its fencing token: a deposed
        // coordinator's write is refused.
        let state = [scans, reclaimed, claim.generation(), u64::from(me), 0, 0];
        if !lease.write_claimed(&claim, state) {
            log(dir, name, "write refused: lease lost; stepping down");
            return Ok(3);
        }
        std::thread::sleep(SCAN_EVERY);
    }
    lease.release_claim(&claim);
    log(dir, name, "released the lease at shutdown");
    Ok(0)
}

/// A worker: registers, then takes units under the semaphore cap until all are done.
pub(crate) fn worker(dir: &Path, name: &str, work_ms: (u64, u64)) -> Result<u8, CliError> {
    let f = Files {
        dir: dir.to_path_buf(),
    };
    let table = HeartbeatTable::open_any(f.table())?;
    let sem = SharedSemaphore::open(f.sem())?;
    let board = Board::open(&f.board())?;
    let me = std::process::id();
    let slot = table.register(me)?;
    let generation = table.snapshot(slot).map_or(0, |s| s.generation);
    log(dir, name, &format!("registered pid {me} in slot {slot}"));
    let cap = board.head(board::CAP).load(Ordering::Acquire);
    let mut rng = u64::from(me).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while !board.shutting_down() && !board.all_done() {
        let Some(permit) = sem.acquire_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let in_use = board.head(board::IN_USE).fetch_add(1, Ordering::AcqRel) + 1;
        board
            .head(board::MAX_IN_USE)
            .fetch_max(in_use, Ordering::AcqRel);
        if in_use > cap {
            board.head(board::VIOLATIONS).fetch_add(1, Ordering::AcqRel);
            log(
                dir,
                name,
                &format!("VIOLATION: {in_use} permits in use, cap {cap}"),
            );
        }
        let unit = board.take(slot, generation);
        if let Some(u) = unit {
            let bit = (u % 64) as u8;
            // Beat first: a worker that waited long for a permit must not look stale the
            // moment it marks the unit in flight.
            if !table.beat(slot) || !table.mark_in_flight(slot, bit) {
                log(dir, name, "fenced (declared dead): stopping");
                return Ok(3);
            }
            board
                .unit(u, board::UNIT_STARTS)
                .fetch_add(1, Ordering::AcqRel);
            log(dir, name, &format!("took unit {u}"));
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let ms = work_ms.0 + rng % (work_ms.1 - work_ms.0 + 1);
            let mut left = ms;
            while left > 0 {
                let step = left.min(5);
                std::thread::sleep(Duration::from_millis(step));
                left -= step;
                if !table.beat(slot) {
                    log(
                        dir,
                        name,
                        &format!("fenced while working on unit {u}: stopping"),
                    );
                    return Ok(3);
                }
            }
            // Completion is accepted only while the unit is still ours on the board (the
            // coordinator puts a dead worker's units back, which changes their tag); the
            // in-flight bit is cleared after, so a kill in between leaves a done unit,
            // never a unit nobody will redo.
            if board.complete(u, slot, generation) {
                table.clear_in_flight(slot, bit);
                log(dir, name, &format!("done unit {u}"));
            } else {
                log(
                    dir,
                    name,
                    &format!("completion of unit {u} refused (fenced)"),
                );
                return Ok(3);
            }
        } else {
            table.beat(slot);
        }
        board.head(board::IN_USE).fetch_sub(1, Ordering::AcqRel);
        drop(permit);
        if unit.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    table.unregister(slot);
    log(dir, name, "all units done; unregistered");
    Ok(0)
}

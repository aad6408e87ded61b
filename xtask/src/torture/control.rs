//! The control file shared by the supervisor and the workers: run flags, cumulative
//! statistics, and the violation count; plus the violation log (one line per violation,
//! appended with a single `write`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::shm::Words;

const TAG: u64 = 0x0043_544c; // "CTL"
pub(crate) const FILE: &str = "control.cxc";
pub(crate) const VIOLATIONS_FILE: &str = "violations.log";

/// Head word 0: flags.
const FLAGS: usize = 0;
/// Head word 1: number of violations reported by any process.
const VIOLATIONS: usize = 1;
/// Violations a process writes to the log (all are counted) and echoes to stderr.
const LOGGED_PER_PROCESS: u32 = 100;
const ECHOED_PER_PROCESS: u32 = 5;
/// Flag: workers finish what they hold and exit.
pub(crate) const STOP: u64 = 1;

/// Statistics slots of the control file: cumulative counters bumped by workers and the
/// supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stat {
    // The lease (L invariants).
    LeaseOps = 0,
    LeaseClaims,
    LeaseClaimFail,
    LeaseWrites,
    LeaseWithLease,
    LeaseFenced,
    LeaseResumed,
    LeaseResumedFenced,
    LeaseTornClaims,
    LeaseReads,
    LeaseStaleEntry,
    LeaseStaleProbes,
    LeaseSibReleases,
    LeaseSibReleasesWriting,
    // The heartbeat table (H).
    HbOps = 16,
    HbRegister,
    HbTaken,
    HbDone,
    HbFenced,
    HbRejected,
    HbTakeRace,
    // The shared cell (C).
    CellOps = 24,
    CellStores,
    CellUpdates,
    CellLoads,
    CellSuperseded,
    CellTakeovers,
    CellChecks,
    // The semaphore (S).
    SemOps = 32,
    SemAcquired,
    SemTimeouts,
    SemChecks,
    SemCheckSkipped,
    SemMaxInUse,
    // Violations by primitive (invariant names start with L, H, S, C, R; others: crashes,
    // hangs).
    LeaseViolations = 48,
    HbViolations,
    SemViolations,
    OtherViolations,
    RwlockViolations,
    CellViolations,
}

impl Stat {
    /// Slots in the control file.
    pub(crate) const COUNT: usize = 64;
}

/// A process's view of the run: the control file and the violation log.
pub(crate) struct Ctx {
    pub(crate) dir: PathBuf,
    ctl: Words,
    violations: File,
    who: String,
    /// Violations reported by this process.
    echoed: std::cell::Cell<u32>,
}

impl Ctx {
    /// Creates the control file (supervisor).
    pub(crate) fn create(dir: &Path) -> Result<Self, String> {
        let ctl = Words::create(&dir.join(FILE), TAG, Stat::COUNT)?;
        Self::with(dir, ctl, "supervisor".into())
    }

    /// Opens the control file (worker).
    pub(crate) fn open(dir: &Path, who: String) -> Result<Self, String> {
        let ctl = Words::open(&dir.join(FILE), TAG)?;
        Self::with(dir, ctl, who)
    }

    fn with(dir: &Path, ctl: Words, who: String) -> Result<Self, String> {
        let path = dir.join(VIOLATIONS_FILE);
        let violations = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        Ok(Ctx {
            dir: dir.to_path_buf(),
            ctl,
            violations,
            who,
            echoed: std::cell::Cell::new(0),
        })
    }

    /// Who reports through this handle (e.g. `lease worker 2.7`).
    pub(crate) fn who(&self) -> &str {
        &self.who
    }

    pub(crate) fn bump(&self, which: Stat, n: u64) {
        self.ctl
            .word(which as usize)
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn max(&self, which: Stat, v: u64) {
        self.ctl
            .word(which as usize)
            .fetch_max(v, Ordering::Relaxed);
    }

    pub(crate) fn stat(&self, which: Stat) -> u64 {
        self.ctl.word(which as usize).load(Ordering::Relaxed)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.ctl.head(FLAGS).load(Ordering::Acquire) & STOP != 0
    }

    pub(crate) fn set_flag(&self, flag: u64) {
        self.ctl.head(FLAGS).fetch_or(flag, Ordering::AcqRel);
    }

    pub(crate) fn violations(&self) -> u64 {
        self.ctl.head(VIOLATIONS).load(Ordering::Acquire)
    }

    /// Reports a violation: counted in the control file and appended to the log with the
    /// reporting process and invariant.
    pub(crate) fn violate(&self, invariant: &str, msg: std::fmt::Arguments<'_>) {
        self.ctl.head(VIOLATIONS).fetch_add(1, Ordering::AcqRel);
        self.bump(
            match invariant.as_bytes().first() {
                Some(b'L') => Stat::LeaseViolations,
                Some(b'H') => Stat::HbViolations,
                Some(b'S') => Stat::SemViolations,
                Some(b'C') => Stat::CellViolations,
                Some(b'R') => Stat::RwlockViolations,
                _ => Stat::OtherViolations,
            },
            1,
        );
        let n = self.echoed.get();
        self.echoed.set(n.saturating_add(1));
        if n >= LOGGED_PER_PROCESS {
            return;
        }
        let line = format!(
            "[{} pid {}] {invariant}: {msg}\n",
            self.who,
            std::process::id()
        );
        // One write per line: O_APPEND keeps lines from different processes whole.
        let _ = (&self.violations).write_all(line.as_bytes());
        if n < ECHOED_PER_PROCESS {
            eprint!("VIOLATION {line}");
        }
    }
}

/// Reads the violation log.
pub(crate) fn read_violations(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join(VIOLATIONS_FILE))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

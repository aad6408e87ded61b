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

/// Statistics slots (cumulative counters bumped by workers and the supervisor).
pub(crate) mod stat {
    pub(crate) const L_OPS: usize = 0;
    pub(crate) const L_CLAIMS: usize = 1;
    pub(crate) const L_CLAIM_FAIL: usize = 2;
    pub(crate) const L_WRITES: usize = 3;
    pub(crate) const L_WITH_LEASE: usize = 4;
    pub(crate) const L_FENCED: usize = 5;
    pub(crate) const L_RESUMED: usize = 6;
    pub(crate) const L_RESUMED_FENCED: usize = 7;
    pub(crate) const L_TORN_CLAIMS: usize = 8;
    pub(crate) const L_READS: usize = 9;
    pub(crate) const L_STALE_ENTRY: usize = 10;
    pub(crate) const L_STALE_PROBES: usize = 11;
    pub(crate) const L_SIB_RELEASES: usize = 12;
    pub(crate) const L_SIB_RELEASES_WRITING: usize = 13;
    pub(crate) const H_OPS: usize = 16;
    pub(crate) const H_REGISTER: usize = 17;
    pub(crate) const H_TAKEN: usize = 18;
    pub(crate) const H_DONE: usize = 19;
    pub(crate) const H_FENCED: usize = 20;
    pub(crate) const H_REJECTED: usize = 21;
    pub(crate) const H_TAKE_RACE: usize = 22;
    pub(crate) const C_OPS: usize = 24;
    pub(crate) const C_STORES: usize = 25;
    pub(crate) const C_UPDATES: usize = 26;
    pub(crate) const C_LOADS: usize = 27;
    pub(crate) const C_SUPERSEDED: usize = 28;
    pub(crate) const C_TAKEOVERS: usize = 29;
    pub(crate) const C_CHECKS: usize = 30;
    pub(crate) const S_OPS: usize = 32;
    pub(crate) const S_ACQUIRED: usize = 33;
    pub(crate) const S_TIMEOUTS: usize = 34;
    pub(crate) const S_CHECKS: usize = 35;
    pub(crate) const S_CHECK_SKIPPED: usize = 36;
    pub(crate) const S_MAX_IN_USE: usize = 37;
    /// Violations by primitive (invariant names start with L, H, S, C, R; others: crashes,
    /// hangs).
    pub(crate) const V_LEASE: usize = 48;
    pub(crate) const V_HEARTBEAT: usize = 49;
    pub(crate) const V_SEMAPHORE: usize = 50;
    pub(crate) const V_OTHER: usize = 51;
    pub(crate) const V_CELL: usize = 53;
    pub(crate) const V_RWLOCK: usize = 52;
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
        let ctl = Words::create(&dir.join(FILE), TAG, stat::COUNT)?;
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

    pub(crate) fn bump(&self, which: usize, n: u64) {
        self.ctl.word(which).fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn max(&self, which: usize, v: u64) {
        self.ctl.word(which).fetch_max(v, Ordering::Relaxed);
    }

    pub(crate) fn stat(&self, which: usize) -> u64 {
        self.ctl.word(which).load(Ordering::Relaxed)
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
                Some(b'L') => stat::V_LEASE,
                Some(b'H') => stat::V_HEARTBEAT,
                Some(b'S') => stat::V_SEMAPHORE,
                Some(b'C') => stat::V_CELL,
                Some(b'R') => stat::V_RWLOCK,
                _ => stat::V_OTHER,
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

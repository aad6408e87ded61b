//! Process identity: a pid plus the process start time, which a reused pid does not share.
//!
//! The start time is field 22 of `/proc/<pid>/stat` (clock ticks since boot). Where `/proc`
//! is not available the start time is 0, meaning "unknown": callers then fall back to
//! heartbeats.

use std::sync::atomic::{AtomicU64, Ordering};

/// A process, named so that a later process with the same pid is a different identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    /// The process id.
    pub pid: u32,
    /// Start time in clock ticks since boot; 0 when unknown.
    pub start_time: u64,
}

/// What `/proc` says about a pid right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcStatus {
    /// Running, sleeping or stopped, with this start time.
    Live {
        /// Start time in clock ticks since boot.
        start_time: u64,
    },
    /// Exited but not yet reaped (a zombie), or being torn down: dead for our purposes.
    Zombie,
    /// No such process.
    Gone,
    /// `/proc` could not tell (not mounted, permission, unparsable).
    Unknown,
}

/// Reads `/proc/<pid>/stat`.
pub fn proc_status(pid: u32) -> ProcStatus {
    if pid == 0 {
        return ProcStatus::Unknown;
    }
    let path = format!("/proc/{pid}/stat");
    match std::fs::read(&path) {
        Ok(bytes) => parse_stat(&bytes).unwrap_or(ProcStatus::Unknown),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Distinguish "no such pid" from "no /proc at all".
            if std::path::Path::new("/proc/self/stat").exists() {
                ProcStatus::Gone
            } else {
                ProcStatus::Unknown
            }
        }
        Err(_) => ProcStatus::Unknown,
    }
}

/// Parses the text of a `/proc/<pid>/stat` file. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(bytes: &[u8]) -> Option<ProcStatus> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(bytes.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22 the start time, i.e. 19 fields after the state.
    let state = fields.next()?.bytes().next()?;
    let start_time: u64 = fields.nth(18)?.parse().ok()?;
    Some(match state {
        b'Z' | b'X' | b'x' => ProcStatus::Zombie,
        _ => ProcStatus::Live { start_time },
    })
}

// Cached identity of this process: (pid, start_time). A forked child without exec keeps
// the parent's cache; its real pid then differs from the cached one, which only costs it
// the OS-identity fast path (it is treated like any other caller-chosen pid).
static SELF_PID: AtomicU64 = AtomicU64::new(0);
static SELF_START: AtomicU64 = AtomicU64::new(0);

/// This process's identity (cached after the first call).
#[inline]
pub fn current() -> ProcessIdentity {
    let pid = SELF_PID.load(Ordering::Acquire);
    if pid != 0 {
        return ProcessIdentity {
            pid: pid as u32,
            start_time: SELF_START.load(Ordering::Relaxed),
        };
    }
    current_slow()
}

#[cold]
fn current_slow() -> ProcessIdentity {
    let pid = std::process::id();
    let start_time = match proc_status(pid) {
        ProcStatus::Live { start_time } => start_time,
        _ => 0,
    };
    SELF_START.store(start_time, Ordering::Relaxed);
    SELF_PID.store(u64::from(pid), Ordering::Release);
    ProcessIdentity { pid, start_time }
}

/// The cached pid of this process, without a system call once warmed up.
#[inline]
pub fn current_pid() -> u32 {
    current().pid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line =
            b"1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(ProcStatus::Live { start_time: 987654 })
        );
        let zombie = b"1 (x) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(zombie), Some(ProcStatus::Zombie));
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S 1"), None);
    }

    #[test]
    fn self_is_live_and_matches() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(
            proc_status(me.pid),
            ProcStatus::Live {
                start_time: me.start_time
            }
        );
        assert_ne!(me.start_time, 0);
    }
}

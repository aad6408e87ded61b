//! A process none of whose own threads is left must end, whatever threads of ours it has.
//!
//! Linux ends a process when its last thread ends, and glibc, when the last thread
//! returns or calls `pthread_exit(3)`, calls `exit(3)` with status 0. The cxc crates'
//! long-lived threads (the lease's sentinel, the async reactor's threads, an election's
//! background renewer, a sidecar, the etcd backend's runtime) only sleep, or only keep
//! claims alive: in a process whose main thread exited (the `pthread_exit` pattern) they
//! would be its last threads once the application's threads end, and keep it alive for
//! ever, and with it every claim, permit and leadership it holds. So each of them calls
//! [`look`] once a second while the main thread runs ([`LOOK_IDLE`]), every
//! [`LOOK_EVERY`] once it has exited: when two looks at least half of that apart find
//! the main thread exited and no thread left that is not ours, the process exits as its
//! last thread would have made it, with the main thread's exit status, through
//! [`std::process::exit`] (so `atexit` handlers run, as glibc's would).
//!
//! A look costs one read of `/proc/self/stat` while the main thread runs (and, on these
//! virtual machines, the 100–300 µs of CPU that waking an idle thread costs, so once a
//! second); only when it has exited are the threads' `stat` files read. Ours are the
//! threads whose name begins with [`OURS`] (`cxc-`; every thread the cxc crates start for
//! longer than one call is named so). A thread of any other name, in any state but
//! exited (stopped, in a system call, traced), keeps the process alive. Without a
//! readable `/proc` nothing is decided.
//!
//! # Examples
//! A long-lived helper thread's loop (its name must begin with [`OURS`]):
//! ```
//! use cxc_mmf::orphan;
//!
//! let helper = std::thread::Builder::new()
//!     .name(format!("{}example", orphan::OURS))
//!     .spawn(|| {
//!         for _ in 0..2 {
//!             // ... the helper's work, then sleep until the next look is due.
//!             let next = orphan::look();
//!             assert_eq!(next, orphan::LOOK_IDLE); // the main thread runs
//!         }
//!     })
//!     .unwrap();
//! helper.join().unwrap();
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a long-lived thread of ours looks while the main thread runs.
pub const LOOK_IDLE: Duration = Duration::from_secs(1);

/// How often it looks once the main thread has exited.
pub const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The prefix of the names of the cxc crates' own threads: a look counts a thread so
/// named as the library's, not the application's.
pub const OURS: &str = "cxc-";

/// Nanoseconds since [`epoch`] when a look first found no thread of the application
/// left (0: the last look found one). Looks of several threads share it.
static ORPHANED_SINCE: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Looks whether any thread of the application is left (see the module's docs), and
/// ends the process if the look before this one, at least half of [`LOOK_EVERY`]
/// earlier, found none either. Returns when to look next.
pub fn look() -> Duration {
    let (next, orphaned) = match orphaned() {
        Look::MainRuns => (LOOK_IDLE, None),
        Look::Others => (LOOK_EVERY, None),
        Look::Orphaned(status) => (LOOK_EVERY, Some(status)),
    };
    let Some(status) = orphaned else {
        ORPHANED_SINCE.store(0, Ordering::Relaxed);
        return next;
    };
    let now = (epoch().elapsed().as_nanos() as u64).max(1);
    let since = ORPHANED_SINCE.load(Ordering::Relaxed);
    if since == 0 {
        ORPHANED_SINCE.store(now, Ordering::Relaxed);
    } else if now.saturating_sub(since) >= LOOK_EVERY.as_nanos() as u64 / 2 {
        std::process::exit(status);
    }
    next
}

/// The looks of a thread that also wakes for its own work: [`tick`](Self::tick) at every
/// wake-up makes a [`look`] when one is due.
///
/// ```
/// let mut looks = cxc_mmf::orphan::Looker::new();
/// // Nothing is due yet: the first look is one LOOK_IDLE away.
/// assert!(looks.tick() <= cxc_mmf::orphan::LOOK_IDLE);
/// ```
#[derive(Debug)]
pub struct Looker {
    next: Instant,
}

impl Looker {
    /// The first look is due [`LOOK_IDLE`] from now.
    pub fn new() -> Self {
        Looker {
            next: Instant::now() + LOOK_IDLE,
        }
    }

    /// Looks if a look is due (which may end the process, see [`look`]); returns how long
    /// until the next one is: sleep no longer than that.
    pub fn tick(&mut self) -> Duration {
        let now = Instant::now();
        if now >= self.next {
            self.next = now + look();
        }
        self.next.saturating_duration_since(now)
    }
}

impl Default for Looker {
    fn default() -> Self {
        Self::new()
    }
}

/// What a look found.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// The main thread runs (or `/proc` cannot tell).
    MainRuns,
    /// The main thread has exited; another thread of the application runs (or may).
    Others,
    /// The main thread has exited with this status, and no thread is left but ours.
    Orphaned(i32),
}

fn orphaned() -> Look {
    let Some(main) = std::fs::read("/proc/self/stat").ok() else {
        return Look::MainRuns;
    };
    match split_stat(&main) {
        Some((b'Z' | b'X', _, rest)) => orphan_status(rest).map_or(Look::Others, Look::Orphaned),
        _ => Look::MainRuns,
    }
}

/// With the main thread exited (`rest`: its `stat` fields after the state): its exit
/// status if every thread of this process that has not exited is one of ours.
fn orphan_status(rest: &str) -> Option<i32> {
    // Field 52, the exit status in waitpid's encoding (`rest` begins with field 4).
    let code: i32 = rest.split_ascii_whitespace().nth(48)?.parse().ok()?;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = match std::fs::read(task.ok()?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that ended while we read is gone; one we cannot read may not be.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(_) => return None,
        };
        let (state, name, _) = split_stat(&stat)?;
        if !matches!(state, b'Z' | b'X') && !name.starts_with(OURS) {
            return None;
        }
    }
    Some((code >> 8) & 0xff)
}

/// A `stat` file's state letter, command name and the fields after the state. The name
/// may hold spaces and parentheses: it ends at the last `)`.
fn split_stat(bytes: &[u8]) -> Option<(u8, &str, &str)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?;
    let after = text.get(close + 1..)?.trim_start();
    let state = *after.as_bytes().first()?;
    Some((state, name, after.get(1..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_not_orphaned() {
        // This test's main thread runs (or waits for this thread): not orphaned.
        assert_eq!(orphaned(), Look::MainRuns);
        assert_eq!(look(), LOOK_IDLE);
        assert_eq!(look(), LOOK_IDLE);
        assert_eq!(ORPHANED_SINCE.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn stat_lines_split_at_the_last_parenthesis() {
        let line = b"42 (a (b) c) Z 1 2 3";
        let (state, name, rest) = split_stat(line).unwrap();
        assert_eq!((state, name, rest.trim()), (b'Z', "a (b) c", "1 2 3"));
        assert_eq!(split_stat(b"42 noname"), None);
        assert_eq!(split_stat(b"42 (x)"), None);
    }
}

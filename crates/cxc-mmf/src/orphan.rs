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
//! threads that registered themselves with [`ours`] (every thread the cxc crates start
//! for longer than one call does so, first thing): a thread's name says nothing, since a
//! thread inherits its creator's, so an application thread started from code of the
//! application that runs on a thread of ours (a backend's `renew`, a sidecar policy)
//! is named like ours and is still the application's. A thread not registered, in any
//! state but exited (stopped, in a system call, traced), keeps the process alive. A
//! look decides nothing unless its listing of the threads is complete: the count of
//! threads in `/proc/self/stat` must be the same before and after it and equal to the
//! number listed, and no listed thread may vanish while its `stat` is read (a thread
//! that hands off to a new one and ends, over and over, can otherwise slip through
//! every listing). Without a readable `/proc` nothing is decided.
//!
//! # Examples
//! A long-lived helper thread's loop (it registers first; its name should begin with
//! [`OURS`], for people reading thread lists):
//! ```
//! use cxc_mmf::orphan;
//!
//! let helper = std::thread::Builder::new()
//!     .name(format!("{}example", orphan::OURS))
//!     .spawn(|| {
//!         orphan::ours();
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

/// The prefix of the names of the cxc crates' own threads (for people reading thread
/// lists: a look goes by [`ours`], not by names).
pub const OURS: &str = "cxc-";

/// Registered threads of ours: `lineage token << 32 | tid` (0: free). The lineage token
/// (`identity::current_proc`) makes a forked child ignore its parent's registrations.
static REGISTRY: [AtomicU64; REGISTRY_LEN] = [const { AtomicU64::new(0) }; REGISTRY_LEN];
const REGISTRY_LEN: usize = 256;

/// This thread's registration, undone by its thread-local destructor when it ends.
struct Registration(Option<(usize, u64)>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some((i, key)) = self.0 {
            let _ = REGISTRY[i].compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static REGISTERED: std::cell::RefCell<Registration> =
        const { std::cell::RefCell::new(Registration(None)) };
}

fn key_of(tid: u32) -> u64 {
    u64::from(crate::identity::current_proc()) << 32 | u64::from(tid)
}

fn this_tid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// Registers the calling thread as one of ours until it ends, so that a look does not
/// count it as the application's. Idempotent. With the registry full (256 threads of
/// ours at once) the thread stays unregistered: then it keeps an orphaned process alive
/// (the safe side), as any application thread does.
pub fn ours() {
    let key = key_of(this_tid());
    let _ = REGISTERED.try_with(|r| {
        let mut r = r.borrow_mut();
        if r.0.is_some_and(|(_, k)| k == key) {
            return;
        }
        r.0 = REGISTRY.iter().enumerate().find_map(|(i, e)| {
            e.compare_exchange(0, key, Ordering::AcqRel, Ordering::Relaxed)
                .ok()
                .map(|_| (i, key))
        });
    });
}

/// Whether thread `tid` of this process registered with [`ours`].
fn is_ours(tid: u32) -> bool {
    let key = key_of(tid);
    REGISTRY.iter().any(|e| e.load(Ordering::Acquire) == key)
}

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
        Some((b'Z' | b'X', rest)) => orphan_status(rest).map_or(Look::Others, Look::Orphaned),
        _ => Look::MainRuns,
    }
}

/// Field 20 of a `stat` line, the number of threads (`rest` begins with field 4).
fn thread_count(rest: &str) -> Option<usize> {
    rest.split_ascii_whitespace().nth(16)?.parse().ok()
}

/// With the main thread exited (`rest`: its `stat` fields after the state): its exit
/// status if every thread of this process that has not exited is one of ours, as seen by
/// a complete listing (see the module's docs).
fn orphan_status(rest: &str) -> Option<i32> {
    // Field 52, the exit status in waitpid's encoding (`rest` begins with field 4).
    let code: i32 = rest.split_ascii_whitespace().nth(48)?.parse().ok()?;
    let before = thread_count(rest)?;
    let mut listed = 0usize;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?;
        let tid: u32 = task.file_name().to_str()?.parse().ok()?;
        listed += 1;
        // A thread that vanished while we read may have handed off to one the listing
        // missed; one we cannot read may run: either way, decide nothing.
        let stat = std::fs::read(task.path().join("stat")).ok()?;
        let (state, _) = split_stat(&stat)?;
        if !matches!(state, b'Z' | b'X') && !is_ours(tid) {
            return None;
        }
    }
    let after = std::fs::read("/proc/self/stat").ok()?;
    let (_, after) = split_stat(&after)?;
    (before == listed && thread_count(after)? == listed).then_some((code >> 8) & 0xff)
}

/// A `stat` file's state letter and the fields after it. The command name (field 2) may
/// hold any bytes, spaces, parentheses and cut UTF-8 sequences included: it ends at the
/// last `)`, and only what follows it must be text.
fn split_stat(bytes: &[u8]) -> Option<(u8, &str)> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    bytes.get(..close)?.iter().position(|&b| b == b'(')?;
    let after = std::str::from_utf8(bytes.get(close + 1..)?)
        .ok()?
        .trim_start();
    let state = *after.as_bytes().first()?;
    Some((state, after.get(1..)?))
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
        let (state, rest) = split_stat(line).unwrap();
        assert_eq!((state, rest.trim()), (b'Z', "1 2 3"));
        assert_eq!(split_stat(b"42 noname"), None);
        assert_eq!(split_stat(b"42 (x)"), None);
        // A name cut by the kernel's 15-byte limit in the middle of a character.
        let cut = b"42 (pr\xc3\xbcfung-auftr\xc3) Z 1 2 3";
        assert_eq!(
            split_stat(cut).map(|(s, r)| (s, r.trim())),
            Some((b'Z', "1 2 3"))
        );
    }

    #[test]
    fn threads_register_until_they_end() {
        let tid = std::thread::spawn(|| {
            let tid = this_tid();
            assert!(!is_ours(tid));
            ours();
            ours();
            assert!(is_ours(tid));
            assert_eq!(
                REGISTRY
                    .iter()
                    .filter(|e| e.load(Ordering::Relaxed) == key_of(tid))
                    .count(),
                1
            );
            tid
        })
        .join()
        .unwrap();
        assert!(!is_ours(tid), "a thread that ended is no longer ours");
        assert!(!is_ours(this_tid()));
    }

    #[test]
    fn the_thread_count_is_field_20() {
        let stat = std::fs::read("/proc/self/stat").unwrap();
        let (_, rest) = split_stat(&stat).unwrap();
        let listed = std::fs::read_dir("/proc/self/task").unwrap().count();
        // Other tests' threads come and go: the count is at least this one and the main.
        assert!(thread_count(rest).unwrap() >= 2);
        assert!(listed >= 2);
    }
}

//! Process identity and liveness: one module owns both.
//!
//! # The identity model
//!
//! A pid is neither unique over time (the kernel reuses it) nor unique across pid
//! namespaces, and files outlive reboots. An [`Identity`] therefore records four words:
//!
//! | field    | what                                                                 |
//! |----------|----------------------------------------------------------------------|
//! | `pid`    | the pid, as seen in the pid namespace below                         |
//! | `pidns`  | nsfs inode of that pid namespace (0 = unknown: identity unknown)    |
//! | `boot`   | 64-bit FNV-1a hash of `/proc/sys/kernel/random/boot_id`             |
//! | `unique` | pidfs inode of a pidfd for the process, or [`FALLBACK_BIT`]` \| start` |
//!
//! On kernels with pidfs (Linux 6.9+) `unique` is `fstat(pidfd).st_ino`, which the kernel
//! never hands to another process during one boot: with the boot id the identity is
//! never reused while the machine is up. Without pidfs (or when forced by
//! [`force_fallback`] / `CXC_IDENTITY_FALLBACK=1`) `unique` is [`FALLBACK_BIT`] or'ed
//! with the start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
//!
//! **The same-tick window of the fallback path**: start times have the resolution of one
//! clock tick (`sysconf(_SC_CLK_TCK)`, 100 Hz: 10 ms). A process that dies and whose pid
//! is handed to a new process that starts within the same tick looks identical (same pid,
//! same start time, same boot). Pid reuse needs the whole pid space (`pid_max`, 4 194 304
//! by default on 64-bit) to wrap within those 10 ms, or a crafted `ns_last_pid`; the
//! pidfs path has no such window. A process started one tick later under the same pid
//! is not taken for the old one but gets [`Liveness::Unknown`] (see below), so its
//! holder's record is judged dead only once that pid is free again.
//!
//! # What counts as dead
//!
//! [`liveness`] says [`Liveness::Dead`] only when the **whole thread group** is gone: a
//! pidfd for it polls readable, `pidfd_open` answers `ESRCH`, or (without pidfds) every
//! task in `/proc/<pid>/task` is a zombie or gone. A main thread that called
//! `pthread_exit` while other threads run makes `/proc/<pid>/stat` say `Z`; that letter
//! is not a death certificate and such a process is [`Liveness::Alive`]. A pid that now
//! names another process (another pidfs inode, or on the fallback path a start time more
//! than one tick away) is Dead too, as is any identity recorded during another boot. A
//! start time exactly one tick away is [`Liveness::Unknown`]: a time namespace whose boot
//! clock offset is not a whole tick makes `/proc` round the same start time either way.
//!
//! # Pid namespaces
//!
//! A pid means something only in its pid namespace. An identity recorded in another
//! namespace than the caller's (another `pidns`) gets [`Liveness::Unknown`]: we cannot
//! see that process, so we neither declare it dead nor alive, and primitives fall back to
//! heartbeats/timeouts for it. The `/proc` fallback is used only when `/proc` is mounted
//! for our own namespace (`/proc/self` names our pid); otherwise it answers Unknown. Our
//! namespace is read from `/proc/self/ns/pid`, else from a pidfd
//! (`PIDFD_GET_PID_NAMESPACE`); an identity without one is unknown.
//!
//! # What `/proc` cannot tell
//!
//! A pid missing from `/proc` is gone only if `kill(pid, 0)` says `ESRCH`: a `/proc`
//! mounted `hidepid=invisible` hides other users' processes. A fact of our own identity
//! that fails for a passing reason ([`identify`]: out of descriptors or memory) is read
//! again later, never cached as unknown. Start times are taken back to the machine's
//! boot clock (a time namespace shifts what `/proc` shows by the reader's offset), and
//! [`monotonic_offset_ns`] gives the shift of our monotonic clock.
//!
//! # Cost
//!
//! [`Identity::current`] is cached in a page mapped with `MADV_WIPEONFORK` (a child made by
//! `fork` without `exec` sees it wiped and computes its own, different identity): after
//! the first call it costs a few atomic loads and no system call. [`liveness`] and the
//! `/proc` helpers allocate nothing, so a scanner may call them on every round.

mod cache;
mod pidfd;
mod procfs;
mod watch;

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use rustix::io::Errno;

pub use procfs::{ProcStatus, parse_stat, proc_status};
pub use watch::PidWatch;

/// Set in [`Identity::unique`] when it holds a start time (fallback path) rather than a
/// pidfs inode.
pub const FALLBACK_BIT: u64 = 1 << 63;

/// A process identity that is never reused while the machine is up (see the module
/// documentation for the fallback path's same-tick window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Identity {
    /// The pid, in the namespace `pidns`.
    pub pid: u32,
    /// Inode of the pid namespace (`/proc/self/ns/pid`); 0 if unknown.
    pub pidns: u64,
    /// Hash of the boot id; 0 if unknown.
    pub boot: u64,
    /// pidfs inode, or [`FALLBACK_BIT`]` | start time in clock ticks`; 0 if unknown.
    pub unique: u64,
}

impl Identity {
    /// Number of `u64` words of [`Identity::to_words`].
    pub const WORDS: usize = 4;

    /// This process's identity: cached, no system call after the first call, and a new
    /// identity in a child made by `fork` without `exec`.
    #[inline]
    pub fn current() -> Identity {
        let f = cache::facts();
        let unique = if f.ino != 0 && !fallback_active() {
            f.ino
        } else if f.start != 0 {
            FALLBACK_BIT | f.start
        } else {
            0
        };
        Identity {
            pid: f.pid,
            pidns: f.pidns,
            boot: boot(),
            unique,
        }
    }

    /// The identity of the process `pid` of our pid namespace right now; `None` if there
    /// is no such process or it cannot be identified. (A zombie is identified: its
    /// liveness is then Dead.)
    pub fn of_pid(pid: u32) -> Option<Identity> {
        match lookup_pid(pid, fallback_active()) {
            PidLookup::Found(id) => Some(id),
            PidLookup::NoProcess | PidLookup::Unknown => None,
        }
    }

    /// Whether the identity names a process at all: `pid`, `pidns`, `unique` and `boot`
    /// are set. Without its pid namespace a pid cannot be checked by anyone (it would be
    /// looked up in the checker's namespace), so such an identity is never judged.
    #[inline]
    pub fn is_known(&self) -> bool {
        self.pid != 0 && self.pidns != 0 && self.unique != 0 && self.boot != 0
    }

    /// `[pid, pidns, boot, unique]`, for storing in a file.
    #[inline]
    pub fn to_words(&self) -> [u64; 4] {
        [u64::from(self.pid), self.pidns, self.boot, self.unique]
    }

    /// The inverse of [`Identity::to_words`]. A pid word above `u32::MAX` (a corrupt
    /// file) gives pid 0, an unknown identity.
    #[inline]
    pub fn from_words(w: [u64; 4]) -> Identity {
        Identity {
            pid: u32::try_from(w[0]).unwrap_or(0),
            pidns: w[1],
            boot: w[2],
            unique: w[3],
        }
    }

    /// Whether `unique` holds a start time (the fallback form).
    #[inline]
    pub fn is_fallback(&self) -> bool {
        self.unique & FALLBACK_BIT != 0
    }
}

/// What [`lookup_pid`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidLookup {
    /// The process that has the pid now (possibly a zombie).
    Found(Identity),
    /// No process of our pid namespace has the pid.
    NoProcess,
    /// The OS could not tell (no pidfs for the pidfs form, `/proc` not ours or missing for
    /// the fallback form, pid 0).
    Unknown,
}

/// The identity of the process that has `pid` in our namespace now, in the fallback form
/// (`fallback`: pid + start time) or the pidfs form, whatever [`fallback_active`] says.
/// Lets a caller compare with a record of either form.
pub fn lookup_pid(pid: u32, fallback: bool) -> PidLookup {
    let me = cache::facts();
    let boot = boot();
    // Without our own namespace's id, what we find could not be compared with a record.
    if pid == 0 || boot == 0 || me.pidns == 0 {
        return PidLookup::Unknown;
    }
    let unique = if fallback {
        if !me.proc_ours {
            return PidLookup::Unknown;
        }
        match procfs::stat_of(pid, None) {
            Some((ProcStatus::Live { .. } | ProcStatus::Zombie, s)) if s != 0 => {
                FALLBACK_BIT | procfs::machine_ticks(s, me.boot_off)
            }
            Some((ProcStatus::Gone, _)) => return PidLookup::NoProcess,
            _ => return PidLookup::Unknown,
        }
    } else {
        match pidfd::open(pid) {
            Ok(fd) => match pidfd::ino_of(&fd) {
                Some(ino) => ino,
                None => return PidLookup::Unknown,
            },
            // No such process, or the pid is a thread of another process.
            Err(Errno::SRCH) | Err(Errno::INVAL) => return PidLookup::NoProcess,
            Err(_) => return PidLookup::Unknown,
        }
    };
    PidLookup::Found(Identity {
        pid,
        pidns: me.pidns,
        boot,
        unique,
    })
}

/// Whether `e` is a failure that passes (the process or the system is short of file
/// descriptors or memory, or a call was interrupted), as opposed to a fact the system
/// does not have: an identity fact that failed so is read again later, never cached as
/// unknown.
pub(crate) fn passing_error(e: Errno) -> bool {
    matches!(
        e,
        Errno::MFILE | Errno::NFILE | Errno::NOMEM | Errno::AGAIN | Errno::INTR | Errno::NOBUFS
    )
}

/// This process's identity, as [`Identity::current`], or the error that kept part of it
/// from being read now (out of file descriptors or memory): a record made with the
/// incomplete identity would be unknown for good (never judged dead), so the primitives
/// refuse to create or open a file then, and a later call tries again.
///
/// # Errors
/// The `errno` of the failed read (`EMFILE`, `ENFILE`, `ENOMEM`, ...).
pub fn identify() -> Result<Identity, Errno> {
    cache::facts_checked().map_err(|(_, e)| e)?;
    Ok(Identity::current())
}

/// [`identify`] for a record in the file at `path`: the error is an [`MmfError::Io`](crate::MmfError::Io)
/// ("identify this process") naming it. Every registration that records this process's
/// identity in a file (a holder slot, an identity slot, a heartbeat slot) goes through
/// it, so a forked child short of descriptors never records an identity that stays
/// unknown (its registration fails, and is tried again on the next use).
///
/// # Errors
/// As [`identify`].
pub fn identify_for(path: &std::path::Path) -> Result<Identity, crate::MmfError> {
    identify().map_err(|e| crate::MmfError::io("identify this process", path, e.into()))
}

/// This process's `CLOCK_MONOTONIC` offset in ns from the machine's: non-zero in a time
/// namespace (`unshare --time`), where every monotonic clock is shifted. Subtract it to
/// get a time all processes of the machine agree on. Cached; correct after `fork`.
#[inline]
pub fn monotonic_offset_ns() -> i64 {
    cache::mono_offset()
}

/// The verdict on a recorded identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The same process still runs (or is stopped), at least one of its threads.
    Alive,
    /// The whole thread group exited, the pid now names another process, or the identity
    /// is from another boot.
    Dead,
    /// Unknown identity, another pid namespace, or the OS could not tell.
    Unknown,
}

/// Whether no thread of the process `id` can run user code again: the process is dead,
/// or every thread `/proc/<pid>/task` lists is in the kernel's exit (`PF_EXITING`, set
/// at the start of `do_exit`, after which a thread never returns to user mode). `false`
/// when it cannot be told for `id` (unknown identity, another pid namespace, no `/proc`),
/// or while any thread may still run: a process whose main thread exited (`Z`) but
/// whose other threads run, or one that exec'd and lives on, is not stopped. A process
/// that is being killed reaches it within microseconds of its last thread taking the
/// signal, well before it is dead.
pub fn threads_stopped(id: &Identity) -> bool {
    // The task list first, with no pidfd: it is what a blocked claimant reads the moment
    // a holder's sentinel says it is exiting. It may be read only for an identity of our
    // pid namespace, through a `/proc` of our namespace, from this boot. If the pid was
    // reaped and reused meanwhile, `id` is dead, so "every thread in its exit" is true of
    // it whatever process the list shows.
    let me = cache::facts();
    if id.is_known()
        && id.boot == boot()
        && id.pidns == me.pidns
        && me.proc_ours
        && procfs::all_tasks_flagged(id.pid, PF_EXITING) == Some(true)
    {
        return true;
    }
    // Some thread may still run, or the list cannot tell: stopped only if dead.
    liveness(id) == Liveness::Dead
}

/// `PF_EXITING` in a task's flags (`/proc/<pid>/task/<tid>/stat`, field 9).
const PF_EXITING: u64 = 0x4;

/// Whether the process `id` still exists (see the module documentation for the rules).
/// Allocation-free.
pub fn liveness(id: &Identity) -> Liveness {
    if !id.is_known() {
        return Liveness::Unknown;
    }
    let boot = boot();
    if boot == 0 {
        return Liveness::Unknown;
    }
    if id.boot != boot {
        return Liveness::Dead;
    }
    let me = cache::facts();
    if id.pidns != me.pidns {
        return Liveness::Unknown;
    }
    if id.is_fallback() {
        liveness_fallback(id, &me)
    } else {
        liveness_pidfs(id)
    }
}

fn liveness_pidfs(id: &Identity) -> Liveness {
    match pidfd::open(id.pid) {
        Ok(fd) => match pidfd::ino_of(&fd) {
            Some(ino) if ino == id.unique => match pidfd::exited(std::os::fd::AsFd::as_fd(&fd)) {
                Some(true) => Liveness::Dead,
                Some(false) => Liveness::Alive,
                None => Liveness::Unknown,
            },
            // The pid names another process now.
            Some(_) => Liveness::Dead,
            None => Liveness::Unknown,
        },
        // No such process; or the pid is now a thread of another process (a pidfd can
        // only be opened for a thread-group leader, and ours was one).
        Err(Errno::SRCH) | Err(Errno::INVAL) => Liveness::Dead,
        Err(_) => Liveness::Unknown,
    }
}

fn liveness_fallback(id: &Identity, me: &cache::Facts) -> Liveness {
    if !me.proc_ours {
        return Liveness::Unknown;
    }
    let start = id.unique & !FALLBACK_BIT;
    match procfs::stat_of(id.pid, None) {
        None => Liveness::Unknown,
        Some((ProcStatus::Gone, _)) => Liveness::Dead,
        // Another process has the pid now; one tick away may be the same process seen
        // through a time namespace whose boot clock offset is not a whole tick (`/proc`
        // rounds the shifted start time): cannot tell.
        Some((_, s)) if procfs::machine_ticks(s, me.boot_off).abs_diff(start) == 1 => {
            Liveness::Unknown
        }
        Some((_, s)) if procfs::machine_ticks(s, me.boot_off) != start => Liveness::Dead,
        Some((ProcStatus::Live { .. }, _)) => Liveness::Alive,
        // The main thread exited: alive as long as any thread runs.
        Some(_) => match pidfd::open(id.pid) {
            Ok(fd) if watch::verify(&fd, id) => {
                match pidfd::exited(std::os::fd::AsFd::as_fd(&fd)) {
                    Some(true) => Liveness::Dead,
                    Some(false) => Liveness::Alive,
                    None => group_by_tasks(id.pid),
                }
            }
            Ok(_) | Err(Errno::SRCH) | Err(Errno::INVAL) => Liveness::Dead,
            Err(_) => group_by_tasks(id.pid),
        },
    }
}

fn group_by_tasks(pid: u32) -> Liveness {
    match procfs::any_task_alive(pid) {
        Some(true) => Liveness::Alive,
        Some(false) => Liveness::Dead,
        None => Liveness::Unknown,
    }
}

/// Whether any thread of process `pid` (of our namespace's `/proc`) still runs, from the
/// task list `/proc/<pid>/task` alone; `None` if `/proc` cannot tell. Allocation-free.
pub fn proc_group_alive(pid: u32) -> Option<bool> {
    procfs::any_task_alive(pid)
}

/// 0 = not read, 1 = forced on, 2 = forced off / not forced.
static FORCE: AtomicU8 = AtomicU8::new(0);

/// Makes this process behave as on a kernel without pidfs: new identities take the
/// fallback form (pid + start time + boot id). For tests; the environment variable
/// `CXC_IDENTITY_FALLBACK=1` does the same at first use, so re-executed children can be
/// forced too. Identities already recorded keep their form and are still checked.
pub fn force_fallback(on: bool) {
    FORCE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether new identities take the fallback form (forced, or no pidfs).
#[inline]
pub fn fallback_active() -> bool {
    let forced = match FORCE.load(Ordering::Relaxed) {
        0 => read_env(),
        f => f == 1,
    };
    forced || !pidfd::kernel_has_pidfs()
}

#[cold]
fn read_env() -> bool {
    let on = std::env::var_os("CXC_IDENTITY_FALLBACK").is_some_and(|v| v == "1");
    // A concurrent `force_fallback` wins.
    let _ = FORCE.compare_exchange(
        0,
        if on { 1 } else { 2 },
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    FORCE.load(Ordering::Relaxed) == 1
}

/// 0 = not read yet; the boot id never changes while we run.
static BOOT: AtomicU64 = AtomicU64::new(0);

/// The hash of this boot's id; 0 if it cannot be read.
pub fn boot() -> u64 {
    match BOOT.load(Ordering::Relaxed) {
        0 => {
            let b = procfs::boot_hash();
            BOOT.store(b, Ordering::Relaxed);
            b
        }
        b => b,
    }
}

/// This process's pid, cached (correct after `fork`), without a system call once warm.
#[inline]
pub fn current_pid() -> u32 {
    cache::pid()
}

/// A token for this process that no process holding a `fork` copy of its memory shares,
/// even one that got the same pid back (a grandchild in a pid namespace, say): the key
/// for per-process state a handle keeps in its own memory (caches, guards, registrations).
/// Cached in the wipe-on-fork page, one load once warm; never 0. Processes that share no
/// memory may have equal tokens. On systems without `MADV_WIPEONFORK` it is the pid.
#[inline]
pub fn current_proc() -> u32 {
    cache::proc_token()
}

/// This process's start time in clock ticks since boot (0 if unknown), cached; the
/// creator field of file headers records it.
#[inline]
pub fn self_start_time() -> u64 {
    cache::facts().start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_round_trips() {
        let me = Identity::current();
        assert!(me.is_known(), "{me:?}");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(liveness(&me), Liveness::Alive);
        assert_eq!(Identity::from_words(me.to_words()), me);
        assert_eq!(Identity::of_pid(me.pid), Some(me));
        assert_eq!(liveness(&Identity::default()), Liveness::Unknown);
        let other_boot = Identity {
            boot: me.boot ^ 1,
            ..me
        };
        assert_eq!(liveness(&other_boot), Liveness::Dead);
        let other_ns = Identity {
            pidns: me.pidns ^ 1,
            ..me
        };
        assert_eq!(liveness(&other_ns), Liveness::Unknown);
        let watch = PidWatch::open(&me).expect("self can be watched");
        assert!(!watch.is_dead());
        assert!(PidWatch::open(&other_ns).is_none());
        assert_eq!(current_pid(), me.pid);
        assert_ne!(self_start_time(), 0);
    }

    #[test]
    fn another_start_time_or_inode_is_dead() {
        let me = Identity::current();
        let fb = Identity {
            unique: FALLBACK_BIT | self_start_time(),
            ..me
        };
        assert_eq!(liveness(&fb), Liveness::Alive);
        // One tick away cannot be told from this process seen through a time namespace
        // whose boot clock offset is not a whole tick; two ticks away is another process.
        let next_tick = Identity {
            unique: FALLBACK_BIT | (self_start_time() + 1),
            ..me
        };
        assert_eq!(liveness(&next_tick), Liveness::Unknown);
        let later = Identity {
            unique: FALLBACK_BIT | (self_start_time() + 2),
            ..me
        };
        assert_eq!(liveness(&later), Liveness::Dead);
        assert!(PidWatch::open(&later).is_none());
        if !me.is_fallback() {
            let other = Identity {
                unique: me.unique + 1,
                ..me
            };
            assert_eq!(liveness(&other), Liveness::Dead);
        }
        assert_eq!(Identity::from_words([1 << 40, 1, 1, 1]).pid, 0);
    }
}

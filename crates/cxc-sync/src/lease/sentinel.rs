//! The sentinel: the earliest notice the kernel gives that a holder's process is going.
//!
//! One thread per process that only sleeps (and looks, once a second, whether the
//! application has any thread left, see `cxc_mmf::orphan`). Its robust futex list (`set_robust_list(2)`)
//! holds the identity slots this process's handles registered: each slot's `robust` word
//! is a list entry and its `sentinel` word, next to it, holds the thread's id. A thread
//! that only sleeps ends only when its whole process does (a fatal signal, `exit_group`)
//! or when the process execs; no signal ends one thread alone. Then, in that thread's
//! exit (`exit_mm`, before the process's files are closed and well before a pidfd becomes
//! readable), the kernel walks the list and, for every entry whose word still holds the
//! thread's id, replaces the id by `FUTEX_OWNER_DIED` and wakes one waiter of the word.
//!
//! What it proves is that the process *is exiting* (or has exec'd), not that it is gone:
//! other threads may run user code until they take their SIGKILL, and an exec'd process
//! lives on. So a claimant takes such a holder over only once every thread of it is in
//! the kernel's exit as well (`cxc_mmf::identity::threads_stopped`), and then as stale,
//! never as dead: it supersedes the claim and quarantines a staging buffer that may be
//! in use (L7), exactly as for an expired heartbeat.
//!
//! The list is changed only under the lease's registration lock (`ident::REGISTRY`),
//! while the sentinel sleeps, in an order that keeps it well formed at every store (the
//! kernel reads it only when the thread ends, which may be at any moment). The addresses
//! of the linked entries are kept here too, so that unlinking never follows a pointer
//! read from a shared file. A handle unlinks the entries it linked before it unmaps
//! them. A forked child has no sentinel (the kernel does not copy a robust list, and
//! the thread is not copied): it starts its own, and never touches its parent's entries.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::forklock::ForkSafeMutex;

/// `FUTEX_WAITERS`: a waiter sleeps on the word (the kernel then wakes one at the death).
pub(crate) const FUTEX_WAITERS: u32 = 0x8000_0000;
/// `FUTEX_OWNER_DIED`: the thread whose id the word held has ended.
pub(crate) const FUTEX_OWNER_DIED: u32 = super::slot::SENTINEL_EXITING;
/// The thread-id bits of a robust futex word.
pub(crate) const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// `struct robust_list_head` of the kernel ABI. `next` is the first entry, or the head
/// itself when the list is empty; the last entry points back at the head.
#[repr(C)]
struct RobustHead {
    next: AtomicPtr<AtomicU64>,
    futex_offset: libc::c_long,
    pending: AtomicPtr<AtomicU64>,
}

/// A job for the sentinel thread (`host`), with the process that gave it.
type Job = Box<dyn FnOnce() + Send>;

/// The job handed to this process's sentinel thread and not yet taken, with the process
/// (lineage token) that handed it: a forked child never runs its parent's.
static JOB: ForkSafeMutex<Option<(u32, Job)>> = ForkSafeMutex::new(None);

/// This process's sentinel.
struct Sentinel {
    /// The process (lineage token) that started it: a forked child's copy is not its.
    proc: u32,
    /// Its thread id, as this process's pid namespace sees it (the kernel compares the
    /// word with the id in the thread's own namespace).
    tid: u32,
    head: &'static RobustHead,
    /// The linked entries, in list order (addresses of `robust` words).
    entries: Vec<usize>,
    /// The thread, to unpark when it is given a job (`host`, with feature `async`).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    thread: std::thread::Thread,
}

/// `None` until the first link, and in a child that has not linked yet.
static SENTINEL: ForkSafeMutex<Option<Sentinel>> = ForkSafeMutex::new(None);

/// The process (lineage token) whose sentinel thread did not report in time, or whose
/// kernel refused the robust list: it goes without one (its slots have no sentinel),
/// rather than start another thread that would be stuck the same way.
static GAVE_UP: AtomicU32 = AtomicU32::new(0);

/// The process (lineage token) that could not start a sentinel thread (the thread limit,
/// `RLIMIT_NPROC`, memory), and from when on (ms of `CLOCK_MONOTONIC`) it tries again:
/// a passing shortage, so it does not go without one for life, nor try at every claim.
static RETRY_PROC: AtomicU32 = AtomicU32::new(0);
static RETRY_AT_MS: AtomicU64 = AtomicU64::new(0);

/// How long a process that could not start its sentinel thread waits before it tries
/// again (at its next registration or async wait).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A head made for a thread that could not be started, for the next attempt (so that
/// retrying leaks nothing).
static SPARE_HEAD: ForkSafeMutex<Option<&'static RobustHead>> = ForkSafeMutex::new(None);

/// Why [`start`] gave no sentinel.
enum NoSentinel {
    /// No thread could be started: try again after [`RETRY_AFTER`].
    Spawn,
    /// The thread did not report in time, or the kernel refused its list: for life.
    GiveUp,
}

/// Whether this process has no sentinel yet only because it could not start the thread
/// (it tries again, see [`RETRY_AFTER`]): a handle then keeps going through its slow
/// path, which arms its slot once a sentinel runs.
pub(crate) fn start_pending() -> bool {
    let proc = cxc_mmf::identity::current_proc();
    // Relaxed: a hint; the slow path decides under the lock.
    RETRY_PROC.load(Ordering::Relaxed) == proc && GAVE_UP.load(Ordering::Relaxed) != proc
}

fn now_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1000) + t.tv_nsec as u64 / 1_000_000
}

/// How long a new sentinel thread may take to report its thread id. It takes
/// microseconds; a thread started in a child made by `fork` from a process with other
/// threads may never report, stuck on a lock of the C or Rust runtime that one of the
/// parent's threads held at the fork (a thread that does not exist in the child; found
/// with `attack3_mp::lease_fork_while_watchers_start_and_move_never_hangs_the_child`,
/// about one fork in a thousand): the claim then goes on without a sentinel.
const REPORT_WITHIN: Duration = Duration::from_secs(1);

/// Starts this process's sentinel thread. `Err` if no thread could be started, it did
/// not report, or the kernel refused the list (then slots simply have no sentinel).
fn start(proc: u32) -> Result<Sentinel, NoSentinel> {
    let spare = SPARE_HEAD.lock(|| None).take();
    let head: &'static RobustHead = spare.unwrap_or_else(|| {
        Box::leak(Box::new(RobustHead {
            next: AtomicPtr::new(ptr::null_mut()),
            futex_offset: super::slot::SENTINEL_FROM_ENTRY as libc::c_long,
            pending: AtomicPtr::new(ptr::null_mut()),
        }))
    });
    head.next.store(
        ptr::from_ref(head).cast_mut().cast::<AtomicU64>(),
        Ordering::Release,
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("cxc-sentinel".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            // One of the library's threads: it never keeps an orphaned process alive.
            cxc_mmf::orphan::ours();
            // SAFETY: `head` is leaked, so it outlives this thread; it is a well-formed
            // empty list (it points at itself) of the kernel's layout. This thread runs
            // nothing but this loop, so it never holds a pthread robust mutex whose list
            // (glibc's, which this replaces for this thread only) would be needed.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_set_robust_list,
                    ptr::from_ref(head),
                    size_of::<RobustHead>(),
                )
            };
            let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
            let ok = r == 0 && tid & !FUTEX_TID_MASK == 0;
            let _ = tx.send(ok.then_some(tid));
            if !ok {
                return;
            }
            // Never returns: this thread must end only with its process. A job it hosts
            // runs here; if that returns, or panics, the thread goes back to sleep. It
            // wakes to look whether the application has any thread left: if not, it ends
            // the process, which it must not keep alive (`cxc_mmf::orphan`).
            let mut next = cxc_mmf::orphan::LOOK_IDLE;
            loop {
                std::thread::park_timeout(next);
                next = cxc_mmf::orphan::look();
                let job = JOB.lock(|| None).take();
                if let Some((by, job)) = job
                    && by == proc
                {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            }
        });
    let thread = match thread {
        Ok(t) => t,
        Err(_) => {
            // The closure, the only other holder of `head`, was dropped unrun.
            *SPARE_HEAD.lock(|| None) = Some(head);
            return Err(NoSentinel::Spawn);
        }
    };
    let tid = rx
        .recv_timeout(REPORT_WITHIN)
        .ok()
        .flatten()
        .ok_or(NoSentinel::GiveUp)?;
    Ok(Sentinel {
        proc,
        tid,
        head,
        entries: Vec::new(),
        thread: thread.thread().clone(),
    })
}

/// This process's sentinel, started if needed (under the caller's lock of [`SENTINEL`]).
fn ensure(guard: &mut Option<Sentinel>) -> Option<&mut Sentinel> {
    let proc = cxc_mmf::identity::current_proc();
    if guard.as_ref().is_some_and(|s| s.proc != proc) {
        // A forked child's copy of its parent's: the parent's thread and entries.
        *guard = None;
    }
    // Relaxed: these are read and written only under the caller's lock of SENTINEL.
    let waiting = RETRY_PROC.load(Ordering::Relaxed) == proc
        && now_ms() < RETRY_AT_MS.load(Ordering::Relaxed);
    if guard.is_none() && GAVE_UP.load(Ordering::Relaxed) != proc && !waiting {
        match start(proc) {
            Ok(s) => {
                *guard = Some(s);
                RETRY_PROC.store(0, Ordering::Relaxed);
            }
            Err(NoSentinel::Spawn) => {
                RETRY_AT_MS.store(now_ms() + RETRY_AFTER.as_millis() as u64, Ordering::Relaxed);
                RETRY_PROC.store(proc, Ordering::Relaxed);
            }
            Err(NoSentinel::GiveUp) => GAVE_UP.store(proc, Ordering::Relaxed),
        }
    }
    guard.as_mut()
}

#[cfg(feature = "async")]
/// Runs `job`, which runs for the life of the process (the async reactor's death watch),
/// on this process's sentinel thread, started if needed, instead of on a thread of its
/// own: the sentinel only sleeps otherwise, and lives as long as the process, so the job
/// costs no thread. `Err(job)` if there is no sentinel (then the caller starts a thread),
/// or if another job was handed to it already.
pub(crate) fn host(job: Job) -> Result<(), Job> {
    let proc = cxc_mmf::identity::current_proc();
    let mut guard = SENTINEL.lock(|| None);
    let Some(s) = ensure(&mut guard) else {
        return Err(job);
    };
    {
        let mut slot = JOB.lock(|| None);
        if slot.as_ref().is_some_and(|(by, _)| *by == proc) {
            return Err(job);
        }
        *slot = Some((proc, job));
    }
    s.thread.unpark();
    Ok(())
}

/// Links `entry` (a slot's `robust` word, in a mapping the caller unlinks it from before
/// unmapping it) into this process's sentinel list and returns the sentinel's thread id,
/// which the caller then stores in the slot's sentinel word. `None`: no sentinel.
/// The caller holds `ident::REGISTRY` and owns the slot (registered by this process).
pub(crate) fn link(entry: &AtomicU64) -> Option<u32> {
    let mut guard = SENTINEL.lock(|| None);
    let s = ensure(&mut guard)?;
    let addr = ptr::from_ref(entry) as usize;
    if s.entries.contains(&addr) {
        return Some(s.tid);
    }
    // Push at the front: the entry first points where the head does, then the head at
    // the entry, so the list is whole after each store.
    let first = s.head.next.load(Ordering::Acquire);
    entry.store(first as u64, Ordering::Release);
    s.head
        .next
        .store(ptr::from_ref(entry).cast_mut(), Ordering::Release);
    s.entries.insert(0, addr);
    Some(s.tid)
}

/// Unlinks `entry` if this process's sentinel list holds it. The caller holds
/// `ident::REGISTRY`.
pub(crate) fn unlink(entry: &AtomicU64) {
    let proc = cxc_mmf::identity::current_proc();
    let mut guard = SENTINEL.lock(|| None);
    let Some(s) = guard.as_mut().filter(|s| s.proc == proc) else {
        return;
    };
    let addr = ptr::from_ref(entry) as usize;
    let Some(i) = s.entries.iter().position(|&a| a == addr) else {
        return;
    };
    let head_addr = ptr::from_ref(s.head) as usize;
    let after = s.entries.get(i + 1).copied().unwrap_or(head_addr);
    if i == 0 {
        s.head
            .next
            .store(after as *mut AtomicU64, Ordering::Release);
    } else {
        // SAFETY: every address in `entries` is the `robust` word of a slot in a mapping
        // that is still mapped: a handle unlinks what it linked before it unmaps, under
        // the same lock, and a forked child never reaches its parent's list (above).
        let before = unsafe { &*(s.entries[i - 1] as *const AtomicU64) };
        before.store(after as u64, Ordering::Release);
    }
    s.entries.remove(i);
}

/// Whether a sentinel word says its process is exiting or has exec'd.
#[inline]
pub(crate) fn exiting(word: u32) -> bool {
    word & FUTEX_OWNER_DIED != 0
}

/// Whether a sentinel word names a live sentinel (a waiter may sleep on it).
#[inline]
pub(crate) fn armed(word: u32) -> bool {
    word & FUTEX_TID_MASK != 0 && !exiting(word)
}

/// Clears a slot's sentinel word (its handle is going, or the slot is being given up)
/// and wakes whoever sleeps on it, so they look again.
pub(crate) fn disarm(word: &AtomicU32) {
    if word.swap(0, Ordering::SeqCst) & FUTEX_WAITERS != 0 {
        crate::futex::wake(word, u32::MAX);
    }
}

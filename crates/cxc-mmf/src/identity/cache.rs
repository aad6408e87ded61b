//! This process's identity, cached so that reading it costs no system call, and correct
//! in a child made by `fork` without `exec`.
//!
//! The cache lives in a page advised `MADV_WIPEONFORK`: a forked child sees it
//! zero-filled and computes its own identity instead of acting as its parent, whatever
//! made the child (libc's `fork`, or a raw `clone` that runs no fork handlers). The page
//! is a page-aligned static where the kernel accepts the advice for it (then the warm
//! pid is one load of a fixed address), else a mapping of its own. Where neither can be
//! made (not Linux, kernel < 4.14) a plain static is used and checked against `getpid`
//! on every read: correct, one system call slower.
//!
//! The slow path allocates nothing (it reads `/proc` into stack buffers), so a forked
//! child of a multi-threaded process may call it.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// The raw facts about this process, from which both forms of [`super::Identity`] are
/// made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Facts {
    pub(super) pid: u32,
    pub(super) pidns: u64,
    /// Start time in clock ticks (field 22 of `/proc/self/stat`); 0 if unknown.
    pub(super) start: u64,
    /// pidfs inode of a pidfd for this process; 0 if the kernel has no pidfs.
    pub(super) ino: u64,
    /// Whether `/proc` is mounted for our pid namespace (so `/proc/<pid>` means our pid).
    pub(super) proc_ours: bool,
    /// Our time namespace's offsets (ns) of `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` from
    /// the machine's (the initial time namespace's); 0 outside a time namespace.
    pub(super) mono_off: i64,
    pub(super) boot_off: i64,
}

#[repr(C)]
struct Cache {
    /// 0 = not filled; else the pid.
    pid: AtomicU64,
    pidns: AtomicU64,
    start: AtomicU64,
    ino: AtomicU64,
    proc_ours: AtomicU64,
    mono_off: AtomicU64,
    boot_off: AtomicU64,
    /// 0 = not yet taken; else this process's lineage token (see [`proc_token`]).
    proc: AtomicU64,
}

impl Cache {
    const fn new() -> Self {
        Cache {
            pid: AtomicU64::new(0),
            pidns: AtomicU64::new(0),
            start: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            proc_ours: AtomicU64::new(0),
            mono_off: AtomicU64::new(0),
            boot_off: AtomicU64::new(0),
            proc: AtomicU64::new(0),
        }
    }

    #[inline]
    fn get(&self) -> Option<Facts> {
        // SYNC: identity cache. Acquire pairs with the Release store of `pid` in `fill`,
        // after which the other fields are visible.
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(Facts {
                pid: pid as u32,
                pidns: self.pidns.load(Ordering::Relaxed),
                start: self.start.load(Ordering::Relaxed),
                ino: self.ino.load(Ordering::Relaxed),
                proc_ours: self.proc_ours.load(Ordering::Relaxed) != 0,
                mono_off: self.mono_off.load(Ordering::Relaxed) as i64,
                boot_off: self.boot_off.load(Ordering::Relaxed) as i64,
            }),
        }
    }

    fn fill(&self, f: Facts) {
        // Two threads filling at once store the same values.
        self.pidns.store(f.pidns, Ordering::Relaxed);
        self.start.store(f.start, Ordering::Relaxed);
        self.ino.store(f.ino, Ordering::Relaxed);
        self.proc_ours
            .store(u64::from(f.proc_ours), Ordering::Relaxed);
        self.mono_off.store(f.mono_off as u64, Ordering::Relaxed);
        self.boot_off.store(f.boot_off as u64, Ordering::Relaxed);
        // SYNC: identity cache (Release).
        self.pid.store(u64::from(f.pid), Ordering::Release);
    }
}

/// The wipe-on-fork page, once made (never unmapped): `WIPE` or a mapping of its own.
static PAGE: AtomicPtr<Cache> = AtomicPtr::new(ptr::null_mut());

/// A static page for the cache, so that the warm path reads a fixed address with no
/// pointer to follow. It is used only once `madvise(MADV_WIPEONFORK)` succeeded on it
/// (the static is all atomics, zero-initialized, so it lies in `.bss`, private anonymous
/// memory); it is aligned to and exactly one 4 KiB page, and used only where the page
/// size is 4 KiB, so wiping it touches nothing else.
#[repr(C, align(4096))]
struct WipePage {
    cache: Cache,
    _rest: [AtomicU64; WIPE_REST],
}

const WIPE_REST: usize = (4096 - size_of::<Cache>()) / 8;
const _: () = assert!(size_of::<WipePage>() == 4096);

static WIPE: WipePage = WipePage {
    cache: Cache::new(),
    _rest: [const { AtomicU64::new(0) }; WIPE_REST],
};
/// Set when the page cannot be made; then `STATIC` is used and verified by `getpid`.
static NO_PAGE: AtomicU32 = AtomicU32::new(0);
static STATIC: Cache = Cache::new();

/// This process's facts.
#[inline]
pub(super) fn facts() -> Facts {
    if let Some(f) = WIPE.cache.get() {
        return f;
    }
    let p = PAGE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null `PAGE` points to a `Cache` that is never unmapped: `WIPE`
        // (a static) or the start of a private anonymous mapping (see `make_page`); a
        // forked child inherits either (zero-filled), so the pointer stays valid there too.
        if let Some(f) = unsafe { &*p }.get() {
            return f;
        }
    }
    facts_slow()
}

/// This process's pid alone: one load of a static once warm (the hot paths of the
/// primitives key their per-handle caches by it).
#[inline]
pub(super) fn pid() -> u32 {
    // `WIPE` is filled only once it is wipe-on-fork (it is then `PAGE`), so a non-zero
    // pid there is this process's own.
    let pid = WIPE.cache.pid.load(Ordering::Acquire);
    if pid != 0 {
        return pid as u32;
    }
    let p = PAGE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as in `facts`.
        let pid = unsafe { &*p }.pid.load(Ordering::Acquire);
        if pid != 0 {
            return pid as u32;
        }
    }
    facts_slow().pid
}

/// This process's `CLOCK_MONOTONIC` offset from the machine's (its time namespace's,
/// ns): two loads of a static once warm.
#[inline]
pub(super) fn mono_offset() -> i64 {
    // As in `pid`: a filled `WIPE` is this process's own.
    if WIPE.cache.pid.load(Ordering::Acquire) != 0 {
        return WIPE.cache.mono_off.load(Ordering::Relaxed) as i64;
    }
    facts().mono_off
}

/// The largest lineage token taken in this memory image: plain memory, so a child made
/// by `fork` inherits it (while its wipe-on-fork page starts at zero) and takes a larger
/// token than every process whose memory it copies.
static LINEAGE: AtomicU32 = AtomicU32::new(0);

/// This process's lineage token: one load of a static once warm.
///
/// Unlike the pid, it differs between a process and every process that holds a copy of
/// its memory made by `fork` (a child, a grandchild, ...), also when one of those gets
/// the same pid back (pid reuse): a child's token is larger than every token in the
/// memory it inherited. Handles key the per-process state they keep in their own memory
/// (caches, guards) by it. Unrelated processes may share a token; they share no memory.
///
/// Without a wipe-on-fork page (not Linux, kernel < 4.14) it is the pid (correct for
/// `fork`, not for a descendant that gets an ancestor's pid back).
#[inline]
pub(super) fn proc_token() -> u32 {
    let t = WIPE.cache.proc.load(Ordering::Acquire);
    if t != 0 {
        return t as u32;
    }
    let p = PAGE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as in `facts`.
        let t = unsafe { &*p }.proc.load(Ordering::Acquire);
        if t != 0 {
            return t as u32;
        }
    }
    proc_token_slow()
}

#[cold]
fn proc_token_slow() -> u32 {
    let Some(cache) = page() else {
        return facts_slow().pid;
    };
    loop {
        let t = cache.proc.load(Ordering::Acquire);
        if t != 0 {
            return t as u32;
        }
        // One token per process, whichever thread takes it first. The lineage records
        // the candidate before the token is published: a fork in between would otherwise
        // give a child whose copy of memory may already key state by the token (another
        // thread read it) the same token, since the child's wiped page makes it take
        // `LINEAGE + 1` again. Recorded first, a child forked once the token is visible
        // takes a larger one; one forked before has no state keyed by it.
        let candidate = match LINEAGE.load(Ordering::SeqCst).wrapping_add(1) {
            0 => 1,
            c => c,
        };
        LINEAGE.fetch_max(candidate, Ordering::SeqCst);
        if cache
            .proc
            .compare_exchange(0, u64::from(candidate), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return candidate;
        }
    }
}

#[cold]
fn facts_slow() -> Facts {
    facts_checked().unwrap_or_else(|(f, _)| f)
}

/// This process's facts, computed if not cached. `Err((facts, errno))` when a fact could
/// not be read for a passing reason (out of file descriptors or memory): the facts are
/// then incomplete (an unknown start time or pidfs inode) and not cached, so a later
/// call reads them again. A fact the system does not have (no `/proc`, no pidfs) is no
/// error: it is cached as unknown.
pub(super) fn facts_checked() -> Result<Facts, (Facts, rustix::io::Errno)> {
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let cache = page().unwrap_or(&STATIC);
    if let Some(f) = cache.get()
        && f.pid == pid
    {
        return Ok(f);
    }
    let mut passing = None;
    let mut note = |e: rustix::io::Errno| {
        if super::passing_error(e) {
            passing = Some(e);
        }
    };
    let proc_ours = super::procfs::proc_is_ours(pid);
    let (mono_off, boot_off) = if proc_ours {
        super::procfs::time_offsets().unwrap_or_else(|e| {
            note(e);
            (0, 0)
        })
    } else {
        (0, 0)
    };
    // The start time whatever the main thread's state: a process whose main thread has
    // exited (`Z`, the `pthread_exit` pattern) before its first use of an identity is
    // this process all the same, and without a start time the fallback form would be
    // unknown (never judged dead, and shared with any later process of the same pid).
    let start = match super::procfs::stat_of_checked(pid, None) {
        Ok(Some((super::ProcStatus::Live { .. } | super::ProcStatus::Zombie, start_time)))
            if proc_ours =>
        {
            super::procfs::machine_ticks(start_time, boot_off)
        }
        Ok(_) => 0,
        Err(e) => {
            note(e);
            0
        }
    };
    let ino = match super::pidfd::ino_of_pid_checked(pid) {
        Ok(ino) => ino.unwrap_or(0),
        Err(e) => {
            note(e);
            0
        }
    };
    let f = Facts {
        pid,
        pidns: super::procfs::self_pidns(pid),
        start,
        ino,
        proc_ours,
        mono_off,
        boot_off,
    };
    match passing {
        Some(e) => Err((f, e)),
        None => {
            cache.fill(f);
            Ok(f)
        }
    }
}

/// The wipe-on-fork page, made on first use; `None` if it cannot be made.
fn page() -> Option<&'static Cache> {
    loop {
        let p = PAGE.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: as in `facts`.
            return Some(unsafe { &*p });
        }
        if NO_PAGE.load(Ordering::Relaxed) != 0 {
            return None;
        }
        match make_page() {
            Some(new) => {
                // Lock-free publication (a lock could be held across `fork` by another
                // thread); the loser unmaps its page.
                if PAGE
                    .compare_exchange(ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                    && !ptr::eq(new, &WIPE.cache)
                {
                    unmap_page(new);
                }
            }
            None => NO_PAGE.store(1, Ordering::Relaxed),
        }
    }
}

#[cfg(target_os = "linux")]
const PAGE_LEN: usize = 4096;

#[cfg(target_os = "linux")]
fn make_page() -> Option<*mut Cache> {
    use rustix::mm::{Advice, MapFlags, ProtFlags, madvise, mmap_anonymous};
    if page_size() == PAGE_LEN {
        let p = ptr::from_ref(&WIPE).cast_mut().cast::<std::ffi::c_void>();
        // SAFETY: `WIPE` is page-aligned and exactly one page long (asserted above, and
        // the page size is checked), so the advice covers no other object; wiping resets
        // its atomics to zero, a valid `Cache` meaning "not filled". The kernel refuses
        // the advice (and nothing changes) unless the page is private anonymous memory.
        if unsafe { madvise(p, PAGE_LEN, Advice::LinuxWipeOnFork) }.is_ok() {
            return Some(ptr::from_ref(&WIPE.cache).cast_mut());
        }
    }
    // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; no
    // existing memory is affected.
    let p = unsafe {
        mmap_anonymous(
            ptr::null_mut(),
            PAGE_LEN,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }
    .ok()?;
    // SAFETY: `p..p + PAGE_LEN` is exactly the mapping made above, which nothing else
    // uses yet.
    if unsafe { madvise(p, PAGE_LEN, Advice::LinuxWipeOnFork) }.is_err() {
        unmap_page(p.cast());
        return None;
    }
    // The mapping is zero-filled and page-aligned, so it holds a valid `Cache` (all
    // atomics, zero = "not filled").
    Some(p.cast())
}

/// The system's page size (`sysconf`, which reads the auxiliary vector libc kept; 0 if
/// unknown).
#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0)
}

#[cfg(target_os = "linux")]
fn unmap_page(p: *mut Cache) {
    // SAFETY: `p` came from `make_page` and was never published, so nothing refers to it.
    let _ = unsafe { rustix::mm::munmap(p.cast(), PAGE_LEN) };
}

#[cfg(not(target_os = "linux"))]
fn make_page() -> Option<*mut Cache> {
    None
}

#[cfg(not(target_os = "linux"))]
fn unmap_page(_p: *mut Cache) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn lineage_token_is_stable_and_nonzero() {
        let t = proc_token();
        assert_ne!(t, 0);
        assert_eq!(proc_token(), t);
        assert!(LINEAGE.load(Ordering::SeqCst) >= t || page().is_none());
    }

    #[test]
    fn warm_pid_comes_from_the_static_wipe_on_fork_page() {
        assert_eq!(pid(), std::process::id());
        if page_size() == PAGE_LEN {
            assert!(ptr::eq(PAGE.load(Ordering::Acquire), &WIPE.cache));
            assert_eq!(
                WIPE.cache.pid.load(Ordering::Acquire),
                u64::from(std::process::id())
            );
        }
    }
}

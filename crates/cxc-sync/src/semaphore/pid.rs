//! This process's identity (pid + start time), cheap to read and correct after `fork`.
//!
//! Every semaphore operation needs the caller's pid to find its cached holder slot, and
//! `getpid` is a system call (≈ 100 ns here). The identity is therefore cached in a page
//! mapped with `MADV_WIPEONFORK`: a child created by `fork` sees that page zero-filled,
//! so it recomputes its own identity instead of acting as its parent (whose holder slot,
//! if reused, would make the parent's death return the child's permits, or the child's
//! death return nothing). Where the page cannot be made (not Linux, kernel < 4.14), the
//! cached identity is checked against `std::process::id()` on every call: correct, just
//! one system call slower.
//!
//! `cxc_mmf::identity::current` is not used here because its cache survives `fork`.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::liveness::{ProcStatus, proc_status};

/// A process identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Me {
    /// Process id.
    pub(crate) pid: u32,
    /// Start time in clock ticks since boot; 0 if unknown.
    pub(crate) start: u64,
}

/// The cache; zero-filled in a forked child when it lives in the wipe-on-fork page.
#[repr(C)]
struct Cache {
    pid: AtomicU32,
    _pad: AtomicU32,
    start: AtomicU64,
}

impl Cache {
    const fn new() -> Self {
        Cache {
            pid: AtomicU32::new(0),
            _pad: AtomicU32::new(0),
            start: AtomicU64::new(0),
        }
    }

    #[inline]
    fn get(&self) -> Option<Me> {
        // SYNC: identity cache (Acquire; pairs with the Release store in `fill`).
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(Me {
                pid,
                start: self.start.load(Ordering::Relaxed),
            }),
        }
    }

    fn fill(&self, me: Me) {
        self.start.store(me.start, Ordering::Relaxed);
        // SYNC: identity cache (Release).
        self.pid.store(me.pid, Ordering::Release);
    }
}

/// The wipe-on-fork page, once made (never unmapped).
static PAGE: AtomicPtr<Cache> = AtomicPtr::new(ptr::null_mut());
/// Set when the page cannot be made; then `FALLBACK` is used and verified by `getpid`.
static NO_PAGE: AtomicU32 = AtomicU32::new(0);
static FALLBACK: Cache = Cache::new();

/// This process's pid, without a system call once warmed up.
#[inline]
pub(crate) fn current_pid() -> u32 {
    let p = PAGE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as in `current`.
        let pid = unsafe { &*p }.pid.load(Ordering::Relaxed);
        if pid != 0 {
            return pid;
        }
    }
    current_slow().pid
}

/// This process's identity.
#[inline]
pub(crate) fn current() -> Me {
    let p = PAGE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null `PAGE` points to a `Cache` at the start of a private
        // anonymous mapping that is never unmapped (see `make_page`); a forked child
        // inherits the mapping (zero-filled), so the pointer stays valid there too.
        if let Some(me) = unsafe { &*p }.get() {
            return me;
        }
    }
    current_slow()
}

#[cold]
fn current_slow() -> Me {
    let pid = std::process::id();
    let cache = page().unwrap_or(&FALLBACK);
    if let Some(me) = cache.get() {
        if me.pid == pid {
            return me;
        }
    }
    let start = match proc_status(pid) {
        ProcStatus::Live { start_time } => start_time,
        _ => 0,
    };
    let me = Me { pid, start };
    cache.fill(me);
    me
}

/// The wipe-on-fork page, made on first use; `None` if it cannot be made.
fn page() -> Option<&'static Cache> {
    loop {
        let p = PAGE.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: as in `current`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_os() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(
            proc_status(me.pid),
            ProcStatus::Live {
                start_time: me.start
            }
        );
        assert_eq!(current(), me);
        assert_eq!(current_pid(), me.pid);
    }
}

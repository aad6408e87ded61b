//! pidfds: a file descriptor naming one process, which the pid's reuse cannot redirect.
//! On kernels with pidfs (6.9+) the fd's inode number names the process uniquely for the
//! whole boot; a pidfd polls readable once the whole thread group has exited.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, pidfd_open};

/// `PIDFS_MAGIC` from `<linux/magic.h>`: the file system of pidfds on kernels with pidfs.
const PIDFS_MAGIC: i64 = 0x5049_4446;

/// 0 = not probed, 1 = pidfs, 2 = no pidfs.
static PIDFS: AtomicU8 = AtomicU8::new(0);

/// Opens a pidfd for `pid` (a thread-group leader in our pid namespace).
pub(super) fn open(pid: u32) -> Result<OwnedFd, Errno> {
    let raw = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or(Errno::INVAL)?;
    pidfd_open(raw, PidfdFlags::empty())
}

/// Whether pidfds live on pidfs here, so that their inode numbers name processes.
pub(super) fn kernel_has_pidfs() -> bool {
    match PIDFS.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => probe_pidfs().unwrap_or(false),
    }
}

/// Probes for pidfs once and caches the answer; `Err` (not cached) when the probe
/// failed for a passing reason (out of file descriptors or memory): a process that was
/// short of descriptors once must not take the fallback form for good.
fn probe_pidfs() -> Result<bool, Errno> {
    let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let fstype = open(me).and_then(|fd| rustix::fs::fstatfs(&fd));
    // `f_type` is i64 here but another width on some architectures.
    #[allow(clippy::unnecessary_cast)]
    let yes = match fstype {
        Ok(s) => s.f_type as i64 == PIDFS_MAGIC,
        Err(e) if super::passing_error(e) => return Err(e),
        Err(_) => false,
    };
    PIDFS.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
    Ok(yes)
}

/// The pidfs inode of `fd`; `None` without pidfs.
pub(super) fn ino_of(fd: &OwnedFd) -> Option<u64> {
    if !kernel_has_pidfs() {
        return None;
    }
    rustix::fs::fstat(fd)
        .ok()
        .map(|s| s.st_ino)
        .filter(|&i| i != 0)
}

/// The pidfs inode of the process `pid`; `Ok(None)` without pidfs or without the
/// process, `Err` for a failure that passes (out of file descriptors or memory).
pub(super) fn ino_of_pid_checked(pid: u32) -> Result<Option<u64>, Errno> {
    let fd = match open(pid) {
        Ok(fd) => fd,
        Err(e) if super::passing_error(e) => return Err(e),
        Err(_) => return Ok(None),
    };
    let pidfs = match PIDFS.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => probe_pidfs()?,
    };
    if !pidfs {
        return Ok(None);
    }
    match rustix::fs::fstat(&fd) {
        Ok(s) => Ok(Some(s.st_ino).filter(|&i| i != 0)),
        Err(e) if super::passing_error(e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Whether the process behind `fd` has exited as a whole (non-blocking); `None` if the
/// poll failed.
pub(super) fn exited(fd: BorrowedFd<'_>) -> Option<bool> {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        match poll(&mut fds, Some(&zero)) {
            // A pidfd polls readable once the whole thread group has exited (zombie
            // included); a leader that exited while other threads run does not.
            Ok(n) => return Some(n > 0),
            Err(Errno::INTR) => {}
            Err(_) => return None,
        }
    }
}

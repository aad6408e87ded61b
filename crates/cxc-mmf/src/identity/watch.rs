//! [`PidWatch`]: a pidfd verified against an identity, for waiters that poll it; and the
//! check that an opened pidfd names the process an identity was recorded for.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::pidfd::{exited, ino_of, open};
use super::{FALLBACK_BIT, Identity, ProcStatus, procfs};

/// A pidfd held for one identity (opened, then verified against the identity, so it
/// names the right process even if the pid was reused before it was opened).
///
/// Waiters may poll [`PidWatch::as_fd`] for `POLLIN` (readable = the process exited).
#[derive(Debug)]
pub struct PidWatch {
    fd: OwnedFd,
    id: Identity,
}

impl PidWatch {
    /// Opens a pidfd for `id`. `None` if the process is already gone, its pid now names
    /// another process, it lives on another boot or in another pid namespace, or the
    /// pidfd cannot be opened (no `pidfd_open`, fd limit).
    pub fn open(id: &Identity) -> Option<PidWatch> {
        if !id.is_known() || id.boot != super::boot() || id.pidns != super::cache::facts().pidns {
            return None;
        }
        let fd = open(id.pid).ok()?;
        if !verify(&fd, id) {
            return None;
        }
        Some(PidWatch { fd, id: *id })
    }

    /// Whether the whole process has exited (non-blocking poll). A poll failure counts
    /// as not dead.
    pub fn is_dead(&self) -> bool {
        exited(self.fd.as_fd()) == Some(true)
    }

    /// The pidfd, for `poll`/`epoll` by waiters (readable = exited).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The identity this watch was opened for.
    pub fn identity(&self) -> Identity {
        self.id
    }
}

/// Whether `fd`, opened for `id.pid`, names the process `id` (checked after opening).
pub(super) fn verify(fd: &OwnedFd, id: &Identity) -> bool {
    if id.unique & FALLBACK_BIT != 0 {
        let start = id.unique & !FALLBACK_BIT;
        let me = super::cache::facts();
        if !me.proc_ours {
            return false;
        }
        matches!(procfs::stat_of(id.pid, None),
            Some((ProcStatus::Live { .. } | ProcStatus::Zombie, s))
                if procfs::machine_ticks(s, me.boot_off) == start)
    } else {
        ino_of(fd) == Some(id.unique)
    }
}

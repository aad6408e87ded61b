//! Is a process still the one that made a claim?
//!
//! A claim made by a process for its own pid records the process start time. The claim's
//! process is then *dead* when `/proc/<pid>` is gone, is a zombie, or has a different
//! start time (the pid was reused). `kill(pid, 0)` is not used: it succeeds for zombies
//! and for a new process that reused the pid.
//!
//! Claims made for pids that are not the caller's own (tests, or an application that
//! uses its own numbering) have no recorded identity; their liveness is [`Liveness::Unknown`]
//! and the primitives fall back to heartbeat staleness.

pub use cxc_mmf::identity::{ProcStatus, ProcessIdentity, current, current_pid, proc_status};

/// The verdict on a recorded identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The same process is still running (or stopped).
    Alive,
    /// The process exited (zombie or gone) or its pid now names another process.
    Dead,
    /// Nothing recorded, or the OS could not tell.
    Unknown,
}

/// Checks whether the process `pid` started at `start_time` still exists.
/// `start_time == 0` means "not recorded" and yields [`Liveness::Unknown`].
pub fn check(pid: u32, start_time: u64) -> Liveness {
    if pid == 0 || start_time == 0 {
        return Liveness::Unknown;
    }
    #[cfg(cxc_loom)]
    {
        Liveness::Unknown
    }
    #[cfg(not(cxc_loom))]
    match proc_status(pid) {
        ProcStatus::Live { start_time: s } if s == start_time => Liveness::Alive,
        ProcStatus::Live { .. } | ProcStatus::Zombie | ProcStatus::Gone => Liveness::Dead,
        ProcStatus::Unknown => Liveness::Unknown,
    }
}

/// The start time to record for a claim by `pid`: this process's start time when `pid`
/// is this process's own id, else 0 (unknown).
#[inline]
pub fn start_time_for(pid: u32) -> u64 {
    #[cfg(cxc_loom)]
    {
        let _ = pid;
        0
    }
    #[cfg(not(cxc_loom))]
    {
        let me = current();
        if me.pid == pid { me.start_time } else { 0 }
    }
}

#[cfg(all(test, not(cxc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn self_alive_and_wrong_start_is_dead() {
        let me = current();
        assert_eq!(check(me.pid, me.start_time), Liveness::Alive);
        assert_eq!(check(me.pid, me.start_time + 1), Liveness::Dead);
        assert_eq!(check(me.pid, 0), Liveness::Unknown);
        assert_eq!(start_time_for(me.pid), me.start_time);
        assert_eq!(start_time_for(me.pid.wrapping_add(1)), 0);
    }

    #[test]
    fn exited_child_is_dead_even_as_zombie() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Wait until it has exited but do not reap it: it is a zombie now.
        let start = match proc_status(pid) {
            ProcStatus::Live { start_time } => start_time,
            _ => 1, // exited before we looked; any start time will do
        };
        for _ in 0..1000 {
            if proc_status(pid) == ProcStatus::Zombie {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(check(pid, start), Liveness::Dead);
        child.wait().unwrap();
        assert_eq!(check(pid, start), Liveness::Dead);
    }
}

/// Watches one recorded identity cheaply: a pidfd is opened once per identity (and the
/// identity verified against `/proc` after opening, so the fd names the right process);
/// each later check is one non-blocking `poll`, far cheaper than parsing `/proc`.
#[derive(Debug, Default)]
pub(crate) struct PidWatch {
    key: (u32, u64),
    #[cfg(all(target_os = "linux", not(cxc_loom)))]
    fd: Option<std::os::fd::OwnedFd>,
    dead: bool,
}

impl PidWatch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Liveness of the process `pid` that started at `start_time` (0 = unknown).
    pub(crate) fn liveness(&mut self, pid: u32, start_time: u64) -> Liveness {
        if pid == 0 || start_time == 0 {
            return Liveness::Unknown;
        }
        #[cfg(all(target_os = "linux", not(cxc_loom)))]
        {
            use rustix::event::{PollFd, PollFlags, poll};
            use rustix::process::{Pid, PidfdFlags, pidfd_open};
            if self.key != (pid, start_time) {
                self.key = (pid, start_time);
                self.dead = false;
                self.fd = None;
                let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
                    return Liveness::Unknown;
                };
                match pidfd_open(raw, PidfdFlags::empty()) {
                    Ok(fd) => match check(pid, start_time) {
                        Liveness::Dead => self.dead = true,
                        Liveness::Alive => self.fd = Some(fd),
                        Liveness::Unknown => return Liveness::Unknown,
                    },
                    Err(rustix::io::Errno::SRCH) => self.dead = true,
                    Err(_) => return check(pid, start_time),
                }
            }
            if self.dead {
                return Liveness::Dead;
            }
            let Some(fd) = &self.fd else {
                return check(pid, start_time);
            };
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            let zero = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match poll(&mut fds, Some(&zero)) {
                // A pidfd polls readable once the process has exited (zombie included).
                Ok(n) if n > 0 => {
                    self.dead = true;
                    Liveness::Dead
                }
                Ok(_) => Liveness::Alive,
                Err(_) => check(pid, start_time),
            }
        }
        #[cfg(not(all(target_os = "linux", not(cxc_loom))))]
        {
            let _ = (&mut self.key, &mut self.dead);
            check(pid, start_time)
        }
    }
}

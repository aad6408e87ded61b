//! Is a process still the one that made a claim?
//!
//! Identity and liveness are owned by [`cxc_mmf::identity`] and re-exported here (see
//! there for the identity model, what counts as dead, and pid namespaces). In short: an
//! [`Identity`] is never reused while the machine is up, and [`Liveness::Dead`] means the
//! whole thread group is gone — never the `Z` state letter of the main thread alone.
//!
//! The `(pid, start time)` helpers below ([`ProcessIdentity`], [`check`],
//! [`start_time_for`], [`current`]) are the older record form, kept for records that
//! store a start time rather than a full [`Identity`]; they give the same verdicts as
//! [`liveness`] on the fallback form.

/// The identity module itself (its `PidWatch` is re-exported above as `IdentityWatch`:
/// this module's own `PidWatch` is the `(pid, start time)` watch the lease uses).
pub use cxc_mmf::identity;
pub use cxc_mmf::identity::{
    FALLBACK_BIT, Identity, Liveness, PidLookup, PidWatch as IdentityWatch, ProcStatus, boot,
    current_pid, current_proc, fallback_active, force_fallback, liveness, lookup_pid,
    proc_group_alive, proc_status, self_start_time,
};

/// A process named by pid and start time (clock ticks since boot; 0 = unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    /// The process id.
    pub pid: u32,
    /// Start time in clock ticks since boot; 0 when unknown.
    pub start_time: u64,
}

/// This process's `(pid, start time)`, cached (correct after `fork`).
#[inline]
pub fn current() -> ProcessIdentity {
    ProcessIdentity {
        pid: cxc_mmf::identity::current_pid(),
        start_time: cxc_mmf::identity::self_start_time(),
    }
}

/// The identity of the process `pid` (of our pid namespace) that started at
/// `start_time`, in the fallback form.
pub fn fallback_identity(pid: u32, start_time: u64) -> Identity {
    let me = Identity::current();
    Identity {
        pid,
        pidns: me.pidns,
        boot: me.boot,
        unique: if start_time == 0 {
            0
        } else {
            FALLBACK_BIT | start_time
        },
    }
}

/// Checks whether the process `pid` started at `start_time` still exists (the whole
/// thread group; a reused pid is another process). `start_time == 0` means "not
/// recorded" and yields [`Liveness::Unknown`]. Allocation-free.
pub fn check(pid: u32, start_time: u64) -> Liveness {
    if pid == 0 || start_time == 0 {
        return Liveness::Unknown;
    }
    #[cfg(cxc_loom)]
    {
        Liveness::Unknown
    }
    #[cfg(not(cxc_loom))]
    liveness(&fallback_identity(pid, start_time))
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

/// Watches one `(pid, start time)` record cheaply: a pidfd is opened once per record
/// (verified against the record after opening); each later check is one non-blocking
/// `poll`.
#[derive(Debug, Default)]
#[allow(dead_code)] // the lease watches full identities (`cxc_mmf::identity::PidWatch`)
pub(crate) struct PidWatch {
    key: (u32, u64),
    #[cfg(not(cxc_loom))]
    watch: Option<IdentityWatch>,
    dead: bool,
}

#[allow(dead_code)]
impl PidWatch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Liveness of the process `pid` that started at `start_time` (0 = unknown).
    pub(crate) fn liveness(&mut self, pid: u32, start_time: u64) -> Liveness {
        if pid == 0 || start_time == 0 {
            return Liveness::Unknown;
        }
        #[cfg(cxc_loom)]
        {
            let _ = (&mut self.key, &mut self.dead);
            Liveness::Unknown
        }
        #[cfg(not(cxc_loom))]
        {
            if self.key != (pid, start_time) {
                self.key = (pid, start_time);
                self.dead = false;
                self.watch = None;
                let id = fallback_identity(pid, start_time);
                match IdentityWatch::open(&id) {
                    Some(w) => self.watch = Some(w),
                    None => match liveness(&id) {
                        Liveness::Dead => self.dead = true,
                        other => return other,
                    },
                }
            }
            if self.dead {
                return Liveness::Dead;
            }
            match &self.watch {
                Some(w) if w.is_dead() => {
                    self.dead = true;
                    Liveness::Dead
                }
                Some(_) => Liveness::Alive,
                None => check(pid, start_time),
            }
        }
    }
}

#[cfg(all(test, not(cxc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn self_alive_and_wrong_start_is_dead() {
        let me = current();
        assert_eq!(check(me.pid, me.start_time), Liveness::Alive);
        // One tick away cannot be told from this process seen through a time namespace
        // whose boot clock offset is not a whole tick; two ticks away is another one.
        assert_eq!(check(me.pid, me.start_time + 1), Liveness::Unknown);
        assert_eq!(check(me.pid, me.start_time + 2), Liveness::Dead);
        assert_eq!(check(me.pid, 0), Liveness::Unknown);
        assert_eq!(start_time_for(me.pid), me.start_time);
        assert_eq!(start_time_for(me.pid.wrapping_add(1)), 0);
        let mut w = PidWatch::new();
        assert_eq!(w.liveness(me.pid, me.start_time), Liveness::Alive);
        assert_eq!(w.liveness(me.pid, me.start_time + 2), Liveness::Dead);
    }

    #[test]
    fn exited_child_is_dead_even_as_zombie() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = match proc_status(pid) {
            ProcStatus::Live { start_time } => start_time,
            other => panic!("child not live: {other:?}"),
        };
        let mut w = PidWatch::new();
        assert_eq!(w.liveness(pid, start), Liveness::Alive);
        // Wait until it has exited but do not reap it: it is a zombie now.
        for _ in 0..5000 {
            if proc_status(pid) == ProcStatus::Zombie {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(check(pid, start), Liveness::Dead);
        assert_eq!(w.liveness(pid, start), Liveness::Dead);
        child.wait().unwrap();
        assert_eq!(check(pid, start), Liveness::Dead);
    }
}

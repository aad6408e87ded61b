//! The process-identity functions the lease uses (one place to swap them).

pub(crate) use crate::liveness::Liveness;

/// Temporary stand-in with the identity module's API (pid + start time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Identity {
    pub(crate) pid: u32,
    pub(crate) pidns: u64,
    pub(crate) boot: u64,
    pub(crate) unique: u64,
}

impl Identity {
    #[cfg(not(cxc_loom))]
    pub(crate) fn current() -> Identity {
        let me = crate::liveness::current();
        Identity {
            pid: me.pid,
            pidns: 1,
            boot: 1,
            unique: me.start_time,
        }
    }

    pub(crate) fn to_words(self) -> [u64; 4] {
        [u64::from(self.pid), self.pidns, self.boot, self.unique]
    }

    pub(crate) fn from_words(w: [u64; 4]) -> Identity {
        Identity {
            pid: w[0] as u32,
            pidns: w[1],
            boot: w[2],
            unique: w[3],
        }
    }
}

pub(crate) fn liveness(id: &Identity) -> Liveness {
    crate::liveness::check(id.pid, id.unique)
}

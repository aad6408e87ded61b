//! The locks the handoff and throughput scenarios compare, behind one interface.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use cxc::{AdaptiveSpin, LeaseClaim, LeaseOptions, OwnerLease, Preemption, SidecarBox};

use crate::baseline::{Flock, FutexMutex, RobustMutex};
use crate::shm::SharedPage;

/// Which lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// `OwnerLease` with blocking `acquire` (no preemption, heartbeat never stale).
    Lease,
    /// Drepper's futex mutex on the shared page.
    FutexMutex,
    /// Robust process-shared pthread mutex on the shared page.
    Robust,
    /// `flock` on a file.
    Flock,
}

impl LockKind {
    /// Every kind, ours first.
    pub const ALL: [LockKind; 4] = [
        LockKind::Lease,
        LockKind::FutexMutex,
        LockKind::Robust,
        LockKind::Flock,
    ];

    /// The id used in rows and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Lease => "lease",
            LockKind::FutexMutex => "futex_mutex",
            LockKind::Robust => "robust_pthread",
            LockKind::Flock => "flock",
        }
    }
}

impl FromStr for LockKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        LockKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown lock kind {s:?}"))
    }
}

/// Options of the leases the scenarios use: a live holder is never preempted (the seed's
/// lower-pid preemption would turn a handoff into a steal) and epochs are manual, so with
/// `grace = u64::MAX` only a release or the OS reporting the holder dead frees the lease.
pub(crate) fn lease_options() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

/// How a process's lease handles take part in the sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observe {
    /// Raw handles: nothing recorded.
    Plain,
    /// Registered with the process's sidecar (waits are recorded in the file's ring).
    Recorded,
    /// Registered with [`AdaptiveSpin`] as policy.
    Adaptive,
}

/// One lease handle, raw or registered with the sidecar.
enum Lease {
    Plain(Box<OwnerLease<u64>>),
    Boxed(SidecarBox<OwnerLease<u64>>),
}

impl std::ops::Deref for Lease {
    type Target = OwnerLease<u64>;
    fn deref(&self) -> &OwnerLease<u64> {
        match self {
            Lease::Plain(l) => l,
            Lease::Boxed(b) => b,
        }
    }
}

/// `n` locks of one kind, as seen from one process, with the claims this process holds.
pub(crate) struct Locks {
    kind: LockKind,
    page: SharedPage,
    pid: u32,
    leases: Vec<Lease>,
    claims: Vec<Option<LeaseClaim>>,
    flocks: Vec<Flock>,
    robust: Vec<RobustMutex>,
    held: Vec<bool>,
}

impl Locks {
    /// Creates `n` locks of `kind` in `dir` (the parent, once).
    pub(crate) fn create(kind: LockKind, dir: &Path, n: usize) -> Locks {
        let page = super::page_in(dir);
        match kind {
            LockKind::Lease => {
                for i in 0..n {
                    OwnerLease::<u64>::create_with(lease_path(dir, i), 0, &lease_options())
                        .expect("create lease");
                }
            }
            LockKind::Robust => {
                for i in 0..n {
                    // SAFETY: cell `i` of the freshly created shared page is aligned, sized
                    // for a pthread mutex, and nobody uses it yet; the page file outlives
                    // every process of this measurement.
                    unsafe { RobustMutex::init(page.cell(i)) }.expect("init robust mutex");
                }
            }
            LockKind::FutexMutex | LockKind::Flock => {}
        }
        drop(page);
        Locks::open(kind, dir, n)
    }

    /// Opens the `n` locks of `kind` in `dir`.
    pub(crate) fn open(kind: LockKind, dir: &Path, n: usize) -> Locks {
        Locks::open_observed(kind, dir, n, Observe::Plain)
    }

    /// Opens the `n` locks of `kind` in `dir`, lease handles registered with the sidecar
    /// as `observe` says.
    pub(crate) fn open_observed(kind: LockKind, dir: &Path, n: usize, observe: Observe) -> Locks {
        let page = super::page_in(dir);
        let mut locks = Locks {
            kind,
            page,
            pid: std::process::id(),
            leases: Vec::new(),
            claims: vec![None; n],
            flocks: Vec::new(),
            robust: Vec::new(),
            held: vec![false; n],
        };
        for i in 0..n {
            match kind {
                LockKind::Lease => {
                    let l = OwnerLease::open(lease_path(dir, i)).expect("open lease");
                    locks.leases.push(match observe {
                        Observe::Plain => Lease::Plain(Box::new(l)),
                        Observe::Recorded => Lease::Boxed(SidecarBox::new(l)),
                        Observe::Adaptive => {
                            Lease::Boxed(SidecarBox::with_policy(l, AdaptiveSpin::new()))
                        }
                    })
                }
                LockKind::Flock => locks.flocks.push(
                    Flock::open(&dir.join(format!("lock{i}.flock"))).expect("open flock file"),
                ),
                // SAFETY: the creator initialised a robust mutex in cell `i` (`create`), and
                // the mapping in `locks.page` lives as long as the handle in `locks`.
                LockKind::Robust => locks
                    .robust
                    .push(unsafe { RobustMutex::at(locks.page.cell(i)) }),
                LockKind::FutexMutex => {}
            }
        }
        locks
    }

    /// Lease `i` (panics for other kinds).
    pub(crate) fn lease(&self, i: usize) -> &OwnerLease<u64> {
        &self.leases[i]
    }

    /// The shared page.
    pub(crate) fn page(&self) -> &SharedPage {
        &self.page
    }

    /// Locks lock `i`, blocking.
    pub(crate) fn lock(&mut self, i: usize) {
        match self.kind {
            LockKind::Lease => {
                let c = self.leases[i]
                    .acquire(self.pid, u64::MAX, Duration::from_secs(30))
                    .expect("lease acquire timed out");
                self.claims[i] = Some(c);
            }
            LockKind::FutexMutex => FutexMutex(self.page.cell_u32(i)).lock(),
            LockKind::Robust => {
                self.robust[i].lock();
            }
            LockKind::Flock => self.flocks[i].lock(),
        }
        self.held[i] = true;
    }

    /// Unlocks lock `i` (held by this process).
    pub(crate) fn unlock(&mut self, i: usize) {
        match self.kind {
            LockKind::Lease => {
                let c = self.claims[i].take().expect("lease not held");
                assert!(self.leases[i].release_claim(&c), "lease lost");
            }
            LockKind::FutexMutex => FutexMutex(self.page.cell_u32(i)).unlock(),
            LockKind::Robust => self.robust[i].unlock(),
            LockKind::Flock => self.flocks[i].unlock(),
        }
        self.held[i] = false;
    }

    /// Unlocks every lock this process holds.
    pub(crate) fn unlock_all(&mut self) {
        for i in 0..self.held.len() {
            if self.held[i] {
                self.unlock(i);
            }
        }
    }

    /// The throughput workload: lock 0, read the protected value, write it + 1, unlock.
    /// For the lease the value is its payload (a fenced write); for the others a word on
    /// the shared page.
    pub(crate) fn locked_increment(&mut self) {
        self.lock(0);
        match self.kind {
            LockKind::Lease => {
                let lease = &self.leases[0];
                let c = self.claims[0].as_ref().expect("held");
                let v = lease.read_claimed(c).expect("read as holder");
                assert!(lease.write_claimed(c, v + 1), "lease lost");
            }
            _ => {
                let w = self.page.counter(crate::shm::counter::VALUE);
                let v = w.load(std::sync::atomic::Ordering::Relaxed);
                w.store(v + 1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        self.unlock(0);
    }

    /// The throughput workload through a guard of lease 0: `lock()` (blocking), `read()`,
    /// `write()` of the value + 1, drop (release). Both are fenced by the guard's claim.
    pub(crate) fn guard_increment(&mut self) {
        let guard = self.leases[0].lock();
        let v = guard.read().expect("read as holder");
        guard.write(v + 1).expect("lease lost");
    }

    /// The throughput workload as one `with_lease` call on lease 0; when the lease is held
    /// by the other process, one blocking round of `locked_increment` instead (so a loser
    /// sleeps rather than spins).
    pub(crate) fn with_lease_increment(&mut self) {
        if self.leases[0]
            .with_lease(self.pid, u64::MAX, |v| *v += 1)
            .is_none()
        {
            self.locked_increment();
        }
    }

    /// The value the throughput workload incremented.
    pub(crate) fn value(&self) -> u64 {
        match self.kind {
            LockKind::Lease => {
                let st = self.leases[0].status();
                st.payload_words[0]
            }
            _ => self
                .page
                .counter(crate::shm::counter::VALUE)
                .load(std::sync::atomic::Ordering::Acquire),
        }
    }
}

/// Path of lease `i` in `dir`.
pub(crate) fn lease_path(dir: &Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("lock{i}.lease"))
}

//! [`MmapElection`]: the election on a lease file. The leader is the lease holder; its
//! identity is a [`LeaderRecord`] in the lease payload, written by the new leader right
//! after it wins (fenced, like every payload write).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{ElectionBackend, Leader};
use crate::epoch::EpochMode;
use crate::lease::{LeaseClaim, LeaseError, OwnerLease, Preemption};

/// The longest identity the lease payload holds, in bytes.
pub const IDENTITY_MAX: usize = 32;

/// The lease payload of an election file: who leads, for which term.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct LeaderRecord {
    /// The token (claim generation) of the term this record was written under.
    pub token: u64,
    /// The leader's process id.
    pub pid: u32,
    /// Bytes of `name` in use.
    pub len: u32,
    /// The identity (UTF-8, `len` bytes).
    pub name: [u8; IDENTITY_MAX],
}

impl LeaderRecord {
    /// The identity, lossily decoded; empty for a corrupt length.
    pub fn identity(&self) -> String {
        let n = usize::try_from(self.len).unwrap_or(usize::MAX);
        self.name
            .get(..n)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }
}

/// Why the mapped-file election failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MmapElectionError {
    /// The lease file could not be created or opened.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The lease uses manual epochs: nobody would replace a stuck leader.
    #[error("an election needs a lease with clock epochs")]
    ManualEpochs,
    /// The lease lets a lower pid preempt a live holder; an election must not.
    #[error("an election needs a lease without preemption")]
    Preemption,
    /// The identity does not fit the lease payload.
    #[error("identity of {len} bytes; at most {IDENTITY_MAX} fit")]
    IdentityTooLong {
        /// Its length.
        len: usize,
    },
    /// The lease duration is not a positive number of epochs.
    #[error("lease duration {0:?} is unusable")]
    LeaseDuration(Duration),
}

/// How long after a missed `lead_timeout` a new one still counts as the same campaign
/// (and does not spin first).
const RESPIN_AFTER: Duration = Duration::from_secs(1);

/// [`ElectionBackend`] on an [`OwnerLease`] file (no preemption, clock epochs): terms are
/// claims, the token is the claim generation, renewal is a heartbeat, and a leader whose
/// heartbeat is older than the lease duration is replaced (a dead one at once).
///
/// A process campaigns for one pid (its own by default, looked up at each campaign, so
/// a forked child campaigns for its own pid): two electors of one process on one file
/// with the same pid share the claim. Give them distinct pids
/// ([`with_pid`](Self::with_pid)) to make them rivals.
#[derive(Debug)]
pub struct MmapElection {
    lease: OwnerLease<LeaderRecord>,
    /// The pid claims are made for; `None`: the calling process's.
    pid: Option<u32>,
    grace: u64,
    /// When the last `lead_timeout` ended without a win (ns after `clock`; 0: never).
    missed_at: AtomicU64,
    clock: Instant,
    poll: Duration,
}

impl MmapElection {
    /// The record of the current claim's leader, whether or not it still leads (its
    /// lease may have run out, its process may be gone): what `observe` reports while it
    /// leads. `None` when nobody ever claimed or the last leader resigned.
    pub fn recorded_leader(&self) -> Option<Leader> {
        let st = self.lease.status();
        st.owner?;
        let bytes: Vec<u8> = st
            .payload_words
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        let identity = LeaderRecord::read_from_prefix(&bytes)
            .ok()
            .map(|(r, _)| r)
            .filter(|r| r.token == st.generation)
            .map(|r| r.identity())
            .unwrap_or_default();
        Some(Leader {
            identity,
            token: st.generation,
        })
    }

    /// Creates the election file at `path`, or opens it (no preemption, 1 ms clock
    /// epochs), for terms of `lease_duration`.
    ///
    /// # Errors
    /// As [`MmapElection::new`], and the file's creation / validation errors.
    pub fn create_or_open(
        path: impl AsRef<Path>,
        lease_duration: Duration,
    ) -> Result<Self, MmapElectionError> {
        let lease = OwnerLease::builder(path)
            .preemption(Preemption::Never)
            .create_or_open(LeaderRecord::default())?;
        Self::new(lease.0, lease_duration)
    }

    /// An election on `lease` for this process's pid. `lease_duration` becomes the
    /// heartbeat grace, rounded up to whole epochs.
    ///
    /// # Errors
    /// [`MmapElectionError::ManualEpochs`], [`MmapElectionError::Preemption`],
    /// [`MmapElectionError::LeaseDuration`].
    pub fn new(
        lease: OwnerLease<LeaderRecord>,
        lease_duration: Duration,
    ) -> Result<Self, MmapElectionError> {
        let EpochMode::Clock { tick } = lease.epoch_mode() else {
            return Err(MmapElectionError::ManualEpochs);
        };
        if lease.preemption() != Preemption::Never {
            return Err(MmapElectionError::Preemption);
        }
        let grace = lease_duration.as_nanos().div_ceil(tick.as_nanos().max(1));
        let grace = u64::try_from(grace)
            .ok()
            .filter(|g| *g > 0)
            .ok_or(MmapElectionError::LeaseDuration(lease_duration))?;
        Ok(MmapElection {
            lease,
            pid: None,
            grace,
            missed_at: AtomicU64::new(0),
            clock: Instant::now(),
            poll: Duration::from_millis(2),
        })
    }

    /// Campaigns for `pid` instead of this process's pid (it only names the claim; the
    /// claim still belongs to this process).
    pub fn with_pid(mut self, pid: u32) -> Self {
        self.pid = Some(pid);
        self
    }

    /// The pid this campaign claims for.
    fn claim_pid(&self) -> u32 {
        self.pid.unwrap_or_else(cxc_mmf::identity::current_pid)
    }

    /// The lease file.
    pub fn lease(&self) -> &OwnerLease<LeaderRecord> {
        &self.lease
    }

    /// The heartbeat grace in epochs.
    pub fn grace_epochs(&self) -> u64 {
        self.grace
    }

    fn record(identity: &str, claim: &LeaseClaim) -> Result<LeaderRecord, MmapElectionError> {
        let bytes = identity.as_bytes();
        let mut name = [0u8; IDENTITY_MAX];
        name.get_mut(..bytes.len())
            .ok_or(MmapElectionError::IdentityTooLong { len: bytes.len() })?
            .copy_from_slice(bytes);
        Ok(LeaderRecord {
            token: claim.generation(),
            pid: std::process::id(),
            len: u32::try_from(bytes.len()).unwrap_or(0),
            name,
        })
    }

    /// Writes the identity under a fresh claim; `None` if the claim was lost meanwhile.
    fn won(
        &self,
        identity: &str,
        claim: Option<LeaseClaim>,
    ) -> Result<Option<LeaseClaim>, MmapElectionError> {
        let Some(claim) = claim else { return Ok(None) };
        let rec = match Self::record(identity, &claim) {
            Ok(r) => r,
            Err(e) => {
                self.lease.release_claim(&claim);
                return Err(e);
            }
        };
        // A failed write (stalled writers hold every spare buffer) leaves the identity
        // unpublished; the claim still leads if it is current.
        if self.lease.write_claimed(&claim, rec) || self.lease.is_current(&claim) {
            Ok(Some(claim))
        } else {
            Ok(None)
        }
    }

    fn check(identity: &str) -> Result<(), MmapElectionError> {
        if identity.len() > IDENTITY_MAX {
            return Err(MmapElectionError::IdentityTooLong {
                len: identity.len(),
            });
        }
        Ok(())
    }
}

impl ElectionBackend for MmapElection {
    type Term = LeaseClaim;
    type Error = MmapElectionError;

    fn try_lead(&self, identity: &str) -> Result<Option<LeaseClaim>, MmapElectionError> {
        Self::check(identity)?;
        self.won(identity, self.lease.try_claim(self.claim_pid(), self.grace))
    }

    fn lead_timeout(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseClaim>, MmapElectionError> {
        Self::check(identity)?;
        // A campaign waits in slices (the retry period), and a standby campaigns again
        // and again: only an attempt that does not follow a missed one closely spins
        // first. Spinning the (shared, up to 16.7 ms) budget on every slice would burn a
        // third of a core for as long as a standby waits; a sleeping one is still woken
        // by the leader's release.
        let now = self.clock.elapsed();
        let last = Duration::from_nanos(self.missed_at.load(Ordering::Relaxed));
        let spin = last.is_zero() || now.saturating_sub(last) > RESPIN_AFTER;
        let won = self
            .lease
            .acquire_spinning(self.claim_pid(), self.grace, timeout, spin);
        if won.is_none() {
            let at = u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.missed_at.store(at.max(1), Ordering::Relaxed);
        }
        self.won(identity, won)
    }

    fn renew(&self, term: &LeaseClaim) -> Result<bool, MmapElectionError> {
        Ok(self.lease.beat_claimed(term))
    }

    fn is_current(&self, term: &LeaseClaim) -> Result<bool, MmapElectionError> {
        // A term is this process's only in the process that won it: a forked child's
        // copy of a `Leadership` is not the leader (as `renew` says there too).
        Ok(term.proc == cxc_mmf::identity::current_proc() && self.lease.is_current(term))
    }

    fn resign(&self, term: &LeaseClaim) -> Result<bool, MmapElectionError> {
        Ok(self.lease.release_claim(term))
    }

    fn leader(&self) -> Result<Option<Leader>, MmapElectionError> {
        // Nobody leads once the last leader's lease ran out or its process is gone, even
        // before a candidate takes over.
        if self.lease.holder_gone(self.grace) {
            return Ok(None);
        }
        Ok(self.recorded_leader())
    }

    fn wait_lost(&self, term: &LeaseClaim, timeout: Duration) -> Result<bool, MmapElectionError> {
        let start = Instant::now();
        loop {
            if !self.lease.is_current(term) {
                return Ok(true);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(false);
            }
            std::thread::sleep(left.min(self.poll));
        }
    }

    fn token(term: &LeaseClaim) -> u64 {
        term.generation()
    }
}

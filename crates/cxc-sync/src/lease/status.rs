//! Diagnostics of a lease: [`LeaseStatus`], type-erased [`inspect`], accessors, and the
//! sidecar's view ([`AdaptiveInstance`]).

use std::path::Path;

use cxc_mmf::{Kind, Mapped, MmfError, TypeFingerprint};
use cxc_sidecar::{Instrumented, Instruments};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::{LeaseClaim, LeaseError, Preemption};
use super::file::*;
use super::state::{LeaseState, PAYLOAD_BYTES, PAYLOAD_WORDS, counter};
use crate::epoch::EpochMode;
use crate::primitive::Ordering;
use cxc_mmf::Expect;

/// A snapshot of a lease's state, for tools and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// Holder pid, `None` when vacant.
    pub owner: Option<u32>,
    /// Generation of the current (or last) claim.
    pub generation: u64,
    /// The recorded identity value of the process that made the current claim (its
    /// pidfs inode, or a flagged start time on kernels without pidfs), if readable.
    pub owner_start: Option<u64>,
    /// Whether a write (or `with_lease` closure) is in flight.
    pub writing: bool,
    /// Whether the holder inherited an interrupted write it has not yet overwritten.
    pub torn: bool,
    /// Epoch of the holder's last beat.
    pub heartbeat_epoch: u64,
    /// The current epoch.
    pub epoch: u64,
    /// The epoch source.
    pub epoch_mode: EpochMode,
    /// The preemption policy.
    pub preemption: Preemption,
    /// Acquirers asleep in the kernel (may over-count after a waiter died).
    pub waiters: u32,
    /// Cumulative counters, indexed by [`counter`](super::counter).
    pub counters: [u64; counter::COUNT],
    /// The published payload words (the payload type's bytes, zero-padded to 48).
    pub payload_words: [u64; PAYLOAD_WORDS],
    /// Payload type recorded in the file.
    pub payload_type: TypeFingerprint,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

/// Reads the status of any lease file without knowing its payload type (for tools such as
/// `cxc inspect`). The file is fully validated except for the payload type's identity.
///
/// # Errors
/// [`LeaseError::File`] if the file is not a valid lease file.
pub fn inspect(path: impl AsRef<Path>) -> Result<LeaseStatus, LeaseError> {
    let path = path.as_ref();
    let info = cxc_mmf::peek(path)?;
    let payload = info.layout.payload;
    if payload.size as usize > PAYLOAD_BYTES || payload.align > 8 {
        return Err(LeaseError::File(MmfError::ParamMismatch {
            name: "payload_size",
            expected: format!("at most {PAYLOAD_BYTES} bytes, alignment at most 8"),
            found: u64::from(payload.size),
        }));
    }
    let expect = Expect {
        payload,
        ..OwnerLease::<[u64; PAYLOAD_WORDS]>::expect()
    };
    let map: Mapped<LeaseState> = Mapped::open(path, &expect)?;
    // Inspection only reads: it does not register this process's identity.
    let lease = OwnerLease::<[u64; PAYLOAD_WORDS]>::from_map_unregistered(map);
    Ok(lease.status())
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> Instrumented for OwnerLease<T> {
    fn kind(&self) -> Kind {
        Kind::Lease
    }

    fn name(&self) -> String {
        self.map.path().display().to_string()
    }

    fn instruments(&self) -> Instruments<'_> {
        let st = self.state();
        Instruments {
            observed: &self.observed,
            counters: &st.counters,
            counter_names: &counter::NAMES,
            handshake: &st.handshake,
            ring: &st.ring,
        }
    }
}

impl<T> OwnerLease<T> {
    pub(super) fn current_owner_raw(&self) -> Option<u32> {
        let st = self.map.head();
        let w = st.word();
        (!w.is_vacant()).then(|| st.holder_pid(w))
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Seed API: advances the file's epoch counter by one and returns the new epoch.
    #[inline]
    pub fn tick_epoch(&self) -> u64 {
        self.clock.tick(&self.state().epoch)
    }

    /// The current epoch (manual counter, or clock ticks plus the counter).
    #[inline]
    pub fn current_epoch(&self) -> u64 {
        self.now()
    }

    /// Seed API: the pid the current claim was made for, `None` when vacant.
    #[inline]
    pub fn current_owner(&self) -> Option<u32> {
        self.current_owner_raw()
    }

    /// The current claim, `None` when vacant.
    pub fn current_claim(&self) -> Option<LeaseClaim> {
        let st = self.state();
        let cur = st.word();
        (!cur.is_vacant()).then(|| {
            let torn = st.torn.load(Ordering::Acquire) == cur.id();
            let proc = st.holder_identity(cur).map_or(0, |id| id.pid);
            st.claim_for(cur.0, torn, proc)
        })
    }

    /// Seed API: whether `my_pid`, claimed through this process, holds the lease (one
    /// atomic load and a compare, after the first call for `my_pid`).
    #[inline]
    pub fn am_i_owner(&self, my_pid: u32) -> bool {
        self.held_as(self.state().word(), my_pid)
    }

    /// Seed API: the generation of the current (or last) claim; it increases by one on
    /// every handover.
    #[inline]
    pub fn lease_term(&self) -> u64 {
        let st = self.state();
        st.full_generation(st.claim.load(Ordering::Acquire))
    }

    /// Whether the current holder inherited an interrupted update and has not yet written.
    pub fn payload_torn(&self) -> bool {
        self.state().torn_pending()
    }

    /// The epoch source stored in the file.
    pub fn epoch_mode(&self) -> EpochMode {
        self.clock.mode()
    }

    /// The preemption policy stored in the file.
    pub fn preemption(&self) -> Preemption {
        self.preemption
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// A diagnostic snapshot (fields are read one by one, not as one atomic unit).
    pub fn status(&self) -> LeaseStatus {
        let st = self.state();
        let cur = st.word();
        LeaseStatus {
            owner: self.current_owner(),
            generation: st.full_generation(cur.0),
            owner_start: st
                .holder_identity(cur)
                .map(|i| i.unique)
                .filter(|u| *u != 0),
            writing: cur.writing(),
            torn: st.torn_pending(),
            heartbeat_epoch: st.heartbeat.load(Ordering::Acquire),
            epoch: self.now(),
            epoch_mode: self.clock.mode(),
            preemption: self.preemption,
            waiters: st.waiters.load(Ordering::Relaxed),
            counters: std::array::from_fn(|i| st.counters[i].load(Ordering::Relaxed)),
            payload_words: st.read_published_consistent(),
            payload_type: self.map.info().layout.payload,
            strategy: st.handshake.current(),
            recent: st.ring.snapshot(),
        }
    }
}

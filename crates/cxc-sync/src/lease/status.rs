//! Diagnostics of a lease: [`LeaseStatus`], type-erased read-only [`inspect`], accessors,
//! and the sidecar's view ([`AdaptiveInstance`]).

use crate::payload::BufferFields;
use std::path::Path;

use cxc_mmf::{Kind, MmfError, Snapshot, TypeFingerprint};
use cxc_sidecar::{Instrumented, Instruments};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::{LeaseClaim, LeaseError, Preemption};
use super::file::*;
use super::state::{CLAIMED_AT_SHIFT, LeaseState, PAYLOAD_BYTES, PAYLOAD_WORDS, counter};
use super::word::Word;
use crate::epoch::{EpochClock, EpochMode};
use crate::primitive::Ordering;

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
    /// The epoch at which the current claim was made (its holder's "since when"); `None`
    /// when vacant or when the file holds no time for this claim (a claim whose claimant
    /// has not stored it yet).
    pub claimed_epoch: Option<u64>,
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
/// Read-only: the file is opened and mapped read-only and copied with loads only
/// ([`cxc_mmf::Snapshot`]); nothing is written, no identity is registered, so read
/// permission is enough (another user's file, a read-only mount). The payload is taken
/// from a copy only when a second copy shows its buffer was not refilled in between (up
/// to 20 more copies, then the payload reads as zeros).
///
/// # Errors
/// [`LeaseError::File`] if the file is not a valid lease file or cannot be read.
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
    let expect = super::file::FILE.expect(Some(0), payload);
    let mut snap: Snapshot<LeaseState> = Snapshot::read(path, &expect)?;
    for _ in 0..SNAPSHOT_TRIES {
        let next: Snapshot<LeaseState> = Snapshot::read(path, &expect)?;
        if let Some(words) = published_whole(snap.head(), next.head()) {
            return Ok(status_of(snap.head(), snap.info(), words));
        }
        snap = next;
    }
    Ok(status_of(snap.head(), snap.info(), [0; PAYLOAD_WORDS]))
}

/// How many more copies [`inspect`] takes at most to find the published payload whole.
const SNAPSHOT_TRIES: u32 = 20;

/// The published payload of copy `a` if it is whole: its buffer's sequence word is even
/// and the same in the later copy `b`, so no fill of that buffer began or ended between
/// the two loads of it, and the words (copied between them) are one publication's.
fn published_whole(a: &LeaseState, b: &LeaseState) -> Option<[u64; PAYLOAD_WORDS]> {
    let i = a.word().published();
    let s1 = a.bufs[i].seq.load(Ordering::Acquire);
    let words = std::array::from_fn(|w| a.bufs[i].words[w].load(Ordering::Relaxed));
    (s1 & 1 == 0 && b.bufs[i].seq.load(Ordering::Acquire) == s1).then_some(words)
}

/// The epoch the current claim `cur` was made at, if the file holds it for this claim.
fn claimed_epoch(st: &LeaseState, cur: Word) -> Option<u64> {
    if cur.is_vacant() {
        return None;
    }
    let v = st.claimed_at.load(Ordering::Relaxed);
    let mask = (1u64 << CLAIMED_AT_SHIFT) - 1;
    (v != 0 && v & mask == cur.gen_low() & mask).then_some(v >> CLAIMED_AT_SHIFT)
}

/// The status of the lease state `st` of a file whose header said `info`, with the
/// published payload `payload_words`.
fn status_of(
    st: &LeaseState,
    info: &cxc_mmf::HeaderInfo,
    payload_words: [u64; PAYLOAD_WORDS],
) -> LeaseStatus {
    let p = info.layout.params;
    // Validated by `check_params` at open (or built from valid options at create).
    let epoch_mode = EpochMode::decode(p[1], p[2]).unwrap_or_default();
    let preemption = Preemption::from_code(p[0]).unwrap_or_default();
    let cur = st.word();
    LeaseStatus {
        owner: (!cur.is_vacant()).then(|| st.holder_pid(cur)),
        generation: st.full_generation(cur.0),
        owner_start: st
            .holder_identity(cur)
            .map(|i| i.unique)
            .filter(|u| *u != 0),
        writing: cur.writing(),
        torn: st.torn_pending(),
        heartbeat_epoch: st.heartbeat.load(Ordering::Acquire),
        claimed_epoch: claimed_epoch(st, cur),
        epoch: EpochClock::new(epoch_mode).now(&st.epoch),
        epoch_mode,
        preemption,
        waiters: st.waiters.load(Ordering::Relaxed),
        counters: std::array::from_fn(|i| st.counters[i].load(Ordering::Relaxed)),
        payload_words,
        payload_type: info.layout.payload,
        strategy: st.handshake.current(),
        recent: st.ring.snapshot(),
    }
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
        let epoch = self.clock.tick(&self.state().epoch);
        // The holder may be stale now: waiters look again instead of at their next poll.
        self.state().wake_after_tick();
        epoch
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
    ///
    /// The token it returns acts (`write_claimed`, `beat_claimed`, `release_claim`) only
    /// in the process that made the claim, and never for a guard's claim: a guard is the
    /// only writer of its claim. Elsewhere it is a fencing token to compare, and only
    /// [`is_current`](Self::is_current) answers for it.
    pub fn current_claim(&self) -> Option<LeaseClaim> {
        let st = self.state();
        let cur = st.word();
        (!cur.is_vacant()).then(|| {
            let torn = st.torn.load(Ordering::Acquire) == cur.id();
            // A token acts only in the process that made the claim: this one if the
            // claim's identity slot records this process (then its lineage token), else
            // inert (token 0 is no process), as is a guard's claim.
            let proc = if !cur.private()
                && st
                    .holder_identity(cur)
                    .is_some_and(|id| id == cxc_mmf::identity::Identity::current())
            {
                super::file::my_proc()
            } else {
                0
            };
            st.claim_for(cur.0, torn, proc)
        })
    }

    /// Whether the current claim is over although nobody took it yet: its heartbeat is
    /// more than `grace` epochs old, or the OS reports its process gone (`false` while
    /// vacant). A claimant with that grace would take it over.
    pub(crate) fn holder_gone(&self, grace: u64) -> bool {
        let st = self.state();
        let w = st.word();
        !w.is_vacant()
            && (self
                .now()
                .saturating_sub(st.heartbeat.load(Ordering::Acquire))
                > grace
                || st.holder_liveness(w) == crate::liveness::Liveness::Dead)
    }

    /// Seed API: whether `my_pid`, claimed through this process, holds the lease (a load of
    /// the claim word, compared with the handle's cached `(this process, my_pid)` identity
    /// slot, after the first call for `my_pid`).
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

    /// The file's cumulative event counters as a typed snapshot (field by field as in
    /// [`lease::counter`](crate::lease::counter); Relaxed loads, one at a time).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lease = cxc_sync::OwnerLease::create(dir.path().join("l"), 0u64).unwrap();
    /// let claim = lease.try_claim(1, 3).expect("vacant");
    /// assert!(lease.release_claim(&claim));
    /// // A superseded claim's write is refused, and counted.
    /// assert!(!lease.write_claimed(&claim, 7));
    /// assert_eq!(lease.stats().stale_op_rejected, 1);
    /// ```
    pub fn stats(&self) -> crate::LeaseStats {
        crate::LeaseStats::read(&self.state().counters)
    }

    /// A diagnostic snapshot (fields are read one by one, not as one atomic unit).
    pub fn status(&self) -> LeaseStatus {
        let st = self.state();
        status_of(st, self.map.info(), st.read_published_consistent())
    }
}

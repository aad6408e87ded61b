//! Diagnostics of a lease: [`LeaseStatus`], type-erased read-only [`inspect`], accessors,
//! and the sidecar's view ([`AdaptiveInstance`]).

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
/// permission is enough (another user's file, a read-only mount). A copy taken while the
/// published payload was being replaced is taken again (a few times, then the payload
/// reads as zeros).
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
    let expect = Expect {
        payload,
        ..OwnerLease::<[u64; PAYLOAD_WORDS]>::expect()
    };
    let mut tries = 0;
    loop {
        let snap: Snapshot<LeaseState> = Snapshot::read(path, &expect)?;
        let st = snap.head();
        let payload = published_once(st);
        tries += 1;
        if payload.is_some() || tries >= SNAPSHOT_TRIES {
            return Ok(status_of(st, snap.info(), payload.unwrap_or_default()));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// A cell file's state (its fixed block is a lease state), as [`inspect_cell`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CellStatus {
    /// The published value's words (the payload type's bytes, zero-padded to 48); zeros
    /// if every copy caught a publication half-done.
    pub value_words: [u64; PAYLOAD_WORDS],
    /// Payload type recorded in the file.
    pub payload_type: TypeFingerprint,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

/// The cell protocol this decoder reads (header `params[0]` of a cell file).
const CELL_PROTOCOL: u64 = 1;

fn check_cell_params(p: &[u64; 4]) -> Result<(), MmfError> {
    if p[0] != CELL_PROTOCOL {
        return Err(MmfError::ParamMismatch {
            name: "cell_protocol",
            expected: CELL_PROTOCOL.to_string(),
            found: p[0],
        });
    }
    Ok(())
}

/// Reads the state of any cell file (`SharedCell<T>` of any payload type) without writing
/// anything, as [`inspect`] reads a lease: read-only mapping, loads only, copies taken
/// again while the published value is being replaced.
///
/// # Errors
/// [`LeaseError::File`] if the file is not a valid cell file or cannot be read.
pub fn inspect_cell(path: impl AsRef<Path>) -> Result<CellStatus, LeaseError> {
    let path = path.as_ref();
    let payload = cxc_mmf::peek(path)?.layout.payload;
    let expect = Expect {
        kind: Kind::Cell,
        payload,
        check_params: &check_cell_params,
        ..OwnerLease::<[u64; PAYLOAD_WORDS]>::expect()
    };
    let mut tries = 0;
    loop {
        let snap: Snapshot<LeaseState> = Snapshot::read(path, &expect)?;
        let st = snap.head();
        let value = published_once(st);
        tries += 1;
        if value.is_some() || tries >= SNAPSHOT_TRIES {
            return Ok(CellStatus {
                value_words: value.unwrap_or_default(),
                payload_type: payload,
                counters: cxc_sidecar::counter_values(&counter::NAMES, &st.counters),
                strategy: st.handshake.current(),
                recent: st.ring.snapshot(),
            });
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// How many copies [`inspect`] takes at most to find the published payload whole.
const SNAPSHOT_TRIES: u32 = 20;

/// The published payload if its buffer is not being written (one try; a copy never
/// changes, so retrying it would not help).
fn published_once(st: &LeaseState) -> Option<[u64; PAYLOAD_WORDS]> {
    let buf = &st.bufs[st.word().published()];
    let s1 = buf.seq.load(Ordering::Acquire);
    let words = std::array::from_fn(|i| buf.words[i].load(Ordering::Relaxed));
    (s1 & 1 == 0 && buf.seq.load(Ordering::Acquire) == s1).then_some(words)
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
        status_of(st, self.map.info(), st.read_published_consistent())
    }
}

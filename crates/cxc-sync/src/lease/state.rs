//! The lease's shared state and its lock-free protocol (see `docs/owner-lease.md`).
//!
//! The claim word ([`Word`], `word.rs`) names the holder (a slot of the identity table,
//! `ident.rs`), the generation, the published payload buffer, the holder's staging buffer,
//! an in-flight write (WRITE) and the buffers in quarantine. There are eight payload
//! buffers of one cache line each.
//!
//! **Writes (L2, L4, L7).** A writer of claim `c` sets WRITE on `c`'s word (CAS), fills
//! `c`'s staging buffer with a seqlock'd copy, then publishes by one CAS that swaps the
//! published and staging buffers and clears WRITE — it succeeds only if `c` is still the
//! claim. A writer whose claim was superseded or released while it ran (stalled, stopped,
//! in a signal handler, or its claim released by a sibling thread) may still be storing
//! into its staging buffer; so whoever supersedes or releases a claim with WRITE set puts
//! that buffer in *quarantine* (a Q bit, in the same CAS), and no later claim stages in it
//! until the stale writer itself clears the bit (after its publication failed) or the OS
//! proves the writer's whole process gone. A quarantined buffer is never published, so
//! no byte of an abandoned write is ever visible. With eight buffers, six stalled writers
//! can be outstanding at once; beyond that a new holder has no staging buffer and its
//! writes fail (`write` returns false; counter `no_buffer`) until one is freed. Takeover
//! itself is never blocked by quarantine (L5).
//!
//! The full 64-bit generation is `term`-relative: `term` is a checkpoint of the full
//! generation stored every 2^16 claims, and a claim's full generation is the unique value
//! above the checkpoint with the claim word's low 40 bits.

#[cfg(not(cxc_loom))]
use zerocopy::{FromBytes, KnownLayout};

use crate::primitive::{AtomicU32, AtomicU64, Ordering, fence, spin_hint};

use cxc_sidecar::{HandshakeHeader, ObservationRing};

use super::claim::LeaseClaim;
use super::slot::{IDENT_SLOTS, IdentSlot};
use super::word::{BUFS, BufferFields, GEN_BITS, GEN_SHIFT, ID_MASK, Word};

pub(crate) const GEN_MOD: u64 = 1 << GEN_BITS;
/// The full generation is checkpointed into `term` whenever the low bits are a multiple of this.
pub(crate) const TERM_CHECKPOINT: u64 = 1 << 16;

/// Payload words per buffer (48 bytes).
pub(crate) const PAYLOAD_WORDS: usize = 6;
/// Maximum payload size in bytes.
pub const PAYLOAD_BYTES: usize = PAYLOAD_WORDS * 8;

/// Low bits of `LeaseState::claimed_at` that hold the claim's generation (modulo 2^16);
/// the epoch is above them (48 bits: about 8.9 years of 1 µs ticks).
pub(crate) const CLAIMED_AT_SHIFT: u32 = 16;

/// `torn` value meaning: the claim that follows the vacant word of this generation (low
/// bits) inherits an interrupted update (see `vacate_dead_holder`).
pub(crate) const TORN_NEXT: u64 = 1 << 63;

/// How long a preempting or stale-taking claimant waits for an in-flight write of a live
/// holder to finish before it supersedes the writer (quarantining its buffer).
#[cfg(not(cxc_loom))]
pub(crate) const WRITE_SPIN_LIMIT: u32 = 256;
#[cfg(cxc_loom)]
pub(crate) const WRITE_SPIN_LIMIT: u32 = 1;
/// Bound on seqlock retries of a reader (only reachable if a writer keeps republishing).
#[cfg(not(cxc_loom))]
const READ_RETRY_LIMIT: u32 = 1 << 20;
#[cfg(cxc_loom)]
const READ_RETRY_LIMIT: u32 = 3;

crate::macros::counters! {
    /// Indices into `LeaseState::counters` (cumulative, slow paths only).
    pub mod counter {
        /// Claims that preempted a live higher-pid holder.
        CLAIM_PREEMPT = claim_preempt,
        /// Claims that took over a stale heartbeat.
        CLAIM_STALE = claim_stale,
        /// Claims that took over a holder the OS proved dead.
        CLAIM_DEAD = claim_dead_owner,
        /// Claims that inherited an interrupted write.
        TORN_INHERITED = torn_inherited,
        /// Writes/beats/releases refused because the caller's claim was superseded.
        STALE_OP_REJECTED = stale_op_rejected,
        /// Blocking acquires that had to sleep.
        BLOCKED_WAITS = blocked_waits,
        /// Total nanoseconds spent in blocked acquires.
        BLOCKED_NS = blocked_ns,
        /// Blocking acquires that timed out.
        TIMEOUTS = timeouts,
        /// Torn-payload flags cleared by a successful write of the new holder.
        TORN_RESTORED = torn_restored,
        /// Buffers put in quarantine (a claim superseded or released mid-write).
        QUARANTINED = quarantined,
        /// Quarantined buffers freed by their own (stale) writer.
        QUARANTINE_FREED = quarantine_freed,
        /// Quarantined buffers freed because the OS proved their writer's process gone.
        QUARANTINE_REAPED = quarantine_reaped,
        /// Writes refused because every buffer was published, staged or in quarantine.
        NO_BUFFER = no_buffer,
        /// Claims that took over a holder whose process was exiting: its sentinel thread
        /// ended and every thread of it was in the kernel's exit (taken over as stale,
        /// `sentinel.rs`).
        CLAIM_EXITING = claim_exiting,
    }
    /// A snapshot of a lease's cumulative event counters
    /// ([`OwnerLease::stats`](crate::OwnerLease::stats)), field by field as in
    /// [`lease::counter`](crate::lease::counter).
    pub struct LeaseStats;
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// One payload buffer: a sequence word and 48 bytes, one cache line.
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C)]
    pub(crate) struct PayloadBuf {
        pub(crate) seq: AtomicU64,
        pub(crate) words: [AtomicU64; PAYLOAD_WORDS],
        _reserved: AtomicU64,
    }
}

impl PayloadBuf {
    #[cfg(cxc_loom)]
    fn new() -> Self {
        PayloadBuf {
            seq: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            _reserved: AtomicU64::new(0),
        }
    }
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// The lease's fixed block in the file (offsets in `docs/memory-layout.md`).
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C, align(64))]
    pub(crate) struct LeaseState {
        /// The claim word (see `word.rs`).
        pub(crate) claim: AtomicU64,
        /// Epoch of the holder's last beat; only ever moves forward (`fetch_max`).
        pub(crate) heartbeat: AtomicU64,
        /// The manual epoch counter (also the offset added to clock epochs).
        pub(crate) epoch: AtomicU64,
        /// Checkpoint of the full generation.
        pub(crate) term: AtomicU64,
        /// Claim id that inherited an interrupted write (0 = none).
        pub(crate) torn: AtomicU64,
        /// The wake word (`park.rs`): bit 0 = sleepers, bits 1.. = wake sequence.
        pub(crate) wake: AtomicU32,
        /// Number of sleeping acquirers, for diagnostics only (may over-count after a waiter
        /// died); the wake protocol does not read it.
        pub(crate) waiters: AtomicU32,
        /// When the current claim was made: the claimant's epoch at the claim, shifted left by
        /// [`CLAIMED_AT_SHIFT`], over the low bits of the claim's generation (which say
        /// whether the value belongs to the current claim). Stored (Relaxed) right after the
        /// claim's CAS; diagnostics only, the protocol never reads it.
        pub(crate) claimed_at: AtomicU64,
        /// Reserved (zero).
        _reserved: AtomicU64,
        /// Quarantine records, one per buffer ([`quarantine_tag`]); meaningful while the
        /// buffer's Q bit is set in the claim word.
        pub(crate) qowner: [AtomicU64; BUFS],
        /// The payload buffers: the published one and the holder's staging one are named by
        /// the claim word.
        pub(crate) bufs: [PayloadBuf; BUFS],
        /// Cumulative event counters (see [`counter`]).
        pub(crate) counters: [AtomicU64; 16],
        /// Process identities of the holders (see `ident.rs`).
        pub(crate) idents: [IdentSlot; IDENT_SLOTS],
        /// Shared strategy (spin budget of blocked acquirers), see `cxc-sidecar`.
        pub(crate) handshake: HandshakeHeader,
        /// Recent transitions, recorded while a `SidecarBox` observes a handle.
        pub(crate) ring: ObservationRing,
        /// Loom models only: holder slots the "OS" reports dead.
        #[cfg(cxc_loom)]
        pub(crate) loom_dead: AtomicU64,
        /// Loom models only: a futex with real semantics (a lost wake-up deadlocks).
        #[cfg(cxc_loom)]
        pub(crate) futex: crate::park::ModelFutex,
    }
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<PayloadBuf>() == 64);
#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<LeaseState>() == 64 + 64 + 512 + 128 + 64 * IDENT_SLOTS + 2688);
#[cfg(not(cxc_loom))]
const _: () = assert!(align_of::<LeaseState>() == 64);

/// Why a claim was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimReason {
    Vacant,
    Preempt,
    Stale,
    Dead,
    /// The holder's process is exiting: its sentinel ended and none of its threads can
    /// run user code again.
    Exiting,
}

/// A granted claim: the claim word as installed (or found, for the current holder).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    pub(crate) word: u64,
    pub(crate) torn: bool,
    /// Why the claim was granted; `None` when the caller already held it.
    pub(crate) reason: Option<ClaimReason>,
}

/// Per-handle protocol parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub(crate) preempt_lower: bool,
}

/// Who claims: the identity-table slot (+1) registered for `pid` by this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimant {
    pub(crate) holder: u8,
    pub(crate) pid: u32,
    /// A guard's claim: never idempotent (every guard excludes every other), never
    /// preempted, and written without WRITE by its single writer.
    pub(crate) private: bool,
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteRefused {
    /// The claim is not (or no longer) current.
    Lost,
    /// Every buffer is published, staged or quarantined.
    NoBuffer,
    /// A sibling's write of the same claim did not finish within the bounded wait.
    Busy,
}

impl LeaseState {
    /// Fresh state (vacant, generation 0, epoch 0, zero payload). Used by loom models;
    /// files are zero-initialised, which is the same state.
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        LeaseState {
            claim: AtomicU64::new(0),
            heartbeat: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            term: AtomicU64::new(0),
            torn: AtomicU64::new(0),
            wake: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            claimed_at: AtomicU64::new(0),
            _reserved: AtomicU64::new(0),
            qowner: std::array::from_fn(|_| AtomicU64::new(0)),
            bufs: std::array::from_fn(|_| PayloadBuf::new()),
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            idents: std::array::from_fn(|_| IdentSlot::new()),
            handshake: HandshakeHeader::new(),
            ring: ObservationRing::new(),
            loom_dead: AtomicU64::new(0),
            futex: crate::park::ModelFutex::new(),
        }
    }

    #[inline]
    pub(crate) fn word(&self) -> Word {
        Word(self.claim.load(Ordering::Acquire))
    }

    #[inline]
    pub(crate) fn bump(&self, which: usize, by: u64) {
        self.counters[which].fetch_add(by, Ordering::Relaxed);
    }

    /// The full generation of claim word `word`: the checkpointed term plus the distance
    /// from it to the word's low generation bits, which is less than half the low bits'
    /// range either way (checkpoints come every `TERM_CHECKPOINT` claims). A word loaded
    /// before a checkpoint passed it (its loader stalled, e.g. stopped) is behind the term
    /// it is read with: counted backwards, never as a wrap ahead (that made a token about
    /// 2^40 too high: `attack35_mp`).
    #[inline]
    pub(crate) fn full_generation(&self, word: u64) -> u64 {
        let low = word >> GEN_SHIFT;
        let t = self.term.load(Ordering::Acquire);
        let ahead = low.wrapping_sub(t) & (GEN_MOD - 1);
        if ahead < GEN_MOD / 2 {
            t.wrapping_add(ahead)
        } else {
            t.wrapping_sub(GEN_MOD - ahead)
        }
    }

    /// The claim `word` as a token of the process with pid `proc` (the caller's own
    /// pid for claims it made; the holder's for a claim it only observes).
    pub(crate) fn claim_for(&self, word: u64, inherited_torn: bool, proc: u32) -> LeaseClaim {
        LeaseClaim {
            id: word & ID_MASK,
            pid: self.holder_pid(Word(word)),
            proc,
            generation: self.full_generation(word),
            inherited_torn,
        }
    }

    /// After a release: wakes one sleeper if any may sleep (one load; see `park.rs`).
    #[inline]
    pub(crate) fn wake_waiters(&self) {
        if crate::park::has_sleepers(&self.wake) {
            self.wake_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self) {
        crate::park::wake(&self.wake, 1, self.model().as_ref());
    }

    /// After the epoch counter moved (`tick_epoch`): the holder may have gone stale, so
    /// every sleeper looks again. The RMW on the claim word orders the tick with a
    /// waiter's re-check as a release's CAS does (`park.rs`): either the waiter's
    /// re-check comes later in the claim word's order and then its read of the epoch
    /// sees the tick, or it comes first and then the sleepers flag it set before is seen
    /// here. Waking all: a waiter that finds the holder still fresh sleeps again, and
    /// one in a stopped process cannot keep the others from looking.
    pub(crate) fn wake_after_tick(&self) {
        // SYNC: park (RMW on the claim word after the epoch's; pairs with `recheck`).
        self.claim.fetch_add(0, Ordering::SeqCst);
        if crate::park::has_sleepers(&self.wake) {
            crate::park::wake(&self.wake, u32::MAX, self.model().as_ref());
        }
    }

    /// A blocked claimant's re-check after `park::announce`: the claim word read with a
    /// read-modify-write, so that it is ordered with every release CAS (see `park.rs`).
    #[inline]
    pub(crate) fn recheck(&self) -> Word {
        // SYNC: park (RMW on the claim word; pairs with the releaser's CAS).
        Word(self.claim.fetch_add(0, Ordering::SeqCst))
    }

    /// The loom model futex of this state (none outside loom).
    #[inline]
    pub(crate) fn model(&self) -> Option<crate::park::ModelFutexRef<'_>> {
        #[cfg(cxc_loom)]
        {
            Some(crate::park::ModelFutexRef(&self.futex))
        }
        #[cfg(not(cxc_loom))]
        {
            None
        }
    }

    /// Heartbeat for the claim matching `accept`. Linearizes at the claim load.
    #[inline]
    pub(crate) fn beat_if(&self, now: u64, accept: impl Fn(Word) -> bool) -> bool {
        let cur = self.word();
        if !accept(cur) {
            self.bump(counter::STALE_OP_REJECTED, 1);
            return false;
        }
        if self.heartbeat.load(Ordering::Relaxed) < now {
            self.heartbeat.fetch_max(now, Ordering::Release);
        }
        true
    }

    /// Reads the published payload if the claim word satisfies `accept`.
    #[inline]
    pub(crate) fn read_if(
        &self,
        n: usize,
        accept: impl Fn(Word) -> bool,
    ) -> Option<[u64; PAYLOAD_WORDS]> {
        let mut tries = 0u32;
        loop {
            let cur = self.word();
            if !accept(cur) {
                return None;
            }
            let p = cur.published();
            let buf = &self.bufs[p];
            // SYNC: payload seqlock. Pairs with the Release fence/store in `fill`.
            let s1 = buf.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let mut words = [0u64; PAYLOAD_WORDS];
                for (dst, src) in words.iter_mut().zip(&buf.words).take(n) {
                    *dst = src.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                // The copy is the published value only if `p` is still the published
                // buffer and was not refilled: a reader that loaded `cur` long ago may
                // have copied a later claim's staged fill of `p`, which is never to be
                // seen unless it is published (L7). A buffer is published again only
                // after a fill, which changes its sequence; the Acquire load of the claim
                // word makes that fill's sequence visible to the load after it.
                let again = self.word();
                if again.published() == p && buf.seq.load(Ordering::Relaxed) == s1 {
                    return Some(words);
                }
            }
            tries += 1;
            if tries >= READ_RETRY_LIMIT {
                return None;
            }
            spin_hint();
        }
    }

    /// The payload published under the claim `word`, which the caller holds WRITE on:
    /// `None` if the claim was superseded or released meanwhile. WRITE keeps siblings
    /// out, not a taker, which republishes and may refill the buffer under the copy (a
    /// torn `with_lease` input, found by `attack37_mp` with the holder stopped mid-copy);
    /// so the copy counts only if the claim is still `word`'s after it.
    #[inline]
    pub(crate) fn read_published(&self, word: Word, n: usize) -> Option<[u64; PAYLOAD_WORDS]> {
        let buf = &self.bufs[word.published()];
        let mut words = [0u64; PAYLOAD_WORDS];
        for (dst, src) in words.iter_mut().zip(&buf.words).take(n) {
            *dst = src.load(Ordering::Relaxed);
        }
        // SYNC: payload seqlock. A copied word from a later claim's fill (its stores
        // follow its Release fence, which follows its claim CAS) makes that CAS visible
        // to the claim-word load after this Acquire fence; while the word still names
        // this claim, no later claim existed, so nothing refilled the buffer.
        fence(Ordering::Acquire);
        (self.word().id() == word.id()).then_some(words)
    }

    /// The published payload, read as a seqlock reader regardless of the holder
    /// (diagnostics only; bounded retries, zeros if a writer keeps interfering).
    pub(crate) fn read_published_consistent(&self) -> [u64; PAYLOAD_WORDS] {
        self.read_if(PAYLOAD_WORDS, |_| true).unwrap_or_default()
    }

    /// Whether the current claim inherited an interrupted write that was not yet
    /// overwritten (while vacant: whether the next claim inherits one).
    pub(crate) fn torn_pending(&self) -> bool {
        let t = self.torn.load(Ordering::Acquire);
        let w = self.word();
        t != 0 && (w.id() == t || (w.is_vacant() && t == TORN_NEXT | w.gen_low()))
    }
}

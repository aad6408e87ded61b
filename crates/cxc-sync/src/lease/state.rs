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

use crate::liveness::Liveness;
use crate::primitive::{AtomicU32, AtomicU64, Ordering, fence, spin_hint};

use cxc_sidecar::{HandshakeHeader, ObservationRing};

use super::claim::LeaseClaim;
use super::ident::{IDENT_SLOTS, IdentSlot};
use super::word::{BUFS, GEN_BITS, GEN_SHIFT, ID_MASK, Word, quarantine_tag};

const GEN_MOD: u64 = 1 << GEN_BITS;
/// The full generation is checkpointed into `term` whenever the low bits are a multiple of this.
const TERM_CHECKPOINT: u64 = 1 << 16;

/// Payload words per buffer (48 bytes).
pub(crate) const PAYLOAD_WORDS: usize = 6;
/// Maximum payload size in bytes.
pub const PAYLOAD_BYTES: usize = PAYLOAD_WORDS * 8;

/// `torn` value meaning: the claim that follows the vacant word of this generation (low
/// bits) inherits an interrupted update (see `vacate_dead_holder`).
pub(crate) const TORN_NEXT: u64 = 1 << 63;

/// How long a preempting or stale-taking claimant waits for an in-flight write of a live
/// holder to finish before it supersedes the writer (quarantining its buffer).
#[cfg(not(cxc_loom))]
const WRITE_SPIN_LIMIT: u32 = 256;
#[cfg(cxc_loom)]
const WRITE_SPIN_LIMIT: u32 = 1;
/// Bound on seqlock retries of a reader (only reachable if a writer keeps republishing).
#[cfg(not(cxc_loom))]
const READ_RETRY_LIMIT: u32 = 1 << 20;
#[cfg(cxc_loom)]
const READ_RETRY_LIMIT: u32 = 3;

/// Indices into `LeaseState::counters` (cumulative, slow paths only).
pub mod counter {
    /// Claims that preempted a live higher-pid holder.
    pub const CLAIM_PREEMPT: usize = 0;
    /// Claims that took over a stale heartbeat.
    pub const CLAIM_STALE: usize = 1;
    /// Claims that took over a holder the OS proved dead.
    pub const CLAIM_DEAD: usize = 2;
    /// Claims that inherited an interrupted write.
    pub const TORN_INHERITED: usize = 3;
    /// Writes/beats/releases refused because the caller's claim was superseded.
    pub const STALE_OP_REJECTED: usize = 4;
    /// Blocking acquires that had to sleep.
    pub const BLOCKED_WAITS: usize = 5;
    /// Total nanoseconds spent in blocked acquires.
    pub const BLOCKED_NS: usize = 6;
    /// Blocking acquires that timed out.
    pub const TIMEOUTS: usize = 7;
    /// Torn-payload flags cleared by a successful write of the new holder.
    pub const TORN_RESTORED: usize = 8;
    /// Buffers put in quarantine (a claim superseded or released mid-write).
    pub const QUARANTINED: usize = 9;
    /// Quarantined buffers freed by their own (stale) writer.
    pub const QUARANTINE_FREED: usize = 10;
    /// Quarantined buffers freed because the OS proved their writer's process gone.
    pub const QUARANTINE_REAPED: usize = 11;
    /// Writes refused because every buffer was published, staged or in quarantine.
    pub const NO_BUFFER: usize = 12;
    /// Number of counters in use.
    pub const COUNT: usize = 13;
    /// Names of the counters, by index.
    pub const NAMES: [&str; COUNT] = [
        "claim_preempt",
        "claim_stale",
        "claim_dead_owner",
        "torn_inherited",
        "stale_op_rejected",
        "blocked_waits",
        "blocked_ns",
        "timeouts",
        "torn_restored",
        "quarantined",
        "quarantine_freed",
        "quarantine_reaped",
        "no_buffer",
    ];
}

/// One payload buffer: a sequence word and 48 bytes, one cache line.
#[repr(C)]
pub(crate) struct PayloadBuf {
    pub(crate) seq: AtomicU64,
    pub(crate) words: [AtomicU64; PAYLOAD_WORDS],
    _reserved: AtomicU64,
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

/// The lease's fixed block in the file (offsets in `docs/memory-layout.md`).
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
    /// Futex word bumped by releases when someone sleeps.
    pub(crate) wake: AtomicU32,
    /// Number of sleeping acquirers (may over-count after a waiter dies; costs one
    /// spurious wake syscall per release, never a lost wake-up).
    pub(crate) waiters: AtomicU32,
    /// Reserved (zero).
    _reserved: [AtomicU64; 2],
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
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<PayloadBuf>() == 64);
#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<LeaseState>() == 64 + 64 + 512 + 128 + 64 * IDENT_SLOTS + 2688);
#[cfg(not(cxc_loom))]
const _: () = assert!(align_of::<LeaseState>() == 64);

#[cfg(not(cxc_loom))]
// SAFETY: `LeaseState` is `repr(C)` and made only of `AtomicU32`/`AtomicU64`, arrays of
// them, and `repr(C)` structs of them (`PayloadBuf`, `IdentSlot`, `HandshakeHeader`,
// `ObservationRing`); every bit pattern is valid and its alignment is 64.
unsafe impl cxc_mmf::AtomicView for LeaseState {}

/// A bounded wait for a sibling's WRITE bit to clear: spins, then sleeps, then gives up
/// after about 100 ms, so a WRITE bit left by a stalled sibling can never hang a caller.
struct WriteWait {
    rounds: u32,
    #[cfg(not(cxc_loom))]
    since: Option<std::time::Instant>,
}

impl WriteWait {
    const SPINS: u32 = 256;
    #[cfg(not(cxc_loom))]
    const PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

    fn new() -> Self {
        WriteWait {
            rounds: 0,
            #[cfg(not(cxc_loom))]
            since: None,
        }
    }

    fn expired(&self) -> bool {
        #[cfg(not(cxc_loom))]
        {
            self.since.is_some_and(|t| t.elapsed() >= Self::PATIENCE)
        }
        #[cfg(cxc_loom)]
        {
            self.rounds >= 2
        }
    }

    fn pause(&mut self) {
        self.rounds += 1;
        #[cfg(not(cxc_loom))]
        if self.rounds > Self::SPINS {
            self.since.get_or_insert_with(std::time::Instant::now);
            std::thread::sleep(std::time::Duration::from_micros(50));
            return;
        }
        spin_hint();
    }
}

/// Why a claim was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimReason {
    Vacant,
    Preempt,
    Stale,
    Dead,
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
            _reserved: std::array::from_fn(|_| AtomicU64::new(0)),
            qowner: std::array::from_fn(|_| AtomicU64::new(0)),
            bufs: std::array::from_fn(|_| PayloadBuf::new()),
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            idents: std::array::from_fn(|_| IdentSlot::new()),
            handshake: HandshakeHeader::new(),
            ring: ObservationRing::new(),
            loom_dead: AtomicU64::new(0),
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

    /// The full generation of claim word `word`.
    #[inline]
    pub(crate) fn full_generation(&self, word: u64) -> u64 {
        let low = word >> GEN_SHIFT;
        let t = self.term.load(Ordering::Acquire);
        t.wrapping_add(low.wrapping_sub(t) & (GEN_MOD - 1))
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

    /// Claim protocol (seed 000 + fencing). `now` is the current epoch (read once by the
    /// caller); `owner` judges the holder's OS liveness. With `write` the new claim is
    /// installed with the WRITE bit already set (used by `with_lease`).
    #[inline]
    pub(crate) fn try_claim(
        &self,
        policy: Policy,
        me: Claimant,
        grace: u64,
        now: u64,
        owner: impl FnMut(&Self, Word) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        // Fast path: a vacant lease whose heartbeat is already current (no write to it).
        let cur = self.word();
        if cur.is_vacant()
            && me.holder != 0
            && self.heartbeat.load(Ordering::Relaxed) >= now
            && self.torn.load(Ordering::Relaxed) & TORN_NEXT == 0
            && let Some(stage) = cur.free_buffer()
        {
            let next = cur
                .with_holder(me.holder)
                .with_stage(Some(stage))
                .next_gen()
                .with_write(write)
                .with_private(me.private);
            if self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
                .is_ok()
            {
                self.note_claim(next, ClaimReason::Vacant, false);
                return Some(Granted {
                    word: next.0,
                    torn: false,
                    reason: Some(ClaimReason::Vacant),
                });
            }
        }
        self.try_claim_slow(policy, me, grace, now, owner, write)
    }

    #[cold]
    #[inline(never)]
    fn try_claim_slow(
        &self,
        policy: Policy,
        me: Claimant,
        grace: u64,
        now: u64,
        mut owner: impl FnMut(&Self, Word) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        if me.holder == 0 {
            return None;
        }
        let mut spins = 0u32;
        let mut cache: Option<(u64, Liveness)> = None;
        let mut judge = |state: &Self, word: Word| -> Liveness {
            match cache {
                Some((c, v)) if c == word.id() => v,
                _ => {
                    let v = owner(state, word);
                    cache = Some((word.id(), v));
                    v
                }
            }
        };
        let mut cur = self.word();
        loop {
            if cur.holder() == me.holder && !me.private {
                // Idempotent (seed): the caller already holds it.
                if write {
                    // `with_lease` on a held lease goes through the ordinary write path.
                    return None;
                }
                return Some(Granted {
                    word: cur.0,
                    torn: false,
                    reason: None,
                });
            }
            let mut verdict = Liveness::Unknown;
            let reason = if cur.is_vacant() {
                ClaimReason::Vacant
            } else if policy.preempt_lower && !cur.private() && me.pid < self.holder_pid(cur) {
                ClaimReason::Preempt
            } else if now.saturating_sub(self.heartbeat.load(Ordering::Acquire)) > grace {
                ClaimReason::Stale
            } else {
                verdict = judge(self, cur);
                if verdict == Liveness::Dead {
                    ClaimReason::Dead
                } else {
                    return None;
                }
            };
            let mut next = cur;
            let mut torn = cur.writing();
            if cur.is_vacant() {
                // A dead holder's claim vacated mid-update (`vacate_dead_holder`): the next
                // claim inherits the torn flag.
                torn = self.torn.load(Ordering::Acquire) == TORN_NEXT | cur.gen_low();
            }
            if cur.may_be_writing() {
                // A write may be in flight: WRITE is set, or the holder is a guard (whose
                // single writer stages without WRITE). A writer the OS proves dead can
                // store nothing more. A live (or unidentifiable, e.g. paused) one with
                // WRITE gets a short while to finish; then a preemption gives up (a live
                // writer is never preempted mid-write), while a stale-heartbeat takeover
                // supersedes it and quarantines its staging buffer (L5, L7).
                if verdict == Liveness::Unknown {
                    verdict = judge(self, cur);
                }
                if cur.private() {
                    // A guard's update was interrupted if its staging buffer is mid-fill.
                    torn = cur
                        .stage()
                        .is_some_and(|s| self.bufs[s].seq.load(Ordering::Acquire) & 1 == 1);
                }
                if verdict != Liveness::Dead {
                    if cur.writing() {
                        if spins < WRITE_SPIN_LIMIT {
                            spins += 1;
                            spin_hint();
                            cur = self.word();
                            continue;
                        }
                        if reason == ClaimReason::Preempt
                            && now.saturating_sub(self.heartbeat.load(Ordering::Acquire)) <= grace
                        {
                            return None;
                        }
                    }
                    if let Some(s) = cur.stage() {
                        self.qowner[s].fetch_max(
                            quarantine_tag(self.full_generation(cur.0), cur.holder()),
                            Ordering::AcqRel,
                        );
                        next = next.with_quarantined(s);
                    }
                }
            }
            let next = next
                .with_holder(me.holder)
                .with_stage(None)
                .with_write(false)
                .with_private(me.private)
                .next_gen();
            let stage = next.free_buffer();
            if write && stage.is_none() {
                self.bump(counter::NO_BUFFER, 1);
                return None;
            }
            let next = next.with_stage(stage).with_write(write);
            // L6: refresh the heartbeat *before* the claim becomes visible, so nobody who
            // sees the new claim can find it stale. `fetch_max` never moves it backwards.
            if self.heartbeat.load(Ordering::Relaxed) < now {
                self.heartbeat.fetch_max(now, Ordering::Relaxed);
            }
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    if next.quarantine() != cur.quarantine() {
                        self.bump(counter::QUARANTINED, 1);
                    }
                    self.note_claim(next, reason, torn);
                    return Some(Granted {
                        word: next.0,
                        torn,
                        reason: Some(reason),
                    });
                }
                Err(actual) => {
                    cur = Word(actual);
                    spin_hint();
                }
            }
        }
    }

    #[inline(always)]
    fn note_claim(&self, word: Word, reason: ClaimReason, torn: bool) {
        if word.gen_low() % TERM_CHECKPOINT == 0 {
            self.checkpoint(word.0);
        }
        match reason {
            ClaimReason::Vacant => {}
            ClaimReason::Preempt => self.bump(counter::CLAIM_PREEMPT, 1),
            ClaimReason::Stale => self.bump(counter::CLAIM_STALE, 1),
            ClaimReason::Dead => self.bump(counter::CLAIM_DEAD, 1),
        }
        if torn {
            self.torn.store(word.id(), Ordering::Release);
            self.bump(counter::TORN_INHERITED, 1);
        } else if self.torn.load(Ordering::Relaxed) & TORN_NEXT != 0 {
            // A marker for a vacant word that another claim went past: stale.
            self.torn.store(0, Ordering::Release);
        }
    }

    /// Vacates the current claim if the OS proves its holder's whole process gone, so
    /// that its identity slot is no longer referenced and can be reused by a claimant
    /// that found the identity table full. An interrupted update is passed on to the next
    /// claim (`TORN_NEXT`). Returns whether it vacated.
    #[cold]
    pub(crate) fn vacate_dead_holder(&self) -> bool {
        let cur = self.word();
        if cur.is_vacant() || self.holder_liveness(cur) != Liveness::Dead {
            return false;
        }
        let torn = cur.writing()
            || (cur.private()
                && cur
                    .stage()
                    .is_some_and(|s| self.bufs[s].seq.load(Ordering::Acquire) & 1 == 1));
        if torn {
            self.torn
                .store(TORN_NEXT | cur.gen_low(), Ordering::Release);
        }
        if self
            .claim
            .compare_exchange(cur.0, cur.vacated().0, Ordering::SeqCst, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.bump(counter::CLAIM_DEAD, 1);
        self.wake_waiters();
        true
    }

    #[cold]
    fn checkpoint(&self, word: u64) {
        self.term
            .fetch_max(self.full_generation(word), Ordering::AcqRel);
    }

    /// Releases the claim `id` (holder + generation bits). A stale id never touches the
    /// current claim (L3).
    #[inline]
    pub(crate) fn release_id(&self, id: u64) -> bool {
        self.release_from(id, self.word(), false)
    }

    /// [`release_id`](Self::release_id) starting from an already loaded claim word. A
    /// write of the same claim in flight (a sibling thread's) does not delay the release:
    /// its staging buffer goes into quarantine and its publication will fail.
    /// `by_guard`: the release is the guard's own (its single writer is not writing).
    #[inline]
    pub(crate) fn release_from(&self, id: u64, mut cur: Word, by_guard: bool) -> bool {
        loop {
            if cur.id() != id || cur.is_vacant() {
                self.bump(counter::STALE_OP_REJECTED, 1);
                return false;
            }
            let mut next = cur.vacated();
            if (cur.writing() || (cur.private() && !by_guard))
                && let Some(s) = cur.stage()
            {
                self.qowner[s].fetch_max(
                    quarantine_tag(self.full_generation(cur.0), cur.holder()),
                    Ordering::AcqRel,
                );
                next = next.with_quarantined(s);
            }
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    if next.quarantine() != cur.quarantine() {
                        self.bump(counter::QUARANTINED, 1);
                    }
                    self.wake_waiters();
                    return true;
                }
                Err(actual) => cur = Word(actual),
            }
        }
    }

    /// Wakes one sleeper if any (release side of the SeqCst handshake with `acquire`).
    #[inline]
    pub(crate) fn wake_waiters(&self) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            self.wake.fetch_add(1, Ordering::SeqCst);
            crate::futex::wake(&self.wake, 1);
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
            let buf = &self.bufs[cur.published()];
            // SYNC: payload seqlock. Pairs with the Release fence/store in `fill`.
            let s1 = buf.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let mut words = [0u64; PAYLOAD_WORDS];
                for (dst, src) in words.iter_mut().zip(&buf.words).take(n) {
                    *dst = src.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if buf.seq.load(Ordering::Relaxed) == s1 {
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

    /// Writes `words` as the claim matching `accept`: start (WRITE), fill the staging
    /// buffer, publish (one CAS that succeeds only if the claim is unchanged: L2).
    #[inline]
    pub(crate) fn write_if(
        &self,
        words: &[u64; PAYLOAD_WORDS],
        n: usize,
        accept: impl Fn(Word) -> bool,
    ) -> Result<(), WriteRefused> {
        let word = self.start_write(accept)?;
        self.fill(word, words, n);
        if self.publish(word, false) {
            Ok(())
        } else {
            Err(WriteRefused::Lost)
        }
    }

    /// A guard's write: fill the claim's staging buffer with plain stores and publish with
    /// one CAS (no WRITE: a guard's claim is PRIVATE, so whoever supersedes or releases it
    /// quarantines its staging buffer). The caller is the claim's only writer.
    pub(crate) fn write_private(
        &self,
        id: u64,
        words: &[u64; PAYLOAD_WORDS],
        n: usize,
    ) -> Result<Word, WriteRefused> {
        let mut cur = self.word();
        if cur.id() != id {
            self.bump(counter::STALE_OP_REJECTED, 1);
            return Err(WriteRefused::Lost);
        }
        if cur.stage().is_none() {
            cur = self.stage_for(id)?;
        }
        self.fill(cur, words, n);
        let mut at = cur;
        loop {
            let next = at.published_swap();
            match self
                .claim
                .compare_exchange(at.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    if self.torn.load(Ordering::Relaxed) == id {
                        let _ =
                            self.torn
                                .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
                        self.bump(counter::TORN_RESTORED, 1);
                    }
                    return Ok(next);
                }
                Err(actual) if Word(actual).sans_quarantine() == cur.sans_quarantine() => {
                    at = Word(actual);
                }
                Err(_) => {
                    self.bump(counter::STALE_OP_REJECTED, 1);
                    self.free_own_quarantine(cur);
                    return Err(WriteRefused::Lost);
                }
            }
        }
    }

    /// Gives the (private) claim `id` a staging buffer: a free one, after reaping the
    /// quarantined buffers of dead writers if none is free.
    #[cold]
    fn stage_for(&self, id: u64) -> Result<Word, WriteRefused> {
        let mut reaped = false;
        let mut cur = self.word();
        loop {
            if cur.id() != id {
                return Err(WriteRefused::Lost);
            }
            if cur.stage().is_some() {
                return Ok(cur);
            }
            let Some(b) = cur.free_buffer() else {
                if reaped {
                    self.bump(counter::NO_BUFFER, 1);
                    return Err(WriteRefused::NoBuffer);
                }
                reaped = true;
                self.reap_quarantine();
                cur = self.word();
                continue;
            };
            let next = cur.with_stage(Some(b));
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(next),
                Err(actual) => cur = Word(actual),
            }
        }
    }

    /// A guard gives up its claim `last` (the claim word it last installed or saw as
    /// current): release it if still current; if it was superseded meanwhile, free the
    /// quarantine of its staging buffer (the guard is not writing). Returns whether the
    /// claim was still current.
    pub(crate) fn release_private(&self, last: Word) -> bool {
        if self.release_from(last.id(), self.word(), true) {
            return true;
        }
        let cur = self.word();
        if cur.id() != last.id() {
            // Our claim went while we were not writing: the stage of the word a taker
            // superseded is the last one we knew (our publications keep `last` current).
            self.free_own_quarantine(last);
        }
        false
    }

    /// Sets WRITE on the current claim if it satisfies `accept` (waiting boundedly for a
    /// sibling's write of the same claim), giving it a staging buffer if it has none.
    /// Returns the word as installed (WRITE set).
    pub(crate) fn start_write(&self, accept: impl Fn(Word) -> bool) -> Result<Word, WriteRefused> {
        let mut cur = self.word();
        let mut waited = WriteWait::new();
        let mut reaped = false;
        loop {
            if !accept(cur) || cur.is_vacant() {
                self.bump(counter::STALE_OP_REJECTED, 1);
                return Err(WriteRefused::Lost);
            }
            if cur.writing() {
                if waited.expired() {
                    self.bump(counter::STALE_OP_REJECTED, 1);
                    return Err(WriteRefused::Busy);
                }
                waited.pause();
                cur = self.word();
                continue;
            }
            let mut next = cur.with_write(true);
            if cur.stage().is_none() {
                match cur.free_buffer() {
                    Some(b) => next = next.with_stage(Some(b)),
                    None if !reaped => {
                        reaped = true;
                        self.reap_quarantine();
                        cur = self.word();
                        continue;
                    }
                    None => {
                        self.bump(counter::NO_BUFFER, 1);
                        return Err(WriteRefused::NoBuffer);
                    }
                }
            }
            match self.claim.compare_exchange_weak(
                cur.0,
                next.0,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(next),
                Err(actual) => cur = Word(actual),
            }
        }
    }

    /// Fills the staging buffer of `word` (the caller holds WRITE on `word`; while the
    /// claim is current nobody else writes that buffer, and once it is superseded the
    /// buffer is quarantined until this writer is done).
    #[inline]
    pub(crate) fn fill(&self, word: Word, words: &[u64; PAYLOAD_WORDS], n: usize) {
        let Some(stage) = word.stage() else { return };
        let buf = &self.bufs[stage];
        let s = buf.seq.load(Ordering::Relaxed);
        let odd = s.wrapping_add(1) | 1;
        // SYNC: payload seqlock (writer side): odd, fence, data, even. Late readers of
        // this buffer (it was published before the last swap) see the odd value or a
        // changed sequence and retry.
        buf.seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (dst, w) in buf.words.iter().zip(words).take(n) {
            dst.store(*w, Ordering::Relaxed);
        }
        buf.seq.store(odd.wrapping_add(1), Ordering::Release);
    }

    /// Publishes the filled staging buffer of `word` (WRITE set): swap published and
    /// staging buffers, clear WRITE, and with `release` also vacate. Fails only if the
    /// claim was superseded or released meanwhile; then this writer's quarantined buffer
    /// is freed (it will store nothing more into it).
    #[inline]
    pub(crate) fn publish(&self, word: Word, release: bool) -> bool {
        let mut cur = word;
        loop {
            let next = if release {
                cur.published_swap().vacated()
            } else {
                cur.published_swap()
            };
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    let id = word.id();
                    if self.torn.load(Ordering::Relaxed) == id {
                        let _ =
                            self.torn
                                .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
                        self.bump(counter::TORN_RESTORED, 1);
                    }
                    if release {
                        self.wake_waiters();
                    }
                    return true;
                }
                // Only the quarantine bits changed (another writer freed its buffer).
                Err(actual) if Word(actual).sans_quarantine() == word.sans_quarantine() => {
                    cur = Word(actual);
                }
                Err(_) => {
                    self.bump(counter::STALE_OP_REJECTED, 1);
                    self.free_own_quarantine(word);
                    return false;
                }
            }
        }
    }

    /// Abandons a write (no publication): clears WRITE if the claim is still `word`, and
    /// with `release` also releases the claim. If the claim was superseded meanwhile,
    /// frees this writer's quarantined buffer.
    pub(crate) fn abort_write(&self, word: Word, release: bool) {
        let mut cur = word;
        loop {
            let next = if release {
                cur.vacated()
            } else {
                cur.with_write(false)
            };
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    if release {
                        self.wake_waiters();
                    }
                    return;
                }
                Err(actual) if Word(actual).sans_quarantine() == word.sans_quarantine() => {
                    cur = Word(actual);
                }
                Err(_) => {
                    self.free_own_quarantine(word);
                    return;
                }
            }
        }
    }

    /// Called by a writer of `word` whose claim was superseded or released while it held
    /// WRITE: it stores nothing more into its staging buffer, so the buffer leaves
    /// quarantine.
    pub(crate) fn free_own_quarantine(&self, word: Word) {
        let Some(s) = word.stage() else { return };
        // The record names this claim if its holder and low generation bits are ours (the
        // full generation of a stale word cannot be rebuilt once `term` moved past it).
        let ours =
            |tag: u64| tag as u8 == word.holder() && (tag >> 8) & (GEN_MOD - 1) == word.gen_low();
        let mut cur = self.word();
        loop {
            if !cur.is_quarantined(s) || !ours(self.qowner[s].load(Ordering::Acquire)) {
                return;
            }
            match self.claim.compare_exchange(
                cur.0,
                cur.without_quarantined(s).0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.bump(counter::QUARANTINE_FREED, 1);
                    return;
                }
                Err(actual) => cur = Word(actual),
            }
        }
    }

    /// Frees every quarantined buffer whose writer's process the OS proves gone.
    #[cold]
    pub(crate) fn reap_quarantine(&self) {
        let mut cur = self.word();
        for b in 0..BUFS {
            if !cur.is_quarantined(b) {
                continue;
            }
            let tag = self.qowner[b].load(Ordering::Acquire);
            let holder = (tag & 0xFF) as u8;
            if self.slot_liveness(holder) != Liveness::Dead {
                continue;
            }
            loop {
                if !cur.is_quarantined(b) || self.qowner[b].load(Ordering::Acquire) != tag {
                    break;
                }
                match self.claim.compare_exchange(
                    cur.0,
                    cur.without_quarantined(b).0,
                    Ordering::SeqCst,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.bump(counter::QUARANTINE_REAPED, 1);
                        cur = self.word();
                        break;
                    }
                    Err(actual) => cur = Word(actual),
                }
            }
        }
    }

    /// Reads the buffer published by `word` while the caller holds WRITE on `word`
    /// (nobody else republishes then).
    #[inline]
    pub(crate) fn read_published(&self, word: Word) -> [u64; PAYLOAD_WORDS] {
        let buf = &self.bufs[word.published()];
        std::array::from_fn(|i| buf.words[i].load(Ordering::Relaxed))
    }

    /// The published payload, read as a seqlock reader regardless of the holder
    /// (diagnostics only; bounded retries, zeros if a writer keeps interfering).
    pub(crate) fn read_published_consistent(&self) -> [u64; PAYLOAD_WORDS] {
        self.read_if(PAYLOAD_WORDS, |_| true).unwrap_or_default()
    }

    /// Whether the current claim inherited an interrupted write that was not yet
    /// overwritten.
    pub(crate) fn torn_pending(&self) -> bool {
        let t = self.torn.load(Ordering::Acquire);
        t != 0 && self.word().id() == t
    }
}

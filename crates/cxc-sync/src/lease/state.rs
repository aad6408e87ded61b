//! The lease's shared state and its lock-free protocol (see `docs/owner-lease.md`).
//!
//! Claim word (`LeaseState::claim`), one `u64` so that owner, generation and payload index
//! change together and no ABA is possible on handover:
//!
//! | bits   | field | meaning                                                        |
//! |--------|-------|----------------------------------------------------------------|
//! | 0..32  | pid   | holder pid, 0 = vacant                                         |
//! | 32     | IDX   | which payload buffer holds the published value                 |
//! | 33     | WRITE | a holder is writing the other buffer (or running `with_lease`) |
//! | 34..64 | gen   | low 30 bits of the generation, +1 on every claim               |
//!
//! The full 64-bit generation is `term`-relative: `term` is a checkpoint of the full
//! generation stored every 2^16 claims, and a claim's full generation is the unique value
//! above the checkpoint with the claim word's low 30 bits.

use crate::liveness::Liveness;
use crate::primitive::{AtomicU32, AtomicU64, Ordering, fence, spin_hint};

use cxc_sidecar::{HandshakeHeader, ObservationRing};

use super::claim::LeaseClaim;
use super::ident::{IDENT_SLOTS, IdentSlot};

pub(crate) const PID_MASK: u64 = 0xFFFF_FFFF;
pub(crate) const IDX_BIT: u64 = 1 << 32;
pub(crate) const WRITE_BIT: u64 = 1 << 33;
pub(crate) const GEN_SHIFT: u32 = 34;
pub(crate) const GEN_BITS: u32 = 30;
pub(crate) const GEN_ONE: u64 = 1 << GEN_SHIFT;
pub(crate) const GEN_MASK: u64 = !(GEN_ONE - 1);
/// The bits that identify a claim: pid and generation.
pub(crate) const ID_MASK: u64 = PID_MASK | GEN_MASK;
const GEN_MOD: u64 = 1 << GEN_BITS;
/// The full generation is checkpointed into `term` whenever the low bits are a multiple of this.
const TERM_CHECKPOINT: u64 = 1 << 16;

/// Payload words per buffer (48 bytes).
pub(crate) const PAYLOAD_WORDS: usize = 6;
/// Maximum payload size in bytes.
pub const PAYLOAD_BYTES: usize = PAYLOAD_WORDS * 8;

/// How long a claimant waits for an in-flight write of a live holder before giving up.
#[cfg(not(cxc_loom))]
const WRITE_SPIN_LIMIT: u32 = 256;
#[cfg(cxc_loom)]
const WRITE_SPIN_LIMIT: u32 = 1;
/// Bound on seqlock retries of a reader (only reachable if a presumed-dead writer revives).
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
    /// Number of counters in use.
    pub const COUNT: usize = 9;
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
    ];
}

/// One payload buffer: a sequence word and 48 bytes, one cache line.
#[repr(C)]
pub(crate) struct PayloadBuf {
    pub(crate) seq: AtomicU64,
    pub(crate) words: [AtomicU64; PAYLOAD_WORDS],
    _reserved: AtomicU64,
}

/// The lease's fixed block in the file (offsets in `docs/memory-layout.md`).
#[repr(C, align(64))]
pub(crate) struct LeaseState {
    /// The claim word (see the module docs).
    pub(crate) claim: AtomicU64,
    /// Epoch of the holder's last beat; only ever moves forward (`fetch_max`).
    pub(crate) heartbeat: AtomicU64,
    /// The manual epoch counter (also the offset added to clock epochs).
    pub(crate) epoch: AtomicU64,
    /// Checkpoint of the full generation.
    pub(crate) term: AtomicU64,
    /// Reserved (zero).
    _reserved: [AtomicU64; 2],
    /// Claim id that inherited an interrupted write (0 = none).
    pub(crate) torn: AtomicU64,
    /// Futex word bumped by releases when someone sleeps.
    pub(crate) wake: AtomicU32,
    /// Number of sleeping acquirers (may over-count after a waiter dies; costs one
    /// spurious wake syscall per release, never a lost wake-up).
    pub(crate) waiters: AtomicU32,
    /// Double-buffered payload: the published one is named by the claim word's IDX bit.
    pub(crate) bufs: [PayloadBuf; 2],
    /// Cumulative event counters (see [`counter`]).
    pub(crate) counters: [AtomicU64; 16],
    /// Process identities of the handles using this file (see `ident.rs`).
    pub(crate) idents: [IdentSlot; IDENT_SLOTS],
    /// Shared strategy (spin budget of blocked acquirers), see `cxc-sidecar`.
    pub(crate) handshake: HandshakeHeader,
    /// Recent transitions, recorded while a `SidecarBox` observes a handle.
    pub(crate) ring: ObservationRing,
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<PayloadBuf>() == 64);
#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<LeaseState>() == 3264);
#[cfg(not(cxc_loom))]
const _: () = assert!(align_of::<LeaseState>() == 64);

#[cfg(not(cxc_loom))]
// SAFETY: `LeaseState` is `repr(C)` and made only of `AtomicU32`/`AtomicU64` (and arrays
// of `PayloadBuf`, itself `repr(C)` of `AtomicU64`s); every bit pattern is valid and its
// alignment is 64.
unsafe impl cxc_mmf::AtomicView for LeaseState {}

/// A bounded wait for a sibling's WRITE bit to clear: spins, then sleeps, then gives up
/// after about 100 ms, so a WRITE bit left by a dead process can never hang a caller.
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

#[inline]
pub(crate) fn pid_of(word: u64) -> u32 {
    word as u32
}

#[inline]
fn idx_of(word: u64) -> usize {
    ((word & IDX_BIT) >> 32) as usize
}

impl LeaseState {
    /// Fresh state (vacant, generation 0, epoch 0, zero payload). Used by loom models;
    /// files are zero-initialised, which is the same state.
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        let buf = || PayloadBuf {
            seq: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            _reserved: AtomicU64::new(0),
        };
        LeaseState {
            claim: AtomicU64::new(0),
            heartbeat: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            term: AtomicU64::new(0),
            _reserved: std::array::from_fn(|_| AtomicU64::new(0)),
            torn: AtomicU64::new(0),
            wake: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            bufs: [buf(), buf()],
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            idents: std::array::from_fn(|_| IdentSlot::new()),
            handshake: HandshakeHeader::new(),
            ring: ObservationRing::new(),
        }
    }

    #[inline]
    pub(crate) fn bump(&self, which: usize, by: u64) {
        self.counters[which].fetch_add(by, Ordering::Relaxed);
    }

    /// The full generation for the low bits `low` (a claim word's generation field).
    #[inline]
    pub(crate) fn full_generation(&self, word: u64) -> u64 {
        let low = word >> GEN_SHIFT;
        let t = self.term.load(Ordering::Acquire);
        t.wrapping_add(low.wrapping_sub(t) & (GEN_MOD - 1))
    }

    pub(crate) fn claim_for(&self, word: u64, inherited_torn: bool) -> LeaseClaim {
        LeaseClaim {
            id: word & ID_MASK,
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
        my_pid: u32,
        grace: u64,
        now: u64,
        owner: impl FnMut(&Self, u64) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        // Fast path: a vacant lease whose heartbeat is already current (no write to it).
        let cur = self.claim.load(Ordering::Acquire);
        if cur & (PID_MASK | WRITE_BIT) == 0
            && my_pid != 0
            && self.heartbeat.load(Ordering::Relaxed) >= now
        {
            let mut next =
                u64::from(my_pid) | (cur & IDX_BIT) | (cur & GEN_MASK).wrapping_add(GEN_ONE);
            if write {
                next |= WRITE_BIT;
            }
            if self
                .claim
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Acquire)
                .is_ok()
            {
                self.note_claim(next, ClaimReason::Vacant, false);
                return Some(Granted {
                    word: next,
                    torn: false,
                    reason: Some(ClaimReason::Vacant),
                });
            }
        }
        self.try_claim_slow(policy, my_pid, grace, now, owner, write)
    }

    #[cold]
    #[inline(never)]
    fn try_claim_slow(
        &self,
        policy: Policy,
        my_pid: u32,
        grace: u64,
        now: u64,
        mut owner: impl FnMut(&Self, u64) -> Liveness,
        write: bool,
    ) -> Option<Granted> {
        if my_pid == 0 {
            return None;
        }
        let mut spins = 0u32;
        let mut cache: Option<(u64, Liveness)> = None;
        let mut judge = |state: &Self, word: u64| -> Liveness {
            let id = word & ID_MASK;
            match cache {
                Some((c, v)) if c == id => v,
                _ => {
                    let v = owner(state, word);
                    cache = Some((id, v));
                    v
                }
            }
        };
        let mut cur = self.claim.load(Ordering::Acquire);
        loop {
            let holder = pid_of(cur);
            if holder == my_pid {
                // Idempotent (seed): the caller already holds it.
                if write {
                    // `with_lease` on a held lease goes through the ordinary write path.
                    return None;
                }
                return Some(Granted {
                    word: cur,
                    torn: false,
                    reason: None,
                });
            }
            let mut verdict = Liveness::Unknown;
            let reason = if holder == 0 {
                ClaimReason::Vacant
            } else if policy.preempt_lower && my_pid < holder {
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
            let torn = cur & WRITE_BIT != 0;
            if torn {
                // A write is in flight.
                if verdict == Liveness::Unknown {
                    verdict = judge(self, cur);
                }
                // Only a holder the OS proves dead is superseded mid-write: a live (or
                // unidentifiable, e.g. paused) writer could still store into the buffer
                // the next holder would publish.
                let dead = verdict == Liveness::Dead;
                if !dead {
                    if spins < WRITE_SPIN_LIMIT {
                        spins += 1;
                        spin_hint();
                        cur = self.claim.load(Ordering::Acquire);
                        continue;
                    }
                    return None;
                }
            }
            // L6: refresh the heartbeat *before* the claim becomes visible, so nobody who
            // sees the new claim can find it stale. `fetch_max` never moves it backwards.
            if self.heartbeat.load(Ordering::Relaxed) < now {
                self.heartbeat.fetch_max(now, Ordering::Relaxed);
            }
            let mut next =
                u64::from(my_pid) | (cur & IDX_BIT) | (cur & GEN_MASK).wrapping_add(GEN_ONE);
            if write {
                next |= WRITE_BIT;
            }
            match self
                .claim
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    self.note_claim(next, reason, torn);
                    return Some(Granted {
                        word: next,
                        torn,
                        reason: Some(reason),
                    });
                }
                Err(actual) => {
                    cur = actual;
                    spin_hint();
                }
            }
        }
    }

    #[inline(always)]
    fn note_claim(&self, word: u64, reason: ClaimReason, torn: bool) {
        let id = word & ID_MASK;
        let low = word >> GEN_SHIFT;
        if low % TERM_CHECKPOINT == 0 {
            self.checkpoint(word);
        }
        match reason {
            ClaimReason::Vacant => {}
            ClaimReason::Preempt => self.bump(counter::CLAIM_PREEMPT, 1),
            ClaimReason::Stale => self.bump(counter::CLAIM_STALE, 1),
            ClaimReason::Dead => self.bump(counter::CLAIM_DEAD, 1),
        }
        if torn {
            self.torn.store(id, Ordering::Release);
            self.bump(counter::TORN_INHERITED, 1);
        }
    }

    #[cold]
    fn checkpoint(&self, word: u64) {
        self.term
            .fetch_max(self.full_generation(word), Ordering::AcqRel);
    }

    /// Releases the claim `id` (pid + generation bits). A stale id never touches the
    /// current claim (L3).
    #[inline]
    pub(crate) fn release_id(&self, id: u64) -> bool {
        self.release_from(id, self.claim.load(Ordering::Acquire))
    }

    /// [`release_id`](Self::release_id) starting from an already loaded claim word.
    #[inline]
    pub(crate) fn release_from(&self, id: u64, mut cur: u64) -> bool {
        let mut waited = WriteWait::new();
        loop {
            if cur & ID_MASK != id || pid_of(cur) == 0 {
                self.bump(counter::STALE_OP_REJECTED, 1);
                return false;
            }
            if cur & WRITE_BIT != 0 && !waited.expired() {
                // Another thread of this holder is mid-write (or in a `with_lease`
                // closure); wait for it, boundedly.
                waited.pause();
                cur = self.claim.load(Ordering::Acquire);
                continue;
            }
            // With WRITE still set after the bound, the write was abandoned (its process
            // died and this pid was reused, or a sibling's closure runs too long): the
            // release aborts it; the unpublished buffer is never published.
            let next = cur & (GEN_MASK | IDX_BIT);
            match self
                .claim
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => {
                    self.wake_waiters();
                    return true;
                }
                Err(actual) => cur = actual,
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
    pub(crate) fn beat_if(&self, now: u64, accept: impl Fn(u64) -> bool) -> bool {
        let cur = self.claim.load(Ordering::Acquire);
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
        accept: impl Fn(u64) -> bool,
    ) -> Option<[u64; PAYLOAD_WORDS]> {
        let mut tries = 0u32;
        loop {
            let cur = self.claim.load(Ordering::Acquire);
            if !accept(cur) {
                return None;
            }
            let buf = &self.bufs[idx_of(cur)];
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

    /// Writes `words` as the claim matching `accept`: set WRITE, fill the unpublished
    /// buffer, then publish by flipping IDX and clearing WRITE in one CAS that succeeds
    /// only if the claim is unchanged (L2: check and publication are one step).
    #[inline]
    pub(crate) fn write_if(
        &self,
        words: &[u64; PAYLOAD_WORDS],
        n: usize,
        accept: impl Fn(u64) -> bool,
    ) -> bool {
        let mut cur = self.claim.load(Ordering::Acquire);
        let mut waited = WriteWait::new();
        loop {
            if !accept(cur) {
                self.bump(counter::STALE_OP_REJECTED, 1);
                return false;
            }
            if cur & WRITE_BIT != 0 {
                if waited.expired() {
                    // An abandoned write holds WRITE (see `release_from`): refuse.
                    self.bump(counter::STALE_OP_REJECTED, 1);
                    return false;
                }
                waited.pause();
                cur = self.claim.load(Ordering::Acquire);
                continue;
            }
            match self.claim.compare_exchange_weak(
                cur,
                cur | WRITE_BIT,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        self.fill(cur, words, n);
        self.publish(cur, false)
    }

    /// Fills the buffer that `word` does not publish (the caller holds WRITE on `word`).
    #[inline]
    pub(crate) fn fill(&self, word: u64, words: &[u64; PAYLOAD_WORDS], n: usize) {
        let buf = &self.bufs[1 - idx_of(word)];
        let s = buf.seq.load(Ordering::Relaxed);
        let odd = s.wrapping_add(1) | 1;
        // SYNC: payload seqlock (writer side): odd, fence, data, even.
        buf.seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (dst, w) in buf.words.iter().zip(words).take(n) {
            dst.store(*w, Ordering::Relaxed);
        }
        buf.seq.store(odd.wrapping_add(1), Ordering::Release);
    }

    /// Publishes the filled buffer: `word | WRITE` -> flipped IDX, WRITE clear, and with
    /// `release` also vacant. Fails only if the claim was superseded meanwhile.
    #[inline]
    pub(crate) fn publish(&self, word: u64, release: bool) -> bool {
        let word = word & !WRITE_BIT;
        let flipped = (word & !IDX_BIT) | ((word & IDX_BIT) ^ IDX_BIT);
        let next = if release {
            flipped & (GEN_MASK | IDX_BIT)
        } else {
            flipped
        };
        match self.claim.compare_exchange(
            word | WRITE_BIT,
            next,
            Ordering::SeqCst,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                let id = word & ID_MASK;
                if self.torn.load(Ordering::Relaxed) == id {
                    let _ = self
                        .torn
                        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
                    self.bump(counter::TORN_RESTORED, 1);
                }
                if release {
                    self.wake_waiters();
                }
                true
            }
            Err(_) => {
                self.bump(counter::STALE_OP_REJECTED, 1);
                false
            }
        }
    }

    /// Abandons a write (no publication): clears WRITE if the claim is still `word`,
    /// and with `release` also releases the claim.
    pub(crate) fn abort_write(&self, word: u64, release: bool) {
        let word = word & !WRITE_BIT;
        let next = if release {
            word & (GEN_MASK | IDX_BIT)
        } else {
            word
        };
        if self
            .claim
            .compare_exchange(word | WRITE_BIT, next, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
            && release
        {
            self.wake_waiters();
        }
    }

    /// Reads the buffer published by `word` while the caller holds WRITE on `word`
    /// (nobody else writes it then).
    #[inline]
    pub(crate) fn read_published(&self, word: u64) -> [u64; PAYLOAD_WORDS] {
        let buf = &self.bufs[idx_of(word)];
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
        t != 0 && self.claim.load(Ordering::Acquire) & ID_MASK == t
    }
}

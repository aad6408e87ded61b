//! The SeqLock's shared state and its protocol (`docs/seqlock.md`).
//!
//! **Buffers and the published word.** There are [`SLOTS`] writer slots; slot `s` owns the
//! two payload buffers `2s` and `2s + 1` while it is reserved. The published word `pub_word`
//! is `version << 8 | index`: the buffer readers copy, and a version that grows by one
//! with every publication (never wraps in practice: 2^56 publications).
//!
//! **Write (one RMW).** The writer of slot `s` picks the buffer of its two that is not
//! published (only slot `s` ever publishes its buffers, so the other one stays unpublished
//! until this writer publishes it), fills it with plain (relaxed) stores after a Release
//! fence, and publishes with one CAS of `pub_word` (Release). It knows which of its
//! buffers is published without loading `pub_word`: its lane remembers the value it last
//! published or saw (`seen`), and that value is also the CAS's expected value. A failed
//! CAS means another writer published meanwhile; a `write` (a blind store) retries the
//! CAS against the value it has now seen, an `update` reports the conflict. A writer that
//! stalls or dies before its CAS has published nothing: its bytes sit in a buffer no
//! reader is directed to.
//!
//! **Read.** `p1 = pub_word` (Acquire), copy the words of buffer `p1.index`, Acquire fence,
//! `p2 = pub_word`; the copy is returned only if `p1 == p2`, i.e. no publication happened
//! during the copy, so the buffer was published (and so never written) throughout it. A
//! writer that fills a buffer a late reader is still copying did so after publishing or
//! seeing (its `seen`) a `pub_word` newer than the reader's `p1`, and after a Release
//! fence; if the reader saw one of its stores, the fences synchronise and, by coherence,
//! the reader's `p2` is at least that newer value.
//!
//! **Writer slots.** A slot records the identity of the process that reserved it. A slot
//! is released when its handle is dropped; the slot of a process the OS proves dead is
//! reclaimed by the next process that finds no free slot. Each thread of a process writes
//! through its own slot (a per-handle lane per thread), so a slot has one writer at a
//! time with no per-write lock.
//!
//! **Update claim.** `update` (read, modify, publish) first takes the claim word, which
//! serialises updaters so that they do not conflict with each other. A holder whose
//! process is proven dead is replaced at once, one that holds it longer than the stall
//! timeout is superseded; neither can publish over a newer value, because its publication
//! CAS expects the `pub_word` it read.

#[cfg(not(cxc_loom))]
use zerocopy::{FromBytes, KnownLayout};

use cxc_sidecar::{HandshakeHeader, ObservationRing};

use crate::primitive::{AtomicU64, Ordering, fence, spin_hint};

/// Payload words per buffer (48 bytes).
pub(crate) const PAYLOAD_WORDS: usize = 6;
/// Writer slots.
pub(crate) const SLOTS: usize = 32;
/// Payload buffers (two per writer slot).
pub(crate) const BUFS: usize = 2 * SLOTS;
/// The index bits of `pub_word`.
const INDEX_MASK: u64 = 0xFF;
/// `BUFS` is a power of two, so `index & (BUFS - 1)` is always in range (a damaged file
/// never makes a reader index out of bounds).
const _: () = assert!(BUFS.is_power_of_two() && BUFS as u64 <= INDEX_MASK + 1);

/// The holder part of the claim word (`slot + 1`; 0 = free).
const HOLDER_MASK: u64 = 0x7F;
/// Claim-word flag: free because the slot of its last holder, a process that died holding
/// it, was reclaimed; the next claimant is told ([`SeqState::claim_died`]).
pub(crate) const CLAIM_DIED: u64 = 0x80;

/// Slot states (low 2 bits of `WriterSlot::state`; the rest is a version).
const FREE: u64 = 0;
const BUSY: u64 = 1;
const VALID: u64 = 2;
const VERSION_ONE: u64 = 4;

/// Indices into `SeqState::counters` (cumulative, slow paths only).
pub(crate) mod counter {
    /// Writer slots reserved.
    pub(crate) const SLOT_RESERVED: usize = 0;
    /// Writer slots of processes the OS proved dead, reclaimed.
    pub(crate) const SLOT_RECLAIMED: usize = 1;
    /// Writes refused because every writer slot belongs to a live process.
    pub(crate) const NO_WRITER_SLOT: usize = 2;
    /// Update claims taken over from a holder whose process died.
    pub(crate) const CLAIM_DEAD: usize = 3;
    /// Update claims taken over from a holder that held it past the stall timeout.
    pub(crate) const CLAIM_STALLED: usize = 4;
    /// Updates not published because another writer published first.
    pub(crate) const UPDATE_CONFLICT: usize = 5;
    /// Number of counters in use.
    pub(crate) const COUNT: usize = 6;
    /// Names of the counters, by index.
    pub(crate) const NAMES: [&str; COUNT] = [
        "slot_reserved",
        "slot_reclaimed",
        "no_writer_slot",
        "claim_dead_writer",
        "claim_stalled_writer",
        "update_conflict",
    ];
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// One payload buffer: 48 bytes and padding to a cache line.
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C, align(64))]
    pub(crate) struct Buf {
        pub(crate) words: [AtomicU64; PAYLOAD_WORDS],
        _reserved: [AtomicU64; 2],
    }
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// A writer slot: its state word (`version | FREE/BUSY/VALID`) and the identity of the
    /// process that reserved it.
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C, align(64))]
    pub(crate) struct WriterSlot {
        pub(crate) state: AtomicU64,
        pub(crate) ident: [AtomicU64; 4],
        _reserved: [AtomicU64; 3],
    }
}

cxc_mmf::atomic_layout! {
    #![view_if(not(cxc_loom))]
    /// The fixed block of a cell file (offsets in `docs/shared-cell.md`), also the heap state
    /// of a `SeqLock`.
    #[cfg_attr(not(cxc_loom), derive(FromBytes, KnownLayout))]
    #[repr(C, align(64))]
    pub(crate) struct SeqState {
        /// `version << 8 | index` of the published buffer.
        pub(crate) pub_word: AtomicU64,
        _line0: [AtomicU64; 7],
        /// The update claim: `nonce << 8 | (slot + 1)`, slot part 0 = free.
        pub(crate) claim: AtomicU64,
        _line1: [AtomicU64; 7],
        /// Cumulative event counters (see [`counter`]).
        pub(crate) counters: [AtomicU64; 16],
        pub(crate) slots: [WriterSlot; SLOTS],
        pub(crate) bufs: [Buf; BUFS],
        /// Shared strategy header, see `cxc-sidecar`.
        pub(crate) handshake: HandshakeHeader,
        /// Recent transitions, recorded while a `SidecarBox` observes a handle.
        pub(crate) ring: ObservationRing,
        /// Loom models only: writer slots the "OS" reports dead.
        #[cfg(cxc_loom)]
        pub(crate) loom_dead: AtomicU64,
    }
}

#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<Buf>() == 64 && size_of::<WriterSlot>() == 64);
#[cfg(not(cxc_loom))]
const _: () = assert!(align_of::<SeqState>() == 64);
/// The layout documented in `docs/shared-cell.md`: published word and claim lines,
/// counters, slots, buffers, then the sidecar handshake and ring (2688 bytes).
#[cfg(not(cxc_loom))]
const _: () = assert!(size_of::<SeqState>() == 64 + 64 + 128 + 64 * SLOTS + 64 * BUFS + 2688);

/// What the OS says about a slot's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Alive,
    Dead,
}

impl SeqState {
    /// A fresh state for loom models (files and the heap state are zero-initialised,
    /// which is the same state: buffer 0 published, every slot free).
    #[cfg(cxc_loom)]
    pub(crate) fn new() -> Self {
        let z = || AtomicU64::new(0);
        SeqState {
            pub_word: z(),
            _line0: std::array::from_fn(|_| z()),
            claim: z(),
            _line1: std::array::from_fn(|_| z()),
            counters: std::array::from_fn(|_| z()),
            slots: std::array::from_fn(|_| WriterSlot {
                state: z(),
                ident: std::array::from_fn(|_| z()),
                _reserved: std::array::from_fn(|_| z()),
            }),
            bufs: std::array::from_fn(|_| Buf {
                words: std::array::from_fn(|_| z()),
                _reserved: std::array::from_fn(|_| z()),
            }),
            handshake: HandshakeHeader::new(),
            ring: ObservationRing::new(),
            loom_dead: z(),
        }
    }

    pub(crate) fn bump(&self, c: usize) {
        self.counters[c].fetch_add(1, Ordering::Relaxed);
    }

    #[inline(always)]
    fn buf(&self, pub_word: u64) -> &Buf {
        &self.bufs[(pub_word & INDEX_MASK) as usize & (BUFS - 1)]
    }

    /// Stores `words` as the published value of a fresh (all-zero) state: buffer 0.
    pub(crate) fn init(&self, words: &[u64; PAYLOAD_WORDS]) {
        for (dst, w) in self.bufs[0].words.iter().zip(words) {
            dst.store(*w, Ordering::Relaxed);
        }
    }

    /// The published value's first `W` words and the `pub_word` they were published
    /// under. Never waits for a writer; retries only if a publication happened during
    /// the copy.
    #[inline(always)]
    pub(crate) fn read_words<const W: usize>(&self) -> ([u64; W], u64) {
        const { assert!(W <= PAYLOAD_WORDS) };
        loop {
            // SYNC: publication. Pairs with the Release CAS in `publish`.
            let p1 = self.pub_word.load(Ordering::Acquire);
            let buf = self.buf(p1);
            let words: [u64; W] = std::array::from_fn(|i| buf.words[i].load(Ordering::Relaxed));
            // SYNC: pairs with the Release fence in `fill`: if a word was stored by a
            // writer that refills this buffer, the `pub_word` value that writer published
            // or saw (newer than `p1`) happens before the load below.
            fence(Ordering::Acquire);
            if self.pub_word.load(Ordering::Relaxed) == p1 {
                return (words, p1);
            }
            spin_hint();
        }
    }

    /// The buffer of slot `slot` to fill, given `seen`: a `pub_word` value that this
    /// slot's writer published, or saw after its latest publication. Only the writer of
    /// `slot` publishes its buffers, so if `seen` names one of them, that one is the
    /// slot's latest publication and the other is not published; if `seen` names another
    /// slot's buffer, neither is published. The result stays unpublished until this
    /// writer publishes it.
    #[inline(always)]
    pub(crate) fn staging_after(slot: usize, seen: u64) -> usize {
        let a = 2 * slot;
        if (seen & INDEX_MASK) as usize == a {
            a + 1
        } else {
            a
        }
    }

    /// The buffer of slot `slot` that is not published now (see
    /// [`staging_after`](Self::staging_after)), with the `pub_word` seen.
    #[inline]
    pub(crate) fn staging(&self, slot: usize) -> (usize, u64) {
        let p = self.pub_word.load(Ordering::Relaxed);
        (Self::staging_after(slot, p), p)
    }

    /// Fills buffer `b` (a staging buffer of the caller's slot, see [`staging`]).
    #[inline(always)]
    pub(crate) fn fill<const W: usize>(&self, b: usize, words: &[u64; W]) {
        // SYNC: pairs with the Acquire fence in `read_words` (a late reader of `b`).
        fence(Ordering::Release);
        for (dst, w) in self.bufs[b & (BUFS - 1)].words.iter().zip(words) {
            dst.store(*w, Ordering::Relaxed);
        }
    }

    /// Publishes the filled buffer `b` if `pub_word` is still `seen`, returning the value
    /// published. `Err(now)`: another writer published first; nothing was published.
    #[inline(always)]
    pub(crate) fn publish(&self, b: usize, seen: u64) -> Result<u64, u64> {
        let next = ((seen >> 8).wrapping_add(1) << 8) | b as u64;
        // SYNC: publication. Pairs with the Acquire loads in `read_words`.
        self.pub_word
            .compare_exchange(seen, next, Ordering::Release, Ordering::Relaxed)
            .map(|_| next)
    }

    /// Fills and publishes `words` through `slot`: the whole write protocol of a blind
    /// store, one RMW when no other writer published since `seen`. `seen` is a
    /// `pub_word` value that `slot`'s writer published, or saw after its latest
    /// publication (see [`staging_after`](Self::staging_after)); no load of `pub_word`
    /// precedes the CAS, whose expected value is `seen`. Returns the value published.
    #[inline(always)]
    pub(crate) fn write_after<const W: usize>(
        &self,
        slot: usize,
        mut seen: u64,
        words: &[u64; W],
    ) -> u64 {
        let b = Self::staging_after(slot, seen);
        self.fill(b, words);
        loop {
            match self.publish(b, seen) {
                Ok(published) => return published,
                // Another writer published: this store is later than that one (it has
                // now seen it), so it replaces it.
                Err(now) => seen = now,
            }
            spin_hint();
        }
    }

    /// [`write_after`](Self::write_after) from a fresh load of `pub_word` (the models).
    #[cfg(cxc_loom)]
    pub(crate) fn write<const W: usize>(&self, slot: usize, words: &[u64; W]) -> u64 {
        self.write_after(slot, self.pub_word.load(Ordering::Relaxed), words)
    }

    // ---- writer slots ----

    /// Reserves a free slot for the process `ident`, or reclaims the slot of a process
    /// that `judge` proves dead. `None` if every slot belongs to a live process.
    pub(crate) fn reserve(
        &self,
        ident: [u64; 4],
        judge: impl Fn(&Self, usize) -> Verdict,
    ) -> Option<usize> {
        for pass in 0..2 {
            for (i, slot) in self.slots.iter().enumerate() {
                let s = slot.state.load(Ordering::Acquire);
                let take = match s & 3 {
                    FREE => true,
                    VALID if pass == 1 => judge(self, i) == Verdict::Dead,
                    _ => false,
                };
                if take
                    && slot
                        .state
                        .compare_exchange(
                            s,
                            (s & !3).wrapping_add(VERSION_ONE) | BUSY,
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    if s & 3 == VALID {
                        self.bump(counter::SLOT_RECLAIMED);
                        self.free_claim_of_dead(i);
                    }
                    for (dst, w) in slot.ident.iter().zip(ident) {
                        dst.store(w, Ordering::Relaxed);
                    }
                    // SYNC: slot identity. Pairs with the Acquire load in `slot_ident`.
                    slot.state.store(
                        (s & !3).wrapping_add(VERSION_ONE) | VALID,
                        Ordering::Release,
                    );
                    self.bump(counter::SLOT_RESERVED);
                    return Some(i);
                }
            }
        }
        self.bump(counter::NO_WRITER_SLOT);
        None
    }

    /// Frees a slot this process reserved (its handle is dropped).
    pub(crate) fn release_slot(&self, i: usize) {
        let slot = &self.slots[i];
        let s = slot.state.load(Ordering::Acquire);
        if s & 3 == VALID {
            // Fails only if the slot was reclaimed meanwhile, which needs this process
            // proven dead: then there is nothing to free.
            let _ = slot.state.compare_exchange(
                s,
                (s & !3).wrapping_add(VERSION_ONE),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// The identity recorded in a valid slot.
    pub(crate) fn slot_ident(&self, i: usize) -> Option<[u64; 4]> {
        let slot = &self.slots[i];
        let s = slot.state.load(Ordering::Acquire);
        if s & 3 != VALID {
            return None;
        }
        let id = std::array::from_fn(|k| slot.ident[k].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (slot.state.load(Ordering::Relaxed) == s).then_some(id)
    }

    // ---- update claim ----

    /// The process that reserved slot `i` was proven dead and the slot is being reclaimed
    /// (BUSY, so no claim can name it anew): if it died holding the update claim, free the
    /// claim with the [`CLAIM_DIED`] flag, before the slot (and so the identity waiters
    /// judge the holder by) goes to a live process.
    fn free_claim_of_dead(&self, i: usize) {
        let c = self.claim.load(Ordering::Acquire);
        if Self::claim_holder(c) == Some(i) {
            // Fails only if a waiter took the claim over meanwhile.
            let _ = self.claim.compare_exchange(
                c,
                (c & !INDEX_MASK) | CLAIM_DIED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Whether the free claim word `c` was left by a holder that died holding it.
    pub(crate) fn claim_died(c: u64) -> bool {
        c & CLAIM_DIED != 0
    }

    /// Tries to take the update claim for `slot` if it is `cur` (free, or a holder being
    /// superseded). Returns the claim word installed.
    pub(crate) fn try_claim(&self, cur: u64, slot: usize) -> Option<u64> {
        let mine = ((cur >> 8).wrapping_add(1) << 8) | (slot as u64 + 1);
        self.claim
            .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| mine)
    }

    /// Gives the update claim back (if it is still `mine`).
    pub(crate) fn release_claim(&self, mine: u64) {
        let _ = self.claim.compare_exchange(
            mine,
            mine & !INDEX_MASK,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// The claim word.
    pub(crate) fn claim_word(&self) -> u64 {
        self.claim.load(Ordering::Acquire)
    }

    /// The slot holding the claim word `c`, if any.
    pub(crate) fn claim_holder(c: u64) -> Option<usize> {
        match (c & HOLDER_MASK) as usize {
            0 => None,
            h => Some((h - 1) % SLOTS),
        }
    }
}

#[cfg(all(test, not(cxc_loom)))]
mod tests {
    use super::*;

    fn zeroed() -> Box<SeqState> {
        let layout = std::alloc::Layout::new::<SeqState>();
        // SAFETY: `SeqState` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<SeqState>();
        assert!(!p.is_null());
        // SAFETY: allocated with `SeqState`'s layout by the global allocator, zeroed;
        // `SeqState` is made of atomics, valid at all zeros.
        unsafe { Box::from_raw(p) }
    }

    /// A slot reclaimed from a process that died holding the update claim frees the claim
    /// with the died flag, so the next updater neither waits for the slot's new (live)
    /// owner nor misses the news.
    #[test]
    fn reclaiming_a_dead_holders_slot_frees_its_claim() {
        let s = zeroed();
        let alive = |_: &SeqState, _: usize| Verdict::Alive;
        let dead0 = |_: &SeqState, i: usize| {
            if i == 0 {
                Verdict::Dead
            } else {
                Verdict::Alive
            }
        };
        assert_eq!(s.reserve([1, 1, 1, 1], alive), Some(0));
        let c = s.claim_word();
        let mine = s.try_claim(c, 0).unwrap();
        assert_eq!(SeqState::claim_holder(s.claim_word()), Some(0));
        for _ in 1..SLOTS {
            assert!(s.reserve([2, 1, 1, 2], alive).is_some());
        }
        assert_eq!(
            s.reserve([3, 1, 1, 3], alive),
            None,
            "no free slot, none dead"
        );
        assert_eq!(s.reserve([3, 1, 1, 3], dead0), Some(0));
        let c = s.claim_word();
        assert_eq!(SeqState::claim_holder(c), None);
        assert!(SeqState::claim_died(c));
        // The dead holder's stale release changes nothing.
        s.release_claim(mine);
        assert_eq!(s.claim_word(), c);
        let m = s.try_claim(c, 0).unwrap();
        assert!(!SeqState::claim_died(m));
    }
}

//! The protocol: per-process read counts, one state word for the writer, staging buffers
//! and quarantine for the payload.
//!
//! - **Read lock**: `readers[me] += 1` (an RMW on this process's own slot), then look at
//!   the state word; no writer: held. A writer: `readers[me] -= 1` (waking a draining
//!   writer), wait for the writer to leave, retry.
//! - **Write lock**: one CAS on the state word installs the writer (new token, a free
//!   staging buffer); from then on new readers back off (*writer preference*). The writer
//!   then waits until every slot's read count is 0 ("drain").
//! - Exclusion is a Dekker handshake between `readers[i]` and the state word: each side
//!   writes its own location, then reads the other's, all `SeqCst`, so in the single
//!   total order of `SeqCst` operations one of them sees the other. (Under loom, which
//!   does not model that total order, both reads are RMWs, which makes the same
//!   argument go through with acquire/release only: see [`peek`].)
//! - **Payload**: the writer fills its staging buffer and publishes it with one CAS that
//!   succeeds only while its claim (writer + token) is current; an evicted writer's
//!   staging buffer is quarantined until that writer finds out (its next operation) or
//!   dies, so none of its bytes is ever published (the lease's L7 scheme).

use super::layout::{PAYLOAD_WORDS, RwHead, RwSlot, ctr};
use super::word::{BufferFields, Word};
use crate::park;
use crate::primitive::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(cxc_loom)]
use crate::park::ModelFutex;
#[cfg(cxc_loom)]
use crate::semaphore::model::CrashPlan;

/// A `SeqCst` read of the other side's word in the Dekker handshake. Outside loom a
/// `SeqCst` load (all operations of the handshake are `SeqCst`, so they are totally
/// ordered); under loom an RMW adding 0, which orders the read after every earlier RMW
/// of the word by acquire/release alone (loom does not model the `SeqCst` total order).
#[inline(always)]
pub(crate) fn peek(a: &AtomicU64) -> u64 {
    #[cfg(cxc_loom)]
    {
        a.fetch_add(0, Ordering::SeqCst)
    }
    #[cfg(not(cxc_loom))]
    {
        a.load(Ordering::SeqCst)
    }
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteRefused {
    /// The claim was evicted.
    Lost,
    /// Every buffer is published or quarantined (for live, evicted writers).
    NoBuffer,
}

/// A view of one lock's state (in a mapped file, or on the heap in loom models).
pub(crate) struct RawRwLock<'a> {
    pub(crate) head: &'a RwHead,
    pub(crate) slots: &'a [RwSlot],
    /// Loom only: where this "process" dies.
    #[cfg(cxc_loom)]
    pub(crate) crash: Option<&'a CrashPlan>,
    /// Loom only: faithful futex stand-ins for `rwake`, `wwake`, `dwake` (one each, so
    /// a wake-up on one word never reaches a sleeper on another), so a lost wake-up shows
    /// as a deadlock.
    #[cfg(cxc_loom)]
    pub(crate) futex: Option<&'a [ModelFutex; 3]>,
}

impl RawRwLock<'_> {
    /// The state word now.
    #[inline]
    pub(crate) fn word(&self) -> Word {
        // SYNC: state (Acquire; pairs with every writer transition's SeqCst CAS).
        Word(self.head.state.load(Ordering::Acquire))
    }

    // ---- readers -------------------------------------------------------------------

    /// Takes a read hold for slot `me` if no writer holds or waits. On `false` nothing
    /// is held.
    #[inline]
    pub(crate) fn try_read(&self, me: usize) -> bool {
        let Some(slot) = self.slots.get(me) else {
            return false;
        };
        // SYNC: Dekker (reader side): count first, then look for a writer.
        slot.readers.fetch_add(1, Ordering::SeqCst);
        if self.crash_here() {
            return false;
        }
        if Word(peek(&self.head.state)).writer().is_none() {
            return true;
        }
        self.read_unlock(me);
        false
    }

    /// Drops one read hold of slot `me` and wakes a writer waiting for readers.
    #[inline]
    pub(crate) fn read_unlock(&self, me: usize) {
        let Some(slot) = self.slots.get(me) else {
            return;
        };
        // SYNC: park (the waker's RMW on the word the draining writer re-checks).
        slot.readers.fetch_sub(1, Ordering::SeqCst);
        if self.crash_here() {
            return;
        }
        if park::has_sleepers(&self.head.dwake) {
            self.wake(&self.head.dwake, u32::MAX);
        }
    }

    /// A blocked reader's round: announce, re-check the state word with an RMW. `None`:
    /// no writer now (retry the lock); `Some(v)`: sleep on `rwake` while it equals `v`.
    pub(crate) fn reader_park(&self) -> Option<u32> {
        let seen = park::announce(&self.head.rwake);
        // SYNC: park (RMW re-check; pairs with the writer's CAS that clears WRITER).
        let w = Word(self.head.state.fetch_add(0, Ordering::SeqCst));
        w.writer().map(|_| seen)
    }

    // ---- writers -------------------------------------------------------------------

    /// Installs slot `me` as the writer if there is none: the next token, a free staging
    /// buffer. New readers back off from here on; the caller must then drain.
    #[inline]
    pub(crate) fn try_claim(&self, me: usize) -> Option<Word> {
        if me >= self.slots.len() {
            return None;
        }
        let mut w = self.word();
        loop {
            if w.writer().is_some() {
                return None;
            }
            let next = w.claimed(me, w.free_buffer());
            // SYNC: Dekker (writer side) and state: the claim, then the read counts.
            match self
                .head
                .state
                .compare_exchange(w.0, next.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    // No `beat` here: the new token already shows progress to waiters.
                    // A crash here leaves a claim that drains nothing: evicted as dead.
                    let _ = self.crash_here();
                    return Some(next);
                }
                Err(now) => w = Word(now),
            }
        }
    }

    /// A blocked writer's round while another writer holds: announce, re-check with an
    /// RMW. `None`: no writer now (retry the claim); `Some(v)`: sleep on `wwake`.
    pub(crate) fn writer_park(&self) -> Option<u32> {
        let seen = park::announce(&self.head.wwake);
        // SYNC: park (RMW re-check; pairs with the CAS that clears WRITER).
        let w = Word(self.head.state.fetch_add(0, Ordering::SeqCst));
        w.writer().map(|_| seen)
    }

    /// The first slot that still has read holds, if any (the writer's drain check).
    #[inline]
    pub(crate) fn reader_left(&self) -> Option<usize> {
        let hwm = usize::try_from(peek(&self.head.hwm))
            .unwrap_or(usize::MAX)
            .min(self.slots.len());
        // SYNC: Dekker (writer side): after the claim CAS, read every count.
        (0..hwm).find(|&i| self.slots.get(i).is_some_and(|s| peek(&s.readers) != 0))
    }

    /// The draining writer's round for slot `i`: announce, re-check its count with an
    /// RMW. `None`: the slot is empty now; `Some(v)`: sleep on `dwake`.
    pub(crate) fn drain_park(&self, i: usize) -> Option<u32> {
        let slot = self.slots.get(i)?;
        let seen = park::announce(&self.head.dwake);
        // SYNC: park (RMW re-check; pairs with the reader's `fetch_sub`).
        (slot.readers.fetch_add(0, Ordering::SeqCst) != 0).then_some(seen)
    }

    /// Whether the claim `claim` (writer + token) is still current.
    #[inline]
    pub(crate) fn is_current(&self, claim: Word) -> bool {
        self.word().id() == claim.id()
    }

    /// Copies the whole published buffer (the loom models' payloads use every word).
    #[cfg(cxc_loom)]
    pub(crate) fn copy_published(&self, w: Word) -> [u64; PAYLOAD_WORDS] {
        self.copy_published_n(w, PAYLOAD_WORDS)
    }

    /// Copies the first `n` words of the published buffer, the words a payload uses (the
    /// rest of the result is 0).
    #[inline]
    pub(crate) fn copy_published_n(&self, w: Word, n: usize) -> [u64; PAYLOAD_WORDS] {
        let mut out = [0u64; PAYLOAD_WORDS];
        if let Some(buf) = self.head.bufs.get(w.published()) {
            for (o, src) in out.iter_mut().zip(buf).take(n) {
                *o = src.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// A writer's read of the published payload: `None` if its claim was evicted (the
    /// copy may then be torn). Validated seqlock-style: loads, `fence(Acquire)`, a check of
    /// the claim (pairs with the `fence(Release)` in [`RawRwLock::fill_n`] of a later writer).
    /// Copies the first `n` words.
    pub(crate) fn read_as_writer(&self, claim: Word, n: usize) -> Option<[u64; PAYLOAD_WORDS]> {
        let w = self.word();
        if w.id() != claim.id() {
            return None;
        }
        let out = self.copy_published_n(w, n);
        // SYNC: writer read (Acquire fence; pairs with the Release fence in `fill_n`).
        fence(Ordering::Acquire);
        self.is_current(claim).then_some(out)
    }

    /// Gives `claim` a staging buffer if it has none. `Err(NoBuffer)` if every buffer is
    /// published or quarantined (the caller may reap and retry).
    pub(crate) fn stage_for(&self, claim: Word) -> Result<Word, WriteRefused> {
        let mut cur = self.word();
        loop {
            if cur.id() != claim.id() {
                return Err(WriteRefused::Lost);
            }
            if cur.stage().is_some() {
                return Ok(cur);
            }
            let Some(b) = cur.free_buffer() else {
                return Err(WriteRefused::NoBuffer);
            };
            match self.head.state.compare_exchange(
                cur.0,
                cur.with_stage(Some(b)).0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(cur.with_stage(Some(b))),
                Err(now) => cur = Word(now),
            }
        }
    }

    /// Fills the whole staging buffer of `claim` (which must have one) with `words` (the
    /// loom models' payloads use every word).
    #[cfg(cxc_loom)]
    pub(crate) fn fill(&self, claim: Word, words: &[u64; PAYLOAD_WORDS]) {
        self.fill_n(claim, words, PAYLOAD_WORDS);
    }

    /// Fills the first `n` words of the staging buffer of `claim` (the words a payload
    /// uses; the others are never read for it).
    #[inline]
    pub(crate) fn fill_n(&self, claim: Word, words: &[u64; PAYLOAD_WORDS], n: usize) {
        let Some(buf) = claim.stage().and_then(|s| self.head.bufs.get(s)) else {
            return;
        };
        // SYNC: writer read (Release fence: a stale writer whose validated read saw one
        // of these stores also sees the claim CAS that preceded them).
        fence(Ordering::Release);
        for (dst, w) in buf.iter().zip(words).take(n) {
            dst.store(*w, Ordering::Relaxed);
        }
    }

    /// Publishes the filled staging buffer of `claim`: one CAS that succeeds only while
    /// the claim is current. Returns the new word, or `Err(Lost)` (then this writer's
    /// quarantined buffer is freed: it stores nothing more into it).
    pub(crate) fn publish(&self, claim: Word) -> Result<Word, WriteRefused> {
        let mut cur = claim;
        loop {
            let next = cur.published_swap();
            // SYNC: state (Release publishes the buffer to readers and later writers).
            match self.head.state.compare_exchange(
                cur.0,
                next.0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.head.beat.fetch_add(1, Ordering::Relaxed);
                    return Ok(next);
                }
                Err(now) if Word(now).sans_quarantine() == claim.sans_quarantine() => {
                    cur = Word(now);
                }
                Err(_) => {
                    self.bump(ctr::STALE_REJECTED);
                    self.free_own_quarantine(claim);
                    return Err(WriteRefused::Lost);
                }
            }
        }
    }

    /// Releases the write lock of `claim` and wakes waiters. `false` if the claim had
    /// been evicted (then its quarantined buffer is freed).
    #[inline]
    pub(crate) fn write_unlock(&self, claim: Word) -> bool {
        let mut cur = claim;
        loop {
            // SYNC: state (Release: the writer's section happens before the next lock).
            match self.head.state.compare_exchange(
                cur.0,
                cur.vacated().0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) if Word(now).sans_quarantine() == claim.sans_quarantine() => {
                    cur = Word(now);
                }
                Err(_) => {
                    self.bump(ctr::STALE_REJECTED);
                    self.free_own_quarantine(claim);
                    return false;
                }
            }
            if self.crash_here() {
                return false;
            }
        }
        if self.crash_here() {
            return true;
        }
        self.wake_after_writer();
        true
    }

    /// After the writer left: wake every blocked reader and one blocked writer.
    #[inline]
    pub(crate) fn wake_after_writer(&self) {
        if park::has_sleepers(&self.head.rwake) {
            self.wake(&self.head.rwake, u32::MAX);
        }
        if park::has_sleepers(&self.head.wwake) {
            self.wake(&self.head.wwake, 1);
        }
    }

    /// Wakes up to `n` sleepers of `word` (the model futex under loom).
    pub(crate) fn wake(&self, word: &AtomicU32, n: u32) {
        #[cfg(cxc_loom)]
        let model = self.model_futex(word).map(park::ModelFutexRef);
        #[cfg(not(cxc_loom))]
        let model: Option<park::ModelFutexRef<'_>> = None;
        park::wake(word, n, model.as_ref());
    }

    /// Loom only: the model futex of wake word `word`.
    #[cfg(cxc_loom)]
    pub(crate) fn model_futex(&self, word: &AtomicU32) -> Option<&ModelFutex> {
        let f = self.futex?;
        let i = [&self.head.rwake, &self.head.wwake, &self.head.dwake]
            .iter()
            .position(|w| std::ptr::eq(*w, word))?;
        f.get(i)
    }

    /// Adds one to a counter (slow paths only).
    #[inline]
    pub(crate) fn bump(&self, index: usize) {
        if let Some(c) = self.head.counters.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    crate::macros::crash_points!();
}

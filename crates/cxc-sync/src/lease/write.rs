//! The write side of the lease protocol: WRITE, staging buffers, publication, and the
//! quarantine of abandoned writes (see `state.rs` and `docs/owner-lease.md`, L2/L4/L7).

use crate::liveness::Liveness;
use crate::primitive::{Ordering, fence, spin_hint};

use super::state::*;
use super::word::BufferFields;
use super::word::{BUFS, Word};

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

/// How long a writer that finds no free buffer waits, at most, for the processes of
/// quarantined writers that their sentinel says are exiting to be gone (`reap_quarantine`).
#[cfg(not(cxc_loom))]
const EXITING_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

impl LeaseState {
    /// Writes `words` as the claim matching `accept`: start (WRITE), fill the staging
    /// buffer, publish (one CAS that succeeds only if the claim is unchanged: L2). The
    /// handle's writes take the same steps (`OwnerLease::write_held`); the loom models
    /// call this.
    #[cfg(cxc_loom)]
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
    /// quarantines its staging buffer). The caller is the claim's only writer, and `last`
    /// is the word it last installed or saw as current: while the claim is current its
    /// staging buffer is the one `last` names (only this writer gives it one), so the
    /// write goes from `last` without loading the word; the publishing CAS proves the
    /// claim current (a change of the quarantine bits alone is retried, see `end_write`).
    #[inline]
    pub(crate) fn write_private(
        &self,
        last: Word,
        words: &[u64; PAYLOAD_WORDS],
        n: usize,
    ) -> Result<Word, WriteRefused> {
        if !last.is_vacant() && last.stage().is_some() {
            self.fill(last, words, n);
            return self.publish_word(last, false).ok_or(WriteRefused::Lost);
        }
        self.write_private_staged(last.id(), words, n)
    }

    /// [`write_private`](Self::write_private) for a claim that has no staging buffer yet.
    #[cold]
    fn write_private_staged(
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
        self.publish_word(cur, false).ok_or(WriteRefused::Lost)
    }

    /// Gives the (private) claim `id` a staging buffer: a free one, after reaping the
    /// quarantined buffers of dead writers if none is free.
    #[cold]
    pub(crate) fn stage_for(&self, id: u64) -> Result<Word, WriteRefused> {
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
    /// claim was still current, as the vacant word installed. `last` is also the guess the
    /// release's CAS starts from.
    #[inline]
    pub(crate) fn release_private(&self, last: Word) -> Option<Word> {
        if let Some(vacated) = self.release_from(last.id(), last, true) {
            return Some(vacated);
        }
        let cur = self.word();
        if cur.id() != last.id() {
            // Our claim went while we were not writing: the stage of the word a taker
            // superseded is the last one we knew (our publications keep `last` current).
            self.free_own_quarantine(last);
        }
        None
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

    /// [`start_write`](Self::start_write) from the claim word `word` without loading it
    /// first: sets WRITE if the word is exactly `word` (a claim with a staging buffer and
    /// no write in flight). `None` if it is not (the caller then takes the full path).
    #[inline(always)]
    pub(crate) fn start_write_exact(&self, word: Word) -> Option<Word> {
        debug_assert!(!word.is_vacant() && !word.may_be_writing() && word.stage().is_some());
        let next = word.with_write(true);
        self.claim
            .compare_exchange(word.0, next.0, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| next)
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
    #[cfg(cxc_loom)]
    pub(crate) fn publish(&self, word: Word, release: bool) -> bool {
        self.publish_word(word, release).is_some()
    }

    /// [`publish`](Self::publish), returning the claim word it installed.
    #[inline]
    pub(crate) fn publish_word(&self, word: Word, release: bool) -> Option<Word> {
        let Some(next) = self.end_write(word, |c| {
            let swapped = c.published_swap();
            if release { swapped.vacated() } else { swapped }
        }) else {
            self.bump(counter::STALE_OP_REJECTED, 1);
            return None;
        };
        let id = word.id();
        if self.torn.load(Ordering::Relaxed) == id {
            let _ = self
                .torn
                .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
            self.bump(counter::TORN_RESTORED, 1);
        }
        if release {
            self.wake_waiters();
        }
        Some(next)
    }

    /// Abandons a write (no publication): clears WRITE if the claim is still `word`, and
    /// with `release` also releases the claim. If the claim was superseded meanwhile,
    /// frees this writer's quarantined buffer.
    pub(crate) fn abort_write(&self, word: Word, release: bool) {
        if release {
            // As any release: an inherited, never rewritten interruption goes on to the
            // next claim.
            self.pass_torn_on(word);
        }
        let ended = self.end_write(word, |c| {
            if release {
                c.vacated()
            } else {
                c.with_write(false)
            }
        });
        if ended.is_some() && release {
            self.wake_waiters();
        }
    }

    /// Ends a write of the claim `word`: installs `finish(cur)` while the claim word is
    /// `word` up to its quarantine bits (another writer may free its buffer meanwhile) and
    /// returns it. `None` if the claim was superseded or released meanwhile: then this
    /// writer's quarantined buffer is freed (it will store nothing more into it).
    #[inline(always)]
    fn end_write(&self, word: Word, finish: impl Fn(Word) -> Word) -> Option<Word> {
        let mut cur = word;
        loop {
            let next = finish(cur);
            match self
                .claim
                .compare_exchange(cur.0, next.0, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => return Some(next),
                Err(actual) if Word(actual).sans_quarantine() == word.sans_quarantine() => {
                    cur = Word(actual);
                }
                Err(_) => {
                    self.free_own_quarantine(word);
                    return None;
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
        self.unquarantine(s, self.word(), ours, counter::QUARANTINE_FREED);
    }

    /// Frees every quarantined buffer whose writer's process the OS proves gone. A writer
    /// whose process its sentinel says is exiting (a takeover quarantined its buffer
    /// because its threads might still run) is waited for, up to [`EXITING_WAIT`] for the
    /// whole call: it is normally gone within a millisecond, and without it a holder that
    /// took over from a run of killed writers would find no buffer.
    #[cold]
    pub(crate) fn reap_quarantine(&self) {
        #[cfg(not(cxc_loom))]
        let started = std::time::Instant::now();
        let mut cur = self.word();
        for b in 0..BUFS {
            if !cur.is_quarantined(b) {
                continue;
            }
            let tag = self.qowner[b].load(Ordering::Acquire);
            let holder = (tag & 0xFF) as u8;
            #[cfg_attr(cxc_loom, allow(unused_mut))] // only the wait below changes it
            let mut gone = self.slot_liveness(holder) == Liveness::Dead;
            #[cfg(not(cxc_loom))]
            while !gone && self.slot_exiting(holder) && started.elapsed() < EXITING_WAIT {
                std::thread::sleep(std::time::Duration::from_micros(100));
                gone = self.slot_liveness(holder) == Liveness::Dead;
            }
            if !gone {
                continue;
            }
            cur = self.unquarantine(b, cur, |t| t == tag, counter::QUARANTINE_REAPED);
        }
    }

    /// Clears buffer `b`'s Q bit, starting from the claim word `cur`, while the bit is set
    /// and `holds` accepts its quarantine record; counts `freed` if it cleared it. Returns
    /// the claim word as last seen (reloaded after clearing).
    fn unquarantine(
        &self,
        b: usize,
        mut cur: Word,
        holds: impl Fn(u64) -> bool,
        freed: usize,
    ) -> Word {
        loop {
            if !cur.is_quarantined(b) || !holds(self.qowner[b].load(Ordering::Acquire)) {
                return cur;
            }
            match self.claim.compare_exchange(
                cur.0,
                cur.without_quarantined(b).0,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.bump(freed, 1);
                    return self.word();
                }
                Err(actual) => cur = Word(actual),
            }
        }
    }
}

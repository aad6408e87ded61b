//! What the async reactor needs of a rwlock (feature `async`): its wake words, the
//! claim/drain steps of a writer split so a future can wait between them, and the
//! reactor checks (non-generic closures over a monomorphized function pointer, so `T`
//! need not be `'static`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::guards::WriteGuard;
use super::handle::SharedRwLock;
use super::layout::ctr;
use super::wait::{CHECK_EVERY, Watch};
use super::word::Word;
use crate::asyncs::reactor::{Check, Next};

/// A write claim installed by an async writer that still waits for readers to leave
/// (new readers already back off).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim(Word);

impl Claim {
    /// The claim's identity (writer and token), a reactor group tag.
    pub(crate) fn tag(self) -> u64 {
        self.0.id()
    }
}

/// Where a claiming async writer stands.
pub(crate) enum Drained<'a, T> {
    /// Every reader left: the write lock is held.
    Held(WriteGuard<'a, T>),
    /// Readers are still inside.
    Waiting,
    /// The claim was evicted while waiting (e.g. the future was not polled for the
    /// grace); claim again.
    Lost,
}

/// A check for a waiter that needs the writer gone: re-reads the state word with an RMW
/// (the parking protocol's re-check; the reactor announced on the wake word first), and
/// evicts a dead or stalled writer (`Watch`).
fn writer_gone<T>(handle: usize, watch: &mut Watch) -> bool {
    // SAFETY: every waiter of the group this check belongs to borrows the handle at
    // `handle` (the group's key is the address of a wake word inside its mapping), and
    // the reactor calls checks only while the group has waiters (`asyncs/reactor.rs`).
    let lock = unsafe { &*(handle as *const SharedRwLock<T>) };
    let now = Instant::now();
    if !lock.has_slot() {
        // Without a holder slot (a forked child that found the table full) nothing can be
        // taken, writer or not: look for a slot with the periodic checks (which reclaim
        // dead holders), as the blocking path does, instead of waking the waiter in a loop.
        if !watch.due(now) {
            return false;
        }
        let freed = watch.check(lock, now);
        return lock.try_register() || (freed && lock.has_slot());
    }
    // SYNC: park (RMW re-check; pairs with the CAS that clears WRITER).
    let w = Word(lock.raw().head.state.fetch_add(0, Ordering::SeqCst));
    w.writer().is_none() || watch.check(lock, now)
}

/// The draining writer's check: its claim is gone, or every read count is 0 (RMW
/// re-checks, paired with the readers' `fetch_sub`). Beats and reclaims dead readers
/// every [`CHECK_EVERY`], as the blocking drain does.
fn readers_gone<T>(handle: usize, claim: u64, next: &mut Instant) -> bool {
    // SAFETY: as in `writer_gone`.
    let lock = unsafe { &*(handle as *const SharedRwLock<T>) };
    let raw = lock.raw();
    if !raw.is_current(Word(claim)) {
        return true;
    }
    let now = Instant::now();
    if now >= *next {
        *next = now + CHECK_EVERY;
        raw.head.beat.fetch_add(1, Ordering::Relaxed);
        if lock.reclaim_dead() > 0 {
            return true;
        }
    }
    let hwm = usize::try_from(raw.head.hwm.load(Ordering::SeqCst))
        .unwrap_or(usize::MAX)
        .min(raw.slots.len());
    // SYNC: park (RMW re-check of every count below `hwm`).
    raw.slots[..hwm]
        .iter()
        .all(|s| s.readers.fetch_add(0, Ordering::SeqCst) == 0)
}

/// Non-generic, so the closure holds no type parameter and is `'static`.
fn waiting_check(handle: usize, f: fn(usize, &mut Watch) -> bool) -> Check {
    let mut watch = Watch::new();
    // The writer's death and stall are found by the periodic checks of `Watch`: every tick.
    Box::new(move || Next::ticking(f(handle, &mut watch)))
}

fn draining_check(handle: usize, claim: u64, f: fn(usize, u64, &mut Instant) -> bool) -> Check {
    let mut next = Instant::now() + CHECK_EVERY;
    Box::new(move || Next::ticking(f(handle, claim, &mut next)))
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SharedRwLock<T> {
    /// Addresses of the wake words of blocked readers, blocked writers, and the
    /// draining writer.
    pub(crate) fn async_words(&self) -> [usize; 3] {
        let h = self.map.head();
        [&h.rwake, &h.wwake, &h.dwake].map(|w| std::ptr::from_ref(w) as usize)
    }

    /// Installs this process as the writer if there is none (new readers back off from
    /// here on); then call [`drained`](Self::drained).
    pub(crate) fn claim_async(&self) -> Option<Claim> {
        let slot = self.holder()?;
        self.raw().try_claim(slot).map(Claim)
    }

    /// Whether the readers of `claim` have left.
    pub(crate) fn drained(&self, claim: Claim) -> Drained<'_, T> {
        let raw = self.raw();
        if !raw.is_current(claim.0) {
            raw.free_own_quarantine(claim.0);
            return Drained::Lost;
        }
        if raw.reader_left().is_none() {
            return Drained::Held(self.write_guard(claim.0));
        }
        Drained::Waiting
    }

    /// Gives up a claim that never got its guard (the future was dropped).
    pub(crate) fn abandon(&self, claim: Claim) {
        self.raw().write_unlock(claim.0);
    }

    /// Counts a contended async lock (once per future).
    pub(crate) fn count_contended(&self, write: bool) {
        self.raw().bump(if write {
            ctr::WRITE_CONTENDED
        } else {
            ctr::READ_CONTENDED
        });
    }

    /// The check of the groups waiting for the writer to leave (readers, and writers
    /// before their claim).
    pub(crate) fn writer_gone_check(&self) -> Check {
        waiting_check(std::ptr::from_ref(self) as usize, writer_gone::<T>)
    }

    /// The check of the group of the writer draining `claim`.
    pub(crate) fn drain_check(&self, claim: Claim) -> Check {
        draining_check(
            std::ptr::from_ref(self) as usize,
            claim.0.0,
            readers_gone::<T>,
        )
    }
}

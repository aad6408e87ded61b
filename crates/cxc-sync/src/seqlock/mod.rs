//! [`SeqLock<T>`]: a sequence lock whose readers never block and never see a torn value,
//! and whose writers survive each other's stalls and deaths; [`SharedCell<T>`]: the same
//! in a file of its own (`docs/seqlock.md`, `docs/shared-cell.md`).

mod cell;

use std::marker::PhantomData;
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::time::Duration;

use cxc_mmf::identity::{Identity, current_pid};
use cxc_mmf::{Mapped, MmfError};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::lease::{LeaseState, PAYLOAD_BYTES, PAYLOAD_WORDS, Patience, Took, Word, WriteRefused};
use crate::primitive::Ordering;

pub use cell::SharedCell;

/// How long a writer waits for another writer that holds the lock before it takes it
/// for stalled (and supersedes it, never publishing its bytes), by default.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_millis(10);

/// Why a `SeqLock` or `SharedCell` could not be made or opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeqLockError {
    /// `T` is larger than a payload buffer.
    #[error("payload type is {found} bytes; at most {max} fit")]
    PayloadTooLarge {
        /// The maximum size in bytes.
        max: usize,
        /// The size of `T`.
        found: usize,
    },
    /// `T` needs a larger alignment than a payload buffer has.
    #[error("payload type needs alignment {found}; at most {max} is supported")]
    PayloadAlign {
        /// The maximum alignment.
        max: usize,
        /// The alignment of `T`.
        found: usize,
    },
    /// The file could not be created, opened or validated.
    #[error(transparent)]
    File(#[from] MmfError),
}

/// Why a write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// This process could not get a writer slot: all 64 identity slots belong to live
    /// processes.
    #[error("no writer slot: the identity table is full of live processes")]
    NoWriterSlot,
    /// Every payload buffer is published or in quarantine for stalled writers (six at
    /// most); a write succeeds again once one of them resumes or dies.
    #[error("no payload buffer is free: six stalled writers hold them")]
    NoBuffer,
    /// This `update` was taken for stalled (it held the lock longer than the other
    /// writers' stall timeout) and superseded: its result was not published.
    #[error("the update was superseded as stalled; its result was not published")]
    Superseded,
}

/// What the writer before this one left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Abandoned {
    /// Its process died mid-write (the OS proved it): its value was never published.
    Died,
    /// It held the lock longer than the stall timeout (stopped, hung, or a slow `update`
    /// closure): it was superseded and its value will never be published.
    Stalled,
}

/// The outcome of a successful write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    /// `Some` if this write took the lock from a writer that died or stalled mid-write
    /// (as a robust mutex's `EOWNERDEAD`): that writer's update is lost, so a value that
    /// depends on it may need restoring.
    pub abandoned: Option<Abandoned>,
}

enum Store {
    Heap(Box<LeaseState>),
    File(Mapped<LeaseState>),
}

/// A sequence lock holding a `T` of at most 48 bytes, on the heap ([`SeqLock::new`]) or
/// in a mapped file ([`SharedCell`]).
///
/// - [`read`](Self::read) never blocks and never returns a torn value: it copies the
///   published buffer, which no writer writes into.
/// - [`write`](Self::write) and [`update`](Self::update) are serialised by a CAS on the
///   claim word; a writer fills a staging buffer and publishes and releases it in one
///   CAS, so a writer that stalls or dies mid-write never exposes its bytes.
/// - A writer that died mid-write is replaced at once (the OS proves it dead); one that
///   holds the lock longer than the stall timeout is superseded. The next writer is told
///   ([`Written::abandoned`]).
///
/// It is built on the owner lease's state and protocol (`docs/seqlock.md`).
///
/// # Examples
/// ```
/// use cxc_sync::SeqLock;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let lock = SeqLock::new([1u64, 2, 3])?;
/// lock.write([4, 5, 6])?;
/// lock.update(|v| v[0] += 10)?;
/// assert_eq!(lock.read(), [14, 5, 6]);
/// # Ok(())
/// # }
/// ```
///
/// `T` must be valid for every bit pattern:
///
/// ```compile_fail
/// let lock = cxc_sync::SeqLock::new(false);
/// ```
pub struct SeqLock<T> {
    store: Store,
    /// This process's writer slot: `process pid << 8 | holder`, 0 = none yet.
    writer: StdAtomicU64,
    stall: Duration,
    _payload: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for SeqLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqLock")
            .field("claim", &self.state().claim.load(Ordering::Relaxed))
            .field("stall_timeout", &self.stall)
            .finish()
    }
}

impl<T> Drop for SeqLock<T> {
    fn drop(&mut self) {
        let c = *self.writer.get_mut();
        if c == 0 || (c >> 8) as u32 != current_pid() {
            return;
        }
        let me = Identity::current();
        let _serial = crate::lease::REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.state().unpin(c as u8, &me);
    }
}

pub(crate) fn check_payload<T>() -> Result<(), SeqLockError> {
    if size_of::<T>() > PAYLOAD_BYTES {
        return Err(SeqLockError::PayloadTooLarge {
            max: PAYLOAD_BYTES,
            found: size_of::<T>(),
        });
    }
    if align_of::<T>() > 8 {
        return Err(SeqLockError::PayloadAlign {
            max: 8,
            found: align_of::<T>(),
        });
    }
    Ok(())
}

const fn words_for<T>() -> usize {
    let n = size_of::<T>().div_ceil(8);
    if n > PAYLOAD_WORDS { PAYLOAD_WORDS } else { n }
}

#[inline]
fn to_words<T: IntoBytes + Immutable>(value: &T) -> [u64; PAYLOAD_WORDS] {
    let mut words = [0u64; PAYLOAD_WORDS];
    let src = value.as_bytes();
    if let Some(dst) = words.as_mut_bytes().get_mut(..src.len()) {
        dst.copy_from_slice(src);
    }
    words
}

#[inline]
fn from_words<T: FromBytes>(words: &[u64; PAYLOAD_WORDS]) -> T {
    // `check_payload` ensured `size_of::<T>() <= PAYLOAD_BYTES`.
    match T::read_from_prefix(words.as_bytes()) {
        Ok((v, _)) => v,
        Err(_) => unreachable!("T fits a payload buffer (checked at construction)"),
    }
}

/// `T` from the first bytes of `words`, which hold at least `size_of::<T>()` bytes
/// (`words_for::<T>()` words).
#[inline]
fn from_prefix<T: FromBytes, const W: usize>(words: &[u64; W]) -> T {
    match T::read_from_prefix(words.as_bytes()) {
        Ok((v, _)) => v,
        Err(_) => unreachable!("W = words_for::<T>() words hold a T"),
    }
}

/// A fresh lease state on the heap: all zero, which is the fresh state (vacant,
/// generation 0), exactly what a new file holds (`docs/memory-layout.md`).
fn zeroed_state() -> Box<LeaseState> {
    let layout = std::alloc::Layout::new::<LeaseState>();
    // SAFETY: `layout` is `LeaseState`'s, whose size is not zero (asserted in
    // `lease/state.rs`).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<LeaseState>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` was allocated by the global allocator with `LeaseState`'s layout, as
    // `Box` requires, and is not aliased. Its bytes are zero, and `LeaseState` is made
    // only of atomics (it is a `cxc_mmf::AtomicView`, see `lease/state.rs`), for which
    // every bit pattern, zero included, is a valid value.
    unsafe { Box::from_raw(ptr) }
}

/// Stores `initial` as the published value of a fresh (all-zero) state.
pub(crate) fn init_state<T: IntoBytes + Immutable>(state: &LeaseState, initial: &T) {
    let buf = &state.bufs[0];
    for (dst, w) in buf.words.iter().zip(to_words(initial)) {
        dst.store(w, Ordering::Relaxed);
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SeqLock<T> {
    /// A SeqLock on the heap holding `initial` (for one process's threads, tests and
    /// benches; [`SharedCell`] is the cross-process one).
    ///
    /// # Errors
    /// [`SeqLockError::PayloadTooLarge`] / [`SeqLockError::PayloadAlign`] for a `T`
    /// larger than 48 bytes or aligned to more than 8.
    pub fn new(initial: T) -> Result<Self, SeqLockError> {
        check_payload::<T>()?;
        let state = zeroed_state();
        init_state(&state, &initial);
        Ok(Self::from_store(Store::Heap(state)))
    }

    pub(crate) fn from_map(map: Mapped<LeaseState>) -> Self {
        Self::from_store(Store::File(map))
    }

    fn from_store(store: Store) -> Self {
        SeqLock {
            store,
            writer: StdAtomicU64::new(0),
            stall: DEFAULT_STALL_TIMEOUT,
            _payload: PhantomData,
        }
    }

    /// Sets how long this handle's writers wait for a writer holding the lock before
    /// they take it for stalled and supersede it (default [`DEFAULT_STALL_TIMEOUT`]).
    /// A writer that holds the lock longer — including an `update` closure that runs
    /// longer — may be superseded by other writers, whatever their setting.
    pub fn set_stall_timeout(&mut self, timeout: Duration) {
        self.stall = timeout;
    }

    /// The stall timeout of this handle's writers.
    pub fn stall_timeout(&self) -> Duration {
        self.stall
    }

    /// The current value. Never blocks and never returns a torn value: it copies the
    /// published buffer, which no writer writes into (a copy that raced with a
    /// republication of that buffer is retried).
    #[inline]
    pub fn read(&self) -> T {
        // `words_for::<T>()` is a constant per `T`: one arm survives monomorphization.
        let st = self.state();
        match words_for::<T>() {
            0 | 1 => from_prefix(&st.seq_read_words::<1>()),
            2 => from_prefix(&st.seq_read_words::<2>()),
            3 => from_prefix(&st.seq_read_words::<3>()),
            4 => from_prefix(&st.seq_read_words::<4>()),
            5 => from_prefix(&st.seq_read_words::<5>()),
            _ => from_prefix(&st.seq_read_words::<6>()),
        }
    }

    /// Replaces the value. Waits for a writer that holds the lock, takes over at once
    /// from one that died, and after the stall timeout from one that stalled.
    ///
    /// A write that is itself superseded (this thread stalled past the others' stall
    /// timeout) is never published; `write` then retries, so it returns only once
    /// `value` is published.
    ///
    /// # Errors
    /// [`WriteError::NoWriterSlot`], [`WriteError::NoBuffer`] (see their docs).
    #[inline]
    pub fn write(&self, value: T) -> Result<Written, WriteError> {
        let words = to_words(&value);
        let (holder, pid) = self.writer()?;
        let mut first: Option<Written> = None;
        loop {
            let c = self.begin(holder, pid)?;
            let w = *first.get_or_insert(c.1);
            match self.state().seq_finish(c.0, &words, words_for::<T>()) {
                Ok(()) => return Ok(w),
                Err(WriteRefused::Lost) => continue,
                Err(e) => return Err(refused(e)),
            }
        }
    }

    /// Applies `f` to the current value and publishes the result, as one serialised
    /// update (writers exclude each other; readers never wait). If `f` panics nothing
    /// is published and the lock is released.
    ///
    /// # Errors
    /// [`WriteError::Superseded`] if `f` ran longer than the other writers' stall
    /// timeout and one of them took over (the result is then discarded); the others as
    /// for [`write`](Self::write).
    pub fn update(&self, f: impl FnOnce(&mut T)) -> Result<Written, WriteError> {
        let (holder, pid) = self.writer()?;
        let (claim, written) = self.begin(holder, pid)?;
        let st = self.state();
        let id = claim.id();
        let Some(words) = st.read_if(words_for::<T>(), |w| w.id() == id) else {
            st.seq_abort(claim);
            return Err(WriteError::Superseded);
        };
        let mut value: T = from_words(&words);
        struct Abort<'a>(&'a LeaseState, Word);
        impl Drop for Abort<'_> {
            fn drop(&mut self) {
                self.0.seq_abort(self.1);
            }
        }
        let abort = Abort(st, claim);
        f(&mut value);
        std::mem::forget(abort);
        match st.seq_finish(claim, &to_words(&value), words_for::<T>()) {
            Ok(()) => Ok(written),
            Err(WriteRefused::Lost) => Err(WriteError::Superseded),
            Err(e) => Err(refused(e)),
        }
    }

    #[inline]
    fn begin(&self, holder: u8, pid: u32) -> Result<(Word, Written), WriteError> {
        let stall = self.stall;
        let c = self
            .state()
            .seq_begin(holder, pid, || Patience::new(stall))
            .map_err(refused)?;
        let abandoned = match c.took {
            Took::Free => None,
            Took::Dead => Some(Abandoned::Died),
            Took::Stalled => Some(Abandoned::Stalled),
        };
        Ok((c.word, Written { abandoned }))
    }

    /// This process's writer slot (registered on the first write, pinned while this
    /// handle lives; a forked child registers its own).
    #[inline]
    fn writer(&self) -> Result<(u8, u32), WriteError> {
        let me = current_pid();
        let c = self.writer.load(std::sync::atomic::Ordering::Acquire);
        if c != 0 && (c >> 8) as u32 == me {
            return Ok((c as u8, me));
        }
        self.writer_slow()
    }

    #[cold]
    fn writer_slow(&self) -> Result<(u8, u32), WriteError> {
        let me = Identity::current();
        let st = self.state();
        let _serial = crate::lease::REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let c = self.writer.load(std::sync::atomic::Ordering::Acquire);
        if c != 0 && (c >> 8) as u32 == me.pid {
            return Ok((c as u8, me.pid));
        }
        let pid = crate::lease::pid_word(me.pid, true);
        let h = match st.register(pid, &me) {
            Some(h) => h,
            // A full table: a dead writer's claim frees its slot (a dead writer never
            // wedges the lock).
            None if st.vacate_dead_holder() => {
                st.register(pid, &me).ok_or(WriteError::NoWriterSlot)?
            }
            None => return Err(WriteError::NoWriterSlot),
        };
        st.pin(h);
        self.writer.store(
            u64::from(me.pid) << 8 | u64::from(h),
            std::sync::atomic::Ordering::Release,
        );
        Ok((h, me.pid))
    }
}

impl<T> SeqLock<T> {
    #[inline]
    pub(crate) fn state(&self) -> &LeaseState {
        match &self.store {
            Store::Heap(s) => s,
            Store::File(m) => m.head(),
        }
    }

    pub(crate) fn map(&self) -> Option<&Mapped<LeaseState>> {
        match &self.store {
            Store::Heap(_) => None,
            Store::File(m) => Some(m),
        }
    }
}

fn refused(e: WriteRefused) -> WriteError {
    match e {
        WriteRefused::NoBuffer => WriteError::NoBuffer,
        // `Lost` right after a claim: another writer superseded this one.
        WriteRefused::Lost | WriteRefused::Busy => WriteError::Superseded,
    }
}

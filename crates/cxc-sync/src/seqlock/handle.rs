//! The [`SeqLock<T>`] handle: per-thread writer lanes over the shared [`SeqState`].

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::Duration;

use cxc_mmf::identity::{current_proc, identify};
use cxc_mmf::{Mapped, MmfError};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::lane::{LANES, Lane, SHARED_LANE, judge_slot, thread_lane};
use super::state::{PAYLOAD_WORDS, SLOTS, SeqState, counter};

/// Maximum payload size in bytes.
pub(crate) const PAYLOAD_BYTES: usize = PAYLOAD_WORDS * 8;

/// How long an `update` waits for another `update` that holds the update claim before it
/// takes it for stalled and supersedes it, by default.
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
    /// This thread could not get a writer slot: all 32 writer slots belong to live
    /// processes' handles.
    #[error("no writer slot: all 32 writer slots belong to live processes")]
    NoWriterSlot,
    /// Another writer published while this `update` ran (a `write`, or an `update` that
    /// took this one for stalled: it held the update claim longer than the other
    /// updaters' stall timeout). Its result was not published: it would have replaced a
    /// value its closure never saw.
    #[error("another writer published first; the update's result was not published")]
    Superseded,
    /// This thread needed a writer slot and this process's identity could not be read
    /// (`errno`: e.g. `EMFILE` in a forked child short of descriptors). Nothing was
    /// written and no slot was taken; a later write tries again. A slot reserved under an
    /// unknown identity could never be judged dead, so none is.
    #[error("could not identify this process for a writer slot: {}", std::io::Error::from_raw_os_error(*errno))]
    Identify {
        /// The OS error number of the failed read.
        errno: i32,
    },
}

/// What the `update` before this one left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Abandoned {
    /// Its process died holding the update claim (the OS proved it): its update may or
    /// may not have been published, never in part.
    Died,
    /// It held the update claim longer than the stall timeout (stopped, hung, or a slow
    /// closure): it was superseded, and it can publish only if nothing was published
    /// since it read the value (else it returns [`WriteError::Superseded`]).
    Stalled,
}

/// The outcome of a successful write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    /// `Some` if this `update` took the update claim from an updater that died or
    /// stalled holding it (as a robust mutex's `EOWNERDEAD`): that update may be lost.
    /// Always `None` for `write`/`store`, which take no claim: a blind store does not
    /// depend on the value before it, and a writer that dies or stalls mid-store leaves
    /// nothing behind (its bytes are never published).
    pub abandoned: Option<Abandoned>,
}

enum Store {
    Heap(Box<SeqState>),
    File(Mapped<SeqState>),
}

/// A sequence lock holding a `T` of at most 48 bytes, on the heap ([`SeqLock::new`]) or
/// in a mapped file ([`SharedCell`](super::SharedCell)).
///
/// - [`read`](Self::read) never blocks and never returns a torn value: it copies the
///   published buffer, which no writer writes into, and checks that no publication
///   happened during the copy.
/// - [`write`](Self::write) fills a staging buffer this thread owns and publishes it with
///   one CAS: writers never wait for each other, and a writer that stalls or dies
///   mid-write never exposes its bytes.
/// - [`update`](Self::update) (read, modify, publish) is serialised with other updates by
///   an update claim; an updater that died holding it is replaced at once, one that
///   holds it longer than the stall timeout is superseded, and the next updater is told
///   ([`Written::abandoned`]).
///
/// See `docs/seqlock.md` for the protocol.
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
    /// The state in `store` (a heap block or the mapping's head, neither of which moves
    /// while `store` lives), kept as a pointer so the fast paths need no match.
    st: NonNull<SeqState>,
    store: Store,
    /// Per thread index (and the shared lane): the writer slot bound to it and the last
    /// `pub_word` it published or saw. Each entry is used by one thread at a time (the
    /// shared one under `shared`).
    lanes: [Lane; LANES + 1],
    shared: crate::forklock::ForkSafeLock,
    pub(super) stall: Duration,
    _payload: PhantomData<fn() -> T>,
}

// SAFETY: `st` points into `store` (a `Box<SeqState>` or a `Mapped<SeqState>`, both
// `Send + Sync`: the state is made of atomics) and is only used to make `&SeqState`
// while `self` lives; every other field is `Send + Sync`. `T` is only a phantom
// (`fn() -> T`), values are copied in and out.
unsafe impl<T> Send for SeqLock<T> {}
// SAFETY: as for `Send`: shared access hands out only `&SeqState`, which is `Sync`.
unsafe impl<T> Sync for SeqLock<T> {}

impl<T> std::fmt::Debug for SeqLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqLock")
            .field(
                "published",
                &self
                    .state()
                    .pub_word
                    .load(crate::primitive::Ordering::Relaxed),
            )
            .field("stall_timeout", &self.stall)
            .finish()
    }
}

impl<T> Drop for SeqLock<T> {
    fn drop(&mut self) {
        let me = current_proc();
        for slot in self.lanes.iter().filter_map(|l| l.slot_of(me)) {
            self.state().release_slot(slot);
        }
    }
}

/// A `T` fits a payload buffer (48 bytes, alignment at most 8).
pub(crate) fn check_payload<T>() -> Result<(), SeqLockError> {
    Ok(crate::payload::check_fit::<T>(PAYLOAD_BYTES)?)
}

/// Words holding a `T` (checked at construction to be at most `PAYLOAD_WORDS`).
const fn words_for<T>() -> usize {
    size_of::<T>().div_ceil(8)
}

/// `value`'s bytes in the first words of a `[u64; W]` (the rest zero); `W` is
/// `words_for::<T>()`, so this is a fixed-size copy.
#[inline(always)]
fn to_words<T: IntoBytes + Immutable, const W: usize>(value: &T) -> [u64; W] {
    let mut words = [0u64; W];
    let src = value.as_bytes();
    if let Some(dst) = words.as_mut_bytes().get_mut(..src.len()) {
        dst.copy_from_slice(src);
    }
    words
}

/// `T` from the first bytes of `words`, which hold at least `size_of::<T>()` bytes.
#[inline(always)]
fn from_words<T: FromBytes, const W: usize>(words: &[u64; W]) -> T {
    match T::read_from_prefix(words.as_bytes()) {
        Ok((v, _)) => v,
        Err(_) => unreachable!("W = words_for::<T>() words hold a T"),
    }
}

/// Runs `$body` with `const $w: usize = words_for::<$t>()` (one arm survives
/// monomorphization: `words_for` is a constant per `T`).
macro_rules! with_words {
    ($t:ty, $w:ident => $body:expr) => {
        with_words!(@arms words_for::<$t>(), $w, $body, [1 2 3 4 5])
    };
    (@arms $n:expr, $w:ident, $body:expr, [$($k:literal)*]) => {
        match $n {
            $(n if n <= $k => {
                const $w: usize = $k;
                $body
            })*
            _ => {
                const $w: usize = PAYLOAD_WORDS;
                $body
            }
        }
    };
}

/// A fresh state on the heap: all zero, which is the fresh state (buffer 0 published,
/// every slot free), exactly what a new file holds.
fn zeroed_state() -> Box<SeqState> {
    let layout = std::alloc::Layout::new::<SeqState>();
    // SAFETY: `layout` is `SeqState`'s, whose size is not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<SeqState>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` was allocated by the global allocator with `SeqState`'s layout, as
    // `Box` requires, and is not aliased. Its bytes are zero, and `SeqState` is made only
    // of atomics and atomic-only sidecar blocks (it derives `FromBytes`), for which every
    // bit pattern, zero included, is a valid value.
    unsafe { Box::from_raw(ptr) }
}

/// Stores `initial` as the published value of a fresh (all-zero) state.
pub(crate) fn init_state<T: IntoBytes + Immutable>(state: &SeqState, initial: &T) {
    state.init(&to_words::<T, PAYLOAD_WORDS>(initial));
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SeqLock<T> {
    /// A SeqLock on the heap holding `initial` (for one process's threads, tests and
    /// benches; [`SharedCell`](super::SharedCell) is the cross-process one).
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

    pub(crate) fn from_map(map: Mapped<SeqState>) -> Self {
        Self::from_store(Store::File(map))
    }

    fn from_store(store: Store) -> Self {
        let st = NonNull::from(match &store {
            Store::Heap(s) => &**s,
            Store::File(m) => m.head(),
        });
        SeqLock {
            st,
            store,
            lanes: std::array::from_fn(|_| Lane::default()),
            shared: crate::forklock::ForkSafeLock::new(),
            stall: DEFAULT_STALL_TIMEOUT,
            _payload: PhantomData,
        }
    }

    /// Sets how long this handle's `update`s wait for another `update` holding the update
    /// claim before they take it for stalled and supersede it (default
    /// [`DEFAULT_STALL_TIMEOUT`]). An `update` whose closure runs longer may be
    /// superseded by other updaters, whatever their setting. `write` never waits.
    pub fn set_stall_timeout(&mut self, timeout: Duration) {
        self.stall = timeout;
    }

    /// The stall timeout of this handle's updaters.
    pub fn stall_timeout(&self) -> Duration {
        self.stall
    }

    /// The current value. Never blocks and never returns a torn value: it copies the
    /// published buffer, which no writer writes into, and retries only if a
    /// publication happened during the copy.
    #[inline(always)]
    pub fn read(&self) -> T {
        let st = self.state();
        with_words!(T, W => from_words::<T, W>(&st.read_words::<W>().0))
    }

    /// Replaces the value. Never waits for another writer: it fills a staging buffer of
    /// this thread's writer slot and publishes it with one CAS (retried, against the
    /// value it now sees, if another writer published first). A writer that stalls or
    /// dies before that CAS publishes nothing.
    ///
    /// The first write of a thread through this handle reserves a writer slot (kept until
    /// the handle is dropped).
    ///
    /// # Errors
    /// [`WriteError::NoWriterSlot`] if every writer slot belongs to a live process.
    #[inline(always)]
    pub fn write(&self, value: T) -> Result<Written, WriteError> {
        if let Some(lane) = self.own_lane()
            && let Some(slot) = lane.slot()
            && let Some(seen) = lane.seen()
        {
            let st = self.state();
            let p = with_words!(T, W => st.write_after::<W>(slot, seen, &to_words::<T, W>(&value)));
            lane.set_seen(p);
            return Ok(Written::default());
        }
        // By value: a reference would make the fast path store `value` to memory first,
        // and those stores would have to drain before its CAS.
        self.write_slow(value)
    }

    #[cold]
    #[inline(never)]
    fn write_slow(&self, value: T) -> Result<Written, WriteError> {
        let st = self.state();
        let (lane, slot, _shared) = self.lane_slot()?;
        let seen = lane
            .seen()
            .unwrap_or_else(|| st.pub_word.load(crate::primitive::Ordering::Relaxed));
        let p = with_words!(T, W => st.write_after::<W>(slot, seen, &to_words::<T, W>(&value)));
        lane.set_seen(p);
        Ok(Written::default())
    }

    /// Applies `f` to the current value and publishes the result, as one atomic
    /// read-modify-write: updates are serialised by the update claim, and the result is
    /// published only if nothing was published since `f`'s input was read. If `f` panics
    /// nothing is published and the claim is released.
    ///
    /// # Errors
    /// [`WriteError::Superseded`] if another writer published first (a `write`, or an
    /// `update` that took this one for stalled: `f` ran longer than the other updaters'
    /// stall timeout); the result is then discarded. [`WriteError::NoWriterSlot`] as
    /// for [`write`](Self::write).
    pub fn update(&self, f: impl FnOnce(&mut T)) -> Result<Written, WriteError> {
        let st = self.state();
        // Reserve this thread's slot before claiming (a full table fails fast).
        drop(self.lane_slot()?);
        let me = self.claim_slot();
        let (mine, abandoned) = self.claim(me);
        struct Release<'a>(&'a SeqState, u64);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.release_claim(self.1);
            }
        }
        let _release = Release(st, mine);
        let (words, seen) = with_words!(T, W => {
            let (w, seen) = st.read_words::<W>();
            (to_words::<[u64; W], PAYLOAD_WORDS>(&w), seen)
        });
        let mut value: T = from_words::<T, PAYLOAD_WORDS>(&words);
        f(&mut value);
        // The lane is taken again after `f` (which may itself write through this handle).
        let (lane, slot, _shared) = self.lane_slot()?;
        let (b, _) = st.staging(slot);
        with_words!(T, W => st.fill::<W>(b, &to_words::<T, W>(&value)));
        match st.publish(b, seen) {
            Ok(p) => {
                lane.set_seen(p);
                Ok(Written { abandoned })
            }
            Err(now) => {
                // A value seen after the slot's latest publication, as a lane's `seen`
                // must be.
                lane.set_seen(now);
                st.bump(counter::UPDATE_CONFLICT);
                Err(WriteError::Superseded)
            }
        }
    }

    /// This thread's own lane (not the shared one): the fast path.
    #[inline(always)]
    fn own_lane(&self) -> Option<&Lane> {
        // `thread_lane` is below `LANES`, a power of two: the mask only spares a
        // bounds check.
        Some(&self.lanes[thread_lane()? & (LANES - 1)])
    }

    /// This thread's lane and writer slot, reserving a slot if needed; for a thread
    /// without a lane of its own, the shared lane and the guard that makes it this
    /// thread's.
    #[allow(clippy::type_complexity)]
    fn lane_slot(
        &self,
    ) -> Result<(&Lane, usize, Option<crate::forklock::ForkSafeGuard<'_>>), WriteError> {
        let (i, guard) = match thread_lane() {
            Some(i) => (i, None),
            None => (
                SHARED_LANE,
                Some(self.shared.lock()),
            ),
        };
        let lane = &self.lanes[i];
        if let Some(slot) = lane.slot() {
            return Ok((lane, slot, guard));
        }
        // A new thread, or a forked child (whose copy of the lanes names its parent's
        // slots, which it must not use).
        let ident = identify()
            .map_err(|e| WriteError::Identify {
                errno: e.raw_os_error(),
            })?
            .to_words();
        let slot = self
            .state()
            .reserve(ident, judge_slot)
            .ok_or(WriteError::NoWriterSlot)?;
        lane.bind(slot);
        Ok((lane, slot, guard))
    }

    /// The slot named in this thread's update claims (any slot of this process's lanes
    /// identifies the process; the claim only needs a live identity to judge).
    fn claim_slot(&self) -> usize {
        let lane = thread_lane().unwrap_or(SHARED_LANE);
        // Else the shared lane's slot (reserved by `lane_slot` just before).
        self.lanes[lane]
            .slot()
            .or_else(|| self.lanes[SHARED_LANE].slot())
            .unwrap_or(0)
    }
}

impl<T> SeqLock<T> {
    #[inline(always)]
    pub(crate) fn state(&self) -> &SeqState {
        // SAFETY: `st` points to the state owned by `self.store` (a heap block or the
        // mapping's head), which does not move and lives as long as `self`.
        unsafe { self.st.as_ref() }
    }

    pub(crate) fn map(&self) -> Option<&Mapped<SeqState>> {
        match &self.store {
            Store::Heap(_) => None,
            Store::File(m) => Some(m),
        }
    }
}

const _: () = assert!(SLOTS <= 255);

//! The [`SeqLock<T>`] handle: per-thread writer lanes over the shared [`SeqState`].

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, AtomicUsize, Ordering as StdOrdering};
use std::time::{Duration, Instant};

use cxc_mmf::identity::{Identity, Liveness, current_pid, liveness};
use cxc_mmf::{Mapped, MmfError};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::state::{PAYLOAD_WORDS, SLOTS, SeqState, Verdict, counter};

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

/// Writer lanes per handle (thread indices); threads beyond them share one more lane
/// under a mutex.
const LANES: usize = 64;
/// The shared lane.
const SHARED_LANE: usize = LANES;
const _: () = assert!(LANES.is_power_of_two());

/// Thread indices `0..LANES`, unique among the live threads of this process (an index
/// is reused only after its thread exited).
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);
static FREE_LANES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Gives this thread's index back when the thread exits (set when it is assigned).
struct LaneRelease(Cell<usize>);

impl Drop for LaneRelease {
    fn drop(&mut self) {
        let v = self.0.get();
        if (1..=LANES).contains(&v) {
            // No write of this thread can follow: its index may go to a new thread.
            LANE.with(|l| l.set(usize::MAX));
            FREE_LANES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(v - 1);
        }
    }
}

thread_local! {
    /// This thread's index + 1 (0 = not assigned yet; `usize::MAX` = none: every index
    /// is taken, or the thread is exiting). No destructor, so the fast path is one
    /// thread-local load.
    static LANE: Cell<usize> = const { Cell::new(0) };
    static LANE_RELEASE: LaneRelease = const { LaneRelease(Cell::new(0)) };
}

/// This thread's lane index, or `None` (the shared lane) if every index is taken or the
/// thread is exiting.
#[inline(always)]
fn thread_lane() -> Option<usize> {
    match LANE.with(Cell::get) {
        0 => assign_lane(),
        v if v <= LANES => Some(v - 1),
        _ => None,
    }
}

#[cold]
#[inline(never)]
fn assign_lane() -> Option<usize> {
    let free = FREE_LANES.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let i = free.or_else(|| {
        NEXT_LANE
            .fetch_update(StdOrdering::Relaxed, StdOrdering::Relaxed, |n| {
                (n < LANES).then_some(n + 1)
            })
            .ok()
    });
    let v = i.map_or(usize::MAX, |i| i + 1);
    // Registers the destructor that gives the index back; a thread already exiting
    // (its destructors running) gets none and uses the shared lane.
    if i.is_some() && LANE_RELEASE.try_with(|r| r.0.set(v)).is_err() {
        if let Some(i) = i {
            FREE_LANES.lock().unwrap_or_else(|e| e.into_inner()).push(i);
        }
        LANE.with(|l| l.set(usize::MAX));
        return None;
    }
    LANE.with(|l| l.set(v));
    i
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
    /// Per thread index (and the shared lane): `pid << 32 | (slot + 1)`, 0 = none. Each
    /// entry is used by one thread at a time (the shared one under `shared`).
    lanes: [StdAtomicU64; LANES + 1],
    shared: Mutex<()>,
    stall: Duration,
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
        let me = current_pid();
        for l in self.lanes.iter() {
            let l = l.load(StdOrdering::Relaxed);
            if l != 0 && (l >> 32) as u32 == me {
                self.state().release_slot((l as u32 - 1) as usize);
            }
        }
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
        match words_for::<$t>() {
            0 | 1 => {
                const $w: usize = 1;
                $body
            }
            2 => {
                const $w: usize = 2;
                $body
            }
            3 => {
                const $w: usize = 3;
                $body
            }
            4 => {
                const $w: usize = 4;
                $body
            }
            5 => {
                const $w: usize = 5;
                $body
            }
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
            lanes: std::array::from_fn(|_| StdAtomicU64::new(0)),
            shared: Mutex::new(()),
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
        match self.own_slot() {
            Some(slot) => {
                let st = self.state();
                with_words!(T, W => st.write::<W>(slot, &to_words::<T, W>(&value)));
                Ok(Written::default())
            }
            // By value: a reference would make the fast path store `value` to memory
            // first, and those stores would have to drain before its CAS.
            None => self.write_slow(value),
        }
    }

    #[cold]
    #[inline(never)]
    fn write_slow(&self, value: T) -> Result<Written, WriteError> {
        let st = self.state();
        let (slot, _shared) = self.lane_slot()?;
        with_words!(T, W => st.write::<W>(slot, &to_words::<T, W>(&value)));
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
        let (slot, _shared) = self.lane_slot()?;
        let (b, _) = st.staging(slot);
        with_words!(T, W => st.fill::<W>(b, &to_words::<T, W>(&value)));
        match st.publish(b, seen) {
            Ok(()) => Ok(Written { abandoned }),
            Err(_) => {
                st.bump(counter::UPDATE_CONFLICT);
                Err(WriteError::Superseded)
            }
        }
    }

    /// This thread's writer slot if its lane has one for this process (the fast path).
    #[inline(always)]
    fn own_slot(&self) -> Option<usize> {
        // `thread_lane` is below `LANES`, a power of two: the mask only spares a
        // bounds check.
        let i = thread_lane()? & (LANES - 1);
        let l = self.lanes[i].load(StdOrdering::Relaxed);
        (l != 0 && (l >> 32) as u32 == current_pid()).then(|| (l as u32 - 1) as usize)
    }

    /// This thread's writer slot, reserving one if needed; for a thread without a lane of
    /// its own, the shared lane's slot and the guard that makes it this thread's.
    fn lane_slot(&self) -> Result<(usize, Option<std::sync::MutexGuard<'_, ()>>), WriteError> {
        let (i, guard) = match thread_lane() {
            Some(i) => (i, None),
            None => (
                SHARED_LANE,
                Some(self.shared.lock().unwrap_or_else(|e| e.into_inner())),
            ),
        };
        let me = current_pid();
        let l = self.lanes[i].load(StdOrdering::Relaxed);
        if l != 0 && (l >> 32) as u32 == me {
            return Ok(((l as u32 - 1) as usize, guard));
        }
        // A new thread, or a forked child (whose copy of the lanes names its parent's
        // slots, which it must not use).
        let ident = Identity::current().to_words();
        let slot = self
            .state()
            .reserve(ident, judge_slot)
            .ok_or(WriteError::NoWriterSlot)?;
        self.lanes[i].store(
            u64::from(me) << 32 | (slot as u64 + 1),
            StdOrdering::Relaxed,
        );
        Ok((slot, guard))
    }

    /// The slot named in this thread's update claims (any slot of this process's lanes
    /// identifies the process; the claim only needs a live identity to judge).
    fn claim_slot(&self) -> usize {
        let me = current_pid();
        let lane = thread_lane().unwrap_or(SHARED_LANE);
        let l = self.lanes[lane].load(StdOrdering::Relaxed);
        if l != 0 && (l >> 32) as u32 == me {
            return (l as u32 - 1) as usize;
        }
        // The shared lane's slot (reserved by `lane_slot` just before).
        let l = self.lanes[SHARED_LANE].load(StdOrdering::Relaxed);
        (l as u32).saturating_sub(1) as usize
    }

    /// Takes the update claim for `slot`: at once if free; from a holder the OS proves
    /// dead at once; from a holder that keeps the same claim longer than the stall
    /// timeout after that timeout.
    fn claim(&self, slot: usize) -> (u64, Option<Abandoned>) {
        let st = self.state();
        let c = st.claim_word();
        if SeqState::claim_holder(c).is_none()
            && let Some(m) = st.try_claim(c, slot)
        {
            return (m, died(c));
        }
        self.claim_slow(slot)
    }

    #[cold]
    fn claim_slow(&self, slot: usize) -> (u64, Option<Abandoned>) {
        const SPINS: u32 = 128;
        const JUDGE_EVERY: Duration = Duration::from_micros(500);
        let st = self.state();
        let mut seen = u64::MAX;
        let mut since = Instant::now();
        let mut judged: Option<Instant> = None;
        let mut rounds = 0u32;
        loop {
            let c = st.claim_word();
            let Some(h) = SeqState::claim_holder(c) else {
                if let Some(m) = st.try_claim(c, slot) {
                    return (m, died(c));
                }
                continue;
            };
            if c != seen {
                (seen, since, judged, rounds) = (c, Instant::now(), None, 0);
            }
            rounds = rounds.saturating_add(1);
            if rounds < SPINS {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if judged.is_none_or(|t| now.duration_since(t) >= JUDGE_EVERY) {
                judged = Some(now);
                if judge_slot(st, h) == Verdict::Dead
                    && let Some(m) = st.try_claim(c, slot)
                {
                    st.bump(counter::CLAIM_DEAD);
                    return (m, Some(Abandoned::Died));
                }
            }
            if now.duration_since(since) >= self.stall
                && let Some(m) = st.try_claim(c, slot)
            {
                st.bump(counter::CLAIM_STALLED);
                return (m, Some(Abandoned::Stalled));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// `Some(Died)` for a free claim word left by a holder that died holding it (its slot was
/// reclaimed, `SeqState::claim_died`).
fn died(c: u64) -> Option<Abandoned> {
    SeqState::claim_died(c).then_some(Abandoned::Died)
}

/// The OS's verdict on the process that reserved slot `i`: `Dead` only if proven (a slot
/// freed or re-reserved since counts as its holder gone only when freed).
fn judge_slot(st: &SeqState, i: usize) -> Verdict {
    match st.slot_ident(i) {
        None => Verdict::Dead,
        Some(w) => match liveness(&Identity::from_words(w)) {
            Liveness::Dead => Verdict::Dead,
            Liveness::Alive | Liveness::Unknown => Verdict::Alive,
        },
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

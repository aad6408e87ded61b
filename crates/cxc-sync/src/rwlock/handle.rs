//! `SharedRwLock<T>`: the type, its file (layout parameters, create/open), the holder
//! table (registration, reclaim of dead processes) and accessors.

use std::marker::PhantomData;
use std::path::Path;
use crate::forklock::{ForkSafeMutex, ForkSafeMutexGuard};
use std::sync::atomic::Ordering;
use std::time::Duration;

use cxc_mmf::identity::Identity;
use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, Origin, TypeFingerprint};
use cxc_sidecar::{Instrumented, OpCode};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::error::{RwLockError, RwLockOptions};
use super::layout::{RwLockStats, HEAD_SIZE, PAYLOAD_BYTES, PAYLOAD_WORDS, RwHead, RwSlot, SLOT_SIZE, ctr};
use super::raw::RawRwLock;
use super::seen::Seen;
use super::word::MAX_HOLDERS;
use crate::holders::{
    HolderCache, check_namespace, find_or_claim, is_dead, pid_namespace, reclaimable,
};
use crate::payload::{check_fit, to_words};
use crate::semaphore::word::{
    STATE_ACTIVE, STATE_RECLAIMING, identity_tag, owner_parts, owner_word,
};

/// Format version in `params[1]`.
///
/// 2: the head block holds the sidecar's handshake and observation ring (3456 bytes; 768
/// in version 1).
const PROTOCOL: u64 = 2;

/// A reader-writer lock shared by processes through a mapped file, guarding a payload
/// `T` of at most [`PAYLOAD_BYTES`] bytes.
///
/// Many readers or one writer, across processes. Readers and the writer are tracked by
/// process identity in a holder table sized at create: a process that dies holding the
/// lock is reclaimed by the next waiter, and a writer that makes no progress for the
/// grace period while others wait (e.g. a stopped process) is evicted, its later writes
/// refused and never visible. Writers are preferred: once a writer waits, new readers
/// wait behind it. Blocked callers sleep in the kernel.
///
/// # Examples
/// ```
/// use cxc_sync::SharedRwLock;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("config.rw");
/// let lock = SharedRwLock::<u64>::create(&path, 7)?;
/// let other = SharedRwLock::<u64>::open(&path)?; // e.g. in another process
/// {
///     let w = lock.write();
///     w.update(|v| *v += 1)?;
///     assert!(other.try_read().is_none()); // the writer excludes readers
/// }
/// let (a, b) = (lock.read(), other.read()); // many readers at once
/// assert_eq!((a.get(), b.get()), (8, 8));
/// # Ok(())
/// # }
/// ```
pub struct SharedRwLock<T> {
    pub(super) map: Mapped<RwHead, RwSlot>,
    pub(super) grace: Duration,
    /// This process's holder slot, cached.
    holder: HolderCache,
    /// Whether a sidecar observes this handle (its slow paths then record into the ring).
    pub(super) observed: cxc_sidecar::Observed,
    /// What this handle's waiters last saw of a writer that makes no progress (a child
    /// made by `fork` while a thread of its parent held it starts afresh: `forklock.rs`).
    seen: ForkSafeMutex<Option<Seen>>,
    _payload: PhantomData<fn() -> T>,
}

fn check_payload<T>() -> Result<(), RwLockError> {
    Ok(check_fit::<T>(PAYLOAD_BYTES)?)
}

fn check_params(p: &[u64; 4]) -> Result<(), MmfError> {
    let mismatch = |name, expected: String, found| MmfError::ParamMismatch {
        name,
        expected,
        found,
    };
    if p[0] == 0 {
        return Err(mismatch("grace_ns", "1..".into(), p[0]));
    }
    if p[1] != PROTOCOL {
        return Err(mismatch(
            "protocol",
            format!(
                "{PROTOCOL} (this build reads rwlock format version {PROTOCOL} only; the file \
                 has version {})",
                p[1]
            ),
            p[1],
        ));
    }
    if p[3] != 0 {
        return Err(mismatch("reserved param 3", "0".into(), p[3]));
    }
    Ok(())
}

/// What an opener of an rwlock file with payload type `payload` expects.
pub(super) fn expect(payload: TypeFingerprint) -> Expect<'static> {
    Expect {
        kind: Kind::RwLock,
        head_size: HEAD_SIZE,
        slot_size: SLOT_SIZE,
        capacity: None,
        max_capacity: u64::from(MAX_HOLDERS),
        payload,
        check_params: &check_params,
    }
}

fn layout<T>(opts: &RwLockOptions) -> Result<Layout, RwLockError> {
    check_payload::<T>()?;
    if opts.holders == 0 || opts.holders > MAX_HOLDERS {
        return Err(RwLockError::InvalidCapacity {
            requested: opts.holders,
            limit: MAX_HOLDERS,
        });
    }
    let grace = u64::try_from(opts.grace.as_nanos()).unwrap_or(0);
    if grace == 0 {
        return Err(RwLockError::InvalidGrace { found: opts.grace });
    }
    Ok(Layout {
        kind: Kind::RwLock,
        head_size: HEAD_SIZE,
        slot_size: SLOT_SIZE,
        capacity: u64::from(opts.holders),
        payload: TypeFingerprint::of::<T>(),
        params: [grace, PROTOCOL, pid_namespace(), 0],
    })
}

fn create_options(opts: &RwLockOptions) -> CreateOptions {
    CreateOptions {
        mode: opts.mode,
        init_timeout: opts.init_timeout,
    }
}

fn init<T: IntoBytes + Immutable>(h: &RwHead, initial: &T) {
    // Published by the file layer's init-state Release store.
    for (dst, w) in h.bufs[0].iter().zip(to_words::<T, PAYLOAD_WORDS>(initial)) {
        dst.store(w, Ordering::Relaxed);
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SharedRwLock<T> {
    /// Largest holder-table capacity (1023).
    pub const MAX_HOLDERS: u32 = MAX_HOLDERS;

    /// Creates a lock file at `path` holding `initial`, with the default
    /// [`RwLockOptions`]. Never clobbers an existing file.
    ///
    /// # Errors
    /// [`RwLockError::PayloadTooLarge`]/[`RwLockError::PayloadAlign`] for a `T` that does
    /// not fit a buffer; [`RwLockError::File`] if the file cannot be created.
    pub fn create(path: impl AsRef<Path>, initial: T) -> Result<Self, RwLockError> {
        Self::create_with(path, initial, &RwLockOptions::default())
    }

    /// [`SharedRwLock::create`] with explicit options.
    ///
    /// # Errors
    /// As [`SharedRwLock::create`], plus [`RwLockError::InvalidCapacity`] and
    /// [`RwLockError::InvalidGrace`].
    pub fn create_with(
        path: impl AsRef<Path>,
        initial: T,
        opts: &RwLockOptions,
    ) -> Result<Self, RwLockError> {
        let layout = layout::<T>(opts)?;
        let map = Mapped::create(path, layout, &create_options(opts), |h: &RwHead, _| {
            init(h, &initial)
        })?;
        Self::from_map(map)
    }

    /// Opens an existing lock file; the grace period and holder capacity are read from it.
    /// The process is registered in the holder table at once.
    ///
    /// # Errors
    /// [`RwLockError::File`] for a missing, foreign, corrupt or incompatible file (another
    /// `T` is a [`MmfError`] payload mismatch); [`RwLockError::TableFull`];
    /// [`RwLockError::ForeignPidNamespace`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RwLockError> {
        check_payload::<T>()?;
        let map = Mapped::open(path, &expect(TypeFingerprint::of::<T>()))?;
        Self::from_map(map)
    }

    /// Creates the file, or opens it if it exists (or another process creates it at the
    /// same time). `initial` and `opts` apply only when this call creates it.
    ///
    /// # Errors
    /// As [`SharedRwLock::create`] and [`SharedRwLock::open`].
    pub fn create_or_open(
        path: impl AsRef<Path>,
        initial: T,
        opts: &RwLockOptions,
    ) -> Result<(Self, Origin), RwLockError> {
        let layout = layout::<T>(opts)?;
        let (map, origin) = Mapped::create_or_open(
            path,
            layout,
            &create_options(opts),
            &expect(TypeFingerprint::of::<T>()),
            |h: &RwHead, _| init(h, &initial),
        )?;
        Ok((Self::from_map(map)?, origin))
    }

    fn from_map(map: Mapped<RwHead, RwSlot>) -> Result<Self, RwLockError> {
        check_namespace(map.info().layout.params[2])
            .map_err(|(expected, found)| RwLockError::ForeignPidNamespace { expected, found })?;
        let grace = Duration::from_nanos(map.info().layout.params[0].max(1));
        let lock = SharedRwLock {
            map,
            grace,
            holder: HolderCache::new(),
            observed: cxc_sidecar::Observed::new(),
            seen: ForkSafeMutex::new(None),
            _payload: PhantomData,
        };
        lock.holder_slow()?;
        Ok(lock)
    }
}

impl<T> SharedRwLock<T> {
    /// What this handle's waiters last saw of the writer (slow paths only).
    pub(super) fn seen(&self) -> ForkSafeMutexGuard<'_, Option<Seen>> {
        self.seen.lock(|| None)
    }

    /// The protocol view of this file.
    #[inline]
    pub(super) fn raw(&self) -> RawRwLock<'_> {
        RawRwLock {
            head: self.map.head(),
            slots: self.map.slots(),
        }
    }

    /// This process's holder slot: cached; registered on first use (and again in a
    /// forked child). `None` if the table is full of live processes.
    #[inline]
    pub(super) fn holder(&self) -> Option<usize> {
        self.holder_and_pid().map(|(slot, _)| slot)
    }

    /// [`holder`](Self::holder) and this process's pid (one pid lookup for both).
    #[inline]
    pub(super) fn holder_and_pid(&self) -> Option<(usize, u32)> {
        let pid = crate::liveness::current_proc();
        let slot = self.holder.get(pid).or_else(|| self.holder_slow().ok())?;
        Some((slot, pid))
    }

    #[cold]
    fn holder_slow(&self) -> Result<usize, RwLockError> {
        // A handle carried into another pid namespace (`unshare` + `fork`) is refused as
        // `open` refuses one opened there.
        check_namespace(self.map.info().layout.params[2])
            .map_err(|(expected, found)| RwLockError::ForeignPidNamespace { expected, found })?;
        self.holder.register(self.map.path(), |me| {
            let slots = self.map.slots();
            let owner = owner_word(STATE_ACTIVE, me.pid, identity_tag(me));
            let claim_free = || {
                slots.iter().position(|s| {
                    s.owner.load(Ordering::Relaxed) == 0
                        // SYNC: owner (AcqRel; pairs with the Release in `reclaim_slot`).
                        && s.owner
                            .compare_exchange(0, owner, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                })
            };
            let found = find_or_claim(
                slots
                    .iter()
                    .position(|s| s.owner.load(Ordering::Acquire) == owner),
                claim_free,
                || {
                    self.reclaim_dead();
                },
                |claimed| {
                    self.raw()
                        .bump(if claimed { ctr::REGISTERED } else { ctr::TABLE_FULL })
                },
            );
            let slot = found.ok_or(RwLockError::TableFull {
                capacity: slots.len() as u32,
            })?;
            // SYNC: Dekker. Writers scan the counts of slots below `hwm`; this slot is in
            // range before it ever counts a read (SeqCst, ordered before our first RMW).
            self.map
                .head()
                .hwm
                .fetch_max(slot as u64 + 1, Ordering::SeqCst);
            Ok(slot)
        })
    }

    /// Reclaims the slots of processes that died (the whole thread group gone, or the
    /// pid now names another process): drops their read holds, evicts a dead writer, and
    /// frees quarantined buffers of dead writers. Blocked callers do this themselves.
    /// Returns the number of slots reclaimed.
    pub fn reclaim_dead(&self) -> u32 {
        if self.foreign() {
            return 0;
        }
        let raw = self.raw();
        let me = Identity::current();
        let my_tag = identity_tag(&me);
        let mine = owner_word(STATE_RECLAIMING, me.pid, my_tag);
        let mut n = 0;
        for (d, slot) in self.map.slots().iter().enumerate() {
            let seen = slot.owner.load(Ordering::Acquire);
            let taken = reclaimable(seen, me.pid, my_tag)
                && slot
                    .owner
                    .compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            if !taken {
                continue;
            }
            if let Some(token) = raw.reclaim_slot(d, mine) {
                self.note(OpCode::RwEvictDead, 0, token);
            }
            raw.bump(ctr::RECLAIMED);
            n += 1;
        }
        // Quarantines of writers whose slot was freed without them (another reclaimer
        // that died between its eviction and its reap, or a file from before
        // `reclaim_slot` reaped first).
        raw.reap_quarantine(|s| self.slot_dead(s));
        if n > 0 {
            self.note(OpCode::RwReclaim, 0, u64::from(n));
        }
        n
    }

    /// Whether the process that owned holder slot `s` is gone (a free or reclaiming
    /// slot's owner was found dead).
    pub(super) fn slot_dead(&self, s: usize) -> bool {
        let Some(slot) = self.map.slots().get(s) else {
            return false;
        };
        if self.foreign() {
            return false;
        }
        let (state, pid, tag) = owner_parts(slot.owner.load(Ordering::Acquire));
        state != STATE_ACTIVE || is_dead(pid, tag)
    }

    /// Whether this process has its holder slot (without registering).
    pub(crate) fn has_slot(&self) -> bool {
        self.holder.get(crate::liveness::current_proc()).is_some()
    }

    /// Tries to get this process's holder slot now (a forked child that found the table
    /// full); whether it has one.
    #[cfg(feature = "async")]
    pub(crate) fn try_register(&self) -> bool {
        self.holder_slow().is_ok()
    }

    /// Whether this process is in another pid namespace than the file's creator (a
    /// handle carried there by `unshare` + `fork`): then no holder is judged dead.
    fn foreign(&self) -> bool {
        crate::holders::foreign_namespace(self.map.info().layout.params[2])
    }

    /// The grace period (stored in the file).
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Number of holder slots in the file.
    pub fn holder_capacity(&self) -> usize {
        self.map.slots().len()
    }

    /// The path the file was created or opened at.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// The fencing token of the current (or last) write lock.
    pub fn current_token(&self) -> u64 {
        self.raw().word().token()
    }

    /// The cumulative event counters, typed.
    ///
    /// ```
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let lock = cxc_sync::SharedRwLock::create(dir.path().join("rw"), 0u64).unwrap();
    /// let reading = lock.read();
    /// // A writer finds a reader inside, drains, and gives up at the deadline.
    /// assert!(lock.write_timeout(Duration::from_millis(5)).is_none());
    /// drop(reading);
    /// let stats = lock.stats();
    /// assert_eq!((stats.timeouts, stats.registered), (1, 1));
    /// assert!(lock.counters().contains(&("timeouts", stats.timeouts)));
    /// ```
    pub fn stats(&self) -> RwLockStats {
        RwLockStats::read(&self.map.head().counters)
    }

    /// The cumulative event counters, by name.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        ctr::NAMES
            .iter()
            .zip(&self.map.head().counters)
            .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
            .collect()
    }
}

crate::macros::instrumented!(SharedRwLock<T>, Kind::RwLock, &ctr::NAMES);

#[cfg(all(feature = "async", not(cxc_loom)))]
impl<T> Drop for SharedRwLock<T> {
    fn drop(&mut self) {
        // Before the mapping goes: this process's async reactor forgets its wake words
        // (and the groups of futures leaked with `mem::forget`).
        let h = self.map.head();
        let words = [&h.rwake, &h.wwake, &h.dwake].map(|w| std::ptr::from_ref(w) as usize);
        crate::asyncs::forget_words(&words);
    }
}

impl<T> std::fmt::Debug for SharedRwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.raw().word();
        f.debug_struct("SharedRwLock")
            .field("path", &self.map.path())
            .field("writer", &w.writer())
            .field("token", &w.token())
            .finish()
    }
}

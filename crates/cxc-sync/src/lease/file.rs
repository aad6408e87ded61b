//! The mapped-file lease: [`OwnerLease<T>`].

use std::marker::PhantomData;
use std::path::Path;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU64};

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, Origin, TypeFingerprint};
use cxc_sidecar::{
    AdaptiveInstance, HandshakeHeader, ObservationRing, OpCode, counter_values,
    flags as sidecar_flags,
};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::{LeaseClaim, LeaseError, LeaseOptions, Preemption};
use super::ident::pid_word;
use super::os::Identity;
use super::state::{
    ClaimReason, Claimant, Granted, LeaseState, PAYLOAD_BYTES, PAYLOAD_WORDS, Policy, WriteRefused,
    counter,
};
use super::watch::DeathWatcher;
use super::word::Word;
use crate::epoch::{EpochClock, EpochMode};
use crate::liveness::Liveness;
use crate::primitive::{Ordering, fence};

/// This process's pid (cached; a forked child's is its own).
#[inline]
pub(super) fn my_proc() -> u32 {
    cxc_mmf::identity::current_pid()
}

/// The pid word (a pid, and the guard flag) as kept in the handle's cache.
const PID_WORD_MASK: u64 = (1 << 33) - 1;

/// Size of the lease's fixed block in the file.
const HEAD_SIZE: u32 = size_of::<LeaseState>() as u32;
/// How often a blocked `acquire` re-checks staleness and holder death while asleep, when
/// no death watcher covers the holder (no recorded identity: heartbeat path).
const BLOCKED_POLL: Duration = Duration::from_millis(2);
/// The first sleep of a blocked `acquire`, before a death watcher is started.
const FIRST_NAP: Duration = Duration::from_millis(1);
/// The re-check interval while a death watcher covers the holder (its death wakes us at
/// once; this only bounds how late a stale heartbeat is noticed).
const WATCHED_POLL: Duration = Duration::from_millis(25);
/// How often a claimant waiting for a free identity slot looks again.
pub(super) const SLOT_POLL: Duration = Duration::from_millis(5);
/// Claim attempts spent spinning before a blocked `acquire` sleeps in the kernel.
const SPIN_BEFORE_PARK: u32 = 64;

/// A cross-process lease on a payload `T` of at most 48 bytes, in a mapped file.
///
/// Any process that opens the file can claim the lease. A claim is granted when the lease
/// is vacant, when the claimant's pid is lower than the holder's ([`Preemption::LowerPid`],
/// the seed default), when the holder's heartbeat is more than `grace` epochs old, or —
/// at once — when the OS shows the holder process is gone (for claims a process made for
/// its own pid). Every claim carries a generation (the fencing token); operations by a
/// holder whose claim was superseded fail instead of silently succeeding.
///
/// `T` must be valid for every bit pattern (zerocopy's `FromBytes`), since another process
/// may write any bytes into the file:
///
/// ```compile_fail
/// # let dir = tempfile::tempdir().unwrap();
/// let lease = cxc_sync::OwnerLease::<bool>::create(dir.path().join("l"), false);
/// ```
///
/// # Examples
/// ```
/// use cxc_sync::OwnerLease;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let lease: OwnerLease<u64> = OwnerLease::create(dir.path().join("counter.lease"), 0)?;
/// let me = std::process::id();
/// if lease.try_acquire(me, 3) {
///     for _ in 0..1000 {
///         let v = lease.read_as_owner(me).unwrap();
///         assert!(lease.write_as_owner(me, v + 1));
///     }
///     lease.release(me);
/// }
/// assert_eq!(lease.with_lease(me, 3, |v| *v), Some(1000));
/// # Ok(())
/// # }
/// ```
pub struct OwnerLease<T> {
    map: Mapped<LeaseState>,
    clock: EpochClock,
    preemption: Preemption,
    /// Whether a `SidecarBox` observes this handle (then transitions are recorded).
    observed: AtomicBool,
    /// The last claimant registered through this handle: `process pid << 41 | pid word
    /// << 8 | holder`, valid while the process pid is this process's (a forked child's
    /// differs).
    cache: AtomicU64,
    /// Identity slots this handle pinned (bit `holder - 1`), unpinned on drop.
    pinned: std::sync::Mutex<u64>,
    /// Guards' settings: the grace in epochs and the pid their slot names.
    pub(super) guard: super::builder::GuardSettings,
    _payload: PhantomData<fn() -> T>,
}

impl<T> Drop for OwnerLease<T> {
    fn drop(&mut self) {
        let pinned = *self.pinned.get_mut().unwrap_or_else(|e| e.into_inner());
        if pinned == 0 {
            return;
        }
        let me = Identity::current();
        let _serial = super::ident::REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for i in 0..64u8 {
            if pinned & (1 << i) != 0 {
                self.map.head().unpin(i + 1, &me);
            }
        }
    }
}

impl<T> std::fmt::Debug for OwnerLease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerLease")
            .field("path", &self.map.path())
            .field("claim", &self.map.head().claim.load(Ordering::Relaxed))
            .field("owner", &self.current_owner_raw())
            .finish()
    }
}

/// A snapshot of a lease's state, for tools and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// Holder pid, `None` when vacant.
    pub owner: Option<u32>,
    /// Generation of the current (or last) claim.
    pub generation: u64,
    /// The recorded identity value of the process that made the current claim (its
    /// pidfs inode, or a flagged start time on kernels without pidfs), if readable.
    pub owner_start: Option<u64>,
    /// Whether a write (or `with_lease` closure) is in flight.
    pub writing: bool,
    /// Whether the holder inherited an interrupted write it has not yet overwritten.
    pub torn: bool,
    /// Epoch of the holder's last beat.
    pub heartbeat_epoch: u64,
    /// The current epoch.
    pub epoch: u64,
    /// The epoch source.
    pub epoch_mode: EpochMode,
    /// The preemption policy.
    pub preemption: Preemption,
    /// Acquirers asleep in the kernel (may over-count after a waiter died).
    pub waiters: u32,
    /// Cumulative counters, indexed by [`counter`](super::counter).
    pub counters: [u64; counter::COUNT],
    /// The published payload words (the payload type's bytes, zero-padded to 48).
    pub payload_words: [u64; PAYLOAD_WORDS],
    /// Payload type recorded in the file.
    pub payload_type: TypeFingerprint,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

/// Reads the status of any lease file without knowing its payload type (for tools such as
/// `cxc inspect`). The file is fully validated except for the payload type's identity.
///
/// # Errors
/// [`LeaseError::File`] if the file is not a valid lease file.
pub fn inspect(path: impl AsRef<Path>) -> Result<LeaseStatus, LeaseError> {
    let path = path.as_ref();
    let info = cxc_mmf::peek(path)?;
    let payload = info.layout.payload;
    if payload.size as usize > PAYLOAD_BYTES || payload.align > 8 {
        return Err(LeaseError::File(MmfError::ParamMismatch {
            name: "payload_size",
            expected: format!("at most {PAYLOAD_BYTES} bytes, alignment at most 8"),
            found: u64::from(payload.size),
        }));
    }
    let expect = Expect {
        payload,
        ..OwnerLease::<[u64; PAYLOAD_WORDS]>::expect()
    };
    let map: Mapped<LeaseState> = Mapped::open(path, &expect)?;
    // Inspection only reads: it does not register this process's identity.
    let lease = OwnerLease::<[u64; PAYLOAD_WORDS]>::from_map_unregistered(map);
    Ok(lease.status())
}

fn check_payload<T>() -> Result<(), LeaseError> {
    if size_of::<T>() > PAYLOAD_BYTES {
        return Err(LeaseError::PayloadTooLarge {
            max: PAYLOAD_BYTES,
            found: size_of::<T>(),
        });
    }
    if align_of::<T>() > 8 {
        return Err(LeaseError::PayloadAlign {
            max: 8,
            found: align_of::<T>(),
        });
    }
    Ok(())
}

/// Payload words that hold a `T` (the rest of the buffer is never read or written).
pub(super) const fn words_for<T>() -> usize {
    let n = size_of::<T>().div_ceil(8);
    if n > PAYLOAD_WORDS { PAYLOAD_WORDS } else { n }
}

pub(super) fn to_words<T: IntoBytes + Immutable>(value: &T) -> [u64; PAYLOAD_WORDS] {
    let mut words = [0u64; PAYLOAD_WORDS];
    let src = value.as_bytes();
    if let Some(dst) = words.as_mut_bytes().get_mut(..src.len()) {
        dst.copy_from_slice(src);
    }
    words
}

pub(super) fn from_words<T: FromBytes>(words: &[u64; PAYLOAD_WORDS]) -> Option<T> {
    T::read_from_bytes(words.as_bytes().get(..size_of::<T>())?).ok()
}

fn check_params(params: &[u64; 4]) -> Result<(), MmfError> {
    if Preemption::from_code(params[0]).is_none() {
        return Err(MmfError::ParamMismatch {
            name: "preemption",
            expected: "0 (lower pid) or 1 (never)".into(),
            found: params[0],
        });
    }
    if EpochMode::decode(params[1], params[2]).is_none() {
        return Err(MmfError::ParamMismatch {
            name: "epoch_mode",
            expected: "0 (manual, tick 0) or 1 (clock, tick 1 µs..1 day)".into(),
            found: params[1],
        });
    }
    if params[3] != 0 {
        return Err(MmfError::ParamMismatch {
            name: "reserved",
            expected: "0".into(),
            found: params[3],
        });
    }
    Ok(())
}

/// Aborts an unfinished `with_lease` if its closure panics: nothing is published and the
/// lease is released.
struct AbortOnUnwind<'a> {
    state: &'a LeaseState,
    word: Word,
    armed: bool,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.state.abort_write(self.word, true);
        }
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    /// Creates a lease file holding `initial`, with the seed's defaults (lower pid
    /// preempts, manual epochs, mode 0600). Fails if anything exists at `path`.
    ///
    /// # Errors
    /// [`LeaseError::PayloadTooLarge`]/[`LeaseError::PayloadAlign`] for an unsuitable `T`;
    /// [`LeaseError::File`] if the file exists or cannot be written.
    pub fn create(path: impl AsRef<Path>, initial: T) -> Result<Self, LeaseError> {
        Self::create_with(path, initial, &LeaseOptions::default())
    }

    /// Creates a lease file with explicit options.
    ///
    /// # Errors
    /// As [`OwnerLease::create`], plus [`LeaseError::InvalidOption`].
    pub fn create_with(
        path: impl AsRef<Path>,
        initial: T,
        opts: &LeaseOptions,
    ) -> Result<Self, LeaseError> {
        let layout = Self::layout(opts)?;
        let map = Mapped::create(path, layout, &Self::create_options(opts), |s, _| {
            Self::init(s, &initial)
        })?;
        Ok(Self::from_map(map))
    }

    /// Creates the lease, or opens it if another process created it first (exactly one
    /// racing process initialises it with its `initial`).
    ///
    /// # Errors
    /// As [`OwnerLease::create_with`] and [`OwnerLease::open`].
    pub fn create_or_open(
        path: impl AsRef<Path>,
        initial: T,
        opts: &LeaseOptions,
    ) -> Result<(Self, Origin), LeaseError> {
        let layout = Self::layout(opts)?;
        let (map, origin) = Mapped::create_or_open(
            path,
            layout,
            &Self::create_options(opts),
            &Self::expect(),
            |s, _| Self::init(s, &initial),
        )?;
        Ok((Self::from_map(map), origin))
    }

    /// Opens an existing lease file, validating the header, the layout, the options
    /// stored in it and that it was created for this `T`.
    ///
    /// # Errors
    /// [`LeaseError::File`] with the exact mismatch; payload errors as for `create`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LeaseError> {
        check_payload::<T>()?;
        let map = Mapped::open(path, &Self::expect())?;
        Ok(Self::from_map(map))
    }

    fn layout(opts: &LeaseOptions) -> Result<Layout, LeaseError> {
        check_payload::<T>()?;
        if !opts.epoch.is_valid() {
            return Err(LeaseError::InvalidOption(format!(
                "epoch tick must be between {:?} and {:?}",
                crate::epoch::MIN_TICK,
                crate::epoch::MAX_TICK
            )));
        }
        let (mode, tick) = opts.epoch.encode();
        Ok(Layout {
            kind: Kind::Lease,
            head_size: HEAD_SIZE,
            slot_size: 0,
            capacity: 0,
            payload: TypeFingerprint::of::<T>(),
            params: [opts.preemption.code(), mode, tick, 0],
        })
    }

    fn create_options(opts: &LeaseOptions) -> CreateOptions {
        CreateOptions {
            mode: opts.mode,
            init_timeout: opts.init_timeout,
        }
    }

    fn expect() -> Expect<'static> {
        Expect {
            kind: Kind::Lease,
            head_size: HEAD_SIZE,
            slot_size: 0,
            capacity: Some(0),
            max_capacity: 0,
            payload: TypeFingerprint::of::<T>(),
            check_params: &check_params,
        }
    }

    fn init(state: &LeaseState, initial: &T) {
        for (dst, w) in state.bufs[0].words.iter().zip(to_words(initial)) {
            dst.store(w, Ordering::Relaxed);
        }
    }

    fn from_map(map: Mapped<LeaseState>) -> Self {
        // Identity slots are registered on the first claim (see `ident.rs`).
        Self::from_map_unregistered(map)
    }

    fn from_map_unregistered(map: Mapped<LeaseState>) -> Self {
        let p = map.info().layout.params;
        // Validated by `check_params` (open) or built from valid options (create).
        let epoch = EpochMode::decode(p[1], p[2]).unwrap_or_default();
        let preemption = Preemption::from_code(p[0]).unwrap_or_default();
        OwnerLease {
            map,
            clock: EpochClock::new(epoch),
            preemption,
            observed: AtomicBool::new(false),
            cache: AtomicU64::new(0),
            pinned: std::sync::Mutex::new(0),
            guard: super::builder::GuardSettings::for_mode(epoch),
            _payload: PhantomData,
        }
    }
}
impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> OwnerLease<T> {
    #[inline]
    pub(super) fn state(&self) -> &LeaseState {
        self.map.head()
    }

    #[inline]
    fn policy(&self) -> Policy {
        Policy {
            preempt_lower: self.preemption == Preemption::LowerPid,
        }
    }

    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.clock.now(&self.state().epoch)
    }

    /// Whether transitions are recorded (a `SidecarBox` observes this handle).
    #[inline]
    fn observed(&self) -> bool {
        self.observed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records an observation if observed.
    #[inline]
    fn note(&self, op: OpCode, flags: u16, arg: u64) {
        if self.observed() {
            self.note_slow(op, flags, arg);
        }
    }

    #[cold]
    fn note_slow(&self, op: OpCode, flags: u16, arg: u64) {
        self.state().ring.record(op, flags, arg);
    }

    /// The identity-table holder value this process uses for `pid`, from the handle's
    /// cache. `None` on a miss (another pid, never registered, or a forked child).
    #[inline]
    fn cached_holder(&self, pid: u64) -> Option<u8> {
        // One word: `process pid << 41 | pid word << 8 | holder`. Keyed by this process's
        // pid (cached in a wipe-on-fork page, no system call): a forked child has another
        // pid, so it misses and registers its own slot. Linux pids fit in 22 bits.
        let me = u64::from(cxc_mmf::identity::current_pid());
        let c = self.cache.load(std::sync::atomic::Ordering::Acquire);
        if c >> 41 != me || (c >> 8) & PID_WORD_MASK != pid {
            return None;
        }
        Some(c as u8).filter(|h| *h != 0)
    }

    /// The holder value for `pid`, registering a slot of the identity table if
    /// `register` (claims) or only looking one up (operations of a holder).
    #[inline]
    fn holder(&self, pid: u32, register: bool) -> Option<u8> {
        self.holder_as(pid_word(pid, false), register)
    }

    /// As [`holder`](Self::holder) for a slot pid word (a pid, or a guard's slot).
    #[inline]
    pub(super) fn holder_as(&self, pid: u64, register: bool) -> Option<u8> {
        if pid as u32 == 0 {
            return None;
        }
        self.cached_holder(pid)
            .or_else(|| self.holder_slow(pid, register))
    }

    #[cold]
    fn holder_slow(&self, pid: u64, register: bool) -> Option<u8> {
        use std::sync::atomic::Ordering as O;
        let me = Identity::current();
        let st = self.state();
        let _serial = super::ident::REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let h = if register {
            match st.register(pid, &me) {
                Some(h) => h,
                // The table is full: if the holder is dead, vacate its claim so that its
                // slot is free, and try once more (a dead holder never wedges the lease).
                None if st.vacate_dead_holder() => st.register(pid, &me)?,
                None => return None,
            }
        } else {
            st.lookup(pid, &me)?
        };
        // Pin the slot for this handle's lifetime, so this process never frees a slot a
        // handle may still use (a forked child's pins are its parent's: start afresh).
        let mut pinned = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let filled_by = self.cache.load(O::Acquire) >> 41;
        if filled_by != u64::from(me.pid) && filled_by != 0 {
            *pinned = 0;
        }
        let bit = 1u64 << (h - 1);
        if *pinned & bit == 0 {
            st.pin(h);
            *pinned |= bit;
        }
        if u64::from(me.pid) < 1 << 23 {
            self.cache.store(
                u64::from(me.pid) << 41 | (pid & PID_WORD_MASK) << 8 | u64::from(h),
                O::Release,
            );
        }
        Some(h)
    }

    /// Claims through the protocol with the OS-identity judge, and records the claim.
    #[inline]
    fn claim_now(&self, my_pid: u32, grace: u64, write: bool) -> Option<Granted> {
        let holder = self.holder(my_pid, true)?;
        let me = Claimant {
            holder,
            pid: my_pid,
            private: false,
        };
        self.claim_as(me, grace, write)
    }

    /// One claim attempt for `me`.
    #[inline]
    pub(super) fn claim_as(&self, me: Claimant, grace: u64, write: bool) -> Option<Granted> {
        let g = self.state().try_claim(
            self.policy(),
            me,
            grace,
            self.now(),
            |s: &LeaseState, w| s.holder_liveness(w),
            write,
        );
        if let Some(g) = &g {
            self.note_grant(g);
        }
        g
    }

    #[inline]
    fn note_grant(&self, g: &Granted) {
        if self.observed() {
            self.note_grant_slow(g);
        }
    }

    #[cold]
    fn note_grant_slow(&self, g: &Granted) {
        let generation = self.state().full_generation(g.word);
        let op = match g.reason {
            None => return,
            Some(ClaimReason::Vacant) => OpCode::LeaseClaimVacant,
            Some(ClaimReason::Preempt) => OpCode::LeaseClaimPreempt,
            Some(ClaimReason::Stale) => OpCode::LeaseClaimStale,
            Some(ClaimReason::Dead) => OpCode::LeaseClaimDeadOwner,
        };
        self.note_slow(op, 0, generation);
        if g.torn {
            self.note_slow(OpCode::LeaseTornRecovered, 0, generation);
        }
    }

    /// Seed API: claims the lease for `my_pid` if it is vacant, held by a higher pid
    /// (with [`Preemption::LowerPid`]), stale by more than `grace` epochs, or held by a
    /// process that no longer exists. Idempotent for the current holder (the same `pid`
    /// claimed through this process). PID 0 is refused, and so is a claim when the
    /// file's identity table has no free slot (64 slots; one per process and pid).
    #[inline]
    pub fn try_acquire(&self, my_pid: u32, grace: u64) -> bool {
        self.claim_now(my_pid, grace, false).is_some()
    }

    /// Like [`try_acquire`](Self::try_acquire), returning the fenced claim.
    #[inline]
    pub fn try_claim(&self, my_pid: u32, grace: u64) -> Option<LeaseClaim> {
        self.claim_now(my_pid, grace, false)
            .map(|g| self.state().claim_for(g.word, g.torn, my_proc()))
    }

    /// Blocks until the lease is claimed for `my_pid` or `timeout` passes. The waiter
    /// spins briefly, then sleeps in the kernel (futex on the file) and is woken by a
    /// release; while asleep it re-checks every 2 ms (every 25 ms while a death-watcher
    /// thread holds a pidfd of the holder and wakes it when the holder's process exits)
    /// for a stale heartbeat or a dead holder, so a crashed holder is replaced promptly.
    pub fn acquire(&self, my_pid: u32, grace: u64, timeout: Duration) -> Option<LeaseClaim> {
        let holder = self.holder_waiting(pid_word(my_pid, false), timeout)?;
        let me = Claimant {
            holder,
            pid: my_pid,
            private: false,
        };
        self.acquire_as(me, grace, timeout)
            .map(|g| self.state().claim_for(g.word, g.torn, my_proc()))
    }

    /// The holder value for `pid`, waiting up to `timeout` for a free identity slot when
    /// the table is full (every slot held by a live process).
    pub(super) fn holder_waiting(&self, pid: u64, timeout: Duration) -> Option<u8> {
        if let Some(h) = self.holder_as(pid, true) {
            return Some(h);
        }
        if pid as u32 == 0 {
            return None;
        }
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            std::thread::sleep(left.map_or(SLOT_POLL, |l| l.min(SLOT_POLL)));
            if let Some(h) = self.holder_as(pid, true) {
                return Some(h);
            }
        }
    }

    /// The blocking claim behind [`acquire`](Self::acquire) and the guards' `lock`.
    pub(super) fn acquire_as(
        &self,
        me: Claimant,
        grace: u64,
        timeout: Duration,
    ) -> Option<Granted> {
        // First attempt without an OS check: the slow path checks holder death cheaply.
        let first = self.state().try_claim(
            self.policy(),
            me,
            grace,
            self.now(),
            |_: &LeaseState, _| Liveness::Unknown,
            false,
        );
        if let Some(g) = first {
            self.note_grant(&g);
            return Some(g);
        }
        self.acquire_slow(me, grace, timeout)
    }

    #[cold]
    fn acquire_slow(&self, me: Claimant, grace: u64, timeout: Duration) -> Option<Granted> {
        let st = self.state();
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        // Spin first, without OS checks: the shared strategy's budget (a time), or the
        // default number of attempts.
        let budget = st.handshake.spin_budget();
        let mut spins = 0u32;
        loop {
            let keep_spinning = match budget {
                None => spins < SPIN_BEFORE_PARK,
                Some(b) => spins % 16 != 0 || started.elapsed() < b,
            };
            if !keep_spinning {
                break;
            }
            spins += 1;
            std::hint::spin_loop();
            let got = st.try_claim(
                self.policy(),
                me,
                grace,
                self.now(),
                |_: &LeaseState, _| Liveness::Unknown,
                false,
            );
            if let Some(g) = got {
                self.note_grant(&g);
                self.note(
                    OpCode::LeaseBlockedWait,
                    sidecar_flags::WAIT_SPUN,
                    started.elapsed().as_nanos() as u64,
                );
                return Some(g);
            }
        }
        st.bump(counter::BLOCKED_WAITS, 1);
        let mut watch = super::os::CachedWatch::default();
        std::thread::scope(|scope| {
            let mut watcher: Option<DeathWatcher<'_>> = None;
            let mut naps = 0u32;
            let result = loop {
                st.waiters.fetch_add(1, Ordering::SeqCst);
                // SYNC: waiters. Pairs with the SeqCst release CAS + waiters load in
                // `wake_waiters`: either the releaser sees us or we see its release.
                fence(Ordering::SeqCst);
                let seq = st.wake.load(Ordering::SeqCst);
                // One OS check per wake-up after the first sleep (a quick handoff pays
                // none).
                let check_os = naps > 0;
                let got = st.try_claim(
                    self.policy(),
                    me,
                    grace,
                    self.now(),
                    |s: &LeaseState, w| match s.holder_identity(w) {
                        Some(id) if check_os => watch.liveness(&id),
                        _ => Liveness::Unknown,
                    },
                    false,
                );
                let mut timed_out = false;
                if got.is_none() {
                    // A short first sleep needs no watcher thread (most handoffs end within
                    // it); a longer wait gets one, and then sleeps long.
                    let watched = naps > 0 && Self::ensure_watcher(scope, st, &mut watcher);
                    let nap = if watched {
                        WATCHED_POLL
                    } else if naps == 0 {
                        FIRST_NAP
                    } else {
                        BLOCKED_POLL
                    };
                    naps += 1;
                    match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
                        Some(Duration::ZERO) => timed_out = true,
                        rem => crate::futex::wait(&st.wake, seq, rem.map_or(nap, |r| r.min(nap))),
                    }
                }
                st.waiters.fetch_sub(1, Ordering::SeqCst);
                if got.is_some() || timed_out {
                    break (got, timed_out);
                }
            };
            if let Some(w) = watcher.take() {
                w.stop();
            }
            let (got, timed_out) = result;
            let waited = started.elapsed().as_nanos() as u64;
            st.bump(counter::BLOCKED_NS, waited);
            let mut flags = sidecar_flags::WAIT_PARKED;
            if timed_out {
                st.bump(counter::TIMEOUTS, 1);
                flags |= sidecar_flags::WAIT_TIMED_OUT;
            }
            if let Some(g) = &got {
                self.note_grant(g);
            }
            self.note(OpCode::LeaseBlockedWait, flags, waited);
            got
        })
    }

    /// Makes sure a death watcher covers the current holder (restarting it after a
    /// handover). Returns whether one does; without one the waiter polls more often.
    fn ensure_watcher<'scope, 'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        st: &'env LeaseState,
        watcher: &mut Option<DeathWatcher<'scope>>,
    ) -> bool {
        let cur = st.word();
        if cur.is_vacant() {
            return false;
        }
        if watcher.as_ref().is_some_and(|w| w.id == cur.id()) {
            return true;
        }
        if let Some(w) = watcher.take() {
            w.stop();
        }
        let Some(ident) = st.holder_identity(cur) else {
            return false;
        };
        *watcher = DeathWatcher::spawn(scope, st, cur.id(), ident);
        watcher.is_some()
    }

    /// Whether `word` is a claim made by this process for `pid` (no registration).
    #[inline]
    fn held_as(&self, word: Word, pid: u32) -> bool {
        !word.is_vacant() && self.holder(pid, false) == Some(word.holder())
    }

    /// Seed API: releases the lease if `my_pid` holds it (claimed through this process).
    /// Any thread of the process may release it, also while a sibling thread is writing
    /// under the same pid: that write then fails and is never published.
    #[inline]
    pub fn release(&self, my_pid: u32) -> bool {
        let cur = self.state().word();
        if !self.held_as(cur, my_pid) {
            return false;
        }
        let ok = self.state().release_from(cur.id(), cur, false);
        self.note(OpCode::LeaseRelease, 0, u64::from(ok));
        ok
    }

    /// Releases `claim` if it is still the current claim; a stale claim never clears a
    /// newer one. Only the process that made the claim can use it (`false` in a forked
    /// child, or for a token of another process's claim from `current_claim`).
    #[inline]
    pub fn release_claim(&self, claim: &LeaseClaim) -> bool {
        let ok = claim.proc == my_proc() && self.state().release_id(claim.id);
        self.note(
            if ok {
                OpCode::LeaseRelease
            } else {
                OpCode::LeaseLossDetected
            },
            0,
            claim.generation,
        );
        ok
    }

    /// Seed API: claims the lease (as [`try_acquire`](Self::try_acquire)), runs `f` on a
    /// copy of the payload, publishes the result and releases, in two atomic steps. If
    /// `my_pid` already held the lease it stays held. Returns `None` if the lease could
    /// not be claimed, or if the claim was lost while `f` ran — then nothing is published,
    /// ever: a claim superseded or released while `f` runs cannot publish, and its
    /// staging buffer stays in quarantine until this call returns. If `f` panics nothing
    /// is published and the lease is released.
    pub fn with_lease<R>(&self, my_pid: u32, grace: u64, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let st = self.state();
        let claimed = self.claim_now(my_pid, grace, true);
        match claimed {
            Some(Granted { word, .. }) => {
                let word = Word(word);
                // We hold the new claim with WRITE set: nobody else writes our staging
                // buffer or republishes.
                let mut guard = AbortOnUnwind {
                    state: st,
                    word,
                    armed: true,
                };
                let mut value: T = from_words(&st.read_published(word))?;
                let r = f(&mut value);
                st.fill(word, &to_words(&value), words_for::<T>());
                guard.armed = false;
                st.publish(word, true).then_some(r)
            }
            None => {
                let cur = st.word();
                if !self.held_as(cur, my_pid) {
                    return None;
                }
                let claim = st.claim_for(cur.0, false, my_proc());
                let mut value = self.read_claimed(&claim)?;
                let r = f(&mut value);
                self.write_claimed(&claim, value).then_some(r)
            }
        }
    }

    /// Seed API: the payload, if `my_pid` holds the lease (claimed through this process).
    #[inline]
    pub fn read_as_owner(&self, my_pid: u32) -> Option<T> {
        let holder = self.holder(my_pid, false)?;
        let words = self
            .state()
            .read_if(words_for::<T>(), |w| w.holder() == holder)?;
        from_words(&words)
    }

    /// The payload, if `claim` is still current (and this process made it).
    #[inline]
    pub fn read_claimed(&self, claim: &LeaseClaim) -> Option<T> {
        if claim.proc != my_proc() {
            return None;
        }
        let words = self
            .state()
            .read_if(words_for::<T>(), |w| w.id() == claim.id)?;
        from_words(&words)
    }

    /// Seed API: writes the payload if `my_pid` holds the lease. The ownership check and
    /// the publication are one atomic step: a holder that was superseded never publishes.
    #[inline]
    pub fn write_as_owner(&self, my_pid: u32, value: T) -> bool {
        let Some(holder) = self.holder(my_pid, false) else {
            return false;
        };
        self.state()
            .write_if(&to_words(&value), words_for::<T>(), |w| {
                w.holder() == holder
            })
            .is_ok()
    }

    /// Writes the payload if `claim` is still current and this process made it (fenced).
    /// `false` also when every
    /// payload buffer is held in quarantine by stalled writers of earlier claims
    /// (counter `no_buffer`; see `docs/owner-lease.md`).
    #[inline]
    pub fn write_claimed(&self, claim: &LeaseClaim, value: T) -> bool {
        if claim.proc != my_proc() {
            return false;
        }
        let r = self
            .state()
            .write_if(&to_words(&value), words_for::<T>(), |w| w.id() == claim.id);
        if r == Err(WriteRefused::Lost) {
            self.note(OpCode::LeaseStaleWriteRejected, 0, claim.generation);
        }
        r.is_ok()
    }

    /// Seed API: refreshes the heartbeat if `my_pid` holds the lease; `false` means the
    /// lease was lost (preempted or taken over).
    #[inline]
    pub fn beat(&self, my_pid: u32) -> bool {
        let Some(holder) = self.holder(my_pid, false) else {
            return false;
        };
        self.state().beat_if(self.now(), |w| w.holder() == holder)
    }

    /// Refreshes the heartbeat if `claim` is still current (and this process made it).
    #[inline]
    pub fn beat_claimed(&self, claim: &LeaseClaim) -> bool {
        let ok =
            claim.proc == my_proc() && self.state().beat_if(self.now(), |w| w.id() == claim.id);
        if !ok {
            self.note(OpCode::LeaseLossDetected, 0, claim.generation);
        }
        ok
    }

    /// Whether `claim` is the current claim.
    #[inline]
    pub fn is_current(&self, claim: &LeaseClaim) -> bool {
        let st = self.state();
        let w = st.word();
        w.id() == claim.id && !w.is_vacant() && st.term.load(Ordering::Acquire) <= claim.generation
    }

    /// Seed API: advances the file's epoch counter by one and returns the new epoch.
    #[inline]
    pub fn tick_epoch(&self) -> u64 {
        self.clock.tick(&self.state().epoch)
    }

    /// The current epoch (manual counter, or clock ticks plus the counter).
    #[inline]
    pub fn current_epoch(&self) -> u64 {
        self.now()
    }

    /// Seed API: the pid the current claim was made for, `None` when vacant.
    #[inline]
    pub fn current_owner(&self) -> Option<u32> {
        self.current_owner_raw()
    }

    /// The current claim, `None` when vacant.
    pub fn current_claim(&self) -> Option<LeaseClaim> {
        let st = self.state();
        let cur = st.word();
        (!cur.is_vacant()).then(|| {
            let torn = st.torn.load(Ordering::Acquire) == cur.id();
            let proc = st.holder_identity(cur).map_or(0, |id| id.pid);
            st.claim_for(cur.0, torn, proc)
        })
    }

    /// Seed API: whether `my_pid`, claimed through this process, holds the lease (one
    /// atomic load and a compare, after the first call for `my_pid`).
    #[inline]
    pub fn am_i_owner(&self, my_pid: u32) -> bool {
        self.held_as(self.state().word(), my_pid)
    }

    /// Seed API: the generation of the current (or last) claim; it increases by one on
    /// every handover.
    #[inline]
    pub fn lease_term(&self) -> u64 {
        let st = self.state();
        st.full_generation(st.claim.load(Ordering::Acquire))
    }

    /// Whether the current holder inherited an interrupted update and has not yet written.
    pub fn payload_torn(&self) -> bool {
        self.state().torn_pending()
    }

    /// The epoch source stored in the file.
    pub fn epoch_mode(&self) -> EpochMode {
        self.clock.mode()
    }

    /// The preemption policy stored in the file.
    pub fn preemption(&self) -> Preemption {
        self.preemption
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// A diagnostic snapshot (fields are read one by one, not as one atomic unit).
    pub fn status(&self) -> LeaseStatus {
        let st = self.state();
        let cur = st.word();
        LeaseStatus {
            owner: self.current_owner(),
            generation: st.full_generation(cur.0),
            owner_start: st
                .holder_identity(cur)
                .map(|i| i.unique)
                .filter(|u| *u != 0),
            writing: cur.writing(),
            torn: st.torn_pending(),
            heartbeat_epoch: st.heartbeat.load(Ordering::Acquire),
            epoch: self.now(),
            epoch_mode: self.clock.mode(),
            preemption: self.preemption,
            waiters: st.waiters.load(Ordering::Relaxed),
            counters: std::array::from_fn(|i| st.counters[i].load(Ordering::Relaxed)),
            payload_words: st.read_published_consistent(),
            payload_type: self.map.info().layout.payload,
            strategy: st.handshake.current(),
            recent: st.ring.snapshot(),
        }
    }
}

impl<T> OwnerLease<T> {
    fn current_owner_raw(&self) -> Option<u32> {
        let st = self.map.head();
        let w = st.word();
        (!w.is_vacant()).then(|| st.holder_pid(w))
    }
}

impl<T> AdaptiveInstance for OwnerLease<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + 'static,
{
    fn kind(&self) -> Kind {
        Kind::Lease
    }

    fn name(&self) -> String {
        self.map.path().display().to_string()
    }

    fn ring(&self) -> &ObservationRing {
        &self.state().ring
    }

    fn handshake(&self) -> &HandshakeHeader {
        &self.state().handshake
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        counter_values(&counter::NAMES, &self.state().counters)
    }

    fn set_observed(&self, observed: bool) {
        self.observed
            .store(observed, std::sync::atomic::Ordering::Relaxed);
    }
}

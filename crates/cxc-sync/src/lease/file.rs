//! The mapped-file lease: [`OwnerLease<T>`].

use std::marker::PhantomData;
use std::path::Path;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use cxc_mmf::{
    CreateOptions, Expect, FileSpec, Kind, Layout, Mapped, MmfError, Origin, TypeFingerprint,
};
use cxc_sidecar::OpCode;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::{GuardSettings, LeaseError, LeaseOptions, Preemption};
use super::slot::pid_word;
use super::os::Identity;
use super::state::{
    ClaimReason, Claimant, Granted, LeaseState, PAYLOAD_BYTES, PAYLOAD_WORDS, Policy,
};
use super::word::Word;
use crate::epoch::{EpochClock, EpochMode};
use crate::primitive::Ordering;

/// This process's pid (cached; a forked child's is its own).
#[inline]
pub(super) fn my_proc() -> u32 {
    cxc_mmf::identity::current_proc()
}

/// The pid word (a pid, and the guard flag) as kept in the handle's cache.
const PID_WORD_MASK: u64 = (1 << 33) - 1;

/// Size of the lease's fixed block in the file.
const HEAD_SIZE: u32 = size_of::<LeaseState>() as u32;

/// Lease files, described once for `create`, `open` and `inspect`.
pub(super) static FILE: FileSpec = FileSpec {
    kind: Kind::Lease,
    head_size: HEAD_SIZE,
    slot_size: 0,
    max_capacity: 0,
    check_params,
};
/// How often a claimant waiting for a free identity slot looks again.
pub(crate) const SLOT_POLL: Duration = Duration::from_millis(5);
/// The longest interval between those looks: a claimant that keeps finding the table
/// full looks again after 5, 10, 20 ... ms, then every 100 ms (each look checks whether
/// the process behind each slot lives, some hundreds of µs of CPU).
pub(crate) const SLOT_POLL_MAX: Duration = Duration::from_millis(100);

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
    pub(super) map: Mapped<LeaseState>,
    pub(super) clock: EpochClock,
    pub(super) preemption: Preemption,
    /// Whether a `SidecarBox` observes this handle (then transitions are recorded).
    pub(super) observed: cxc_sidecar::Observed,
    /// The last claimants registered through this handle, each `process pid << 41 | pid
    /// word << 8 | holder`, valid while the process pid is this process's (a forked
    /// child's differs).
    pub(super) cache: [AtomicU64; 4],
    /// The claim word as this handle last left it (the claim it made, or the vacant word
    /// its release left): the guess that the fast paths' CAS expects instead of loading
    /// the word first (a wrong guess costs a failed CAS, whose result they go on from).
    pub(super) hot: AtomicU64,
    /// The process that pinned, and the identity slots it pinned (bit `holder - 1`),
    /// unpinned on drop (a forked child's copy pinned nothing).
    /// Changed only under [`REGISTRY`](super::ident::REGISTRY) (plain atomics, not a
    /// mutex that a fork could leave locked).
    pub(super) pinned_by: std::sync::atomic::AtomicU32,
    pub(super) pinned: std::sync::atomic::AtomicU64,
    /// The identity slots whose entries this handle put on the process's sentinel list
    /// (`sentinel.rs`; bit `holder - 1`), unlinked on drop before the mapping goes.
    /// Changed only under `REGISTRY`, by the process in `pinned_by`.
    pub(super) linked: std::sync::atomic::AtomicU64,
    /// The death watcher of blocked `acquire`s (one thread, kept between waits; stopped
    /// and joined at the latest in `drop`, before the mapping it reads is unmapped).
    pub(super) watch: super::watch::Watch,
    /// Whether this handle's blocked waits spin first (their recent length).
    pub(super) spin: crate::park::SpinGauge,
    /// Guards' settings: the grace in epochs and the pid their slot names.
    pub(super) guard: GuardSettings,
    pub(super) _payload: PhantomData<fn() -> T>,
}

impl<T> Drop for OwnerLease<T> {
    fn drop(&mut self) {
        // First: the watcher threads read the mapping, which the fields' drops unmap; so
        // may this process's async reactor (groups of leaked futures).
        self.watch.join_all();
        #[cfg(all(feature = "async", not(cxc_loom)))]
        crate::asyncs::forget_words(&[std::ptr::from_ref(&self.map.head().wake) as usize]);
        let (by, pinned) = (*self.pinned_by.get_mut(), *self.pinned.get_mut());
        if pinned == 0 || by != cxc_mmf::identity::current_proc() {
            return;
        }
        let me = Identity::current();
        let linked = *self.linked.get_mut();
        let _serial = super::ident::REGISTRY.lock();
        for i in 0..64u8 {
            if linked & (1 << i) != 0 {
                self.map.head().disarm_sentinel(i + 1);
            }
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

/// A `T` fits a payload buffer (48 bytes, alignment at most 8).
fn check_payload<T>() -> Result<(), LeaseError> {
    Ok(crate::payload::check_fit::<T>(PAYLOAD_BYTES)?)
}

pub(super) use crate::payload::{from_words, to_words, words_of as words_for};

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
        Ok(FILE.layout(
            0,
            TypeFingerprint::of::<T>(),
            [opts.preemption.code(), mode, tick, 0],
        ))
    }

    fn create_options(opts: &LeaseOptions) -> CreateOptions {
        CreateOptions {
            mode: opts.mode,
            init_timeout: opts.init_timeout,
        }
    }

    pub(super) fn expect() -> Expect<'static> {
        FILE.expect(Some(0), TypeFingerprint::of::<T>())
    }

    fn init(state: &LeaseState, initial: &T) {
        for (dst, w) in state.bufs[0].words.iter().zip(to_words::<T, PAYLOAD_WORDS>(initial)) {
            dst.store(w, Ordering::Relaxed);
        }
    }

    fn from_map(map: Mapped<LeaseState>) -> Self {
        // Identity slots are registered on the first claim (see `ident.rs`).
        Self::from_map_unregistered(map)
    }

    pub(super) fn from_map_unregistered(map: Mapped<LeaseState>) -> Self {
        let p = map.info().layout.params;
        // Validated by `check_params` (open) or built from valid options (create).
        let epoch = EpochMode::decode(p[1], p[2]).unwrap_or_default();
        let preemption = Preemption::from_code(p[0]).unwrap_or_default();
        OwnerLease {
            map,
            clock: EpochClock::new(epoch),
            preemption,
            observed: cxc_sidecar::Observed::new(),
            cache: std::array::from_fn(|_| AtomicU64::new(0)),
            hot: AtomicU64::new(0),
            spin: crate::park::SpinGauge::new(),
            pinned_by: std::sync::atomic::AtomicU32::new(0),
            pinned: std::sync::atomic::AtomicU64::new(0),
            linked: std::sync::atomic::AtomicU64::new(0),
            watch: super::watch::Watch::default(),
            guard: GuardSettings::for_mode(epoch),
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
    pub(super) fn policy(&self) -> Policy {
        Policy {
            preempt_lower: self.preemption == Preemption::LowerPid,
        }
    }

    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.clock.now(&self.state().epoch)
    }

    /// Whether the handle's first cache entry says this process uses holder value
    /// `holder` for `pid` (one load of the entry, one of the process's cached pid).
    #[inline(always)]
    pub(super) fn cache_hit(&self, pid: u32, holder: u8) -> bool {
        let me = u64::from(cxc_mmf::identity::current_proc());
        let want = me << 41 | u64::from(pid) << 8 | u64::from(holder);
        self.cache[0].load(std::sync::atomic::Ordering::Acquire) == want
    }

    /// The identity-table holder value this process (`proc`, its pid) uses for `pid`, from
    /// the handle's cache. `None` on a miss (another pid, never registered, or a forked
    /// child).
    #[inline]
    fn cached_holder_in(&self, proc: u32, pid: u64) -> Option<u8> {
        // One word: `process pid << 41 | pid word << 8 | holder`. Keyed by this process's
        // pid (cached in a wipe-on-fork page, no system call): a forked child has another
        // pid, so it misses and registers its own slot. Linux pids fit in 22 bits.
        let me = u64::from(proc);
        let want = me << 41 | (pid & PID_WORD_MASK) << 8;
        // The first entry is the hot one (a handle used for one pid); the rest are
        // looked at only on a miss.
        let c = self.cache[0].load(std::sync::atomic::Ordering::Acquire);
        if c & !0xFF == want && c & 0xFF != 0 {
            return Some(c as u8);
        }
        self.cached_holder_rest(want)
    }

    #[cold]
    #[inline(never)]
    fn cached_holder_rest(&self, want: u64) -> Option<u8> {
        self.cache[1..].iter().find_map(|e| {
            let c = e.load(std::sync::atomic::Ordering::Acquire);
            (c & !0xFF == want && c & 0xFF != 0).then_some(c as u8)
        })
    }

    /// The holder value for `pid`, registering a slot of the identity table if
    /// `register` (claims) or only looking one up (operations of a holder).
    #[inline]
    pub(super) fn holder(&self, pid: u32, register: bool) -> Option<u8> {
        self.holder_as(pid_word(pid, false), register)
    }

    /// As [`holder`](Self::holder) for a slot pid word (a pid, or a guard's slot).
    #[inline]
    pub(super) fn holder_as(&self, pid: u64, register: bool) -> Option<u8> {
        self.holder_as_in(cxc_mmf::identity::current_proc(), pid, register)
    }

    /// [`holder_as`](Self::holder_as) for a caller that already has this process's pid,
    /// `proc`.
    #[inline]
    pub(super) fn holder_as_in(&self, proc: u32, pid: u64, register: bool) -> Option<u8> {
        if pid as u32 == 0 {
            return None;
        }
        self.cached_holder_in(proc, pid)
            .or_else(|| self.holder_slow(pid, register))
    }

    #[cold]
    fn holder_slow(&self, pid: u64, register: bool) -> Option<u8> {
        use std::sync::atomic::Ordering as O;
        // No slot while this process's identity cannot be read whole (out of
        // descriptors): one recorded partial could never be judged dead. The next use
        // tries again.
        let me = cxc_mmf::identity::identify().ok()?;
        let st = self.state();
        let _serial = super::ident::REGISTRY.lock();
        let h = if register {
            match st.register(pid, &me) {
                Some(h) => h,
                // The table is full. A dead process never wedges the lease: vacate the
                // current claim if its holder is dead, and free the quarantined buffers
                // of superseded writers that are gone (a quarantine record keeps the
                // writer's slot referenced), so their slots are free; then try once more.
                None => {
                    st.vacate_dead_holder();
                    st.reap_quarantine();
                    st.register(pid, &me)?
                }
            }
        } else {
            st.lookup(pid, &me)?
        };
        // Pin the slot for this handle's lifetime, so this process never frees a slot a
        // handle may still use (a forked child's pins are its parent's: start afresh).
        let proc = cxc_mmf::identity::current_proc();
        if self.pinned_by.load(O::Relaxed) != proc {
            self.pinned_by.store(proc, O::Relaxed);
            self.pinned.store(0, O::Relaxed);
            self.linked.store(0, O::Relaxed);
        }
        let bit = 1u64 << (h - 1);
        if self.pinned.load(O::Relaxed) & bit == 0 {
            st.pin(h);
            self.pinned.fetch_or(bit, O::Relaxed);
        }
        if self.linked.load(O::Relaxed) & bit == 0 && st.arm_sentinel(h) {
            self.linked.fetch_or(bit, O::Relaxed);
        }
        // Not cached while this process could not start its sentinel thread yet (a
        // passing thread shortage): the next use comes here again and arms the slot
        // once the thread runs, instead of going without a sentinel for the handle's life.
        if u64::from(proc) < 1 << 23 && !super::sentinel_start_pending() {
            let entry = u64::from(proc) << 41 | (pid & PID_WORD_MASK) << 8 | u64::from(h);
            // The first free or stale entry, else the last (the first entries stay hot).
            let i = self
                .cache
                .iter()
                .position(|e| e.load(O::Acquire) >> 41 != u64::from(proc))
                .unwrap_or(self.cache.len() - 1);
            self.cache[i].store(entry, O::Release);
        }
        Some(h)
    }

    /// Claims through the protocol with the OS-identity judge, and records the claim.
    #[inline]
    pub(super) fn claim_now(&self, my_pid: u32, grace: u64, write: bool) -> Option<Granted> {
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
            Word(self.hot.load(Ordering::Relaxed)),
            self.policy(),
            me,
            grace,
            self.now(),
            |s: &LeaseState, w| s.holder_liveness(w),
            write,
        );
        if let Some(g) = &g {
            self.hot.store(g.word, Ordering::Relaxed);
            self.note_grant(g);
        }
        g
    }

    #[inline]
    pub(super) fn note_grant(&self, g: &Granted) {
        if self.observed.get() {
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
            // An exiting holder is taken over as stale (counter `claim_exiting` tells).
            Some(ClaimReason::Stale | ClaimReason::Exiting) => OpCode::LeaseClaimStale,
            Some(ClaimReason::Dead) => OpCode::LeaseClaimDeadOwner,
        };
        self.state().ring.record(op, 0, generation);
        if g.torn {
            self.state()
                .ring
                .record(OpCode::LeaseTornRecovered, 0, generation);
        }
    }
}

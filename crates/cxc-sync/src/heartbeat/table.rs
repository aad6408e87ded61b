//! [`HeartbeatTable`]: the mapped file and the worker-side API.

use std::path::Path;
use std::sync::atomic::AtomicU64 as LocalU64;

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};

use super::error::HeartbeatError;
use super::layout::*;
use super::slot::{Claim, ClaimRule, HeartbeatSnapshot};
use crate::epoch::{EpochClock, EpochMode};
use crate::liveness::{self, Identity, Liveness};
use crate::primitive::Ordering;
use cxc_sidecar::Instrumented;

/// Version of the slot layout and protocol, stored in header parameter 2. Version 2
/// records the registered process's full [`Identity`] in each slot (version 1 kept a
/// 40-bit start time); files of another version are refused.
pub(crate) const PROTOCOL_VERSION: u64 = 2;
pub(super) const HEAD_SIZE: u32 = size_of::<HeartbeatHead>() as u32;
pub(super) const SLOT_SIZE: u32 = size_of::<HeartbeatSlot>() as u32;

/// How [`HeartbeatTable::create_with`] makes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOptions {
    /// Where epochs come from (default [`EpochMode::Manual`], as in the seed).
    pub epoch: EpochMode,
    /// Permission bits of the file (default `0o600`).
    pub mode: u32,
}

impl Default for HeartbeatOptions {
    fn default() -> Self {
        HeartbeatOptions {
            epoch: EpochMode::Manual,
            mode: 0o600,
        }
    }
}

/// A table of worker heartbeats in a mapped file: one slot per registered worker with its
/// pid, generation, last-seen epoch and a 64-bit in-flight bitmap.
///
/// Workers `register`, `beat` and `mark_in_flight`/`clear_in_flight` the work units they
/// hold; a [`FailoverWatchdog`](crate::FailoverWatchdog) (in any process) reports and
/// reclaims the units of workers that stopped beating or died. Every slot index and bit is
/// bounds-checked: out-of-range calls return `false`/`None`.
///
/// A handle remembers which registrations it made, so `beat`/`mark_in_flight`/
/// `clear_in_flight`/`unregister` act only for the registration this handle made at that
/// slot (or, for a slot this handle did not register, a live registration of this very
/// process's pid). Once that registration is fenced by a watchdog they return `false`.
///
/// # Examples
/// ```
/// use cxc_sync::{FailoverWatchdog, HeartbeatTable};
/// # fn main() -> Result<(), cxc_sync::HeartbeatError> {
/// let dir = tempfile::tempdir().unwrap();
/// let table = HeartbeatTable::create(dir.path().join("hb.cxc"), 8)?;
/// let slot = table.register(std::process::id())?;
/// assert!(table.mark_in_flight(slot, 5));
/// assert!(table.beat(slot));
/// let watchdog = FailoverWatchdog::with_grace(&table, 3);
/// assert!(watchdog.scan().dead_slots.is_empty());
/// # Ok(())
/// # }
/// ```
pub struct HeartbeatTable {
    map: Mapped<HeartbeatHead, HeartbeatSlot>,
    clock: EpochClock,
    /// Owner words of the registrations made through this handle (0: none), per slot.
    /// Valid only in the process whose lineage token (`current_proc`) is `mine_pid` (a
    /// child made by `fork` starts afresh).
    mine: Box<[LocalU64]>,
    /// The process that made the registrations in `mine`.
    mine_pid: std::sync::atomic::AtomicU32,
    /// Whether a `SidecarBox` observes this handle (then transitions are recorded).
    observed: cxc_sidecar::Observed,
}

impl std::fmt::Debug for HeartbeatTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeartbeatTable")
            .field("path", &self.map.path())
            .field("capacity", &self.capacity())
            .field("epoch", &self.clock.mode())
            .finish()
    }
}

pub(super) fn check_params(p: &[u64; 4]) -> Result<(), MmfError> {
    if EpochMode::decode(p[0], p[1]).is_none() {
        return Err(MmfError::ParamMismatch {
            name: "epoch_mode",
            expected: "0 (manual, tick 0) or 1 (clock, tick 1 us..=1 day)".into(),
            found: p[0],
        });
    }
    if p[2] != PROTOCOL_VERSION {
        return Err(MmfError::ParamMismatch {
            name: "heartbeat_protocol",
            expected: format!(
                "{PROTOCOL_VERSION} (this build reads heartbeat format version \
                 {PROTOCOL_VERSION} only; the file has version {})",
                p[2]
            ),
            found: p[2],
        });
    }
    if p[3] != 0 {
        return Err(MmfError::ParamMismatch {
            name: "reserved_param",
            expected: "0".into(),
            found: p[3],
        });
    }
    Ok(())
}

/// What an opener of a heartbeat file of `capacity` slots (`None`: any) expects.
pub(super) fn expect(capacity: Option<u64>) -> Expect<'static> {
    Expect {
        kind: Kind::Heartbeat,
        head_size: HEAD_SIZE,
        slot_size: SLOT_SIZE,
        capacity,
        max_capacity: MAX_CAPACITY as u64,
        payload: TypeFingerprint::NONE,
        check_params: &check_params,
    }
}

/// Refuses a file without slots (the format allows none; a table needs one).
pub(super) fn check_not_empty(layout: &Layout) -> Result<(), HeartbeatError> {
    if layout.capacity == 0 {
        return Err(MmfError::ParamMismatch {
            name: "capacity",
            expected: format!("1..={MAX_CAPACITY}"),
            found: 0,
        }
        .into());
    }
    Ok(())
}

fn check_capacity(capacity: usize) -> Result<(), HeartbeatError> {
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(HeartbeatError::InvalidCapacity {
            requested: capacity,
            max: MAX_CAPACITY,
        });
    }
    Ok(())
}

impl HeartbeatTable {
    /// Creates a table of `capacity` slots (1..=65536) with manual epochs and mode 0600.
    ///
    /// # Errors
    /// [`HeartbeatError::InvalidCapacity`]; [`HeartbeatError::File`] if the file exists or
    /// cannot be written.
    pub fn create(path: impl AsRef<Path>, capacity: usize) -> Result<Self, HeartbeatError> {
        Self::create_with(path, capacity, &HeartbeatOptions::default())
    }

    /// Creates a table with explicit options (epoch mode, file mode).
    ///
    /// # Errors
    /// As [`HeartbeatTable::create`], plus [`HeartbeatError::InvalidEpochMode`].
    pub fn create_with(
        path: impl AsRef<Path>,
        capacity: usize,
        opts: &HeartbeatOptions,
    ) -> Result<Self, HeartbeatError> {
        check_capacity(capacity)?;
        if !opts.epoch.is_valid() {
            return Err(HeartbeatError::InvalidEpochMode(opts.epoch));
        }
        let (mode, tick) = opts.epoch.encode();
        let layout = Layout {
            kind: Kind::Heartbeat,
            head_size: HEAD_SIZE,
            slot_size: SLOT_SIZE,
            capacity: capacity as u64,
            payload: TypeFingerprint::NONE,
            params: [mode, tick, PROTOCOL_VERSION, 0],
        };
        let create = CreateOptions {
            mode: opts.mode,
            ..CreateOptions::default()
        };
        let map = Mapped::create(
            path,
            layout,
            &create,
            |_head: &HeartbeatHead, slots: &[HeartbeatSlot]| {
                // The file is zero-filled; close every slot's halves explicitly (generation 0
                // is never live, so zero would do, but the free state is spelled out here).
                for s in slots {
                    s.lo.store(half_word(fenced_tag(0), 0), Ordering::Relaxed);
                    s.hi.store(half_word(fenced_tag(0), 0), Ordering::Relaxed);
                }
            },
        )?;
        Ok(Self::from_map(map, opts.epoch))
    }

    /// Opens an existing table, which must have exactly `capacity` slots.
    ///
    /// # Errors
    /// [`HeartbeatError::InvalidCapacity`]; [`HeartbeatError::File`] with the mismatch
    /// (kind, capacity, epoch parameters, length, checksum, ...).
    pub fn open(path: impl AsRef<Path>, capacity: usize) -> Result<Self, HeartbeatError> {
        check_capacity(capacity)?;
        Self::open_inner(path.as_ref(), Some(capacity as u64))
    }

    /// Opens an existing table of any capacity (for tools such as `cxc inspect`).
    ///
    /// # Errors
    /// As [`HeartbeatTable::open`].
    pub fn open_any(path: impl AsRef<Path>) -> Result<Self, HeartbeatError> {
        Self::open_inner(path.as_ref(), None)
    }

    fn open_inner(path: &Path, capacity: Option<u64>) -> Result<Self, HeartbeatError> {
        let map: Mapped<HeartbeatHead, HeartbeatSlot> = Mapped::open(path, &expect(capacity))?;
        let layout = map.info().layout;
        check_not_empty(&layout)?;
        let epoch = EpochMode::decode(layout.params[0], layout.params[1])
            .expect("validated by check_params");
        Ok(Self::from_map(map, epoch))
    }

    fn from_map(map: Mapped<HeartbeatHead, HeartbeatSlot>, epoch: EpochMode) -> Self {
        let mine = (0..map.slots().len()).map(|_| LocalU64::new(0)).collect();
        HeartbeatTable {
            map,
            clock: EpochClock::new(epoch),
            mine,
            mine_pid: std::sync::atomic::AtomicU32::new(liveness::current_proc()),
            observed: cxc_sidecar::Observed::new(),
        }
    }

    /// Number of slots.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.map.slots().len()
    }

    /// The epoch mode recorded in the file.
    pub fn epoch_mode(&self) -> EpochMode {
        self.clock.mode()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// Advances the global epoch by one and returns the new epoch.
    pub fn tick_global_epoch(&self) -> u64 {
        self.clock.tick(&self.map.head().global_epoch)
    }

    /// The current global epoch.
    #[inline]
    pub fn global_epoch(&self) -> u64 {
        self.clock.now(&self.map.head().global_epoch)
    }

    /// The cumulative event counters, typed.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let table = cxc_sync::HeartbeatTable::create(dir.path().join("hb"), 4).unwrap();
    /// let slot = table.register(std::process::id()).unwrap();
    /// assert!(table.unregister(slot));
    /// let stats = table.stats();
    /// assert_eq!((stats.register, stats.unregister, stats.table_full), (1, 1, 0));
    /// let by_index = table.counters();
    /// assert_eq!(by_index[cxc_sync::heartbeat_counter::REGISTER], stats.register);
    /// ```
    pub fn stats(&self) -> HeartbeatStats {
        HeartbeatStats::read(&self.map.head().counters)
    }

    /// The cumulative event counters (indices in [`counter`]).
    pub fn counters(&self) -> [u64; counter::COUNT] {
        std::array::from_fn(|i| self.map.head().counters[i].load(Ordering::Relaxed))
    }

    /// Registers a worker and returns its slot. A free slot, a fenced (reclaimed) slot
    /// whose bits are gone, or a slot whose recorded process is dead by OS identity and
    /// holds no bits is taken.
    ///
    /// The slot records the [`Identity`] of the process `pid` names now (this process's
    /// own when `pid` is its pid, else looked up; unknown if `pid` names no process of our
    /// pid namespace), so watchdogs and later registrations can tell when it dies (the
    /// whole thread group; a reused pid is another process), and only that process (or
    /// this handle in this process) can act for the slot.
    ///
    /// # Errors
    /// [`HeartbeatError::InvalidPid`] for pid 0; [`HeartbeatError::TableFull`].
    pub fn register(&self, pid: u32) -> Result<usize, HeartbeatError> {
        if pid == 0 {
            return Err(HeartbeatError::InvalidPid);
        }
        let me = liveness::current_pid();
        let proc = liveness::current_proc();
        if self.mine_pid.load(std::sync::atomic::Ordering::Relaxed) != proc {
            // A child made by `fork` (or its descendant, even with this pid again): the
            // registrations of the parent are not ours.
            for m in self.mine.iter() {
                m.store(0, Ordering::Relaxed);
            }
            self.mine_pid
                .store(proc, std::sync::atomic::Ordering::Relaxed);
        }
        // This process's identity must be whole (a forked child short of descriptors
        // would record a partial one, which no watchdog could ever judge dead); it is
        // also what a lookup of another pid is made against.
        let mine = cxc_mmf::identity::identify_for(self.map.path())?;
        let identity = if pid == me {
            mine
        } else {
            Identity::of_pid(pid).unwrap_or_default()
        };
        let identity = Identity { pid, ..identity };
        let now = self.global_epoch();
        let is_dead = |id: &Identity| liveness::liveness(id) == Liveness::Dead;
        let rules = [ClaimRule::FreeOrFenced, ClaimRule::OsDead(&is_dead)];
        for (pass, rule) in rules.iter().enumerate() {
            for (i, slot) in self.map.slots().iter().enumerate() {
                if let Claim::Won { owner, reused } = slot.try_claim(pid, &identity, now, rule) {
                    self.mine[i].store(owner, Ordering::Relaxed);
                    self.bump(counter::REGISTER, 1);
                    self.note(cxc_sidecar::OpCode::HeartbeatRegister, 0, i as u64);
                    if pass == 1 {
                        self.bump(counter::REUSE_OS_DEAD, 1);
                    } else if reused {
                        self.bump(counter::REUSE_FENCED, 1);
                    }
                    return Ok(i);
                }
            }
        }
        self.bump(counter::TABLE_FULL, 1);
        Err(HeartbeatError::TableFull)
    }

    /// Unregisters the registration this handle made at `slot`. In-flight bits still set
    /// are left for the watchdog (the slot stays fenced until they are reclaimed); with no
    /// bits the slot is free at once. False if `slot` is out of range or not ours (any
    /// more).
    pub fn unregister(&self, slot: usize) -> bool {
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let expected = self.expected(slot);
        let ok = expected != 0 && s.release(expected);
        if let Some(m) = self.mine.get(slot) {
            m.store(0, Ordering::Relaxed);
        }
        if ok {
            self.bump(counter::UNREGISTER, 1);
            self.note(cxc_sidecar::OpCode::HeartbeatUnregister, 0, slot as u64);
        }
        ok
    }

    /// Records a heartbeat for `slot` at the current epoch. False if `slot` is out of
    /// range, or the registration was fenced (declared dead), unregistered or replaced:
    /// the worker must stop acting on its old work and register again.
    #[inline]
    pub fn beat(&self, slot: usize) -> bool {
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let ok = s.beat(self.expected(slot), self.global_epoch());
        if !ok {
            self.rejected(slot);
        }
        ok
    }

    /// Marks work unit `bit` (0..64) in flight on `slot`. False if out of range or the
    /// registration is no longer ours (fenced: the unit must not be started).
    #[inline]
    pub fn mark_in_flight(&self, slot: usize, bit: u8) -> bool {
        self.update(slot, bit, true)
    }

    /// Clears work unit `bit` on `slot` (the unit is finished). False if out of range or
    /// the registration is no longer ours (the watchdog reclaimed the unit).
    #[inline]
    pub fn clear_in_flight(&self, slot: usize, bit: u8) -> bool {
        self.update(slot, bit, false)
    }

    #[inline]
    fn update(&self, slot: usize, bit: u8, set: bool) -> bool {
        if bit >= 64 {
            self.bump(counter::OUT_OF_RANGE, 1);
            return false;
        }
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let ok = s.update_bit(self.expected(slot), bit, set);
        if !ok {
            self.rejected(slot);
        }
        ok
    }

    /// The owner word of the registration this handle made at `slot` in this process (0
    /// if none): what a [`Registration`](super::Registration) guard acts for.
    pub(crate) fn registered_owner(&self, slot: usize) -> u64 {
        if self.mine_pid.load(std::sync::atomic::Ordering::Relaxed) != liveness::current_proc() {
            return 0;
        }
        self.mine.get(slot).map_or(0, |m| m.load(Ordering::Relaxed))
    }

    /// [`beat`](Self::beat) for the registration whose owner word is `owner` only.
    pub(crate) fn beat_owned(&self, slot: usize, owner: u64) -> bool {
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let ok = owner != 0 && s.beat(owner, self.global_epoch());
        if !ok {
            self.rejected(slot);
        }
        ok
    }

    /// [`mark_in_flight`](Self::mark_in_flight) / [`clear_in_flight`](Self::clear_in_flight)
    /// for the registration whose owner word is `owner` only.
    pub(crate) fn update_owned(&self, slot: usize, bit: u8, set: bool, owner: u64) -> bool {
        if bit >= 64 {
            self.bump(counter::OUT_OF_RANGE, 1);
            return false;
        }
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let ok = owner != 0 && s.update_bit(owner, bit, set);
        if !ok {
            self.rejected(slot);
        }
        ok
    }

    /// [`unregister`](Self::unregister) for the registration whose owner word is `owner`
    /// only (a later registration of the slot is left alone).
    pub(crate) fn unregister_owned(&self, slot: usize, owner: u64) -> bool {
        let Some(s) = self.slot_or_count(slot) else {
            return false;
        };
        let ok = owner != 0 && s.release(owner);
        if let Some(m) = self.mine.get(slot)
            && owner != 0
            && m.load(Ordering::Relaxed) == owner
        {
            m.store(0, Ordering::Relaxed);
        }
        if ok {
            self.bump(counter::UNREGISTER, 1);
            self.note(cxc_sidecar::OpCode::HeartbeatUnregister, 0, slot as u64);
        }
        ok
    }

    /// The in-flight bitmap of the registration whose owner word is `owner`, `None` if
    /// it was fenced or replaced.
    pub(crate) fn in_flight_owned(&self, slot: usize, owner: u64) -> Option<u64> {
        let s = self.snapshot(slot)?;
        (owner != 0 && s.owner_word() == Some(owner)).then_some(s.in_flight_bitmap)
    }

    /// A consistent snapshot of `slot` (H1). `None` if `slot` is out of range, or (very
    /// rarely) if the slot changed owner on every one of a bounded number of re-reads.
    pub fn snapshot(&self, slot: usize) -> Option<HeartbeatSnapshot> {
        let snap = self.map.slot(slot)?.read();
        if snap.is_none() {
            self.bump(counter::SNAPSHOT_GIVEUP, 1);
        }
        snap
    }

    /// The registration this handle acts for at `slot`: the one it made (in this
    /// process), else a live registration recorded for this very process's identity; 0 if
    /// none.
    #[inline]
    fn expected(&self, slot: usize) -> u64 {
        match self.mine.get(slot).map(|m| m.load(Ordering::Relaxed)) {
            Some(0) => self.adopt(slot),
            Some(w)
                if self.mine_pid.load(std::sync::atomic::Ordering::Relaxed)
                    == liveness::current_proc() =>
            {
                w
            }
            Some(_) => self.adopt(slot),
            None => 0,
        }
    }

    /// A live registration of `slot` whose recorded identity is this process's (a known
    /// identity: same pid, pid namespace, boot and pidfs inode or start time). A process
    /// that merely has the pid of a dead worker has another identity and adopts nothing.
    #[cold]
    fn adopt(&self, slot: usize) -> u64 {
        let Some(s) = self.map.slot(slot) else {
            return 0;
        };
        let owner = s.owner.load(Ordering::Acquire);
        let me = Identity::current();
        if pid_of(owner) == me.pid && !is_fenced(owner) && me.is_known() && s.identity(owner) == me
        {
            owner
        } else {
            0
        }
    }

    #[inline]
    fn slot_or_count(&self, slot: usize) -> Option<&HeartbeatSlot> {
        let s = self.map.slot(slot);
        if s.is_none() {
            self.bump(counter::OUT_OF_RANGE, 1);
        }
        s
    }

    #[cold]
    fn rejected(&self, slot: usize) {
        self.bump(counter::FENCED_REJECT, 1);
        self.note(cxc_sidecar::OpCode::HeartbeatFencedBeat, 0, slot as u64);
    }

    /// The shared strategy and its generation.
    pub fn strategy(&self) -> (cxc_sidecar::Strategy, u32) {
        self.map.head().handshake.current()
    }

    /// The observations still in the file's ring, oldest first.
    pub fn recent_observations(&self) -> Vec<cxc_sidecar::Observation> {
        self.map.head().ring.snapshot()
    }

    pub(crate) fn slots(&self) -> &[HeartbeatSlot] {
        self.map.slots()
    }
}

crate::macros::instrumented!(HeartbeatTable, cxc_mmf::Kind::Heartbeat, &counter::NAMES[..counter::IN_USE]);

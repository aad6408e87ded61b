//! [`FailoverWatchdog`]: scans a [`HeartbeatTable`] for dead workers and reclaims their
//! in-flight work.

use std::iter::FusedIterator;
use std::time::{Duration, Instant};

use super::layout::*;
use super::slot::{HeartbeatSnapshot, is_reportable};
use super::table::HeartbeatTable;
use crate::epoch::EpochMode;
use crate::forklock::{ForkSafeMutex, ForkSafeMutexGuard};
use crate::liveness::Liveness;
use crate::primitive::Ordering;
use cxc_sidecar::Instrumented;

/// The seed's default staleness threshold, in epochs: a slot must miss strictly more
/// than 3 epochs to be reported (`lag == 3` is alive).
pub const DEFAULT_GRACE_EPOCHS: u64 = 3;

/// Default minimum time between two OS-identity passes of one watchdog
/// (see [`FailoverWatchdog::with_os_check_interval`]).
pub const DEFAULT_OS_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// The result of one [`FailoverWatchdog::scan`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReclaimReport {
    /// Every dead slot found, with the snapshot that condemned it.
    pub dead_slots: Vec<(usize, HeartbeatSnapshot)>,
    /// The epoch the scan compared against (the epoch it ticked to, in manual mode).
    pub new_global_epoch: u64,
}

/// What a watchdog remembers between scans.
#[derive(Debug)]
struct ScanState {
    /// The dead slots of the last scan (what `reclaim`/`clear_dead_bitmap` act on).
    last: Vec<(usize, HeartbeatSnapshot)>,
    /// Per slot: `(owner word, last_seen)` at this watchdog's previous OS-identity pass,
    /// for slots that held bits and were within grace. A slot whose heartbeat did not move
    /// between two passes gets its OS identity checked; beating slots never cost a
    /// `/proc` read.
    seen: Vec<(u64, u64)>,
    /// When the last OS-identity pass ran.
    last_os_pass: Option<Instant>,
}

impl ScanState {
    /// Nothing scanned yet, for a table of `capacity` slots.
    fn fresh(capacity: usize) -> Self {
        ScanState {
            last: Vec::new(),
            seen: vec![(0, 0); capacity],
            last_os_pass: None,
        }
    }
}

/// Reports and reclaims the in-flight work of workers that stopped beating or died.
///
/// Each [`scan`](Self::scan) (in manual epoch mode) ticks the global epoch by one and
/// reports every registered slot with a non-zero in-flight bitmap that
/// - missed STRICTLY more than `grace` epochs (`lag == grace` is alive), or
/// - is fenced (declared dead earlier, or unregistered with bits left), or
/// - belongs to a process the OS says is gone (the full identity recorded at `register`:
///   pidfs inode, or pid + start time on the fallback path, with boot id and pid namespace).
///
/// Act on a report with [`reclaim`](Self::reclaim) (fence the slot and take all its bits,
/// exactly once even with several watchdogs) or, as in the seed,
/// [`clear_dead_bitmap`](Self::clear_dead_bitmap) (fence and erase only the reported
/// bits). Both act only on the registration the scan saw: a slot re-registered since is
/// never touched. Several watchdogs, in any processes, may scan one table.
#[derive(Debug)]
pub struct FailoverWatchdog<'a> {
    table: &'a HeartbeatTable,
    grace: u64,
    os_interval: Duration,
    /// This watchdog's memory of its scans; a child made by `fork` while another thread
    /// scanned takes the lock over and starts afresh (`forklock.rs`).
    state: ForkSafeMutex<ScanState>,
}

impl<'a> FailoverWatchdog<'a> {
    /// A watchdog with the default grace of [`DEFAULT_GRACE_EPOCHS`] (3) epochs.
    pub fn new(table: &'a HeartbeatTable) -> Self {
        Self::with_grace(table, DEFAULT_GRACE_EPOCHS)
    }

    /// A watchdog that reports slots lagging strictly more than `grace` epochs.
    pub fn with_grace(table: &'a HeartbeatTable, grace: u64) -> Self {
        FailoverWatchdog {
            table,
            grace,
            os_interval: DEFAULT_OS_CHECK_INTERVAL,
            state: ForkSafeMutex::new(ScanState::fresh(table.capacity())),
        }
    }

    /// Sets the minimum time between two OS-identity passes (default 10 ms). A scan that
    /// comes at least this long after the previous pass checks, for every busy slot
    /// within grace whose heartbeat did not move since that pass, whether its process
    /// still exists (its recorded identity). `Duration::ZERO` checks on every scan;
    /// `Duration::MAX` never (staleness only).
    pub fn with_os_check_interval(mut self, interval: Duration) -> Self {
        self.os_interval = interval;
        self
    }

    /// The staleness threshold in epochs.
    pub fn grace(&self) -> u64 {
        self.grace
    }

    /// The table this watchdog scans.
    pub fn table(&self) -> &'a HeartbeatTable {
        self.table
    }

    fn state(&self) -> ForkSafeMutexGuard<'_, ScanState> {
        self.state
            .lock(|| ScanState::fresh(self.table.capacity()))
    }

    /// Scans every slot once. In manual epoch mode the global epoch is ticked by one first;
    /// in clock mode the clock is the time base and the scan does not tick.
    ///
    /// Cost: two atomic loads per slot without in-flight bits, four for a busy slot
    /// within grace. At most once per OS-check interval (default 10 ms) the scan also
    /// asks the OS (`pidfd_open` + `fstat` + `poll`, or `/proc/<pid>/stat` on the fallback
    /// path; allocation-free either way) about each busy slot with a recorded
    /// identity whose heartbeat did not move since the previous such pass. Nothing is
    /// allocated unless a dead slot is found.
    pub fn scan(&self) -> ReclaimReport {
        let mut st = self.state();
        let table = self.table;
        let now = match table.epoch_mode() {
            EpochMode::Manual => table.tick_global_epoch(),
            EpochMode::Clock { .. } => table.global_epoch(),
        };
        table.bump(counter::SCAN, 1);
        let os_pass = self.os_interval != Duration::MAX && {
            let t = Instant::now();
            let due = st
                .last_os_pass
                .is_none_or(|last| t.saturating_duration_since(last) >= self.os_interval);
            if due {
                st.last_os_pass = Some(t);
            }
            due
        };
        let grace = self.grace;
        let mut dead = Vec::new();
        for (i, slot) in table.slots().iter().enumerate() {
            // SYNC: half-bits / half-retag. Acquire: a half showing bits of a new
            // registration also shows its owner word and last_seen (see slot.rs).
            let lo = slot.lo.load(Ordering::Acquire);
            let hi = slot.hi.load(Ordering::Acquire);
            if half_bits(lo) | half_bits(hi) == 0 {
                continue;
            }
            let owner = slot.owner.load(Ordering::Acquire);
            if pid_of(owner) == 0 {
                continue;
            }
            let last_seen = slot.last_seen.load(Ordering::Acquire);
            let mut os_dead = false;
            if !is_fenced(owner) && now.saturating_sub(last_seen) <= grace {
                if !os_pass {
                    continue;
                }
                let Some(prev) = st.seen.get_mut(i) else {
                    continue;
                };
                if *prev != (owner, last_seen) {
                    *prev = (owner, last_seen);
                    continue; // beating: alive
                }
                // Dead = the recorded process's whole thread group is gone (or its pid now
                // names another process); an unknown identity is never dead.
                os_dead = crate::liveness::liveness(&slot.identity(owner)) == Liveness::Dead;
                if !os_dead {
                    continue;
                }
            }
            let Some(snap) = slot.read() else {
                table.bump(counter::SNAPSHOT_GIVEUP, 1);
                continue;
            };
            // The OS verdict is about the registration `owner`; it holds for the snapshot
            // only if the snapshot is of that registration.
            let os_dead = os_dead && snap.owner_word() == Some(owner);
            if is_reportable(&snap, now, grace, os_dead) {
                table.bump(counter::DEAD_REPORTED, 1);
                if !snap.fenced && now.saturating_sub(snap.last_seen_epoch) <= grace {
                    table.bump(counter::OS_DEAD_DETECTED, 1);
                }
                dead.push((i, snap));
            }
        }
        st.last.clear();
        st.last.extend_from_slice(&dead);
        table.note(cxc_sidecar::OpCode::HeartbeatScan, 0, dead.len() as u64);
        ReclaimReport {
            dead_slots: dead,
            new_global_epoch: now,
        }
    }

    /// The set bits of `bitmap`, lowest first (one step per set bit, via
    /// `trailing_zeros`).
    #[inline]
    pub fn iter_in_flight_bits(bitmap: u64) -> InFlightBits {
        InFlightBits(bitmap)
    }

    fn reported(&self, slot: usize) -> Option<HeartbeatSnapshot> {
        self.state()
            .last
            .iter()
            .find(|(i, _)| *i == slot)
            .map(|(_, s)| *s)
    }

    /// Reclaims `slot` as reported by this watchdog's last scan: fences the slot (its
    /// worker's next `beat`/`mark_in_flight` fail) and atomically takes every in-flight
    /// bit it holds, including bits set after the scan; returns them. Each bit is returned
    /// by exactly one `reclaim` call, whichever watchdogs race. Returns 0 if the slot was
    /// not in the last report, or was already reclaimed, unregistered or re-registered.
    pub fn reclaim(&self, slot: usize) -> u64 {
        match self.reported(slot) {
            Some(snap) => self.reclaim_snapshot(slot, &snap),
            None => 0,
        }
    }

    /// [`reclaim`](Self::reclaim) for an explicit snapshot (e.g. taken with
    /// [`HeartbeatTable::snapshot`]).
    pub fn reclaim_snapshot(&self, slot: usize, snapshot: &HeartbeatSnapshot) -> u64 {
        let Some(bits) = self.fence_with(slot, snapshot, counter::RECLAIMED_BITS, |s, seen| {
            s.reclaim(seen)
        }) else {
            return 0;
        };
        self.table
            .note(cxc_sidecar::OpCode::HeartbeatReclaim, 0, bits);
        bits
    }

    /// The seed's silencing call, made safe: fences `slot` (as reported by the last scan)
    /// and erases only the bits that scan reported. Bits set after the scan survive (the
    /// next scan reports them); a slot re-registered since is not touched. Returns the
    /// bits erased.
    pub fn clear_dead_bitmap(&self, slot: usize) -> u64 {
        match self.reported(slot) {
            Some(snap) => self.clear_snapshot(slot, &snap),
            None => 0,
        }
    }

    /// [`clear_dead_bitmap`](Self::clear_dead_bitmap) for an explicit snapshot.
    pub fn clear_snapshot(&self, slot: usize, snapshot: &HeartbeatSnapshot) -> u64 {
        self.fence_with(slot, snapshot, counter::CLEARED_BITS, |s, seen| {
            s.clear_reported(seen, snapshot.in_flight_bitmap)
        })
        .unwrap_or(0)
    }

    /// Runs `take` (a fencing transition returning the bits taken and whether this call
    /// fenced) on `slot` for the registration `snapshot` saw; counts the fence and the
    /// bits (into `bits_counter`). `None` if the slot or the registration is gone.
    fn fence_with(
        &self,
        slot: usize,
        snapshot: &HeartbeatSnapshot,
        bits_counter: usize,
        take: impl FnOnce(&HeartbeatSlot, u64) -> Option<(u64, bool)>,
    ) -> Option<u64> {
        let s = self.table.slots().get(slot)?;
        let (bits, newly) = take(s, snapshot.owner_word()?)?;
        self.after_fence(newly);
        self.table.bump(bits_counter, u64::from(bits.count_ones()));
        Some(bits)
    }

    fn after_fence(&self, newly: bool) {
        if newly {
            self.table.bump(counter::FENCE, 1);
        }
    }

    /// Fences every registered slot with no in-flight bits whose heartbeat is stale
    /// (lag > grace) or whose process is dead by OS identity, so `register` can reuse it.
    /// (`scan` only reports slots with bits, as in the seed; idle workers that vanished
    /// are swept here.) Returns how many slots were fenced.
    pub fn sweep_idle(&self) -> usize {
        let now = self.table.global_epoch();
        let mut swept = 0;
        for slot in self.table.slots() {
            let Some(snap) = slot.read() else { continue };
            let Some(seen) = snap.owner_word() else {
                continue;
            };
            if snap.fenced || snap.in_flight_bitmap != 0 {
                continue;
            }
            let stale = now.saturating_sub(snap.last_seen_epoch) > self.grace
                || crate::liveness::liveness(&snap.identity) == Liveness::Dead;
            if stale && slot.fence(seen) == Some(true) {
                // Close the halves; bits that raced in stay and make the slot reportable.
                slot.retag_fenced(gen_of(seen), 0);
                self.table.bump(counter::FENCE, 1);
                self.table.bump(counter::SWEPT_IDLE, 1);
                swept += 1;
            }
        }
        swept
    }
}

/// Iterator over the set bits of an in-flight bitmap, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightBits(u64);

impl Iterator for InFlightBits {
    type Item = u8;

    #[inline]
    fn next(&mut self) -> Option<u8> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros() as u8;
        self.0 &= self.0 - 1;
        Some(bit)
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for InFlightBits {}
impl FusedIterator for InFlightBits {}

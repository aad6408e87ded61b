//! Counters and a holder-table snapshot, for diagnostics (and the sidecar).

use std::sync::atomic::Ordering;

use super::handle::SharedSemaphore;
use super::layout::{HolderSlot, SemHead, ctr};
use super::word::{BookWord, STATE_ACTIVE, STATE_RECLAIMING, owner_parts};

/// A snapshot of the semaphore's cumulative event counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SemaphoreStats {
    /// Acquires that found no permit and entered the blocking path.
    pub contended: u64,
    /// Times a blocked acquirer went to sleep in the kernel.
    pub sleeps: u64,
    /// `acquire_timeout` calls that gave up.
    pub timeouts: u64,
    /// Releases (or reclaims) that woke sleepers.
    pub wakes: u64,
    /// Releases refused because the pool was full.
    pub overflow_rejected: u64,
    /// Permits returned from dead holders.
    pub reclaimed_permits: u64,
    /// Dead holders' slots freed.
    pub reclaimed_holders: u64,
    /// Holder slots registered.
    pub registered: u64,
    /// Registrations refused because the holder table was full of live processes.
    pub table_full: u64,
    /// Reclaim scans.
    pub reclaim_scans: u64,
    /// Held counts dropped by reclaim because the pool was already full (only a corrupt
    /// file gets there).
    pub over_held: u64,
    /// Releases refused because the caller held no permit and none was handed off.
    pub not_held_rejected: u64,
    /// Permits handed off with `Permit::disown`.
    pub disowned: u64,
    /// Permits handed off and not yet released (now, not cumulative).
    pub handed: u32,
}

/// One holder-table entry, as [`SharedSemaphore::holders`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// Slot index.
    pub slot: usize,
    /// Owner (or, while `reclaiming`, reclaimer) process id.
    pub pid: u32,
    /// Whether a reclaimer is returning this dead holder's permits right now.
    pub reclaiming: bool,
    /// Permits held (tracked).
    pub held: u32,
}

impl SharedSemaphore {
    /// The cumulative event counters.
    pub fn stats(&self) -> SemaphoreStats {
        stats_of(self.map.head())
    }

    /// The occupied holder slots (a racy snapshot, for diagnostics).
    pub fn holders(&self) -> Vec<HolderInfo> {
        holders_of(self.map.slots())
    }
}

/// The counters of the head block `head`.
pub(super) fn stats_of(head: &SemHead) -> SemaphoreStats {
    let c = &head.counters;
    let get = |i: usize| c[i].load(Ordering::Relaxed);
    SemaphoreStats {
        contended: get(ctr::CONTENDED),
        sleeps: get(ctr::SLEEPS),
        timeouts: get(ctr::TIMEOUTS),
        wakes: get(ctr::WAKES),
        overflow_rejected: get(ctr::OVERFLOW_REJECTED),
        reclaimed_permits: get(ctr::RECLAIMED_PERMITS),
        reclaimed_holders: get(ctr::RECLAIMED_HOLDERS),
        registered: get(ctr::REGISTERED),
        table_full: get(ctr::TABLE_FULL),
        reclaim_scans: get(ctr::RECLAIM_SCANS),
        over_held: get(ctr::OVER_HELD),
        not_held_rejected: get(ctr::NOT_HELD_REJECTED),
        disowned: get(ctr::DISOWNED),
        handed: BookWord(head.handed.load(Ordering::Acquire)).held(),
    }
}

/// The occupied entries of the holder table `slots`.
pub(super) fn holders_of(slots: &[HolderSlot]) -> Vec<HolderInfo> {
    slots
        .iter()
        .enumerate()
        .filter_map(|(slot, s)| {
            let (state, pid, _) = owner_parts(s.owner.load(Ordering::Acquire));
            (state == STATE_ACTIVE || state == STATE_RECLAIMING).then(|| HolderInfo {
                slot,
                pid,
                reclaiming: state == STATE_RECLAIMING,
                held: BookWord(s.book.load(Ordering::Acquire)).held(),
            })
        })
        .collect()
}

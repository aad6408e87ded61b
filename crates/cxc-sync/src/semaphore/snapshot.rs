//! [`SharedSemaphore::inspect`]: a semaphore file's state, read without writing.

use std::path::Path;
use std::sync::atomic::Ordering;

use cxc_mmf::Snapshot;

use super::error::SemaphoreError;
use super::handle::{SharedSemaphore, check_params, expect};
use super::layout::{HolderSlot, SemHead};
use super::stats::{HolderInfo, SemaphoreStats, holders_of, stats_of};
use super::word::{self, CountWord};

/// A semaphore file's state as read by [`SharedSemaphore::inspect`] (fields read one by
/// one from one copy of the file).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SemaphoreSnapshot {
    /// Permits available.
    pub available: u32,
    /// The most permits that can be available.
    pub max_permits: u32,
    /// The occupied holder slots.
    pub holders: Vec<HolderInfo>,
    /// Slots in the holder table.
    pub holder_capacity: usize,
    /// Cumulative counters.
    pub stats: SemaphoreStats,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

impl SharedSemaphore {
    /// Reads the state of the semaphore file at `path` without writing anything: the
    /// file is opened and mapped read-only and copied with loads only
    /// ([`cxc_mmf::Snapshot`]); no holder slot is registered, no reclaim runs. Read
    /// permission is enough (another user's file, a read-only mount), and a file of
    /// another pid namespace can be read too (its pids are then not this namespace's).
    ///
    /// # Errors
    /// [`SemaphoreError::File`] if the file is not a valid semaphore file or cannot be
    /// read.
    pub fn inspect(path: impl AsRef<Path>) -> Result<SemaphoreSnapshot, SemaphoreError> {
        let snap: Snapshot<SemHead, HolderSlot> = Snapshot::read(path, &expect(&check_params))?;
        let head = snap.head();
        // Validated by `check_params`.
        let max = u32::try_from(snap.info().layout.params[0])
            .unwrap_or(word::MAX_PERMITS)
            .min(word::MAX_PERMITS);
        Ok(SemaphoreSnapshot {
            available: CountWord(head.count.load(Ordering::Acquire))
                .avail()
                .min(max),
            max_permits: max,
            holders: holders_of(snap.slots()),
            holder_capacity: snap.slots().len(),
            stats: stats_of(head),
            strategy: head.handshake.current(),
            recent: head.ring.snapshot(),
        })
    }
}

//! [`HeartbeatTable::inspect`]: a heartbeat table's state, read without writing.

use std::path::Path;

use cxc_mmf::Snapshot;

use super::error::HeartbeatError;
use super::layout::{HeartbeatHead, HeartbeatSlot, counter};
use super::slot::HeartbeatSnapshot;
use super::table::{HeartbeatTable, check_not_empty, expect};
use crate::epoch::{EpochClock, EpochMode};
use crate::primitive::Ordering;

/// A heartbeat table's state as read by [`HeartbeatTable::inspect`] (fields read one by
/// one from one copy of the file).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeartbeatTableSnapshot {
    /// Number of slots.
    pub capacity: usize,
    /// The table's current epoch.
    pub epoch: u64,
    /// The epoch source.
    pub epoch_mode: EpochMode,
    /// Every slot's snapshot by index (`None`: the slot changed under every read).
    pub slots: Vec<Option<HeartbeatSnapshot>>,
    /// The cumulative event counters (indices in [`counter`]).
    pub counters: [u64; counter::COUNT],
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

impl HeartbeatTable {
    /// Reads the state of the heartbeat table at `path` (of any capacity) without writing
    /// anything: the file is opened and mapped read-only and copied with loads only
    /// ([`cxc_mmf::Snapshot`]); nothing is registered, no counter is bumped. Read
    /// permission is enough (another user's file, a read-only mount).
    ///
    /// # Errors
    /// [`HeartbeatError::File`] if the file is not a valid heartbeat table or cannot be
    /// read.
    pub fn inspect(path: impl AsRef<Path>) -> Result<HeartbeatTableSnapshot, HeartbeatError> {
        let snap: Snapshot<HeartbeatHead, HeartbeatSlot> = Snapshot::read(path, &expect(None))?;
        let layout = snap.info().layout;
        check_not_empty(&layout)?;
        // Validated by `check_params`.
        let epoch_mode = EpochMode::decode(layout.params[0], layout.params[1]).unwrap_or_default();
        let head = snap.head();
        Ok(HeartbeatTableSnapshot {
            capacity: snap.slots().len(),
            epoch: EpochClock::new(epoch_mode).now(&head.global_epoch),
            epoch_mode,
            slots: snap.slots().iter().map(HeartbeatSlot::read).collect(),
            counters: std::array::from_fn(|i| head.counters[i].load(Ordering::Relaxed)),
            strategy: head.handshake.current(),
            recent: head.ring.snapshot(),
        })
    }
}

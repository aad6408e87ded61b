//! [`HeartbeatTable::inspect`]: a heartbeat table's state, read without writing.

use std::path::Path;

use cxc_mmf::{Expect, Kind, MmfError, Snapshot, TypeFingerprint};

use super::error::HeartbeatError;
use super::layout::{HeartbeatHead, HeartbeatSlot, MAX_CAPACITY, counter};
use super::slot::HeartbeatSnapshot;
use super::table::{HEAD_SIZE, HeartbeatTable, SLOT_SIZE, check_params};
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
        let expect = Expect {
            kind: Kind::Heartbeat,
            head_size: HEAD_SIZE,
            slot_size: SLOT_SIZE,
            capacity: None,
            max_capacity: MAX_CAPACITY as u64,
            payload: TypeFingerprint::NONE,
            check_params: &check_params,
        };
        let snap: Snapshot<HeartbeatHead, HeartbeatSlot> = Snapshot::read(path, &expect)?;
        let layout = snap.info().layout;
        if layout.capacity == 0 {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: format!("1..={MAX_CAPACITY}"),
                found: 0,
            }
            .into());
        }
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

//! [`SharedRwLock::inspect`]: an rwlock file's state, read without writing (for tools
//! such as `cxc inspect`).

use std::path::Path;
use std::sync::atomic::Ordering;

use cxc_mmf::{Snapshot, TypeFingerprint};

use super::error::RwLockError;
use super::handle::{SharedRwLock, expect};
use super::layout::{PAYLOAD_WORDS, RwHead, RwSlot, ctr};
use super::word::{BufferFields, Word};
use crate::semaphore::word::{STATE_ACTIVE, owner_parts};

/// One process in an rwlock's holder table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolderInfo {
    /// Slot index.
    pub slot: usize,
    /// The process id recorded in the slot.
    pub pid: u32,
    /// Read holds of that process.
    pub readers: u64,
}

/// An rwlock file's state as read by [`SharedRwLock::inspect`] (fields read one by one
/// from one copy of the file).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RwLockSnapshot {
    /// The writer's slot and pid, if a writer holds the lock (or is draining readers).
    pub writer: Option<(usize, u32)>,
    /// The fencing token of the current (or last) write lock.
    pub token: u64,
    /// The writer's progress counter (bumped when it writes, beats or drains readers).
    pub beat: u64,
    /// Registered processes, with their read holds.
    pub holders: Vec<RwHolderInfo>,
    /// Slots in the holder table.
    pub holder_capacity: usize,
    /// The eviction grace in nanoseconds.
    pub grace_ns: u64,
    /// The published value's words (the payload type's bytes, zero-padded).
    pub payload_words: [u64; PAYLOAD_WORDS],
    /// The payload type recorded in the file.
    pub payload_type: TypeFingerprint,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

impl SharedRwLock<()> {
    /// Reads the state of the rwlock file at `path`, of any payload type, without writing
    /// anything: the file is opened and mapped read-only and copied with loads only
    /// ([`cxc_mmf::Snapshot`]); no holder slot is registered. Read permission is enough
    /// (another user's file, a read-only mount).
    ///
    /// # Errors
    /// [`RwLockError::File`] if the file is not a valid rwlock file or cannot be read.
    pub fn inspect(path: impl AsRef<Path>) -> Result<RwLockSnapshot, RwLockError> {
        let path = path.as_ref();
        let payload = cxc_mmf::peek(path)?.layout.payload;
        let snap: Snapshot<RwHead, RwSlot> = Snapshot::read(path, &expect(payload))?;
        let head = snap.head();
        let w = Word(head.state.load(Ordering::Acquire));
        let pid_of = |slot: usize| {
            snap.slots()
                .get(slot)
                .map_or(0, |s| owner_parts(s.owner.load(Ordering::Acquire)).1)
        };
        let holders = snap
            .slots()
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let (state, pid, _) = owner_parts(s.owner.load(Ordering::Acquire));
                (state == STATE_ACTIVE).then(|| RwHolderInfo {
                    slot,
                    pid,
                    readers: s.readers.load(Ordering::Acquire),
                })
            })
            .collect();
        let buf = &head.bufs[w.published()];
        Ok(RwLockSnapshot {
            writer: w.writer().map(|s| (s, pid_of(s))),
            token: w.token(),
            beat: head.beat.load(Ordering::Relaxed),
            holders,
            holder_capacity: snap.slots().len(),
            grace_ns: snap.info().layout.params[0],
            payload_words: std::array::from_fn(|i| buf[i].load(Ordering::Relaxed)),
            payload_type: payload,
            counters: ctr::NAMES
                .iter()
                .zip(&head.counters)
                .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
                .collect(),
            strategy: head.handshake.current(),
            recent: head.ring.snapshot(),
        })
    }
}

//! Reading: validating one position (seqlock and checksum), and batches since a cursor.

use std::sync::atomic::{Ordering, fence};

use super::block::ObservationRing;
use super::observation::{Observation, ReadBatch, SlotRead};
use crate::op::OpCode;

use super::slot::{
    CAP, PENDING_BUDGET, PENDING_SPINS, PENDING_YIELDS, checksum, published, ticket_of, writing,
};

impl ObservationRing {
    /// Reads position `pos` once.
    fn try_read(&self, pos: u64) -> SlotRead {
        let slot = &self.slots[(pos % CAP) as usize];
        let want = published(pos);
        // SYNC: ring slot (reader). Pairs with the producer's Release publish CAS.
        let s1 = slot.seq.load(Ordering::Acquire);
        if s1 != want {
            return if s1 == writing(pos) || s1 == 0 || ticket_of(s1) < pos {
                SlotRead::Pending
            } else {
                SlotRead::Gone
            };
        }
        let timestamp = slot.timestamp.load(Ordering::Relaxed);
        let meta = slot.meta.load(Ordering::Relaxed);
        let arg = slot.arg.load(Ordering::Relaxed);
        let check = slot.check.load(Ordering::Relaxed);
        // SYNC: ring slot (reader). Pairs with the producer's Release fence.
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != s1 {
            return SlotRead::Gone;
        }
        if check != checksum(pos, timestamp, meta, arg) {
            return SlotRead::Rejected;
        }
        SlotRead::Ok(Observation {
            ticket: pos,
            timestamp_ns: timestamp,
            pid: meta as u32,
            op: OpCode::from_u16((meta >> 32) as u16),
            flags: (meta >> 48) as u16,
            arg,
        })
    }

    /// Reads position `pos`, waiting a bounded time for an unfinished entry: at most
    /// `PENDING_SPINS` spins and `PENDING_YIELDS` yields, and never past `deadline` (the
    /// whole call's budget, set at its first wait).
    fn read_pos(&self, pos: u64, deadline: &mut Option<std::time::Instant>) -> SlotRead {
        let mut round = 0u32;
        loop {
            match self.try_read(pos) {
                SlotRead::Pending if round < PENDING_SPINS + PENDING_YIELDS => {
                    let now = std::time::Instant::now();
                    if *deadline.get_or_insert(now + PENDING_BUDGET) <= now {
                        return SlotRead::Pending;
                    }
                    if round < PENDING_SPINS {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                    round += 1;
                }
                r => return r,
            }
        }
    }

    /// Every intact entry from position `cursor` up to the current head, in ticket order,
    /// plus the cursor for the next call and how many positions in between were lost.
    /// Start with `cursor = 0` for everything still retained, or [`head`](Self::head) for
    /// only what comes next. A cursor beyond the head (a cursor from another file) returns
    /// nothing and resets to the head.
    ///
    /// An entry whose producer has not finished it is waited for only briefly (200 µs in
    /// all per call), then counted as lost: a reader never blocks on a stalled or dead
    /// producer.
    pub fn read_since(&self, cursor: u64) -> ReadBatch {
        let head = self.head();
        let mut batch = ReadBatch {
            next: head,
            ..ReadBatch::default()
        };
        if cursor >= head {
            return batch;
        }
        let start = cursor.max(head.saturating_sub(CAP));
        batch.lost = start - cursor;
        batch.observations.reserve((head - start) as usize);
        let mut deadline = None;
        for pos in start..head {
            match self.read_pos(pos, &mut deadline) {
                SlotRead::Ok(o) => batch.observations.push(o),
                SlotRead::Rejected => {
                    batch.lost += 1;
                    batch.rejected += 1;
                }
                SlotRead::Gone | SlotRead::Pending => batch.lost += 1,
            }
        }
        batch
    }

    /// The intact entries still retained (at most [`RING_CAPACITY`](super::slot::RING_CAPACITY)), oldest first.
    pub fn snapshot(&self) -> Vec<Observation> {
        self.read_since(self.head().saturating_sub(CAP))
            .observations
    }
}

//! Producing: taking a ticket, claiming its slot, writing and publishing the entry.

use std::sync::atomic::{Ordering, fence};

use crate::clock::monotonic_ns;
use crate::op::OpCode;

use super::block::ObservationRing;
use super::slot::{CAP, checksum, pack_meta, published, ticket_of, writing};

impl ObservationRing {
    /// Records an event as this process, now. For slow paths and transitions only: it costs
    /// a `fetch_add` on the shared head, two CASes and a clock read (tens of nanoseconds).
    /// Returns the event's ticket.
    #[inline]
    pub fn record(&self, op: OpCode, flags: u16, arg: u64) -> u64 {
        self.record_code(op.code(), flags, arg)
    }

    /// [`record`](Self::record) with a raw op code (for codes outside [`OpCode`], e.g. in
    /// tests or newer builds).
    #[inline]
    pub fn record_code(&self, code: u16, flags: u16, arg: u64) -> u64 {
        self.record_with(
            cxc_mmf::identity::current_pid(),
            monotonic_ns(),
            code,
            flags,
            arg,
        )
    }

    /// Records an event with an explicit pid and timestamp. Returns its ticket.
    #[cold]
    pub fn record_with(&self, pid: u32, timestamp_ns: u64, code: u16, flags: u16, arg: u64) -> u64 {
        let ticket = self.head.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[(ticket % CAP) as usize];
        let mine = writing(ticket);
        let mut cur = slot.seq.load(Ordering::Relaxed);
        loop {
            if cur != 0 && ticket_of(cur) >= ticket {
                // Overtaken: a producer a lap ahead already owns the slot.
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return ticket;
            }
            match slot
                .seq
                .compare_exchange_weak(cur, mine, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        // SYNC: ring slot (writer): odd seq, Release fence, fields, Release publish. The
        // fence pairs with the reader's Acquire fence: a reader that sees any field stored
        // below sees `seq` at `mine` or later on its second load, and rejects the slot.
        fence(Ordering::Release);
        let meta = pack_meta(pid, code, flags);
        slot.timestamp.store(timestamp_ns, Ordering::Relaxed);
        slot.meta.store(meta, Ordering::Relaxed);
        slot.arg.store(arg, Ordering::Relaxed);
        slot.check
            .store(checksum(ticket, timestamp_ns, meta, arg), Ordering::Relaxed);
        // SYNC: ring slot (publish). Pairs with the reader's Acquire load of `seq`. Fails
        // only if a producer a lap ahead took the slot over while we wrote: our entry is lost
        // and its checksum (over its own ticket) rejects any field we stored late.
        if slot
            .seq
            .compare_exchange(
                mine,
                published(ticket),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ticket
    }
}

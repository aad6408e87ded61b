//! [`ObservationRing`]: a fixed-size, multi-producer, lossy ring of observations that lives
//! inside a primitive's file.
//!
//! # Protocol
//!
//! Producers (any thread of any process) take a ticket with one `fetch_add` on `head`; the
//! ticket's slot is `ticket % RING_CAPACITY`. Each slot has a sequence word:
//!
//! | `seq`          | meaning                                             |
//! |----------------|-----------------------------------------------------|
//! | 0              | never written (an all-zero ring is empty)           |
//! | `2 * t + 1`    | the producer of ticket `t` is writing               |
//! | `2 * t + 2`    | ticket `t` is published                             |
//!
//! The producer of ticket `t` claims the slot by CAS from any value naming an *older* ticket
//! (published, or still being written by a producer one lap behind that stalled or died) to
//! `2t+1`; if the slot already names ticket `t` or newer, it was overtaken and drops its
//! entry. So `seq` only ever grows, and a slot has at most one claimant at a time unless a
//! claimant stalled for a whole lap. It then writes the fields and a checksum over
//! (ticket, fields), and publishes with a CAS `2t+1 -> 2t+2` that fails if a later ticket
//! took the slot over meanwhile.
//!
//! A reader of position `p` accepts the slot only if `seq == 2p+2` before and after reading
//! the fields (seqlock: Acquire load, fields, Acquire fence, load) **and** the checksum over
//! `p` and the fields verifies. The second `seq` check rejects every overwrite by a newer
//! ticket; the checksum rejects the one case the sequence cannot see, stray stores of a
//! producer that stalled a whole lap mid-write (it computed its checksum over a different
//! ticket). A torn entry is accepted only on a 64-bit hash collision.
//!
//! A producer that dies mid-entry leaves an odd `seq`; readers wait for an unfinished entry
//! only briefly (a few spins and yields), then count it as lost and go on. The next lap's
//! producer takes the slot over. Readers never spin unboundedly on state left by a crashed
//! process, and every index is reduced modulo the capacity, so a corrupt file cannot make
//! a reader or producer touch memory outside the ring.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use zerocopy::{FromBytes, KnownLayout};

use crate::clock::monotonic_ns;
use crate::op::OpCode;

/// Number of observations a ring retains.
pub const RING_CAPACITY: usize = 64;
const CAP: u64 = RING_CAPACITY as u64;

/// Rounds a reader waits for an unfinished entry: first spins, then yields.
const PENDING_SPINS: u32 = 64;
const PENDING_YIELDS: u32 = 8;

/// One entry: five words, 40 bytes.
///
/// `pub` only because `ObservationRing`'s derived `KnownLayout` names the type of its last
/// field in a public impl; the module is private, so the type cannot be named outside.
#[derive(Debug, FromBytes, KnownLayout)]
#[repr(C)]
#[allow(unreachable_pub)]
pub struct RingSlot {
    /// Sequence word (see the module docs).
    seq: AtomicU64,
    /// `CLOCK_MONOTONIC` nanoseconds.
    timestamp: AtomicU64,
    /// `pid | op << 32 | flags << 48`.
    meta: AtomicU64,
    /// The op's argument.
    arg: AtomicU64,
    /// [`checksum`] over the ticket and the three words above.
    check: AtomicU64,
}

impl RingSlot {
    const fn new() -> Self {
        RingSlot {
            seq: AtomicU64::new(0),
            timestamp: AtomicU64::new(0),
            meta: AtomicU64::new(0),
            arg: AtomicU64::new(0),
            check: AtomicU64::new(0),
        }
    }
}

/// A fixed-size, multi-producer, lossy ring of [`Observation`]s, stored in a primitive's
/// file so any process (or the `cxc` CLI) can read recent events.
///
/// It is an in-file view: `#[repr(C, align(64))]`, only `AtomicU64`s, 2624 bytes, and an
/// all-zero ring is a valid empty ring, so a primitive embeds it in its fixed block and a
/// freshly created (zero-filled) file needs no initialisation. Any number of threads and
/// processes may [`record`](Self::record) at once; readers ([`read_since`](Self::read_since))
/// validate every entry and never return a torn one. When producers outpace a reader, the
/// oldest entries are overwritten and the reader is told how many it lost.
///
/// | offset | size | field                                   |
/// |-------:|-----:|-----------------------------------------|
/// | 0      | 8    | `head`: tickets taken (= events recorded) |
/// | 8      | 8    | `dropped`: producers that lost their slot to a later lap |
/// | 16     | 48   | reserved, zero                          |
/// | 64     | 2560 | 64 slots of 40 bytes: `seq`, `timestamp`, `meta`, `arg`, `check` |
///
/// # Examples
/// ```
/// use cxc_sidecar::{ObservationRing, OpCode};
///
/// let ring = ObservationRing::new(); // in a file: a field of the primitive's fixed block
/// ring.record(OpCode::LeaseRelease, 0, 7);
/// let batch = ring.read_since(0);
/// assert_eq!(batch.observations.len(), 1);
/// assert_eq!(batch.observations[0].op, OpCode::LeaseRelease);
/// assert_eq!((batch.next, batch.lost), (1, 0));
/// ```
#[derive(FromBytes, KnownLayout)]
#[repr(C, align(64))]
pub struct ObservationRing {
    head: AtomicU64,
    dropped: AtomicU64,
    _reserved: [AtomicU64; 6],
    slots: [RingSlot; RING_CAPACITY],
}

const _: () = assert!(size_of::<RingSlot>() == 40);
const _: () = assert!(size_of::<ObservationRing>() == 2624);
const _: () = assert!(align_of::<ObservationRing>() == 64);
const _: () = assert!(std::mem::offset_of!(ObservationRing, slots) == 64);

/// One event read from a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Observation {
    /// Position in the ring's history (the producer's ticket): increases by one per event,
    /// across all producers.
    pub ticket: u64,
    /// `CLOCK_MONOTONIC` nanoseconds when it was recorded ([`monotonic_ns`]).
    pub timestamp_ns: u64,
    /// Pid of the recording process.
    pub pid: u32,
    /// What happened.
    pub op: OpCode,
    /// Op-specific flag bits (see [`flags`](crate::flags)).
    pub flags: u16,
    /// Op-specific argument (see [`OpCode`]).
    pub arg: u64,
}

impl Observation {
    /// The wait duration in nanoseconds, if this is a wait op ([`OpCode::is_wait`]).
    pub fn wait_ns(&self) -> Option<u64> {
        self.op.is_wait().then_some(self.arg)
    }
}

impl fmt::Display for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} t={}ns pid={} {} flags={:#x} arg={}",
            self.ticket, self.timestamp_ns, self.pid, self.op, self.flags, self.arg
        )
    }
}

/// What one [`ObservationRing::read_since`] returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatch {
    /// Intact entries, in ticket order.
    pub observations: Vec<Observation>,
    /// The cursor to pass to the next call (the ring's head when this call read it).
    pub next: u64,
    /// Positions between the cursor and `next` that were not returned: overwritten before
    /// they were read, unfinished (producer stalled or died), or rejected as torn.
    /// `observations.len() + lost == next - cursor`.
    pub lost: u64,
    /// The part of `lost` whose slot named the right ticket but failed the checksum.
    pub rejected: u64,
}

/// The outcome of reading one position.
enum SlotRead {
    Ok(Observation),
    /// Overwritten by a later ticket.
    Gone,
    /// Not (yet) published by its producer.
    Pending,
    /// The right ticket, but the checksum failed.
    Rejected,
}

#[inline]
const fn writing(ticket: u64) -> u64 {
    ticket.wrapping_mul(2).wrapping_add(1)
}

#[inline]
const fn published(ticket: u64) -> u64 {
    ticket.wrapping_mul(2).wrapping_add(2)
}

/// The ticket named by a non-zero sequence word.
#[inline]
const fn ticket_of(seq: u64) -> u64 {
    (seq - 1) / 2
}

#[inline]
const fn pack_meta(pid: u32, code: u16, flags: u16) -> u64 {
    pid as u64 | (code as u64) << 32 | (flags as u64) << 48
}

#[inline]
const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The per-entry checksum: a 64-bit hash of the ticket and the three data words.
#[inline]
const fn checksum(ticket: u64, timestamp: u64, meta: u64, arg: u64) -> u64 {
    let mut h = fmix64(ticket ^ 0x6a09_e667_f3bc_c909);
    h = fmix64(h ^ timestamp.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    h = fmix64(h ^ meta.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    fmix64(h ^ arg.wrapping_mul(0x94d0_49bb_1331_11eb))
}

impl Default for ObservationRing {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ObservationRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservationRing")
            .field("head", &self.head())
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl ObservationRing {
    /// An empty ring (the same state as all-zero bytes in a file). For rings on the heap,
    /// e.g. in tests and loom models; a file needs no initialisation.
    pub const fn new() -> Self {
        ObservationRing {
            head: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            _reserved: [const { AtomicU64::new(0) }; 6],
            slots: [const { RingSlot::new() }; RING_CAPACITY],
        }
    }

    /// Number of entries retained ([`RING_CAPACITY`]).
    pub const fn capacity(&self) -> usize {
        RING_CAPACITY
    }

    /// Tickets taken so far: the number of events ever recorded into this ring (by all
    /// processes, including entries since overwritten or dropped).
    #[inline]
    pub fn head(&self) -> u64 {
        // Relaxed: it only bounds which positions to look at; every entry is validated by
        // its own slot's sequence word and checksum.
        self.head.load(Ordering::Relaxed)
    }

    /// Producers that lost their slot to a producer one lap ahead before they could
    /// publish (their entries are among the readers' `lost`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

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

    /// Reads position `pos`, waiting a bounded time for an unfinished entry.
    fn read_pos(&self, pos: u64) -> SlotRead {
        let mut round = 0u32;
        loop {
            match self.try_read(pos) {
                SlotRead::Pending if round < PENDING_SPINS + PENDING_YIELDS => {
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
    /// An entry whose producer has not finished it is waited for only briefly, then
    /// counted as lost: a reader never blocks on a stalled or dead producer.
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
        for pos in start..head {
            match self.read_pos(pos) {
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

    /// The intact entries still retained (at most [`RING_CAPACITY`]), oldest first.
    pub fn snapshot(&self) -> Vec<Observation> {
        self.read_since(self.head().saturating_sub(CAP))
            .observations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_ring_is_empty() {
        let ring = ObservationRing::new();
        assert_eq!(ring.head(), 0);
        assert_eq!(ring.read_since(0), ReadBatch::default());
        assert!(ring.snapshot().is_empty());
    }

    #[test]
    fn records_round_trip_in_order() {
        let ring = ObservationRing::new();
        let before = monotonic_ns();
        for i in 0..10 {
            assert_eq!(ring.record(OpCode::SemReclaim, i as u16, i * 3), i);
        }
        let b = ring.read_since(0);
        assert_eq!((b.next, b.lost, b.rejected), (10, 0, 0));
        for (i, o) in b.observations.iter().enumerate() {
            assert_eq!(o.ticket, i as u64);
            assert_eq!(o.op, OpCode::SemReclaim);
            assert_eq!(o.flags, i as u16);
            assert_eq!(o.arg, i as u64 * 3);
            assert_eq!(o.pid, std::process::id());
            assert!(o.timestamp_ns >= before);
        }
        let b2 = ring.read_since(b.next);
        assert!(b2.observations.is_empty());
        assert_eq!((b2.next, b2.lost), (10, 0));
    }

    #[test]
    fn overwritten_entries_are_counted_lost() {
        let ring = ObservationRing::new();
        for i in 0..(CAP + 10) {
            ring.record_code(0x4242, 0, i);
        }
        let b = ring.read_since(0);
        assert_eq!(b.lost, 10);
        assert_eq!(b.observations.len(), RING_CAPACITY);
        assert_eq!(b.observations[0].arg, 10);
        assert_eq!(b.observations[0].op, OpCode::Unknown(0x4242));
        assert_eq!(b.next, CAP + 10);
        assert_eq!(ring.snapshot().len(), RING_CAPACITY);
    }

    #[test]
    fn unfinished_entry_is_skipped_not_waited_for() {
        let ring = ObservationRing::new();
        ring.record(OpCode::LeaseRelease, 0, 1);
        // A producer that died after taking ticket 1 and marking its slot.
        let t = ring.head.fetch_add(1, Ordering::Relaxed);
        ring.slots[t as usize]
            .seq
            .store(writing(t), Ordering::Relaxed);
        // One that died after taking ticket 2 but before claiming its slot.
        ring.head.fetch_add(1, Ordering::Relaxed);
        ring.record(OpCode::LeaseRelease, 0, 4);
        let b = ring.read_since(0);
        assert_eq!(
            b.observations.iter().map(|o| o.arg).collect::<Vec<_>>(),
            [1, 4]
        );
        assert_eq!((b.lost, b.next), (2, 4));
        // The next lap takes the dead slot over.
        for i in 0..CAP {
            ring.record(OpCode::LeaseRelease, 0, 100 + i);
        }
        assert_eq!(ring.snapshot().len(), RING_CAPACITY);
    }

    #[test]
    fn corrupt_entry_is_rejected() {
        let ring = ObservationRing::new();
        ring.record(OpCode::SemTimeout, 0, 5);
        ring.record(OpCode::SemTimeout, 0, 6);
        ring.slots[0].arg.store(99, Ordering::Relaxed);
        let b = ring.read_since(0);
        assert_eq!(b.observations.len(), 1);
        assert_eq!(b.observations[0].arg, 6);
        assert_eq!((b.lost, b.rejected), (1, 1));
    }

    #[test]
    fn overtaken_producer_drops_its_entry() {
        let ring = ObservationRing::new();
        // Ticket CAP (next lap) published before ticket 0's producer got to its slot.
        ring.head.store(CAP + 1, Ordering::Relaxed);
        ring.slots[0].seq.store(published(CAP), Ordering::Relaxed);
        ring.head.store(0, Ordering::Relaxed);
        ring.record(OpCode::SemTimeout, 0, 1);
        assert_eq!(ring.dropped(), 1);
        assert_eq!(ring.slots[0].seq.load(Ordering::Relaxed), published(CAP));
    }

    #[test]
    fn hostile_values_do_not_panic() {
        let ring = ObservationRing::new();
        for v in [u64::MAX, u64::MAX - 1, 1 << 63, 0x5555_5555_5555_5555] {
            ring.head.store(v, Ordering::Relaxed);
            for s in &ring.slots {
                s.seq.store(v, Ordering::Relaxed);
            }
            let _ = ring.read_since(0);
            let _ = ring.read_since(v);
            let _ = ring.snapshot();
            ring.record(OpCode::LeaseRelease, 0, 0);
            let _ = ring.read_since(v.wrapping_sub(3));
        }
        // A cursor from another (longer) history resets to the head.
        let ring = ObservationRing::new();
        ring.record(OpCode::LeaseRelease, 0, 0);
        let b = ring.read_since(1000);
        assert_eq!((b.next, b.lost, b.observations.len()), (1, 0, 0));
    }

    #[test]
    fn concurrent_producers_in_one_process() {
        const THREADS: u64 = 4;
        const PER: u64 = 20_000;
        let ring = ObservationRing::new();
        let done = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (ring, done) = (&ring, &done);
                s.spawn(move || {
                    for i in 0..PER {
                        ring.record_code(0xF000 | t as u16, t as u16, t << 32 | i);
                    }
                    done.fetch_add(1, Ordering::Release);
                });
            }
            let mut last = [None::<u64>; THREADS as usize];
            let mut cursor = 0;
            let (mut seen, mut lost) = (0, 0);
            loop {
                let finished = done.load(Ordering::Acquire) == THREADS;
                let b = ring.read_since(cursor);
                assert_eq!(b.observations.len() as u64 + b.lost, b.next - cursor);
                cursor = b.next;
                seen += b.observations.len() as u64;
                lost += b.lost;
                for o in &b.observations {
                    let t = (o.arg >> 32) as usize;
                    assert_eq!(o.op.code(), 0xF000 | t as u16);
                    assert_eq!(o.flags as usize, t);
                    let i = o.arg & 0xFFFF_FFFF;
                    assert!(last[t].is_none_or(|l| l < i), "out of order");
                    last[t] = Some(i);
                }
                if finished && cursor == ring.head() {
                    break;
                }
            }
            assert_eq!(seen + lost, THREADS * PER);
            assert!(seen > 0);
        });
        assert_eq!(ring.head(), THREADS * PER);
    }
}

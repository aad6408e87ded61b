//! Unit tests of the ring protocol.

use std::sync::atomic::Ordering;

use super::slot::*;
use super::*;
use crate::clock::monotonic_ns;
use crate::op::OpCode;

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

//! Loom models of the slot protocol: worker marks/clears/beats racing a watchdog's
//! reclaim, two watchdogs racing, a stale worker racing a re-registration, and snapshots
//! racing register/unregister. Run with
//! `RUSTFLAGS="--cfg cxc_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p cxc-sync --lib -- loom_`.

use loom::sync::Arc;
use loom::thread;

use cxc_mmf::identity::{FALLBACK_BIT, Identity};

use super::layout::*;
use super::slot::{Claim, ClaimRule, is_reportable};

/// An identity for `pid` with start time `start` (fallback form; 0 = unknown).
fn id(pid: u32, start: u64) -> Identity {
    Identity {
        pid,
        pidns: 1,
        boot: 1,
        unique: if start == 0 { 0 } else { FALLBACK_BIT | start },
    }
}
use crate::primitive::Ordering;

/// A slot registered for `pid` at epoch 1 with `bits` marked; returns its owner word.
fn registered(pid: u32, bits: &[u8]) -> (Arc<HeartbeatSlot>, u64) {
    let slot = HeartbeatSlot::new_free();
    let Claim::Won { owner, .. } = slot.try_claim(pid, &id(pid, 0), 1, &ClaimRule::FreeOrFenced)
    else {
        panic!("a fresh slot must be claimable");
    };
    for &b in bits {
        assert!(slot.update_bit(owner, b, true));
    }
    (Arc::new(slot), owner)
}

/// Runs `f` on (a shared handle of) `slot` in a new thread.
fn on<R: Send + 'static>(
    slot: &Arc<HeartbeatSlot>,
    f: impl FnOnce(&HeartbeatSlot) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let slot = Arc::clone(slot);
    thread::spawn(move || f(&slot))
}

fn has(bits: u64, bit: u8) -> bool {
    bits & (1u64 << bit) != 0
}

/// A worker marks, clears and beats while a watchdog reclaims its slot: no bit is lost or
/// taken twice, a mark that failed left no bit, and once reclaimed the worker is fenced.
#[test]
fn loom_mark_vs_reclaim_no_bit_lost() {
    loom::model(|| {
        let (slot, me) = registered(10, &[1]);
        let worker = on(&slot, move |slot| {
            let m2 = slot.update_bit(me, 2, true);
            let beat = slot.beat(me, 2);
            let m40 = slot.update_bit(me, 40, true);
            let c1 = slot.update_bit(me, 1, false);
            // Once a beat saw the fence, nothing of this worker succeeds any more.
            assert!(beat || (!m40 && !c1), "fenced worker resumed");
            (m2, m40, c1)
        });
        let watchdog = on(&slot, move |slot| slot.reclaim(me));
        let (m2, m40, c1) = worker.join().unwrap();
        let (taken, newly) = watchdog
            .join()
            .unwrap()
            .expect("the live slot must be reclaimable");
        assert!(newly);
        // Bit 1 was set before: exactly one of "worker cleared it" / "watchdog took it".
        assert_eq!(
            u8::from(c1) + u8::from(has(taken, 1)),
            1,
            "bit 1 lost or doubled"
        );
        // A successful mark's bit is taken; a failed mark set nothing.
        assert_eq!(m2, has(taken, 2));
        assert_eq!(m40, has(taken, 40));
        let snap = slot.read().unwrap();
        assert!(snap.fenced);
        assert_eq!(snap.in_flight_bitmap, 0, "bits left behind after reclaim");
        // H3: the fenced worker learns it.
        assert!(!slot.beat(me, 5));
        assert!(!slot.update_bit(me, 3, true));
        assert!(!slot.update_bit(me, 2, false));
        // A second reclaim of the same report gets nothing.
        assert_eq!(slot.reclaim(me), None);
    });
}

/// Two watchdogs reclaim the same report while the worker marks one more bit: exactly one
/// fences, every bit is returned exactly once.
#[test]
fn loom_two_watchdogs_reclaim_exactly_once() {
    loom::model(|| {
        let (slot, me) = registered(10, &[0, 33]);
        let a = on(&slot, move |slot| slot.reclaim(me));
        let b = on(&slot, move |slot| slot.reclaim(me));
        let m7 = slot.update_bit(me, 7, true);
        let ra = a.join().unwrap();
        let rb = b.join().unwrap();
        assert_eq!(
            u8::from(ra.is_some()) + u8::from(rb.is_some()),
            1,
            "fenced twice"
        );
        let ta = ra.map_or(0, |r| r.0);
        let tb = rb.map_or(0, |r| r.0);
        assert_eq!(ta & tb, 0, "a bit reclaimed twice");
        let want = (1 << 0) | (1 << 33) | if m7 { 1 << 7 } else { 0 };
        assert_eq!(ta | tb, want, "a bit lost");
        assert!(!slot.beat(me, 9));
    });
}

/// A watchdog reclaims a slot, a new worker tries to register it and marks bit 1, and the
/// old (stale) worker clears bit 1 and marks bit 5 meanwhile: the stale worker never
/// touches the new registration, old bits are accounted exactly once.
#[test]
fn loom_reclaim_vs_reregister_vs_stale_worker() {
    loom::model(|| {
        let (slot, old) = registered(10, &[1]);
        let watchdog = on(&slot, move |slot| slot.reclaim(old));
        let newcomer = on(&slot, move |slot| {
            match slot.try_claim(20, &id(20, 0), 3, &ClaimRule::FreeOrFenced) {
                Claim::Won { owner, .. } => Some((owner, slot.update_bit(owner, 1, true))),
                Claim::No => None,
            }
        });
        let c1 = slot.update_bit(old, 1, false);
        let m5 = slot.update_bit(old, 5, true);
        let _ = slot.beat(old, 2); // a stale beat must not revive or disturb anything
        let (taken, _) = watchdog
            .join()
            .unwrap()
            .expect("reclaim precedes any re-registration");
        let new = newcomer.join().unwrap();
        assert_eq!(
            u8::from(c1) + u8::from(has(taken, 1)),
            1,
            "old bit 1 lost or doubled"
        );
        assert_eq!(m5, has(taken, 5), "stale mark escaped the reclaim");
        let snap = slot.read().unwrap();
        match new {
            Some((owner, marked)) => {
                assert!(marked, "the new owner must own its bitmap");
                assert_eq!(snap.generation, u64::from(gen_of(owner)));
                assert_eq!(snap.pid, 20);
                assert_eq!(
                    snap.in_flight_bitmap,
                    1 << 1,
                    "stale worker touched the new registration"
                );
                assert!(!snap.fenced);
                assert_eq!(
                    slot.reclaim(old),
                    None,
                    "stale report reclaimed the new registration"
                );
                assert_eq!(slot.clear_reported(old, 1 << 1), None);
                assert!(slot.beat(owner, 4));
            }
            None => {
                assert_eq!(snap.pid, 10);
                assert!(snap.fenced);
                assert_eq!(snap.in_flight_bitmap, 0);
            }
        }
        assert!(!slot.beat(old, 4));
    });
}

/// `clear_reported` erases only the reported bits: a bit marked after the scan survives
/// and the fenced slot is reported again.
#[test]
fn loom_clear_keeps_bits_marked_after_scan() {
    loom::model(|| {
        let (slot, me) = registered(10, &[4]);
        let report = slot.read().unwrap();
        let worker = on(&slot, move |slot| slot.update_bit(me, 6, true));
        let cleared = slot.clear_reported(me, report.in_flight_bitmap);
        let m6 = worker.join().unwrap();
        let (erased, newly) = cleared.unwrap();
        assert!(newly);
        assert_eq!(erased, 1 << 4);
        let snap = slot.read().unwrap();
        assert_eq!(
            has(snap.in_flight_bitmap, 6),
            m6,
            "post-scan bit erased or invented"
        );
        assert_eq!(snap.in_flight_bitmap & (1 << 4), 0);
        assert_eq!(is_reportable(&snap, 1, 3, false), m6);
    });
}

/// Snapshots taken while the slot is unregistered and re-registered never mix fields of
/// two registrations.
#[test]
fn loom_snapshot_consistent_under_churn() {
    loom::model(|| {
        let (slot, first) = registered(10, &[3]);
        let g1 = u64::from(gen_of(first));
        let churn = on(&slot, move |slot| {
            assert!(slot.update_bit(first, 3, false));
            assert!(slot.release(first));
            if let Claim::Won { owner, .. } =
                slot.try_claim(20, &id(20, 777), 7, &ClaimRule::FreeOrFenced)
            {
                assert!(slot.update_bit(owner, 9, true));
            }
        });
        for _ in 0..2 {
            let Some(s) = slot.read() else { continue };
            match s.pid {
                10 => {
                    assert_eq!(s.generation, g1);
                    assert_eq!(s.last_seen_epoch, 1);
                    assert_eq!(s.in_flight_bitmap & !(1 << 3), 0);
                    assert_eq!(s.start_time, 0);
                }
                20 => {
                    assert_eq!(s.generation, g1 + 1);
                    assert_eq!(s.last_seen_epoch, 7);
                    assert_eq!(s.in_flight_bitmap & !(1 << 9), 0);
                    // The identity is written right after the owner CAS: a snapshot in
                    // between says "unknown", never the previous registration's value,
                    // and a snapshot that sees the new registration's bits sees it.
                    assert!(s.start_time == 777 || s.start_time == 0);
                    assert!(s.identity == id(20, 777) || s.identity == Identity::default());
                    if s.in_flight_bitmap != 0 {
                        assert_eq!(s.start_time, 777);
                        assert_eq!(s.identity, id(20, 777));
                    }
                }
                0 => {
                    assert_eq!(s.in_flight_bitmap, 0);
                    assert_eq!(s.generation, g1);
                }
                p => panic!("unexpected pid {p}"),
            }
        }
        churn.join().unwrap();
        assert_eq!(slot.owner.load(Ordering::Relaxed) >> 32, 20);
    });
}

/// A registrant reuses the empty slot of a process the OS says is dead while a watchdog
/// (holding an old report) fences it: exactly one of them changes the owner word, and
/// the loser changes nothing.
#[test]
fn loom_os_dead_reuse_vs_fence() {
    loom::model(|| {
        let slot = Arc::new(HeartbeatSlot::new_free());
        let Claim::Won { owner: old, .. } =
            slot.try_claim(10, &id(10, 555), 1, &ClaimRule::FreeOrFenced)
        else {
            panic!("a fresh slot must be claimable");
        };
        let registrant = on(&slot, move |slot| {
            let dead = |i: &Identity| *i == id(10, 555);
            slot.try_claim(30, &id(30, 0), 2, &ClaimRule::OsDead(&dead))
        });
        let fenced = slot.fence(old);
        let claim = registrant.join().unwrap();
        let snap = slot.read().unwrap();
        match claim {
            Claim::Won { owner, reused } => {
                assert!(reused);
                assert_eq!(fenced, None, "fenced a slot that was re-registered");
                assert_eq!((snap.pid, snap.fenced), (30, false));
                assert_eq!(snap.generation, u64::from(gen_of(owner)));
                assert!(slot.update_bit(owner, 0, true));
            }
            Claim::No => {
                assert_eq!(fenced, Some(true));
                assert_eq!((snap.pid, snap.fenced), (10, true));
                // The fenced, empty slot is reusable the ordinary way.
                assert!(matches!(
                    slot.try_claim(30, &id(30, 0), 2, &ClaimRule::FreeOrFenced),
                    Claim::Won { .. }
                ));
            }
        }
        assert!(!slot.beat(old, 3));
    });
}

/// A registrant preempted anywhere after its owner CAS (a SIGSTOP) while a watchdog
/// fences that registration and a second registrant takes the slot and marks a bit:
/// whatever the first one does when it resumes, the second registration keeps its bit,
/// its identity and its slot, and the first one's registration is dead.
#[test]
fn loom_stalled_registrant_never_overwrites_the_next_registration() {
    loom::model(|| {
        let slot = Arc::new(HeartbeatSlot::new_free());
        let first = on(&slot, |slot| {
            slot.try_claim(10, &id(10, 7), 1, &ClaimRule::FreeOrFenced)
        });
        let seen = loop {
            let o = slot.owner.load(Ordering::Acquire);
            if pid_of(o) == 10 {
                break o;
            }
            thread::yield_now();
        };
        assert_eq!(slot.reclaim(seen).map(|(bits, _)| bits), Some(0));
        let Claim::Won { owner, .. } = slot.try_claim(20, &id(20, 9), 2, &ClaimRule::FreeOrFenced)
        else {
            panic!("a fenced, empty slot must be claimable");
        };
        assert!(slot.update_bit(owner, 1, true));
        let first = first.join().unwrap();
        let snap = slot.read().unwrap();
        assert_eq!(
            (snap.pid, snap.fenced, snap.in_flight_bitmap),
            (20, false, 1 << 1),
            "the resumed registrant touched the new registration"
        );
        assert_eq!(snap.identity, id(20, 9), "identity overwritten");
        assert!(slot.beat(owner, 3));
        assert!(slot.update_bit(owner, 1, false));
        if let Claim::Won { owner: old, .. } = first {
            assert!(!slot.beat(old, 3));
            assert!(!slot.update_bit(old, 2, true));
        }
    });
}

/// A registrant on behalf of a dead pid (the identity it records is dead from the start)
/// marks a unit right after registering, while a newcomer reuses the slot by OS identity
/// (register pass 2). The unit is never lost: either the mark fails (the registrant was
/// fenced, and knows it), or the bit stands in the registration that holds the slot,
/// which the newcomer then did not take. Without the fence at the start of pass 2 loom
/// finds the registrant's late live tag letting its mark land between the newcomer's
/// close and owner CAS, in a half no snapshot shows (`attack28_mp` drives the same
/// interleaving with real processes).
#[test]
fn loom_pass2_reuse_never_loses_a_late_registrants_unit() {
    loom::model(|| {
        let slot = Arc::new(HeartbeatSlot::new_free());
        let proxy = on(&slot, |slot| {
            match slot.try_claim(10, &id(10, 555), 1, &ClaimRule::FreeOrFenced) {
                Claim::Won { owner, .. } => slot.update_bit(owner, 40, true),
                Claim::No => false,
            }
        });
        let dead = |i: &Identity| *i == id(10, 555);
        // Once the registrant's identity is complete (spinning costs no preemption).
        while !slot.identity(slot.owner.load(Ordering::Acquire)).is_known() {
            thread::yield_now();
        }
        let newcomer = slot.try_claim(30, &id(30, 0), 2, &ClaimRule::OsDead(&dead));
        let marked = proxy.join().unwrap();
        let snap = slot.read().unwrap();
        if marked {
            assert_eq!(
                (snap.pid, snap.in_flight_bitmap & (1 << 40)),
                (10, 1 << 40),
                "unit 40 lost: {snap:?}"
            );
            assert_eq!(newcomer, Claim::No);
        }
    });
}

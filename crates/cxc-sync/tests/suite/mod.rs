//! The backend property suite: `docs/design.md` §3's lease properties (L1 exclusion, L2 fencing,
//! L3 stale claims, increasing generations) and semaphore properties (S1 never above
//! max, S2 no overflow), stated once against the [`FencedLease`] and [`PermitPool`]
//! traits and run against every backend: the mapped-file primitives here
//! (`tests/backend.rs`) and etcd (`crates/cxc-etcd/tests/backend_suite.rs`, which
//! includes this file).
//!
//! Each suite takes a factory that opens a new handle on one shared, fresh resource; every
//! handle is a distinct holder identity (its own pid, its own etcd session).
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{FencedLease, PermitPool};

/// Generous bound for "happens promptly" on a loaded 2-core machine.
const PROMPT: Duration = Duration::from_secs(5);
/// Slack for timer granularity when checking that a timeout was waited out.
const SLACK: Duration = Duration::from_millis(10);

/// Shorthand: unwrap a backend result with the operation's name.
fn ok<T, E: std::fmt::Debug>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: backend error {e:?}"))
}

/// `r` must be a refusal (`Ok(false)`): else the test fails with `why`.
fn refused<E: std::fmt::Debug>(what: &str, r: Result<bool, E>, why: &str) {
    assert!(!ok(what, r), "{why}");
}

/// Runs every lease property. The resource must start vacant with payload 0.
pub fn lease_properties<L, F>(make: F)
where
    L: FencedLease<Value = u64> + Send + Sync,
    F: Fn() -> L,
{
    let a = make();
    let b = make();
    exclusive_and_idempotent(&a, &b);
    fenced_operations(&a, &b);
    generations_increase(&a, &b);
    acquire_wakes_on_release(&a, &b);
    guards(&a, &b);
    let many: Vec<L> = (0..3).map(|_| make()).collect();
    exclusion_under_contention(&many, 15);
}

/// The guard shape (`FencedLeaseGuards`): exclusion, fenced writes, release on drop, a
/// loss reported by the stale guard, tokens strictly increasing.
fn guards<L: FencedLease<Value = u64>>(a: &L, b: &L) {
    use cxc_sync::{FencedLeaseGuards, GuardError};
    let g = ok("a guards", a.try_lock_guard()).expect("vacant");
    assert!(ok("b tries", b.try_lock_guard()).is_none(), "held");
    g.update(|v| *v += 5).expect("holder updates");
    let t1 = g.token();
    assert!(ok("is_current", g.is_current()));
    drop(g);
    let g = ok("b guards", b.lock_guard_timeout(Duration::from_secs(5))).expect("released");
    assert!(g.token() > t1, "tokens increase across guards");
    let v = g.read().expect("read");
    g.write(v + 1).expect("write");
    g.unlock().expect("a current guard unlocks");
    let g1 = ok("a guards again", a.try_lock_guard()).expect("vacant");
    // Steal it through the claim API to make g1 stale: release it under g1's feet.
    assert!(ok("release", a.release(g1.claim())));
    let g2 = ok("b guards", b.try_lock_guard()).expect("vacant after the release");
    assert!(
        matches!(g1.write(0), Err(GuardError::Lost { .. })),
        "stale guard fenced"
    );
    assert!(matches!(g1.unlock(), Err(GuardError::Lost { .. })));
    assert!(ok("still b", g2.is_current()));
    assert!(g2.token() > t1);
    g2.write(0)
        .expect("restore the payload for the next property");
    drop(g2);
}

/// L1: one holder; claiming again is idempotent; a blocked claimant times out.
fn exclusive_and_idempotent<L: FencedLease<Value = u64>>(a: &L, b: &L) {
    let c = ok("a claims", a.try_claim()).expect("a vacant lease is claimable");
    assert!(ok("b claims", b.try_claim()).is_none(), "L1: two holders");
    let again = ok("a claims again", a.try_claim()).expect("the holder claims again");
    assert_eq!(
        L::generation(&again),
        L::generation(&c),
        "claiming a held lease again must return the same claim"
    );
    assert!(ok("is_current", a.is_current(&c)));
    let t = Instant::now();
    let timeout = Duration::from_millis(150);
    assert!(
        ok("b acquire", b.acquire(timeout)).is_none(),
        "L1: acquire succeeded while held"
    );
    assert!(
        t.elapsed() + SLACK >= timeout,
        "acquire returned after {:?}, before its timeout {timeout:?}",
        t.elapsed()
    );
    assert!(ok("a releases", a.release(&c)));
}

/// L2/L3: a stale claim's read, write, beat and release fail and change nothing.
fn fenced_operations<L: FencedLease<Value = u64>>(a: &L, b: &L) {
    let c1 = ok("a claims", a.try_claim()).expect("vacant");
    assert!(ok("write", a.write(&c1, 11)));
    assert_eq!(ok("read", a.read(&c1)), Some(11));
    assert!(ok("beat", a.beat(&c1)));
    assert!(ok("release", a.release(&c1)));
    refused(
        "is_current",
        a.is_current(&c1),
        "released claim still current",
    );
    assert_eq!(
        ok("read", a.read(&c1)),
        None,
        "L2: read through a released claim"
    );
    refused(
        "write",
        a.write(&c1, 12),
        "L2: write through a released claim",
    );
    refused("beat", a.beat(&c1), "L2: beat through a released claim");
    refused("release", a.release(&c1), "L3: second release succeeded");

    let c2 = ok("b claims", b.try_claim()).expect("released lease is claimable");
    assert!(
        L::generation(&c2) > L::generation(&c1),
        "generation did not increase: {} then {}",
        L::generation(&c1),
        L::generation(&c2)
    );
    refused("stale write", a.write(&c1, 13), "L2: stale write accepted");
    refused(
        "stale release",
        a.release(&c1),
        "L3: stale release accepted",
    );
    assert!(!ok("stale beat", a.beat(&c1)), "L2: stale beat accepted");
    assert!(
        ok("b current", b.is_current(&c2)),
        "L3: stale ops disturbed the holder"
    );
    assert_eq!(
        ok("b reads", b.read(&c2)),
        Some(11),
        "payload changed by a stale claim"
    );
    assert!(ok("b writes", b.write(&c2, 0)));
    assert!(ok("b releases", b.release(&c2)));
}

/// Fencing tokens strictly increase across handovers between holders.
fn generations_increase<L: FencedLease<Value = u64>>(a: &L, b: &L) {
    let mut last = 0u64;
    for round in 0..6 {
        let h = if round % 2 == 0 { a } else { b };
        let c = ok("claim", h.try_claim()).expect("vacant");
        let g = L::generation(&c);
        assert!(g > last, "round {round}: generation {g} after {last}");
        last = g;
        assert!(ok("release", h.release(&c)));
    }
}

/// A blocked `acquire` returns promptly once the holder releases.
fn acquire_wakes_on_release<L: FencedLease<Value = u64> + Sync>(a: &L, b: &L) {
    let c = ok("a claims", a.try_claim()).expect("vacant");
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            let got = ok("b acquire", b.acquire(PROMPT * 2));
            (got, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(ok("a releases", a.release(&c)));
        let (got, took) = waiter.join().expect("waiter");
        let got = got.expect("acquire after release timed out");
        assert!(took < PROMPT, "acquire took {took:?} after a release");
        assert!(L::generation(&got) > L::generation(&c));
        assert!(ok("b releases", b.release(&got)));
    });
}

/// Runs `f` with each handle on a thread of its own, all at once; returns once all are
/// done.
fn on_each<H: Sync>(handles: &[H], f: impl Fn(&H) + Sync) {
    std::thread::scope(|s| {
        for h in handles {
            let f = &f;
            s.spawn(move || f(h));
        }
    });
}

/// L1 + L2 under contention: threads (one handle each) increment the payload under the
/// lease; nobody is ever inside together and no increment is lost.
fn exclusion_under_contention<L: FencedLease<Value = u64> + Sync>(handles: &[L], rounds: u64) {
    let inside = AtomicU32::new(0);
    let done = AtomicU64::new(0);
    on_each(handles, |h| {
        for _ in 0..rounds {
            let c = ok("acquire", h.acquire(PROMPT * 4)).expect("acquire timed out");
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "L1: two holders");
            let v = ok("read", h.read(&c)).expect("holder cannot read");
            assert!(ok("write", h.write(&c, v + 1)), "holder's write refused");
            inside.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(1, Ordering::SeqCst);
            assert!(ok("release", h.release(&c)));
        }
    });
    let h = &handles[0];
    let c = ok("final claim", h.try_claim()).expect("vacant at the end");
    let total = handles.len() as u64 * rounds;
    assert_eq!(done.load(Ordering::SeqCst), total);
    assert_eq!(ok("final read", h.read(&c)), Some(total), "lost updates");
    assert!(ok("final release", h.release(&c)));
}

/// Runs every pool property. The pool must be fresh (all permits free), `max >= 2`.
pub fn pool_properties<P, F>(make: F)
where
    P: PermitPool + Send + Sync,
    F: Fn() -> P,
{
    let a = make();
    let b = make();
    assert!(a.max() >= 2, "the suite needs at least 2 permits");
    assert_eq!(a.max(), b.max());
    give_when_full_refused(&a);
    take_all_then_block(&a, &b);
    take_wakes_on_give(&a, &b);
    pool_guards(&a, &b);
    let many: Vec<P> = (0..4).map(|_| make()).collect();
    never_above_max(&many, 10);
}

/// The guard shape (`PermitPoolGuards`): permits given back on drop.
fn pool_guards<P: PermitPool>(a: &P, b: &P) {
    use cxc_sync::PermitPoolGuards;
    let max = a.max();
    let mut held = Vec::new();
    for _ in 0..max {
        held.push(ok("take", a.try_permit()).expect("free"));
    }
    assert!(ok("none left", b.try_permit()).is_none());
    held.pop();
    let p = ok("b waits", b.permit_timeout(Duration::from_secs(5))).expect("one came back");
    p.give_back().expect("given back");
    drop(held);
    assert_eq!(ok("available", a.available()), max);
}

/// S2: giving with nothing to give is refused and changes nothing.
fn give_when_full_refused<P: PermitPool>(a: &P) {
    assert_eq!(ok("available", a.available()), a.max());
    assert!(!ok("give", a.give()), "S2: give beyond max accepted");
    assert_eq!(
        ok("available", a.available()),
        a.max(),
        "S2: count above max"
    );
}

/// S1: exactly `max` takes succeed; the next blocks until its timeout.
fn take_all_then_block<P: PermitPool>(a: &P, b: &P) {
    let max = a.max();
    for i in 0..max {
        assert!(ok("take", a.try_take()), "take {i} of {max} refused");
    }
    assert!(!ok("take", a.try_take()), "S1: took more than max");
    assert!(!ok("take", b.try_take()), "S1: took more than max");
    assert_eq!(ok("available", b.available()), 0);
    let timeout = Duration::from_millis(150);
    let t = Instant::now();
    refused(
        "take_timeout",
        b.take_timeout(timeout),
        "S1: took more than max",
    );
    assert!(
        t.elapsed() + SLACK >= timeout,
        "take_timeout returned after {:?}, before {timeout:?}",
        t.elapsed()
    );
    assert!(ok("give", a.give()));
    assert_eq!(ok("available", a.available()), 1);
    assert!(ok("take", b.try_take()));
    assert!(ok("give", b.give()));
    for _ in 1..max {
        assert!(ok("give", a.give()));
    }
    assert_eq!(ok("available", a.available()), max);
    assert!(!ok("give", a.give()), "S2: give beyond max accepted");
}

/// A blocked `take_timeout` returns promptly once a permit is given.
fn take_wakes_on_give<P: PermitPool + Sync>(a: &P, b: &P) {
    for _ in 0..a.max() {
        assert!(ok("take", a.try_take()));
    }
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            (ok("take_timeout", b.take_timeout(PROMPT * 2)), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(ok("give", a.give()));
        let (got, took) = waiter.join().expect("waiter");
        assert!(got, "take_timeout after a give timed out");
        assert!(took < PROMPT, "take_timeout took {took:?} after a give");
    });
    assert!(ok("give", b.give()));
    for _ in 1..a.max() {
        assert!(ok("give", a.give()));
    }
    assert_eq!(ok("available", a.available()), a.max());
}

/// S1 under contention: threads (one handle each) take and give; never more than `max`
/// inside at once.
fn never_above_max<P: PermitPool + Sync>(handles: &[P], rounds: u32) {
    let max = handles[0].max();
    let inside = AtomicU32::new(0);
    let peak = AtomicU32::new(0);
    on_each(handles, |h| {
        for _ in 0..rounds {
            assert!(ok("take", h.take_timeout(PROMPT * 4)), "take timed out");
            let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(n <= max, "S1: {n} permits out of {max}");
            peak.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            inside.fetch_sub(1, Ordering::SeqCst);
            assert!(ok("give", h.give()), "give of a taken permit refused");
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= max);
    assert_eq!(ok("available", handles[0].available()), max);
}

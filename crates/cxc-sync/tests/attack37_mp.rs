//! attack37: the owner lease against a holder that forks *inside* an update, and against
//! one process mixing guards, claims and seed calls on sibling threads while another
//! process contends and both are SIGSTOPped at random (docs/owner-lease.md: Identity,
//! "A claim belongs to the process that made it", L2, L4, L7, Pitfalls).
//!
//! 1. A `with_lease` closure that calls `fork`: the child returns from the closure and
//!    carries on with the rest of the parent's `with_lease` (fill the staging buffer,
//!    publish). The forker is SIGKILLed; a new holder takes the lease over as dead (the
//!    forker's whole process is gone, so its staging buffer is not quarantined), writes
//!    until its published buffer is the forker's old staging buffer, then lets the
//!    forked child run on. The published value must stay the new holder's. Both the
//!    claiming `with_lease` and the nested one (the pid already holds the lease).
//! 2. The same fork inside `with_lease`, with the forker alive (blocked in its closure):
//!    the forked child must neither publish under the forker's claim nor release it.
//! 3. Chaos: two processes of three threads each (a guard thread; a claims-API thread;
//!    a seed-call thread sharing the claims thread's pid, whose `release(pid)` and nested
//!    `with_lease` hit its sibling's claim), clock epochs with a short grace, and the
//!    parent SIGSTOPs/SIGCONTs the processes at random. Every value written is sealed and
//!    unique (writer, sequence); every value any holder reads must be intact and one
//!    whose write was reported published, never one whose writer was told it failed.
//!
//! Tests 1 and 2 failed before `with_lease` asked, after the closure, whether this process
//! is still the one that made the claim (the guards' `write` already asked): the forked
//! child published its value under the live forker's claim and released it (2), and,
//! after a dead takeover that skipped the quarantine, overwrote the new holder's published
//! buffer with a value it never published (1: the holder read `sealed(CHILD_VAL)` back,
//! intact, after writing its own). The child's `with_lease` now returns `None` and
//! touches nothing shared.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cxc_sync::{EpochMode, GuardError, LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, intact, path_arg, play_role, read_word, report, sealed, serial,
    sigkill, sleep_forever, wait_until,
};

type P = [u64; 6];

/// A heartbeat grace no test reaches: only the OS identity ends a claim.
const BIG: u64 = 1 << 40;
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// The claim word: file offset 128 (the lease block follows the 128-byte header).
const CLAIM_AT: u64 = 128;
const WRITE_BIT: u64 = 1 << 14;

fn me() -> u32 {
    std::process::id()
}

fn holder_of(w: u64) -> u64 {
    w & 0xFF
}
fn pub_of(w: u64) -> u64 {
    (w >> 8) & 7
}
fn stage_of(w: u64) -> u64 {
    (w >> 11) & 7
}

fn manual_never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Manual,
        ..LeaseOptions::default()
    }
}

/// The value the forked child's copy of `with_lease` tries to publish.
const CHILD_VAL: u64 = 0xC41D_0000_0000;

// ---------------------------------------------------------------------------------------
// 1 and 2. fork inside a `with_lease` closure.
// ---------------------------------------------------------------------------------------

/// Role: claims through `with_lease` (or, with `nested=1`, first `try_acquire`s and then
/// runs a nested `with_lease`), and forks inside the closure. The forked child waits for
/// the marker `go`, sets the value to `sealed(CHILD_VAL)` and returns from the closure
/// into the rest of `with_lease`; it then records what `with_lease` returned in
/// `child_done` and leaves with `_exit`. The forker itself reports the child's pid and
/// blocks in its closure until it is killed.
fn role_forker() {
    let path = path_arg("path");
    let lease: OwnerLease<P> = OwnerLease::open(&path).unwrap();
    if arg("disarm") == "1" {
        // Docs, The sentinel: "A slot that two handles of one process use is armed by the
        // first and stays unarmed after that one drops": the takeover after our death is
        // then decided by the OS identity alone (dead, no quarantine).
        let first: OwnerLease<P> = OwnerLease::open(&path).unwrap();
        assert!(first.try_acquire(me(), BIG));
        assert!(first.release(me()));
        assert!(lease.try_acquire(me(), BIG));
        assert!(lease.release(me()));
        drop(first);
    }
    let dir = path_arg("dir");
    let go = dir.join("go");
    let done = dir.join("child_done");
    if arg("nested") == "1" {
        assert!(lease.try_acquire(me(), BIG));
    }
    let r = lease.with_lease(me(), BIG, |v| {
        // SAFETY: fork in a role process; the child only polls a file, sleeps, and goes
        // on in the library's own code (atomics on the shared mapping), then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !go.exists() {
                if Instant::now() > deadline {
                    // SAFETY: leave the forked child without running anything else.
                    unsafe { libc::_exit(3) };
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            *v = sealed(CHILD_VAL);
            return 7u32;
        }
        report(format!("forked child={pid}"));
        sleep_forever()
    });
    // Only the forked child gets here.
    let _ = std::fs::write(&done, format!("{r:?}"));
    // SAFETY: leave the forked child without running the destructors of the parent's
    // state (the handle's drop is not what this test attacks).
    unsafe { libc::_exit(0) }
}

fn spawn_forker(test: &str, path: &Path, dir: &Path, nested: bool, disarm: bool) -> (Proc, u32) {
    let mut p = RoleCommand::new(test, "forker")
        .arg("path", path)
        .arg("dir", dir)
        .arg("nested", if nested { "1" } else { "0" })
        .arg("disarm", if disarm { "1" } else { "0" })
        .spawn();
    let line = p.next_report(REPORT_WAIT);
    let child: u32 = line
        .strip_prefix("forked child=")
        .unwrap_or_else(|| panic!("bad report {line:?}"))
        .parse()
        .unwrap();
    (p, child)
}

fn wait_child_done(dir: &Path, child: u32) -> String {
    let done = dir.join("child_done");
    let ok = wait_until(Duration::from_secs(30), || done.exists());
    if !ok {
        sigkill(child);
        panic!("the forked child never finished its with_lease");
    }
    // Give the write a moment to land completely.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::read_to_string(&done).unwrap()
}

/// One round of test 1: returns (whether the new holder's published buffer was the
/// forker's old staging buffer, what the forked child's `with_lease` returned, the value
/// read back).
fn fork_then_die_round(test: &str, nested: bool, disarm: bool) -> (bool, String, P, P, String) {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let lease: OwnerLease<P> = OwnerLease::create_with(&path, sealed(1), &manual_never()).unwrap();
    let (mut forker, child) = spawn_forker(test, &path, d.path(), nested, disarm);
    let w = read_word(&path, CLAIM_AT);
    assert_ne!(holder_of(w), 0, "the forker holds the lease: {w:#x}");
    assert_ne!(w & WRITE_BIT, 0, "the forker is inside with_lease: {w:#x}");
    let s = stage_of(w);
    // The forker's whole process dies; only the forked child (another identity) lives.
    forker.kill();
    let claim = lease
        .acquire(me(), BIG, Duration::from_secs(20))
        .expect("the dead forker's claim is taken over");
    // Write until the published buffer is the forker's old staging buffer (the one the
    // forked child's copy of with_lease will fill).
    let mut mine = sealed(1);
    let mut armed = false;
    for k in 0..16u64 {
        let v = sealed(1000 + k);
        assert!(lease.write_claimed(&claim, v), "our write {k} failed");
        mine = v;
        if pub_of(read_word(&path, CLAIM_AT)) == s {
            armed = true;
            break;
        }
    }
    std::fs::write(d.path().join("go"), b"").unwrap();
    let child_said = wait_child_done(d.path(), child);
    let got = lease.read_claimed(&claim).expect("we still hold the lease");
    assert!(lease.release_claim(&claim));
    let c = lease.stats();
    let how = format!("{c:?}");
    (armed, child_said, mine, got, how)
}

const FORK_DIE: &str =
    "forked_child_of_a_dead_with_lease_holder_never_overwrites_the_next_holders_value";

/// Docs, Identity: "when a claiming process is proven dead, nothing of it — not even a
/// forked child holding its token — can still write, which is what lets a dead takeover
/// skip the quarantine"; L7: "no byte of an abandoned write is ever published"; Write:
/// "the published one is never written".
#[test]
fn forked_child_of_a_dead_with_lease_holder_never_overwrites_the_next_holders_value() {
    play_role!(role_forker);
    let _s = serial();
    let mut armed_rounds = 0;
    // (nested, disarmed sentinel)
    let rounds = [(false, false), (false, true), (true, true), (false, true)];
    for (round, &(nested, disarm)) in rounds.iter().enumerate() {
        let (armed, child_said, mine, got, how) = fork_then_die_round(FORK_DIE, nested, disarm);
        eprintln!(
            "round {round} nested={nested} disarm={disarm}: armed={armed} child's \
             with_lease={child_said} ours={:#x} read back={:#x} intact={} stats={how}",
            mine[0],
            got[0],
            intact(&got)
        );
        armed_rounds += usize::from(armed);
        assert!(
            intact(&got),
            "round {round}: torn payload read back: {got:x?}"
        );
        assert_ne!(
            got[0], CHILD_VAL,
            "round {round} (nested={nested}): the forked child of the dead forker published \
             its value into the new holder's buffer (child's with_lease returned {child_said})"
        );
        assert_eq!(got, mine, "round {round}: not our last write");
    }
    eprintln!("{armed_rounds}/4 rounds had the new holder publish the forker's old stage");
}

const FORK_LIVE: &str = "forked_child_of_a_live_with_lease_holder_neither_publishes_nor_releases";

/// Docs, Identity: "A claim belongs to the process that made it. A `LeaseClaim` token
/// or a guard copied into a forked child ... cannot write, read, beat or release";
/// "The cache is correct after `fork` without `exec`: the child is a new identity".
#[test]
fn forked_child_of_a_live_with_lease_holder_neither_publishes_nor_releases() {
    play_role!(role_forker);
    let _s = serial();
    for round in 0..2 {
        let nested = round == 1;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lease");
        let lease: OwnerLease<P> =
            OwnerLease::create_with(&path, sealed(1), &manual_never()).unwrap();
        let (mut forker, child) = spawn_forker(FORK_LIVE, &path, d.path(), nested, false);
        let before = read_word(&path, CLAIM_AT);
        std::fs::write(d.path().join("go"), b"").unwrap();
        let child_said = wait_child_done(d.path(), child);
        let after = read_word(&path, CLAIM_AT);
        let st = lease.status();
        let value = lease.with_lease(me(), 0, |v| *v);
        eprintln!(
            "round {round} nested={nested}: word {before:#x} -> {after:#x}, child's \
             with_lease={child_said}, forker alive={}, owner={:?}, our with_lease read {:?}",
            forker.try_wait().is_none(),
            st.owner,
            value.map(|v| v[0])
        );
        assert!(forker.try_wait().is_none(), "the forker still lives");
        assert_eq!(
            holder_of(after),
            holder_of(before),
            "round {round} (nested={nested}): the forker's claim was released by its \
             forked child (child's with_lease returned {child_said}): {before:#x} -> {after:#x}"
        );
        assert_eq!(
            pub_of(after),
            pub_of(before),
            "round {round} (nested={nested}): the forked child published under the \
             forker's claim: {before:#x} -> {after:#x}"
        );
        forker.kill();
    }
}

// ---------------------------------------------------------------------------------------
// 3. Guards, claims and seed calls on sibling threads, two processes, random stops.
// ---------------------------------------------------------------------------------------

const CHAOS: &str =
    "mixed_guard_claim_and_seed_threads_under_stops_never_read_a_failed_or_torn_value";
/// Grace of every claim: 30 epochs of 1 ms.
const CHAOS_GRACE: u64 = 30;

fn chaos_open(path: &Path) -> Arc<OwnerLease<P>> {
    Arc::new(
        OwnerLease::builder(path)
            .grace(Duration::from_millis(CHAOS_GRACE))
            .open::<P>()
            .unwrap(),
    )
}

/// What one thread did: values it was told were published, values it was told were not
/// (its writer learned it lost), values it read as a holder, torn copies it read.
#[derive(Default)]
struct Log {
    ok: Vec<u64>,
    fail: Vec<u64>,
    seen: Vec<u64>,
    torn: Vec<String>,
}

impl Log {
    fn saw(&mut self, v: &P, how: &str) {
        if intact(v) {
            self.seen.push(v[0]);
        } else {
            self.torn.push(format!("{how}:{v:x?}").replace(' ', ""));
        }
    }
}

/// Role: three threads on one handle (a guard thread, a claims thread and a seed thread
/// sharing the claims thread's pid), until the marker `stop`; then writes its log.
fn role_chaos() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let w: u64 = arg("w").parse().unwrap();
    let lease = chaos_open(&path);
    let stop = dir.join("stop");
    let deadline = Instant::now() + Duration::from_secs(40);
    let running = move || !stop.exists() && Instant::now() < deadline;
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let lease = Arc::clone(&lease);
        let running = running.clone();
        threads.push(std::thread::spawn(move || {
            let mut log = Log::default();
            let mut rng = Rng::new(cxc_testkit::mix(u64::from(me()) << 8 | t));
            let mut seq = 0u64;
            let mut next = || {
                seq += 1;
                sealed((w << 48) | (t << 40) | seq)
            };
            let mut n = 0u64;
            while running() {
                n += 1;
                match t {
                    0 => {
                        let Some(g) = lease.lock_timeout(Duration::from_millis(200)) else {
                            continue;
                        };
                        let first = match g.read() {
                            Err(GuardError::Inconsistent) => {
                                g.acknowledge_inconsistent();
                                g.read()
                            }
                            r => r,
                        };
                        if let Ok(v) = first {
                            log.saw(&v, "guard-read");
                        }
                        for _ in 0..rng.below(4) + 1 {
                            let v = next();
                            match g.write(v) {
                                Ok(()) => log.ok.push(v[0]),
                                Err(_) => {
                                    log.fail.push(v[0]);
                                    break;
                                }
                            }
                            if let Ok(v) = g.read() {
                                log.saw(&v, "guard-reread");
                            }
                        }
                        drop(g);
                    }
                    1 => {
                        let Some(c) = lease.acquire(me(), CHAOS_GRACE, Duration::from_millis(200))
                        else {
                            continue;
                        };
                        if let Some(v) = lease.read_claimed(&c) {
                            log.saw(&v, "claim-read");
                        }
                        for _ in 0..rng.below(4) + 1 {
                            let v = next();
                            if lease.write_claimed(&c, v) {
                                log.ok.push(v[0]);
                            } else {
                                log.fail.push(v[0]);
                                break;
                            }
                            if let Some(v) = lease.read_claimed(&c) {
                                log.saw(&v, "claim-reread");
                            }
                        }
                        let _ = lease.release_claim(&c);
                    }
                    _ => match rng.below(4) {
                        0 | 1 => {
                            let v = next();
                            let mut ran = false;
                            let mut input = None;
                            let r = lease.with_lease(me(), CHAOS_GRACE, |x| {
                                ran = true;
                                input = Some(*x);
                                *x = v;
                            });
                            if let Some(x) = input {
                                log.saw(&x, "with_lease-input");
                            }
                            if r.is_some() {
                                log.ok.push(v[0]);
                            } else if ran {
                                log.fail.push(v[0]);
                            }
                        }
                        2 => {
                            if lease.try_acquire(me(), CHAOS_GRACE) {
                                if let Some(x) = lease.read_as_owner(me()) {
                                    log.saw(&x, "seed-read");
                                }
                                let v = next();
                                if lease.write_as_owner(me(), v) {
                                    log.ok.push(v[0]);
                                } else {
                                    log.fail.push(v[0]);
                                }
                                if let Some(x) = lease.read_as_owner(me()) {
                                    log.saw(&x, "seed-reread");
                                }
                                // Releases the claims thread's claim too, when it is the
                                // one held for this pid.
                                let _ = lease.release(me());
                            }
                        }
                        _ => {
                            // A sibling's release in the middle of the claims thread's
                            // (or this thread's) work.
                            let _ = lease.release(me());
                        }
                    },
                }
                if n.is_multiple_of(4) {
                    std::thread::sleep(Duration::from_micros(rng.below(300)));
                }
            }
            log
        }));
    }
    let mut out = String::new();
    let (mut ok, mut fail, mut seen, mut torn) = (0, 0, 0, 0);
    for h in threads {
        let log = h.join().unwrap();
        ok += log.ok.len();
        fail += log.fail.len();
        seen += log.seen.len();
        torn += log.torn.len();
        for v in log.ok {
            out.push_str(&format!("o {v}\n"));
        }
        for v in log.fail {
            out.push_str(&format!("f {v}\n"));
        }
        for v in log.seen {
            out.push_str(&format!("s {v}\n"));
        }
        for t in log.torn {
            out.push_str(&format!("t {t}\n"));
        }
    }
    std::fs::write(dir.join(format!("log{w}")), out).unwrap();
    report(format!("ok={ok} fail={fail} seen={seen} torn={torn}"));
}

/// Docs: L2 "a superseded holder's write, `with_lease` or beat fails"; L7 "a claim
/// superseded or released mid-write has that buffer quarantined until its writer is done
/// or dead, so no byte of an abandoned write is ever published"; Pitfalls "a sibling's
/// `release(pid)` while another thread writes makes that write fail (never published)";
/// "A stopped (SIGSTOPped) holder, even mid-write, is replaced after the grace ... Its
/// later operations fail, and a write it was making is never published"; `with_lease`:
/// "If the claim is taken over (stale heartbeat) or released by a sibling thread while
/// the closure runs, the closure's result is never published (`None`)".
#[test]
fn mixed_guard_claim_and_seed_threads_under_stops_never_read_a_failed_or_torn_value() {
    play_role!(role_chaos);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("lease");
    let _lease: OwnerLease<P> = OwnerLease::builder(&path)
        .epoch(EpochMode::Clock {
            tick: Duration::from_millis(1),
        })
        .preemption(Preemption::Never)
        .grace(Duration::from_millis(CHAOS_GRACE))
        .create(sealed(0))
        .unwrap();
    let mut workers: Vec<Proc> = (0..2u64)
        .map(|w| {
            RoleCommand::new(CHAOS, "chaos")
                .arg("path", &path)
                .arg("dir", d.path())
                .arg("w", (w + 1).to_string())
                .spawn()
        })
        .collect();
    let mut rng = Rng::for_test();
    let until = Instant::now() + Duration::from_secs(8);
    let mut stops = 0;
    while Instant::now() < until {
        let i = rng.below(2) as usize;
        workers[i].stop();
        stops += 1;
        // Mostly past the grace (30 ms), sometimes shorter.
        std::thread::sleep(Duration::from_millis(5 + rng.below(80)));
        workers[i].cont();
        std::thread::sleep(Duration::from_millis(rng.below(30)));
    }
    for w in &workers {
        w.cont();
    }
    std::fs::write(d.path().join("stop"), b"").unwrap();
    let mut reports = Vec::new();
    for w in &mut workers {
        reports.extend(w.finish(Duration::from_secs(60)));
    }
    let mut ok: HashSet<u64> = HashSet::from([sealed(0)[0]]);
    let mut fail: HashSet<u64> = HashSet::new();
    let mut seen: Vec<u64> = Vec::new();
    let mut torn: Vec<String> = Vec::new();
    for w in 1..=2 {
        let text = std::fs::read_to_string(d.path().join(format!("log{w}"))).unwrap();
        for line in text.lines() {
            let (k, v) = line.split_once(' ').unwrap();
            match k {
                "o" => {
                    ok.insert(v.parse().unwrap());
                }
                "f" => {
                    fail.insert(v.parse().unwrap());
                }
                "s" => seen.push(v.parse().unwrap()),
                _ => torn.push(v.to_owned()),
            }
        }
    }
    let read_failed: Vec<String> = seen
        .iter()
        .filter(|v| fail.contains(v))
        .map(|v| format!("{v:#x}"))
        .collect();
    let read_unknown: Vec<String> = seen
        .iter()
        .filter(|v| !ok.contains(v) && !fail.contains(v))
        .map(|v| format!("{v:#x}"))
        .collect();
    eprintln!(
        "{stops} stops; reports {reports:?}; {} published, {} failed, {} reads",
        ok.len(),
        fail.len(),
        seen.len()
    );
    assert!(
        torn.is_empty(),
        "torn payloads read: {:?}",
        &torn[..torn.len().min(5)]
    );
    assert!(
        read_failed.is_empty(),
        "{} reads returned a value whose writer was told it failed: {:?}",
        read_failed.len(),
        &read_failed[..read_failed.len().min(10)]
    );
    assert!(
        read_unknown.is_empty(),
        "{} reads returned a value no write reported: {:?}",
        read_unknown.len(),
        &read_unknown[..read_unknown.len().min(10)]
    );
    assert!(
        !fail.is_empty() && seen.len() > 100,
        "the chaos did too little"
    );
}

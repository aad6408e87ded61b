//! Attack 11: multi-process attacks on the owner lease's documented promises
//! (`docs/owner-lease.md`, `docs/api.md`): guards used after a loss, claim tokens of a
//! guard's claim, randomized SIGSTOP/SIGCONT/SIGKILL chaos checked by an outside reader,
//! the inherited-interrupted-update flag, and the generation checkpoint.
//!
//! Each test re-executes this binary in a role (`cxc_testkit`); parent and children
//! synchronise through the lease file and marker files.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc_sync::{EpochMode, GuardError, LeaseBuilder, LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, fields, intact, path_arg, report, role, sealed, wait_for_path,
};

type P6 = [u64; 6];

/// How long a child waits for a marker of its parent before giving up.
const CHILD_PATIENCE: Duration = Duration::from_secs(20);
/// How long the parent waits for a child's report.
const REPORT: Duration = Duration::from_secs(10);

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Waits (in a child) for the parent's marker file `name` next to the lease.
fn await_marker(dir: &Path, name: &str) {
    assert!(
        wait_for_path(&dir.join(name), CHILD_PATIENCE),
        "parent never wrote marker {name}"
    );
}

fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"1").unwrap();
}

/// A builder-made guard lease of `[u64; 6]`: clock epochs of 1 ms, no preemption.
fn guard_lease(path: &Path, grace: Duration) -> LeaseBuilder {
    LeaseBuilder::new(path).grace(grace)
}

// ---------------------------------------------------------------------------------------
// 1. A guard keeps writing after it learned of its loss.
// ---------------------------------------------------------------------------------------

/// The stale guard's values: never to be seen by anyone.
const STALE: u64 = 0xDEAD_0000_0000;

/// A guard superseded (its process stalled past the grace) that keeps calling `write`
/// after the first `Err(Lost)` must never publish, and its stores must never reach a
/// buffer that a later holder stages or publishes. The parent, the new holder, writes and
/// reads back its own values while the stale guard keeps writing.
// Found (fixed since): a superseded guard's second `write` after `Err(Lost)` fills its old staging buffer, freed from quarantine by the first failed write and reused by the new holder: the new holder reads the stale guard's values (docs/api.md "GuardError::Lost { successor } (superseded; nothing was published)"; owner-lease.md L7 "no byte of an abandoned write is ever published")
#[test]
fn superseded_guard_writing_again_after_lost_never_reaches_a_reused_buffer() {
    const T: &str = "superseded_guard_writing_again_after_lost_never_reaches_a_reused_buffer";
    if role().as_deref() == Some("stale") {
        let path = path_arg("path");
        let dir = path.parent().unwrap().to_path_buf();
        let lease = guard_lease(&path, Duration::from_millis(40))
            .open::<P6>()
            .unwrap();
        let g = lease.lock();
        g.write(sealed(1)).unwrap();
        report(format!("token={}", g.token()));
        // No beats from here: the parent takes over after the grace.
        await_marker(&dir, "go1");
        let first = g.write(sealed(STALE));
        report(format!(
            "first_lost={}",
            matches!(first, Err(GuardError::Lost { .. }))
        ));
        await_marker(&dir, "go2");
        // A caller that ignores the loss and keeps writing (for example a retry loop).
        let started = Instant::now();
        let (mut ok, mut lost, mut other) = (0u64, 0u64, 0u64);
        let mut k = 1u64;
        while started.elapsed() < Duration::from_millis(600) {
            match g.write(sealed(STALE + k)) {
                Ok(()) => ok += 1,
                Err(GuardError::Lost { .. }) => lost += 1,
                Err(_) => other += 1,
            }
            k += 1;
        }
        report(format!("ok={ok} lost={lost} other={other}"));
        drop(g);
        return;
    }
    assert!(role().is_none(), "unknown role");
    let d = tmp();
    let path = d.path().join("l");
    let lease = guard_lease(&path, Duration::from_millis(40))
        .create::<P6>(sealed(0))
        .unwrap();
    let mut kid = RoleCommand::new(T, "stale").arg("path", &path).spawn();
    let r = kid.next_report(REPORT);
    let old: u64 = fields(&r)["token"].parse().unwrap();
    // The child never beats again: after the grace the parent takes over as stale.
    let g = lease
        .lock_timeout(Duration::from_secs(5))
        .expect("a silent holder is replaced after the grace");
    assert!(g.token() > old);
    g.write(sealed(1_000)).unwrap();
    touch(d.path(), "go1");
    let r = kid.next_report(REPORT);
    assert_eq!(fields(&r)["first_lost"], "true", "{r}");
    drop(g);
    touch(d.path(), "go2");
    // While the stale guard keeps writing: claim, write, read back, release, over and
    // over, so every spare buffer is staged and published in turn.
    let started = Instant::now();
    let (mut rounds, mut wrong) = (0u64, Vec::new());
    let mut v = 10_000u64;
    while started.elapsed() < Duration::from_millis(500) {
        let g = lease.lock_timeout(Duration::from_secs(5)).expect("free");
        g.acknowledge_inconsistent();
        for _ in 0..3 {
            v += 1;
            g.write(sealed(v)).unwrap();
            let back = g.read().unwrap();
            let seen = lease.status().payload_words;
            if back != sealed(v) || seen != sealed(v) {
                wrong.push((v, back[0], intact(&back), seen[0], intact(&seen)));
            }
        }
        drop(g);
        rounds += 1;
    }
    let r = kid.next_report(REPORT);
    kid.finish(REPORT);
    println!("rounds={rounds} child: {r} wrong={}", wrong.len());
    let f = fields(&r);
    assert_eq!(f["ok"], "0", "the stale guard published: {r}");
    assert!(
        wrong.is_empty(),
        "the new holder's published value was overwritten by the superseded guard \
         ({} of {rounds} rounds; first (wrote, read, intact, status, intact): {:x?})",
        wrong.len(),
        &wrong[..wrong.len().min(4)]
    );
}

// ---------------------------------------------------------------------------------------
// 2. A token of a guard's claim, read through `current_claim()` in the guard's process.
// ---------------------------------------------------------------------------------------

/// `current_claim()` in the guard's own process hands out a `LeaseClaim` of the guard's
/// (private) claim. The claims layer must not become a second writer of a guard's claim:
/// its `write_claimed` must fail, and whatever it does, a guard write reported as
/// `Err(Lost)` must never be the published value.
// Found (fixed since): in the guard holder's process, `write_claimed(&current_claim())` publishes under the guard's claim (a second writer), and the guard's next write returns Err(Lost) while is_current() is true, yet is the published value (api.md "mixing the layers can never make two writers"; "GuardError::Lost ... nothing was published")
#[test]
fn guard_claim_token_from_current_claim_is_not_a_second_writer() {
    const T: &str = "guard_claim_token_from_current_claim_is_not_a_second_writer";
    if role().as_deref() == Some("holder") {
        let path = path_arg("path");
        let dir = path.parent().unwrap().to_path_buf();
        let lease = guard_lease(&path, Duration::from_secs(5))
            .open::<P6>()
            .unwrap();
        let g = lease.lock();
        g.write(sealed(1)).unwrap();
        let c = lease.current_claim().expect("the guard's claim");
        let same = c.generation() == g.token();
        let claimed = lease.write_claimed(&c, sealed(2));
        let guard = match g.write(sealed(3)) {
            Ok(()) => "ok".to_owned(),
            Err(GuardError::Lost { .. }) => "lost".to_owned(),
            Err(e) => format!("{e:?}").replace(' ', "_"),
        };
        report(format!(
            "same_token={same} write_claimed={claimed} guard_write={guard} current={}",
            g.is_current()
        ));
        await_marker(&dir, "done");
        drop(g);
        return;
    }
    assert!(role().is_none(), "unknown role");
    let d = tmp();
    let path = d.path().join("l");
    let lease = guard_lease(&path, Duration::from_secs(5))
        .create::<P6>(sealed(0))
        .unwrap();
    let mut kid = RoleCommand::new(T, "holder").arg("path", &path).spawn();
    let r = kid.next_report(REPORT);
    // Read by another process while the child still holds.
    let seen = lease.status().payload_words;
    touch(d.path(), "done");
    kid.finish(REPORT);
    println!("child: {r}; published first word {}", seen[0]);
    let f = fields(&r);
    assert_eq!(f["same_token"], "true", "{r}");
    assert!(intact(&seen), "torn published payload {seen:x?}");
    if f["guard_write"] == "lost" {
        assert_ne!(
            seen,
            sealed(3),
            "a guard write reported Err(Lost) is the published value ({r})"
        );
    }
    assert_eq!(
        f["write_claimed"], "false",
        "a claim token published under a held guard's claim ({r})"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Chaos: claimants SIGSTOPped, SIGCONTed and SIGKILLed at random; an outside reader.
// ---------------------------------------------------------------------------------------

const CHAOS_GRACE: u64 = 25;
const CHAOS_WORKERS: u64 = 3;

/// The value a worker writes: its claim's token, its worker index and a counter.
fn chaos_value(token: u64, worker: u64, k: u64) -> u64 {
    (token << 24) | (worker << 20) | (k & 0xF_FFFF)
}

/// Whether `v` was written by a worker's seed-call sibling thread.
fn from_seed_sibling(v: u64) -> bool {
    (v >> 18) & 3 == 1
}

fn chaos_log(dir: &Path, worker: u64, incarnation: u64) -> PathBuf {
    dir.join(format!("w{worker}.{incarnation}.log"))
}

/// Workers claim with `acquire`, write sealed values with `write_claimed` (logging every
/// attempt before it and its outcome after it, unbuffered), beat and release, while the
/// parent stops, resumes and kills them at random (stops longer than the grace make
/// stale takeovers mid-write). A reader thread of the parent polls the published value.
/// Promises checked: every published value is intact; the tokens of the values seen
/// never decrease (a superseded claim never publishes, L2); no value whose write
/// returned `false` is ever seen (L7); every token granted is distinct (fencing); no
/// value appears that was never attempted.
#[test]
fn chaos_of_stops_and_kills_never_shows_a_lost_claims_value() {
    const T: &str = "chaos_of_stops_and_kills_never_shows_a_lost_claims_value";
    if role().as_deref() == Some("worker") {
        let path = path_arg("path");
        let worker: u64 = arg("worker").parse().unwrap();
        let seed: u64 = arg("seed").parse().unwrap();
        // A builder handle: guards with the chaos grace; the seed and claim calls work
        // on it as on any handle.
        let lease = LeaseBuilder::new(&path)
            .grace(Duration::from_millis(CHAOS_GRACE))
            .open::<P6>()
            .unwrap();
        let log = std::sync::Mutex::new(std::fs::File::create(path_arg("log")).unwrap());
        let note = |kind: &str, v: u64| {
            // One write per line, so a kill never leaves half a line.
            let line = format!("{kind} {v}\n");
            log.lock().unwrap().write_all(line.as_bytes()).unwrap();
        };
        let me = std::process::id();
        report("ready");
        std::thread::scope(|s| {
            // A sibling thread using the seed calls for the same pid, concurrently with
            // the main thread's guards, claims and `with_lease`.
            s.spawn(|| {
                let mut rng = Rng::derive(seed, worker, 1, 0);
                let mut k = 0u64;
                loop {
                    std::thread::sleep(Duration::from_micros(rng.range(0, 2_000)));
                    let Some(c) = lease.try_claim(me, CHAOS_GRACE) else {
                        continue;
                    };
                    // Possibly the main thread's claim (idempotent per pid): not counted.
                    note("t", c.generation());
                    k += 1;
                    let v = chaos_value(c.generation(), worker, 0x4_0000 | (k & 0x3_FFFF));
                    note("A", v);
                    let ok = lease.write_as_owner(me, sealed(v));
                    note(if ok { "S" } else { "F" }, v);
                    let _ = lease.release(me);
                }
            });
            let mut rng = Rng::derive(seed, worker, 0, 0);
            let mut n = 0u64;
            loop {
                n += 1;
                match rng.below(3) {
                    0 => {
                        // A closure that takes a while: stops land inside it (stale
                        // takeovers that quarantine its staging buffer).
                        let nap = Duration::from_micros(rng.range(0, 3_000));
                        let mut wrote = None;
                        let r = lease.with_lease(me, CHAOS_GRACE, |p| {
                            // Our claim's token (if already superseded, a later one: then
                            // the publication fails).
                            let token = lease.current_claim().map_or(0, |c| c.generation());
                            let v = chaos_value(token, worker, 0x8_0000 | (n & 0x3_FFFF));
                            note("A", v);
                            wrote = Some(v);
                            std::thread::sleep(nap);
                            *p = sealed(v);
                        });
                        if let Some(v) = wrote {
                            note(if r.is_some() { "S" } else { "F" }, v);
                        }
                    }
                    1 => {
                        let Some(g) = lease.lock_timeout(Duration::from_millis(300)) else {
                            continue;
                        };
                        g.acknowledge_inconsistent();
                        note("T", g.token());
                        for k in 0..rng.range(1, 8) {
                            let v = chaos_value(g.token(), worker, 0xC_0000 | k);
                            note("A", v);
                            let ok = g.write(sealed(v)).is_ok();
                            note(if ok { "S" } else { "F" }, v);
                            if !ok {
                                break;
                            }
                            std::thread::sleep(Duration::from_micros(rng.range(0, 2_000)));
                            let _ = g.beat();
                        }
                        drop(g);
                    }
                    _ => {
                        let Some(c) = lease.acquire(me, CHAOS_GRACE, Duration::from_millis(300))
                        else {
                            continue;
                        };
                        let token = c.generation();
                        note("T", token);
                        for k in 0..rng.range(1, 8) {
                            let v = chaos_value(token, worker, k);
                            note("A", v);
                            let ok = lease.write_claimed(&c, sealed(v));
                            note(if ok { "S" } else { "F" }, v);
                            if !ok {
                                break;
                            }
                            if rng.percent(50) {
                                std::thread::sleep(Duration::from_micros(rng.range(0, 3_000)));
                            }
                            let _ = lease.beat_claimed(&c);
                        }
                        let _ = lease.release_claim(&c);
                    }
                }
            }
        });
        return;
    }
    assert!(role().is_none(), "unknown role");
    let mut rng = Rng::for_test();
    let seed = rng.seed();
    let d = tmp();
    let path = d.path().join("l");
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..LeaseOptions::default()
    };
    let lease = OwnerLease::<P6>::create_with(&path, sealed(0), &opts).unwrap();
    let spawn = |w: u64, inc: u64| -> Proc {
        let mut p = RoleCommand::new(T, "worker")
            .arg("path", &path)
            .arg("worker", w.to_string())
            .arg("log", chaos_log(d.path(), w, inc))
            .arg("seed", seed.to_string())
            .spawn();
        assert_eq!(p.next_report(REPORT), "ready");
        p
    };
    let mut incs = vec![0u64; CHAOS_WORKERS as usize];
    let mut kids: Vec<Proc> = (0..CHAOS_WORKERS).map(|w| spawn(w, 0)).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (seen, bad) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen: Vec<u64> = Vec::new();
            let mut bad: Vec<String> = Vec::new();
            let mut last_fenced: Option<u64> = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let w = lease.status().payload_words;
                if !intact(&w) {
                    bad.push(format!("torn {w:x?}"));
                    continue;
                }
                if seen.last() != Some(&w[0]) {
                    // The seed sibling's values carry the token of the claim it made
                    // (seed writes are per pid, not per claim): not ordered.
                    if !from_seed_sibling(w[0]) {
                        if let Some(prev) = last_fenced
                            && (w[0] >> 24) < (prev >> 24)
                        {
                            bad.push(format!(
                                "token went back: {} after {} (values {:#x} after {prev:#x})",
                                w[0] >> 24,
                                prev >> 24,
                                w[0]
                            ));
                        }
                        last_fenced = Some(w[0]);
                    }
                    seen.push(w[0]);
                }
            }
            (seen, bad)
        });
        let started = Instant::now();
        let mut stopped: Vec<Option<Instant>> = vec![None; kids.len()];
        while started.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(Duration::from_millis(rng.range(2, 15)));
            let i = rng.below(kids.len() as u64) as usize;
            match stopped[i] {
                Some(at) => {
                    if at.elapsed() > Duration::from_millis(rng.range(5, 80)) {
                        kids[i].cont();
                        stopped[i] = None;
                    }
                }
                None => {
                    if rng.percent(8) {
                        kids[i].kill();
                        incs[i] += 1;
                        kids[i] = spawn(i as u64, incs[i]);
                    } else if rng.percent(60) {
                        kids[i].stop();
                        stopped[i] = Some(Instant::now());
                    }
                }
            }
        }
        for k in &mut kids {
            k.kill();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap()
    });
    let (mut tokens, mut attempted, mut failed, mut succeeded) =
        (Vec::new(), HashSet::new(), HashSet::new(), 0u64);
    for (w, &n) in incs.iter().enumerate() {
        for inc in 0..=n {
            let text = std::fs::read_to_string(chaos_log(d.path(), w as u64, inc)).unwrap();
            for line in text.lines() {
                let Some((k, v)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(v) = v.parse::<u64>() else { continue };
                match k {
                    "T" => tokens.push(v),
                    "A" => {
                        attempted.insert(v);
                    }
                    "F" => {
                        failed.insert(v);
                    }
                    "S" => succeeded += 1,
                    _ => {}
                }
            }
        }
    }
    let distinct: BTreeSet<u64> = tokens.iter().copied().collect();
    let st = lease.stats();
    println!(
        "claims={} writes ok={succeeded} failed={} values seen={} kills={} stale={} dead={} quarantined={} freed={} reaped={} no_buffer={}",
        tokens.len(),
        failed.len(),
        seen.len(),
        incs.iter().sum::<u64>(),
        st.claim_stale,
        st.claim_dead_owner,
        st.quarantined,
        st.quarantine_freed,
        st.quarantine_reaped,
        st.no_buffer
    );
    assert!(
        bad.is_empty(),
        "{} violations: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(distinct.len(), tokens.len(), "a token was granted twice");
    let from_failed: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|v| failed.contains(v))
        .collect();
    assert!(
        from_failed.is_empty(),
        "values whose write returned false were published: {from_failed:x?}"
    );
    let unknown: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|v| *v != 0 && !attempted.contains(v))
        .collect();
    assert!(unknown.is_empty(), "values nobody wrote: {unknown:x?}");
    assert!(
        succeeded > 100 && st.claim_stale > 0,
        "the chaos did not exercise the lease ({succeeded} writes, {} stale takeovers)",
        st.claim_stale
    );
}

// ---------------------------------------------------------------------------------------
// 4. The interrupted-update flag when the inheriting holder releases without writing.
// ---------------------------------------------------------------------------------------

/// A holder killed inside `with_lease`: the claim that takes over is told; the doc says
/// `payload_torn()` "stays true until the new holder writes". When that holder releases
/// without writing, nobody has restored the payload: the flag must not be lost (the
/// next claim must still be told, as a robust mutex does not forget `EOWNERDEAD`).
// Found (fixed since): a holder that inherited an interrupted update and releases without writing clears the flag: payload_torn() is false and the next claim's payload_may_be_inconsistent() is false though nobody wrote (owner-lease.md "payload_torn() stays true until the new holder writes")
#[test]
fn inherited_interrupted_update_is_not_forgotten_by_a_release_without_write() {
    const T: &str = "inherited_interrupted_update_is_not_forgotten_by_a_release_without_write";
    if role().as_deref() == Some("victim") {
        let lease = OwnerLease::<P6>::open(path_arg("path")).unwrap();
        let me = std::process::id();
        lease.with_lease(me, 3, |v| {
            v[0] = 77;
            report("inside");
            std::thread::sleep(Duration::from_secs(60));
        });
        return;
    }
    assert!(role().is_none(), "unknown role");
    let d = tmp();
    let path = d.path().join("l");
    let lease = OwnerLease::<P6>::create(&path, sealed(5)).unwrap();
    let mut kid = RoleCommand::new(T, "victim").arg("path", &path).spawn();
    assert_eq!(kid.next_report(REPORT), "inside");
    kid.kill();
    let me = std::process::id();
    let c = lease
        .try_claim(me, 3)
        .expect("a dead holder is replaced at once");
    assert!(c.payload_may_be_inconsistent(), "the taker is told");
    assert!(lease.payload_torn());
    assert!(lease.release_claim(&c));
    let after_release = lease.payload_torn();
    let c2 = lease.try_claim(me, 3).expect("vacant");
    let told = c2.payload_may_be_inconsistent();
    let torn_now = lease.payload_torn();
    println!("after release: payload_torn={after_release}; next claim told={told} torn={torn_now}");
    assert!(
        told && torn_now,
        "the interrupted update was forgotten by a release without a write \
         (payload_torn after release {after_release}, next claim told {told})"
    );
}

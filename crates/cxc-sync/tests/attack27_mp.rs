#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack27: the owner lease's buffer budget, torn-flag inheritance and nested
//! `with_lease`, with real processes (`docs/owner-lease.md`: "Write", "six stalled
//! writers", "Read", "with_lease", "Death mid-update (L4)", "Pitfalls").
//!
//! 1. Seven writers in seven processes, each SIGSTOPped mid-update (inside
//!    `write_claimed`, inside a `with_lease` closure, inside a guard's `update`) and
//!    superseded as stale by the next: the eighth holder's claim succeeds but its write
//!    fails (`no_buffer`); a SIGKILLed staller's buffer is reaped, a SIGCONTed one frees
//!    its own; a reader process hammering `status()`/`inspect()` never sees a torn
//!    payload nor any stalled writer's value; every taker of a mid-update claim is told.
//! 2. A torn flag carried through releases, a kill, a stop, a guard and clean releases in
//!    several processes without a write, until one write clears it.
//! 3. A `with_lease` that inherited a torn payload and panics must pass the flag on.
//! 4. Nested `with_lease` (the pid already holds the lease) against a sibling thread's
//!    `write_as_owner` (Pitfalls: "serialised by the WRITE bit").
//! 5. Nested `with_lease` whose claim a sibling releases and re-claims for the same pid,
//!    or another process takes over as stale while the holder is SIGSTOPped: never
//!    published.
//! 6. A holder that execs inside a `with_lease` closure: the claim survives the exec,
//!    the abandoned update is never published, its buffer stays quarantined while the
//!    process lives.
//! 7. A full identity table whose current holder died holding a torn flag it inherited
//!    (not writing): the newcomer that vacates it must be told.
//!
//! Tests 3, 4 and 7 failed before their fixes: the torn flag was lost by a panicking
//! `with_lease` (`LeaseState::abort_write` did not pass it on) and by `LeaseState::vacate`
//! (it passed the flag on only when WRITE was set); a nested `with_lease` ran its closure
//! without WRITE, so a sibling's `write_as_owner` succeeded meanwhile and was overwritten.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::lease::inspect;
use cxc_sync::{EpochMode, LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{
    Proc, Rng, RoleCommand, child_wait_for_path, flag, intact, num, path_arg, play_role, read_word,
    report, sealed, serial, sleep_forever, wait_until,
};

type P = [u64; 6];

/// A heartbeat grace no test reaches.
const BIG: u64 = 1 << 40;
/// How long a child may take to report.
const REPORT_WAIT: Duration = Duration::from_secs(20);
/// How long a child waits for a marker of its parent.
const PATIENCE: Duration = Duration::from_secs(60);

/// File offset of the claim word (the 128-byte header, then the lease block).
const CLAIM_OFF: u64 = 128;
const WRITE_BIT: u64 = 1 << 14;
const PRIVATE_BIT: u64 = 1 << 23;

fn me() -> u32 {
    std::process::id()
}

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("touch a marker");
}

/// Number of buffers in quarantine (the Q bits of the claim word).
fn quarantined(path: &Path) -> u32 {
    ((read_word(path, CLAIM_OFF) >> 15) & 0xFF).count_ones()
}

/// Manual epochs (only our ticks age a holder), no preemption.
fn manual_never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Manual,
        ..LeaseOptions::default()
    }
}

/// A sealed payload of writer `tag`, number `k`.
fn val(tag: u64, k: u64) -> P {
    sealed(tag << 32 | k)
}

fn tag_of(w: &P) -> u64 {
    w[0] >> 32
}

fn k_of(w: &P) -> u64 {
    w[0] & 0xFFFF_FFFF
}

/// Stops `child` at a moment the claim word shows WRITE set on its claim (a writer in a
/// write loop); returns the number of attempts.
fn stop_with_write_set(child: &mut Proc, lease: &OwnerLease<P>, path: &Path) -> u32 {
    for attempt in 1..=2000 {
        child.stop();
        child.wait_state('T', Duration::from_secs(5));
        let w = read_word(path, CLAIM_OFF);
        if w & WRITE_BIT != 0 && lease.current_owner() == Some(child.pid()) {
            return attempt;
        }
        child.cont();
        std::thread::sleep(Duration::from_micros(200 + u64::from(attempt % 7) * 100));
    }
    panic!("never caught the writer with WRITE set");
}

// ---------------------------------------------------------------------------------------
// 1. Seven stalled writers in seven processes.
// ---------------------------------------------------------------------------------------

const T1: &str = "seven_writers_stopped_mid_update_exhaust_the_buffers_until_one_resumes_or_dies";
/// Kinds of the seven stallers, in order: `W` a `write_claimed` loop, `L` a `with_lease`
/// closure, `G` a guard's `update` closure.
const KINDS: [char; 7] = ['W', 'L', 'G', 'W', 'L', 'G', 'W'];
/// The `k` of the value a closure staller tries to publish (never published).
const FORBIDDEN_K: u64 = 0xFFFF_FFF0;
/// The parent's tag.
const PARENT_TAG: u64 = 100;
const INIT_TAG: u64 = 99;

/// Role: staller `idx` of kind `kind`: on its go marker it takes the lease over (the
/// previous staller is stopped and stale), then updates until it is stopped; once
/// resumed, it reports the value whose publication failed.
fn role_staller() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let idx: u64 = cxc_testkit::arg("idx").parse().unwrap();
    let tag = idx + 1;
    let kind = cxc_testkit::arg("kind");
    let resume = dir.join(format!("resume-{idx}"));
    child_wait_for_path(&dir.join(format!("go-{idx}")), PATIENCE);
    match kind.as_str() {
        "W" => {
            let lease = OwnerLease::<P>::open(&path).unwrap();
            let c = lease.try_claim(me(), 1).expect("the staller takes over");
            report(format!(
                "claimed gen={} torn={}",
                c.generation(),
                c.payload_may_be_inconsistent()
            ));
            let mut k = 1;
            assert!(lease.write_claimed(&c, val(tag, k)), "first write");
            report("running");
            loop {
                k += 1;
                if !lease.write_claimed(&c, val(tag, k)) {
                    break;
                }
            }
            report(format!("failed={k} published=false"));
        }
        "L" => {
            let lease = OwnerLease::<P>::open(&path).unwrap();
            let r = lease.with_lease(me(), 1, |v| {
                report(format!("inside torn={}", lease.payload_torn()));
                child_wait_for_path(&resume, PATIENCE);
                *v = val(tag, FORBIDDEN_K);
            });
            report(format!("failed={FORBIDDEN_K} published={}", r.is_some()));
        }
        "G" => {
            let lease: OwnerLease<P> = OwnerLease::builder(&path).grace_epochs(1).open().unwrap();
            let g = lease.try_lock().expect("the guard takes over");
            report(format!(
                "claimed gen={} torn={}",
                g.token(),
                g.payload_may_be_inconsistent()
            ));
            g.acknowledge_inconsistent();
            let r = g.update(|v| {
                report("inside");
                child_wait_for_path(&resume, PATIENCE);
                *v = val(tag, FORBIDDEN_K);
            });
            report(format!("failed={FORBIDDEN_K} published={}", r.is_ok()));
        }
        other => panic!("unknown kind {other}"),
    }
    child_wait_for_path(&dir.join("exit"), PATIENCE);
}

/// Role: hammers the published payload through `status()` (and now and then `inspect`)
/// until the `done` marker and the parent's final value (`PARENT_TAG`, 4) were seen;
/// reports torn copies and the highest `k` seen per tag. (`inspect` reads zeros when
/// 21 copies of the file all raced a writer, as documented; counted apart.)
fn role_reader() {
    let path = path_arg("path");
    let done = path_arg("dir").join("done");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    let mut max: HashMap<u64, u64> = HashMap::new();
    let (mut samples, mut torn, mut inspected) = (0u64, 0u64, 0u64);
    let (mut zeros_status, mut zeros_inspect) = (0u64, 0u64);
    let mut first_torn = None;
    report("reading");
    let t = Instant::now();
    let mut i = 0u64;
    while !(done.exists() && max.get(&PARENT_TAG) == Some(&4)) && t.elapsed() < PATIENCE {
        for _ in 0..64 {
            i += 1;
            let from_inspect = i.is_multiple_of(97);
            let w = if from_inspect {
                inspected += 1;
                inspect(&path).expect("inspect").payload_words
            } else {
                lease.status().payload_words
            };
            samples += 1;
            if w == [0; 6] {
                if from_inspect {
                    zeros_inspect += 1;
                } else {
                    zeros_status += 1;
                }
            } else if !intact(&w) {
                torn += 1;
                first_torn.get_or_insert(w);
            } else {
                let e = max.entry(tag_of(&w)).or_insert(0);
                *e = (*e).max(k_of(&w));
            }
        }
        std::thread::yield_now();
    }
    let maxes: Vec<String> = max.iter().map(|(t, k)| format!("{t}:{k}")).collect();
    report(format!(
        "samples={samples} inspected={inspected} torn={torn} zeros_status={zeros_status} \
         zeros_inspect={zeros_inspect} first_torn={first_torn:?} max={}",
        maxes.join(",")
    ));
}

fn parse_max(line: &str) -> HashMap<u64, u64> {
    let f = cxc_testkit::fields(line);
    f["max"]
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (t, k) = s.split_once(':').unwrap();
            (t.parse().unwrap(), k.parse().unwrap())
        })
        .collect()
}

/// What the taker of staller `i`'s claim is told (`payload_may_be_inconsistent`): the
/// staller was stopped with WRITE set (`W`, `L`), or it is a guard (stopped before its
/// fill began) that had itself inherited the flag and never wrote.
fn expected_told(kinds: &[char], told: &[bool], i: usize) -> bool {
    match kinds[i] {
        'W' | 'L' => true,
        _ => told[i],
    }
}

/// One round: seven stallers of kinds `kinds`; `killed` is SIGKILLed first, `resumed`
/// SIGCONTed next, then the rest. Returns a summary.
fn seven_stalls_round(kinds: [char; 7], killed: usize, resumed: usize) -> String {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, val(INIT_TAG, 1), &manual_never()).unwrap();
    let mut reader = RoleCommand::new(T1, "reader")
        .arg("path", &path)
        .arg("dir", dir.path())
        .spawn();
    assert_eq!(reader.next_report(REPORT_WAIT), "reading");

    let mut stallers: Vec<Proc> = Vec::new();
    let mut told = Vec::new();
    let mut attempts = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let mut s = RoleCommand::new(T1, "staller")
            .arg("path", &path)
            .arg("dir", dir.path())
            .arg("idx", i.to_string())
            .arg("kind", kind.to_string())
            .spawn();
        if i > 0 {
            // The previous staller is stopped: two ticks make it stale for grace 1.
            lease.tick_epoch();
            lease.tick_epoch();
        }
        touch(&dir.path().join(format!("go-{i}")));
        let first = s.next_report(REPORT_WAIT);
        if *kind == 'L' {
            assert!(first.starts_with("inside"), "staller {i}: {first}");
        } else {
            assert!(first.starts_with("claimed"), "staller {i}: {first}");
            let second = s.next_report(REPORT_WAIT);
            assert!(
                second == "running" || second == "inside",
                "staller {i}: {second}"
            );
        }
        told.push(flag(&first, "torn"));
        assert_eq!(lease.current_owner(), Some(s.pid()), "staller {i} holds");
        let n = if *kind == 'W' {
            stop_with_write_set(&mut s, &lease, &path)
        } else {
            s.stop();
            s.wait_state('T', Duration::from_secs(5));
            let w = read_word(&path, CLAIM_OFF);
            let bit = if *kind == 'L' { WRITE_BIT } else { PRIVATE_BIT };
            assert_ne!(
                w & bit,
                0,
                "staller {i} ({kind}) stopped mid-update: {w:#x}"
            );
            1
        };
        attempts.push(n);
        assert_eq!(
            quarantined(&path),
            i as u32,
            "staller {i}: one quarantined buffer per superseded staller"
        );
        stallers.push(s);
    }
    // Every taker of a claim stopped mid-update is told; the first claimed a clean lease.
    assert!(!told[0], "the first claim of a clean lease is not told");
    for i in 1..7 {
        assert_eq!(
            told[i],
            expected_told(&kinds, &told, i - 1),
            "staller {i} taking over staller {} ({}): told {told:?}",
            i - 1,
            kinds[i - 1]
        );
    }

    // The eighth holder: a seventh stale takeover still succeeds (L5), without a buffer.
    lease.tick_epoch();
    lease.tick_epoch();
    let st0 = lease.stats();
    let claim = lease
        .try_claim(me(), 1)
        .expect("the takeover of a seventh stalled writer succeeds");
    assert_eq!(
        claim.payload_may_be_inconsistent(),
        expected_told(&kinds, &told, 6),
        "the eighth holder's torn flag"
    );
    assert_eq!(quarantined(&path), 7, "seven stalled writers in quarantine");
    let before = lease.read_claimed(&claim).expect("the holder reads");
    assert!(intact(&before), "published payload whole: {before:?}");
    let last_w = kinds.iter().rposition(|k| *k == 'W');
    assert_eq!(
        tag_of(&before),
        last_w.map_or(INIT_TAG, |i| i as u64 + 1),
        "the last published value is the last write-loop staller's"
    );
    assert!(
        !lease.write_claimed(&claim, val(PARENT_TAG, 1)),
        "no buffer: the write must fail"
    );
    let st1 = lease.stats();
    assert!(st1.no_buffer > st0.no_buffer, "counted as no_buffer");
    assert_eq!(
        lease.read_claimed(&claim),
        Some(before),
        "nothing published"
    );
    assert_eq!(lease.status().payload_words, before);

    // A stalled writer dies: a reap frees its buffer and the write succeeds.
    stallers[killed].kill();
    assert!(
        lease.write_claimed(&claim, val(PARENT_TAG, 2)),
        "the dead staller's buffer is reaped for the holder's write"
    );
    let st2 = lease.stats();
    assert_eq!(
        st2.quarantine_reaped - st1.quarantine_reaped,
        1,
        "one reaped"
    );
    assert_eq!(quarantined(&path), 6);
    assert!(!lease.payload_torn(), "the write cleared the torn flag");
    assert_eq!(lease.read_claimed(&claim), Some(val(PARENT_TAG, 2)));

    // A stalled writer resumes: its publication fails and it frees its own buffer.
    let mut failed: HashMap<usize, u64> = HashMap::new();
    let mut resume = |i: usize, s: &mut Proc| {
        touch(&dir.path().join(format!("resume-{i}")));
        s.cont();
        let r = s.next_report(REPORT_WAIT);
        assert!(!flag(&r, "published"), "staller {i} published: {r}");
        failed.insert(i, num(&r, "failed"));
    };
    resume(resumed, &mut stallers[resumed]);
    assert_eq!(quarantined(&path), 5, "the resumed writer freed its buffer");
    let st3 = lease.stats();
    assert_eq!(st3.quarantine_freed - st2.quarantine_freed, 1);
    assert!(lease.write_claimed(&claim, val(PARENT_TAG, 3)));
    for i in (0..7).filter(|i| *i != killed && *i != resumed) {
        resume(i, &mut stallers[i]);
    }
    assert!(
        wait_until(Duration::from_secs(5), || quarantined(&path) == 0),
        "all buffers back, {} quarantined",
        quarantined(&path)
    );
    assert!(lease.write_claimed(&claim, val(PARENT_TAG, 4)));
    assert_eq!(lease.read_claimed(&claim), Some(val(PARENT_TAG, 4)));
    assert!(lease.release_claim(&claim));
    let st4 = lease.stats();
    touch(&dir.path().join("done"));
    let rr = reader.finish(REPORT_WAIT).pop().expect("reader report");
    touch(&dir.path().join("exit"));
    for (i, s) in stallers.iter_mut().enumerate() {
        if i != killed {
            s.finish(REPORT_WAIT);
        }
    }
    assert_eq!(num(&rr, "torn"), 0, "the reader saw a torn payload: {rr}");
    assert!(num(&rr, "samples") > 1000, "the reader read: {rr}");
    let max = parse_max(&rr);
    for (i, k) in &failed {
        let tag = *i as u64 + 1;
        let seen = max.get(&tag).copied();
        assert!(
            seen.is_none_or(|m| m < *k),
            "staller {i}'s abandoned value k={k} (or later) was published: reader max {seen:?}"
        );
        if kinds[*i] != 'W' {
            assert_eq!(seen, None, "staller {i} never published anything");
        }
    }
    if let Some(w) = last_w.filter(|w| *w != killed) {
        assert_eq!(k_of(&before), failed[&w] - 1, "its last published value");
    }
    assert_eq!(max.get(&PARENT_TAG).copied(), Some(4), "{rr}");
    assert_eq!(st4.quarantined, 7);
    assert_eq!(st4.quarantine_reaped, 1);
    assert_eq!(st4.quarantine_freed, 6);
    assert_eq!(st4.claim_stale, 7);
    format!(
        "kinds {kinds:?} killed {killed} resumed {resumed}: stop attempts {attempts:?}; told \
         {told:?}; failed k {failed:?}; counters no_buffer={} torn_inherited={}; reader: \
         {rr}; {:?}",
        st4.no_buffer,
        st4.torn_inherited,
        started.elapsed()
    )
}

#[test]
fn seven_writers_stopped_mid_update_exhaust_the_buffers_until_one_resumes_or_dies() {
    play_role!(role_staller, role_reader);
    let _s = serial();
    let mut rng = Rng::for_test();
    for round in 0..4 {
        let kinds = if round == 0 {
            KINDS
        } else {
            std::array::from_fn(|_| ['W', 'L', 'G'][rng.below(3) as usize])
        };
        let killed = rng.below(7) as usize;
        let resumed = (killed + 1 + rng.below(6) as usize) % 7;
        println!(
            "round {round}: {}",
            seven_stalls_round(kinds, killed, resumed)
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. A torn flag carried through many hands without a write.
// ---------------------------------------------------------------------------------------

const T2: &str = "torn_flag_passes_through_releases_kills_stops_and_guards_until_a_write";
const T3: &str = "with_lease_that_inherited_a_torn_payload_and_panics_passes_the_flag_on";

/// Role: dies (SIGKILL by the parent) inside `with_lease`, mid-update.
fn role_victim() {
    let lease = OwnerLease::<P>::open(path_arg("path")).unwrap();
    lease.with_lease(me(), BIG, |v| {
        *v = val(66, 66);
        report("inside");
        sleep_forever();
    });
}

/// Role: one hand of the chain: claims in mode `how`, reports what it was told, then
/// releases without writing (`release`), or holds until killed / stopped (`hold`), or
/// locks a guard, tries to read, and drops it (`guard`), or runs a panicking
/// `with_lease` (`panic`).
fn role_hand() {
    let path = path_arg("path");
    let how = cxc_testkit::arg("how");
    match how.as_str() {
        "guard" => {
            let lease: OwnerLease<P> = OwnerLease::builder(&path).grace_epochs(1).open().unwrap();
            let g = lease.lock_timeout(Duration::from_secs(10)).expect("lock");
            let refused = matches!(g.read(), Err(cxc_sync::GuardError::Inconsistent));
            report(format!(
                "told={} refused={refused} torn_now={}",
                g.payload_may_be_inconsistent(),
                lease.payload_torn()
            ));
            drop(g);
            report(format!("released torn_after={}", lease.payload_torn()));
        }
        "panic" => {
            let lease = OwnerLease::<P>::open(&path).unwrap();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                lease.with_lease(me(), 1, |v| {
                    let torn = lease.payload_torn();
                    *v = val(77, 77);
                    panic!("closure fails, torn={torn}");
                })
            }));
            report(format!(
                "panicked={} vacant={} torn_after={}",
                r.is_err(),
                lease.current_owner().is_none(),
                lease.payload_torn()
            ));
        }
        _ => {
            let lease = OwnerLease::<P>::open(&path).unwrap();
            let c = lease
                .acquire(me(), 1, Duration::from_secs(10))
                .expect("acquire");
            let read = lease.read_claimed(&c).expect("read");
            report(format!(
                "told={} torn_now={} intact={} k={}",
                c.payload_may_be_inconsistent(),
                lease.payload_torn(),
                intact(&read),
                k_of(&read)
            ));
            if how == "release" {
                assert!(lease.release_claim(&c));
                report(format!("released torn_after={}", lease.payload_torn()));
            } else {
                sleep_forever();
            }
        }
    }
}

fn hand(test: &str, path: &Path, how: &str) -> Proc {
    RoleCommand::new(test, "hand")
        .arg("path", path)
        .arg("how", how)
        .spawn()
}

/// Creates the lease, and a victim killed mid-`with_lease`; returns the claim of the
/// dead takeover (told), not yet released.
fn torn_start(test: &str, path: &Path) -> OwnerLease<P> {
    let lease = OwnerLease::<P>::create_with(path, val(5, 5), &manual_never()).unwrap();
    let mut v = RoleCommand::new(test, "victim").arg("path", path).spawn();
    assert_eq!(v.next_report(REPORT_WAIT), "inside");
    v.kill();
    let c = lease.try_claim(me(), BIG).expect("dead holder replaced");
    assert!(c.payload_may_be_inconsistent(), "the dead takeover is told");
    assert!(lease.release_claim(&c), "released without a write");
    assert!(lease.payload_torn(), "vacant and still torn");
    assert!(inspect(path).unwrap().torn, "inspect agrees");
    lease
}

#[test]
fn torn_flag_passes_through_releases_kills_stops_and_guards_until_a_write() {
    play_role!(role_victim, role_hand);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let lease = torn_start(T2, &path);
    let mut log = Vec::new();
    let check_told = |line: &str, what: &str| {
        assert!(flag(line, "told"), "{what}: not told: {line}");
        assert!(flag(line, "torn_now"), "{what}: payload_torn false: {line}");
        if line.contains("k=") {
            assert!(
                flag(line, "intact") && num(line, "k") == 5,
                "{what}: {line}"
            );
        }
    };
    // Three processes in turn: claim, told, release without writing.
    for r in 0..3 {
        let mut h = hand(T2, &path, "release");
        let l = h.next_report(REPORT_WAIT);
        check_told(&l, &format!("release hand {r}"));
        let l2 = h.next_report(REPORT_WAIT);
        assert!(
            flag(&l2, "torn_after"),
            "hand {r} release lost the flag: {l2}"
        );
        h.finish(REPORT_WAIT);
        assert!(lease.payload_torn(), "vacant after hand {r}");
        log.push(l);
    }
    // A holder SIGKILLed while holding (not writing): the dead takeover is told.
    let mut h = hand(T2, &path, "hold");
    let l = h.next_report(REPORT_WAIT);
    check_told(&l, "killed hand");
    h.kill();
    let c = lease.try_claim(me(), BIG).expect("dead holder replaced");
    assert!(
        c.payload_may_be_inconsistent(),
        "taker of a killed torn holder"
    );
    assert!(lease.release_claim(&c));
    // A holder SIGSTOPped while holding: the stale takeover is told.
    let mut h = hand(T2, &path, "hold");
    let l = h.next_report(REPORT_WAIT);
    check_told(&l, "stopped hand");
    h.stop();
    h.wait_state('T', Duration::from_secs(5));
    lease.tick_epoch();
    lease.tick_epoch();
    let c = lease.try_claim(me(), 1).expect("stale holder replaced");
    assert!(
        c.payload_may_be_inconsistent(),
        "taker of a stopped torn holder"
    );
    assert!(lease.release_claim(&c));
    h.kill();
    // A guard: its read refuses, it drops without writing.
    let mut h = hand(T2, &path, "guard");
    let l = h.next_report(REPORT_WAIT);
    assert!(flag(&l, "told") && flag(&l, "refused"), "guard: {l}");
    let l2 = h.next_report(REPORT_WAIT);
    assert!(flag(&l2, "torn_after"), "guard drop lost the flag: {l2}");
    h.finish(REPORT_WAIT);
    // Still the victim's last published value, and torn.
    assert!(lease.payload_torn());
    assert_eq!(lease.status().payload_words, val(5, 5));
    let tin = lease.stats().torn_inherited;
    // A write clears it: the next claim is clean.
    assert_eq!(lease.with_lease(me(), BIG, |v| *v = val(5, 6)), Some(()));
    assert!(!lease.payload_torn(), "a write clears the flag");
    let mut h = hand(T2, &path, "release");
    let l = h.next_report(REPORT_WAIT);
    assert!(
        !flag(&l, "told") && num(&l, "k") == 6,
        "after the write: {l}"
    );
    h.finish(REPORT_WAIT);
    println!("torn_inherited {tin}; hands {log:?}");
}

#[test]

fn with_lease_that_inherited_a_torn_payload_and_panics_passes_the_flag_on() {
    play_role!(role_victim, role_hand);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let lease = torn_start(T3, &path);
    let mut h = hand(T3, &path, "panic");
    let l = h.next_report(REPORT_WAIT);
    h.finish(REPORT_WAIT);
    assert!(flag(&l, "panicked") && flag(&l, "vacant"), "{l}");
    let vacant_torn = lease.payload_torn();
    let c = lease.try_claim(me(), BIG).expect("vacant");
    let told = c.payload_may_be_inconsistent();
    println!("panicking with_lease: {l}; then payload_torn={vacant_torn} next told={told}");
    assert_eq!(lease.read_claimed(&c), Some(val(5, 5)), "nothing published");
    assert!(
        flag(&l, "torn_after") && vacant_torn && told,
        "the inherited interrupted update was forgotten by a panicking with_lease \
         (released without a write): {l}, payload_torn {vacant_torn}, next told {told}"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Nested `with_lease` against a sibling's `write_as_owner`.
// ---------------------------------------------------------------------------------------

const T4: &str = "nested_with_lease_and_a_siblings_write_as_owner_are_serialised";

/// Role: holds the lease for its pid; thread B runs a nested `with_lease` (+1) whose
/// closure waits until the main thread's `write_as_owner` returned.
fn role_nester() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    let pid = me();
    assert!(lease.try_acquire(pid, BIG));
    assert!(lease.write_as_owner(pid, val(1, 1)));
    let wrote = dir.join("wrote");
    let inside = dir.join("inside");
    let (b, d_ok, d_ms) = std::thread::scope(|s| {
        let b = s.spawn(|| {
            lease.with_lease(pid, BIG, |v| {
                let k = k_of(v);
                touch(&inside);
                child_wait_for_path(&wrote, PATIENCE);
                *v = val(1, k + 1);
            })
        });
        child_wait_for_path(&inside, PATIENCE);
        let t = Instant::now();
        let ok = lease.write_as_owner(pid, val(1, 100));
        let ms = t.elapsed().as_millis();
        touch(&wrote);
        (b.join().unwrap(), ok, ms)
    });
    let fin = lease.read_as_owner(pid).unwrap();
    report(format!(
        "b_some={} d_ok={d_ok} d_ms={d_ms} final_k={}",
        b.is_some(),
        k_of(&fin)
    ));
    assert!(lease.release(pid));
}

#[test]

fn nested_with_lease_and_a_siblings_write_as_owner_are_serialised() {
    play_role!(role_nester);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, val(1, 0), &manual_never()).unwrap();
    let mut n = RoleCommand::new(T4, "nester")
        .arg("path", &path)
        .arg("dir", dir.path())
        .spawn();
    let r = n.next_report(REPORT_WAIT);
    n.finish(REPORT_WAIT);
    println!("nested with_lease vs sibling write_as_owner: {r}");
    let published = lease.status().payload_words;
    assert_eq!(k_of(&published), num(&r, "final_k"));
    // Serialised: either the sibling's write was refused (it waited for the update in
    // flight), or the nested update was refused, or the update applied after it (101).
    let lost = flag(&r, "b_some") && flag(&r, "d_ok") && num(&r, "final_k") == 2;
    assert!(
        !lost,
        "both calls succeeded but the sibling's write_as_owner (k=100) was overwritten by a \
         with_lease result computed from the value before it (k=2): {r}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Nested `with_lease` losing its claim mid-closure.
// ---------------------------------------------------------------------------------------

const T5: &str = "nested_with_lease_never_publishes_after_a_sibling_reclaims_or_a_stale_takeover";

/// Role: holds the lease for its pid; thread B runs a nested `with_lease` whose closure
/// waits for marker `go`. Mode `reclaim`: meanwhile the main thread releases the pid's
/// claim, claims it again for the same pid and writes k=50. Mode `stale`: the parent
/// stops this process, takes the lease over as stale and continues it.
fn role_nested_loser() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let mode = cxc_testkit::arg("mode");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    let pid = me();
    let first = lease.try_claim(pid, 1).expect("claim");
    assert!(lease.write_claimed(&first, val(3, 1)));
    let inside = dir.join("inside");
    let go = dir.join("go");
    let (b, extra) = std::thread::scope(|s| {
        let b = s.spawn(|| {
            lease.with_lease(pid, 1, |v| {
                touch(&inside);
                child_wait_for_path(&go, PATIENCE);
                *v = val(3, 666);
            })
        });
        child_wait_for_path(&inside, PATIENCE);
        let extra = if mode == "reclaim" {
            assert!(lease.release(pid), "the sibling releases");
            let again = lease.try_claim(pid, 1).expect("the sibling claims again");
            assert!(again.generation() > first.generation());
            let w = lease.write_claimed(&again, val(3, 50));
            touch(&go);
            format!("regen={} rewrote={w}", again.generation())
        } else {
            report("inside");
            String::new()
        };
        (b.join().unwrap(), extra)
    });
    report(format!(
        "b_some={} owner_me={} {extra}",
        b.is_some(),
        lease.am_i_owner(pid)
    ));
    if mode == "reclaim" {
        let fin = lease.read_as_owner(pid).expect("still held");
        report(format!("final_k={}", k_of(&fin)));
    }
}

#[test]
fn nested_with_lease_never_publishes_after_a_sibling_reclaims_or_a_stale_takeover() {
    play_role!(role_nested_loser);
    let _s = serial();
    for round in 0..3 {
        // A sibling's release and re-claim for the same pid.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease");
        let lease = OwnerLease::<P>::create_with(&path, val(3, 0), &manual_never()).unwrap();
        let mut c = RoleCommand::new(T5, "nested_loser")
            .arg("path", &path)
            .arg("dir", dir.path())
            .arg("mode", "reclaim")
            .spawn();
        let r = c.next_report(REPORT_WAIT);
        let f = c.next_report(REPORT_WAIT);
        c.finish(REPORT_WAIT);
        assert!(
            !flag(&r, "b_some"),
            "round {round}: nested update published: {r}"
        );
        assert!(flag(&r, "rewrote") && flag(&r, "owner_me"), "{r}");
        assert_eq!(num(&f, "final_k"), 50, "round {round}: {f}");
        assert_eq!(lease.status().payload_words, val(3, 50));
        assert_eq!(
            quarantined(&path),
            0,
            "the nested writer left no quarantine"
        );

        // A stale takeover by this process while the holder is stopped mid-closure.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease");
        let lease = OwnerLease::<P>::create_with(&path, val(3, 0), &manual_never()).unwrap();
        let mut c = RoleCommand::new(T5, "nested_loser")
            .arg("path", &path)
            .arg("dir", dir.path())
            .arg("mode", "stale")
            .spawn();
        assert_eq!(c.next_report(REPORT_WAIT), "inside");
        c.stop();
        c.wait_state('T', Duration::from_secs(5));
        lease.tick_epoch();
        lease.tick_epoch();
        let claim = lease.try_claim(me(), 1).expect("stale takeover");
        assert_eq!(lease.read_claimed(&claim), Some(val(3, 1)));
        touch(&dir.path().join("go"));
        c.cont();
        let r = c.next_report(REPORT_WAIT);
        c.finish(REPORT_WAIT);
        assert!(
            !flag(&r, "b_some") && !flag(&r, "owner_me"),
            "round {round}: {r}"
        );
        assert_eq!(
            lease.read_claimed(&claim),
            Some(val(3, 1)),
            "never published"
        );
        assert!(lease.write_claimed(&claim, val(3, 2)));
        assert_eq!(lease.status().payload_words, val(3, 2));
        assert!(lease.release_claim(&claim));
    }
}

// ---------------------------------------------------------------------------------------
// 6. A holder that execs inside `with_lease`.
// ---------------------------------------------------------------------------------------

const T6: &str = "holder_that_execs_inside_with_lease_keeps_the_claim_and_never_publishes";

/// Role: inside a `with_lease` closure (WRITE set), execs this test binary in role
/// `after_exec` (same process, same pid).
fn role_execer() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    lease.with_lease(me(), BIG, |v| {
        *v = val(8, 666);
        report("inside");
        child_wait_for_path(&dir.join("exec"), PATIENCE);
        let err = RoleCommand::new(T6, "after_exec")
            .arg("path", &path)
            .arg("dir", &dir)
            .into_command()
            .exec();
        panic!("exec failed: {err}");
    });
}

/// Role: the new image of the exec'd holder: same pid, its claim still held.
fn role_after_exec() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let lease = OwnerLease::<P>::open(&path).unwrap();
    let pid = me();
    let owner = lease.am_i_owner(pid);
    let writing = lease.status().writing;
    let t = Instant::now();
    let wrote = lease.write_as_owner(pid, val(8, 7));
    let w_ms = t.elapsed().as_millis();
    let read = lease.read_as_owner(pid).map(|w| k_of(&w));
    report(format!(
        "owner={owner} writing={writing} wrote={wrote} w_ms={w_ms} read_k={read:?}"
    ));
    child_wait_for_path(&dir.join("release"), PATIENCE);
    let rel = lease.release(pid);
    report(format!("released={rel}"));
    sleep_forever();
}

#[test]
fn holder_that_execs_inside_with_lease_keeps_the_claim_and_never_publishes() {
    play_role!(role_execer, role_after_exec);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let lease = OwnerLease::<P>::create_with(&path, val(8, 1), &manual_never()).unwrap();
    let mut x = RoleCommand::new(T6, "execer")
        .arg("path", &path)
        .arg("dir", dir.path())
        .spawn();
    assert_eq!(x.next_report(REPORT_WAIT), "inside");
    touch(&dir.path().join("exec"));
    let r = x.next_report(REPORT_WAIT);
    println!("after exec: {r}");
    assert!(flag(&r, "owner"), "the exec'd process still holds: {r}");
    assert!(
        flag(&r, "writing"),
        "the abandoned update's WRITE stays: {r}"
    );
    assert!(
        !flag(&r, "wrote"),
        "its write waits for the (gone) writer, then fails: {r}"
    );
    assert!(
        num(&r, "w_ms") < 2_000,
        "the write gave up after the bounded wait: {r}"
    );
    assert!(
        r.contains("read_k=Some(1)"),
        "reads the last published: {r}"
    );
    // The process lives: nobody takes its claim over (fresh heartbeat).
    assert!(lease.try_claim(me(), BIG).is_none(), "a live exec'd holder");
    assert_eq!(lease.current_owner(), Some(x.pid()));
    touch(&dir.path().join("release"));
    let r2 = x.next_report(REPORT_WAIT);
    assert!(flag(&r2, "released"), "{r2}");
    assert_eq!(quarantined(&path), 1, "the abandoned buffer is quarantined");
    let c = lease.try_claim(me(), BIG).expect("vacant");
    println!(
        "next claim told={} (the pre-exec image's update was interrupted)",
        c.payload_may_be_inconsistent()
    );
    assert_eq!(lease.read_claimed(&c), Some(val(8, 1)), "never published");
    assert!(lease.write_claimed(&c, val(8, 2)));
    assert!(lease.release_claim(&c));
    assert_eq!(
        quarantined(&path),
        1,
        "kept while the exec'd process lives (only its death frees it)"
    );
    x.kill();
    assert_eq!(lease.status().payload_words, val(8, 2));
}

// ---------------------------------------------------------------------------------------
// 7. A full identity table vacates a dead holder that inherited a torn payload.
// ---------------------------------------------------------------------------------------

const T7: &str = "full_table_vacating_a_dead_torn_holder_passes_the_flag_to_the_newcomer";
/// File offset of identity slot 0 (64 bytes a slot: `state`, then the `pid` word).
const IDENTS_OFF: u64 = 128 + 768;
/// Pids the filler registers slots for.
const FILL_BASE: u64 = 3_000_000;

/// Role: registers (and pins) `n` identity slots, one per pid `FILL_BASE + k`, and lives
/// until killed.
fn role_filler() {
    let lease = OwnerLease::<P>::open(path_arg("path")).unwrap();
    let n: u64 = cxc_testkit::arg("n").parse().unwrap();
    for k in 0..n {
        // The attempt registers the slot; the lease is held, so it claims nothing.
        assert!(!lease.try_acquire((FILL_BASE + k) as u32, BIG));
    }
    report(format!("filled={n}"));
    sleep_forever();
}

/// Role: a process without a slot claims for its own pid.
fn role_newcomer() {
    let lease = OwnerLease::<P>::open(path_arg("path")).unwrap();
    let c = lease.try_claim(me(), BIG);
    report(format!(
        "claimed={} told={} torn_now={}",
        c.is_some(),
        c.is_some_and(|c| c.payload_may_be_inconsistent()),
        lease.payload_torn()
    ));
}

#[test]

fn full_table_vacating_a_dead_torn_holder_passes_the_flag_to_the_newcomer() {
    play_role!(role_victim, role_hand, role_filler, role_newcomer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    // This process never claims: it takes no identity slot.
    let lease = OwnerLease::<P>::create_with(&path, val(5, 5), &manual_never()).unwrap();
    let mut v = RoleCommand::new(T7, "victim").arg("path", &path).spawn();
    assert_eq!(v.next_report(REPORT_WAIT), "inside");
    v.kill();
    // H takes the dead victim over (told), and holds without writing.
    let mut h = hand(T7, &path, "hold");
    let l = h.next_report(REPORT_WAIT);
    assert!(flag(&l, "told"), "H is told: {l}");
    let mut filler = RoleCommand::new(T7, "filler")
        .arg("path", &path)
        .arg("n", "63")
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "filled=63");
    let filled = (0..64)
        .filter(|i| {
            let base = IDENTS_OFF + 64 * i;
            read_word(&path, base) & 2 != 0
                && (FILL_BASE..FILL_BASE + 63).contains(&(read_word(&path, base + 8) & 0xFFFF_FFFF))
        })
        .count();
    assert_eq!(filled, 63, "the filler holds 63 slots, H the 64th");
    h.kill();
    assert!(lease.payload_torn(), "H died holding the inherited flag");
    let mut n = RoleCommand::new(T7, "newcomer").arg("path", &path).spawn();
    let r = n.next_report(REPORT_WAIT);
    n.finish(REPORT_WAIT);
    println!(
        "newcomer after vacating dead torn holder: {r}; payload_torn now {}",
        lease.payload_torn()
    );
    assert!(
        flag(&r, "claimed"),
        "a dead holder never wedges a full table: {r}"
    );
    assert_eq!(lease.status().payload_words, val(5, 5));
    assert!(
        flag(&r, "told") && flag(&r, "torn_now"),
        "the interrupted update was forgotten when the full table vacated its dead holder: {r}"
    );
    filler.kill();
}

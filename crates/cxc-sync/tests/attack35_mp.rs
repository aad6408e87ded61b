#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack35: fencing tokens and generations against stalls, kills, reopenings and the
//! bit fields that hold them, with real processes (docs/owner-lease.md "The claim word",
//! "Generations are per file and strictly increasing; pass them to storage as fencing
//! tokens"; docs/leader-election.md "Every term has a token, strictly greater for every
//! later term"; `FencedFile`).
//!
//! 1. Observer processes (`lease_term`, `current_claim`, `status`, `Elector::observe`)
//!    SIGSTOPped at random while two other pids hand the lease over across term
//!    checkpoints (every 2^16 claims): no value may be one no claim ever had (the
//!    lease never gets near 2^40 claims) nor go down.
//! 2. A claimant process SIGSTOPped at random while it claims (claims API, guards,
//!    election campaigns: one test each); its claim is taken over as stale and the
//!    lease crosses two term checkpoints before it runs again: every token it got must
//!    be one the lease issued, so a fresh holder's token, handed to a `FencedFile` after
//!    the claimant's highest, is accepted.
//! 3. Claims, guards and election terms of fresh processes across the wrap of the claim
//!    word's 40 generation bits (the file's words set to just below the wrap, a state
//!    2^40 claims reach), with the holder of the wrap claim SIGKILLed and the `term`
//!    checkpoint it stored rolled back (as if it died between its claim CAS and the
//!    checkpoint store): tokens +1 per claim, every one accepted by a `FencedFile`,
//!    read back the same by reopening processes, checkpoints resume.
//! 4. A `FencedFile` handle opened before `fork` and used by both processes (a pre-fork
//!    server's store): "every operation holds an exclusive `flock` on the file, so check
//!    and write are one step for every process using it" — the accepted tokens, in
//!    acceptance order, must never go down; the same with one open per process as the
//!    control, and with the handle shared by two threads.
//!
//! 1, 2 (claims API and guards) and 4 (fork and threads) failed before their fixes: a
//! word loaded before a checkpoint passed it was read as 2^40 generations ahead of the
//! term (`LeaseState::full_generation` now counts such a word backwards), and a
//! `FencedFile`'s `flock` excluded nothing between holders of one open file description
//! (it now also holds a lock of the handle, and a forked child opens the file anew).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionConfig, Elector, EpochMode, FencedFile, FencedResource, LeaseBuilder, LeaseOptions,
    MmapElection, OwnerLease, Preemption,
};
use cxc_testkit::{
    Rng, RoleCommand, arg, fields, num, path_arg, play_role, read_word, report, sleep_forever,
    wait_until,
};

/// The claim word: file offset 128 (the lease block follows the 128-byte header).
const CLAIM_AT: u64 = 128;
/// `term`: lease block offset 24 (docs/owner-lease.md, "Layout").
const TERM_AT: u64 = 128 + 24;
/// The claim word keeps the low 40 bits of the generation, from bit 24.
const GEN_SHIFT: u32 = 24;
const GEN_MOD: u64 = 1 << 40;
/// A checkpoint of the full generation is stored every 2^16 claims.
const CHECKPOINT: u64 = 1 << 16;

const REPORT_WAIT: Duration = Duration::from_secs(30);

/// An election-compatible lease file (clock epochs of 1 ms, no preemption): every
/// primitive of this file's tests can use it.
type Rec = cxc_sync::election::LeaderRecord;

fn create_lease(path: &Path) -> OwnerLease<Rec> {
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..LeaseOptions::default()
    };
    OwnerLease::create_with(path, Rec::default(), &opts).unwrap()
}

/// The full generation the file holds now, rebuilt as docs/owner-lease.md says from two
/// raw reads (`pread`, not the mapping) of a quiet lease.
fn raw_generation(path: &Path) -> u64 {
    loop {
        let w = read_word(path, CLAIM_AT);
        let t = read_word(path, TERM_AT);
        if read_word(path, CLAIM_AT) == w && read_word(path, TERM_AT) == t {
            let low = w >> GEN_SHIFT;
            return t.wrapping_add(low.wrapping_sub(t) & (GEN_MOD - 1));
        }
    }
}

fn put_word(path: &Path, offset: u64, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_ne_bytes(), offset).unwrap();
}

fn marker(path: &Path, ext: &str) -> PathBuf {
    path.with_extension(ext)
}

fn election(path: &Path, ms: u64, identity: &str) -> Elector<MmapElection> {
    let lease = OwnerLease::<Rec>::open(path).unwrap();
    let backend = MmapElection::new(lease, Duration::from_millis(ms)).unwrap();
    Elector::new(
        backend,
        ElectionConfig::new(identity).lease_duration(Duration::from_millis(ms)),
    )
    .unwrap()
}

/// Role: claims and releases as fast as it can, for pids 1 and 2 in turn (`grace`
/// epochs), until the stop marker exists; its own tokens must increase.
fn role_churn() {
    let path = path_arg("path");
    let grace: u64 = arg("grace").parse().unwrap();
    let lease = OwnerLease::<Rec>::open(&path).unwrap();
    let stop = marker(&path, "stop");
    let (mut n, mut last) = (0u64, 0u64);
    while !stop.exists() {
        for i in 0..4096u32 {
            if let Some(c) = lease.try_claim(1 + (i & 1), grace) {
                assert!(
                    c.generation() > last,
                    "churn: {} after {last}",
                    c.generation()
                );
                last = c.generation();
                lease.release_claim(&c);
                n += 1;
            }
        }
    }
    report(format!("claims={n} last={last}"));
}

// ---------------------------------------------------------------------------------------
// 1. Observers stalled across a term checkpoint.
// ---------------------------------------------------------------------------------------

/// Role: reads the generation through four calls, each value checked against the
/// previous one of the same call (generations only grow) and against 2^40 (this test
/// makes far fewer claims). The first bad value creates the `hit` marker.
fn role_observer() {
    let path = path_arg("path");
    let elector = election(&path, 3, "observer");
    let lease = elector.backend().lease();
    let (stop, hit) = (marker(&path, "stop"), marker(&path, "hit"));
    const NAMES: [&str; 4] = ["lease_term", "current_claim", "status", "observe"];
    let mut prev = [0u64; 4];
    let mut bad: Vec<String> = Vec::new();
    let mut reads = 0u64;
    while !stop.exists() && bad.len() < 8 {
        for _ in 0..256 {
            for (k, p) in prev.iter_mut().enumerate() {
                let g = match k {
                    0 => Some(lease.lease_term()),
                    1 => lease.current_claim().map(|c| c.generation()),
                    2 => Some(lease.status().generation),
                    _ => elector.observe().unwrap().map(|l| l.token),
                };
                let Some(g) = g else { continue };
                reads += 1;
                if g < *p || g >= GEN_MOD {
                    bad.push(format!("{}:{}->{}", NAMES[k], *p, g));
                    let _ = std::fs::write(&hit, b"1");
                }
                *p = g;
            }
        }
    }
    report(format!(
        "reads={reads} bad={} values={}",
        bad.len(),
        bad.join(",")
    ));
}

const OBSERVERS: &str = "observers_never_see_a_generation_no_claim_had";

/// docs/owner-lease.md: "The full generation of a claim is `term + ((gen40 - term) mod
/// 2^40)` ... the reconstruction is exact and generations keep increasing past the wrap";
/// `lease_term`: "the generation of the current (or last) claim"; docs/leader-election.md:
/// "`elector.observe()` → the current leader" with its token.
#[test]
fn observers_never_see_a_generation_no_claim_had() {
    play_role!(role_churn, role_observer);
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let _lease = create_lease(&path);
    let mut churn = RoleCommand::new(OBSERVERS, "churn")
        .arg("path", &path)
        .arg("grace", "1000000")
        .spawn();
    let mut obs = RoleCommand::new(OBSERVERS, "observer")
        .arg("path", &path)
        .spawn();
    let mut rng = Rng::for_test();
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(25) && !marker(&path, "hit").exists() {
        std::thread::sleep(Duration::from_micros(rng.range(200, 3000)));
        obs.stop();
        // Two checkpoints pass while it is stopped.
        let t0 = read_word(&path, TERM_AT);
        assert!(
            wait_until(Duration::from_secs(20), || read_word(&path, TERM_AT)
                >= t0 + 2 * CHECKPOINT),
            "the churn stalled"
        );
        obs.cont();
        rounds += 1;
    }
    std::fs::write(marker(&path, "stop"), b"1").unwrap();
    let o = obs.next_report(REPORT_WAIT);
    let c = churn.next_report(REPORT_WAIT);
    let issued = raw_generation(&path);
    eprintln!("{rounds} stops; observer: {o}; churn: {c}; file generation {issued}");
    assert!(num(&c, "last") <= issued);
    assert_eq!(
        num(&o, "bad"),
        0,
        "observers read generations no claim had (the lease issued {issued} in all, < 2^40 = {GEN_MOD}): {o}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A claimant stalled while it claims, across a stale takeover and a checkpoint.
// ---------------------------------------------------------------------------------------

/// Role: claims for its own pid through the claims API, a guard and an election
/// campaign in turn, releasing each at once, until the stop marker exists; keeps the
/// highest token of each; any token at or above 2^40 creates the `hit` marker. At the end
/// it hands its highest token to the fenced file (a holder whose write was late).
fn role_claimant() {
    let path = path_arg("path");
    let lease: OwnerLease<Rec> = LeaseBuilder::new(&path)
        .grace(Duration::from_millis(3))
        .open()
        .unwrap();
    let elector = election(&path, 3, "claimant");
    let (stop, hit) = (marker(&path, "stop"), marker(&path, "hit"));
    let me = std::process::id();
    let api = arg("api");
    let mut max = [0u64; 3];
    let mut count = [0u64; 3];
    let note = |k: usize, t: u64, max: &mut [u64; 3], count: &mut [u64; 3]| {
        max[k] = max[k].max(t);
        count[k] += 1;
        if t >= GEN_MOD {
            let _ = std::fs::write(&hit, b"1");
        }
    };
    while !stop.exists() {
        for _ in 0..64 {
            if api == "claim"
                && let Some(c) = lease.try_claim(me, 3)
            {
                note(0, c.generation(), &mut max, &mut count);
                lease.release_claim(&c);
            }
            if api == "guard"
                && let Some(g) = lease.try_lock()
            {
                note(1, g.token(), &mut max, &mut count);
                drop(g);
            }
            if api == "elect"
                && let Some(l) = elector.campaign(Duration::ZERO).unwrap()
            {
                note(2, l.token(), &mut max, &mut count);
                let _ = l.step_down();
            }
        }
    }
    let top = max.iter().copied().max().unwrap();
    let store = FencedFile::open(path_arg("store")).unwrap();
    let accepted = store.write(top, b"claimant").unwrap();
    report(format!(
        "claims={} guards={} terms={} max_claim={} max_guard={} max_term={} top={top} accepted={accepted}",
        count[0], count[1], count[2], max[0], max[1], max[2]
    ));
}

/// One run of test 2 for claims made through `api` (`claim`, `guard`, `elect`): the
/// claimant is stopped at random, for as long as its claim takes to go stale and two
/// term checkpoints to pass, until it got a token the lease never issued or `budget`
/// ran out. Then a fresh holder claims and hands its token to the fenced file after the
/// claimant's highest.
fn stalled_claimant(test: &str, api: &str, budget: Duration) {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let store = d.path().join("store");
    let _lease = create_lease(&path);
    let mut churn = RoleCommand::new(test, "churn")
        .arg("path", &path)
        .arg("grace", "3")
        .spawn();
    let mut cl = RoleCommand::new(test, "claimant")
        .arg("path", &path)
        .arg("store", &store)
        .arg("api", api)
        .spawn();
    let mut rng = Rng::for_test();
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < budget && !marker(&path, "hit").exists() {
        std::thread::sleep(Duration::from_micros(rng.range(200, 3000)));
        cl.stop();
        // Its claim (if it holds one) goes stale and two checkpoints pass meanwhile.
        let t0 = read_word(&path, TERM_AT);
        assert!(
            wait_until(Duration::from_secs(20), || read_word(&path, TERM_AT)
                >= t0 + 2 * CHECKPOINT),
            "the churn stalled"
        );
        cl.cont();
        rounds += 1;
    }
    std::fs::write(marker(&path, "stop"), b"1").unwrap();
    let o = cl.next_report(REPORT_WAIT);
    let c = churn.next_report(REPORT_WAIT);
    // A fresh holder, after everyone else stopped: the newest claim of all.
    let lease = OwnerLease::<Rec>::open(&path).unwrap();
    let fresh = lease.try_claim(std::process::id(), 3).expect("vacant");
    let issued = raw_generation(&path);
    let accepted = FencedFile::open(&store)
        .unwrap()
        .write(fresh.generation(), b"fresh")
        .unwrap();
    eprintln!(
        "{api}: {rounds} stops; claimant: {o}; churn: {c}; fresh token {} (file generation {issued}), accepted after the claimant's: {accepted}",
        fresh.generation()
    );
    assert_eq!(fresh.generation(), issued);
    assert!(
        num(&o, "top") < fresh.generation(),
        "{api}: the stalled claimant got token {} but the lease has issued only {issued} claims: {o}",
        num(&o, "top")
    );
    assert!(
        accepted,
        "{api}: the FencedFile refused the newest holder's token {}: {o}",
        fresh.generation()
    );
}

const CLAIMANT: &str = "a_stalled_claimants_token_is_one_the_lease_issued";

/// docs/owner-lease.md: "every claim has a holder, a generation (the fencing token)";
/// "Generations are per file and strictly increasing; pass them to storage as fencing
/// tokens" (`try_claim`, `LeaseClaim::generation`).
#[test]
fn a_stalled_claimants_token_is_one_the_lease_issued() {
    play_role!(role_churn, role_claimant);
    stalled_claimant(CLAIMANT, "claim", Duration::from_secs(40));
}

const GUARD: &str = "a_stalled_guards_token_is_one_the_lease_issued";

/// The same for a guard's `token()` (docs/api.md, docs/owner-lease.md).
#[test]
fn a_stalled_guards_token_is_one_the_lease_issued() {
    play_role!(role_churn, role_claimant);
    stalled_claimant(GUARD, "guard", Duration::from_secs(40));
}

const TERM: &str = "a_stalled_campaigns_token_is_one_the_lease_issued";

/// The same for an election term's token (docs/leader-election.md: "Every term has a
/// token, strictly greater for every later term"). Holds: a campaign whose claim was
/// taken over before it wrote its leader record (a fenced write) does not win.
#[test]
fn a_stalled_campaigns_token_is_one_the_lease_issued() {
    play_role!(role_churn, role_claimant);
    stalled_claimant(TERM, "elect", Duration::from_secs(15));
}

// ---------------------------------------------------------------------------------------
// 3. Across the wrap of the claim word's 40 generation bits.
// ---------------------------------------------------------------------------------------

/// Role: one step of a fresh process. `how` = `claim` (claims API), `guard`, `elect`
/// (campaign), `hold` (claims and stays until killed), `look` (reports what it reads).
/// Every token is appended to the fenced store (8 bytes, little-endian); reports the
/// token, whether the store accepted it and whether the claim was current.
fn role_step() {
    let path = path_arg("path");
    let store = FencedFile::open(path_arg("store")).unwrap();
    let lease: OwnerLease<Rec> = LeaseBuilder::new(&path)
        .grace(Duration::from_millis(50))
        .open()
        .unwrap();
    let me = std::process::id();
    let put = |t: u64| store.append(t, &t.to_le_bytes()).unwrap();
    match arg("how").as_str() {
        "claim" | "hold" => {
            let c = lease
                .acquire(me, 50, Duration::from_secs(10))
                .expect("claimed");
            let t = c.generation();
            let ok = put(t);
            let cur = lease.is_current(&c);
            let seen = lease.lease_term();
            let status = lease.status().generation;
            report(format!(
                "token={t} accepted={ok} current={cur} term={seen} status={status}"
            ));
            if arg("how") == "hold" {
                sleep_forever();
            }
            assert!(lease.release_claim(&c));
        }
        "guard" => {
            let g = lease.lock_timeout(Duration::from_secs(10)).expect("locked");
            let t = g.token();
            let ok = put(t);
            let cur = g.is_current();
            report(format!("token={t} accepted={ok} current={cur}"));
            g.unlock().unwrap();
        }
        "elect" => {
            drop(lease);
            let elector = election(&path, 50, "step");
            let l = elector
                .campaign(Duration::from_secs(10))
                .unwrap()
                .expect("elected");
            let t = l.token();
            let ok = put(t);
            let seen = elector.observe().unwrap().map_or(0, |l| l.token);
            report(format!(
                "token={t} accepted={ok} current=true observed={seen}"
            ));
            l.step_down().unwrap();
        }
        _ => {
            let cur = lease.current_claim().map_or(0, |c| c.generation());
            report(format!(
                "term={} status={} current={cur}",
                lease.lease_term(),
                lease.status().generation
            ));
        }
    }
}

const WRAP: &str = "tokens_cross_the_40_bit_wrap_in_order_across_processes";

/// docs/owner-lease.md "The claim word": "`term` never lags the claim word by more than
/// 2^16 claims, so the reconstruction is exact and generations keep increasing past the
/// wrap (tested past the first checkpoint)" — here past the wrap itself.
#[test]
fn tokens_cross_the_40_bit_wrap_in_order_across_processes() {
    play_role!(role_step);
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l");
    let store = d.path().join("store");
    let lease = create_lease(&path);
    // A vacant lease whose last claim had generation 2^40 - 4 (published buffer 0), and
    // the checkpoint that claim's run stored: the state 2^40 - 4 claims leave.
    assert_eq!(read_word(&path, CLAIM_AT), 0, "fresh claim word");
    let start = GEN_MOD - 4;
    put_word(&path, CLAIM_AT, start << GEN_SHIFT);
    put_word(&path, TERM_AT, GEN_MOD - CHECKPOINT);
    assert_eq!(lease.lease_term(), start);
    let step = |how: &str| -> String {
        let mut p = RoleCommand::new(WRAP, "step")
            .arg("path", &path)
            .arg("store", &store)
            .arg("how", how)
            .spawn();
        let line = p.next_report(REPORT_WAIT);
        if how != "hold" {
            p.finish(REPORT_WAIT);
        } else {
            // Killed right after its claim at the wrap, before its release: and as if
            // before its checkpoint store too.
            put_word(&path, TERM_AT, GEN_MOD - CHECKPOINT);
            p.kill();
        }
        eprintln!("{how}: {line}");
        line
    };
    let mut expect = start;
    let mut tokens = Vec::new();
    for how in [
        "claim", "guard", "elect", "hold", "look", "claim", "guard", "elect", "claim",
    ] {
        let line = step(how);
        let f = fields(&line);
        if how == "look" {
            // The dead holder's claim at the wrap is still the current one.
            assert_eq!(num(&line, "term"), expect, "{line}");
            assert_eq!(num(&line, "status"), expect, "{line}");
            assert_eq!(num(&line, "current"), expect, "{line}");
            continue;
        }
        expect += 1;
        assert_eq!(num(&line, "token"), expect, "{how}: {line}");
        assert_eq!(f["accepted"], "true", "{how}: the store refused it: {line}");
        assert_eq!(f["current"], "true", "{how}: {line}");
        for k in ["term", "status", "observed"] {
            if let Some(v) = f.get(k) {
                assert_eq!(v.parse::<u64>().unwrap(), expect, "{how} {k}: {line}");
            }
        }
        tokens.push(expect);
    }
    // This handle opened before the wrap: the same numbers, and 2^16 more claims bring
    // the next checkpoint.
    assert_eq!(lease.lease_term(), expect);
    let mut last = expect;
    for i in 0..CHECKPOINT as u32 {
        let c = lease.try_claim(1 + (i & 1), 3).unwrap();
        assert_eq!(c.generation(), last + 1);
        last = c.generation();
        assert!(lease.is_current(&c));
        assert!(lease.release_claim(&c));
    }
    assert!(
        read_word(&path, TERM_AT) > GEN_MOD,
        "the checkpoint after the wrap was stored: {:#x}",
        read_word(&path, TERM_AT)
    );
    assert_eq!(raw_generation(&path), last);
    let line = step("claim");
    assert_eq!(num(&line, "token"), last + 1, "{line}");
    tokens.push(last + 1);
    // The store accepted them all, in order.
    let (mark, data) = FencedFile::open(&store).unwrap().read().unwrap();
    let logged: Vec<u64> = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(logged, tokens);
    assert_eq!(mark, last + 1);
}

// ---------------------------------------------------------------------------------------
// 4. A FencedFile handle shared across fork.
// ---------------------------------------------------------------------------------------

/// Role: two writers, this process and a forked child, append tokens to the fenced
/// file: even tokens here, odd ones in the child, each rising by 2 per attempt, so their
/// tokens interleave closely. `shared=1`: the child uses the handle opened before the
/// fork; else it opens its own. Reports the accepted count and highest accepted token
/// of each.
fn role_fwriters() {
    let store = path_arg("store");
    let rounds: u64 = arg("rounds").parse().unwrap();
    let shared = arg("shared") == "1";
    let f = FencedFile::open(&store).unwrap();
    let run = |f: &FencedFile, odd: u64| -> (u64, u64) {
        let (mut n, mut top) = (0, 0);
        for k in 1..=rounds {
            let t = 2 * k + odd;
            if f.append(t, &t.to_le_bytes()).unwrap() {
                n += 1;
                top = t;
            }
        }
        (n, top)
    };
    // SAFETY: the child only uses the fenced file, reports and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let (n, top) = if shared {
            run(&f, 1)
        } else {
            run(&FencedFile::open(&store).unwrap(), 1)
        };
        report(format!("odd_n={n} odd_top={top}"));
        // SAFETY: ends the forked child without the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    let (n, top) = run(&f, 0);
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    report(format!("even_n={n} even_top={top}"));
}

fn fenced_writers(test: &str, shared: bool) -> (Vec<String>, u64, Vec<u64>) {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mut p = RoleCommand::new(test, "fwriters")
        .arg("store", &store)
        .arg("rounds", "20000")
        .arg("shared", if shared { "1" } else { "0" })
        .spawn();
    let reports = p.finish(Duration::from_secs(50));
    let (mark, data) = FencedFile::open(&store).unwrap().read().unwrap();
    let logged = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (reports, mark, logged)
}

/// The accepted tokens in acceptance order must never go down, and the final
/// high-water mark is the highest token any writer was told was accepted.
fn check_fenced(reports: &[String], mark: u64, logged: &[u64]) {
    let top = reports
        .iter()
        .map(|r| {
            let f = fields(r);
            f.get("odd_top")
                .or(f.get("even_top"))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .max()
        .unwrap();
    let downs: Vec<String> = logged
        .windows(2)
        .filter(|w| w[1] < w[0])
        .take(5)
        .map(|w| format!("{} after {}", w[1], w[0]))
        .collect();
    eprintln!(
        "{reports:?}: mark {mark}, {} records, {} downs (first {downs:?})",
        logged.len(),
        logged.windows(2).filter(|w| w[1] < w[0]).count()
    );
    assert!(
        downs.is_empty(),
        "lower tokens accepted after higher ones: {downs:?}"
    );
    assert!(
        mark >= top,
        "the high-water mark went down to {mark} below the accepted {top}"
    );
}

const FENCED_OWN: &str = "fenced_file_writers_with_their_own_handles_never_accept_a_lower_token";

/// docs/leader-election.md "`FencedResource` ... `Ok(false)` for a token below the
/// high-water mark"; `FencedFile`: "check and write are one step for every process
/// using it". The control of test 4: one open per process.
#[test]
fn fenced_file_writers_with_their_own_handles_never_accept_a_lower_token() {
    play_role!(role_fwriters);
    let (reports, mark, logged) = fenced_writers(FENCED_OWN, false);
    check_fenced(&reports, mark, &logged);
}

const FENCED_SHARED: &str = "fenced_file_handle_shared_across_fork_never_accepts_a_lower_token";

/// As the control, with the handle opened before `fork` and used by both processes.
#[test]
fn fenced_file_handle_shared_across_fork_never_accepts_a_lower_token() {
    play_role!(role_fwriters);
    let (reports, mark, logged) = fenced_writers(FENCED_SHARED, true);
    check_fenced(&reports, mark, &logged);
}

/// As the fork case, with the handle shared by two threads of one process (an
/// `Arc<FencedFile>`): a `flock` is per open file description, which threads share, so
/// only the handle's own lock makes check and write one step between them (before it,
/// lower tokens were accepted after higher ones here too).
#[test]
fn fenced_file_handle_shared_by_threads_never_accepts_a_lower_token() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let f = std::sync::Arc::new(FencedFile::open(&store).unwrap());
    let rounds = 20_000u64;
    let tops: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0u64, "even_top"), (1, "odd_top")]
            .into_iter()
            .map(|(odd, name)| {
                let f = f.clone();
                s.spawn(move || {
                    let mut top = 0;
                    for k in 1..=rounds {
                        let t = 2 * k + odd;
                        if f.append(t, &t.to_le_bytes()).unwrap() {
                            top = t;
                        }
                    }
                    format!("{name}={top}")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (mark, data) = f.read().unwrap();
    let logged: Vec<u64> = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    check_fenced(&tops, mark, &logged);
}

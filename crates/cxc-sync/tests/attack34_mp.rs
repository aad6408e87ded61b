#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack34: the mapped-file leader election (docs/leader-election.md) attacked where
//! earlier rounds (attack2, attack10, attack13, attack21, election_mp) did not go, with
//! real processes.
//!
//! 1. A full identity table: 64 processes that each led once and live on (stepped down,
//!    elector kept); one of them leads again and is SIGSTOPped, then continued (it
//!    resigns when it finds its term expired), then SIGKILLed, while a newcomer that
//!    never led campaigns all along. "a stopped or non-renewing one [is replaced] after
//!    the lease duration", `campaign` "wakes at once on a release".
//! 2. `step_down()` / `resign()` of a term whose local deadline passed (nobody took over):
//!    "`Err(Lost)` if it was already over", while `is_lost()` and `renew()` say it is.
//! 3. A forked child's copy of a `Leadership` ("never led", "`is_current` is `false` and
//!    `renew` fails"): what its `wait_lost` and `is_lost` say first.
//! 4. Resign racing a takeover: two candidates that renew, go idle and act (`step_down`,
//!    `resign`, `renew`, `is_current`) within a few ms either side of their term's
//!    deadline while the other campaigns with a 1 ms retry period. Nothing of the old term
//!    may succeed after its successor was elected, and a late resignation must never end
//!    the successor's term ("a stale term never ends a newer one").
//! 5. Seeded SIGSTOP/SIGKILL chaos over ten candidates (more than the cores; plain, main
//!    thread exited, fallback identity) with two independent judges: a *storage* process
//!    that keeps its own fencing high-water mark (no `FencedFile`) and flags a token used
//!    by two processes, and tells a refused leader, whose next `renew` must then fail; and
//!    an *observer* process whose `observe()` and `NewLeader` events must never go back
//!    to an older term nor name a leader that did not win that token.
//! 6. A leader whose work loop hangs, with a thread waiting on its event channel for
//!    `StoppedLeading` (client-go's `OnStoppedLeading` pattern) and one in `wait_lost`,
//!    after a standby took over.
//! 7. `observe()` of a leader whose main thread exited while its worker renews (pidfs and
//!    fallback identity paths): named while it lives, `None` once it is SIGKILLed.
//!
//! Items 1, 2, 3 and 6 found broken promises: 2 and 3 were fixed in the code; 1 and 6
//! were promises the docs made and the design does not keep (a slot per candidate
//! process while its elector lives; events sent when a call notices), so the docs now
//! say what is kept and these tests check that. 4, 5 and 7 held.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionBackend, ElectionConfig, ElectionError, ElectionEvent, Elector, MmapElection,
};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, exit_main_thread, fields, flag, mono_ns, num, path_arg, play_role,
    read_word, report, serial, sleep_forever, wait_until,
};

const REPORT_WAIT: Duration = Duration::from_secs(30);
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn ms_arg(key: &str) -> Duration {
    Duration::from_millis(arg(key).parse().expect("ms"))
}

fn elector(path: &Path, id: &str, lease: Duration, retry: Duration) -> Elector<MmapElection> {
    let backend = MmapElection::create_or_open(path, lease).expect("election file");
    let cfg = ElectionConfig::new(id)
        .lease_duration(lease)
        .retry_period(retry);
    Elector::new(backend, cfg).expect("elector")
}

/// A child's slow wait for a marker file (many children wait at once: no busy polling).
fn wait_path_slowly(path: &Path) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < CHILD_DEADLINE, "no {path:?} in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `O_APPEND` log: one `write` per line, so lines of several processes never mix.
struct Log(std::fs::File);

impl Log {
    fn open(path: &Path) -> Log {
        Log(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("log"))
    }
    fn line(&self, s: String) {
        (&self.0).write_all(s.as_bytes()).expect("log line");
    }
}

fn sleep_until_mono(target: u64) {
    loop {
        let now = mono_ns();
        if now >= target {
            return;
        }
        let left = target - now;
        if left > 2_000_000 {
            std::thread::sleep(Duration::from_nanos(left - 1_500_000));
        } else {
            std::hint::spin_loop();
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. A full identity table.
// ---------------------------------------------------------------------------------------

const TABLE: &str = "a_newcomer_is_elected_once_one_of_64_past_leaders_frees_a_slot";
const TABLE_LEASE_MS: u64 = 200;

/// The file offset of identity slot `i`'s `state` word (docs/owner-lease.md: the lease
/// block follows the 128-byte header; `idents[64]` at block offset 768, 64 bytes each).
fn slot_state(path: &Path, i: u64) -> u64 {
    read_word(path, 128 + 768 + 64 * i)
}

/// Leader-election.md, Pitfalls: the file's identity table has 64 slots; every process
/// whose elector has campaigned keeps one while that elector lives (also after stepping
/// down), and a further candidate waits for a slot, which a candidate process that exits
/// (or drops its elector) frees. Sixty-four candidates each win once, step down and live
/// on with their elector (the table is full). Candidate `v0` then leads again and renews;
/// a newcomer that never led campaigns. `v0` is SIGSTOPped: the newcomer is not elected
/// (no slot); then another past leader is SIGKILLed: the newcomer must lead within the
/// lease (plus margin). Before the docs named the limit they promised a stopped leader
/// replaced after the lease whatever the table held.
#[test]
fn a_newcomer_is_elected_once_one_of_64_past_leaders_frees_a_slot() {
    fn role_veteran() {
        let lease = ms_arg("lease_ms");
        let i = arg("i");
        let path = path_arg("path");
        let el = elector(&path, &format!("v{i}"), lease, Duration::from_millis(20));
        let l = el
            .campaign(CHILD_DEADLINE)
            .expect("campaign")
            .expect("elected");
        let token = l.token();
        l.step_down().expect("step_down");
        report(format!("veteran token={token}"));
        wait_path_slowly(&path_arg("dir").join(format!("go-{i}")));
        let l = el
            .campaign(CHILD_DEADLINE)
            .expect("campaign")
            .expect("elected again");
        report(format!("leading token={}", l.token()));
        loop {
            if l.renew().is_err() {
                report("lost=1");
                drop(l);
                // Lives on as an observer with its elector (and its slot).
                sleep_forever();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    fn role_newcomer() {
        let lease = ms_arg("lease_ms");
        let el = elector(
            &path_arg("path"),
            "newcomer",
            lease,
            Duration::from_millis(20),
        );
        report("campaigning=1");
        let l = el
            .campaign(CHILD_DEADLINE)
            .expect("campaign")
            .expect("elected within 60 s");
        report(format!("elected token={} t={}", l.token(), mono_ns()));
        loop {
            let _ = l.renew();
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    play_role!(role_veteran, role_newcomer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("e");
    let lease = Duration::from_millis(TABLE_LEASE_MS);
    drop(MmapElection::create_or_open(&path, lease).unwrap());
    let observer = MmapElection::create_or_open(&path, lease).unwrap();
    let mut vets: Vec<Proc> = (0..64)
        .map(|i| {
            RoleCommand::new(TABLE, "veteran")
                .arg("path", &path)
                .arg("dir", d.path())
                .arg("i", i.to_string())
                .arg("lease_ms", TABLE_LEASE_MS.to_string())
                .spawn()
        })
        .collect();
    let mut tokens: Vec<u64> = vets
        .iter_mut()
        .map(|v| num(&v.next_report(CHILD_DEADLINE), "token"))
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 64, "two veterans shared a token: {tokens:?}");
    let used = (0..64).filter(|&i| slot_state(&path, i) != 0).count();
    assert_eq!(used, 64, "harness: the identity table is not full");
    std::fs::write(d.path().join("go-0"), b"go").unwrap();
    let v0_token = num(&vets[0].next_report(REPORT_WAIT), "token");
    let mut newcomer = RoleCommand::new(TABLE, "newcomer")
        .arg("path", &path)
        .arg("lease_ms", TABLE_LEASE_MS.to_string())
        .spawn();
    assert_eq!(newcomer.next_report(REPORT_WAIT), "campaigning=1");
    std::thread::sleep(Duration::from_millis(300));
    let leads = |id: &str| observer.recorded_leader().is_some_and(|l| l.identity == id);
    assert!(leads("v0"), "v0 (token {v0_token}) does not lead");
    // v0 stopped past the lease: the newcomer, with no slot, is not elected (the
    // documented limit) ...
    vets[0].stop();
    vets[0].wait_state('T', Duration::from_secs(5));
    let waited = wait_until(lease * 3, || leads("newcomer"));
    assert!(
        !waited,
        "harness: the newcomer led without a slot (is the table really full?)"
    );
    // ... until a past leader's process exits and frees its slot: it must then lead.
    vets[1].kill();
    let t = Instant::now();
    let elected = wait_until(lease + Duration::from_secs(3), || leads("newcomer"));
    let took = t.elapsed();
    newcomer.kill();
    for v in &mut vets {
        v.kill();
    }
    assert!(
        elected,
        "the newcomer was not elected {took:?} after a past leader's process exited and \
         freed a slot (v0 stopped past the lease {lease:?})"
    );
    println!("newcomer elected {took:?} after a slot freed");
}

// ---------------------------------------------------------------------------------------
// 2. Stepping down from an expired term.
// ---------------------------------------------------------------------------------------

/// API: `leadership.step_down()` "resigns now; `Err(Lost)` if it was already over";
/// `renew()`: "`Err(Lost)` ... when the previous renewal is older than the lease duration
/// (the leader then resigns ...)"; `is_lost()` "answers locally". A lone leader (lease
/// 100 ms, nobody else campaigns) renews, idles for 250 ms, asks `is_lost()` (true: the
/// term is over) and then steps down (or `resign`s). The same state that makes `renew`
/// say `Lost` must make `step_down` say `Lost`.
#[test]
fn stepping_down_from_an_expired_term_reports_lost() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("e");
    let lease = Duration::from_millis(100);
    let mut seen = Vec::new();
    for how in ["step_down", "resign", "renew"] {
        let el = elector(&path, "solo", lease, Duration::from_millis(10));
        let l = el
            .campaign(Duration::from_secs(5))
            .unwrap()
            .expect("elected");
        l.renew().unwrap();
        std::thread::sleep(Duration::from_millis(250));
        let lost_locally = l.is_lost();
        let r = match how {
            "step_down" => l.step_down(),
            "resign" => {
                let r = l.resign();
                drop(l);
                r
            }
            _ => {
                let r = l.renew();
                drop(l);
                r
            }
        };
        seen.push(format!(
            "{how}: is_lost() just before = {lost_locally}, result {r:?}"
        ));
        assert!(lost_locally, "harness: the term is not over locally");
        // Nobody leads afterwards either way.
        assert!(el.observe().unwrap().is_none());
    }
    println!("{}", seen.join("\n"));
    assert!(
        seen.iter().all(|s| s.contains("Err(Lost")),
        "an expired term is reported lost by renew but not by step_down/resign:\n{}",
        seen.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// 3. A forked child's copy of a Leadership.
// ---------------------------------------------------------------------------------------

const FORK_WAIT: &str = "a_forked_childs_copy_of_a_leadership_is_lost_for_wait_lost_too";

/// Leader-election.md: "A forked child's copy of a `Leadership` never led"; Pitfalls:
/// "the child's copy of a `Leadership` is not the leader there: `is_current` is `false`
/// and `renew` fails". `wait_lost` "blocks until the term is lost". A leader (lease
/// 500 ms) forks a worker without exec; the worker first asks `is_lost()`, then waits with
/// `wait_lost(300 ms)` (the usual "work until lost" guard), then asks `is_current()`, while
/// the parent leads and renews. A copy that is not the leader must not be told, for a
/// whole wait, that its term is not lost, and then at once that it is not current.
#[test]
fn a_forked_childs_copy_of_a_leadership_is_lost_for_wait_lost_too() {
    fn role_leader() {
        let lease = Duration::from_millis(500);
        let el = elector(
            &path_arg("path"),
            "forker",
            lease,
            Duration::from_millis(10),
        );
        let l = el
            .campaign(Duration::from_secs(5))
            .expect("campaign")
            .expect("elected");
        l.renew().unwrap();
        let done = path_arg("done");
        // SAFETY: the child (single-threaded copy) only makes election calls, writes a
        // file, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let lost_first = l.is_lost();
            let t = Instant::now();
            let waited = l.wait_lost(Duration::from_millis(300)).expect("wait_lost");
            let took = t.elapsed().as_millis();
            let current = l.is_current().unwrap_or(true);
            let renewed = l.renew().is_ok();
            report(format!(
                "CHILD is_lost={lost_first} wait_lost={waited} took_ms={took} \
                 is_current={current} renewed={renewed}"
            ));
            std::mem::forget(l);
            let _ = std::fs::write(&done, b"1");
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut renew_ok = true;
        while !done.exists() {
            renew_ok &= l.renew().is_ok();
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!(
            "PARENT renew_ok={renew_ok} current={}",
            l.is_current().unwrap_or(false)
        ));
    }
    play_role!(role_leader);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let mut kid = RoleCommand::new(FORK_WAIT, "leader")
        .arg("path", d.path().join("e"))
        .arg("done", d.path().join("done"))
        .spawn();
    let reports = kid.finish(CHILD_DEADLINE);
    let find = |p: &str| {
        reports
            .iter()
            .find(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("no {p} report: {reports:?}"))
            .clone()
    };
    let child = find("CHILD");
    let parent = find("PARENT");
    println!("{child}\n{parent}");
    assert!(
        flag(&parent, "renew_ok") && flag(&parent, "current"),
        "the parent lost its term: {parent}"
    );
    assert!(
        !flag(&child, "is_current") && !flag(&child, "renewed"),
        "the child's copy acts as the leader: {child}"
    );
    assert!(
        flag(&child, "wait_lost"),
        "the child's copy (not the leader: is_current false, renew fails) was told by \
         wait_lost that its term is not lost: {child}"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Resign racing a takeover.
// ---------------------------------------------------------------------------------------

const RACE: &str = "a_late_resignation_never_ends_the_successors_term";
const RACE_LEASE_MS: u64 = 60;

/// Two racers. Each, when elected: renews every 3 ms for 15–40 ms, goes idle until
/// its last renewal + lease + jitter (-6..+6 ms), then does one of `step_down`,
/// `resign`, `renew`, `is_current`, and drops the term (resigning if not lost). The other
/// campaigns with a 1 ms retry period meanwhile. Log lines (CLOCK_MONOTONIC ns):
/// `won TOK PID T`, `renew TOK PID S E`, `alost TOK PID S E LAST` (renew said Lost while
/// active), `act TOK PID WHAT OK S E LAST`.
fn racer() {
    let lease = ms_arg("lease_ms");
    let lease_ns = lease.as_nanos() as u64;
    let pid = std::process::id();
    let mut rng = Rng::derive(arg("seed").parse().unwrap(), 34, u64::from(pid), 4);
    let el = elector(
        &path_arg("path"),
        &arg("id"),
        lease,
        Duration::from_millis(1),
    );
    let log = Log::open(&path_arg("log"));
    let end = Instant::now() + ms_arg("run_ms");
    report("ready=1");
    while Instant::now() < end {
        let Some(l) = el.campaign(Duration::from_secs(5)).expect("campaign") else {
            continue;
        };
        let tok = l.token();
        log.line(format!("won {tok} {pid} {}\n", mono_ns()));
        let active = Duration::from_millis(rng.range(15, 40));
        let t0 = Instant::now();
        let mut last = 0u64;
        let mut alive = true;
        while t0.elapsed() < active {
            let s = mono_ns();
            let r = l.renew();
            let e = mono_ns();
            match r {
                Ok(()) => {
                    last = s;
                    log.line(format!("renew {tok} {pid} {s} {e}\n"));
                }
                Err(ElectionError::Lost { .. }) => {
                    log.line(format!("alost {tok} {pid} {s} {e} {last}\n"));
                    alive = false;
                    break;
                }
                Err(e) => panic!("renew: {e}"),
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        if !alive || last == 0 {
            continue;
        }
        let jitter = rng.range(0, 12_000_000) as i64 - 6_000_000;
        sleep_until_mono((last + lease_ns).saturating_add_signed(jitter));
        let what = ["step_down", "resign", "renew", "is_current"][rng.below(4) as usize];
        let s = mono_ns();
        let ok = match what {
            "step_down" => l.step_down().is_ok(),
            "resign" => l.resign().is_ok(),
            "renew" => l.renew().is_ok(),
            _ => l.is_current().expect("is_current"),
        };
        let e = mono_ns();
        log.line(format!("act {tok} {pid} {what} {ok} {s} {e} {last}\n"));
    }
}

/// "Every term has a token, strictly greater for every later term"; `resign`/`step_down`
/// "Ends `term` if it is current (a stale term never ends a newer one)"; `renew`:
/// "`Err(Lost)` once superseded"; `step_down`: "`Err(Lost)` if it was already over".
/// Two racers (module doc, item 4) for 12 s. Checked: tokens are unique; nothing of a
/// term succeeds once it started after the next term's campaign returned; a term is never
/// lost while its leader renews well within the lease (only a stale resignation could end
/// it). Printed, not judged here (see `stepping_down_from_an_expired_term_reports_lost`):
/// how often `step_down`/`resign` said `Ok` after the local deadline.
#[test]
fn a_late_resignation_never_ends_the_successors_term() {
    play_role!(role_racer);
    fn role_racer() {
        racer();
    }
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("e");
    let log = d.path().join("log");
    let lease = Duration::from_millis(RACE_LEASE_MS);
    drop(MmapElection::create_or_open(&path, lease).unwrap());
    let seed = Rng::for_test().seed();
    let mut racers: Vec<Proc> = ["a", "b"]
        .iter()
        .map(|id| {
            RoleCommand::new(RACE, "racer")
                .arg("path", &path)
                .arg("log", &log)
                .arg("id", id)
                .arg("seed", seed.to_string())
                .arg("lease_ms", RACE_LEASE_MS.to_string())
                .arg("run_ms", "12000")
                .spawn()
        })
        .collect();
    for r in &mut racers {
        assert_eq!(r.next_report(REPORT_WAIT), "ready=1");
    }
    for r in &mut racers {
        r.finish(CHILD_DEADLINE);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lease_ns = lease.as_nanos() as u64;
    let mut won: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut oks: Vec<(u64, String, u64)> = Vec::new();
    let mut acts: BTreeMap<String, usize> = BTreeMap::new();
    let mut late_ok = 0;
    for l in text.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        let tok: u64 = w[1].parse().unwrap();
        let pid: u32 = w[2].parse().unwrap();
        let n = |i: usize| -> u64 { w[i].parse().unwrap() };
        match w[0] {
            "won" => {
                if let Some((p, _)) = won.insert(tok, (pid, n(3))) {
                    problems.push(format!("token {tok} won by pids {p} and {pid}"));
                }
            }
            "renew" => oks.push((tok, "renew".into(), n(3))),
            "alost" => {
                let (s, last) = (n(3), n(5));
                if last != 0 && s < last + lease_ns - 3_000_000 {
                    problems.push(format!(
                        "term {tok} (pid {pid}) lost while renewing: renew started {:.2} ms \
                         after its last successful renewal (lease {lease:?})",
                        (s - last) as f64 / 1e6
                    ));
                }
            }
            "act" => {
                let (what, ok, s, last) = (w[3], w[4] == "true", n(5), n(7));
                *acts.entry(format!("{what}={ok}")).or_default() += 1;
                if ok {
                    oks.push((tok, what.to_owned(), s));
                    if (what == "step_down" || what == "resign") && s > last + lease_ns {
                        late_ok += 1;
                    }
                }
            }
            other => panic!("log line {l:?}: {other}"),
        }
    }
    for (tok, what, s) in &oks {
        if let Some((&next, &(p, w))) = won.range(tok + 1..).next()
            && *s > w
        {
            problems.push(format!(
                "term {tok}: {what} succeeded, started {:.2} ms after term {next} (pid {p}) \
                 was elected",
                (s - w) as f64 / 1e6
            ));
        }
    }
    println!(
        "{} terms; actions at the deadline: {acts:?}; step_down/resign Ok after the local \
         deadline: {late_ok}",
        won.len()
    );
    assert!(
        problems.is_empty(),
        "{} broken promises:\n{}",
        problems.len(),
        problems[..problems.len().min(20)].join("\n")
    );
    assert!(won.len() >= 40, "only {} terms", won.len());
}

// ---------------------------------------------------------------------------------------
// 5. Chaos judged by a storage process and an observer process.
// ---------------------------------------------------------------------------------------

const CHAOS: &str = "many_candidates_under_chaos_never_share_a_term_or_outlive_a_refusal";
const CHAOS_LEASE_MS: u64 = 150;

/// The storage: a datagram socket at `dir/storage.sock`. A write `TOK PID SEQ` is
/// accepted (`ok`) if `TOK` is at least the high-water mark, else refused (`no MARK`).
/// Flags a token written by two pids. On `finish`, reports its counts and problems.
fn storage() {
    let dir = path_arg("dir");
    let sock = UnixDatagram::bind(dir.join("storage.sock")).expect("bind storage");
    report("ready=1");
    let mut mark = 0u64;
    let mut owner: HashMap<u64, u32> = HashMap::new();
    let (mut accepted, mut refused) = (0u64, 0u64);
    let mut problems: Vec<String> = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let (n, from) = retry_eintr(|| sock.recv_from(&mut buf)).expect("recv");
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg == "finish" {
            break;
        }
        let w: Vec<u64> = msg.split(' ').map(|x| x.parse().unwrap()).collect();
        let (tok, pid) = (w[0], w[1] as u32);
        let reply = if tok >= mark {
            mark = tok;
            accepted += 1;
            if let Some(&p) = owner.get(&tok)
                && p != pid
            {
                problems.push(format!("token {tok} written by pids {p} and {pid}"));
            }
            owner.insert(tok, pid);
            "ok".to_owned()
        } else {
            refused += 1;
            format!("no {mark}")
        };
        if let Some(p) = from.as_pathname() {
            let _ = sock.send_to(reply.as_bytes(), p);
        }
    }
    report(format!(
        "accepted={accepted} refused={refused} terms={} problems={}",
        owner.len(),
        problems.len()
    ));
    for p in problems {
        report(format!("PROBLEM {p}"));
    }
}

/// The observer: `observe()` every 2 ms and every `NewLeader` event; neither may go back
/// to an older token, nor name two identities for one token. Writes `TOK IDENTITY` of
/// every leader it saw to `dir/seen` and reports at `dir/finish`.
fn observer() {
    let dir = path_arg("dir");
    let lease = ms_arg("lease_ms");
    let el = elector(
        &path_arg("path"),
        "observer",
        lease,
        Duration::from_millis(50),
    );
    let events = el.events();
    report("ready=1");
    let mut last = 0u64;
    let mut last_ev: Option<(u64, String)> = None;
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut problems: Vec<String> = Vec::new();
    let mut polls = 0u64;
    let finish = dir.join("finish");
    while !finish.exists() {
        polls += 1;
        if let Some(l) = el.observe().expect("observe") {
            if l.token < last {
                problems.push(format!("observe() went back from token {last} to {l:?}"));
            }
            last = last.max(l.token);
            if !l.identity.is_empty() {
                match names.get(&l.token) {
                    Some(n) if *n != l.identity => problems.push(format!(
                        "token {} named {n:?} and then {:?}",
                        l.token, l.identity
                    )),
                    _ => {
                        names.insert(l.token, l.identity.clone());
                    }
                }
            }
        }
        for ev in events.try_iter() {
            if let ElectionEvent::NewLeader { identity, token } = ev {
                if let Some((t, id)) = &last_ev
                    && (token < *t || (token == *t && !id.is_empty()))
                {
                    problems.push(format!(
                        "NewLeader {{{identity:?}, {token}}} after NewLeader {{{id:?}, {t}}}"
                    ));
                }
                last_ev = Some((token, identity));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen: String = names.iter().map(|(t, n)| format!("{t} {n}\n")).collect();
    std::fs::write(dir.join("seen"), seen).unwrap();
    report(format!(
        "polls={polls} leaders={} problems={}",
        names.len(),
        problems.len()
    ));
    for p in problems {
        report(format!("PROBLEM {p}"));
    }
}

/// A candidate: campaigns forever; while leading, every `period`: a write to the storage,
/// then a renewal. Log lines (CLOCK_MONOTONIC ns): `won TOK PID ID T`, `renew TOK PID S E`,
/// `refused TOK PID MARK T` (the storage refused: a newer term wrote), `lost TOK PID T`.
fn chaos_candidate() {
    let body = || {
        let dir = path_arg("dir");
        let lease = ms_arg("lease_ms");
        let period = ms_arg("period_ms");
        let id = arg("id");
        let pid = std::process::id();
        let el = elector(&path_arg("path"), &id, lease, Duration::from_millis(10));
        let me = dir.join(format!("c-{pid}.sock"));
        let _ = std::fs::remove_file(&me);
        let sock = UnixDatagram::bind(&me).expect("bind candidate");
        sock.connect(dir.join("storage.sock"))
            .expect("connect storage");
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let log = Log::open(&dir.join("log"));
        report("ready=1");
        let mut buf = [0u8; 64];
        loop {
            let l = el
                .campaign(Duration::from_secs(120))
                .expect("campaign")
                .expect("elected within 120 s");
            let tok = l.token();
            log.line(format!("won {tok} {pid} {id} {}\n", mono_ns()));
            for seq in 0u64.. {
                // A socket timeout makes a SIGSTOP/SIGCONT interrupt the call: retry.
                let msg = format!("{tok} {pid} {seq}");
                retry_eintr(|| sock.send(msg.as_bytes())).expect("send to storage");
                let n = retry_eintr(|| sock.recv(&mut buf)).expect("storage reply");
                let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
                if let Some(m) = reply.strip_prefix("no ") {
                    log.line(format!("refused {tok} {pid} {m} {}\n", mono_ns()));
                }
                let s = mono_ns();
                let r = l.renew();
                let e = mono_ns();
                match r {
                    Ok(()) => log.line(format!("renew {tok} {pid} {s} {e}\n")),
                    Err(ElectionError::Lost { .. }) => {
                        log.line(format!("lost {tok} {pid} {e}\n"));
                        break;
                    }
                    Err(e) => panic!("renew: {e}"),
                }
                std::thread::sleep(period);
            }
        }
    };
    if arg("kind") == "half" {
        std::thread::spawn(body);
        assert!(exit_main_thread(), "the main thread did not exit");
        sleep_forever();
    }
    body();
}

/// `f` again as long as it is interrupted by a signal (or a stop and continue).
fn retry_eintr<T>(mut f: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

struct Chaos {
    dir: tempfile::TempDir,
    next: usize,
    kids: Vec<(String, Proc)>,
    kills: Vec<(u32, u64)>,
}

impl Chaos {
    fn path(&self) -> PathBuf {
        self.dir.path().join("e")
    }
    fn spawn(&mut self) -> (String, Proc) {
        let kinds = ["plain", "half", "fallback"];
        let kind = kinds[self.next % kinds.len()];
        let id = format!("c{}-{kind}", self.next);
        self.next += 1;
        let mut cmd = RoleCommand::new(CHAOS, "candidate")
            .arg("path", self.path())
            .arg("dir", self.dir.path())
            .arg("id", &id)
            .arg("kind", kind)
            .arg("lease_ms", CHAOS_LEASE_MS.to_string())
            .arg("period_ms", "3");
        if kind == "fallback" {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut p = cmd.spawn();
        assert_eq!(p.next_report(REPORT_WAIT), "ready=1");
        (id, p)
    }
    fn leader(&self, observer: &MmapElection) -> Option<usize> {
        let l = observer.leader().unwrap()?;
        self.kids.iter().position(|(id, _)| *id == l.identity)
    }
    fn kill(&mut self, i: usize) {
        let pid = self.kids[i].1.pid();
        self.kills.push((pid, mono_ns()));
        self.kids[i].1.kill();
        let k = self.spawn();
        self.kids[i] = k;
    }
    fn stop_for(&self, i: usize, d: Duration) {
        let p = &self.kids[i].1;
        p.stop();
        std::thread::sleep(d);
        p.cont();
    }
}

/// Module doc, item 5. Promises: "Every term has a token, strictly greater for every later
/// term"; "Two processes must never share a term"; `renew`: "`Err(Lost)` once superseded"
/// (a storage refusal proves a newer term was elected, so the refused leader's next
/// `renew` must fail); `observe()`: "the current leader" (never an older term than one
/// already seen; the identity is the winner's); `NewLeader`: "A leader was observed that
/// differs from the last one observed". Ten candidates (lease 150 ms, writing and renewing
/// every 3 ms) for 12 s under seeded chaos: SIGSTOP of the leader for 0.3–2 leases or of
/// anyone, SIGKILL of the leader or anyone (replaced by a fresh candidate).
#[test]
fn many_candidates_under_chaos_never_share_a_term_or_outlive_a_refusal() {
    fn role_candidate() {
        chaos_candidate();
    }
    fn role_storage() {
        storage();
    }
    fn role_observer() {
        observer();
    }
    play_role!(role_candidate, role_storage, role_observer);
    let _s = serial();
    let mut c = Chaos {
        dir: tempfile::tempdir().unwrap(),
        next: 0,
        kids: Vec::new(),
        kills: Vec::new(),
    };
    let lease = Duration::from_millis(CHAOS_LEASE_MS);
    drop(MmapElection::create_or_open(c.path(), lease).unwrap());
    let mut store = RoleCommand::new(CHAOS, "storage")
        .arg("dir", c.dir.path())
        .spawn();
    assert_eq!(store.next_report(REPORT_WAIT), "ready=1");
    let mut obs = RoleCommand::new(CHAOS, "observer")
        .arg("dir", c.dir.path())
        .arg("path", c.path())
        .arg("lease_ms", CHAOS_LEASE_MS.to_string())
        .spawn();
    assert_eq!(obs.next_report(REPORT_WAIT), "ready=1");
    for _ in 0..10 {
        let k = c.spawn();
        c.kids.push(k);
    }
    let watcher = MmapElection::create_or_open(c.path(), lease).unwrap();
    let mut rng = Rng::for_test();
    let end = Instant::now() + Duration::from_secs(12);
    let (mut stops, mut kills) = (0, 0);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.range(10, 100)));
        let leader = c.leader(&watcher);
        let n = c.kids.len() as u64;
        match rng.below(10) {
            0..=3 => {
                if let Some(i) = leader {
                    let ms = rng.range(CHAOS_LEASE_MS * 3 / 10, CHAOS_LEASE_MS * 2);
                    c.stop_for(i, Duration::from_millis(ms));
                    stops += 1;
                }
            }
            4 => {
                let i = rng.below(n) as usize;
                c.stop_for(i, Duration::from_millis(rng.range(10, 2 * CHAOS_LEASE_MS)));
                stops += 1;
            }
            5 => {
                if let Some(i) = leader {
                    c.kill(i);
                    kills += 1;
                }
            }
            6 => {
                c.kill(rng.below(n) as usize);
                kills += 1;
            }
            _ => {}
        }
    }
    eprintln!("chaos: {stops} stops, {kills} kills");
    std::thread::sleep(lease * 2);
    for (id, p) in &mut c.kids {
        if let Some(st) = p.try_wait() {
            panic!("candidate {id} exited on its own ({st}):\n{}", p.stderr());
        }
        p.kill();
    }
    std::fs::write(c.dir.path().join("finish"), b"1").unwrap();
    let obs_reports = obs.finish(CHILD_DEADLINE);
    let end_sock = UnixDatagram::unbound().unwrap();
    end_sock
        .send_to(b"finish", c.dir.path().join("storage.sock"))
        .unwrap();
    let store_reports = store.finish(CHILD_DEADLINE);
    println!("storage: {store_reports:?}\nobserver: {obs_reports:?}");
    let mut problems: Vec<String> = store_reports
        .iter()
        .chain(&obs_reports)
        .filter(|r| r.starts_with("PROBLEM"))
        .cloned()
        .collect();
    // The candidates' log.
    let text = std::fs::read_to_string(c.dir.path().join("log")).unwrap();
    let mut won: BTreeMap<u64, (u32, String, u64)> = BTreeMap::new();
    let mut renews: Vec<(u64, u32, u64)> = Vec::new();
    let mut refusals: Vec<(u64, u32, u64)> = Vec::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        let tok: u64 = w[1].parse().unwrap();
        let pid: u32 = w[2].parse().unwrap();
        match w[0] {
            "won" => {
                if let Some((p, ..)) =
                    won.insert(tok, (pid, w[3].to_owned(), w[4].parse().unwrap()))
                {
                    problems.push(format!("token {tok} won by pids {p} and {pid}"));
                }
            }
            "renew" => renews.push((tok, pid, w[3].parse().unwrap())),
            "refused" => refusals.push((tok, pid, w[4].parse().unwrap())),
            "lost" => {}
            other => panic!("log line {l:?}: {other}"),
        }
    }
    // A renewal that started after the storage refused that term (same process).
    for &(tok, pid, t) in &refusals {
        if let Some(&(_, _, s)) = renews
            .iter()
            .find(|&&(k, p, s)| k == tok && p == pid && s > t)
        {
            problems.push(format!(
                "term {tok} (pid {pid}): renew succeeded {:.2} ms after the storage refused \
                 its write (a newer term had written)",
                (s - t) as f64 / 1e6
            ));
        }
    }
    // A renewal that started after the next term's campaign returned.
    for &(tok, pid, s) in &renews {
        if let Some((&next, &(p, _, w))) = won.range(tok + 1..).next()
            && s > w
        {
            problems.push(format!(
                "term {tok} (pid {pid}): renew succeeded {:.2} ms after term {next} (pid {p}) \
                 was elected",
                (s - w) as f64 / 1e6
            ));
        }
    }
    // The observer's names match the winners'.
    let seen = std::fs::read_to_string(c.dir.path().join("seen")).unwrap();
    for l in seen.lines() {
        let (tok, name) = l.split_once(' ').unwrap();
        let tok: u64 = tok.parse().unwrap();
        if let Some((_, id, _)) = won.get(&tok)
            && id != name
        {
            problems.push(format!(
                "observer named {name:?} for token {tok}, won by {id:?}"
            ));
        }
    }
    let accepted = num(
        store_reports
            .iter()
            .find(|r| r.starts_with("accepted="))
            .unwrap(),
        "accepted",
    );
    let refused = fields(
        store_reports
            .iter()
            .find(|r| r.starts_with("accepted="))
            .unwrap(),
    )["refused"]
        .to_owned();
    eprintln!(
        "{} terms, {} renewals, {accepted} accepted and {refused} refused writes, {} \
         refusals seen by leaders, {} kills",
        won.len(),
        renews.len(),
        refusals.len(),
        c.kills.len()
    );
    assert!(
        problems.is_empty(),
        "{} broken promises:\n{}",
        problems.len(),
        problems[..problems.len().min(20)].join("\n")
    );
    assert!(won.len() >= 8, "only {} terms", won.len());
    assert!(accepted > 200, "the run did too little to judge");
}

// ---------------------------------------------------------------------------------------
// 6. The StoppedLeading event of a leader whose work loop is stuck.
// ---------------------------------------------------------------------------------------

const STUCK: &str = "a_stuck_leader_is_told_stopped_leading_once_a_standby_leads";

/// Leader-election.md: "A leader whose work is stuck loses leadership even though its
/// process lives"; `ElectionEvent::StoppedLeading`: sent when a call of the elector finds
/// the term over, so a leader whose work loop may hang keeps a thread in `wait_lost`,
/// which returns at the local deadline (Pitfalls). A leader (lease 200 ms, progress
/// renewal) has a watcher thread on its event channel, as client-go users have
/// `OnStoppedLeading` to stop the work, and a thread blocked in `wait_lost`; its work loop
/// renews a few times and then hangs. A standby in the test process is elected after the
/// lease. The watcher must then get `StoppedLeading` (within 3 s). Before the docs were
/// corrected they promised the event without any call (the analogue of client-go's
/// `OnStoppedLeading`): with the event watcher alone, no event came.
#[test]
fn a_stuck_leader_is_told_stopped_leading_once_a_standby_leads() {
    fn role_leader() {
        let lease = Duration::from_millis(200);
        let dir = path_arg("dir");
        let el = elector(&dir.join("e"), "stuck", lease, Duration::from_millis(10));
        let events = el.events();
        let l = el
            .campaign(Duration::from_secs(5))
            .expect("campaign")
            .expect("elected");
        let token = l.token();
        let ev_file = dir.join("event");
        std::thread::spawn(move || {
            for ev in events {
                if ev == (ElectionEvent::StoppedLeading { token }) {
                    std::fs::write(&ev_file, mono_ns().to_string()).unwrap();
                }
            }
        });
        let l: &'static _ = Box::leak(Box::new(l));
        let wl_file = dir.join("wait_lost");
        if flag(&format!("w={}", arg("wait_lost")), "w") {
            std::thread::spawn(move || {
                if l.wait_lost(Duration::from_secs(60)).expect("wait_lost") {
                    std::fs::write(&wl_file, mono_ns().to_string()).unwrap();
                }
            });
        }
        for _ in 0..5 {
            l.renew().expect("renew");
            std::thread::sleep(Duration::from_millis(10));
        }
        report(format!("stuck token={token} t={}", mono_ns()));
        // The work loop hangs (waits on something that never comes).
        sleep_forever();
    }
    play_role!(role_leader);
    let _s = serial();
    let lease = Duration::from_millis(200);
    let mut outcome = Vec::new();
    {
        let with_wait_lost = true;
        let d = tempfile::tempdir().unwrap();
        drop(MmapElection::create_or_open(d.path().join("e"), lease).unwrap());
        let mut leader = RoleCommand::new(STUCK, "leader")
            .arg("dir", d.path())
            .arg("wait_lost", with_wait_lost.to_string())
            .spawn();
        let token = num(&leader.next_report(REPORT_WAIT), "token");
        let standby = elector(
            &d.path().join("e"),
            "standby",
            lease,
            Duration::from_millis(10),
        );
        let l = standby
            .campaign(Duration::from_secs(10))
            .unwrap()
            .expect("the standby was not elected after the stuck leader's lease");
        let elected = mono_ns();
        assert!(l.token() > token);
        let event = wait_until(Duration::from_secs(3), || d.path().join("event").exists());
        let got = |f: &str| {
            std::fs::read_to_string(d.path().join(f))
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .map(|t| format!("{:.1} ms", (t as f64 - elected as f64) / 1e6))
        };
        leader.kill();
        outcome.push(format!(
            "with a wait_lost thread: {with_wait_lost}: StoppedLeading {{ token: {token} }} \
             at {:?} after the standby's election (wait_lost returned at {:?})",
            got("event"),
            got("wait_lost")
        ));
        assert!(
            !with_wait_lost || got("wait_lost").is_some(),
            "harness: wait_lost did not see the loss"
        );
        if !event {
            outcome.push("  -> no StoppedLeading within 3 s".into());
        }
    }
    println!("{}", outcome.join("\n"));
    assert!(
        !outcome.iter().any(|o| o.contains("-> no")),
        "a stuck leader's event watcher was not told it stopped leading:\n{}",
        outcome.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// 7. observe() of a leader whose main thread exited.
// ---------------------------------------------------------------------------------------

const HALF: &str = "observe_names_a_leader_whose_main_thread_exited";

/// `observe()`: "the current leader; `None` when nobody leads, also once the last
/// leader's lease ran out or its process is gone"; owner-lease.md: "A process whose main
/// thread exited while other threads run ... is **alive**". A leader's main thread exits
/// while its worker thread renews every 20 ms (pidfs and fallback identity paths): for a
/// second, every `observe()` (every 5 ms) must name it; once it is SIGKILLed, `None`.
#[test]
fn observe_names_a_leader_whose_main_thread_exited() {
    fn role_leader() {
        let path = path_arg("path");
        std::thread::spawn(move || {
            let el = elector(
                &path,
                "half",
                Duration::from_millis(200),
                Duration::from_millis(10),
            );
            let l = el
                .campaign(Duration::from_secs(5))
                .expect("campaign")
                .expect("elected");
            loop {
                if l.renew().is_err() {
                    report("lost=1");
                    sleep_forever();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        assert!(exit_main_thread(), "the main thread did not exit");
        report("half=1");
        sleep_forever();
    }
    play_role!(role_leader);
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("e");
        let lease = Duration::from_millis(200);
        let obs = elector(&path, "observer", lease, Duration::from_millis(10));
        let mut cmd = RoleCommand::new(HALF, "leader").arg("path", &path);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        assert_eq!(kid.next_report(REPORT_WAIT), "half=1");
        assert!(wait_until(Duration::from_secs(5), || obs
            .observe()
            .unwrap()
            .is_some_and(|l| l.identity == "half")));
        let t = Instant::now();
        let mut misses = Vec::new();
        while t.elapsed() < Duration::from_secs(1) {
            let seen = obs.observe().unwrap();
            if seen.as_ref().is_none_or(|l| l.identity != "half") {
                misses.push(format!("{:?}: {seen:?}", t.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        kid.kill();
        let gone = wait_until(Duration::from_millis(100), || {
            obs.observe().unwrap().is_none()
        });
        assert!(
            misses.is_empty(),
            "fallback={fallback}: observe() did not name the live leader (main thread \
             exited): {misses:?}"
        );
        assert!(
            gone,
            "fallback={fallback}: the killed leader is still named"
        );
    }
}

//! Round 24 of attacks on the read-only views of the sidecar blocks (docs/cli.md
//! `inspect`/`watch`, docs/sidecar.md): Prometheus series of distinct files whose paths
//! are not UTF-8, `inspect`/`watch` of a ring that several processes record into while
//! some are SIGKILLed and SIGSTOPped and another publishes strategies, and a blocked
//! `acquire_many` under a spin strategy a sidecar may publish.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cxc::sidecar::AdaptiveInstance;
use cxc_testkit::{Proc, RoleCommand, mix, mono_ns, path_arg, play_role, report};

mod common;
use common::{cxc, p};

/// CPU time (user + system, all threads) of process `pid` so far, from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// `cxc ARGS`, killed if it runs past `t`: (exit code, stdout, stderr).
fn run_bounded(args: &[&str], paths: &[&Path], t: Duration) -> (Option<i32>, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cxc"));
    c.args(args).args(paths);
    let o = Proc::spawn(c, "cxc").output(t);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The series (name and label set) of every sample line of an exposition-format text.
fn series(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
        .collect()
}

/// Two different files whose names differ only in a non-UTF-8 byte (`x\xff`, `x\xfe`:
/// any shell can make them). docs/cli.md: "`--format prometheus` prints the exposition
/// format: gauges ..., `*_info`/per-holder series labelled with `pid` and `state`, and
/// counters" — one set of series per file, labelled with its path. In the exposition
/// format a series (metric name and label set) appears once per scrape; a scrape with two
/// samples of one series is rejected (Prometheus: "duplicate sample for timestamp"), and
/// the two files cannot be told apart.
// Found (fixed since): both paths were shown as `x\u{fffd}` (lossy), so every series of the two files is printed twice with identical labels.
#[test]
fn prometheus_series_stay_unique_for_distinct_non_utf8_paths() {
    use std::os::unix::ffi::OsStrExt;
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join(std::ffi::OsStr::from_bytes(b"x\xff"));
    let b = d.path().join(std::ffi::OsStr::from_bytes(b"x\xfe"));
    for f in [&a, &b] {
        let o = cxc(&["create", "sem", "--permits", "2"])
            .arg(f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    }
    let (code, out, err) = run_bounded(
        &["inspect", "--format", "prometheus"],
        &[&a, &b],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{err}");
    let all = series(&out);
    let mut seen = HashSet::new();
    let dups: Vec<&String> = all.iter().filter(|s| !seen.insert(*s)).collect();
    assert!(
        dups.is_empty(),
        "{} of {} series printed twice for two distinct files, e.g. {:?}",
        dups.len(),
        all.len(),
        dups.iter().take(2).collect::<Vec<_>>()
    );
}

/// The op code the producers below record (a known one, so `inspect` names it).
const OP: cxc::OpCode = cxc::OpCode::SemOverflowRejected;

/// The producers' own check word of an entry: every field but the ticket.
fn check_of(pid: u32, ts: u64, flags: u16) -> u64 {
    mix(u64::from(pid) ^ ts.rotate_left(17) ^ u64::from(flags) << 48)
}

/// A producer: records verifiable entries into the semaphore's ring as fast as it can,
/// and now and then contends for the semaphore's one permit (bumping its counters).
fn role_ring_producer() {
    let sem = cxc::SharedSemaphore::open(path_arg("path")).unwrap();
    let ring = sem.ring();
    let pid = std::process::id();
    report("ready=1");
    let mut i = 0u64;
    loop {
        let ts = mono_ns();
        let flags = (i & 0xFFFF) as u16;
        ring.record_with(pid, ts, OP.code(), flags, check_of(pid, ts, flags));
        if i.is_multiple_of(256) {
            drop(sem.acquire_timeout(Duration::from_micros(50)));
        }
        i += 1;
    }
}

/// One decoded report: (tickets → entry), counters, strategy generation.
struct Report {
    entries: BTreeMap<u64, (u64, u32, u16, u64)>,
    counters: BTreeMap<String, u64>,
    generation: u64,
}

/// Checks one `--json` report of the semaphore against what the producers can have
/// written; `pids`: every producer's pid.
fn check_json(line: &str, pids: &HashSet<u32>, now: u64) -> Report {
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let recent = v["recent"].as_array().expect("recent is an array");
    assert!(
        recent.len() <= 64,
        "{} recent entries: {line}",
        recent.len()
    );
    let mut entries = BTreeMap::new();
    let mut last: Option<u64> = None;
    for o in recent {
        let t = o["ticket"].as_u64().unwrap();
        let ts = o["timestamp_ns"].as_u64().unwrap();
        let pid = o["pid"].as_u64().unwrap() as u32;
        let flags = o["flags"].as_u64().unwrap() as u16;
        let arg = o["arg"].as_u64().unwrap();
        assert_eq!(o["op"], OP.name(), "an entry no producer wrote: {o}");
        assert!(pids.contains(&pid), "an entry of pid {pid}: {o}");
        assert_eq!(arg, check_of(pid, ts, flags), "a torn entry shown: {o}");
        assert!(ts <= now, "an entry from the future: {o}");
        if let Some(l) = last {
            assert!(l < t, "tickets out of order: {l} then {t}");
        }
        last = Some(t);
        entries.insert(t, (ts, pid, flags, arg));
    }
    if let (Some((first, _)), Some(l)) = (entries.first_key_value(), last) {
        assert!(l - first < 64, "entries span more than a lap: {first}..{l}");
    }
    let counters = v["state"]["counters"]
        .as_object()
        .expect("counters")
        .iter()
        .map(|(k, c)| (k.clone(), c.as_u64().expect("a counter is a number")))
        .collect();
    let st = v["strategy"].as_str().expect("strategy is a string");
    assert!(
        st == "Default" || st == "Park" || st.starts_with("Spin { budget_ns: "),
        "strategy {st:?}"
    );
    Report {
        entries,
        counters,
        generation: v["strategy_generation"].as_u64().expect("generation"),
    }
}

/// Folds `r` into what earlier reports showed: a ticket always shows the same entry;
/// counters and the strategy generation never go back.
fn fold(
    r: &Report,
    tickets: &mut HashMap<u64, (u64, u32, u16, u64)>,
    prev: &mut Option<(BTreeMap<String, u64>, u64)>,
) {
    for (t, e) in &r.entries {
        if let Some(old) = tickets.insert(*t, *e) {
            assert_eq!(old, *e, "ticket {t} shown with two contents");
        }
    }
    if let Some((counters, generation)) = prev {
        for (k, c) in counters.iter() {
            let now = r.counters.get(k).copied();
            assert!(
                now.is_some_and(|n| n >= *c),
                "counter {k} went from {c} to {now:?}"
            );
        }
        assert!(
            r.generation >= *generation,
            "strategy generation went from {generation} to {}",
            r.generation
        );
    }
    *prev = Some((r.counters.clone(), r.generation));
}

/// Four processes record into a semaphore file's ring at full speed (docs/sidecar.md:
/// "any number of threads in any number of processes record at once"), one is SIGKILLed
/// and one SIGSTOPped while doing so, and this process publishes a new strategy every
/// millisecond. Meanwhile `cxc inspect --json`, `cxc inspect --format prometheus` and
/// `cxc watch --format json` read the file. Docs: "a reader validates every entry ... and
/// never returns a torn one"; `inspect` shows "the last observations from `snapshot()`"
/// ("up to 64 intact entries, oldest first"); the in-file counters are "cumulative";
/// `publish` "bumps the generation only when the strategy actually changes"; a file being
/// written gives exit 0 (or 2), "never a crash". Every report must be valid, show only
/// entries the producers wrote, in ticket order within one lap, the same entry for a ticket
/// in every report, and counters and generation that never go back.
#[test]
fn inspect_and_watch_of_a_ring_under_killed_and_stopped_producers_stay_consistent() {
    play_role!(role_ring_producer);
    let _serial = cxc_testkit::serial();
    const TEST: &str =
        "inspect_and_watch_of_a_ring_under_killed_and_stopped_producers_stay_consistent";
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("ring.sem");
    let sem = Arc::new(cxc::SharedSemaphore::create(&path, 1, 1).unwrap());
    let mut kids: Vec<Proc> = (0..4)
        .map(|_| {
            RoleCommand::new(TEST, "ring_producer")
                .arg("path", &path)
                .spawn()
        })
        .collect();
    for k in &mut kids {
        let r = k.next_report(Duration::from_secs(20));
        assert_eq!(r, "ready=1");
    }
    let pids: HashSet<u32> = kids.iter().map(Proc::pid).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (sem, stop) = (sem.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let s = match i % 3 {
                    0 => cxc::Strategy::Park,
                    1 => cxc::Strategy::Spin {
                        budget_ns: 1000 + i % 4000,
                    },
                    _ => cxc::Strategy::Default,
                };
                sem.handshake().publish(s);
                i += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let mut watch = Proc::spawn(
        {
            let mut c = Command::new(env!("CARGO_BIN_EXE_cxc"));
            c.args(["watch", p(&path), "--format", "json", "--interval", "100ms"]);
            c
        },
        "cxc watch",
    );
    let mut tickets = HashMap::new();
    let mut prev = None;
    let mut shown = 0usize;
    let mut runs = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        match runs {
            10 => kids[0].stop(),
            12 => kids[1].kill_unreaped(),
            30 => kids[0].cont(),
            _ => {}
        }
        runs += 1;
        let (code, out, err) =
            run_bounded(&["inspect", "--json"], &[&path], Duration::from_secs(10));
        assert_eq!(code, Some(0), "inspect: {err}");
        let r = check_json(out.trim(), &pids, mono_ns());
        shown += r.entries.len();
        fold(&r, &mut tickets, &mut prev);
        let (code, out, err) = run_bounded(
            &["inspect", "--format", "prometheus"],
            &[&path],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(0), "inspect prometheus: {err}");
        prometheus_parse::Scrape::parse(out.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("{e}: {out}"));
        let all = series(&out);
        assert_eq!(all.len(), all.iter().collect::<HashSet<_>>().len(), "{out}");
    }
    assert!(
        watch.try_wait().is_none(),
        "watch ended: {}",
        watch.stderr()
    );
    kids[0].cont();
    stop.store(true, Ordering::Relaxed);
    publisher.join().unwrap();
    watch.kill();
    std::thread::sleep(Duration::from_millis(200));
    let out = watch.stdout();
    let mut prev = None;
    let mut lines = 0;
    // Whole lines only: the last one may have been cut by the kill.
    for l in out
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n') && !l.trim().is_empty())
    {
        let r = check_json(l, &pids, mono_ns());
        shown += r.entries.len();
        fold(&r, &mut tickets, &mut prev);
        lines += 1;
    }
    for k in &mut kids {
        k.kill();
    }
    assert!(lines >= 5, "watch printed {lines} reports: {out}");
    assert!(
        runs >= 5 && shown > 64,
        "{runs} runs showed {shown} entries"
    );
}

/// A child that takes both permits of a 2-permit semaphore in one call.
fn role_many_waiter() {
    let sem = cxc::SharedSemaphore::open(path_arg("path")).unwrap();
    report("waiting=1");
    let got = sem.acquire_many(2).is_some();
    report(format_args!("got={got}"));
}

/// docs/sidecar.md: `Spin` is a strategy a sidecar may publish ("parameter = spin budget
/// in ns, at most 2^24 − 1 ≈ 16.7 ms"), and "A blocking call spins once. A caller that
/// blocks in slices does not spin again on each". A process blocked in
/// `SharedSemaphore::acquire_many(2)` (docs/api.md: it "never waits holding part of the"
/// permits) while another holds both, under the largest spin budget, must spin at most
/// about one budget, not burn a CPU for as long as it waits.
// Found (fixed since): acquire_many waited in 2 ms slices of acquire_timeout, each of which spun the whole budget first (ignoring its 2 ms deadline): the waiter burns a full core (~1 s CPU per 1 s waited).
#[test]
fn blocked_acquire_many_does_not_spin_on_every_slice_under_a_spin_strategy() {
    play_role!(role_many_waiter);
    let _serial = cxc_testkit::serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("many.sem");
    let sem = cxc::SharedSemaphore::create(&path, 2, 2).unwrap();
    sem.handshake().publish(cxc::Strategy::Spin {
        budget_ns: cxc::Strategy::MAX_PARAM,
    });
    let held = sem.acquire_many(2).expect("both permits");
    let mut kid = RoleCommand::new(
        "blocked_acquire_many_does_not_spin_on_every_slice_under_a_spin_strategy",
        "many_waiter",
    )
    .arg("path", &path)
    .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(20)), "waiting=1");
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_time(kid.pid());
    let window = Duration::from_secs(1);
    std::thread::sleep(window);
    let used = cpu_time(kid.pid()).saturating_sub(before);
    assert!(kid.try_wait().is_none(), "the waiter ended while blocked");
    drop(held);
    let r = kid.finish(Duration::from_secs(20));
    assert_eq!(r, vec!["got=true".to_string()]);
    assert!(
        used < Duration::from_millis(250),
        "a blocked acquire_many used {used:?} of CPU in {window:?} under Spin(2^24-1 ns)"
    );
}

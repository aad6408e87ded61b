//! Thirty-second round of attacks on the `cxc` command (docs/cli.md): what a run's command
//! is told, above all `CXC_FENCING_TOKEN` ("strictly increasing, pass it to storage that
//! rejects stale writers"; `elect`: "strictly greater for every later term").
//!
//! 1. `lease run`: a queue of concurrent runs; the tokens in the order the commands
//!    started (an `O_APPEND` log: each start is one `write`) strictly increase, and the
//!    token a command sees is the generation `cxc inspect` shows while it runs.
//! 2. `lease run --kill-after`: a holder whose keeper is stopped is taken over; the
//!    taker's token is greater than the replaced command's, the replaced command wrote
//!    nothing after the taker started, and the resumed keeper exits 75.
//! 3. `lease run`: a killed wrapper and a killed keeper; the next run's token is greater.
//! 4. `lease run` nested in `lease run`: the inner command sees the inner lease's token
//!    and path, the outer command the outer's.
//! 5. `rwlock run -x`: tokens across exclusive runs interleaved with shared runs, and
//!    after an eviction of a stopped keeper (the evicted run exits 75).
//! 6. `elect`: two candidates alternating (commands that end on their own), then a
//!    stopped leader's keeper replaced after `--lease-duration`: every later term's
//!    command sees a greater token.
//!
//! Two more cases found that the docs promised tokens "strictly increasing" without
//! saying they count the claims of one file: a lease file removed and made again (as
//! `/run`, the docs' example directory, is emptied at every boot) starts again at 1, and a
//! run on a file removed while a run holds it starts beside it with a smaller token (as
//! flock(1) would overlap). docs/cli.md now says so; no test keeps those cases.
//!
//! The judge is the log: every command appends `KIND TOKEN` lines with `>>` (`O_APPEND`,
//! one `write` each), so the file's order is the order the writes happened.

use std::path::Path;
use std::time::Duration;

use cxc_testkit::wait_until;
use rustix::process::Signal;

mod common;
use common::{Job, alive, cxc, p};

/// `(kind, token)` lines of the log (lines of another shape are skipped).
fn tokens(log: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// The token of the first line of `kind`, waiting up to `t` for it.
fn token_of(log: &Path, kind: &str, t: Duration) -> Option<u64> {
    let mut found = None;
    wait_until(t, || {
        found = tokens(log).iter().find(|(k, _)| k == kind).map(|e| e.1);
        found.is_some()
    });
    found
}

fn assert_strictly_increasing(seq: &[u64], what: &str) {
    for w in seq.windows(2) {
        assert!(
            w[0] < w[1],
            "{what}: tokens not strictly increasing: {seq:?}"
        );
    }
}

const LONG: Duration = Duration::from_secs(30);

#[test]
fn queued_lease_runs_see_strictly_increasing_tokens_equal_to_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let lease = dir.path().join("q.lease");
    let log = dir.path().join("log");
    let script = format!(
        "echo \"S $CXC_FENCING_TOKEN\" >> {log}; \
         g=$({cxc} inspect --json {lease} | tr -d ' \\n' | sed 's/.*\"generation\":\\([0-9]*\\).*/\\1/'); \
         echo \"G $g\" >> {log}; echo \"C $CXC_FENCING_TOKEN\" >> {log}; sleep 0.02",
        log = p(&log),
        lease = p(&lease),
        cxc = env!("CARGO_BIN_EXE_cxc"),
    );
    let mut jobs: Vec<Job> = (0..6)
        .map(|_| Job::start(&["lease", "run", p(&lease), "-c", &script]))
        .collect();
    for j in &mut jobs {
        assert_eq!(j.wait(LONG), Some(0), "a queued run failed");
    }
    let lines = tokens(&log);
    assert_eq!(lines.len(), 18, "log: {lines:?}");
    // Exclusive: each command's three lines are adjacent, the generation read while it
    // ran is its own token.
    for chunk in lines.chunks(3) {
        let kinds: Vec<&str> = chunk.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(kinds, ["S", "G", "C"], "interleaved runs: {lines:?}");
        assert_eq!(
            chunk[0].1, chunk[1].1,
            "token != inspect's generation: {lines:?}"
        );
        assert_eq!(chunk[0].1, chunk[2].1, "{lines:?}");
    }
    let seq: Vec<u64> = lines.iter().step_by(3).map(|e| e.1).collect();
    assert_strictly_increasing(&seq, "queued lease runs");
}

#[test]
fn a_kill_after_taker_gets_a_greater_token_than_the_stopped_holder() {
    let dir = tempfile::tempdir().unwrap();
    let lease = dir.path().join("k.lease");
    let log = dir.path().join("log");
    // The holder writes its token every 10 ms while it lives.
    let holder_cmd = format!(
        "while :; do echo \"H $CXC_FENCING_TOKEN\" >> {}; sleep 0.01; done",
        p(&log)
    );
    let mut holder = Job::start(&[
        "lease",
        "run",
        p(&lease),
        "--kill-after",
        "300ms",
        "-c",
        &holder_cmd,
    ]);
    let h = token_of(&log, "H", LONG).expect("holder never ran");
    let keeper = holder.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let taker_cmd = format!("echo \"T $CXC_FENCING_TOKEN\" >> {}", p(&log));
    let mut taker = Job::start(&[
        "lease",
        "run",
        p(&lease),
        "--kill-after",
        "300ms",
        "-c",
        &taker_cmd,
    ]);
    let code = taker.wait(LONG);
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    assert_eq!(code, Some(0), "the taker did not run");
    let lines = tokens(&log);
    let t_at = lines.iter().position(|e| e.0 == "T").unwrap();
    let t = lines[t_at].1;
    assert!(t > h, "taker's token {t} not above the holder's {h}");
    assert!(
        lines[t_at..].iter().all(|e| e.0 != "H"),
        "the replaced holder wrote after the taker started: {lines:?}"
    );
    assert_eq!(
        holder.wait(LONG),
        Some(75),
        "the superseded holder's exit code"
    );
}

#[test]
fn a_run_after_a_killed_wrapper_or_keeper_gets_a_greater_token() {
    let dir = tempfile::tempdir().unwrap();
    let lease = dir.path().join("d.lease");
    let log = dir.path().join("log");
    let mut seen = Vec::new();
    for (round, kill_keeper) in [(0, false), (1, true)] {
        let kind = format!("R{round}");
        let cmd = format!(
            "echo \"{kind} $CXC_FENCING_TOKEN\" >> {}; exec sleep 30",
            p(&log)
        );
        let mut job = Job::start(&["lease", "run", p(&lease), "-c", &cmd]);
        seen.push(token_of(&log, &kind, LONG).expect("run never started"));
        let keeper = job.keeper();
        if kill_keeper {
            rustix::process::kill_process(keeper, Signal::KILL).unwrap();
        } else {
            job.signal(Signal::KILL);
        }
        let _ = job.wait(LONG);
        if !kill_keeper {
            let k = keeper.as_raw_pid().unsigned_abs();
            assert!(
                wait_until(LONG, || !alive(k)),
                "the keeper of a killed wrapper did not end"
            );
        }
    }
    let cmd = format!("echo \"N $CXC_FENCING_TOKEN\" >> {}", p(&log));
    let mut next = Job::start(&["lease", "run", p(&lease), "-c", &cmd]);
    assert_eq!(next.wait(LONG), Some(0));
    seen.push(token_of(&log, "N", LONG).unwrap());
    assert_strictly_increasing(&seen, "runs after killed wrappers and keepers");
}

#[test]
fn a_nested_lease_run_tells_each_command_its_own_token() {
    let dir = tempfile::tempdir().unwrap();
    let outer = dir.path().join("outer.lease");
    let inner = dir.path().join("inner.lease");
    let log = dir.path().join("log");
    // Give the two files different generations.
    for _ in 0..3 {
        assert!(
            cxc(&["lease", "run", p(&inner), "--", "true"])
                .status()
                .unwrap()
                .success()
        );
    }
    let inner_cmd = format!(
        "echo \"I $CXC_FENCING_TOKEN\" >> {log}; echo \"IP 0 $CXC_LEASE_PATH\" >> {log}",
        log = p(&log)
    );
    let outer_cmd = format!(
        "echo \"O $CXC_FENCING_TOKEN\" >> {log}; {cxc} lease run {inner} -c '{inner_cmd}'; \
         echo \"O2 $CXC_FENCING_TOKEN\" >> {log}",
        log = p(&log),
        cxc = env!("CARGO_BIN_EXE_cxc"),
        inner = p(&inner),
    );
    let mut job = Job::start(&["lease", "run", p(&outer), "-c", &outer_cmd]);
    assert_eq!(job.wait(LONG), Some(0));
    let get = |k: &str| token_of(&log, k, Duration::ZERO);
    assert_eq!(get("O"), Some(1), "outer command's token");
    assert_eq!(get("O2"), Some(1), "outer token after the inner run");
    assert_eq!(
        get("I"),
        Some(4),
        "inner command's token (the inner file's 4th claim)"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("IP 0 {}", p(&inner))),
        "inner CXC_LEASE_PATH: {text}"
    );
}

#[test]
fn rwlock_exclusive_tokens_increase_across_shared_runs_and_an_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let rw = dir.path().join("x.rw");
    let log = dir.path().join("log");
    assert!(
        cxc(&["create", "rwlock", p(&rw), "--grace", "300ms"])
            .status()
            .unwrap()
            .success()
    );
    let mut seen = Vec::new();
    for i in 0..3 {
        let cmd = format!("echo \"X{i} $CXC_FENCING_TOKEN\" >> {}", p(&log));
        assert_eq!(
            Job::start(&["rwlock", "run", "-x", p(&rw), "-c", &cmd]).wait(LONG),
            Some(0)
        );
        assert_eq!(
            Job::start(&["rwlock", "run", "-s", p(&rw), "--", "true"]).wait(LONG),
            Some(0)
        );
        seen.push(token_of(&log, &format!("X{i}"), Duration::ZERO).unwrap());
    }
    // An exclusive run whose keeper stops: evicted by a waiting exclusive run.
    let cmd = format!(
        "while :; do echo \"E $CXC_FENCING_TOKEN\" >> {}; sleep 0.01; done",
        p(&log)
    );
    let mut evicted = Job::start(&["rwlock", "run", "-x", p(&rw), "-c", &cmd]);
    seen.push(token_of(&log, "E", LONG).expect("exclusive run never started"));
    let keeper = evicted.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let cmd = format!("echo \"T $CXC_FENCING_TOKEN\" >> {}", p(&log));
    let code = Job::start(&["rwlock", "run", "-x", p(&rw), "-c", &cmd]).wait(LONG);
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    assert_eq!(code, Some(0), "the evicting run did not run");
    let lines = tokens(&log);
    let t_at = lines.iter().position(|e| e.0 == "T").unwrap();
    seen.push(lines[t_at].1);
    assert!(
        lines[t_at..].iter().all(|e| e.0 != "E"),
        "the evicted command wrote after the next writer started: {lines:?}"
    );
    assert_strictly_increasing(&seen, "exclusive rwlock runs");
    assert_eq!(evicted.wait(LONG), Some(75), "the evicted run's exit code");
}

#[test]
fn elect_terms_give_every_later_command_a_greater_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.elect");
    let log = dir.path().join("log");
    let short = |id: &str| {
        format!(
            "echo \"{id} $CXC_FENCING_TOKEN\" >> {}; sleep 0.05",
            p(&log)
        )
    };
    let cands: Vec<Job> = ["A", "B"]
        .iter()
        .map(|id| {
            Job::start(&[
                "elect",
                p(&file),
                "--identity",
                id,
                "--lease-duration",
                "200ms",
                "--restart-delay",
                "100ms",
                "-c",
                &short(id),
            ])
        })
        .collect();
    assert!(
        wait_until(LONG, || tokens(&log).len() >= 10),
        "terms: {:?}",
        tokens(&log)
    );
    for c in &cands {
        c.signal(Signal::TERM);
    }
    drop(cands);
    let mut seq: Vec<u64> = tokens(&log).iter().map(|e| e.1).collect();
    assert_strictly_increasing(&seq, "alternating terms");
    // A leader whose keeper is stopped is replaced after the lease duration.
    let long = format!(
        "while :; do echo \"L $CXC_FENCING_TOKEN\" >> {}; sleep 0.01; done",
        p(&log)
    );
    let leader = Job::start(&[
        "elect",
        p(&file),
        "--identity",
        "L",
        "--lease-duration",
        "300ms",
        "-c",
        &long,
    ]);
    let l = token_of(&log, "L", LONG).expect("leader never ran");
    seq.push(l);
    let keeper = leader.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let standby_cmd = format!("echo \"S $CXC_FENCING_TOKEN\" >> {}; sleep 30", p(&log));
    let standby = Job::start(&[
        "elect",
        p(&file),
        "--identity",
        "S",
        "--lease-duration",
        "300ms",
        "-c",
        &standby_cmd,
    ]);
    let s = token_of(&log, "S", LONG);
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    let s = s.expect("the standby never led");
    seq.push(s);
    let lines = tokens(&log);
    let s_at = lines.iter().position(|e| e.0 == "S").unwrap();
    assert!(
        lines[s_at..].iter().all(|e| e.0 != "L"),
        "the replaced leader's command wrote after the new leader started: {lines:?}"
    );
    assert_strictly_increasing(&seq, "terms after a stopped leader");
    drop(standby);
    drop(leader);
}

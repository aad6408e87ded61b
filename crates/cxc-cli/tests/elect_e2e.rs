//! End-to-end test of `cxc elect` on the built binary: two candidates on one file, the
//! leader's command killed, then the leader's wrapper killed with SIGKILL; the commands
//! never run at once and the standby's command runs after each failover.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

mod common;
use common::{Job, cxc};

/// Starts a `cxc elect` candidate (killed with SIGKILL if the test ends first).
fn candidate(file: &Path, log: &Path, name: &str) -> Job {
    let l = log.to_str().unwrap();
    // Logs `start|end NAME PID TOKEN NS`; the loop's short sleeps let the TERM trap
    // run at once.
    let script = format!(
        "trap 'echo end {name} $$ $CXC_FENCING_TOKEN $(date +%s%N) >> {l}; exit 0' TERM; \
         echo start {name} $$ $CXC_FENCING_TOKEN $(date +%s%N) >> {l}; \
         while :; do sleep 0.05; done"
    );
    Job::start(&[
        "elect",
        file.to_str().unwrap(),
        "--identity",
        name,
        "--lease-duration",
        "500ms",
        "--restart-delay",
        "1s",
        "--",
        "sh",
        "-c",
        &script,
    ])
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    kind: String,
    name: String,
    pid: i32,
    token: u64,
    ns: u128,
}

fn read_log(log: &Path) -> Vec<Entry> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Entry {
                kind: f.first()?.to_string(),
                name: f.get(1)?.to_string(),
                pid: f.get(2)?.parse().ok()?,
                token: f.get(3)?.parse().ok()?,
                ns: f.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

/// The `n`th (from 0) entry of `kind`, waiting up to `t` for it.
fn nth(log: &Path, kind: &str, n: usize, t: Duration) -> Entry {
    let end = Instant::now() + t;
    loop {
        if let Some(e) = read_log(log).into_iter().filter(|e| e.kind == kind).nth(n) {
            return e;
        }
        assert!(
            Instant::now() < end,
            "no {kind} #{n} within {t:?}: {:?}",
            read_log(log)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every run (start..end, matched by pid) ended before the next one started, and the
/// fencing tokens increase from run to run.
fn assert_one_at_a_time(log: &Path) {
    let entries = read_log(log);
    let mut spans: Vec<(u128, u128, Entry)> = entries
        .iter()
        .filter(|e| e.kind == "start")
        .map(|s| {
            let end = entries
                .iter()
                .find(|e| e.kind == "end" && e.pid == s.pid)
                .map_or(u128::MAX, |e| e.ns);
            (s.ns, end, s.clone())
        })
        .collect();
    spans.sort_by_key(|s| s.0);
    for w in spans.windows(2) {
        assert!(
            w[1].0 > w[0].1,
            "{:?} started before {:?} ended: {entries:?}",
            w[1].2,
            w[0].2
        );
        assert!(w[1].2.token > w[0].2.token, "tokens: {entries:?}");
    }
}

fn gone(pid: i32, t: Duration) -> bool {
    let end = Instant::now() + t;
    while Instant::now() < end {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn failover_never_runs_two_commands_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("leader.elect");
    let log = dir.path().join("log");
    let long = Duration::from_secs(15);

    let mut a = candidate(&file, &log, "A");
    let first = nth(&log, "start", 0, long);
    assert_eq!(first.name, "A");
    let mut b = candidate(&file, &log, "B");
    // B campaigns for longer than a term while A's command runs: it must not lead.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(read_log(&log), vec![first.clone()], "B ran while A led");

    // The leader's command dies: A gives the term back and waits 1 s before campaigning
    // again, so the standby leads and runs its command.
    rustix::process::kill_process(Pid::from_raw(first.pid).unwrap(), Signal::TERM).unwrap();
    let second = nth(&log, "start", 1, long);
    assert_eq!(second.name, "B", "{:?}", read_log(&log));
    assert!(second.token > first.token);

    // The leader's wrapper is killed with SIGKILL: its keeper terminates B's command,
    // and only then can A lead again.
    std::thread::sleep(Duration::from_millis(300));
    b.signal(Signal::KILL);
    let third = nth(&log, "start", 2, long);
    assert_eq!(third.name, "A", "{:?}", read_log(&log));
    let b_end = nth(&log, "end", 1, long);
    assert_eq!(b_end.pid, second.pid);
    assert!(third.ns > b_end.ns, "A started before B's command ended");
    assert!(gone(second.pid, long), "B's command outlived its wrapper");
    assert_eq!(b.wait(long), Some(128 + 9));

    // SIGTERM to A's wrapper stops its command and A exits with the command's code.
    std::thread::sleep(Duration::from_millis(300));
    a.signal(Signal::TERM);
    assert_eq!(a.wait(long), Some(0));
    let a_end = nth(&log, "end", 2, long);
    assert_eq!(a_end.pid, third.pid);
    assert!(gone(third.pid, long));

    assert_one_at_a_time(&log);
    assert_eq!(read_log(&log).len(), 6, "{:?}", read_log(&log));
}

#[test]
fn elect_rejects_bad_input_without_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| cxc(args).output().unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"not a cxc file at all, not at all").unwrap();
    let o = run(&["elect", garbage.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a cxc file"), "{err}");

    let f = dir.path().join("e");
    let long_id = "x".repeat(40);
    let o = run(&[
        "elect",
        f.to_str().unwrap(),
        "--identity",
        &long_id,
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--identity"));

    let o = run(&["elect", f.to_str().unwrap(), "--", "/nonexistent/cmd"]);
    assert_eq!(o.status.code(), Some(127));
}

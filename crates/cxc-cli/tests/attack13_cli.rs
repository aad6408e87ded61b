//! Thirteenth round of attacks on `cxc elect` (docs/cli.md, `elect`): keepers killed one
//! after another while a previous leader's command outlives its term, a keeper killed
//! with no standby, the exit codes of a wrapper signalled while campaigning or running,
//! and the handover when the leader's command ends on its own.
//!
//! Wrappers run under `cxc_testkit::Proc` (killed on drop, stderr kept for failure
//! messages); the commands log `start NAME PID TOKEN NS` to a shared file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc::ElectionBackend;
use cxc_testkit::{Proc, wait_until};
use rustix::process::{Pid, Signal};

mod common;
use common::{cxc, p};

const LONG: Duration = Duration::from_secs(15);

/// `cxc elect FILE --identity NAME --lease-duration 500ms --restart-delay R -- sh -c
/// "BODY"`, where `BODY` may use `$LOG_START` (the line that logs the start).
fn elect(file: &Path, log: &Path, name: &str, restart: &str, body: &str) -> Proc {
    let start = format!(
        "echo start {name} $$ $CXC_FENCING_TOKEN $(date +%s%N) >> {}",
        log.display()
    );
    let script = body.replace("$LOG_START", &start);
    let args = [
        "elect",
        p(file),
        "--identity",
        name,
        "--lease-duration",
        "500ms",
        "--restart-delay",
        restart,
        "--",
        "sh",
        "-c",
        &script,
    ];
    Proc::spawn(cxc(&args), &format!("cxc elect ({name})"))
}

#[derive(Debug, Clone)]
struct Start {
    name: String,
    pid: i32,
    token: u64,
}

fn starts(log: &Path) -> Vec<Start> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"start")).then(|| Start {
                name: f[1].to_owned(),
                pid: f[2].parse().unwrap(),
                token: f[3].parse().unwrap(),
            })
        })
        .collect()
}

fn start_of(log: &Path, name: &str, t: Duration) -> Start {
    let mut found = None;
    wait_until(t, || {
        found = starts(log).into_iter().find(|s| s.name == name);
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("{name} never started its command: {:?}", starts(log)))
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let st = s[s.rfind(')').unwrap() + 1..].split_whitespace().next();
            !matches!(st, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

/// The keeper the wrapper `pid` started.
fn keeper(wrapper: u32) -> Pid {
    let mut k = None;
    wait_until(Duration::from_secs(10), || {
        k = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<i32>().ok());
        k.is_some()
    });
    Pid::from_raw(k.expect("the wrapper started no keeper")).unwrap()
}

/// The identity the election file shows for its leader.
fn leader_identity(file: &Path) -> Option<String> {
    let e = cxc::MmapElection::create_or_open(file, Duration::from_millis(500)).ok()?;
    e.leader().ok().flatten().map(|l| l.identity)
}

/// Kills process group `pgid` (cleanup of an orphan the test made).
struct GroupKiller(Vec<i32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        for g in &self.0 {
            if let Some(p) = Pid::from_raw(*g) {
                let _ = rustix::process::kill_process_group(p, Signal::KILL);
            }
        }
    }
}

struct Dir {
    _d: tempfile::TempDir,
    file: PathBuf,
    log: PathBuf,
}

fn dir() -> Dir {
    let d = tempfile::tempdir().unwrap();
    Dir {
        file: d.path().join("leader.elect"),
        log: d.path().join("log"),
        _d: d,
    }
}

/// A command that ignores SIGTERM (so ending it takes the keeper's 2 s until SIGKILL).
const STUBBORN: &str = "trap '' TERM; $LOG_START; while :; do sleep 0.05; done";
/// A command that logs its start and runs until killed.
const PLAIN: &str = "$LOG_START; while :; do sleep 0.05; done";

/// docs/cli.md, `elect`: "Every host runs the same line; one leads at a time"; "A
/// candidate that wins after a leader whose keeper was killed or stopped past the lease
/// duration first terminates that group if it still has live members". Leader A's
/// command ignores SIGTERM; A's keeper is SIGKILLed (its command lives on). Candidate B
/// wins at once and starts ending A's group (SIGTERM, SIGKILL 2 s later); while it waits,
/// B's keeper is SIGKILLed too. Candidate C then wins at once (B is dead) — but the
/// record it observed is B's (B overwrote A's record, which named A's group, when it
/// won), so nobody is left who knows about A's command: C must not start its command
/// while A's still runs.
// Found (fixed since): after two keepers die in a row, the third leader runs its command next to the first leader's still-running command (docs/cli.md: "one leads at a time"; "first terminates that group if it still has live members")
#[test]
fn elect_third_leader_never_runs_beside_an_orphan_whose_ender_died() {
    let d = dir();
    let mut a = elect(&d.file, &d.log, "A", "30s", STUBBORN);
    let sa = start_of(&d.log, "A", LONG);
    let _cleanup = GroupKiller(vec![sa.pid]);
    // A's group is published in the record.
    assert!(wait_until(LONG, || leader_identity(&d.file)
        .is_some_and(|i| i.contains("pgid="))));
    rustix::process::kill_process(keeper(a.pid()), Signal::KILL).unwrap();
    assert!(
        a.wait_timeout(LONG).is_some(),
        "A's wrapper outlived its keeper"
    );
    assert!(alive(sa.pid), "A's command ended with its keeper");

    let mut b = elect(&d.file, &d.log, "B", "30s", PLAIN);
    // B leads (its own record, no group yet) and is ending A's stubborn command.
    assert!(
        wait_until(LONG, || leader_identity(&d.file).as_deref() == Some("B")),
        "B never led: {:?}",
        leader_identity(&d.file)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(sa.pid));
    rustix::process::kill_process(keeper(b.pid()), Signal::KILL).unwrap();
    assert!(b.wait_timeout(LONG).is_some());

    let _c = elect(&d.file, &d.log, "C", "30s", PLAIN);
    let sc = start_of(&d.log, "C", LONG);
    let a_alive_at_c = alive(sa.pid);
    std::thread::sleep(Duration::from_secs(3));
    let a_alive_later = alive(sa.pid);
    assert!(sc.token > sa.token);
    assert!(
        !a_alive_at_c && !a_alive_later,
        "C (token {}) started its command while A's (token {}, pid {}) still ran, and A's \
         was {} 3 s later; B started nothing: {:?}",
        sc.token,
        sa.token,
        sa.pid,
        if a_alive_later {
            "still running"
        } else {
            "gone"
        },
        starts(&d.log)
    );
}

/// "Wrapper killed" has its own promise; here the *keeper* is SIGKILLed with no standby:
/// its command lives on, orphaned. A candidate started 1 s later wins at once (the dead
/// holder) and must end that command before starting its own ("first terminates that
/// group if it still has live members and one of them carries that term's mark").
#[test]
fn elect_candidate_arriving_after_a_killed_keeper_ends_its_orphan_first() {
    let d = dir();
    let mut a = elect(&d.file, &d.log, "A", "30s", PLAIN);
    let sa = start_of(&d.log, "A", LONG);
    let _cleanup = GroupKiller(vec![sa.pid]);
    assert!(wait_until(LONG, || leader_identity(&d.file)
        .is_some_and(|i| i.contains("pgid="))));
    rustix::process::kill_process(keeper(a.pid()), Signal::KILL).unwrap();
    assert!(a.wait_timeout(LONG).is_some());
    std::thread::sleep(Duration::from_secs(1));
    assert!(alive(sa.pid), "A's command ended with its keeper");
    let _b = elect(&d.file, &d.log, "B", "30s", PLAIN);
    let sb = start_of(&d.log, "B", LONG);
    assert!(sb.token > sa.token);
    assert!(
        !alive(sa.pid),
        "B (token {}) runs beside the orphaned command of A (token {})",
        sb.token,
        sa.token
    );
}

/// Exit codes (docs/cli.md and `cxc elect --help`): "SIGTERM/SIGINT/SIGHUP ... `elect`
/// exits with the command's code (128+S while campaigning)". Three candidates campaign
/// while another leads and get SIGINT, SIGHUP, SIGTERM: 130, 129, 143. The leader's
/// command exits 7 on SIGTERM: its wrapper exits 7 — and the term is given back, so a
/// fresh candidate leads at once.
#[test]
fn elect_exit_codes_follow_the_signal_or_the_command() {
    let d = dir();
    let mut lead = elect(
        &d.file,
        &d.log,
        "L",
        "30s",
        "trap 'exit 7' TERM; $LOG_START; while :; do sleep 0.05; done",
    );
    start_of(&d.log, "L", LONG);
    let mut waiting: Vec<(Signal, i32, Proc)> =
        [(Signal::INT, 130), (Signal::HUP, 129), (Signal::TERM, 143)]
            .into_iter()
            .map(|(s, c)| (s, c, elect(&d.file, &d.log, &format!("W{c}"), "30s", PLAIN)))
            .collect();
    std::thread::sleep(Duration::from_millis(700));
    let mut wrong = Vec::new();
    for (sig, code, w) in &mut waiting {
        rustix::process::kill_process(Pid::from_raw(w.pid() as i32).unwrap(), *sig).unwrap();
        let st = w
            .wait_timeout(LONG)
            .expect("a campaigning wrapper ignored a signal");
        if st.code() != Some(*code) {
            wrong.push(format!("{sig:?} while campaigning: {st} (want {code})"));
        }
    }
    rustix::process::kill_process(Pid::from_raw(lead.pid() as i32).unwrap(), Signal::TERM).unwrap();
    let st = lead
        .wait_timeout(LONG)
        .expect("the leader's wrapper ignored SIGTERM");
    if st.code() != Some(7) {
        wrong.push(format!("SIGTERM to the leader: {st} (want 7)"));
    }
    let t = Instant::now();
    let _n = elect(&d.file, &d.log, "N", "30s", PLAIN);
    start_of(&d.log, "N", LONG);
    assert!(wrong.is_empty(), "{wrong:?}");
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "a fresh candidate waited {:?} after the leader exited on SIGTERM",
        t.elapsed()
    );
}

/// "Command ends on its own (any code): the keeper gives the term back at once and
/// campaigns again after --restart-delay, so a standby takes over meanwhile." A's
/// command exits after 0.5 s (restart delay 3 s); B campaigns all along: B's command
/// must start within 300 ms of A's end, and A must not run again while B leads.
#[test]
fn elect_standby_takes_over_at_once_when_the_command_ends_on_its_own() {
    let d = dir();
    let end_log = d.log.display().to_string();
    let _a = elect(
        &d.file,
        &d.log,
        "A",
        "3s",
        &format!("$LOG_START; sleep 0.5; echo end A $(date +%s%N) >> {end_log}"),
    );
    let sa = start_of(&d.log, "A", LONG);
    let _b = elect(&d.file, &d.log, "B", "3s", PLAIN);
    let sb = start_of(&d.log, "B", LONG);
    let text = std::fs::read_to_string(&d.log).unwrap();
    let ns = |l: &str| -> u128 { l.split_whitespace().last().unwrap().parse().unwrap() };
    let a_end = text
        .lines()
        .find(|l| l.starts_with("end A"))
        .map(ns)
        .unwrap();
    let b_start = text
        .lines()
        .find(|l| l.starts_with("start B"))
        .map(ns)
        .unwrap();
    assert!(
        b_start > a_end,
        "B started before A's command ended: {text}"
    );
    let gap = Duration::from_nanos((b_start - a_end) as u64);
    assert!(sb.token > sa.token);
    // A campaigns again after 3 s and must stay a standby.
    std::thread::sleep(Duration::from_secs(4));
    let again: Vec<Start> = starts(&d.log);
    assert_eq!(again.len(), 2, "A ran again while B led: {again:?}");
    assert!(
        gap < Duration::from_millis(300),
        "the standby started {gap:?} after the leader's command ended"
    );
}

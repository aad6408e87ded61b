//! Thirty-third round of attacks on `cxc lease run`, `cxc sem run` and `cxc rwlock run`
//! (docs/cli.md, "How `run` keeps one job at a time"): processes that change under the
//! wrapper and its keeper.
//!
//! 1. The command's leader exits (code 7) leaving a child in its group; then SIGTERM or
//!    SIGHUP reaches the wrapper: the signal must still reach the group (the leader is
//!    gone, its pid reaped), the claim must be kept until the child ends, and the wrapper
//!    must return the leader's code.
//! 2. The wrapper is SIGSTOPped while its command runs: the command ends meanwhile; the
//!    claim must be given back though the wrapper cannot be told (stopped), and a
//!    `--kill-after` waiter must not take over from the running command while only the
//!    wrapper (not the keeper) is stopped.
//! 3. SIGTERM to the wrapper in its first milliseconds, at many delays (before the keeper
//!    exists, before it installs its handlers, while it waits, just as it starts the
//!    command, with and without `-n`): the run exits 143, leaves no process of its
//!    command behind and no claim held.
//! 4. `sem run -j 2` nested in `sem run -j 2` on the same semaphore: the two hold both
//!    permits; the outer wrapper killed with `kill -9` while the inner command cleans up
//!    slowly; no waiting run may start before the inner command is gone.
//! 5. A command whose leader `exec`s, forks a grandchild and exits: `sem run` and
//!    `rwlock run -x` keep the claim while the grandchild runs.
//! 6. A run nested in an `elect` leader's command (`cxc elect E -- cxc sem run S -- job`),
//!    the leader's keeper stopped past `--lease-duration` or SIGKILLed: the next leader
//!    ends the leader's group (the nested wrapper) but not the nested job, whose cleanup
//!    outlasts the 2 s before SIGKILL, and must not start its command beside it. Both
//!    cases failed every time before `elect` waited for the keepers nested in the group
//!    it ended, as a `lease run --kill-after` taker does (point 5; that control held).
//!
//! Markers are files written with `>>` (`O_APPEND`) and pid files; the judge of "still
//! running" is `/proc` (a live, non-zombie process).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cxc_testkit::wait_until;
use rustix::process::Signal;

mod common;
use common::{Job, alive, p};

const CXC: &str = env!("CARGO_BIN_EXE_cxc");

fn write_script(path: &Path, body: &str) -> PathBuf {
    std::fs::write(path, body).unwrap();
    path.to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The pid written (alone, on one line) in `path`, waiting up to `t`.
fn pid_in(path: &Path, t: Duration) -> Option<u32> {
    let mut got = None;
    wait_until(t, || {
        got = read(path)
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok());
        got.is_some()
    });
    got
}

fn ppid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// The exit code of `cxc ARGS` (a probe run), bounded by `t`.
fn probe(args: &[&str], t: Duration) -> Option<i32> {
    let mut j = Job::start(args);
    j.wait(t)
}

/// Live processes whose command line mentions `needle` (the test's private directory).
fn processes_naming(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// The three run commands, as argument prefixes before the options, each on its own file
/// in `dir`.
fn run_kinds(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let f = |name: &str| p(&dir.join(name)).to_string();
    vec![
        ("lease", vec!["lease".into(), "run".into(), f("l")]),
        (
            "sem",
            vec!["sem".into(), "run".into(), f("s"), "-j".into(), "1".into()],
        ),
        (
            "rwlock-x",
            vec!["rwlock".into(), "run".into(), "--exclusive".into(), f("rw")],
        ),
    ]
}

fn with<'a>(prefix: &'a [String], rest: &[&'a str]) -> Vec<&'a str> {
    prefix
        .iter()
        .map(String::as_str)
        .chain(rest.iter().copied())
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. A signal after the command's leader exited.

/// docs/cli.md point 3: "SIGTERM, SIGINT and SIGHUP to the wrapper are forwarded to the
/// keeper, which forwards them to the command's group and keeps the claim until the group
/// is gone. The wrapper exits with the command's code." — and `lease run` "gives the
/// lease back once the command's whole process group is gone".
///
/// The leader exits 7 at once, leaving a child in its group (a background job of `sh`,
/// which does not ignore SIGTERM or SIGHUP). Once the child is the keeper's (the keeper
/// is a subreaper: the leader is gone), the wrapper gets the signal: the child must get it
/// too (its trap logs it, after a cleanup of 0.5 s), a `-n` run must find the claim taken
/// until the child ended, and the wrapper must exit 7.
///
/// The same with `kill -9` of the wrapper (point 4: "If the wrapper dies (even `kill -9`),
/// the keeper sees its pidfd and terminates the command's group: SIGTERM, SIGKILL 2 s
/// later. The claim is given back only when no live (non-zombie) process is left in the
/// group"): the orphan gets SIGTERM, and the claim stays held until it ended.
#[test]
fn a_signal_after_the_leader_exited_reaches_its_orphan_and_the_command_s_code_returns() {
    for (sig, name, want) in [
        (Signal::TERM, "TERM", 7),
        (Signal::HUP, "HUP", 7),
        (Signal::KILL, "TERM", 137),
    ] {
        let d = tempfile::tempdir().unwrap();
        for (kind, prefix) in run_kinds(d.path()) {
            let tag = format!("{kind}-sig{}", sig.as_raw());
            let log = d.path().join(format!("{tag}.log"));
            let pidf = d.path().join(format!("{tag}.pid"));
            let child = write_script(
                &d.path().join(format!("{tag}.child.sh")),
                &format!(
                    "trap 'sleep 0.5; echo got {name} >> {log}; exit 0' {name}\n\
                     echo $$ > {pidf}\n\
                     while :; do sleep 0.05; done\n",
                    log = p(&log),
                    pidf = p(&pidf),
                ),
            );
            let leader = format!("sh {} & exit 7", p(&child));
            let mut w = Job::start(&with(&prefix, &["--", "sh", "-c", &leader]));
            let kid = pid_in(&pidf, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{tag}: the command's child never started"));
            let keeper = w.keeper().as_raw_pid() as u32;
            assert!(
                wait_until(Duration::from_secs(20), || ppid(kid) == Some(keeper)),
                "{tag}: the child {kid} never became the keeper's (leader still running?)"
            );
            // The claim is held while the orphan runs.
            assert_eq!(
                probe(
                    &with(&prefix, &["-n", "--", "true"]),
                    Duration::from_secs(20)
                ),
                Some(1),
                "{tag}: a -n run got the claim while the command's child still ran"
            );
            w.signal(sig);
            let code = w.wait(Duration::from_secs(30));
            if sig == Signal::KILL {
                // The wrapper is gone at once; the keeper ends the group after it.
                wait_until(Duration::from_secs(30), || !alive(kid));
            }
            assert!(
                read(&log).contains(&format!("got {name}")),
                "{tag}: the orphan never received the forwarded SIG{name} \
                 (wrapper exit {code:?}, orphan alive: {})",
                alive(kid)
            );
            assert_eq!(
                code,
                Some(want),
                "{tag}: the wrapper must return the command's code (the leader's 7; 137: \
                 the wrapper itself was killed)"
            );
            assert!(!alive(kid), "{tag}: the orphan outlived the run");
            assert_eq!(
                probe(
                    &with(&prefix, &["-n", "--", "true"]),
                    Duration::from_secs(20)
                ),
                Some(0),
                "{tag}: the claim was not given back after the group ended"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. A stopped wrapper.

/// docs/cli.md: `lease run` "gives the lease back once the command's whole process group
/// is gone" (and `sem run`, `rwlock run` give "the same promise for the command's process
/// group"); point 3: "The wrapper exits with the command's code."
///
/// The wrapper is stopped (SIGSTOP) while its command runs; the command then ends with
/// code 5. A waiting run must get the claim while the first wrapper is still stopped, and
/// the first wrapper, continued, must exit 5.
#[test]
fn a_stopped_wrapper_does_not_keep_the_claim_after_its_command_ended() {
    let d = tempfile::tempdir().unwrap();
    for (kind, prefix) in run_kinds(d.path()) {
        let go = d.path().join(format!("{kind}.go"));
        let started = d.path().join(format!("{kind}.started"));
        let body = format!(
            "echo $$ > {s}; while [ ! -e {g} ]; do sleep 0.02; done; exit 5",
            s = p(&started),
            g = p(&go)
        );
        let mut w = Job::start(&with(&prefix, &["--", "sh", "-c", &body]));
        let cmd = pid_in(&started, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{kind}: the command never started"));
        w.signal(Signal::STOP);
        let wpid = w.0.id();
        assert!(
            wait_until(Duration::from_secs(10), || state(wpid) == Some('T')),
            "{kind}: the wrapper did not stop"
        );
        let mut next = Job::start(&with(&prefix, &["-w", "30", "--", "true"]));
        std::fs::write(&go, "").unwrap();
        let got = next.wait(Duration::from_secs(40));
        let still_stopped = state(wpid) == Some('T');
        w.signal(Signal::CONT);
        assert_eq!(
            got,
            Some(0),
            "{kind}: the next run did not get the claim while the finished command's wrapper \
             was stopped (command alive: {})",
            alive(cmd)
        );
        assert!(still_stopped, "{kind}: the wrapper did not stay stopped");
        assert_eq!(
            w.wait(Duration::from_secs(20)),
            Some(5),
            "{kind}: the continued wrapper must exit with its command's code"
        );
    }
}

/// docs/cli.md: "`--kill-after D` opts in to hung-holder takeover: a waiting run that sees
/// the holder's heartbeat stale for `D` terminates the holder's process group" — the
/// holder is the keeper ("the lease ... names the keeper's process identity"), which the
/// docs keep renewing while the command's group lives. A stopped *wrapper* is not a stale
/// holder: with the wrapper stopped for well over `D`, a `--kill-after 200ms` waiter must
/// not terminate the running command, must start only after the command ended on its
/// own, and the first wrapper (continued) must exit with the command's code, not 75.
#[test]
fn a_stopped_wrapper_is_not_a_stale_holder_for_kill_after() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    let log = d.path().join("log");
    let go = d.path().join("go");
    let started = d.path().join("started");
    let body = format!(
        "trap 'echo terminated >> {log}; exit 9' TERM; echo $$ > {s}; \
         while [ ! -e {g} ]; do sleep 0.02; done; echo first-end >> {log}; exit 6",
        log = p(&log),
        s = p(&started),
        g = p(&go)
    );
    let mut w = Job::start(&["lease", "run", p(&l), "--", "sh", "-c", &body]);
    pid_in(&started, Duration::from_secs(20)).expect("the command never started");
    w.signal(Signal::STOP);
    let second = format!("echo second-start >> {}", p(&log));
    let mut next = Job::start(&[
        "lease",
        "run",
        p(&l),
        "--kill-after",
        "200ms",
        "--",
        "sh",
        "-c",
        &second,
    ]);
    // Well over D: a wrongful takeover would have happened by now.
    std::thread::sleep(Duration::from_millis(2500));
    let before = read(&log);
    std::fs::write(&go, "").unwrap();
    let next_code = next.wait(Duration::from_secs(30));
    w.signal(Signal::CONT);
    let first_code = w.wait(Duration::from_secs(20));
    let all = read(&log);
    assert!(
        before.is_empty(),
        "a --kill-after waiter acted while only the wrapper was stopped: {before:?}"
    );
    assert_eq!(next_code, Some(0), "the waiter never ran: log {all:?}");
    assert_eq!(
        all.lines().collect::<Vec<_>>(),
        ["first-end", "second-start"],
        "the waiter must run after the first command ended on its own"
    );
    assert_eq!(
        first_code,
        Some(6),
        "the first wrapper must return its command's code"
    );
}

// ---------------------------------------------------------------------------------------
// 3. SIGTERM in the first milliseconds.

/// docs/cli.md, exit codes: "128+S if it died of signal S, or if signal S came while the
/// run waited for its claim ... (nothing was run then)"; point 3: signals "forwarded to
/// the keeper, which forwards them to the command's group and keeps the claim until the
/// group is gone". So a wrapper that gets SIGTERM at any moment of its start — before its
/// keeper exists, before the keeper installs its handlers, while it waits, just as it
/// starts the command — exits 143 (the command, `sh -c '...; exec sleep 30'`, dies of
/// SIGTERM too), and once it has exited no process of its run is left and the claim is free.
#[test]
fn sigterm_in_the_first_milliseconds_leaves_nothing_running_and_nothing_held() {
    let d = tempfile::tempdir().unwrap();
    let needle = p(d.path()).to_string();
    let delays_us: [u64; 14] = [
        0, 200, 500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 20000, 35000, 60000,
    ];
    let mut kinds: Vec<(&str, Vec<String>, Vec<String>)> = run_kinds(d.path())
        .into_iter()
        .map(|(k, pre)| (k, pre.clone(), pre))
        .collect();
    let rw = p(&d.path().join("rw")).to_string();
    // A shared run's leftover read hold shows to an exclusive probe.
    kinds.push((
        "rwlock-s",
        vec!["rwlock".into(), "run".into(), "--shared".into(), rw.clone()],
        vec!["rwlock".into(), "run".into(), "--exclusive".into(), rw],
    ));
    for (kind, prefix, probe_prefix) in kinds {
        for nonblock in [false, true] {
            for &us in &delays_us {
                let tag = format!("{kind} -n={nonblock} after {us} us");
                let pids = d.path().join(format!("{kind}-{nonblock}-{us}.pids"));
                let body = format!("echo $$ >> {}; exec sleep 30", p(&pids));
                let mut args = prefix.iter().map(String::as_str).collect::<Vec<_>>();
                if nonblock {
                    args.push("-n");
                }
                args.extend(["--", "sh", "-c", &body]);
                let mut w = Job::start(&args);
                std::thread::sleep(Duration::from_micros(us));
                w.signal(Signal::TERM);
                let code = w.wait(Duration::from_secs(20));
                assert_eq!(code, Some(143), "{tag}: exit code");
                // The keeper is gone before the wrapper returns; give stragglers a moment.
                let left = {
                    let mut left = Vec::new();
                    wait_until(Duration::from_secs(5), || {
                        left = processes_naming(&needle);
                        left.is_empty()
                    });
                    left
                };
                assert!(
                    left.is_empty(),
                    "{tag}: processes of the run outlived its wrapper: {left:?} ({:?})",
                    left.iter()
                        .map(|p| std::fs::read(format!("/proc/{p}/cmdline"))
                            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                            .unwrap_or_default())
                        .collect::<Vec<_>>()
                );
                for pid in read(&pids).lines().filter_map(|l| l.trim().parse().ok()) {
                    assert!(!alive(pid), "{tag}: the command {pid} outlived its run");
                }
                assert_eq!(
                    probe(
                        &with(&probe_prefix, &["-w", "15", "--", "true"]),
                        Duration::from_secs(30)
                    ),
                    Some(0),
                    "{tag}: the claim was left held"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. `sem run` nested in `sem run` on the same semaphore.

/// docs/cli.md point 4: "If the wrapper dies (even `kill -9`), the keeper ... terminates
/// the command's group ... The claim is given back only when no live (non-zombie) process
/// is left in the group, and no keeper of a run nested in this one is left among the
/// keeper's children", with "`cxc lease run A -- cxc sem run B -- job`" as the example;
/// `sem run`: "At most `--permits` (`-j`) commands hold a permit at once".
///
/// Here A and B are the same semaphore of 2 permits: the outer run holds one, the inner
/// one the other, so a `-n` run finds none. The outer wrapper is killed with `kill -9`
/// while the inner command takes 1 s to clean up after SIGTERM; two runs waiting meanwhile
/// must both start only after the inner command is gone, and both permits must come back.
#[test]
fn a_sem_run_nested_in_a_sem_run_of_the_same_file_keeps_both_permits_until_it_ends() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    let log = d.path().join("log");
    let inner_pid = d.path().join("inner.pid");
    let job = write_script(
        &d.path().join("inner.sh"),
        &format!(
            "trap 'sleep 1; echo inner-cleaned >> {log}; exit 0' TERM\n\
             echo $$ > {pidf}\n\
             while :; do sleep 0.05; done\n",
            log = p(&log),
            pidf = p(&inner_pid)
        ),
    );
    let outer = Job::start(&[
        "sem",
        "run",
        p(&s),
        "-j",
        "2",
        "--",
        CXC,
        "sem",
        "run",
        p(&s),
        "-j",
        "2",
        "--",
        "sh",
        p(&job),
    ]);
    let inner = pid_in(&inner_pid, Duration::from_secs(20)).expect("the inner job never started");
    assert_eq!(
        probe(
            &["sem", "run", p(&s), "-j", "2", "-n", "--", "true"],
            Duration::from_secs(20)
        ),
        Some(1),
        "the nested runs should hold both permits"
    );
    let waiter = |i: usize| {
        let body = format!(
            "if kill -0 {inner} 2>/dev/null && [ \"$(cut -d' ' -f3 /proc/{inner}/stat)\" != Z ]; \
             then echo waiter-{i}-beside-inner >> {log}; else echo waiter-{i} >> {log}; fi",
            log = p(&log)
        );
        Job::start(&[
            "sem",
            "run",
            p(&s),
            "-j",
            "2",
            "-w",
            "40",
            "--",
            "sh",
            "-c",
            &body,
        ])
    };
    let mut w1 = waiter(1);
    let mut w2 = waiter(2);
    // Let both waiters queue.
    std::thread::sleep(Duration::from_millis(300));
    outer.signal(Signal::KILL);
    let c1 = w1.wait(Duration::from_secs(45));
    let c2 = w2.wait(Duration::from_secs(45));
    let all = read(&log);
    assert!(
        !all.contains("beside"),
        "a waiting run started while the nested command still ran: {all:?}"
    );
    assert_eq!((c1, c2), (Some(0), Some(0)), "the waiters: log {all:?}");
    assert!(!alive(inner), "the inner command outlived the run");
    assert!(
        all.lines().next() == Some("inner-cleaned"),
        "the inner command's cleanup must come first: {all:?}"
    );
    // Both permits back.
    let both = format!("{CXC} sem run {s} -j 2 -n -- true", s = p(&s));
    assert_eq!(
        probe(
            &[
                "sem",
                "run",
                p(&s),
                "-j",
                "2",
                "-n",
                "--",
                "sh",
                "-c",
                &both
            ],
            Duration::from_secs(20)
        ),
        Some(0),
        "both permits must come back"
    );
}

// ---------------------------------------------------------------------------------------
// 5. A leader that execs, forks a grandchild and exits.

/// docs/cli.md: `cxc lease run` and `cxc sem run` "give the same promise for the command's
/// process group" as flock(1)'s lock that "lasts while the command holds the descriptor";
/// `rwlock run`: "the lock lasts while the command's process group lives".
///
/// The command `exec`s a shell, which `exec`s another, which starts a grandchild (in the
/// group) and exits 3. While the grandchild runs a `-n` run finds the claim taken; after
/// it ends the claim comes back and the wrapper returns 3.
#[test]
fn an_exec_chain_that_leaves_a_grandchild_keeps_sem_and_rwlock_claims() {
    let d = tempfile::tempdir().unwrap();
    let kinds = run_kinds(d.path());
    let mut kinds: Vec<_> = kinds.into_iter().filter(|(k, _)| *k != "lease").collect();
    kinds.push((
        "sem-j2",
        vec![
            "sem".into(),
            "run".into(),
            p(&d.path().join("s2")).into(),
            "-j".into(),
            "2".into(),
        ],
    ));
    for (kind, prefix) in kinds {
        let go = d.path().join(format!("{kind}.go"));
        let gc = d.path().join(format!("{kind}.gc"));
        let leaf = write_script(
            &d.path().join(format!("{kind}.leaf.sh")),
            &format!(
                "echo $$ > {gc}\nwhile [ ! -e {go} ]; do sleep 0.02; done\n",
                gc = p(&gc),
                go = p(&go)
            ),
        );
        let mid = format!("sh {} & exit 3", p(&leaf));
        let top = format!("exec sh -c \"exec sh -c '{mid}'\"");
        let mut w = Job::start(&with(&prefix, &["--", "sh", "-c", &top]));
        let g = pid_in(&gc, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{kind}: the grandchild never started"));
        let keeper = w.keeper().as_raw_pid() as u32;
        assert!(
            wait_until(Duration::from_secs(20), || ppid(g) == Some(keeper)),
            "{kind}: the leader never exited"
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        // A few probes over a second: the claim stays held throughout.
        let mut held_runs = 0;
        // With 2 permits (one held by the grandchild's run) the probe needs both: it nests
        // a second `-n` run of the same file.
        let both = format!("{CXC} {} -n -- true", prefix.join(" "));
        let probe_args = if kind == "sem-j2" {
            with(&prefix, &["-n", "--", "sh", "-c", &both])
        } else {
            with(&prefix, &["-n", "--", "true"])
        };
        while Instant::now() < deadline || held_runs == 0 {
            let code = probe(&probe_args, Duration::from_secs(20));
            assert_ne!(
                code,
                Some(0),
                "{kind}: a -n run got the claim while the grandchild {g} still ran"
            );
            held_runs += 1;
        }
        std::fs::write(&go, "").unwrap();
        assert_eq!(
            w.wait(Duration::from_secs(20)),
            Some(3),
            "{kind}: the command's code"
        );
        assert!(!alive(g), "{kind}: the grandchild outlived the run");
        assert_eq!(
            probe(
                &with(&prefix, &["-n", "--", "true"]),
                Duration::from_secs(20)
            ),
            Some(0),
            "{kind}: the claim was not given back"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 6. A run nested in an `elect` leader's command, the leader's keeper stopped or killed.

/// `A`'s keeper is stopped (`stop`) or SIGKILLed; `B` then wins the term (or takes the
/// lease over) and must not start its command while the job of the run nested in `A`'s
/// command still runs. `A`'s nested job cleans up for 4 s after SIGTERM (longer than the
/// 2 s between SIGTERM and SIGKILL, so its wrapper in `A`'s group is SIGKILLed first).
/// Returns B's first log line.
fn nested_run_under_a_taken_over_leader(kind: &str, stop: bool) -> String {
    let d = tempfile::tempdir().unwrap();
    let (e, s, log) = (d.path().join("e"), d.path().join("s"), d.path().join("log"));
    let inner_pid = d.path().join("inner.pid");
    let job = write_script(
        &d.path().join("inner.sh"),
        &format!(
            "trap 'echo A-cleanup >> {log}; sleep 4; echo A-cleaned >> {log}; exit 0' TERM\n\
             echo $$ > {pidf}\n\
             while :; do sleep 0.05; done\n",
            log = p(&log),
            pidf = p(&inner_pid)
        ),
    );
    let claim = |id: &str| -> Vec<String> {
        let v: Vec<&str> = match kind {
            "elect" => vec![
                "elect",
                p(&e),
                "--identity",
                id,
                "--lease-duration",
                "300ms",
                "--restart-delay",
                "30s",
            ],
            _ => vec!["lease", "run", p(&e), "--kill-after", "300ms"],
        };
        v.into_iter().map(String::from).collect()
    };
    let a_args = claim("A");
    let mut a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    a_args.extend([
        "--",
        CXC,
        "sem",
        "run",
        p(&s),
        "-j",
        "5",
        "--",
        "sh",
        p(&job),
    ]);
    let a = Job::start(&a_args);
    let inner = pid_in(&inner_pid, Duration::from_secs(20)).expect("A's nested job never started");
    let a_keeper = a.keeper();
    let b_body = format!(
        "if [ -d /proc/{inner} ] && [ \"$(cut -d' ' -f3 /proc/{inner}/stat)\" != Z ]; \
         then echo B-beside-A-job >> {log}; else echo B-start >> {log}; fi; sleep 30",
        log = p(&log)
    );
    let b_args = claim("B");
    let mut b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    b_args.extend(["--", "sh", "-c", &b_body]);
    let _b = Job::start(&b_args);
    std::thread::sleep(Duration::from_millis(300));
    if stop {
        rustix::process::kill_process(a_keeper, Signal::STOP).unwrap();
    } else {
        rustix::process::kill_process(a_keeper, Signal::KILL).unwrap();
    }
    // The log shows `A-cleanup` twice: the nested keeper, its wrapper gone, sends SIGTERM
    // again, which kills the trap's `sleep` and runs the trap anew.
    let mut first_b = String::new();
    wait_until(Duration::from_secs(30), || {
        first_b = read(&log)
            .lines()
            .find(|l| l.starts_with("B-"))
            .unwrap_or_default()
            .to_string();
        !first_b.is_empty()
    });
    let all = read(&log);
    if stop {
        let _ = rustix::process::kill_process(a_keeper, Signal::CONT);
    }
    // Let A's pieces end before the directory goes.
    wait_until(Duration::from_secs(10), || !alive(inner));
    drop(a);
    format!("{first_b} | log: {all:?}")
}

/// Control: the same scene under `lease run --kill-after` (docs/cli.md point 5: the taker
/// "waits for the keepers of runs nested in that group to exit"), which holds.
#[test]
fn lease_taker_waits_for_the_job_nested_in_a_stopped_holder_s_command() {
    let r = nested_run_under_a_taken_over_leader("lease", true);
    assert!(r.starts_with("B-start"), "{r}");
}

/// docs/cli.md, `elect`: "one leads at a time"; "The keeper design of `lease run` (below)
/// holds the term on behalf of the command's process group", whose point 4 keeps the
/// claim until "no keeper of a run nested in this one is left" and point 5 has a taker
/// wait "for the keepers of runs nested in that group to exit"; "A candidate that wins
/// after a leader whose keeper was killed or stopped past the lease duration first
/// terminates that group ... and starts its command only if the term is still its own
/// afterwards". A leader's command `cxc sem run S -- job` (a nested run): its keeper
/// stopped past `--lease-duration`, the next leader must not start beside the job.
#[test]
fn elect_taker_waits_for_the_job_nested_in_a_stopped_leader_s_command() {
    let r = nested_run_under_a_taken_over_leader("elect", true);
    assert!(r.starts_with("B-start"), "{r}");
}

/// As above, A's keeper SIGKILLed (docs/cli.md, `elect`: "A candidate that wins after a
/// leader whose keeper was killed ... first terminates that group").
#[test]
fn elect_taker_waits_for_the_job_nested_in_a_killed_leader_s_command() {
    let r = nested_run_under_a_taken_over_leader("elect", false);
    assert!(r.starts_with("B-start"), "{r}");
}

//! Attacks on the documented promises of the `cxc` command (docs/cli.md) on the built
//! binary: a run that takes a claim over and must first end a slow orphan while a second
//! run waits with a short staleness limit, hostile paths (a FIFO), zero and huge
//! arguments, a daemonized grandchild, and the signals the docs say are forwarded.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rustix::process::Signal;

mod common;
use common::{Job, cxc, p};

/// A job that logs `start ID TOKEN NS` and `end ID TOKEN NS` (also when terminated by
/// SIGTERM), running `body` in between.
fn script(log: &Path, id: usize, body: &str) -> String {
    let l = p(log);
    format!(
        "trap 'echo end {id} $CXC_FENCING_TOKEN $(date +%s%N) >> {l}; exit 0' TERM; \
         echo start {id} $CXC_FENCING_TOKEN $(date +%s%N) >> {l}; {body}; \
         echo end {id} $CXC_FENCING_TOKEN $(date +%s%N) >> {l}"
    )
}

/// Every run of every job: (id, token, start ns, end ns if logged).
fn spans(log: &Path) -> Vec<(usize, String, u128, Option<u128>)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: Vec<(usize, String, u128, Option<u128>)> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, id, token, ns] = f[..] else {
            continue;
        };
        let (Ok(id), Ok(ns)) = (id.parse::<usize>(), ns.parse::<u128>()) else {
            continue;
        };
        match kind {
            "start" => out.push((id, token.to_string(), ns, None)),
            "end" => {
                if let Some(s) = out
                    .iter_mut()
                    .rev()
                    .find(|s| s.0 == id && s.1 == token && s.3.is_none())
                {
                    s.3 = Some(ns);
                }
            }
            _ => {}
        }
    }
    out
}

/// Waits until jobs 1 and 2 each logged an end (at most `t`).
fn wait_ends(log: &Path, t: Duration) {
    let end = Instant::now() + t;
    while Instant::now() < end {
        let s = spans(log);
        if [1, 2]
            .iter()
            .all(|id| s.iter().any(|x| x.0 == *id && x.3.is_some()))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("jobs 1 and 2 did not both run: {:?}", spans(log));
}

/// The scenario of the three `*_never_overlaps_while_a_slow_orphan_is_ended` tests:
///
/// 1. Job 0 runs a command that ignores SIGTERM (`trap '' TERM`, inherited by `sleep`
///    through exec), and its keeper is SIGSTOPped: a hung holder.
/// 2. Jobs 1 and 2 wait with a staleness limit of 500 ms (`--kill-after`, the rwlock's
///    grace, the election's lease duration). One of them takes the claim over and, as
///    documented, terminates job 0's recorded group before running: SIGTERM, SIGKILL
///    2 s later, so it spends 2 s in that cleanup.
/// 3. Promise: "two jobs never run at once" — the other waiting run must not get a claim
///    whose holder is still busy ending the orphan, or at least the two commands must
///    never run together.
fn slow_orphan_takeover(args: &dyn Fn(&str) -> Vec<String>) {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("log");
    let start = |id: usize, body: &str| {
        let a = args(&script(&log, id, body));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Job::start(&a)
    };
    let mut j0 = start(0, "trap '' TERM; sleep 30");
    let t = Instant::now();
    while !spans(&log).iter().any(|s| s.0 == 0) {
        assert!(t.elapsed() < Duration::from_secs(10), "job 0 never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let k0 = j0.keeper();
    rustix::process::kill_process(k0, Signal::STOP).unwrap();
    let j1 = start(1, "sleep 0.3");
    let j2 = start(2, "sleep 0.3");
    wait_ends(&log, Duration::from_secs(10));
    let _ = rustix::process::kill_process(k0, Signal::KILL);
    let _ = j0.wait(Duration::from_secs(5));
    drop((j1, j2));
    let runs: Vec<_> = spans(&log).into_iter().filter(|s| s.0 != 0).collect();
    for a in &runs {
        for b in &runs {
            if a.0 == b.0 && a.1 == b.1 {
                continue;
            }
            let (Some(ae), Some(be)) = (a.3, b.3) else {
                continue;
            };
            assert!(
                ae < b.2 || be < a.2,
                "job {} (token {}) and job {} (token {}) ran at once for {} ms: {runs:?}",
                a.0,
                a.1,
                b.0,
                b.1,
                (ae.min(be) - a.2.max(b.2)) / 1_000_000
            );
        }
    }
}

#[test]
fn lease_run_kill_after_never_overlaps_while_a_slow_orphan_is_ended() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    let l = p(&l).to_string();
    slow_orphan_takeover(&|s| {
        [
            "lease",
            "run",
            &l,
            "--kill-after",
            "500ms",
            "--",
            "sh",
            "-c",
            s,
        ]
        .map(String::from)
        .to_vec()
    });
}

#[test]
fn rwlock_run_exclusive_never_overlaps_while_a_slow_orphan_is_ended() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("rw");
    let l = p(&l).to_string();
    slow_orphan_takeover(&|s| {
        [
            "rwlock", "run", "-x", &l, "--grace", "500ms", "--", "sh", "-c", s,
        ]
        .map(String::from)
        .to_vec()
    });
}

#[test]
fn elect_never_runs_two_leaders_while_a_slow_orphan_is_ended() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("e");
    let l = p(&l).to_string();
    slow_orphan_takeover(&|s| {
        [
            "elect",
            &l,
            "--lease-duration",
            "500ms",
            "--restart-delay",
            "30s",
            "--",
            "sh",
            "-c",
            s,
        ]
        .map(String::from)
        .to_vec()
    });
}

/// Runs `cxc ARGS`; its exit code and stderr, or `None` if it did not end within `t`
/// (then it is killed).
fn run_within(args: &[&str], t: Duration) -> Option<(Option<i32>, String)> {
    let mut c = cxc(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + t;
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
            return Some((s.code(), err));
        }
        if Instant::now() >= end {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// "A file that is not a valid cxc file ... gives one line on stderr ... and exit code 2
/// — never a crash": a FIFO (nobody writes to it) given to the read-only commands, as
/// itself and through a symlink. `lease run` on it already says "not a regular file".
#[test]
fn inspect_and_watch_of_a_fifo_exit_2_instead_of_hanging() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let mut hung = Vec::new();
    for path in [&fifo, &link] {
        for args in [
            vec!["inspect", p(path)],
            vec!["inspect", "--format", "prometheus", p(path)],
            vec!["watch", p(path)],
            vec!["lease", "run", p(path), "--", "true"],
        ] {
            match run_within(&args, Duration::from_secs(2)) {
                None => hung.push(args.join(" ")),
                Some((code, err)) => {
                    assert_eq!(code, Some(2), "cxc {args:?}: {err}");
                    assert!(!err.contains("panicked"), "cxc {args:?}: {err}");
                }
            }
        }
    }
    assert!(
        hung.is_empty(),
        "hung on a FIFO (killed after 2 s): {hung:?}"
    );
}

/// Zero, huge and malformed arguments: a clear error (exit 2) or a normal run, never a
/// panic or a hang.
#[test]
fn zero_huge_and_malformed_arguments_never_panic() {
    let d = tempfile::tempdir().unwrap();
    let f = |n: &str| -> String { p(&d.path().join(n)).to_string() };
    let cases: Vec<Vec<String>> = [
        "lease run {l0} --tick 0 -- true",
        "lease run {l1} --tick 1000000000 -- true",
        "lease run {l2} -w 1000000000 -- true",
        "lease run {l3} -w 0 -- true",
        "lease run {l4} --kill-after 1000000000 -- true",
        "lease run {l5} -w nan -- true",
        "lease run {l5} -w -1 -- true",
        "lease run {l5} -w 1e400 -- true",
        "lease run {l5} -E 256 -- true",
        "lease run {l5} -c",
        "lease run {l5} --",
        "sem run {s0} -j 0 -- true",
        "sem run {s1} -j 4294967295 -- true",
        "sem run {s2} -j 2 --holders 0 -- true",
        "sem run {s3} -j 2 --holders 4294967295 -- true",
        "create sem {s4} --permits 3 --initial 5",
        "create heartbeat {h0} --capacity 0",
        "create heartbeat {h1} --capacity 4294967295",
        "create heartbeat {h2} --tick 0",
        "create rwlock {r0} --holders 0",
        "create rwlock {r1} --holders 5000",
        "create rwlock {r2} --grace 0",
        "create rwlock {r3} --grace 1000000000",
        "rwlock run -x {r4} --grace 0 -- true",
        "rwlock run -s -x {r5} -- true",
        "rwlock run {r5} -- true",
        "create cell {c0} --value zz",
        "create cell {c1} --value 0x",
        "create cell {c2} --value 0102030405060708091011121314151617181920212223242526272829303132333435363738394041424344454647484950",
        "create lease {m0} --mode 7777",
        "elect {e0} --identity 12345678901234567 -- true",
        "elect {e1} --identity {empty} -- true",
        "elect {e2} --lease-duration 0 -- true",
        "elect {e3} --lease-duration 1ms -- true",
        "watch {w0} --interval 0",
        "inspect {missing}",
    ]
    .iter()
    .map(|line| {
        line.split(' ')
            .map(|w| match w {
                "{empty}" => String::new(),
                w if w.starts_with('{') => f(w.trim_matches(['{', '}'])),
                w => w.to_string(),
            })
            .collect()
    })
    .collect();
    for c in &cases {
        let a: Vec<&str> = c.iter().map(String::as_str).collect();
        let (code, err) =
            run_within(&a, Duration::from_secs(5)).unwrap_or_else(|| panic!("cxc {a:?} hung"));
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "cxc {a:?} panicked: {err}"
        );
        assert!(
            matches!(code, Some(0 | 2)),
            "cxc {a:?}: exit {code:?}: {err}"
        );
        if code == Some(2) {
            assert!(
                err.starts_with("cxc: ") || err.starts_with("error: "),
                "{err}"
            );
        }
    }
}

/// A command whose grandchild (double fork, same process group) outlives it: the next run
/// starts only once the grandchild is gone ("the claim is given back once the command's
/// whole process group is gone"), and the wrapper exits with the leader's code.
#[test]
fn daemonized_grandchild_holds_the_lease_until_it_ends() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let lg = p(&log);
    let first = format!(
        "( (sleep 0.6; echo end 0 x $(date +%s%N) >> {lg}) & ); \
         echo start 0 x $(date +%s%N) >> {lg}; exit 4"
    );
    let mut j0 = Job::start(&["lease", "run", p(&l), "--", "sh", "-c", &first]);
    let t = Instant::now();
    while spans(&log).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(5));
    }
    let second =
        format!("echo start 1 x $(date +%s%N) >> {lg}; echo end 1 x $(date +%s%N) >> {lg}");
    let mut j1 = Job::start(&["lease", "run", p(&l), "--", "sh", "-c", &second]);
    assert_eq!(j0.wait(Duration::from_secs(10)), Some(4));
    assert_eq!(j1.wait(Duration::from_secs(10)), Some(0));
    let s = spans(&log);
    let g = s.iter().find(|x| x.0 == 0).unwrap();
    let n = s.iter().find(|x| x.0 == 1).unwrap();
    assert!(
        g.3.is_some_and(|e| e < n.2),
        "the next run started before the grandchild ended: {s:?}"
    );
}

/// SIGHUP and SIGINT to the wrapper reach the command (docs: "SIGTERM, SIGINT and SIGHUP
/// to the wrapper are forwarded"), whose exit code the wrapper returns; for every run
/// command.
#[test]
fn hup_and_int_are_forwarded_and_the_command_s_code_returned() {
    let d = tempfile::tempdir().unwrap();
    // Foreground sleeps: a background job of a non-interactive `sh` ignores SIGINT, and
    // would rightly keep the claim after `sh` exits.
    let body = "trap 'exit 11' HUP; trap 'exit 12' INT; echo > {m}; \
                while :; do sleep 0.05; done";
    for (sig, want) in [(Signal::HUP, 11), (Signal::INT, 12)] {
        for (i, pre) in [
            vec!["lease", "run"],
            vec!["sem", "run", "-j", "1"],
            vec!["rwlock", "run", "-x"],
            vec!["rwlock", "run", "-s"],
        ]
        .into_iter()
        .enumerate()
        {
            let file: PathBuf = d.path().join(format!("f{i}"));
            let marker = d.path().join(format!("m{i}-{}", sig.as_raw()));
            let s = body.replace("{m}", p(&marker));
            let mut a = pre.clone();
            a.extend([p(&file), "--", "sh", "-c", &s]);
            let mut j = Job::start(&a);
            let t = Instant::now();
            while !marker.exists() {
                assert!(t.elapsed() < Duration::from_secs(10), "{a:?} never ran");
                std::thread::sleep(Duration::from_millis(5));
            }
            j.signal(sig);
            assert_eq!(j.wait(Duration::from_secs(5)), Some(want), "{a:?} {sig:?}");
        }
    }
}

/// What `lease run` leaves in the lease payload (`supervise/held.rs`, `Record`): a tag, a
/// run counter and the command's process group.
fn run_record(runs: u64, pgid: u32) -> u64 {
    (0xC5 << 56) | ((runs & 0xFF_FFFF) << 32) | u64::from(pgid)
}

/// The state a killed keeper leaves behind (`kill -9` of the keeper, or the OOM killer):
/// the payload still names its command's process group after that command ended on its
/// own; by the next run (minutes or days later) the number may name an unrelated group
/// (pid reuse). Simulated by writing that record for an unrelated `sleep` in a group of
/// its own. Promise (cli.md point 5): the run terminates "a recorded group that still has
/// live members" — the group of *its* predecessor's command, not whichever group has that
/// number now. The unrelated `sleep` must survive `cxc lease run L -- true`.
#[test]
fn lease_run_never_terminates_a_group_it_did_not_start() {
    use std::os::unix::process::CommandExt;
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    common::succeeds(&["create", "lease", p(&l)]);
    let mut bystander = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = bystander.id();
    {
        let lease = cxc::OwnerLease::<u64>::open(&l).unwrap();
        let g = lease.try_lock().expect("vacant");
        g.write(run_record(1, pgid)).unwrap();
    }
    let o = run_within(
        &["lease", "run", p(&l), "--", "true"],
        Duration::from_secs(5),
    )
    .expect("lease run hung");
    std::thread::sleep(Duration::from_millis(50));
    let alive = bystander.try_wait().unwrap().is_none();
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(
        alive,
        "`cxc lease run` terminated process group {pgid}, which it never started \
         (exit {:?}, stderr {:?})",
        o.0, o.1
    );
}

/// `--kill-after` that could never mean "hung": shorter than 10 ms (every waiter would
/// take over a live holder at once), or on a lease file with manual epochs (no holder
/// would ever look stale, so the option would silently do nothing). Both exit 2 without
/// running the command.
#[test]
fn lease_run_refuses_a_kill_after_that_cannot_work() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");
    let touch = format!("touch {}", p(&marker));
    let clock = d.path().join("clock");
    let manual = d.path().join("manual");
    common::succeeds(&["create", "lease", p(&manual), "--manual-epochs"]);
    for (file, after) in [(&clock, "0"), (&clock, "9ms"), (&manual, "1s")] {
        let o = run_within(
            &["lease", "run", p(file), "--kill-after", after, "-c", &touch],
            Duration::from_secs(5),
        )
        .expect("lease run hung");
        assert_eq!(o.0, Some(2), "--kill-after {after} on {file:?}: {}", o.1);
        assert!(o.1.contains("--kill-after"), "{}", o.1);
        assert!(!marker.exists(), "--kill-after {after}: the command ran");
    }
    // The shortest accepted value runs.
    let o = run_within(
        &[
            "lease",
            "run",
            p(&clock),
            "--kill-after",
            "10ms",
            "-c",
            &touch,
        ],
        Duration::from_secs(5),
    )
    .expect("lease run hung");
    assert_eq!(o.0, Some(0), "{}", o.1);
    assert!(marker.exists());
}

/// The half-exited command of `a_half_exited_command_keeps_its_run_going`: the main
/// thread exits, another thread runs on for 1.5 s and then leaves the `done` marker.
fn half_exited_command(dir: &Path) -> ! {
    let done = dir.join("done");
    assert!(cxc_testkit::exit_main_thread());
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(done, b"").unwrap();
    std::process::exit(0)
}

/// A process of the command whose main thread exited while another thread runs (the
/// pattern `pthread_exit(3)` recommends; /proc shows it as `Z`) is alive: the run keeps
/// the lease until it is gone (here the command's shell exits at once and leaves that
/// process in the group), so the next run starts only after it.
#[test]
fn a_half_exited_command_keeps_its_run_going() {
    if let Some(dir) = std::env::var_os("CXC_TEST_HALFEXIT") {
        half_exited_command(Path::new(&dir));
    }
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    let exe = std::env::current_exe().unwrap();
    let first = format!(
        "CXC_TEST_HALFEXIT={} {} --exact a_half_exited_command_keeps_its_run_going --nocapture >/dev/null 2>&1 &",
        p(d.path()),
        p(&exe)
    );
    let o = run_within(
        &["lease", "run", p(&l), "-c", &first],
        Duration::from_secs(10),
    )
    .expect("first run hung");
    assert_eq!(o.0, Some(0), "{}", o.1);
    let done = d.path().join("done");
    let second = format!(
        "if test -f {done}; then touch {ok}; else touch {early}; fi",
        done = p(&done),
        ok = p(&d.path().join("ok")),
        early = p(&d.path().join("early"))
    );
    let o = run_within(
        &["lease", "run", p(&l), "-c", &second],
        Duration::from_secs(10),
    )
    .expect("second run hung");
    assert_eq!(o.0, Some(0), "{}", o.1);
    assert!(
        d.path().join("ok").exists() && !d.path().join("early").exists(),
        "the second run started while the first run's half-exited process still ran"
    );
}

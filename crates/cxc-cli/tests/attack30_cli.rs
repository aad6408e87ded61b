//! Thirtieth round of attacks on `cxc lease run`, `cxc sem run` and `cxc rwlock run`
//! (docs/cli.md, "How `run` keeps one job at a time"): seeded chaos on queues of runs
//! (wrappers and keepers SIGKILLed, SIGSTOPped and SIGTERMed at random moments, commands
//! whose children outlive them), a run nested in another run, a run that loses its claim
//! while it ends an orphan, `-w` over both waits of `sem run`, stopped waiters at a
//! handover, a half-exited command leader, and a killed keeper's pid reused.
//!
//! Overlap is judged by the kernel, not by timestamps: every job opens a detector file
//! on fd 9 and takes `flock -n` on it (exclusive for a lease or a write lock, shared for a
//! read lock, one of N slot files for a semaphore of N permits). The fd is inherited by
//! every process the job starts and the kernel drops the lock only when the last of them
//! is gone (even by SIGKILL), so a job that finds the detector taken started while
//! another job (or a surviving piece of it) still ran: it logs `overlap`.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cxc_testkit::Rng;
use rustix::process::{Pid, Signal};

mod common;
use common::{Job, alive, cxc, logged, p, read_log};

/// How a job checks that it runs alone (or with at most N others).
#[derive(Clone, Copy)]
enum Detector {
    /// Alone: `flock -x -n` on `det`.
    Exclusive,
    /// Beside other shared jobs only: `flock -s -n` on `det`.
    Shared,
    /// At most N at once: `flock -n` on one of `det.0` .. `det.N-1`.
    Slots(usize),
}

/// A job's shell script: takes its detector on fd 9 (logging `overlap ID NS` if it is
/// taken), logs `start ID PID NS`, runs `body`, logs `end ID NS`.
fn job_script(dir: &Path, log: &Path, id: usize, det: Detector, body: &str) -> String {
    let (d, l) = (p(dir), p(log));
    let take = match det {
        Detector::Exclusive => format!("exec 9>>{d}/det; flock -x -n 9 || bad=1"),
        Detector::Shared => format!("exec 9>>{d}/det; flock -s -n 9 || bad=1"),
        Detector::Slots(n) => {
            let slots: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            format!(
                "bad=1; for i in {}; do exec 9>>{d}/det.$i; if flock -n 9; then bad=; break; \
                 fi; exec 9>&-; done",
                slots.join(" ")
            )
        }
    };
    format!(
        "{take}; [ -z \"$bad\" ] || echo overlap {id} $(date +%s%N) >> {l}; \
         echo start {id} $$ $(date +%s%N) >> {l}; {body}; echo end {id} $(date +%s%N) >> {l}"
    )
}

/// The detector catches what it is meant to: `n` + 1 jobs of `det` (or, for
/// [`Detector::Shared`], a shared job beside an exclusive one) started with plain `sh`,
/// no claim at all, log an overlap. Makes sure the chaos tests can fail.
fn detector_catches_overlap(det: Detector) {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("log");
    let (first, n) = match det {
        Detector::Shared => (Detector::Exclusive, 1),
        Detector::Exclusive => (det, 1),
        Detector::Slots(n) => (det, n),
    };
    let mut held: Vec<std::process::Child> = (0..n)
        .map(|i| {
            let s = job_script(d.path(), &log, i, first, "(sleep 5) & :");
            std::process::Command::new("sh")
                .args(["-c", &s])
                .process_group(0)
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in held.iter_mut().enumerate() {
        assert!(logged(&log, "end", i, Duration::from_secs(5)).is_some());
        c.wait().unwrap();
    }
    let s = job_script(d.path(), &log, n, det, "true");
    let ok = std::process::Command::new("sh")
        .args(["-c", &s])
        .status()
        .unwrap();
    assert!(ok.success());
    let bad = overlaps(&log);
    for i in 0..n {
        if let Some(pid) = started_pid(&log, i) {
            let _ = rustix::process::kill_process_group(
                Pid::from_raw(pid as i32).unwrap(),
                Signal::KILL,
            );
        }
    }
    assert_eq!(bad.len(), 1, "the detector missed an overlap: {bad:?}");
    assert!(bad[0].starts_with(&format!("overlap {n} ")), "{bad:?}");
}

/// The `overlap` lines of the log.
fn overlaps(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("overlap"))
        .map(str::to_string)
        .collect()
}

/// The pid job `id` logged at its start (`start ID PID NS`).
fn started_pid(log: &Path, id: usize) -> Option<u32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[0] == "start" && f[1] == id.to_string())
                .then(|| f[2].parse().ok())
                .flatten()
        })
}

/// The time (ns) job `id` logged at its start (`start ID PID NS`).
fn start_ns(log: &Path, id: usize) -> Option<u128> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[0] == "start" && f[1] == id.to_string())
                .then(|| f[3].parse().ok())
                .flatten()
        })
}

/// The keeper the wrapper `w` started, if it started one yet (no waiting).
fn keeper_now(w: u32) -> Option<Pid> {
    std::fs::read_to_string(format!("/proc/{w}/task/{w}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
        .and_then(Pid::from_raw)
}

fn wait_for(what: &str, t: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + t;
    while !cond() {
        assert!(Instant::now() < end, "{what}: never happened within {t:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The process group the run record in a payload word names (`supervise/held.rs`,
/// `Record`: tag 0xC5 in the top byte, the group in the low 32 bits).
fn recorded_group(word: u64) -> Option<u32> {
    (word >> 56 == 0xC5)
        .then_some(word as u32)
        .filter(|g| *g != 0)
}

/// The group a lease file's run record names.
fn lease_group(l: &Path) -> Option<u32> {
    recorded_group(cxc::lease::inspect(l).ok()?.payload_words[0])
}

/// The group an rwlock file's run record names.
fn rwlock_group(r: &Path) -> Option<u32> {
    recorded_group(cxc::SharedRwLock::<()>::inspect(r).ok()?.payload_words[0])
}

/// The exit code of a finished wrapper (128 + S for signal S), without waiting.
fn try_code(job: &mut Job) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    let s = job.0.try_wait().unwrap()?;
    Some(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)))
}

/// `cxc ARGS` with stderr to `err`.
fn start_logged(args: &[&str], err: &Path) -> Job {
    let f = File::create(err).unwrap();
    Job(cxc(args).stderr(Stdio::from(f)).spawn().expect("spawn cxc"))
}

/// Which command a chaos run uses, and what may be done to it.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Lease,
    Sem(usize),
    RwShared,
    RwExclusive,
}

impl Kind {
    fn detector(self) -> Detector {
        match self {
            Kind::Lease | Kind::RwExclusive => Detector::Exclusive,
            Kind::RwShared => Detector::Shared,
            Kind::Sem(n) => Detector::Slots(n),
        }
    }

    fn args(self, file: &Path) -> Vec<String> {
        let f = p(file).to_string();
        let v: Vec<&str> = match self {
            Kind::Lease => vec!["lease", "run", &f],
            Kind::Sem(_) => vec!["sem", "run", &f, "-j"],
            Kind::RwShared => vec!["rwlock", "run", "-s", &f],
            Kind::RwExclusive => vec!["rwlock", "run", "-x", &f],
        };
        let mut v: Vec<String> = v.into_iter().map(String::from).collect();
        if let Kind::Sem(n) = self {
            v.push(n.to_string());
        }
        v
    }

    /// Whether SIGKILL of its keeper is covered by the docs: the exclusive runs record
    /// their command's group ("What this does not cover": not `sem run`, not `--shared`).
    fn keeper_kill_covered(self) -> bool {
        matches!(self, Kind::Lease | Kind::RwExclusive)
    }
}

/// One run of a chaos test.
struct Run {
    id: usize,
    kind: Kind,
    job: Job,
    /// What was done to it (empty: nothing but stops).
    harmed: Vec<&'static str>,
    stopped: Vec<(Pid, Instant)>,
    code: Option<i32>,
}

/// Seeded chaos on one file: `total` runs of the kinds `kinds` picks from, at most
/// `live` at a time; at random moments a wrapper is SIGKILLed, SIGTERMed or SIGSTOPped
/// (resumed later), a keeper SIGSTOPped for up to `max_keeper_stop` (resumed later) or,
/// where the docs cover it and once the run's group is recorded, SIGKILLed. Commands
/// are short sleeps, some leave a child behind that outlives them, a few ignore SIGTERM.
/// Asserts that no job ever found its detector taken, and that every run that was not
/// killed or terminated ran its command and exited 0.
fn chaos(
    file: &Path,
    kinds: &dyn Fn(&mut Rng) -> Kind,
    total: usize,
    live: usize,
    max_keeper_stop: Duration,
    group_of: &dyn Fn(&Path) -> Option<u32>,
) {
    detector_catches_overlap(kinds(&mut Rng::new(0)).detector());
    let mut rng = Rng::for_test();
    let seed = rng.seed();
    println!("chaos seed {seed:#x} (replay with CXC_TEST_SEED={seed:#x})");
    let d = file.parent().unwrap().to_path_buf();
    let log = d.join("log");
    let mut runs: Vec<Run> = Vec::new();
    let mut next = 0;
    let mut stubborn = 0;
    let mut stops = 0;
    let began = Instant::now();
    let mut actions: Vec<String> = Vec::new();
    while next < total || runs.iter().any(|r| r.code.is_none()) {
        assert!(
            began.elapsed() < Duration::from_secs(25),
            "seed {seed:#x}: chaos did not finish; actions {actions:?}, log {:?}",
            read_log(&log)
        );
        // Resume what is due.
        for r in &mut runs {
            r.stopped.retain(|(pid, until)| {
                if Instant::now() >= *until {
                    let _ = rustix::process::kill_process(*pid, Signal::CONT);
                    false
                } else {
                    true
                }
            });
            if r.code.is_none()
                && r.stopped.is_empty()
                && let Some(c) = try_code(&mut r.job)
            {
                r.code = Some(c);
            }
        }
        let running: Vec<usize> = (0..runs.len())
            .filter(|i| runs[*i].code.is_none())
            .collect();
        let roll = rng.below(100);
        if next < total && running.len() < live && (roll < 45 || running.is_empty()) {
            let kind = kinds(&mut rng);
            let body = match rng.below(16) {
                0 if stubborn < 2 => {
                    stubborn += 1;
                    "trap '' TERM; sleep 0.3".to_string()
                }
                1..=4 => format!("(sleep 0.{}) & :", 1 + rng.below(3)),
                5..=7 => format!("sleep 0.{} & wait", 1 + rng.below(2)),
                _ => format!("sleep 0.0{}", 1 + rng.below(9)),
            };
            let s = job_script(&d, &log, next, kind.detector(), &body);
            let mut a = kind.args(file);
            a.extend(["--", "sh", "-c", &s].map(String::from));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            runs.push(Run {
                id: next,
                kind,
                job: Job::start(&a),
                harmed: Vec::new(),
                stopped: Vec::new(),
                code: None,
            });
            next += 1;
        } else if !running.is_empty() && roll >= 45 {
            let i = running[rng.below(running.len() as u64) as usize];
            let r = &mut runs[i];
            let wrapper = r.job.pid();
            let keeper = keeper_now(wrapper.as_raw_nonzero().get() as u32);
            let hold = Duration::from_millis(20 + rng.below(250));
            match roll {
                45..=54 => {
                    r.job.signal(Signal::KILL);
                    r.harmed.push("wrapper SIGKILL");
                }
                55..=59 => {
                    r.job.signal(Signal::TERM);
                    r.harmed.push("wrapper SIGTERM");
                }
                60..=74 => {
                    r.job.signal(Signal::STOP);
                    r.stopped.push((wrapper, Instant::now() + hold));
                    stops += 1;
                }
                75..=89 => {
                    if let Some(k) = keeper {
                        let hold = hold.min(max_keeper_stop);
                        let _ = rustix::process::kill_process(k, Signal::STOP);
                        r.stopped.push((k, Instant::now() + hold));
                        stops += 1;
                    }
                }
                _ => {
                    // A keeper SIGKILLed once its run's group is recorded (a keeper
                    // killed between starting its command and recording it is the
                    // documented exception).
                    let recorded = started_pid(&log, r.id).is_some_and(|pid| {
                        group_of(file) == Some(pid) && alive(pid) && r.stopped.is_empty()
                    });
                    if r.kind.keeper_kill_covered()
                        && recorded
                        && let Some(k) = keeper
                    {
                        let _ = rustix::process::kill_process(k, Signal::KILL);
                        r.harmed.push("keeper SIGKILL");
                    }
                }
            }
            actions.push(format!("{}: {:?} {:?}", r.id, roll, r.harmed));
        }
        std::thread::sleep(Duration::from_millis(rng.below(40)));
    }
    // A last run (of the first kind) ends any orphan a killed keeper left.
    let kind = kinds(&mut Rng::new(seed));
    let s = job_script(&d, &log, total, kind.detector(), "true");
    let mut a = kind.args(file);
    a.extend(["--", "sh", "-c", &s].map(String::from));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut last = Job::start(&a);
    assert_eq!(last.wait(Duration::from_secs(10)), Some(0), "the last run");
    let bad = overlaps(&log);
    let harmed = runs.iter().filter(|r| !r.harmed.is_empty()).count();
    let ran = read_log(&log).iter().filter(|e| e.0 == "start").count();
    let count = |what: &str| {
        runs.iter()
            .flat_map(|r| &r.harmed)
            .filter(|h| **h == what)
            .count()
    };
    println!(
        "seed {seed:#x}: {total} runs, {harmed} killed or terminated (wrapper SIGKILL {}, \
         wrapper SIGTERM {}, keeper SIGKILL {}), {stops} stops, {ran} commands started, \
         {} overlaps",
        count("wrapper SIGKILL"),
        count("wrapper SIGTERM"),
        count("keeper SIGKILL"),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "seed {seed:#x}: jobs ran beside another: {bad:?}\nruns: {:?}",
        runs.iter()
            .map(|r| (r.id, r.harmed.clone(), r.code))
            .collect::<Vec<_>>()
    );
    for r in &runs {
        if r.harmed.is_empty() {
            assert_eq!(
                r.code,
                Some(0),
                "seed {seed:#x}: run {} was only stopped and resumed",
                r.id
            );
            assert!(
                logged(&log, "start", r.id, Duration::ZERO).is_some(),
                "seed {seed:#x}: run {} never ran its command",
                r.id
            );
        }
    }
}

/// docs/cli.md: "the claim is held on behalf of the command's process group whatever
/// happens to the wrapper"; "If the wrapper dies (even `kill -9`), the keeper ...
/// terminates the command's group ... The claim is given back only when no live
/// (non-zombie) process is left in the group"; "Without `--kill-after` a live holder is
/// never replaced, however long it runs or stalls"; point 5 for a SIGKILLed keeper.
/// Seeded chaos on `cxc lease run`: wrappers SIGKILLed/SIGTERMed/SIGSTOPped at any moment
/// (before, while and after the command starts), keepers SIGSTOPped (any time) and
/// SIGKILLed (once the group is recorded), commands leaving children behind.
#[test]
fn lease_run_chaos_never_runs_two_jobs_at_once() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    chaos(
        &l,
        &|_| Kind::Lease,
        60,
        6,
        Duration::from_millis(400),
        &lease_group,
    );
}

/// docs/cli.md, `sem run`: "At most `--permits` (`-j`) commands hold a permit at once
/// across all shells", with the keeper design of `lease run`. Seeded chaos as for the
/// lease (no keeper SIGKILL: not covered for `sem run`), 2 permits.
#[test]
fn sem_run_chaos_never_runs_more_than_permits() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    chaos(
        &s,
        &|_| Kind::Sem(2),
        60,
        7,
        Duration::from_millis(400),
        &|_| None,
    );
}

/// docs/cli.md, `rwlock run`: "any number of shared runs at once ..., none together with
/// an exclusive one. `--exclusive` (`-x`) holds the write lock: alone", with the keeper
/// design of `lease run`. Seeded chaos with shared and exclusive runs mixed; keepers are
/// stopped for less than the file's grace (1 s: a keeper stopped longer between its last
/// check and starting its command is a documented exception), and only exclusive keepers
/// are SIGKILLed.
#[test]
fn rwlock_run_chaos_never_runs_a_writer_beside_anyone() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path().join("r");
    chaos(
        &r,
        &|rng| {
            if rng.below(5) < 2 {
                Kind::RwExclusive
            } else {
                Kind::RwShared
            }
        },
        60,
        6,
        Duration::from_millis(400),
        &rwlock_group,
    );
}

/// docs/cli.md: "flock(1)'s lock lasts while the command holds the descriptor, whatever
/// happens to flock itself. `cxc lease run` and `cxc sem run` give the same promise for
/// the command's process group"; point 4: "If the wrapper dies (even `kill -9`), the
/// keeper ... terminates the command's group: SIGTERM, SIGKILL 2 s later. The claim is
/// given back only when no live (non-zombie) process is left in the group"; the table
/// maps `flock FILE CMD` to `cxc lease run FILE -- CMD`. Here CMD is itself a run (as
/// `flock A flock B CMD`): `cxc lease run L -- cxc sem run S -j 1 -- JOB`, where JOB
/// shuts down in 3 s on SIGTERM (a graceful cleanup that SIGTERM does not interrupt).
/// The outer wrapper is SIGKILLed; a second `cxc lease run L` waits. The second job must
/// not start while the first job (the command run on the first claim) still runs.
#[test]
fn a_run_nested_in_a_run_keeps_the_outer_claim_until_the_inner_command_ends() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let (outer, pid0) = nested_run_with_slow_cleanup(d.path(), &[]);
    let s1 = job_script(d.path(), &log, 1, Detector::Exclusive, "true");
    let mut next = Job::start(&["lease", "run", p(&l), "--", "sh", "-c", &s1]);
    std::thread::sleep(Duration::from_millis(200));
    outer.signal(Signal::KILL);
    let killed = Instant::now();
    assert_eq!(
        next.wait(Duration::from_secs(15)),
        Some(0),
        "the second run"
    );
    let beside_ms = cleanup_beside_ms(&log);
    println!(
        "job 0 (pid {pid0}) ran on {beside_ms:?} ms after job 1 started; job 1 done {:?} after \
         the outer wrapper was killed",
        killed.elapsed()
    );
    let bad = overlaps(&log);
    assert!(
        bad.is_empty(),
        "job 1 started while job 0 (the command of the first `lease run`, inside its nested \
         `sem run`) still ran: {bad:?}; job 0 ran on {beside_ms:?} ms after job 1 started"
    );
}

/// `cxc lease run DIR/l OPTS -- cxc sem run DIR/s -j 1 -- job 0` (logging to DIR/log),
/// where job 0 answers SIGTERM with a 3 s cleanup (then logs `cleaned 0`); returns the
/// outer wrapper and job 0's pid once job 0 has started its `sleep 30` (a TERM before it
/// would end the job at once).
fn nested_run_with_slow_cleanup(dir: &Path, lease_opts: &[&str]) -> (Job, u32) {
    let (l, s, log) = (dir.join("l"), dir.join("s"), dir.join("log"));
    let lg = p(&log);
    let cleanup = format!(
        "trap 'trap \"\" TERM; sleep 3; echo cleaned 0 $(date +%s%N) >> {lg}; exit 0' TERM; \
         sleep 30 & wait"
    );
    let s0 = job_script(dir, &log, 0, Detector::Exclusive, &cleanup);
    let mut args = vec!["lease", "run", p(&l)];
    args.extend_from_slice(lease_opts);
    args.extend_from_slice(&[
        "--",
        env!("CARGO_BIN_EXE_cxc"),
        "sem",
        "run",
        p(&s),
        "-j",
        "1",
        "--",
        "sh",
        "-c",
        &s0,
    ]);
    let outer = Job::start(&args);
    let pid0 = (0..2000)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(5));
            started_pid(&log, 0)
        })
        .expect("job 0 never started");
    std::thread::sleep(Duration::from_millis(200));
    (outer, pid0)
}

/// How long job 0's cleanup still ran after job 1 started (ms; negative: it had ended),
/// from the log of [`nested_run_with_slow_cleanup`].
fn cleanup_beside_ms(log: &Path) -> Option<i128> {
    logged(log, "cleaned", 0, Duration::from_secs(5))
        .zip(start_ns(log, 1))
        .map(|(cleaned, start1)| (cleaned as i128 - start1 as i128) / 1_000_000)
}

/// The same nesting, taken over with `--kill-after` (docs/cli.md point 5): the outer
/// run's keeper is SIGSTOPped, a waiting run sees its heartbeat stale, ends the recorded
/// group (which holds only the nested `sem run` wrapper; it forwards the SIGTERM and
/// waits for its keeper, and is SIGKILLed 2 s later) and must not start its command while
/// the nested run's command still runs its 3 s cleanup. Before the fix the taker ran its
/// command once the recorded group was gone, about 1 s before job 0 ended.
#[test]
fn a_takeover_from_a_stopped_nested_run_waits_for_the_inner_command() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let (mut outer, _) = nested_run_with_slow_cleanup(d.path(), &["--kill-after", "300ms"]);
    let keeper = outer.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let s1 = job_script(d.path(), &log, 1, Detector::Exclusive, "true");
    let mut next = Job::start(&[
        "lease",
        "run",
        p(&l),
        "--kill-after",
        "300ms",
        "--",
        "sh",
        "-c",
        &s1,
    ]);
    let code = next.wait(Duration::from_secs(20));
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    assert_eq!(code, Some(0), "the run that took the lease over");
    assert_eq!(
        outer.wait(Duration::from_secs(10)),
        Some(75),
        "the superseded run, resumed"
    );
    let beside_ms = cleanup_beside_ms(&log);
    let bad = overlaps(&log);
    assert!(
        bad.is_empty(),
        "job 1 started while job 0 (the command of a `sem run` nested in the stopped \
         `lease run`) still ran: {bad:?}; job 0 ran on {beside_ms:?} ms after job 1 started"
    );
}

/// docs/cli.md point 5: a run that takes the lease over "first terminates a recorded
/// group that still has live members ... It renews its own claim meanwhile ... and
/// starts its command only if the claim is still its own afterwards; otherwise it exits
/// 75 without running anything, and the run that took the claim over goes on". Job 0
/// ignores SIGTERM and its keeper is SIGKILLed; run 1 takes over at once and starts
/// ending group 0 (2 s until SIGKILL); run 1's keeper is then SIGSTOPped, and run 2
/// (`--kill-after 300ms`) takes the lease from it, ends group 0 itself and runs. Run 1,
/// resumed, exits 75 and its command never runs.
#[test]
fn a_run_stopped_while_ending_an_orphan_exits_75_without_running() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let run = |id: usize, body: &str| -> Vec<String> {
        let s = job_script(d.path(), &log, id, Detector::Exclusive, body);
        [
            "lease",
            "run",
            p(&l),
            "--kill-after",
            "300ms",
            "--",
            "sh",
            "-c",
            &s,
        ]
        .map(String::from)
        .to_vec()
    };
    let a0 = run(0, "trap '' TERM; sleep 30");
    let a0: Vec<&str> = a0.iter().map(String::as_str).collect();
    let mut j0 = Job::start(&a0);
    let mut pid0 = None;
    wait_for("job 0 recorded", Duration::from_secs(10), || {
        pid0 = started_pid(&log, 0);
        pid0.is_some() && lease_group(&l) == pid0
    });
    let pid0 = pid0.unwrap();
    rustix::process::kill_process(j0.keeper(), Signal::KILL).unwrap();
    assert!(j0.wait(Duration::from_secs(5)).is_some());
    let err1 = d.path().join("err1");
    let a1 = run(1, "true");
    let a1: Vec<&str> = a1.iter().map(String::as_str).collect();
    let mut j1 = start_logged(&a1, &err1);
    wait_for("run 1 ending group 0", Duration::from_secs(10), || {
        std::fs::read_to_string(&err1).is_ok_and(|e| e.contains("terminating it before running"))
    });
    let k1 = j1.keeper();
    rustix::process::kill_process(k1, Signal::STOP).unwrap();
    let a2 = run(2, "true");
    let a2: Vec<&str> = a2.iter().map(String::as_str).collect();
    let mut j2 = Job::start(&a2);
    let code2 = j2.wait(Duration::from_secs(15));
    let group0_alive = alive(pid0);
    rustix::process::kill_process(k1, Signal::CONT).unwrap();
    let code1 = j1.wait(Duration::from_secs(10));
    let _ = rustix::process::kill_process_group(Pid::from_raw(pid0 as i32).unwrap(), Signal::KILL);
    assert_eq!(code2, Some(0), "run 2 did not take over and run");
    assert!(!group0_alive, "run 2 ended while job 0 still ran");
    assert_eq!(
        code1,
        Some(75),
        "run 1 (stopped while ending group 0): {}",
        std::fs::read_to_string(&err1).unwrap_or_default()
    );
    assert!(
        logged(&log, "start", 1, Duration::ZERO).is_none(),
        "run 1 ran its command after losing the lease: {:?}",
        read_log(&log)
    );
    assert!(overlaps(&log).is_empty(), "{:?}", overlaps(&log));
}

/// docs/cli.md, `sem run`: "when every slot belongs to a live run ..., a run waits for a
/// slot to free (trying every 20 ms) as it waits for a permit: `-n`, `-w` and signals
/// apply to both waits together". A file of 1 permit and 2 holder slots: run A holds the
/// permit, run B waits for it (the second slot). `-n -E 7` finds no slot: exit 7 at once.
/// `-w 2 -E 9` waits 1 s for a slot (B is then killed), then for the permit: it must give
/// up 2 s after it started in all, not 2 s after it got the slot.
#[test]
fn sem_run_wait_bounds_the_slot_wait_and_the_permit_wait_together() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    let (ma, mb, mc) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
    let sem = |extra: &[&str], marker: &Path| -> Vec<String> {
        let mut v: Vec<String> = ["sem", "run", p(&s), "-j", "1", "--holders", "2"]
            .map(String::from)
            .to_vec();
        v.extend(extra.iter().map(|x| x.to_string()));
        v.extend(["-c".to_string(), format!("touch {}; sleep 30", p(marker))]);
        v
    };
    let a = sem(&[], &ma);
    let _a = Job::start(&a.iter().map(String::as_str).collect::<Vec<_>>());
    wait_for("run A", Duration::from_secs(10), || ma.exists());
    let b = sem(&[], &mb);
    let jb = Job::start(&b.iter().map(String::as_str).collect::<Vec<_>>());
    wait_for("run B in the holder table", Duration::from_secs(10), || {
        cxc::SharedSemaphore::inspect(&s).is_ok_and(|st| st.holders.len() == 2)
    });
    let n = sem(&["-n", "-E", "7"], &mc);
    let t = Instant::now();
    let o = cxc(&n.iter().map(String::as_str).collect::<Vec<_>>())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "-n with every slot taken: {o:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let w = sem(&["-w", "2", "-E", "9"], &mc);
    let t = Instant::now();
    let mut jc = Job::start(&w.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
    assert!(try_code(&mut jc).is_none(), "-w 2 gave up within 1 s");
    jb.signal(Signal::KILL);
    let code = jc.wait(Duration::from_secs(6));
    let took = t.elapsed();
    println!("-w 2 over a 1 s slot wait and a permit wait: exit {code:?} after {took:?}");
    assert_eq!(code, Some(9));
    assert!(
        took >= Duration::from_millis(1950) && took < Duration::from_millis(2700),
        "-w 2 gave up after {took:?} (a slot after ~1 s, then the permit)"
    );
    assert!(!mb.exists() && !mc.exists());
}

/// docs/cli.md point 2: "A waiting keeper blocks in one call of the lease's (or
/// semaphore's) blocking acquire, woken by the release"; "the next job starts about as
/// soon as the previous group is gone". A waiter whose keeper is SIGSTOPped while it
/// waits must not hold up the handover: holder 0 ends, run 1 (keeper stopped) cannot
/// take the claim, run 2 (started after it) must. Run 1, resumed, runs after run 2, alone.
#[test]
fn a_stopped_waiting_keeper_does_not_hold_up_the_handover() {
    for kind in [Kind::Lease, Kind::Sem(1)] {
        let d = tempfile::tempdir().unwrap();
        let (f, log) = (d.path().join("f"), d.path().join("log"));
        let start = |id: usize, body: &str| {
            let s = job_script(d.path(), &log, id, kind.detector(), body);
            let mut a = kind.args(&f);
            a.extend(["--", "sh", "-c", &s].map(String::from));
            Job::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let mut j0 = start(0, "sleep 0.5");
        wait_for("job 0", Duration::from_secs(10), || {
            start_ns(&log, 0).is_some()
        });
        let mut j1 = start(1, "true");
        let k1 = j1.keeper();
        std::thread::sleep(Duration::from_millis(200));
        rustix::process::kill_process(k1, Signal::STOP).unwrap();
        let mut j2 = start(2, "true");
        assert_eq!(j0.wait(Duration::from_secs(10)), Some(0));
        let ended = Instant::now();
        let code2 = j2.wait(Duration::from_secs(5));
        let took = ended.elapsed();
        let ran1 = start_ns(&log, 1).is_some();
        rustix::process::kill_process(k1, Signal::CONT).unwrap();
        assert_eq!(j1.wait(Duration::from_secs(10)), Some(0));
        println!(
            "{}: run 2 done {took:?} after run 0 ended, with run 1 stopped",
            kind.args(&f)[0]
        );
        assert_eq!(code2, Some(0), "run 2 waited behind a stopped waiter");
        assert!(!ran1, "a stopped keeper ran its command");
        assert!(start_ns(&log, 1) > start_ns(&log, 2));
        assert!(overlaps(&log).is_empty(), "{:?}", overlaps(&log));
    }
}

/// docs/cli.md, `rwlock run`: "Writers are preferred: once an exclusive run waits, new
/// shared runs wait behind it"; a keeper "that stalls past the grace while others wait
/// (stopped, or starved of CPU) loses the lock"; an exclusive run "holds the write lock:
/// alone". A *waiting* exclusive run (installed as the writer, draining a reader) whose
/// keeper is SIGSTOPped past the grace (300 ms) must neither block the shared runs behind
/// it for good nor, once resumed, run its command beside them.
#[test]
fn a_stopped_waiting_writer_neither_blocks_readers_nor_runs_beside_them() {
    let d = tempfile::tempdir().unwrap();
    let (r, log) = (d.path().join("r"), d.path().join("log"));
    common::succeeds(&["create", "rwlock", p(&r), "--grace", "300ms"]);
    let start = |id: usize, kind: Kind, body: &str| {
        let s = job_script(d.path(), &log, id, kind.detector(), body);
        let mut a = kind.args(&r);
        a.extend(["--", "sh", "-c", &s].map(String::from));
        Job::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let mut r0 = start(0, Kind::RwShared, "sleep 0.5");
    wait_for("reader 0", Duration::from_secs(10), || {
        start_ns(&log, 0).is_some()
    });
    let mut x1 = start(1, Kind::RwExclusive, "sleep 0.2");
    let k1 = x1.keeper();
    std::thread::sleep(Duration::from_millis(200));
    rustix::process::kill_process(k1, Signal::STOP).unwrap();
    let stopped = Instant::now();
    let mut r2 = start(2, Kind::RwShared, "sleep 0.5");
    assert_eq!(r0.wait(Duration::from_secs(10)), Some(0));
    let code2 = r2.wait(Duration::from_secs(8));
    let took = stopped.elapsed();
    rustix::process::kill_process(k1, Signal::CONT).unwrap();
    let code1 = x1.wait(Duration::from_secs(10));
    println!(
        "reader 2 done {took:?} after the waiting writer stopped; the writer exited {code1:?}, \
         ran its command: {}",
        start_ns(&log, 1).is_some()
    );
    assert_eq!(code2, Some(0), "a stopped waiting writer blocked a reader");
    assert!(
        matches!(code1, Some(0 | 75)),
        "the resumed writer: {code1:?}"
    );
    assert!(overlaps(&log).is_empty(), "{:?}", overlaps(&log));
}

/// The half-exited command of [`a_half_exited_leader_keeps_sem_and_rwlock_runs_going`]:
/// its main thread exits, another thread runs on for 1 s and leaves the `done` marker.
fn half_exited_leader(dir: &Path) -> ! {
    assert!(cxc_testkit::exit_main_thread());
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::write(dir.join("done"), b"").unwrap();
    std::process::exit(0)
}

/// docs/cli.md: the command's "main thread exiting while a worker thread runs
/// (pthread_exit pattern: the process is alive)" keeps the claim: "the claim is given back
/// only when no live (non-zombie) process is left in the group". `attack_cli` covers a
/// background process of `lease run`'s command; here the command's *leader* itself (the
/// process the keeper started and waits on) is half-exited, under `sem run -j 1` and
/// `rwlock run -x`: the next run starts only after its worker thread ended.
#[test]
fn a_half_exited_leader_keeps_sem_and_rwlock_runs_going() {
    if let Some(dir) = std::env::var_os("CXC_TEST_HALFLEADER") {
        half_exited_leader(Path::new(&dir));
    }
    let exe = std::env::current_exe().unwrap();
    for kind in [Kind::Sem(1), Kind::RwExclusive, Kind::Lease] {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        let mut a = kind.args(&f);
        a.extend(
            [
                "--",
                p(&exe),
                "--exact",
                "a_half_exited_leader_keeps_sem_and_rwlock_runs_going",
                "--nocapture",
            ]
            .map(String::from),
        );
        let first = cxc(&a.iter().map(String::as_str).collect::<Vec<_>>())
            .env("CXC_TEST_HALFLEADER", d.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut first = Job(first);
        // The leader runs (its main thread exits at once; the run must go on).
        std::thread::sleep(Duration::from_millis(300));
        let second = format!(
            "if test -f {done}; then touch {ok}; else touch {early}; fi",
            done = p(&d.path().join("done")),
            ok = p(&d.path().join("ok")),
            early = p(&d.path().join("early"))
        );
        let mut b = kind.args(&f);
        b.extend(["-c".to_string(), second]);
        let mut next = Job::start(&b.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(first.wait(Duration::from_secs(10)), Some(0), "{a:?}");
        assert_eq!(next.wait(Duration::from_secs(10)), Some(0), "{b:?}");
        assert!(
            d.path().join("ok").exists() && !d.path().join("early").exists(),
            "{b:?} started while the first run's half-exited leader still ran"
        );
    }
}

/// Starts `sleep 30` (in a group of its own) as process `want`, through
/// `/proc/sys/kernel/ns_last_pid` (root); `None` if other processes keep taking the pid.
fn spawn_with_pid(want: u32) -> Option<std::process::Child> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).ok()?;
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .ok()?;
        if c.id() == want {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
        if alive(want) {
            return None;
        }
    }
    None
}

/// docs/cli.md: "a dead holder (its keeper process gone ...) is replaced at once" (`lease
/// run`), "the permits of killed holders always come back" (`sem run`), "a process that
/// dies holding the lock is reclaimed by the next waiter" (`rwlock run`); the brief's
/// "a reused pid". A keeper holding the claim is SIGKILLed, its command ends, and an
/// unrelated process is started with the dead keeper's pid (root only:
/// `ns_last_pid`). The next run must take the claim at once, not wait on the live
/// process that now carries the holder's pid.
#[test]
fn a_killed_keeper_s_reused_pid_does_not_keep_its_claim() {
    if !rustix::process::geteuid().is_root() {
        println!("skipped: needs root to choose a pid (ns_last_pid)");
        return;
    }
    for kind in [Kind::Lease, Kind::Sem(1), Kind::RwExclusive] {
        let d = tempfile::tempdir().unwrap();
        let (f, log) = (d.path().join("f"), d.path().join("log"));
        let start = |id: usize, body: &str| {
            let s = job_script(d.path(), &log, id, kind.detector(), body);
            let mut a = kind.args(&f);
            a.extend(["-w", "10", "--", "sh", "-c", &s].map(String::from));
            Job::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let mut j0 = start(0, "sleep 0.3");
        wait_for("job 0", Duration::from_secs(10), || {
            start_ns(&log, 0).is_some()
        });
        let k0 = j0.keeper();
        rustix::process::kill_process(k0, Signal::KILL).unwrap();
        assert!(j0.wait(Duration::from_secs(5)).is_some());
        wait_for("job 0's end", Duration::from_secs(5), || {
            logged(&log, "end", 0, Duration::ZERO).is_some()
                && !started_pid(&log, 0).is_some_and(alive)
        });
        let name = kind.args(&f)[0].clone();
        let k0 = k0.as_raw_nonzero().get() as u32;
        let Some(mut reused) = spawn_with_pid(k0) else {
            println!("{name}: pid {k0} taken by another process first; case skipped");
            continue;
        };
        let t = Instant::now();
        let mut j1 = start(1, "true");
        let code = j1.wait(Duration::from_secs(12));
        let took = t.elapsed();
        let _ = reused.kill();
        let _ = reused.wait();
        println!("{name}: run 1 done {took:?} after the dead keeper's pid {k0} was reused");
        assert_eq!(
            code,
            Some(0),
            "{name}: the claim stayed with the reused pid {k0}"
        );
        assert!(took < Duration::from_secs(3), "{name}: {took:?}");
        assert!(overlaps(&log).is_empty(), "{:?}", overlaps(&log));
    }
}

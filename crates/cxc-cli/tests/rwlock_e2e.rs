//! End-to-end tests of `cxc create rwlock` and `cxc rwlock run --shared|--exclusive` on
//! the built binary: shared runs overlap, an exclusive run overlaps nothing, and killing
//! a wrapper (or an exclusive run's keeper) with SIGKILL never lets an exclusive run
//! start while the killed run's command still runs. Jobs log their own start and end
//! (`date +%s%N`, also when terminated by SIGTERM).

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;

mod common;
use common::{Job, cxc, logged, p, read_log};

/// A job that starts `body` in the background, then logs `start ID NS`, waits, and logs
/// `end ID NS` (also when terminated by SIGTERM). `start` is logged once `body` runs, so
/// a signal sent after it reaches `body` too.
fn script(log: &Path, id: usize, body: &str) -> String {
    let l = p(log);
    format!(
        "trap 'echo end {id} $(date +%s%N) >> {l}; exit 0' TERM; {body} & \
         echo start {id} $(date +%s%N) >> {l}; wait; echo end {id} $(date +%s%N) >> {l}"
    )
}

fn run_args<'a>(mode: &'a str, lock: &'a str, s: &'a str) -> Vec<&'a str> {
    vec!["rwlock", "run", mode, lock, "--", "sh", "-c", s]
}

/// Starts job 0 (`sleep 30`) in `mode` on `lock` and waits until it runs.
fn first_holder(log: &Path, lock: &str, mode: &str) -> Job {
    let s0 = script(log, 0, "sleep 30");
    let holder = Job::start(&run_args(mode, lock, &s0));
    assert!(logged(log, "start", 0, Duration::from_secs(10)).is_some());
    holder
}

/// The (start, end) of job `id` from the log.
fn span(log: &Path, id: usize) -> (u128, u128) {
    let entries = read_log(log);
    let s = entries.iter().find(|e| e.0 == "start" && e.1 == id);
    let e = entries.iter().find(|e| e.0 == "end" && e.1 == id);
    match (s, e) {
        (Some(s), Some(e)) => (s.2, e.2),
        _ => panic!("job {id} has no start or end: {entries:?}"),
    }
}

/// No exclusive job's span overlaps any other job's span.
fn assert_exclusive_alone(log: &Path, jobs: &[(usize, bool)]) {
    let spans: Vec<(usize, bool, u128, u128)> = jobs
        .iter()
        .map(|&(id, x)| {
            let (s, e) = span(log, id);
            (id, x, s, e)
        })
        .collect();
    for a in &spans {
        for b in &spans {
            if a.0 == b.0 || !(a.1 || b.1) {
                continue;
            }
            assert!(
                a.3 < b.2 || b.3 < a.2,
                "job {} ({}) [{}, {}] overlaps job {} ({}) [{}, {}]",
                a.0,
                if a.1 { "exclusive" } else { "shared" },
                a.2,
                a.3,
                b.0,
                if b.1 { "exclusive" } else { "shared" },
                b.2,
                b.3
            );
        }
    }
}

#[test]
fn create_rwlock_makes_the_file_rwlock_run_uses() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("made.rw");
    let out = cxc(&[
        "create",
        "rwlock",
        p(&l),
        "--holders",
        "8",
        "--grace",
        "250ms",
    ])
    .output()
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("8 holders"));
    // Created once; a second create is refused (exit 2), naming the path.
    let again = cxc(&["create", "rwlock", p(&l)]).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains(p(&l)));
    // `rwlock run` opens it: the command sees the path and, exclusive, a fencing token.
    let out = cxc(&[
        "rwlock",
        "run",
        "-x",
        p(&l),
        "--",
        "sh",
        "-c",
        "echo \"$CXC_RWLOCK_PATH $CXC_FENCING_TOKEN\"",
    ])
    .output()
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{} 1", p(&l))
    );
    // Neither --shared nor --exclusive, or both: usage error.
    for mode in [&[][..], &["-s", "-x"][..]] {
        let mut a = vec!["rwlock", "run"];
        a.extend_from_slice(mode);
        a.extend([p(&l), "--", "true"]);
        assert_eq!(cxc(&a).output().unwrap().status.code(), Some(2));
    }
    // A file of another kind is refused with exit 2.
    let sem = d.path().join("s.sem");
    assert!(
        cxc(&["create", "sem", p(&sem), "--permits", "1"])
            .output()
            .unwrap()
            .status
            .success()
    );
    let out = cxc(&["rwlock", "run", "-s", p(&sem), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn shared_runs_overlap_and_exclusive_runs_overlap_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l.rw"), d.path().join("log"));
    let lock = p(&l);
    // Three shared runs of 1 s started together: all three run at the same time.
    let scripts: Vec<String> = (0..3).map(|i| script(&log, i, "sleep 1")).collect();
    let mut jobs: Vec<Job> = scripts
        .iter()
        .map(|s| Job::start(&run_args("--shared", lock, s)))
        .collect();
    for j in &mut jobs {
        assert_eq!(j.wait(Duration::from_secs(20)), Some(0));
    }
    let spans: Vec<(u128, u128)> = (0..3).map(|i| span(&log, i)).collect();
    let last_start = spans.iter().map(|s| s.0).max().unwrap();
    let first_end = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        last_start < first_end,
        "shared runs did not overlap: {spans:?}"
    );
    // A mix started at once, exclusive and shared interleaved: every exclusive run is
    // alone, and every run ran.
    let log2 = d.path().join("log2");
    let kinds: Vec<(usize, bool)> = (0..12).map(|i| (i, i % 3 == 0)).collect();
    let scripts: Vec<String> = kinds
        .iter()
        .map(|&(i, _)| script(&log2, i, "sleep 0.2"))
        .collect();
    let mut jobs: Vec<Job> = kinds
        .iter()
        .zip(&scripts)
        .map(|(&(_, x), s)| Job::start(&run_args(if x { "-x" } else { "-s" }, lock, s)))
        .collect();
    for j in &mut jobs {
        assert_eq!(j.wait(Duration::from_secs(60)), Some(0));
    }
    assert_exclusive_alone(&log2, &kinds);
}

/// Holder after holder (a shared or an exclusive run, in turn) is SIGKILLed while an
/// exclusive run waits: the waiting run starts only once the killed run's command ended.
#[test]
fn kill_9_of_a_wrapper_never_lets_an_exclusive_run_overlap() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l.rw"), d.path().join("log"));
    let lock = p(&l);
    let rounds = 12;
    let mut kinds = vec![(0, false)];
    let mut holder = first_holder(&log, lock, "-s");
    for i in 1..=rounds {
        // The next holder is exclusive; every other one of them is followed by a
        // shared holder (so shared holders are killed too).
        let exclusive = i % 2 == 1 || i == rounds;
        kinds.push((i, exclusive));
        let si = script(&log, i, "sleep 30");
        let next = Job::start(&run_args(if exclusive { "-x" } else { "-s" }, lock, &si));
        std::thread::sleep(Duration::from_millis(50));
        holder.signal(Signal::KILL);
        assert!(
            holder.wait(Duration::from_secs(10)).is_some(),
            "round {i}: wrapper did not exit"
        );
        assert!(
            logged(&log, "start", i, Duration::from_secs(10)).is_some(),
            "round {i}: next job never started"
        );
        holder = next;
    }
    // Let the last job's `sleep` exec first: a TERM between the shell's fork and the
    // exec is taken by the shell's trap and lost (the group would then live 30 s).
    std::thread::sleep(Duration::from_millis(200));
    holder.signal(Signal::TERM);
    assert!(
        holder.wait(Duration::from_secs(10)).is_some(),
        "the last wrapper did not exit after SIGTERM"
    );
    assert_exclusive_alone(&log, &kinds);
}

/// The keeper itself (not the wrapper) of an exclusive run is SIGKILLed: its command
/// lives on, the lock is reclaimed, and the next run terminates the recorded command
/// group before it starts its own.
#[test]
fn a_killed_exclusive_keeper_s_command_is_ended_before_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l.rw"), d.path().join("log"));
    let holder = first_holder(&log, p(&l), "-x");
    let lock = p(&l);
    // Let the keeper record the command's group (it does so right after starting it).
    std::thread::sleep(Duration::from_millis(200));
    rustix::process::kill_process(holder.keeper(), Signal::KILL).unwrap();
    for (i, mode) in [(1, "-x"), (2, "-s")] {
        let si = script(&log, i, "true");
        let mut next = Job::start(&run_args(mode, lock, &si));
        assert_eq!(next.wait(Duration::from_secs(20)), Some(0), "run {i}");
    }
    assert_exclusive_alone(&log, &[(0, true), (1, true), (2, false)]);
    drop(holder);
}

/// An exclusive run whose keeper is stopped past the grace while another exclusive run
/// waits is evicted: the waiting run terminates the recorded command group before it
/// starts, and the stopped run, once resumed, exits 75.
#[test]
fn a_stopped_exclusive_keeper_is_evicted_and_its_run_exits_75() {
    let d = tempfile::tempdir().unwrap();
    let (l, log) = (d.path().join("l.rw"), d.path().join("log"));
    let lock = p(&l);
    let made = cxc(&["create", "rwlock", lock, "--grace", "300ms"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let mut holder = first_holder(&log, lock, "-x");
    std::thread::sleep(Duration::from_millis(200));
    let keeper = holder.keeper();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    let s1 = script(&log, 1, "true");
    let t0 = Instant::now();
    let mut next = Job::start(&run_args("-x", lock, &s1));
    assert_eq!(next.wait(Duration::from_secs(20)), Some(0));
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "the stopped keeper was evicted before the grace: {:?}",
        t0.elapsed()
    );
    rustix::process::kill_process(keeper, Signal::CONT).unwrap();
    assert_eq!(holder.wait(Duration::from_secs(10)), Some(75));
    assert_exclusive_alone(&log, &[(0, true), (1, true)]);
}

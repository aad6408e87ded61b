//! Fourth round of attacks on `cxc` (docs/cli.md point 5 and "What this does not cover"):
//! a genuine orphan — the command's group leader exited, its children (which inherited
//! `CXC_RUN_MARK`) still run — left by a keeper killed with SIGKILL must be terminated by
//! the next run before it starts its command, for `lease run` and `rwlock run --exclusive`.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;

mod common;
use common::{Job, alive, cxc, p};

fn wait_for(what: &str, t: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + t;
    while !cond() {
        assert!(Instant::now() < end, "{what}: never happened");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts `run(orphan command)`: the command's leader (`sh`) starts two background
/// children (`sleep 30`, and a `sh` running `sleep 30`) in its group, writes their pids,
/// and exits at once. Once the leader is gone, the keeper is SIGKILLed (then the
/// wrapper). The next `run(probe)` must end both children before its command runs: the
/// probe records whether they were still alive when it started.
fn orphan_case(dir: &Path, run: &dyn Fn(&str) -> Vec<String>) {
    let pids = dir.join("pids");
    let seen = dir.join("seen");
    let orphan = format!(
        "sleep 30 & a=$!; sh -c 'sleep 30' & b=$!; echo $a $b > {}.tmp; mv {0}.tmp {0}; exit 0",
        p(&pids)
    );
    let a = run(&orphan);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut job = Job::start(&a);
    let keeper = job.keeper();
    wait_for("orphan pids", Duration::from_secs(5), || pids.exists());
    let kids: Vec<u32> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(kids.len(), 2);
    // The leader (the keeper's child `sh`) exits right after writing the pids.
    std::thread::sleep(Duration::from_millis(150));
    assert!(kids.iter().all(|k| alive(*k)), "children died early");
    rustix::process::kill_process(keeper, Signal::KILL).unwrap();
    let _ = job.wait(Duration::from_secs(3));
    drop(job);
    std::thread::sleep(Duration::from_millis(50));
    let still: Vec<u32> = kids.iter().copied().filter(|k| alive(*k)).collect();
    assert_eq!(
        still, kids,
        "the orphans did not outlive their keeper (nothing to attack)"
    );
    let probe = format!(
        "for k in {}; do if [ -r /proc/$k/stat ] && ! grep -q ') Z' /proc/$k/stat; then \
         echo alive $k >> {s}; fi; done; echo ran >> {s}",
        kids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        s = p(&seen)
    );
    let b = run(&probe);
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let mut next = cxc(&b)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(4);
    let status = loop {
        if let Some(s) = next.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = next.kill();
            let _ = next.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let survivors: Vec<u32> = kids.iter().copied().filter(|k| alive(*k)).collect();
    for k in &kids {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(*k as i32).unwrap(),
            Signal::KILL,
        );
    }
    let mut err = String::new();
    if let Some(mut e) = next.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let seen = std::fs::read_to_string(&seen).unwrap_or_default();
    assert!(status.is_some(), "the next run hung (stderr {err:?})");
    assert!(
        seen.contains("ran"),
        "the next run never ran its command: {err:?}"
    );
    assert!(
        !seen.contains("alive"),
        "the next run started its command beside the orphan's children: {seen:?} \
         (stderr {err:?})"
    );
    assert!(
        survivors.is_empty(),
        "orphan children {survivors:?} of the killed keeper survived the next run \
         (stderr {err:?})"
    );
}

#[test]
fn lease_run_ends_children_of_an_exited_leader_after_a_keeper_sigkill() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    common::succeeds(&["create", "lease", p(&l)]);
    let l = p(&l).to_string();
    orphan_case(d.path(), &|s: &str| {
        ["lease", "run", &l, "--", "sh", "-c", s]
            .iter()
            .map(ToString::to_string)
            .collect()
    });
}

#[test]
fn rwlock_run_exclusive_ends_children_of_an_exited_leader_after_a_keeper_sigkill() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("r");
    common::succeeds(&["create", "rwlock", p(&l)]);
    let l = p(&l).to_string();
    orphan_case(d.path(), &|s: &str| {
        ["rwlock", "run", "-x", &l, "--", "sh", "-c", s]
            .iter()
            .map(ToString::to_string)
            .collect()
    });
}

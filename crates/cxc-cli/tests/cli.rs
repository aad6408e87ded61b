//! End-to-end tests of the built `cxc` binary.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cxc_testkit::{Proc, wait_for_path};

mod common;
use common::p;

/// Bound on any one `cxc` run (the demo is the longest), so a hang fails the test.
const T: Duration = Duration::from_secs(120);

fn cxc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cxc"))
}

/// Starts `cxc ARGS` (killed if the test panics first).
fn start(args: &[&str]) -> Proc {
    let mut cmd = cxc();
    cmd.args(args);
    Proc::spawn(cmd, &format!("cxc {}", args.join(" ")))
}

/// Starts `cxc lease run LEASE -- sh -c "touch MARKER; BODY"` and waits until its
/// command runs (the marker exists).
fn start_holding(lease: &Path, marker: &Path, body: &str) -> Proc {
    let script = format!("touch {}; {body}", p(marker));
    let holder = start(&["lease", "run", p(lease), "--", "sh", "-c", &script]);
    assert!(
        wait_for_path(marker, Duration::from_secs(10)),
        "the holding run never started"
    );
    holder
}

/// In a fresh directory, starts `n` runs of `cxc CMD RUN FILE [OPTS] -- sh -c SCRIPT`
/// at once (`cmd` is `[CMD, RUN, OPTS...]`; SCRIPT's `$1` is a log file in the same
/// directory), waits for all of them and returns the log's lines.
fn run_at_once(n: usize, cmd: &[&str], script: &str) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let (file, log) = (d.path().join("f"), d.path().join("log"));
    let mut args = cmd.to_vec();
    args.insert(2, p(&file));
    args.extend(["--", "sh", "-c", script, "sh", p(&log)]);
    let mut kids: Vec<Proc> = (0..n).map(|_| start(&args)).collect();
    for k in &mut kids {
        k.finish(T);
    }
    std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn run(args: &[&str]) -> Output {
    start(args).output(T)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn inspect_each_kind_text_and_json() {
    let d = tempfile::tempdir().unwrap();
    let lease = d.path().join("l");
    let hb = d.path().join("h");
    let sem = d.path().join("s");
    assert!(run(&["create", "lease", p(&lease)]).status.success());
    assert!(
        run(&["create", "heartbeat", p(&hb), "--capacity", "8"])
            .status
            .success()
    );
    assert!(
        run(&["create", "sem", p(&sem), "--permits", "3"])
            .status
            .success()
    );
    for (path, kind) in [(&lease, "lease"), (&hb, "heartbeat"), (&sem, "semaphore")] {
        let o = run(&["inspect", p(path)]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).starts_with(kind), "{}", text(&o));
        let o = run(&["inspect", "--json", p(path)]);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
        assert_eq!(v["kind"], kind);
        assert!(v["state"].is_object());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", "--json", p(&sem)]).stdout).unwrap();
    assert_eq!(v["state"]["max_permits"], 3);
    assert_eq!(v["state"]["available"], 3);
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", "--json", p(&hb)]).stdout).unwrap();
    assert_eq!(v["state"]["capacity"], 8);
}

#[test]
fn inspect_bad_files_is_one_line_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let garbage = d.path().join("garbage");
    std::fs::write(
        &garbage,
        (0..4096u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let empty = d.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let lease = d.path().join("l");
    assert!(run(&["create", "lease", p(&lease)]).status.success());
    let truncated = d.path().join("truncated");
    let bytes = std::fs::read(&lease).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let short = d.path().join("short");
    std::fs::write(&short, &bytes[..100]).unwrap();
    let missing = d.path().join("missing");
    for f in [&garbage, &empty, &truncated, &short, &missing] {
        let o = run(&["inspect", p(f)]);
        assert_eq!(o.status.code(), Some(2), "{}: {}", f.display(), text(&o));
        assert!(o.stdout.is_empty());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with("cxc: "), "{err}");
    }
}

#[test]
fn concurrent_lease_runs_never_interleave() {
    // Each run appends "start", sleeps, appends "end"; under the lease the pairs nest.
    let lines = run_at_once(
        3,
        &["lease", "run"],
        "for i in 1 2 3 4 5; do echo \"$CXC_FENCING_TOKEN start\" >> \"$1\"; sleep 0.01; echo \"$CXC_FENCING_TOKEN end\" >> \"$1\"; done",
    );
    assert_eq!(lines.len(), 30);
    let mut tokens = Vec::new();
    for pair in lines.chunks(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let ta = a.split(' ').next().unwrap();
        assert_eq!(a, &format!("{ta} start"), "{lines:?}");
        assert_eq!(b, &format!("{ta} end"), "interleaved: {lines:?}");
        tokens.push(ta.parse::<u64>().unwrap());
    }
    // Each run holds one token for its whole life; tokens increase run by run.
    let mut runs = tokens.clone();
    runs.dedup();
    assert_eq!(runs.len(), 3, "{tokens:?}");
    assert!(runs.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn sem_run_never_runs_more_than_permits() {
    // Record +1 on start and -1 on end with a timestamp-free counter file protected by
    // a lock directory would itself need a lock; instead each run writes start/end
    // lines and the test replays them (appends of short lines are atomic).
    let lines = run_at_once(
        6,
        &["sem", "run", "--permits", "2"],
        "echo \"+ $$\" >> \"$1\"; sleep 0.05; echo \"- $$\" >> \"$1\"",
    );
    let text = lines.join("\n");
    let mut running = 0i32;
    let mut max = 0;
    for line in &lines {
        running += if line.starts_with('+') { 1 } else { -1 };
        max = max.max(running);
    }
    assert_eq!(lines.len(), 12);
    assert_eq!(running, 0);
    assert!(max <= 2, "{max} ran at once:\n{text}");
    assert_eq!(max, 2, "the cap should be used");
}

#[test]
fn killed_lease_run_is_taken_over_by_waiting_run() {
    let d = tempfile::tempdir().unwrap();
    let lease = d.path().join("l");
    let marker = d.path().join("first-running");
    let mut first = start_holding(&lease, &marker, "exec sleep 30");
    let mut second = start(&[
        "lease",
        "run",
        p(&lease),
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $CXC_FENCING_TOKEN",
    ]);
    std::thread::sleep(Duration::from_millis(200));
    first.kill();
    let killed_at = Instant::now();
    let out = second.output(T);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "takeover took {:?}",
        killed_at.elapsed()
    );
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(token, 2, "second holder got the next fencing token");
    // The orphaned `sleep` of the killed run keeps running; it is harmless here.
}

#[test]
fn lease_run_times_out_and_passes_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let lease = d.path().join("l");
    let o = run(&["lease", "run", p(&lease), "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    let marker = d.path().join("holding");
    let mut holder = start_holding(&lease, &marker, "sleep 5");
    let o = run(&["lease", "run", p(&lease), "--wait", "100ms", "--", "true"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    holder.kill();
}

#[test]
fn demo_exits_zero_and_lists_every_unit() {
    let o = run(&["demo", "--workers", "3", "--units", "40"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("demo passed"), "{out}");
    for u in 0..40 {
        assert!(
            out.contains(&format!(" {u}:done")),
            "unit {u} not listed:\n{out}"
        );
    }
    assert!(out.contains("took over the lease"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
}

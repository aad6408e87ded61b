//! The cross-process scenarios of `cxc-xbench` and the child roles it re-executes itself
//! as (`cxc-xbench --role <role> <args>`).
//!
//! Output protocol (stdout of the parent, read by `cargo xtask bench`), tab-separated:
//! - `row  <id>  <unit>  <median>  <p99>  <samples>`: one measured row;
//! - `note  <key>  <text>`: a fact the report should state (e.g. the heartbeat tick).
//!
//! Progress goes to stderr.

mod cpu;
mod death;
mod failover;
mod handoff;
mod locks;
mod rwlock;
mod semaphore;
mod sidecar;
mod throughput;
mod wake;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::shm::SharedPage;
use crate::stats::{Summary, summarize};

pub use locks::LockKind;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Round trips per handoff measurement.
    pub rtt_iters: usize,
    /// Trials per contended-throughput measurement.
    pub tput_trials: usize,
    /// Length of one throughput trial.
    pub tput_time: Duration,
    /// Trials per failover measurement.
    pub failover_trials: usize,
    /// Trials per blocked-waiter CPU measurement.
    pub cpu_trials: usize,
    /// How long the waiter stays blocked in a CPU trial.
    pub cpu_block: Duration,
    /// Samples per wake-latency measurement.
    pub wake_iters: usize,
}

impl Config {
    /// The full run (a few minutes).
    pub fn full() -> Self {
        Config {
            rtt_iters: 20_000,
            tput_trials: 5,
            tput_time: Duration::from_secs(1),
            failover_trials: 40,
            cpu_trials: 3,
            cpu_block: Duration::from_secs(1),
            wake_iters: 400,
        }
    }

    /// The quick run (well under a minute).
    pub fn quick() -> Self {
        Config {
            rtt_iters: 2_000,
            tput_trials: 3,
            tput_time: Duration::from_millis(300),
            failover_trials: 10,
            cpu_trials: 1,
            cpu_block: Duration::from_secs(1),
            wake_iters: 100,
        }
    }
}

/// The scenario sections, in run order.
pub const SECTIONS: [&str; 8] = [
    "handoff",
    "wake",
    "throughput",
    "failover",
    "cpu",
    "semaphore",
    "sidecar",
    "rwlock",
];

/// Sections run only when named (`cxc-xbench death`): measurements of mechanisms, not
/// rows of the report.
pub const EXTRA_SECTIONS: [&str; 1] = ["death"];

/// Runs one section of the parent side.
pub fn run_section(name: &str, cfg: &Config) {
    match name {
        "handoff" => handoff::run(cfg),
        "wake" => wake::run(cfg),
        "throughput" => throughput::run(cfg),
        "failover" => failover::run(cfg),
        "cpu" => cpu::run(cfg),
        "sidecar" => sidecar::run(cfg),
        "semaphore" => semaphore::run(cfg),
        "rwlock" => rwlock::run(cfg),
        "death" => death::run(cfg),
        other => panic!("unknown section {other:?}; sections: {SECTIONS:?}"),
    }
}

/// Runs a child role (`args` are the words after `--role`).
pub fn run_role(args: &[String]) {
    let (role, rest) = args.split_first().expect("--role needs a role name");
    match role.as_str() {
        "handoff-b" => handoff::role_b(rest),
        "pingpong-b" => handoff::role_pingpong(rest),
        "wake-waiter" => wake::role_waiter(rest),
        "tput" => throughput::role(rest),
        "fo-holder" => failover::role_holder(rest),
        "fo-waiter" => failover::role_waiter(rest),
        "death-holder" => death::role_holder(rest),
        "death-waiter" => death::role_waiter(rest),
        "cpu-waiter" => cpu::role(rest),
        "sidecar-b" => sidecar::role_b(rest),
        "sem-b" => semaphore::role_b(rest),
        "rw-mix" => rwlock::role(rest),
        other => panic!("unknown role {other:?}"),
    }
}

/// Whether row `id` should be measured: all rows, or with `CXC_XBENCH_ONLY=<text>` in
/// the environment only those whose id contains `<text>` (for profiling one case).
pub fn wanted(id: &str) -> bool {
    std::env::var("CXC_XBENCH_ONLY").map_or(true, |only| id.contains(&only))
}

/// Prints a result row.
pub fn row(id: &str, unit: &str, s: Option<Summary>) {
    match s {
        Some(s) => println!("row\t{id}\t{unit}\t{:.1}\t{:.1}\t{}", s.median, s.p99, s.n),
        None => eprintln!("xbench: {id}: no samples"),
    }
    eprintln!("xbench: {id} done");
}

/// Prints a note for the report.
pub fn note(key: &str, text: &str) {
    println!("note\t{key}\t{text}");
}

/// Summarises and prints samples in nanoseconds.
pub fn row_ns(id: &str, samples: &[f64]) {
    row(id, "ns", summarize(samples));
}

/// Spawns this executable as child `role` with `args`; its stdout is piped.
pub fn spawn(role: &str, args: &[&str]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    Command::new(exe)
        .arg("--role")
        .arg(role)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child role")
}

/// Waits for a child and returns its stdout; panics if it failed.
pub fn finish(child: Child, what: &str) -> String {
    let out = child.wait_with_output().expect("wait for child");
    assert!(out.status.success(), "{what}: child failed: {}", out.status);
    String::from_utf8(out.stdout).expect("child output is UTF-8")
}

/// Polls until flag `i` of `page` reaches at least `value` (panics after 20 s).
pub fn wait_flag(page: &SharedPage, i: usize, value: u32) {
    let start = Instant::now();
    while page.flag(i).load(std::sync::atomic::Ordering::Acquire) < value {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for flag {i} to reach {value}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// A fresh scratch directory for one measurement.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cxc-xbench-")
        .tempdir()
        .expect("create scratch dir")
}

/// The shared page of scratch directory `dir`.
pub fn page_in(dir: &Path) -> SharedPage {
    SharedPage::open(&dir.join("shm")).expect("map shared page")
}

/// Path argument helper.
pub fn arg_path(args: &[String], i: usize) -> PathBuf {
    PathBuf::from(args.get(i).expect("missing path argument"))
}

/// Parses argument `i`.
pub fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T
where
    T::Err: std::fmt::Debug,
{
    args.get(i)
        .expect("missing argument")
        .parse()
        .expect("bad argument")
}

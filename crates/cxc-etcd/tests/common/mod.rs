//! Shared test plumbing: the etcd server harness ([`server`]), child processes that
//! re-execute the test binary in a role, reports through files, and a system-wide
//! monotonic clock for comparing intervals across processes.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod cluster;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use server::EtcdServer;

/// The role a re-executed test binary plays.
pub const ROLE_VAR: &str = "CXC_ETCD_ROLE";
/// The etcd endpoint children connect to.
pub const ENDPOINT_VAR: &str = "CXC_ETCD_ENDPOINT";
/// A directory for the child's report and marker files.
pub const DIR_VAR: &str = "CXC_ETCD_DIR";
/// The child's name (its report file is `<dir>/<name>.report`).
pub const NAME_VAR: &str = "CXC_ETCD_NAME";
/// The key name of the lease or semaphore under test.
pub const KEY_VAR: &str = "CXC_ETCD_KEY";

/// How long a child waits for its parent before giving up (the parent failed then).
pub const CHILD_PATIENCE: Duration = Duration::from_secs(60);

/// The role this process was started in, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

pub fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("child needs {var}"))
}

pub fn child_dir() -> PathBuf {
    PathBuf::from(env(DIR_VAR))
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process on the machine, so
/// intervals recorded by different children can be compared.
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Writes `text` to `path` atomically (temporary file + rename).
pub fn publish(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write report");
    std::fs::rename(&tmp, path).expect("publish report");
}

/// The child's report file.
pub fn report_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.report"))
}

/// Writes this child's `key=value` report.
pub fn report(text: &str) {
    publish(&report_path(&child_dir(), &env(NAME_VAR)), text);
}

/// A value from a `key=value key=value` report.
pub fn report_value(text: &str, key: &str) -> String {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("report {text:?} has no {key}"))
        .to_string()
}

pub fn report_u64(text: &str, key: &str) -> u64 {
    report_value(text, key)
        .parse()
        .expect("numeric report value")
}

/// Waits (in a child) until `path` exists; exits with code 4 if the parent never makes it.
pub fn child_wait_for_file(path: &Path) {
    let deadline = Instant::now() + CHILD_PATIENCE;
    while !path.exists() {
        if Instant::now() > deadline {
            std::process::exit(4);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A child process re-executing this test binary; SIGKILLed and reaped on drop.
pub struct Kid {
    child: Child,
    reaped: Option<ExitStatus>,
    pub name: String,
    dir: PathBuf,
}

impl Kid {
    /// Runs test `test` of this binary as `role`, named `name`, with the usual variables
    /// plus `envs`. (This toolchain's libtest ignores `--nocapture`: children report
    /// through files.)
    pub fn spawn(
        test: &str,
        role: &str,
        name: &str,
        endpoint: &str,
        dir: &Path,
        key: &str,
        envs: &[(&str, String)],
    ) -> Kid {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--test-threads=1", "--include-ignored"])
            .env(ROLE_VAR, role)
            .env(ENDPOINT_VAR, endpoint)
            .env(DIR_VAR, dir)
            .env(NAME_VAR, name)
            .env(KEY_VAR, key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Kid {
            child: cmd.spawn().expect("spawn child"),
            reaped: None,
            name: name.to_string(),
            dir: dir.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's report, once published.
    pub fn report(&self) -> Option<String> {
        std::fs::read_to_string(report_path(&self.dir, &self.name)).ok()
    }

    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("try_wait");
        }
        self.reaped
    }

    /// SIGKILL, then reap.
    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        self.reap();
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = i32::try_from(self.pid())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .expect("child pid");
        rustix::process::kill_process(pid, sig).expect("signal child");
    }

    pub fn reap(&mut self) -> ExitStatus {
        if let Some(s) = self.reaped {
            return s;
        }
        let s = self.child.wait().expect("wait child");
        self.reaped = Some(s);
        s
    }

    /// Waits for the child's report; fails if it exits without one or `timeout` passes.
    pub fn wait_report(&mut self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.report() {
                return r;
            }
            if let Some(s) = self.exited() {
                if let Some(r) = self.report() {
                    return r;
                }
                panic!("child {} exited ({s}) without a report", self.name);
            }
            assert!(
                Instant::now() < deadline,
                "child {} sent no report within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for the child to exit successfully within `timeout`.
    pub fn wait_success(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                assert!(s.success(), "child {} failed: {s}", self.name);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "child {} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Intervals `[start, end]` (ns) that must not overlap more than `max` at a time;
/// returns the largest overlap seen.
pub fn max_overlap(intervals: &[(u64, u64)]) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals {
        assert!(s <= e, "interval ends before it starts: {s} > {e}");
        events.push((s, 1));
        events.push((e, -1));
    }
    // At equal times, count the start first: touching intervals count as overlapping.
    events.sort_by_key(|&(t, d)| (t, -d));
    let (mut cur, mut best) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        best = best.max(cur);
    }
    best as usize
}

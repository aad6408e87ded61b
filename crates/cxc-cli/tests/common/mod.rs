//! What the end-to-end tests of the run commands share: the built `cxc`, a running
//! wrapper (`Job`), and the start/end log the jobs write.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

pub(crate) fn cxc(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cxc"));
    c.args(args).stdin(Stdio::null());
    c
}

/// Runs `cxc ARGS` to the end and asserts that it succeeded.
pub(crate) fn succeeds(args: &[&str]) {
    let status = cxc(args).status().expect("run cxc");
    assert!(status.success(), "cxc {args:?}: {status}");
}

/// A running `cxc` wrapper, killed with SIGKILL if the test ends first (its keeper then
/// terminates the command's group).
pub(crate) struct Job(pub(crate) Child);

impl Job {
    pub(crate) fn start(args: &[&str]) -> Job {
        Job(cxc(args).spawn().expect("spawn cxc"))
    }
    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32).unwrap()
    }
    pub(crate) fn signal(&self, sig: Signal) {
        rustix::process::kill_process(self.pid(), sig).unwrap();
    }
    /// Exit code, within `t`.
    pub(crate) fn wait(&mut self, t: Duration) -> Option<i32> {
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Some(s) = self.0.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                return Some(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
    /// The keeper process the wrapper started.
    pub(crate) fn keeper(&self) -> Pid {
        let pid = self.0.id();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(k) = kids.split_whitespace().next() {
                return Pid::from_raw(k.parse().unwrap()).unwrap();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("wrapper {pid} started no keeper");
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The time (ns) the log records for `kind` (`start` or `end`) of job `id`, waiting up
/// to `t` for it to appear.
pub(crate) fn logged(log: &Path, kind: &str, id: usize, t: Duration) -> Option<u128> {
    let end = Instant::now() + t;
    loop {
        if let Some(e) = read_log(log).iter().find(|e| e.0 == kind && e.1 == id) {
            return Some(e.2);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// (kind, id, ns) lines of the log.
pub(crate) fn read_log(log: &Path) -> Vec<(String, usize, u128)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_string(),
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Whether process `pid` is alive (exists and is not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|st| st != "Z" && st != "X")
        })
        .unwrap_or(false)
}

//! Child process handles: spawn any command (this test binary in a role: see
//! [`crate::RoleCommand`]), signals, bounded waits, report lines, and a SIGKILL on drop.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::role::REPORT_PREFIX;

/// After a child exits, how long its output may take to reach end of file (a grandchild
/// that inherited the pipe can hold it open for much longer; then what arrived is used).
const EOF_GRACE: Duration = Duration::from_secs(2);

/// A running child process, killed (SIGKILL) and reaped when dropped, so a test that
/// panics leaves no orphan.
///
/// Its stdin is null; its stdout and stderr are read by background threads, so a chatty
/// child never blocks on a full pipe. Lines holding [`REPORT_PREFIX`] are *reports*
/// ([`crate::report`]); everything is kept for failure messages.
pub struct Proc {
    child: Child,
    what: String,
    /// The exact test name, for children that are this test binary.
    pub(crate) test: Option<String>,
    reaped: Option<ExitStatus>,
    lines: Receiver<String>,
    eof: bool,
    /// Reports read while waiting for the end of output, not yet handed out.
    pending: Vec<String>,
    /// Stderr's lines (already kept in `stderr`), to see its end of file.
    err_lines: Receiver<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn drain(
    src: impl Read + Send + 'static,
    keep: Arc<Mutex<String>>,
    to: Option<std::sync::mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut buf = Vec::new();
        while matches!(r.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&buf).into_owned();
            buf.clear();
            keep.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&line);
            if let Some(to) = &to {
                let _ = to.send(line.trim_end_matches(['\n', '\r']).to_owned());
            }
        }
    });
}

impl Proc {
    /// Starts `cmd` with stdin null and stdout/stderr captured; `what` names it in
    /// failure messages.
    ///
    /// # Panics
    ///
    /// If the command cannot be started.
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut p = cxc_testkit::Proc::spawn(std::process::Command::new("true"), "true");
    /// assert!(p.wait_timeout(Duration::from_secs(10)).expect("exited").success());
    /// ```
    pub fn spawn(mut cmd: Command, what: &str) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
        let (tx, lines) = channel();
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        drain(
            child.stdout.take().expect("piped"),
            stdout.clone(),
            Some(tx),
        );
        let (err_tx, err_lines) = channel();
        drain(
            child.stderr.take().expect("piped"),
            stderr.clone(),
            Some(err_tx),
        );
        Proc {
            child,
            what: what.to_owned(),
            test: None,
            reaped: None,
            lines,
            eof: false,
            pending: Vec::new(),
            err_lines,
            stdout,
            stderr,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: Signal) {
        assert!(
            self.reaped.is_none(),
            "{}: signal after it was reaped",
            self.what
        );
        // Not reaped yet, so the pid cannot have been reused.
        let _ = kill_process(Pid::from_child(&self.child), sig);
    }

    /// SIGKILL, then reaps the child. Its exit status is returned by later waits.
    pub fn kill(&mut self) {
        if self.reaped.is_none() {
            self.signal(Signal::KILL);
            self.reaped = Some(self.child.wait().expect("reap a killed child"));
        }
    }

    /// SIGKILL without reaping: the child stays a zombie (dead, its pid still taken)
    /// until a later wait, so a test can check what others see of a dead, unreaped process.
    pub fn kill_unreaped(&self) {
        self.signal(Signal::KILL);
    }

    /// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z` zombie, ...),
    /// `None` once the child is reaped.
    pub fn state(&self) -> Option<char> {
        if self.reaped.is_some() {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        stat.get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .next()?
            .chars()
            .next()
    }

    /// Waits at most `timeout` until `/proc` shows the child in `state` (e.g. `T` after
    /// [`Proc::stop`], `Z` after [`Proc::kill_unreaped`]).
    ///
    /// # Panics
    ///
    /// If it does not get there in time.
    pub fn wait_state(&mut self, state: char, timeout: Duration) {
        let what = format!("{} in state {state}", self.what);
        let found = crate::wait_until(timeout, || self.state() == Some(state));
        assert!(
            found,
            "{what}: not reached within {timeout:?}, now {:?}",
            self.state()
        );
    }

    /// Polls `cond` until it holds while the child runs.
    ///
    /// # Panics
    ///
    /// If the child exits first or `timeout` passes; `what` names the awaited condition.
    pub fn wait_while_alive(
        &mut self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond() {
                return;
            }
            if let Some(s) = self.try_wait() {
                panic!(
                    "{} exited ({s}) while waiting for: {what}\n{}",
                    self.what,
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out ({timeout:?}) waiting for: {what}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// SIGSTOP: the child is paused until [`Proc::cont`] (or killed).
    pub fn stop(&self) {
        self.signal(Signal::STOP);
    }

    /// SIGCONT: resumes a child paused by [`Proc::stop`].
    pub fn cont(&self) {
        self.signal(Signal::CONT);
    }

    /// The exit status if the child has exited (and reaps it), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("wait for a child");
        }
        self.reaped
    }

    /// Waits at most `timeout` for the child to exit; `None` if it still runs (it is left
    /// running).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The child's next report (without [`REPORT_PREFIX`]), waiting at most `timeout`.
    /// Reports taken here are not returned again by [`Proc::finish`].
    ///
    /// # Panics
    ///
    /// If none arrives in time or the child's stdout ends first; the message holds
    /// the child's output.
    pub fn next_report(&mut self, timeout: Duration) -> String {
        if !self.pending.is_empty() {
            return self.pending.remove(0);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, r)) = line.split_once(REPORT_PREFIX) {
                        return r.to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no report within {timeout:?}{}", self.what, self.dump())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.eof = true;
                    let status = self.wait_timeout(EOF_GRACE);
                    panic!(
                        "{}: output ended before a report (status {status:?}){}{}",
                        self.what,
                        self.no_test_hint(),
                        self.dump()
                    )
                }
            }
        }
    }

    /// Waits at most `timeout` for the child to exit and checks it exited normally with
    /// status 0; returns the reports not yet taken by [`Proc::next_report`]. For a child
    /// that is this test binary, also checks that the test it was asked to run ran.
    ///
    /// # Panics
    ///
    /// If the child runs past `timeout` (it is killed first), was killed by a signal,
    /// exited non-zero, or ran no test; the message holds its output.
    pub fn finish(&mut self, timeout: Duration) -> Vec<String> {
        let status = self.exit_and_eof(timeout);
        if let Some(sig) = status.signal() {
            panic!("{}: killed by signal {sig}{}", self.what, self.dump());
        }
        assert!(
            status.success(),
            "{}: failed ({status}){}",
            self.what,
            self.dump()
        );
        let hint = self.no_test_hint();
        assert!(hint.is_empty(), "{}: {hint}{}", self.what, self.dump());
        std::mem::take(&mut self.pending)
    }

    /// Waits at most `timeout` for the exit, then for the end of the output; kills the
    /// child and panics with its output if it runs past `timeout`.
    fn exit_and_eof(&mut self, timeout: Duration) -> ExitStatus {
        let Some(status) = self.wait_timeout(timeout) else {
            self.kill();
            panic!(
                "{}: still running after {timeout:?}, killed{}",
                self.what,
                self.dump()
            );
        };
        self.wait_eof();
        status
    }

    /// Like [`Command::output`], bounded: waits at most `timeout` for the child to exit,
    /// then for the end of its output, and returns its status, stdout and stderr (as read,
    /// invalid UTF-8 replaced). Does not judge the status.
    ///
    /// # Panics
    ///
    /// If the child runs past `timeout` (it is killed first).
    ///
    /// ```
    /// use std::process::Command;
    /// use std::time::Duration;
    /// let mut cmd = Command::new("sh");
    /// cmd.args(["-c", "echo hi; exit 2"]);
    /// let out = cxc_testkit::Proc::spawn(cmd, "sh").output(Duration::from_secs(60));
    /// assert_eq!((out.status.code(), &out.stdout[..]), (Some(2), &b"hi\n"[..]));
    /// ```
    pub fn output(&mut self, timeout: Duration) -> Output {
        let status = self.exit_and_eof(timeout);
        Output {
            status,
            stdout: self.stdout().into_bytes(),
            stderr: self.stderr().into_bytes(),
        }
    }

    /// Waits up to [`EOF_GRACE`] for the end of stdout and stderr (an exited child's
    /// output may be in flight), keeping the reports read on the way for [`Proc::finish`].
    fn wait_eof(&mut self) {
        let deadline = Instant::now() + EOF_GRACE;
        while !self.eof {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let report = line.split_once(REPORT_PREFIX).map(|(_, r)| r.to_owned());
                    self.pending.extend(report);
                }
                Err(RecvTimeoutError::Disconnected) => self.eof = true,
                Err(RecvTimeoutError::Timeout) => break,
            }
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err_lines.recv_timeout(left) {
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected | RecvTimeoutError::Timeout) => break,
            }
        }
    }

    /// Non-empty if this is a role child whose output shows it did not run its test.
    fn no_test_hint(&self) -> String {
        match &self.test {
            Some(t) if self.eof && !self.stdout().contains("running 1 test") => {
                format!("ran no test named {t:?} (the name must be exact, with its module path)")
            }
            _ => String::new(),
        }
    }

    /// Everything the child printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Everything the child printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn dump(&self) -> String {
        format!(
            "\n--- pid {} stdout:\n{}\n--- stderr:\n{}",
            self.pid(),
            self.stdout(),
            self.stderr()
        )
    }
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc")
            .field("what", &self.what)
            .field("pid", &self.pid())
            .field("status", &self.reaped)
            .finish_non_exhaustive()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = kill_process(Pid::from_child(&self.child), Signal::KILL);
            let _ = self.child.wait();
        }
    }
}

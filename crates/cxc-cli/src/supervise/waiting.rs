//! How a keeper waits for its claim: the flock(1)-style options (`-n`, `-w`, `-E`, `-c`)
//! and the one blocking wait, watched by a thread that ends the process if the wrapper
//! dies or a signal arrives.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::{Keeper, Parent, Signals, wait_any};
use crate::CliError;

/// The flock(1)-style options shared by `lease run` and `sem run`.
#[derive(clap::Args, Debug)]
pub(crate) struct Waiting {
    /// Fail at once if the claim is taken (exit 1, or the code of -E), as flock -n.
    #[arg(short = 'n', long = "nonblock", visible_alias = "nb")]
    pub(crate) nonblock: bool,
    /// Give up after this long (exit 1, or the code of -E): plain seconds as flock -w
    /// (`-w 2.5`) or with a unit (`500ms`, `2m`). Default: wait forever.
    #[arg(short = 'w', long = "wait", visible_alias = "timeout", value_parser = crate::duration::parse)]
    pub(crate) wait: Option<Duration>,
    /// Exit code when -n finds the claim taken or -w runs out (default 1), as flock -E.
    #[arg(short = 'E', long = "conflict-exit-code", default_value_t = crate::EXIT_TIMEOUT)]
    pub(crate) conflict_exit_code: u8,
    /// Run this command line with `$SHELL -c` (`/bin/sh -c` if SHELL is unset or empty), as
    /// flock -c.
    #[arg(short = 'c', long = "command", conflicts_with = "cmd")]
    pub(crate) command: Option<OsString>,
    /// The command and its arguments.
    #[arg(
        required_unless_present = "command",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub(crate) cmd: Vec<OsString>,
}

impl Waiting {
    /// The keeper that waits and runs the command as these options say.
    pub(crate) fn keeper<'a>(&'a self, parent: &'a Parent, signals: &'a Signals) -> Keeper<'a> {
        Keeper {
            waiting: self,
            parent,
            signals,
            started: Instant::now(),
        }
    }

    /// The command line to run.
    pub(crate) fn argv(&self) -> Vec<OsString> {
        match &self.command {
            Some(c) => vec![crate::supervise::shell(), "-c".into(), c.clone()],
            None => self.cmd.clone(),
        }
    }

    /// Takes the claim: `try_now()` once with `-n`, else `wait_for(timeout)` until `-w`
    /// after `started` (the keeper's start, so that all waits of a run share it). The wait is
    /// one blocking call (not short slices: a waiter that woke every few milliseconds to
    /// look around would crowd the CPUs just when a handover needs them); meanwhile a
    /// [`Monitor`] thread ends this process if the wrapper dies or a signal arrives.
    pub(crate) fn acquire<T>(
        &self,
        what: &str,
        parent: &Parent,
        signals: &Signals,
        started: Instant,
        try_now: impl FnOnce() -> Option<T>,
        mut wait_for: impl FnMut(Duration) -> Option<T>,
    ) -> Result<T, CliError> {
        let conflict = |msg: String| CliError {
            code: self.conflict_exit_code,
            msg,
        };
        if self.nonblock {
            return try_now().ok_or_else(|| conflict(format!("{what} is taken")));
        }
        // Already taken signals or a wrapper already gone end the wait at once.
        if let Some(sig) = signals.take().first() {
            return Err(interrupted(what, *sig));
        }
        if parent.is_gone() {
            return Err(CliError::usage("the wrapper is gone"));
        }
        let deadline = self.wait.and_then(|w| started.checked_add(w));
        let monitor = Monitor::start(parent, signals, what)?;
        let got = loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if let Some(t) = wait_for(left.unwrap_or(WAIT_CALL)) {
                break Some(t);
            }
            if left.is_some_and(|l| l <= WAIT_CALL) || deadline.is_some_and(|d| Instant::now() >= d)
            {
                break None;
            }
        };
        monitor.stop();
        got.ok_or_else(|| {
            conflict(format!(
                "timed out after {:?} waiting for {what}",
                self.wait.unwrap_or_default()
            ))
        })
    }
}

fn interrupted(what: &str, sig: Signal) -> CliError {
    CliError {
        code: (128 + sig.as_raw()).clamp(0, 255) as u8,
        msg: format!("interrupted while waiting for {what}"),
    }
}

/// While a keeper blocks waiting for its claim: a thread that ends the process when the
/// wrapper dies (exit 2) or a forwarded signal arrives (exit 128 + the signal), as the
/// wait cannot be interrupted. Should the claim be granted in that very instant, it is
/// left to a dead process, which the next waiter takes over at once (the OS proves the
/// holder gone).
struct Monitor {
    stop: OwnedFd,
    handle: std::thread::JoinHandle<()>,
}

impl Monitor {
    fn start(parent: &Parent, signals: &Signals, what: &str) -> Result<Monitor, CliError> {
        use rustix::event::{EventfdFlags, eventfd};
        let stop = eventfd(0, EventfdFlags::CLOEXEC)?;
        let stop_r = stop.try_clone()?;
        let wrapper = parent.pidfd.try_clone()?;
        let rx = signals.rx.try_clone()?;
        let flags: Vec<(Signal, Arc<AtomicBool>)> = signals
            .flags
            .iter()
            .map(|(s, f)| (*s, Arc::clone(f)))
            .collect();
        let what = what.to_string();
        let handle = std::thread::Builder::new()
            .name("cxc-wait-monitor".into())
            .spawn(move || {
                cxc::mmf::orphan::ours();
                loop {
                    let ready = wait_any(&[stop_r.as_fd(), wrapper.as_fd(), rx.as_fd()], None);
                    if ready[0] {
                        return;
                    }
                    if ready[1] {
                        cxc_cli::say!("cxc: the wrapper is gone");
                        std::process::exit(i32::from(cxc_cli::EXIT_ERROR));
                    }
                    if ready[2] {
                        let mut buf = [0u8; 64];
                        while matches!(std::io::Read::read(&mut &rx, &mut buf), Ok(n) if n > 0) {}
                        if let Some((sig, _)) =
                            flags.iter().find(|(_, f)| f.load(Ordering::Acquire))
                        {
                            let e = interrupted(&what, *sig);
                            cxc_cli::say!("cxc: {}", e.msg);
                            std::process::exit(i32::from(e.code));
                        }
                    }
                }
            })?;
        Ok(Monitor { stop, handle })
    }

    fn stop(self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        let _ = self.handle.join();
    }
}

/// The longest single blocking call of a waiting keeper (it is called again after).
const WAIT_CALL: Duration = Duration::from_secs(3600);

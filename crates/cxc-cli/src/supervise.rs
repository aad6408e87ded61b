//! Running a command on behalf of a claim: the wrapper/keeper pair (docs/cli.md, "How
//! `run` keeps one job at a time").
//!
//! - The *wrapper* is the process the shell started (`cxc lease run ...`). It re-runs
//!   itself as the *keeper* (same arguments, [`KEEPER_ENV`] naming the wrapper's pid, in
//!   a process group of its own), forwards SIGTERM/SIGINT/SIGHUP to it, and exits with
//!   its exit code.
//! - The *keeper* takes the claim (its own process identity is the holder), starts the
//!   command in a new process group, and is a child subreaper, so the command's orphans
//!   stay its children. It waits on the command's pidfd, the wrapper's pidfd and its
//!   signal pipe (no sleep loop), forwards signals to the group, and gives the claim back
//!   only once no live process is left in the group. When the wrapper dies (any signal,
//!   even SIGKILL) the keeper terminates the group first.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::{CliError, EXIT_CANNOT_EXEC, EXIT_NOT_FOUND};

mod held;
mod waiting;

pub(crate) use held::{Keeper, MARK_VAR, run_mark, wait_nested_keepers_where};
pub(crate) use waiting::Waiting;

/// The exit codes of `lease run` and `sem run`, as `--help` shows them.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  N        the command's own exit code (128+S if it died of signal S, or if signal S
           came while the run waited or ended a previous command: nothing was run)
  1        conflict (-n found the claim taken) or timeout (-w ran out); -E N changes it
  2        usage error, or the file is missing, foreign or unusable; or the wrapper
           died before the command started
  75       lease lost (--kill-after takeover by another run): while the command ran (its
           process group was terminated), or before it started (nothing was run); or the
           wrapper died while the command ran (its group was terminated)
  126      the command was found but could not be run
  127      the command was not found

The claim is held on behalf of the command's process group: the next run starts only
once that group is gone, whatever happens to this wrapper. SIGTERM/SIGINT/SIGHUP are
forwarded to the group (one the caller ignores, as nohup does, stays ignored, for the
command too); if the wrapper dies, the group is terminated (SIGTERM, SIGKILL
2 s later). See docs/cli.md.";

/// Set in the keeper's environment to the wrapper's pid (removed from the command's).
pub(crate) const KEEPER_ENV: &str = "CXC_KEEPER_OF";

/// Set for the keeper besides [`KEEPER_ENV`]: the process group its wrapper was in. A
/// takeover that ends a recorded command group waits for the keepers of runs nested in
/// it by this (`held::end_orphan`); a nested run the command moved out of its group
/// (setsid, setpgid) names another group and is not waited for.
pub(crate) const KEEPER_GROUP_ENV: &str = "CXC_KEEPER_GROUP";
/// Between SIGTERM and SIGKILL when a group is terminated.
pub(crate) const KILL_DELAY: Duration = Duration::from_secs(2);
/// How often a keeper ending an orphaned group renews its own claim meanwhile (well
/// within the shortest grace the commands accept).
pub(crate) const KEEP_EVERY: Duration = Duration::from_millis(5);

const FORWARDED: [(i32, Signal); 3] = [
    (signal_hook::consts::SIGTERM, Signal::TERM),
    (signal_hook::consts::SIGINT, Signal::INT),
    (signal_hook::consts::SIGHUP, Signal::HUP),
];

/// SIGTERM, SIGINT and SIGHUP caught (not fatal) and reported through a pipe; one that
/// the caller left ignored (`nohup`, a background job of a non-interactive shell) is left
/// ignored, not forwarded, and so inherited ignored by the keeper and the command, as
/// under flock(1).
pub(crate) struct Signals {
    rx: UnixStream,
    flags: Vec<(Signal, Arc<AtomicBool>)>,
    /// Whether any signal was ever taken.
    seen: std::cell::Cell<bool>,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, CliError> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let mut flags = Vec::new();
        for (raw, sig) in FORWARDED {
            if crate::dispositions::is_ignored(raw) {
                continue;
            }
            let flag = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(raw, Arc::clone(&flag))?;
            signal_hook::low_level::pipe::register(raw, tx.try_clone()?)?;
            flags.push((sig, flag));
        }
        // A signal that came between its flag's registration and its pipe's set the flag
        // but wrote nothing: wake the first wait so that it looks at the flags (else a
        // wrapper blocked in poll never forwarded it, and a SIGTERM in its first
        // milliseconds was lost; attack33_cli, "sigterm_in_the_first_milliseconds").
        if flags.iter().any(|(_, f)| f.load(Ordering::Acquire)) {
            let _ = std::io::Write::write(&mut &tx, &[0]);
        }
        Ok(Signals {
            rx,
            flags,
            seen: std::cell::Cell::new(false),
        })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    /// The signals received since the last call.
    pub(crate) fn take(&self) -> Vec<Signal> {
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut &self.rx, &mut buf), Ok(n) if n > 0) {}
        let taken: Vec<Signal> = self
            .flags
            .iter()
            .filter(|(_, f)| f.swap(false, Ordering::AcqRel))
            .map(|(s, _)| *s)
            .collect();
        if !taken.is_empty() {
            self.seen.set(true);
        }
        taken
    }

    /// Whether a signal was ever taken (by [`take`](Self::take)).
    pub(crate) fn seen(&self) -> bool {
        self.seen.get()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes; which ones are.
fn wait_any(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<bool> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
        .collect();
    let ts = timeout.map(|t| Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match poll(&mut pfds, ts.as_ref()) {
        Ok(_) => pfds.iter().map(|p| !p.revents().is_empty()).collect(),
        Err(_) => vec![false; fds.len()],
    }
}

fn pid_of(raw: u32) -> Option<Pid> {
    i32::try_from(raw).ok().and_then(Pid::from_raw)
}

/// Exit code of a finished child: its code, or 128 + the signal that killed it.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).min(255) as u8,
        _ => 1,
    }
}

/// The entry point of a command run by a keeper: in the wrapper, re-runs this process as
/// the keeper ([`wrap`]); in the keeper, installs the signal handlers and calls `keep`.
pub(crate) fn run(
    keep: impl FnOnce(&Parent, &Signals) -> Result<u8, CliError>,
) -> Result<u8, CliError> {
    match Parent::from_env()? {
        None => wrap(),
        Some(parent) => keep(&parent, &Signals::install()?),
    }
}

/// The wrapper: runs this very command line again as the keeper and mirrors it.
pub(crate) fn wrap() -> Result<u8, CliError> {
    let signals = Signals::install()?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::usage(format!("cannot find the cxc executable: {e}")))?;
    let mut keeper = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(KEEPER_ENV, std::process::id().to_string())
        .env(
            KEEPER_GROUP_ENV,
            rustix::process::getpgrp().as_raw_pid().to_string(),
        )
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::usage(format!("cannot start the keeper process: {e}")))?;
    let kpid = pid_of(keeper.id());
    let pidfd = kpid
        .map(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()))
        .transpose()?;
    loop {
        if let Some(fd) = &pidfd {
            let ready = wait_any(&[fd.as_fd(), signals.fd()], None);
            if ready[1] {
                for sig in signals.take() {
                    if let Some(p) = kpid {
                        let _ = rustix::process::kill_process(p, sig);
                    }
                }
            }
            if !ready[0] {
                continue;
            }
        }
        let status = keeper.wait()?;
        return Ok(exit_code(status));
    }
}

/// The wrapper as the keeper sees it.
pub(crate) struct Parent {
    pidfd: OwnedFd,
}

impl Parent {
    /// `Some` when this process is a keeper (see [`KEEPER_ENV`]).
    pub(crate) fn from_env() -> Result<Option<Parent>, CliError> {
        let Some(raw) = std::env::var_os(KEEPER_ENV) else {
            return Ok(None);
        };
        let pid = raw
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .and_then(pid_of)
            .ok_or_else(|| CliError::usage(format!("{KEEPER_ENV}: not a pid")))?;
        let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())
            .map_err(|e| CliError::usage(format!("the wrapper is gone: {e}")))?;
        // The pidfd names the wrapper only if it is still our parent.
        if rustix::process::getppid() != Some(pid) {
            return Err(CliError::usage("the wrapper is gone"));
        }
        // Orphans of the command become our children, so we can see them end.
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        Ok(Some(Parent { pidfd }))
    }

    pub(crate) fn is_gone(&self) -> bool {
        wait_any(&[self.pidfd.as_fd()], Some(Duration::ZERO))[0]
    }

    /// Sleeps `d`, or less if the wrapper dies or a signal arrives; `false` then.
    pub(crate) fn pause(&self, signals: &Signals, d: Duration) -> bool {
        let ready = wait_any(&[self.pidfd.as_fd(), signals.fd()], Some(d));
        !ready.iter().any(|r| *r)
    }
}

/// A started command: its process (the leader of its own group) and a pidfd on it.
pub(crate) struct Running {
    child: Child,
    pidfd: OwnedFd,
    /// The command's process group (its pid).
    pub(crate) pgid: u32,
}

/// Starts `cmd` in a new process group, with `env` added.
pub(crate) fn spawn(cmd: &[OsString], env: &[(&str, OsString)]) -> Result<Running, CliError> {
    let Some((program, rest)) = cmd.split_first() else {
        return Err(CliError::usage("no command given"));
    };
    let start = |program: &OsStr, args: &[OsString]| {
        Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove(KEEPER_ENV)
            .env_remove(KEEPER_GROUP_ENV)
            .process_group(0)
            .spawn()
    };
    let spawned = match start(program, rest) {
        // An executable file without a `#!` line: run it with /bin/sh, as execvp(3) (and
        // so flock(1) and a shell) do.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOEXEC.raw_os_error()) => {
            match resolve(program) {
                Some(path) => {
                    let args: Vec<OsString> = std::iter::once(path.into_os_string())
                        .chain(rest.iter().cloned())
                        .collect();
                    start(OsStr::new("/bin/sh"), &args)
                }
                None => Err(e),
            }
        }
        other => other,
    };
    let child = spawned.map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            EXIT_NOT_FOUND
        } else {
            EXIT_CANNOT_EXEC
        };
        CliError {
            code,
            msg: format!("cannot run {}: {e}", program.to_string_lossy()),
        }
    })?;
    let pgid = child.id();
    let pidfd = pid_of(pgid)
        .ok_or_else(|| CliError::usage("the command has no pid"))
        .and_then(|p| Ok(rustix::process::pidfd_open(p, PidfdFlags::empty())?))?;
    Ok(Running { child, pidfd, pgid })
}

/// The shell of `-c CMDLINE`, as flock(1) picks it: `$SHELL`, or `/bin/sh` if SHELL is
/// unset or empty (not `sh` looked up in PATH: a service's trimmed PATH may have none).
pub(crate) fn shell() -> OsString {
    std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// The file `program` names, as execvp(3) finds it: itself if it contains a `/`, else the
/// first executable regular file of that name in a `PATH` directory.
fn resolve(program: &OsStr) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    if program.as_bytes().contains(&b'/') {
        return Some(program.into());
    }
    let paths = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&paths)
        .map(|d| d.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// How the command's run ended.
pub(crate) enum Ended {
    /// The command exited with this code (its group is gone).
    Exited(u8),
    /// The claim was lost; the group was terminated.
    Lost,
    /// The wrapper died; the group was terminated.
    WrapperDied,
}

/// Waits for the command (and the rest of its group), forwarding signals, beating every
/// `period` (`beat` false: the claim is lost), terminating the group if the wrapper dies.
pub(crate) fn supervise(
    mut run: Running,
    parent: &Parent,
    signals: &Signals,
    period: Duration,
    beat: &mut dyn FnMut() -> bool,
) -> Ended {
    let mut code = None;
    loop {
        let fds = [run.pidfd.as_fd(), parent.pidfd.as_fd(), signals.fd()];
        // Once the leader exited, its pidfd stays readable: poll only the others, and
        // look for the rest of the group now and then.
        let (fds, timeout) = match code {
            None => (&fds[..], period),
            Some(_) => (&fds[1..], period.min(Duration::from_millis(5))),
        };
        let ready = wait_any(fds, Some(timeout));
        let off = usize::from(code.is_some());
        if code.is_none() && ready[0] {
            code = Some(run.child.wait().map_or(1, exit_code));
        }
        if ready[2 - off] {
            for sig in signals.take() {
                if let Some(p) = pid_of(run.pgid) {
                    let _ = rustix::process::kill_process_group(p, sig);
                }
            }
        }
        if ready[1 - off] {
            // Renewing the claim meanwhile (the group may take longer than its grace to
            // end); if it is lost, whoever took it ends the group (held.rs, end_orphan).
            if !terminate_group_keeping(run.pgid, beat) {
                return Ended::Lost;
            }
            let _ = run.child.wait();
            return if wait_nested_keepers(beat) {
                Ended::WrapperDied
            } else {
                Ended::Lost
            };
        }
        if !beat() {
            terminate_group(run.pgid);
            let _ = run.child.wait();
            return Ended::Lost;
        }
        if let Some(c) = code
            && !group_alive(run.pgid)
        {
            return if wait_nested_keepers(beat) {
                Ended::Exited(c)
            } else {
                Ended::Lost
            };
        }
    }
}

/// A run nested in this one (`cxc lease run A -- cxc sem run B -- cmd`, as `flock A flock
/// B cmd`) has its keeper and its command in process groups of their own, outside our
/// command's group, which holds only its wrapper. If that wrapper dies (when we end our
/// group, say), its keeper becomes our child (we are a subreaper) and ends its command
/// before it exits: our claim must last until then, as flock's lock lasts while the inner
/// command holds its descriptor. So this waits, renewing the claim with `beat` every
/// [`KEEP_EVERY`], while any child of ours is a keeper (its environment names
/// [`KEEPER_ENV`]), sending each SIGCONT once (a stopped keeper would never end its
/// command); `false` if the claim was lost meanwhile. A nested run the command moved out
/// of its group itself (setsid) is not ended with the group, so its keeper stays its own
/// wrapper's child and is not waited for here (it is only if that wrapper died and the
/// keeper became ours).
fn wait_nested_keepers(beat: &mut dyn FnMut() -> bool) -> bool {
    let mut continued = Vec::new();
    loop {
        let live = nested_keeper_children();
        if live.is_empty() {
            return true;
        }
        continue_once(&live, &mut continued);
        if !beat() {
            return false;
        }
        std::thread::sleep(KEEP_EVERY);
    }
}

/// Sends SIGCONT to each of `pids` not in `done`, and adds it there.
pub(crate) fn continue_once(pids: &[u32], done: &mut Vec<u32>) {
    for &pid in pids {
        if done.contains(&pid) {
            continue;
        }
        if let Some(p) = pid_of(pid) {
            let _ = rustix::process::kill_process(p, Signal::CONT);
        }
        done.push(pid);
    }
}

/// The live children of this process that are keepers of nested runs (see
/// [`wait_nested_keepers`]).
fn nested_keeper_children() -> Vec<u32> {
    reap_zombies();
    // No child at all (how a run usually ends): nothing to look for in /proc.
    if let Err(Errno::CHILD) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
        return Vec::new();
    }
    children()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env_has(&env, KEEPER_ENV, &mut |_| true))
        })
        .collect()
}

/// The live children of this process: from `/proc/self/task/*/children` where the kernel
/// has it, else by a scan of `/proc` for our pid as parent.
fn children() -> Vec<u32> {
    let me = std::process::id();
    let listed: Option<Vec<u32>> = std::fs::read_dir("/proc/self/task").ok().and_then(|tasks| {
        let mut all = Vec::new();
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("children")).ok()?;
            all.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
        Some(all)
    });
    if let Some(all) = listed {
        return all
            .into_iter()
            .filter(|&pid| stat_ppid(&format!("/proc/{pid}/stat")) == Some(me))
            .collect();
    }
    std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| stat_ppid(&format!("/proc/{pid}/stat")) == Some(me))
                .collect()
        })
        .unwrap_or_default()
}

/// The parent pid in the `stat` file at `path`, if the process is not a zombie.
fn stat_ppid(path: &str) -> Option<u32> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.next()?.parse().ok()
}

/// Reaps every exited child (the keeper is a subreaper: orphans of the command).
fn reap_zombies() {
    while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
}

/// Whether process group `pgid` has a live (not zombie) member.
pub(crate) fn group_alive(pgid: u32) -> bool {
    let Some(p) = pid_of(pgid) else { return false };
    reap_zombies();
    match rustix::process::test_kill_process_group(p) {
        Err(Errno::SRCH) => false,
        _ => proc_group_has_live_member(pgid).unwrap_or(true),
    }
}

/// Scans /proc for a live member of `pgid` (`None`: /proc unreadable; see [`live_members`]).
fn proc_group_has_live_member(pgid: u32) -> Option<bool> {
    Some(!live_members(pgid)?.is_empty())
}

/// The live members of process group `pgid`, from /proc (`None`: /proc unreadable): for
/// each, its pid and a live thread of it. A process whose main thread exited shows `Z`
/// while its other threads run; it is alive (and its environment is read through a live
/// thread: the exited main thread has no memory left to read it from).
pub(crate) fn live_members(pgid: u32) -> Option<Vec<(u32, u32)>> {
    live_processes(&mut |pgrp| pgrp == pgid)
}

/// The live processes whose process group `in_group` accepts, from /proc (`None`: /proc
/// unreadable), each with a live thread of it (see [`live_members`]).
fn live_processes(in_group: &mut dyn FnMut(u32) -> bool) -> Option<Vec<(u32, u32)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((state, pgrp)) = stat_state_pgrp(&format!("/proc/{pid}/stat")) else {
            continue;
        };
        if !in_group(pgrp) {
            continue;
        }
        if state != 'Z' && state != 'X' {
            found.push((pid, pid));
        } else if let Some(tid) = live_thread(pid) {
            found.push((pid, tid));
        }
    }
    Some(found)
}

/// The state letter and process group in the `stat` file at `path`.
pub(crate) fn stat_state_pgrp(path: &str) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // After the command name: state, ppid, pgrp, ...
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse::<u32>().ok()?;
    Some((state, pgrp))
}

/// A thread of process `pid` that is not a zombie, if any.
fn live_thread(pid: u32) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|tid| {
            stat_state_pgrp(&format!("/proc/{pid}/task/{tid}/stat"))
                .is_some_and(|(st, _)| st != 'Z' && st != 'X')
        })
}

/// Whether a live member of group `pgid` carries `VAR=value` in its environment (as
/// /proc shows the environment it was started with). A member whose environment cannot be
/// read (another user's, or gone) does not count.
pub(crate) fn group_carries(pgid: u32, var: &str, value: &str) -> bool {
    group_carries_any(pgid, var, &mut |v| v == value)
}

/// Whether a live member of group `pgid` has `var` set to a value `accept` takes.
pub(crate) fn group_carries_any(
    pgid: u32,
    var: &str,
    accept: &mut dyn FnMut(&str) -> bool,
) -> bool {
    live_members(pgid)
        .unwrap_or_default()
        .into_iter()
        .any(|(pid, tid)| environ_of(pid, tid).is_some_and(|env| env_has(&env, var, accept)))
}

/// The environment process `pid` was started with, read through its live thread `tid`
/// (`None` if it cannot be read: another user's, or gone).
fn environ_of(pid: u32, tid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/task/{tid}/environ")).ok()
}

/// Whether the environment block `env` sets `var` to a value `accept` takes.
fn env_has(env: &[u8], var: &str, accept: &mut dyn FnMut(&str) -> bool) -> bool {
    let prefix = format!("{var}=");
    env.split(|b| *b == 0).any(|e| {
        std::str::from_utf8(e)
            .ok()
            .and_then(|e| e.strip_prefix(&prefix))
            .is_some_and(&mut *accept)
    })
}

/// The live keepers of runs nested in process group `pgid`, the group of a command that
/// was started with a `var` (its [`held::MARK_VAR`] mark) that `want` accepts, this
/// process aside: a nested run's wrapper is that command or one of its descendants in its
/// group, and its keeper is started with the wrapper's environment plus [`KEEPER_ENV`]
/// and [`KEEPER_GROUP_ENV`] (the wrapper's group), so it carries all three. A nested run
/// the command moved out of its group names another group and is left out.
pub(crate) fn nested_keepers_where(
    pgid: u32,
    var: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Vec<u32> {
    let me = std::process::id();
    let group = pgid.to_string();
    live_processes(&mut |_| true)
        .unwrap_or_default()
        .into_iter()
        .filter(|&(pid, tid)| {
            pid != me
                && environ_of(pid, tid).is_some_and(|env| {
                    env_has(&env, KEEPER_GROUP_ENV, &mut |g| g == group)
                        && env_has(&env, KEEPER_ENV, &mut |_| true)
                        && env_has(&env, var, &mut *want)
                })
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// SIGTERM to the group, SIGKILL after [`KILL_DELAY`]; returns once no live member is
/// left.
pub(crate) fn terminate_group(pgid: u32) {
    terminate_group_keeping(pgid, &mut || true);
}

/// [`terminate_group`], calling `keep` every [`KEEP_EVERY`] while it waits (a claim's
/// renewal: the wait can last [`KILL_DELAY`], longer than a claim's grace). Returns
/// `false` as soon as `keep` does (the claim is lost; whoever took it ends the group),
/// `true` once the group is gone.
pub(crate) fn terminate_group_keeping(pgid: u32, keep: &mut dyn FnMut() -> bool) -> bool {
    let Some(p) = pid_of(pgid) else { return true };
    let _ = rustix::process::kill_process_group(p, Signal::TERM);
    let _ = rustix::process::kill_process_group(p, Signal::CONT);
    let started = Instant::now();
    let deadline = started + KILL_DELAY;
    let mut next_keep = started + KEEP_EVERY;
    let mut killed = false;
    while group_alive(pgid) {
        let now = Instant::now();
        if !killed && now >= deadline {
            let _ = rustix::process::kill_process_group(p, Signal::KILL);
            killed = true;
        }
        if now >= next_keep {
            if !keep() {
                return false;
            }
            next_keep = now + KEEP_EVERY;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

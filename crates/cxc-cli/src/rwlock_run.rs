//! `cxc create rwlock PATH [--holders N] [--grace D]` and
//! `cxc rwlock run --shared|--exclusive PATH [-n] [-w D] [-E N] -- CMD ARGS...`: flock(1)
//! `-s`/`-x` on a `SharedRwLock`. The read or write lock is held by a keeper process on
//! behalf of the command's process group (see `supervise`), as `lease run` holds the lease.
//!
//! The file is a `SharedRwLock<u64>` whose payload is the `lease run` record: a tag, a run
//! counter and the process group of the exclusive command running on the write lock (0:
//! none). An exclusive run records its group after starting it and clears it when the
//! group is gone; a run that finds a group recorded (its keeper was SIGKILLed, or stopped
//! past the grace and evicted) terminates that group before running its own command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cxc::{RwLockError, RwLockOptions, SharedRwLock};

use crate::supervise::{self, Ended, Parent, Signals, Waiting};
use crate::{CliError, EXIT_LEASE_LOST, duration, files};

/// The payload `cxc create rwlock` and `rwlock run` use.
pub(crate) type Payload = u64;

/// Arguments of `cxc create rwlock`.
#[derive(clap::Args, Debug)]
pub(crate) struct CreateRwLock {
    /// The new file.
    path: PathBuf,
    /// Holder-table slots: how many processes (runs) may use the lock at once.
    #[arg(long, default_value_t = 64)]
    holders: u32,
    /// How long a writer may make no progress while others wait before it is evicted
    /// (an exclusive run's keeper shows progress every quarter of it, at most every
    /// 100 ms).
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    grace: Duration,
    /// File permission bits, octal.
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    mode: u32,
}

/// Arguments of `cxc rwlock run`.
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["shared", "exclusive"])))]
pub(crate) struct RwLockRun {
    /// Hold a read lock: any number of shared runs at once, none with an exclusive one.
    #[arg(long, short = 's')]
    shared: bool,
    /// Hold the write lock: alone (flock -x).
    #[arg(long, short = 'x')]
    exclusive: bool,
    /// The lock file (created as `cxc create rwlock` makes it if missing).
    path: PathBuf,
    /// Holder-table slots of a file this command creates.
    #[arg(long, default_value_t = 64)]
    holders: u32,
    /// Grace of a file this command creates (see `cxc create rwlock --grace`).
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    grace: Duration,
    #[command(flatten)]
    waiting: Waiting,
}

/// The exit codes of `rwlock run`, as `--help` shows them (`lease run`'s, with 75 for an
/// evicted exclusive run).
const EXIT_CODES: &str = "\
Exit codes:
  N        the command's own exit code (128+S if it died of signal S)
  1        conflict (-n found the lock taken) or timeout (-w ran out); -E N changes it
  2        usage error, or the file is missing, foreign or unusable
  75       --exclusive: the write lock was lost while the command ran (the keeper made no
           progress for the file's grace while others waited); the command's process
           group was terminated
  126      the command was found but could not be run
  127      the command was not found

The lock is held on behalf of the command's process group: an exclusive run starts only
once every earlier group is gone, whatever happens to the wrappers. SIGTERM/SIGINT/SIGHUP
are forwarded to the group; if the wrapper dies, the group is terminated (SIGTERM, SIGKILL
2 s later). See docs/cli.md.";

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("`{s}` is not an octal file mode"))
}

/// `e` about `path`, worded as the other file errors (exit 2).
fn rw_error(path: &Path, e: &RwLockError) -> CliError {
    match e {
        RwLockError::File(m) => files::error(path, m),
        other => CliError::usage(format!("{}: {other}", path.display())),
    }
}

const TAG: u64 = 0xC5 << 56;
const TAG_MASK: u64 = 0xFF << 56;

fn record(runs: u64, pgid: u32) -> Payload {
    TAG | ((runs & 0xFF_FFFF) << 32) | u64::from(pgid)
}

/// The run counter and the recorded process group (`None`: none, or not written by
/// `rwlock run`).
fn decode(v: Payload) -> (u64, Option<u32>) {
    if v & TAG_MASK == TAG {
        ((v >> 32) & 0xFF_FFFF, Some(v as u32).filter(|p| *p != 0))
    } else {
        (0, None)
    }
}

/// `cxc create rwlock`.
pub(crate) fn create(args: CreateRwLock) -> Result<(), CliError> {
    let opts = RwLockOptions::default()
        .holders(args.holders)
        .grace(args.grace)
        .mode(args.mode);
    SharedRwLock::<Payload>::create_with(&args.path, 0, &opts)
        .map_err(|e| rw_error(&args.path, &e))?;
    println!(
        "created rwlock {} ({} holders, grace {:?})",
        args.path.display(),
        args.holders,
        args.grace
    );
    Ok(())
}

/// `cxc rwlock run`.
pub(crate) fn run(args: RwLockRun) -> Result<u8, CliError> {
    match Parent::from_env()? {
        None => supervise::wrap(),
        Some(parent) => keep(args, &parent),
    }
}

/// Terminates the group `recorded` names if it is not ours and still has live members:
/// its run's keeper is gone or was evicted, so nothing else will.
fn end_orphan(what: &str, recorded: Option<u32>) {
    let own_group = rustix::process::getpgrp().as_raw_pid().unsigned_abs();
    if let Some(pgid) = recorded.filter(|p| *p != own_group)
        && supervise::group_alive(pgid)
    {
        eprintln!(
            "cxc: {what}: the previous exclusive command (process group {pgid}) outlived its \
             lock; terminating it before running"
        );
        supervise::terminate_group(pgid);
    }
}

fn keep(args: RwLockRun, parent: &Parent) -> Result<u8, CliError> {
    let signals = Signals::install()?;
    let path = &files::follow(&args.path);
    let opts = RwLockOptions::default()
        .holders(args.holders)
        .grace(args.grace);
    let (lock, _) = SharedRwLock::<Payload>::create_or_open(path, 0, &opts)
        .map_err(|e| rw_error(&args.path, &e))?;
    let env = [("CXC_RWLOCK_PATH", path.clone().into_os_string())];
    if args.shared {
        let what = format!("a read lock of {}", path.display());
        let guard = args.waiting.acquire(&what, parent, &signals, |t| {
            if t.is_zero() {
                lock.try_read()
            } else {
                lock.read_timeout(t)
            }
        })?;
        end_orphan(&what, decode(guard.get()).1);
        let running = supervise::spawn(&args.waiting.argv(), &env)?;
        // Read holds do not expire: nothing to renew.
        let ended = supervise::supervise(
            running,
            parent,
            &signals,
            Duration::from_secs(1),
            &mut || true,
        );
        drop(guard);
        return match ended {
            Ended::Exited(code) => Ok(code),
            Ended::WrapperDied | Ended::Lost => Ok(EXIT_LEASE_LOST),
        };
    }
    let what = format!("the write lock of {}", path.display());
    let guard = args.waiting.acquire(&what, parent, &signals, |t| {
        if t.is_zero() {
            lock.try_write()
        } else {
            lock.write_timeout(t)
        }
    })?;
    let (runs, prev) = decode(guard.read().unwrap_or(0));
    end_orphan(&what, prev);
    let runs = runs + 1;
    let token = guard.token();
    let mut env = env.to_vec();
    env.push(("CXC_FENCING_TOKEN", token.to_string().into()));
    let running = match supervise::spawn(&args.waiting.argv(), &env) {
        Ok(r) => r,
        Err(e) => {
            let _ = guard.write(record(runs, 0));
            return Err(e);
        }
    };
    let _ = guard.write(record(runs, running.pgid));
    let period = (lock.grace() / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let ended = supervise::supervise(running, parent, &signals, period, &mut || {
        guard.beat().is_ok()
    });
    match ended {
        Ended::Exited(code) => {
            let _ = guard.write(record(runs, 0));
            Ok(code)
        }
        Ended::WrapperDied => {
            let _ = guard.write(record(runs, 0));
            Ok(EXIT_LEASE_LOST)
        }
        Ended::Lost => Err(CliError {
            code: EXIT_LEASE_LOST,
            msg: format!(
                "{what} lost (token {token} evicted: this run made no progress for the grace); \
                 the command's process group was terminated"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_foreign_payloads_name_no_group() {
        assert_eq!(decode(record(7, 1234)), (7, Some(1234)));
        assert_eq!(decode(record(8, 0)), (8, None));
        assert_eq!(decode(0), (0, None));
        assert_eq!(decode(1234), (0, None));
    }
}

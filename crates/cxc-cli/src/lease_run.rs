//! `cxc lease run PATH [-n] [-w D] [-E N] [--kill-after D] -- CMD ARGS...`: flock(1)
//! with crash failover. The claim is held by a keeper process on behalf of the command's
//! process group (see `supervise`).

use std::path::PathBuf;
use std::time::Duration;

use cxc::{EpochMode, OwnerLease};

use crate::supervise::{self, Ended, Parent, Signals, Waiting};
use crate::{CliError, EXIT_LEASE_LOST, duration, files};

/// Arguments of `cxc lease run`.
#[derive(clap::Args, Debug)]
#[command(after_help = supervise::EXIT_CODES)]
pub(crate) struct LeaseRun {
    /// The lease file (created as `cxc create lease` makes it if missing).
    path: PathBuf,
    /// Opt-in hung-holder takeover: a waiter that sees the holder's heartbeat stale for
    /// this long terminates the holder's process group (SIGTERM, SIGKILL 2 s later) and
    /// runs only once it is gone. Default: never take over from a live holder.
    #[arg(long, value_parser = duration::parse)]
    kill_after: Option<Duration>,
    /// Epoch length of a lease file this command creates.
    #[arg(long, default_value = "1ms", value_parser = duration::parse)]
    tick: Duration,
    #[command(flatten)]
    waiting: Waiting,
}

/// The payload of a lease used by `lease run`: a tag, the run counter and the process
/// group of the command running on the claim (0: none).
const TAG: u64 = 0xC5 << 56;
const TAG_MASK: u64 = 0xFF << 56;

fn payload(runs: u64, pgid: u32) -> u64 {
    TAG | ((runs & 0xFF_FFFF) << 32) | u64::from(pgid)
}

/// The run counter and the recorded process group of a payload (`None`: not written by
/// `lease run`).
fn decode(v: u64) -> (u64, Option<u32>) {
    if v & TAG_MASK == TAG {
        ((v >> 32) & 0xFF_FFFF, Some(v as u32).filter(|p| *p != 0))
    } else {
        (0, None)
    }
}

pub(crate) fn run(args: LeaseRun) -> Result<u8, CliError> {
    match Parent::from_env()? {
        None => supervise::wrap(),
        Some(parent) => keep(args, &parent),
    }
}

fn keep(args: LeaseRun, parent: &Parent) -> Result<u8, CliError> {
    let signals = Signals::install()?;
    let path = &files::follow(&args.path);
    let builder = OwnerLease::builder(path).epoch(EpochMode::Clock { tick: args.tick });
    let builder = match args.kill_after {
        Some(d) => builder.grace(d),
        None => builder.grace_epochs(u64::MAX),
    };
    let (lease, _) = builder
        .create_or_open::<u64>(0)
        .map_err(|e| files::error(&args.path, &e))?;
    let what = format!("lease {}", path.display());
    let guard = args.waiting.acquire(&what, parent, &signals, |t| {
        if t.is_zero() {
            lease.try_lock()
        } else {
            lease.lock_timeout(t)
        }
    })?;
    let (runs, prev) = decode(guard.read().unwrap_or(0));
    let own_group = rustix::process::getpgrp().as_raw_pid().unsigned_abs();
    if let Some(pgid) = prev.filter(|p| *p != own_group)
        && supervise::group_alive(pgid)
    {
        eprintln!(
            "cxc: {what}: the previous holder's command (process group {pgid}) outlived its \
             claim; terminating it before running"
        );
        supervise::terminate_group(pgid);
    }
    let runs = runs + 1;
    let token = guard.token();
    let env = [
        ("CXC_FENCING_TOKEN", token.to_string().into()),
        ("CXC_LEASE_PATH", path.clone().into_os_string()),
    ];
    let running = match supervise::spawn(&args.waiting.argv(), &env) {
        Ok(r) => r,
        Err(e) => {
            let _ = guard.write(payload(runs, 0));
            return Err(e);
        }
    };
    let _ = guard.write(payload(runs, running.pgid));
    let period = args
        .kill_after
        .map_or(Duration::from_millis(100), |d| d / 4)
        .clamp(Duration::from_millis(1), Duration::from_millis(100));
    let ended = supervise::supervise(running, parent, &signals, period, &mut || {
        guard.beat().is_ok() && guard.is_current()
    });
    match ended {
        Ended::Exited(code) => {
            let _ = guard.write(payload(runs, 0));
            Ok(code)
        }
        Ended::WrapperDied => {
            let _ = guard.write(payload(runs, 0));
            Ok(EXIT_LEASE_LOST)
        }
        Ended::Lost => Err(CliError {
            code: EXIT_LEASE_LOST,
            msg: format!(
                "{what} lost (token {token} superseded); the command's process group was terminated"
            ),
        }),
    }
}

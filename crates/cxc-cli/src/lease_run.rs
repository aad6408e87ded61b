//! `cxc lease run PATH [-n] [-w D] [-E N] [--kill-after D | --grace N] -- CMD ARGS...`: flock(1)
//! with crash failover. The claim is held by a keeper process on behalf of the command's
//! process group (see `supervise`).

use std::path::PathBuf;
use std::time::Duration;

use cxc::{EpochMode, OwnerLease};

use crate::supervise::{self, Keeper, Waiting};
use crate::{CliError, duration, files};

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
    /// The same opt-in, in epochs of `--tick` (the first spelling of this command):
    /// `--grace N` is `--kill-after` N × tick, raised to the 10 ms minimum.
    #[arg(long, conflicts_with = "kill_after")]
    grace: Option<u64>,
    /// Epoch length of a lease file this command creates.
    #[arg(long, default_value = "1ms", value_parser = duration::parse)]
    tick: Duration,
    #[command(flatten)]
    waiting: Waiting,
}

pub(crate) fn run(args: LeaseRun) -> Result<u8, CliError> {
    supervise::run(|parent, signals| keep(&args, &args.waiting.keeper(parent, signals)))
}

/// The shortest `--kill-after` accepted (as `elect`'s shortest `--lease-duration`): a
/// holder is renewed every quarter of it, at least every millisecond.
const MIN_KILL_AFTER: Duration = Duration::from_millis(10);

/// `--kill-after`, or `--grace N` as N epochs of `--tick` (at least [`MIN_KILL_AFTER`];
/// a grace too long to count in nanoseconds is no takeover at all).
fn kill_after(args: &LeaseRun) -> Option<Duration> {
    match args.grace {
        Some(n) => {
            let ns = u64::try_from(args.tick.as_nanos()).ok()?.checked_mul(n)?;
            Some(Duration::from_nanos(ns).max(MIN_KILL_AFTER))
        }
        None => args.kill_after,
    }
}

fn keep(args: &LeaseRun, keeper: &Keeper<'_>) -> Result<u8, CliError> {
    let kill_after = kill_after(args);
    if kill_after.is_some_and(|d| d < MIN_KILL_AFTER) {
        return Err(CliError::usage("--kill-after must be at least 10ms"));
    }
    let path = &files::follow(&args.path);
    let builder = OwnerLease::builder(path).epoch(EpochMode::Clock { tick: args.tick });
    let builder = match kill_after {
        Some(d) => builder.grace(d),
        None => builder.grace_epochs(u64::MAX),
    };
    let (lease, _) = builder
        .create_or_open::<u64>(0)
        .map_err(|e| files::error(&args.path, &e))?;
    if kill_after.is_some() && lease.epoch_mode() == EpochMode::Manual {
        // Its epochs only move when something ticks them: no holder would ever look stale.
        return Err(CliError::usage(format!(
            "--kill-after needs a lease file with clock-driven epochs; {} was created with \
             manual epochs",
            args.path.display()
        )));
    }
    if let (Some(d), EpochMode::Clock { tick }) = (kill_after, lease.epoch_mode())
        && d < tick
    {
        // Staleness is judged in whole epochs of the file's tick: a shorter D would
        // silently mean up to two ticks.
        return Err(CliError::usage(format!(
            "--kill-after {d:?} is shorter than the epoch tick of {} ({tick:?}): a stale \
             heartbeat is judged in whole ticks (create the file with a shorter --tick)",
            args.path.display()
        )));
    }
    let what = format!("lease {}", path.display());
    let guard = keeper.acquire(&what, || lease.try_lock(), |t| lease.lock_timeout(t))?;
    let env = [("CXC_LEASE_PATH", path.clone().into_os_string())];
    let period = kill_after
        .map_or(Duration::from_millis(100), |d| d / 4)
        .clamp(Duration::from_millis(1), Duration::from_millis(100));
    keeper.run_exclusive(&what, path, &guard, &env, period, "superseded")
}

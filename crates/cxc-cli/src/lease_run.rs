//! `cxc lease run PATH [-n] [-w D] [-E N] [--kill-after D] -- CMD ARGS...`: flock(1)
//! with crash failover. The claim is held by a keeper process on behalf of the command's
//! process group (see `supervise`).

use std::path::PathBuf;
use std::time::Duration;

use cxc::{EpochMode, LeaseGuard, OwnerLease};

use crate::supervise::{self, ExclusiveHold, Parent, Signals, Waiting};
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
    /// Epoch length of a lease file this command creates.
    #[arg(long, default_value = "1ms", value_parser = duration::parse)]
    tick: Duration,
    #[command(flatten)]
    waiting: Waiting,
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
    let guard = args.waiting.acquire(
        &what,
        parent,
        &signals,
        || lease.try_lock(),
        |t| lease.lock_timeout(t),
    )?;
    let env = [("CXC_LEASE_PATH", path.clone().into_os_string())];
    let period = args
        .kill_after
        .map_or(Duration::from_millis(100), |d| d / 4)
        .clamp(Duration::from_millis(1), Duration::from_millis(100));
    let keeper = args.waiting.keeper(parent, &signals);
    keeper.run_exclusive(&what, &Held(&guard), &env, period, "superseded")
}

/// The claim `lease run` holds.
struct Held<'a>(&'a LeaseGuard<'a, u64>);

impl ExclusiveHold for Held<'_> {
    fn payload(&self) -> Option<u64> {
        self.0.read().ok()
    }

    fn set_payload(&self, v: u64) {
        let _ = self.0.write(v);
    }

    fn renew(&self) -> bool {
        self.0.beat().is_ok() && self.0.is_current()
    }

    fn token(&self) -> u64 {
        self.0.token()
    }
}

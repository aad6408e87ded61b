//! `cxc sem run PATH --permits N [-n] [-w D] [-E N] -- CMD ARGS...`: like GNU `sem`: at
//! most N commands at once across all shells. The permit is held by a keeper process on
//! behalf of the command's process group (see `supervise`); permits of killed keepers are
//! reclaimed.

use std::path::PathBuf;

use cxc::{SemaphoreError, SemaphoreOptions, SharedSemaphore};

use crate::supervise::{self, Keeper, Waiting};
use crate::{CliError, files};

/// Arguments of `cxc sem run`.
#[derive(clap::Args, Debug)]
#[command(after_help = supervise::EXIT_CODES)]
pub(crate) struct SemRun {
    /// The semaphore file (created with N permits if missing).
    path: PathBuf,
    /// The most commands that may run at once (must match an existing file), as sem -j.
    #[arg(long, short = 'j')]
    permits: u32,
    /// Holder-table slots of a file this command creates (default: one per permit, at
    /// least 64, at most the format's limit).
    #[arg(long)]
    holders: Option<u32>,
    #[command(flatten)]
    waiting: Waiting,
}

/// The holder-table size for `permits` permits when none is given.
pub(crate) fn default_holders(permits: u32) -> u32 {
    permits.clamp(64, SharedSemaphore::MAX_HOLDERS)
}

/// The holder-table size of a file made for `permits` permits: `holders` if given, else
/// [`default_holders`]. Fewer slots than permits is refused: every permit's holder needs a
/// slot, or runs would wait with permits free.
pub(crate) fn holders_for(permits: u32, holders: Option<u32>) -> Result<u32, CliError> {
    match holders {
        Some(h) if h < permits => Err(CliError::usage(format!(
            "--holders {h} is fewer than --permits {permits}: every permit needs a holder slot"
        ))),
        Some(h) => Ok(h),
        None => Ok(default_holders(permits)),
    }
}

pub(crate) fn run(args: SemRun) -> Result<u8, CliError> {
    supervise::run(|parent, signals| keep(&args, &args.waiting.keeper(parent, signals)))
}

fn keep(args: &SemRun, keeper: &Keeper<'_>) -> Result<u8, CliError> {
    let path = files::follow(&args.path);
    let opts = SemaphoreOptions::default().holders(holders_for(args.permits, args.holders)?);
    // More runs than holder slots (e.g. the docs' `for f in *.mp4` loop over 100 files):
    // a run that finds every slot taken by a live run waits for one to free.
    let sem = keeper.open_with_slot(&args.path.display().to_string(), || {
        match SharedSemaphore::create_or_open(&path, args.permits, args.permits, &opts) {
            Ok((sem, _)) => Ok(Some(sem)),
            Err(SemaphoreError::TableFull { .. }) => Ok(None),
            Err(e) => Err(files::error(&args.path, &e)),
        }
    })?;
    let what = format!("a permit of {}", args.path.display());
    let permit = keeper.acquire(&what, || sem.try_acquire(), |t| sem.acquire_timeout(t))?;
    let env = [("CXC_SEM_PATH", args.path.clone().into_os_string())];
    let code = keeper.run_shared(&what, &path, None, &env);
    drop(permit);
    code
}

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

use crate::supervise::{self, Keeper, Waiting};
use crate::{CliError, duration, files};

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

/// `cxc create rwlock`.
pub(crate) fn create(args: CreateRwLock) -> Result<(), CliError> {
    let opts = RwLockOptions::default()
        .holders(args.holders)
        .grace(args.grace)
        .mode(args.mode);
    SharedRwLock::<Payload>::create_with(&args.path, 0, &opts)
        .map_err(|e| rw_error(&args.path, &e))?;
    cxc_cli::report!(
        "created rwlock {} ({} holders, grace {:?})",
        args.path.display(),
        args.holders,
        args.grace
    );
    Ok(())
}

/// `cxc rwlock run`.
pub(crate) fn run(args: RwLockRun) -> Result<u8, CliError> {
    supervise::run(|parent, signals| keep(&args, &args.waiting.keeper(parent, signals)))
}

fn keep(args: &RwLockRun, keeper: &Keeper<'_>) -> Result<u8, CliError> {
    let path = &files::follow(&args.path);
    let opts = RwLockOptions::default()
        .holders(args.holders)
        .grace(args.grace);
    // More runs than holder slots: a run that finds every slot taken by a live run waits
    // for one to free (shared runs: "any number at once").
    let lock = keeper.open_with_slot(&path.display().to_string(), || {
        match SharedRwLock::<Payload>::create_or_open(path, 0, &opts) {
            Ok((lock, _)) => Ok(Some(lock)),
            Err(RwLockError::TableFull { .. }) => Ok(None),
            Err(e) => Err(rw_error(&args.path, &e)),
        }
    })?;
    let env = [("CXC_RWLOCK_PATH", path.clone().into_os_string())];
    if args.shared {
        let what = format!("a read lock of {}", path.display());
        let guard = keeper.acquire(&what, || lock.try_read(), |t| lock.read_timeout(t))?;
        let code = keeper.run_shared(&what, path, Some(guard.get()), &env);
        drop(guard);
        return code;
    }
    let what = format!("the write lock of {}", path.display());
    let guard = keeper.acquire(&what, || lock.try_write(), |t| lock.write_timeout(t))?;
    let period = (lock.grace() / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let lost = "evicted: this run made no progress for the grace";
    keeper.run_exclusive(&what, path, &guard, &env, period, lost)
}

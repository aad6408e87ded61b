//! `cxc sem run PATH --permits N [--wait D] -- CMD ARGS...`: like GNU `sem`: at most N
//! commands at once across all shells; permits of killed runs are reclaimed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cxc::{SemaphoreOptions, SharedSemaphore};

use crate::lease_run::exit_code;
use crate::{CliError, EXIT_TIMEOUT, duration};

/// Arguments of `cxc sem run`.
#[derive(clap::Args, Debug)]
pub(crate) struct SemRun {
    /// The semaphore file (created with N permits if missing).
    path: PathBuf,
    /// The most commands that may run at once (must match an existing file).
    #[arg(long)]
    permits: u32,
    /// Give up (exit 1) if no permit is free within this time (default: wait forever).
    #[arg(long, value_parser = duration::parse)]
    wait: Option<Duration>,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
}

pub(crate) fn run(args: SemRun) -> Result<u8, CliError> {
    let (sem, _) = SharedSemaphore::create_or_open(
        &args.path,
        args.permits,
        args.permits,
        &SemaphoreOptions::default(),
    )?;
    let permit = match args.wait {
        Some(d) => sem.acquire_timeout(d),
        None => Some(sem.acquire()),
    };
    let Some(permit) = permit else {
        return Err(CliError {
            code: EXIT_TIMEOUT,
            msg: format!(
                "timed out after {:?} waiting for a permit of {}",
                args.wait.unwrap_or_default(),
                args.path.display()
            ),
        });
    };
    let (program, rest) = args.cmd.split_first().expect("clap requires a command");
    let status = Command::new(program)
        .args(rest)
        .env("CXC_SEM_PATH", &args.path)
        .status();
    drop(permit);
    match status {
        Ok(s) => Ok(exit_code(s)),
        Err(e) => Err(CliError {
            code: 127,
            msg: format!("cannot run {}: {e}", program.to_string_lossy()),
        }),
    }
}

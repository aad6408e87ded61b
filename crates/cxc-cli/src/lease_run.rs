//! `cxc lease run PATH [--grace N] [--wait D] -- CMD ARGS...`: flock(1) with crash failover.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cxc::{EpochMode, LeaseOptions, OwnerLease, Preemption};

use crate::{CliError, EXIT_LEASE_LOST, EXIT_TIMEOUT, duration};

/// Arguments of `cxc lease run`.
#[derive(clap::Args, Debug)]
pub(crate) struct LeaseRun {
    /// The lease file (created with clock epochs if missing).
    path: PathBuf,
    /// Epochs without a heartbeat after which a holder is presumed dead.
    #[arg(long, default_value_t = 10)]
    grace: u64,
    /// Give up (exit 1) if the lease is not acquired within this time (default: wait forever).
    #[arg(long, value_parser = duration::parse)]
    wait: Option<Duration>,
    /// Epoch length for a lease file this command creates.
    #[arg(long, default_value = "100ms", value_parser = duration::parse)]
    tick: Duration,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
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

/// Terminates `child`: SIGTERM, then SIGKILL after `patience`.
pub(crate) fn terminate(child: &mut std::process::Child, patience: Duration) {
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) fn run(args: LeaseRun) -> Result<u8, CliError> {
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock { tick: args.tick },
        ..LeaseOptions::default()
    };
    let (lease, _) = OwnerLease::<u64>::create_or_open(&args.path, 0, &opts)?;
    let me = std::process::id();
    let wait = args
        .wait
        .unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
    let Some(claim) = lease.acquire(me, args.grace, wait) else {
        return Err(CliError {
            code: EXIT_TIMEOUT,
            msg: format!(
                "timed out after {:?} waiting for {}",
                wait,
                args.path.display()
            ),
        });
    };
    // The payload counts the runs that held this lease.
    if let Some(runs) = lease.read_claimed(&claim) {
        lease.write_claimed(&claim, runs.wrapping_add(1));
    }
    let (program, rest) = args.cmd.split_first().expect("clap requires a command");
    let spawned = Command::new(program)
        .args(rest)
        .env("CXC_FENCING_TOKEN", claim.generation().to_string())
        .env("CXC_LEASE_PATH", &args.path)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            lease.release_claim(&claim);
            return Err(CliError {
                code: 127,
                msg: format!("cannot run {}: {e}", program.to_string_lossy()),
            });
        }
    };
    // Beat at least twice per epoch, so the heartbeat never lags by a whole epoch.
    let period = (lease_tick(&lease).unwrap_or(args.tick) / 2)
        .clamp(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                lease.release_claim(&claim);
                return Ok(exit_code(status));
            }
            Ok(None) => {}
            Err(e) => {
                terminate(&mut child, Duration::from_secs(2));
                lease.release_claim(&claim);
                return Err(CliError::usage(format!("waiting for the command: {e}")));
            }
        }
        if !lease.beat_claimed(&claim) {
            eprintln!(
                "cxc: lease {} lost (generation {} superseded); terminating the command",
                args.path.display(),
                claim.generation()
            );
            terminate(&mut child, Duration::from_secs(2));
            return Ok(EXIT_LEASE_LOST);
        }
        std::thread::sleep(period);
    }
}

fn lease_tick(lease: &OwnerLease<u64>) -> Option<Duration> {
    match lease.epoch_mode() {
        EpochMode::Clock { tick } => Some(tick),
        _ => None,
    }
}

//! The `cxc` command: see and use cxc primitives from the shell.
//!
//! Exit codes: the command's own code for `lease run`/`sem run`/`rwlock run`/`elect`; 1
//! (or `-E N`) when `--wait` ran out or `-n` found the claim taken; 2 for usage errors and
//! bad files; 126/127 when the command could not be run/found; 75 when the lease, the
//! write lock or the term was lost while the command ran (the command was terminated).
//!
//! `unsafe` is denied but for [`dispositions`], which reads a signal's disposition with
//! sigaction(2).
#![deny(unsafe_code)]

mod create;
mod demo;
mod dispositions;
mod duration;
mod elect;
mod lease_run;
mod rwlock_run;
mod sem_run;
mod supervise;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cxc_cli::{
    CliError, EXIT_CANNOT_EXEC, EXIT_LEASE_LOST, EXIT_NOT_FOUND, EXIT_TIMEOUT, files, render, say,
};

/// See and use cxc cross-process primitives (leases, heartbeat tables, semaphores).
#[derive(Parser, Debug)]
#[command(name = "cxc", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a primitive's file.
    Create {
        #[command(subcommand)]
        what: create::CreateKind,
    },
    /// Show a file's whole state: kind, holders, counters, recent observations.
    Inspect {
        /// The files.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print JSON instead of text (same as --format json).
        #[arg(long)]
        json: bool,
        /// Output format: text, json or prometheus (the exposition format, all files in
        /// one report).
        #[arg(long, default_value = "text", value_parser = ["text", "json", "prometheus"])]
        format: String,
    },
    /// Redraw `inspect` until Ctrl-C: in place on a terminal, plain reports otherwise.
    /// Exits 2 if the file is missing (unless --wait-for-file).
    Watch {
        /// The file.
        path: PathBuf,
        /// Time between redraws (e.g. 500ms, 1s; at least 100ms).
        #[arg(long, default_value = "1s", value_parser = duration::parse)]
        interval: Duration,
        /// Wait for a missing file to appear instead of exiting 2.
        #[arg(long)]
        wait_for_file: bool,
        /// Output format: text, json or prometheus.
        #[arg(long, default_value = "text", value_parser = ["text", "json", "prometheus"])]
        format: String,
        /// With --format prometheus: rewrite this file atomically at every interval (for
        /// node-exporter's textfile collector) instead of printing.
        #[arg(long)]
        textfile: Option<PathBuf>,
    },
    /// Run a command while holding a lease (like flock(1), with crash failover).
    Lease {
        #[command(subcommand)]
        what: LeaseCmd,
    },
    /// Run a command holding a semaphore permit (like GNU sem): at most N at once.
    Sem {
        #[command(subcommand)]
        what: SemCmd,
    },
    /// Run a command holding a read lock (--shared) or the write lock (--exclusive) of a
    /// SharedRwLock, as flock -s / -x.
    Rwlock {
        #[command(subcommand)]
        what: RwLockCmd,
    },
    /// Run a command while this candidate leads an election (stopped when the term is
    /// lost, started again when won); the command gets CXC_FENCING_TOKEN.
    Elect(elect::Elect),
    /// A self-contained failover scenario on real processes (coordinators, workers,
    /// a lease, a heartbeat table, a semaphore); exits 0 only if every invariant held.
    Demo(demo::Demo),
    /// Internal: a demo child process.
    #[command(name = "__demo-role", hide = true)]
    DemoRole(demo::Role),
}

#[derive(Subcommand, Debug)]
enum SemCmd {
    /// Take a permit of PATH (creating it with N permits if missing), run CMD, give it back.
    Run(sem_run::SemRun),
}

#[derive(Subcommand, Debug)]
enum RwLockCmd {
    /// Take a read or the write lock of PATH (creating it if missing), run CMD, unlock
    /// once its process group is gone.
    Run(rwlock_run::RwLockRun),
}

#[derive(Subcommand, Debug)]
enum LeaseCmd {
    /// Acquire PATH (creating it if missing), run CMD while beating, release on exit.
    Run(lease_run::LeaseRun),
}

fn run(cli: Cli) -> Result<u8, CliError> {
    if matches!(cli.command, Command::Inspect { .. } | Command::Watch { .. }) {
        // They read files other processes may truncate meanwhile: that is a file that
        // stopped being valid (exit 2, one line on stderr), not a crash.
        cxc::mmf::exit_on_bus_error(i32::from(cxc_cli::EXIT_ERROR))?;
    }
    match cli.command {
        Command::Create { what } => create::run(what).map(|()| 0),
        Command::Inspect {
            paths,
            json,
            format,
        } => {
            let views = paths
                .iter()
                .map(|p| cxc_cli::load(p))
                .collect::<Result<Vec<_>, _>>()?;
            let text: String = match (json, format.as_str()) {
                (true, _) | (false, "json") => views
                    .iter()
                    .map(|v| format!("{}\n", render::json(v)))
                    .collect(),
                (false, "prometheus") => cxc_cli::prometheus::render(&views),
                _ => views.iter().map(render::text).collect(),
            };
            cxc_cli::stdout_outcome(cxc_cli::write_stdout(&text)).map(|()| 0)
        }
        Command::Watch {
            path,
            interval,
            wait_for_file,
            format,
            textfile,
        } => match textfile {
            Some(out) => {
                cxc_cli::prometheus::textfile_loop_waiting(&[path], &out, interval, wait_for_file)
                    .map(|()| 0)
            }
            None => {
                let render = move |v: &cxc_cli::View| match format.as_str() {
                    "json" => format!("{}\n", render::json(v)),
                    "prometheus" => cxc_cli::prometheus::render(std::slice::from_ref(v)),
                    _ => render::text(v),
                };
                cxc_cli::watch(&path, interval, wait_for_file, &render).map(|()| 0)
            }
        },
        Command::Lease {
            what: LeaseCmd::Run(args),
        } => lease_run::run(args),
        Command::Sem {
            what: SemCmd::Run(args),
        } => sem_run::run(args),
        Command::Rwlock {
            what: RwLockCmd::Run(args),
        } => rwlock_run::run(args),
        Command::Elect(args) => elect::run(args),
        Command::Demo(args) => demo::run(args),
        Command::DemoRole(r) => demo::run_role(r),
    }
}

fn main() -> ExitCode {
    dispositions::survive_file_size_limit();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("cxc: {}", e.msg);
            ExitCode::from(e.code)
        }
    }
}

//! `cargo xtask fuzz [--seconds N] [--target T]...`: the cargo-fuzz targets in `fuzz/`.
//!
//! Needs a nightly toolchain (skipped with a message, exit 0, without one) and
//! cargo-fuzz (installed with `cargo install cargo-fuzz --locked` when missing; skipped if
//! that fails). Writes seed corpora into `fuzz/corpus/<target>/`, builds every target,
//! then runs each for N seconds (default 60). Exits non-zero if a target crashed, leaked,
//! timed out or ran out of memory, printing the artifact to reproduce it with.

mod seeds;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::SystemTime;

use crate::root;

/// Every fuzz target (`fuzz/fuzz_targets/<name>.rs`).
pub(crate) const TARGETS: [&str; 4] = ["open_lease", "open_heartbeat", "open_semaphore", "inspect"];

/// libFuzzer's per-input time limit: a hostile file must not hang a process.
const INPUT_TIMEOUT_SECS: u32 = 10;

/// The rustup `cargo` proxy, so that `+nightly` works (`$CARGO` is a toolchain's own
/// binary), without the variables the outer cargo set for this xtask.
fn proxy_cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        // Fuzz builds (nightly, sanitizers) stay in fuzz/target.
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

fn quiet_ok(mut cmd: Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn has_nightly() -> bool {
    let mut cmd = proxy_cargo();
    cmd.args(["+nightly", "--version"]);
    quiet_ok(cmd)
}

fn has_cargo_fuzz() -> bool {
    let mut cmd = proxy_cargo();
    cmd.args(["+nightly", "fuzz", "--version"]);
    quiet_ok(cmd)
}

/// `cargo xtask fuzz` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// A target to run (repeatable; default: all).
    #[arg(long = "target", value_name = "T", value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    targets: Vec<String>,
}

impl Args {
    /// The targets to run: those named, or all.
    fn targets(&self) -> Vec<&'static str> {
        TARGETS
            .into_iter()
            .filter(|t| self.targets.is_empty() || self.targets.iter().any(|n| n == t))
            .collect()
    }
}

/// What one target's run ended with.
struct Outcome {
    target: &'static str,
    ok: bool,
    /// libFuzzer's last status line (`#N DONE cov: ... ft: ... corp: ... exec/s ...`).
    last_status: Option<String>,
    /// `stat::number_of_executed_units`.
    execs: Option<String>,
    /// Crash/leak/timeout/oom inputs written during this run.
    artifacts: Vec<PathBuf>,
}

pub(crate) fn run(args: &Args) -> ExitCode {
    if !has_nightly() {
        eprintln!(
            "xtask fuzz: SKIPPED: no nightly toolchain (`cargo +nightly --version` failed); \
             cargo-fuzz needs one: `rustup toolchain install nightly`"
        );
        return ExitCode::SUCCESS;
    }
    if !has_cargo_fuzz() {
        eprintln!(
            "xtask fuzz: cargo-fuzz not found; installing it (cargo install cargo-fuzz --locked)"
        );
        let mut install = proxy_cargo();
        install.args(["install", "cargo-fuzz", "--locked"]);
        let installed = install.status().is_ok_and(|s| s.success());
        if !installed || !has_cargo_fuzz() {
            eprintln!(
                "xtask fuzz: SKIPPED: cargo-fuzz is unavailable and could not be installed \
                 (`cargo install cargo-fuzz --locked` failed)"
            );
            return ExitCode::SUCCESS;
        }
    }
    let fuzz_dir = root().join("fuzz");
    match seeds::write_all(&fuzz_dir.join("corpus")) {
        Ok(n) => eprintln!("xtask fuzz: wrote {n} seed files into fuzz/corpus/<target>/"),
        Err(e) => {
            eprintln!("xtask fuzz: cannot write the seed corpora: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut build = proxy_cargo();
    build.args(["+nightly", "fuzz", "build"]);
    if crate::run(build) != ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    let outcomes: Vec<Outcome> = args
        .targets()
        .into_iter()
        .map(|t| run_target(&fuzz_dir, t, args.seconds))
        .collect();
    eprintln!("\nxtask fuzz: summary ({} s per target)", args.seconds);
    for o in &outcomes {
        eprintln!(
            "  {:<15} {:<7} execs {:<10} {}",
            o.target,
            if o.ok { "ok" } else { "FAILED" },
            o.execs.as_deref().unwrap_or("?"),
            o.last_status.as_deref().unwrap_or("")
        );
        for a in &o.artifacts {
            eprintln!(
                "      artifact: {}\n      reproduce: cargo +nightly fuzz run {} {}",
                a.display(),
                o.target,
                a.display()
            );
        }
    }
    if outcomes.iter().all(|o| o.ok) {
        ExitCode::SUCCESS
    } else {
        eprintln!("xtask fuzz: FAILED: a target found a bug (see the artifacts above)");
        ExitCode::FAILURE
    }
}

/// Runs one target for `seconds`, echoing libFuzzer's output and keeping its summary.
fn run_target(fuzz_dir: &Path, target: &'static str, seconds: u64) -> Outcome {
    let started = SystemTime::now();
    let mut cmd = proxy_cargo();
    cmd.args(["+nightly", "fuzz", "run", target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        // Inputs that make a lease call wait out its bounded wait for an abandoned WRITE
        // bit (100 ms) would otherwise dominate the time; this favours fast inputs.
        .arg("-entropic_scale_per_exec_time=1")
        .arg("-print_final_stats=1")
        .stderr(Stdio::piped());
    eprintln!("+ {cmd:?}");
    let mut out = Outcome {
        target,
        ok: false,
        last_status: None,
        execs: None,
        artifacts: Vec::new(),
    };
    match cmd.spawn() {
        Ok(mut child) => {
            if let Some(err) = child.stderr.take() {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    if line.starts_with('#') && line.contains("cov:") {
                        out.last_status = Some(line.clone());
                    }
                    if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
                        out.execs = Some(n.trim().to_string());
                    }
                }
            }
            out.ok = child.wait().is_ok_and(|s| s.success());
        }
        Err(e) => eprintln!("xtask fuzz: cannot run {cmd:?}: {e}"),
    }
    out.artifacts = new_artifacts(&fuzz_dir.join("artifacts").join(target), started);
    if !out.artifacts.is_empty() {
        out.ok = false;
    }
    out
}

/// Failure inputs libFuzzer wrote into `dir` since `since`.
fn new_artifacts(dir: &Path, since: SystemTime) -> Vec<PathBuf> {
    const FAILURES: [&str; 4] = ["crash-", "leak-", "timeout-", "oom-"];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            FAILURES.iter().any(|p| name.starts_with(p))
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m >= since)
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

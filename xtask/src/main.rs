//! `cargo xtask`: project automation.
//!
//! Tasks: `loom` (all loom models under `cfg(cxc_loom)`, own target dir); `bench`
//! (criterion benches + cross-process harness, writes `docs/BENCHMARKS.md`); `fuzz`
//! (cargo-fuzz targets, nightly); `torture` (kills processes at random points and checks
//! the invariants; `torture-supervise` and `torture-worker` are its own child roles).

mod torture;

mod bench;

mod fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn loom(args: &[String]) -> ExitCode {
    let preemptions = std::env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| "2".into());
    let mut cmd = cargo();
    cmd.current_dir(root())
        .env("RUSTFLAGS", "--cfg cxc_loom")
        .env("LOOM_MAX_PREEMPTIONS", preemptions)
        .env("CARGO_TARGET_DIR", root().join("target-loom"))
        .args([
            "test",
            "--release",
            "-p",
            "cxc-sync",
            "--lib",
            "--",
            "loom_",
        ])
        .args(args);
    run(cmd)
}

fn run(mut cmd: Command) -> ExitCode {
    match cmd.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("xtask: {cmd:?} failed: {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("xtask: cannot run {cmd:?}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("loom") => loom(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("torture") => torture::run(&args[1..]),
        Some("torture-supervise") => torture::supervise(&args[1..]),
        Some("torture-worker") => torture::worker(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <loom|bench|fuzz|torture> [args]");
            ExitCode::FAILURE
        }
    }
}

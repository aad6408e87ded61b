//! `cargo xtask`: project automation.
//!
//! Tasks: `loom` (all loom models under `cfg(cxc_loom)`, own target dir); `bench`
//! (criterion benches + cross-process harness, writes `docs/BENCHMARKS.md`);
//! `bench-compare` (that report's ratios of an earlier revision against this tree's,
//! measured in turns on this machine); `fuzz`
//! (cargo-fuzz targets, nightly); `torture` (kills processes at random points and checks
//! the invariants; `torture-supervise` and `torture-worker` are its own child roles).

mod torture;

mod bench;

mod fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Parses `0x`-prefixed hexadecimal or decimal (seeds are printed in hex).
fn parse_u64(v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    r.map_err(|e| format!("{v:?}: {e}"))
}

/// `cargo xtask <task> [args]`.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "cxc project automation"
)]
enum Task {
    /// Every loom model of cxc-sync (release, `--cfg cxc_loom`, target dir `target-loom`);
    /// the arguments go to the test binary.
    Loom {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The criterion benches and the cross-process harness; writes the report.
    Bench(bench::Args),
    /// The bench report's ratios of an earlier revision and of this tree, measured in
    /// turns on this machine; flags every ratio worse by more than 10 %.
    BenchCompare(bench::compare::Args),
    /// The cargo-fuzz targets (nightly).
    Fuzz(fuzz::Args),
    /// Kills, pauses and restarts workers of every primitive and checks the invariants.
    Torture(torture::Args),
    /// The torture supervisor (what `torture` runs from a release build).
    #[command(hide = true)]
    TortureSupervise(torture::Args),
    /// One torture worker process (spawned by the supervisor).
    #[command(hide = true)]
    TortureWorker(torture::WorkerOptions),
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
    match Task::parse() {
        Task::Loom { args } => loom(&args),
        Task::Bench(a) => bench::run(&a),
        Task::BenchCompare(a) => bench::compare::run(&a),
        Task::Fuzz(a) => fuzz::run(&a),
        Task::Torture(a) => torture::run(a),
        Task::TortureSupervise(a) => torture::supervise(a),
        Task::TortureWorker(o) => torture::worker(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Task, clap::Error> {
        Task::try_parse_from(std::iter::once("xtask").chain(line.split_whitespace()))
    }

    #[test]
    fn documented_invocations_parse() {
        for line in [
            "loom",
            "loom --nocapture",
            "bench",
            "bench --quick",
            "bench --quick --out some/dir --no-criterion --no-xbench",
            "bench-compare --base 01e14b8",
            "bench-compare --base HEAD~3 --rounds 3 --quick --out d",
            "fuzz --seconds 8",
            "fuzz --seconds 8 --target open_lease --target inspect",
            "torture --seconds 60",
            "torture --primitive cell",
            "torture --seconds 600 --procs 4 --seed 0x18ece79d47088402 --primitive rwlock",
            "torture --seconds 20 --procs 4 --seed 0x9 --primitive lease --ident-churn",
            "torture --seconds=5 --primitive all --dir d --keep",
        ] {
            if let Err(e) = parse(line) {
                panic!("`cargo xtask {line}` does not parse: {e}");
            }
        }
        for bad in [
            "fuzz --seconds 0",
            "fuzz --target nope",
            "torture --procs 0",
            "torture --procs 17",
            "torture --primitive bogus",
            "torture --seed zz",
            "bench --fast",
            "bench-compare",
            "bench-compare --base x --rounds 0",
            "nothing",
        ] {
            assert!(parse(bad).is_err(), "`cargo xtask {bad}` parsed");
        }
    }

    #[test]
    fn torture_options_round_trip() {
        let Ok(Task::Torture(a)) = parse(
            "torture --seconds 7 --procs 3 --seed 0x2a --primitive rwlock --primitive cell --primitive cell --keep",
        ) else {
            panic!("torture arguments do not parse");
        };
        let o = torture::Options::from(a);
        assert_eq!((o.seconds, o.procs, o.seed, o.keep), (7, 3, 42, true));
        assert_eq!(o.roles.len(), 2, "{:?}", o.roles);
        let again = format!("torture-supervise {}", o.to_args().join(" "));
        let Ok(Task::TortureSupervise(b)) = parse(&again) else {
            panic!("`{again}` does not parse");
        };
        let p = torture::Options::from(b);
        assert_eq!(
            format!(
                "{:?}",
                (p.seconds, p.procs, p.seed, &p.roles, &p.dir, p.keep)
            ),
            format!(
                "{:?}",
                (o.seconds, o.procs, o.seed, &o.roles, &o.dir, o.keep)
            )
        );
        let Ok(Task::Torture(all)) = parse("torture") else {
            panic!("bare torture does not parse");
        };
        assert_eq!(torture::Options::from(all).roles.len(), 5);
    }

    #[test]
    fn worker_options_round_trip() {
        let line = "torture-worker --role lease --dir d --seed 0x10 --id 2 --inc 3 --lease-mode siblings --open-only";
        let Ok(Task::TortureWorker(w)) = parse(line) else {
            panic!("`{line}` does not parse");
        };
        assert_eq!((w.seed, w.id, w.inc, w.open_only), (16, 2, 3, true));
        let again = format!("torture-worker {}", w.to_args().join(" "));
        let Ok(Task::TortureWorker(v)) = parse(&again) else {
            panic!("`{again}` does not parse");
        };
        assert_eq!(format!("{v:?}"), format!("{w:?}"));
    }
}

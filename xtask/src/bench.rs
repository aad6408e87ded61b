//! `cargo xtask bench [--quick] [--out DIR] [--no-criterion] [--no-xbench]`
//!
//! 1. Runs the criterion benches of `cxc-benches` and reads every median from criterion's
//!    `new/estimates.json` (`median.point_estimate`, ns), keyed by `new/benchmark.json`'s
//!    `full_id`.
//! 2. Runs the cross-process harness `cxc-xbench` in release and reads its rows.
//! 3. Writes `BENCHMARKS.md` (machine, date, every table with ours, baseline, ratio, the
//!    seed's ratio, target, met?) and `benchmarks.svg` (ratios vs targets, log scale).
//!
//! The full run writes into `docs/`; `--quick` (short measurements, well under 5
//! minutes) writes into `<target>/cxc-bench/` unless `--out` says otherwise, so a quick
//! run never overwrites the committed report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use crate::{cargo, root};

pub(crate) mod compare;
mod quote;
mod report;

/// Criterion settings of `--quick`.
const QUICK_CRITERION: [&str; 6] = [
    "--warm-up-time",
    "0.2",
    "--measurement-time",
    "0.4",
    "--sample-size",
    "10",
];

/// `cargo xtask bench` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Short measurements (well under 5 minutes); writes into `<target>/cxc-bench/`
    /// unless `--out` says otherwise.
    #[arg(long)]
    quick: bool,
    /// Where to write `BENCHMARKS.md` and `benchmarks.svg`.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Skip the criterion benches.
    #[arg(long)]
    no_criterion: bool,
    /// Skip the cross-process harness.
    #[arg(long)]
    no_xbench: bool,
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() { d } else { root().join(d) }
        }
        None => root().join("target"),
    }
}

/// Entry point.
pub(crate) fn run(opts: &Args) -> ExitCode {
    match bench(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(opts: &Args) -> Result<(), String> {
    let work = target_dir().join("cxc-bench");
    let crit_home = work.join("criterion");
    let mut medians = BTreeMap::new();
    if !opts.no_criterion {
        let _ = std::fs::remove_dir_all(&crit_home);
        let mut cmd = bench_cargo(&work);
        cmd.current_dir(root())
            .env("CRITERION_HOME", &crit_home)
            .args(["bench", "-p", "cxc-benches", "--benches"])
            .arg("--");
        if opts.quick {
            cmd.args(QUICK_CRITERION);
        }
        status(cmd)?;
        collect_criterion(&crit_home, &mut medians)?;
        eprintln!("xtask bench: {} criterion medians", medians.len());
    }
    let mut rows = BTreeMap::new();
    let mut notes = BTreeMap::new();
    if !opts.no_xbench {
        let mut cmd = bench_cargo(&work);
        cmd.current_dir(root())
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "cxc-benches",
                "--bin",
                "cxc-xbench",
            ])
            .arg("--");
        if opts.quick {
            cmd.arg("--quick");
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{cmd:?} failed: {}", out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        parse_xbench(&text, &mut rows, &mut notes);
        eprintln!("xtask bench: {} cross-process rows", rows.len());
    }
    let data = Data {
        crit: medians,
        rows,
        notes,
        quick: opts.quick,
    };
    let out_dir = match &opts.out {
        Some(d) => d.clone(),
        None if opts.quick => work.clone(),
        None => root().join("docs"),
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let report = report::render(&data, &machine());
    let md = out_dir.join("BENCHMARKS.md");
    let svg = out_dir.join("benchmarks.svg");
    std::fs::write(&md, &report.markdown).map_err(|e| format!("{}: {e}", md.display()))?;
    std::fs::write(&svg, report.svg).map_err(|e| format!("{}: {e}", svg.display()))?;
    eprintln!("xtask bench: wrote {} and {}", md.display(), svg.display());
    if out_dir == root().join("docs") {
        let n = quote::refresh_pages(&out_dir, &report.markdown)?;
        eprintln!("xtask bench: refreshed the quoted tables of {n} pages");
    }
    Ok(())
}

/// The code-alignment flag every measured build gets (see [`bench_cargo`]).
const ALIGN_FUNCTIONS: &str = "-C llvm-args=-align-all-functions=6";

/// `cargo` for the measured builds: every function aligned to 64 bytes, in a target
/// directory of their own under `work` (the flag rebuilds everything; the usual builds
/// keep their cache).
///
/// A measured loop of a few nanoseconds moves with the code around it: two builds of one
/// tree that differed only in a line number elsewhere (so in symbol hashes, and so in the
/// order the linker placed functions) measured `read_as_owner` held at 2.4 and 4.6 ns,
/// and the interleaved `acquire_release`/std Mutex ratio at 1.9 and 2.8, each build
/// steadily (AMD EPYC VM, 2026-12-06). With every function starting on a 64-byte
/// boundary, a function's hot loop keeps its place whatever changes elsewhere: both
/// builds then measured 2.3–2.6 ns and 1.94–2.0. Both sides of every ratio (ours and the
/// baseline, compiled into the same binaries) get the same alignment.
fn bench_cargo(work: &Path) -> Command {
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !flags.contains(ALIGN_FUNCTIONS) {
        if !flags.is_empty() {
            flags.push(' ');
        }
        flags.push_str(ALIGN_FUNCTIONS);
    }
    let mut cmd = cargo();
    cmd.env("RUSTFLAGS", flags)
        .env("CARGO_TARGET_DIR", work.join("aligned"));
    cmd
}

fn status(mut cmd: Command) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} failed: {s}")),
        Err(e) => Err(format!("cannot run {cmd:?}: {e}")),
    }
}

/// Everything a report is made from.
pub(crate) struct Data {
    /// Criterion medians in ns, by full id (`group/case/impl`).
    pub(crate) crit: BTreeMap<String, f64>,
    /// Cross-process rows by id.
    pub(crate) rows: BTreeMap<String, Row>,
    /// Notes from the harness, by key.
    pub(crate) notes: BTreeMap<String, String>,
    /// Whether this was a quick run.
    pub(crate) quick: bool,
}

/// One cross-process row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) median: f64,
    pub(crate) p99: f64,
    pub(crate) n: usize,
}

fn collect_criterion(dir: &Path, out: &mut BTreeMap<String, f64>) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            let (Ok(bench), Ok(est)) = (
                std::fs::read_to_string(path.join("benchmark.json")),
                std::fs::read_to_string(path.join("estimates.json")),
            ) else {
                continue;
            };
            if let Some((id, median)) = criterion_median(&bench, &est) {
                out.insert(id, median);
            }
        } else {
            collect_criterion(&path, out)?;
        }
    }
    Ok(())
}

/// A benchmark's id (`full_id` of criterion's `benchmark.json`) and median in ns
/// (`median.point_estimate` of its `estimates.json`); `None` if either is missing.
fn criterion_median(benchmark: &str, estimates: &str) -> Option<(String, f64)> {
    let benchmark: serde_json::Value = serde_json::from_str(benchmark).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(estimates).ok()?;
    let id = benchmark.get("full_id")?.as_str()?.to_owned();
    let median = estimates.get("median")?.get("point_estimate")?.as_f64()?;
    Some((id, median))
}

fn parse_xbench(
    text: &str,
    rows: &mut BTreeMap<String, Row>,
    notes: &mut BTreeMap<String, String>,
) {
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["row", id, _unit, median, p99, n] => {
                if let (Ok(median), Ok(p99), Ok(n)) = (median.parse(), p99.parse(), n.parse()) {
                    rows.insert(id.to_string(), Row { median, p99, n });
                }
            }
            ["note", key, text] => {
                notes.insert(key.to_string(), text.to_string());
            }
            _ => {}
        }
    }
}

/// The machine a report was measured on.
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    pub(crate) rustc: String,
    pub(crate) date: String,
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let mut cpu_model = field("model name").unwrap_or_else(|| "unknown".into());
    // The model name alone hides which generation a VM runs on ("AMD EPYC"), and the
    // generation moves the ratios (notes, "The CPU decides the ratios").
    if let (Some(family), Some(model)) = (field("cpu family"), field("model")) {
        cpu_model.push_str(&format!(" (family {family}, model {model})"));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.into());
    let rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-V")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        kernel,
        rustc,
        date: utc_now(),
    }
}

/// The current UTC date and time, `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    utc_minute(std::time::SystemTime::now())
}

/// `t` as `YYYY-MM-DD HH:MM UTC` (from RFC 3339's `YYYY-MM-DDTHH:MM:SSZ`).
fn utc_minute(t: std::time::SystemTime) -> String {
    let rfc3339 = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} {} UTC", &rfc3339[..10], &rfc3339[11..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_criterion_fields() {
        let est = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},"point_estimate":1.5,"standard_error":0.1},"median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":3.0,"upper_bound":4.0},"point_estimate":3.25e1,"standard_error":0.1}}"#;
        let b = r#"{"group_id":"owner_lease","function_id":"acquire_release/lease","value_str":null,"full_id":"owner_lease/acquire_release/lease","directory_name":"owner_lease/acquire_release_lease"}"#;
        assert_eq!(
            criterion_median(b, est),
            Some(("owner_lease/acquire_release/lease".to_owned(), 32.5))
        );
        assert_eq!(criterion_median(b, r#"{"mean":{}}"#), None);
    }

    #[test]
    fn parses_rows_and_notes() {
        let mut rows = BTreeMap::new();
        let mut notes = BTreeMap::new();
        parse_xbench(
            "row\thandoff/lease\tns\t10.0\t20.0\t5\nnote\tk\tsome text\nnoise\n",
            &mut rows,
            &mut notes,
        );
        assert_eq!(rows["handoff/lease"].median, 10.0);
        assert_eq!(rows["handoff/lease"].n, 5);
        assert_eq!(notes["k"], "some text");
    }

    #[test]
    fn dates_are_utc_minutes() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_072_069);
        assert_eq!(utc_minute(t), "2026-11-30 20:54 UTC");
        assert_eq!(utc_minute(std::time::UNIX_EPOCH), "1970-01-01 00:00 UTC");
        let d = utc_now();
        assert!(d.ends_with(" UTC") && d.len() == 20, "{d}");
    }
}

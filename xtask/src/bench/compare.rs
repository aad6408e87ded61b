//! `cargo xtask bench-compare --base REV [--rounds N] [--quick] [--out DIR]`
//!
//! Compares every ratio of `docs/BENCHMARKS.md` (ours / baseline, same run) between an
//! earlier revision and this tree **on this machine**: the ratios of two reports written
//! on different machines differ by more than the changes being judged (see
//! `benches/notes.md`, "The CPU decides the ratios").
//!
//! 1. Checks `REV` out into a detached git worktree under `<target>/cxc-bench-compare/`
//!    (kept between runs, so its build is reused).
//! 2. Runs `cargo xtask bench --out ...` in the base worktree and in this tree, taking
//!    turns, `N` times each (default 2), so load from other work falls on both alike.
//! 3. Reads every table of the reports, takes for each ratio (a row's `ours/...`,
//!    `median / ...` or `measured` cell) the median over the rounds, and writes
//!    `compare.md`: base, head, head/base and whether the change is worse by more than
//!    10 % (rows whose target is `≥` and throughput rows count higher as better).
//!
//! Rows that exist in only one of the reports are listed apart. A baseline measured
//! differently in the two trees changes its rows' ratios too: the report shows ours and
//! the baseline as they were, and the reader judges.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::{cargo, root};

/// A change by more than this factor, in the worse direction, is flagged.
const WORSE_BY: f64 = 1.10;

/// `cargo xtask bench-compare` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The earlier revision (anything `git rev-parse` takes).
    #[arg(long, value_name = "REV")]
    base: String,
    /// Full bench runs per tree (they take turns).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Short measurements (`cargo xtask bench --quick`): a smoke test, not a verdict.
    #[arg(long)]
    quick: bool,
    /// Where to write the reports and `compare.md` (default `<target>/cxc-bench-compare`).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Entry point.
pub(crate) fn run(opts: &Args) -> ExitCode {
    match compare(opts) {
        Ok(path) => {
            eprintln!("xtask bench-compare: wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask bench-compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn compare(opts: &Args) -> Result<PathBuf, String> {
    let work = opts
        .out
        .clone()
        .unwrap_or_else(|| super::target_dir().join("cxc-bench-compare"));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let base_rev = git(
        &root(),
        &[
            "rev-parse",
            "--verify",
            &format!("{}^{{commit}}", opts.base),
        ],
    )?;
    let head_rev = git(&root(), &["rev-parse", "HEAD"])?;
    let tree = work.join("base-tree");
    checkout(&tree, &base_rev)?;

    let mut base_reports = Vec::new();
    let mut head_reports = Vec::new();
    for round in 1..=opts.rounds {
        for (name, dir, reports) in [
            ("base", tree.as_path(), &mut base_reports),
            ("head", root().as_path(), &mut head_reports),
        ] {
            let out = work.join(format!("{name}-{round}"));
            eprintln!("xtask bench-compare: round {round}/{}, {name}", opts.rounds);
            let mut cmd = cargo();
            cmd.current_dir(dir)
                .args(["xtask", "bench", "--out"])
                .arg(&out);
            if name == "base" {
                // The base tree builds into its own target dir (its sources differ).
                cmd.env_remove("CARGO_TARGET_DIR");
            }
            if opts.quick {
                cmd.arg("--quick");
            }
            status(cmd)?;
            let md = out.join("BENCHMARKS.md");
            let text =
                std::fs::read_to_string(&md).map_err(|e| format!("{}: {e}", md.display()))?;
            reports.push(parse(&text));
        }
    }
    let text = render(
        &base_rev,
        &head_rev,
        opts,
        &merge(&base_reports),
        &merge(&head_reports),
    );
    let path = work.join("compare.md");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// A detached worktree of `rev` at `tree`: kept if it is one already (its build is
/// reused), else an old one is removed first.
fn checkout(tree: &Path, rev: &str) -> Result<(), String> {
    if git(tree, &["rev-parse", "HEAD"]).is_ok_and(|h| h == rev)
        && git(tree, &["status", "--porcelain", "--untracked-files=no"]).is_ok_and(|s| s.is_empty())
    {
        return Ok(());
    }
    if tree.exists() {
        let _ = git(
            &root(),
            &["worktree", "remove", "--force", &tree.display().to_string()],
        );
        let _ = std::fs::remove_dir_all(tree);
    }
    git(
        &root(),
        &[
            "worktree",
            "add",
            "--detach",
            &tree.display().to_string(),
            rev,
        ],
    )
    .map(|_| ())
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn status(mut cmd: Command) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} failed: {s}")),
        Err(e) => Err(format!("cannot run {cmd:?}: {e}")),
    }
}

/// One ratio of a report: the section it is in, its row, its column.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    section: String,
    row: String,
    column: String,
}

/// A ratio's value, whether higher is better, and whether its row is a baseline's (a
/// peer measured beside ours, such as flock against the raw futex): those rows say how
/// the baselines moved, and are not counted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ratio {
    value: f64,
    higher_is_better: bool,
    baseline: bool,
}

/// How the rows of the baselines begin in the cross-process tables.
const BASELINES: [&str; 7] = [
    "flock",
    "futex mutex",
    "raw futex",
    "raw spin",
    "robust pthread",
    "pthread rwlock",
    "SysV",
];

/// Every ratio of a `BENCHMARKS.md`: in each table, the cells of the columns named
/// `measured` or with a `/` in their header (`ours/std Mutex`, `median / flock`; not a
/// rate such as `ops/s`), whose text starts with a number. The row is named by its first cell (two for the sidecar
/// table, whose first column is the hold time).
fn parse(md: &str) -> BTreeMap<Key, Ratio> {
    let mut out = BTreeMap::new();
    let mut section = String::new();
    let mut header: Option<Vec<String>> = None;
    for line in md.lines() {
        if let Some(h) = line.strip_prefix('#') {
            section = h.trim_start_matches('#').trim().to_string();
            header = None;
            continue;
        }
        let Some(body) = line.trim().strip_prefix('|') else {
            header = None;
            continue;
        };
        let cells: Vec<String> = body
            .trim_end_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        let Some(head) = &header else {
            header = Some(cells);
            continue;
        };
        if cells[0].chars().all(|c| matches!(c, '-' | ':' | ' ')) {
            continue;
        }
        let key_cells = if head[0] == "hold" { 2 } else { 1 };
        let baseline = BASELINES
            .iter()
            .any(|b| cells[key_cells - 1].starts_with(b));
        let row = cells
            .iter()
            .take(key_cells)
            .cloned()
            .collect::<Vec<_>>()
            .join(" / ");
        let target = head
            .iter()
            .rposition(|h| h == "target")
            .and_then(|i| cells.get(i))
            .map(String::as_str)
            .unwrap_or("");
        let throughput = head.iter().any(|h| h.contains("ops/s"));
        let higher_is_better = target.starts_with('≥') || throughput;
        for (h, c) in head.iter().zip(&cells) {
            let ratio = h.contains('/') && !h.contains("ops/s") && !h.contains("ns/op");
            if !(h == "measured" || ratio) {
                continue;
            }
            if let Some(value) = leading_number(c) {
                out.insert(
                    Key {
                        section: section.clone(),
                        row: row.clone(),
                        column: h.clone(),
                    },
                    Ratio {
                        value,
                        higher_is_better,
                        baseline,
                    },
                );
            }
        }
    }
    out
}

/// The number a cell starts with (`**1.22**`, `0.37 ns`), if any.
fn leading_number(cell: &str) -> Option<f64> {
    let t = cell.trim_start_matches('*');
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t[..end].parse().ok()
}

/// A figure as the reports print them: three decimals at most, no trailing zeros.
fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The median of every ratio over the reports that have it.
fn merge(reports: &[BTreeMap<Key, Ratio>]) -> BTreeMap<Key, Ratio> {
    let mut all: BTreeMap<Key, (Vec<f64>, Ratio)> = BTreeMap::new();
    for r in reports {
        for (k, v) in r {
            all.entry(k.clone())
                .or_insert((Vec::new(), *v))
                .0
                .push(v.value);
        }
    }
    all.into_iter()
        .map(|(k, (mut v, first))| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let value = if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            };
            (k, Ratio { value, ..first })
        })
        .collect()
}

/// Whether `head` is worse than `base` by more than [`WORSE_BY`] (never for a baseline's
/// row).
fn worse(base: Ratio, head: Ratio) -> bool {
    if base.baseline || base.value <= 0.0 || head.value <= 0.0 {
        return false;
    }
    if base.higher_is_better {
        head.value * WORSE_BY < base.value
    } else {
        head.value > base.value * WORSE_BY
    }
}

fn render(
    base_rev: &str,
    head_rev: &str,
    opts: &Args,
    base: &BTreeMap<Key, Ratio>,
    head: &BTreeMap<Key, Ratio>,
) -> String {
    let mut s = String::new();
    let short = |r: &str| r.chars().take(10).collect::<String>();
    s.push_str("# Bench comparison\n\n");
    s.push_str(&format!(
        "Base `{}`, head `{}`, {} round(s) of `cargo xtask bench{}` each, taking turns, \
         on one machine. Medians over the rounds; head/base > {WORSE_BY} (or < 1/{WORSE_BY} \
         where higher is better) is flagged.\n\n",
        short(base_rev),
        short(head_rev),
        opts.rounds,
        if opts.quick { " --quick" } else { "" },
    ));
    s.push_str("| section | row | ratio | base | head | head/base | worse by > 10 %? |\n");
    s.push_str("|---|---|---|---:|---:|---:|---|\n");
    let mut flagged = 0;
    for (k, b) in base {
        let Some(h) = head.get(k) else { continue };
        let bad = worse(*b, *h);
        flagged += usize::from(bad);
        let change = if b.value > 0.0 {
            format!("{:.2}", h.value / b.value)
        } else {
            "—".into()
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            k.section,
            k.row,
            k.column,
            number(b.value),
            number(h.value),
            change,
            if b.baseline {
                "(baseline)"
            } else if bad {
                "**yes**"
            } else {
                "no"
            }
        ));
    }
    s.push_str(&format!(
        "\n{flagged} ratio(s) of ours worse by more than 10 %.\n"
    ));
    let only = |a: &BTreeMap<Key, Ratio>, b: &BTreeMap<Key, Ratio>| {
        a.keys()
            .filter(|k| !b.contains_key(*k))
            .map(|k| format!("- {} | {} | {}\n", k.section, k.row, k.column))
            .collect::<String>()
    };
    let (ob, oh) = (only(base, head), only(head, base));
    if !ob.is_empty() {
        s.push_str("\nOnly in the base report:\n\n");
        s.push_str(&ob);
    }
    if !oh.is_empty() {
        s.push_str("\nOnly in the head report:\n\n");
        s.push_str(&oh);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
# Benchmarks

## Targets

| target | measured | seed | target | met? |
|---|---:|---:|---:|---|
| acquire_release / std Mutex | **1.22** | 1.43 | ≤ 1 | **missed** |
| contended throughput / robust pthread | 0.95 | — | ≥ 0.9 | met |
| flock | 0.95 | — | — | — |
| iter_in_flight_bits, ns per bit | 0.37 ns | 8.50 ns | ≤ 2 ns | met |

### Sidecar

| hold | strategy | RTT median | RTT p99 | RTT / raw spin | CPU | target | met? |
|---|---|---:|---:|---:|---:|---|---|
| short | always park | 48.57 µs | 66.58 µs | 22.46 | 92 % | — | — |
";

    fn key(section: &str, row: &str, column: &str) -> Key {
        Key {
            section: section.into(),
            row: row.into(),
            column: column.into(),
        }
    }

    #[test]
    fn reads_every_ratio_with_its_direction() {
        let r = parse(REPORT);
        assert_eq!(r.len(), 5, "{r:?}");
        assert!(r[&key("Targets", "flock", "measured")].baseline);
        let a = r[&key("Targets", "acquire_release / std Mutex", "measured")];
        assert_eq!(a.value, 1.22);
        assert!(!a.higher_is_better && !a.baseline);
        assert!(
            r[&key(
                "Targets",
                "contended throughput / robust pthread",
                "measured"
            )]
                .higher_is_better
        );
        assert_eq!(
            r[&key("Targets", "iter_in_flight_bits, ns per bit", "measured")].value,
            0.37
        );
        assert_eq!(
            r[&key("Sidecar", "short / always park", "RTT / raw spin")].value,
            22.46
        );
    }

    #[test]
    fn flags_only_changes_beyond_ten_percent_in_the_worse_direction() {
        let lower = |value| Ratio {
            value,
            higher_is_better: false,
            baseline: false,
        };
        let higher = |value| Ratio {
            value,
            higher_is_better: true,
            baseline: false,
        };
        assert!(worse(lower(1.0), lower(1.11)));
        assert!(!worse(lower(1.0), lower(1.09)));
        assert!(!worse(lower(1.0), lower(0.5)));
        assert!(worse(higher(1.0), higher(0.90)));
        assert!(!worse(higher(1.0), higher(0.92)));
        assert!(!worse(higher(1.0), higher(2.0)));
        assert!(!worse(lower(0.0), lower(1.0)));
        let peer = Ratio {
            baseline: true,
            ..lower(1.0)
        };
        assert!(!worse(peer, Ratio { value: 2.0, ..peer }));
    }

    #[test]
    fn medians_over_rounds() {
        let mk = |v| {
            let mut m = BTreeMap::new();
            m.insert(
                key("s", "r", "c"),
                Ratio {
                    value: v,
                    higher_is_better: false,
                    baseline: false,
                },
            );
            m
        };
        let m = merge(&[mk(3.0), mk(1.0), mk(2.0)]);
        assert_eq!(m[&key("s", "r", "c")].value, 2.0);
        let m = merge(&[mk(3.0), mk(1.0)]);
        assert_eq!(m[&key("s", "r", "c")].value, 2.0);
    }

    #[test]
    fn figures_print_as_in_the_reports() {
        assert_eq!(number(0.12000000000000001), "0.12");
        assert_eq!(number(2.5149999999999997), "2.515");
        assert_eq!(number(1.0), "1");
        assert_eq!(number(66349329.0), "66349329");
    }

    #[test]
    fn numbers_at_the_start_of_cells() {
        assert_eq!(leading_number("**1.22**"), Some(1.22));
        assert_eq!(leading_number("0.37 ns"), Some(0.37));
        assert_eq!(leading_number("—"), None);
        assert_eq!(leading_number("met"), None);
    }
}

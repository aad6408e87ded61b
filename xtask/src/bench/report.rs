//! Renders `BENCHMARKS.md` and `benchmarks.svg` from one run's numbers.
//!
//! Which benchmark is compared with which baseline, the seeds' published ratios and the
//! targets are fixed here (the criterion comparisons in `criterion.tsv`); every measured
//! number comes from the run. Explanations for missed targets come from `benches/notes.md`
//! (a `## <key>` section per target row) and are printed only for rows that missed in this
//! run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Data, Machine, Row};

/// The rendered report.
pub(crate) struct Report {
    pub(crate) markdown: String,
    pub(crate) svg: String,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    None,
    /// The value must be at most this.
    Max(f64),
    /// The value must be at least this.
    Min(f64),
}

impl Target {
    fn met(self, v: Option<f64>) -> Option<bool> {
        match (self, v) {
            (Target::Max(t), Some(v)) => Some(v <= t),
            (Target::Min(t), Some(v)) => Some(v >= t),
            _ => None,
        }
    }

    fn show(self, unit: &str) -> String {
        match self {
            Target::None => "—".into(),
            Target::Max(t) => format!("≤ {}{unit}", trim(t)),
            Target::Min(t) => format!("≥ {}{unit}", trim(t)),
        }
    }
}

/// A row of the targets summary (and, for ratios, a bar of the chart).
struct Goal {
    key: String,
    label: String,
    value: Option<f64>,
    unit: &'static str,
    seed: Option<f64>,
    target: Target,
    /// Plotted on the ratio chart.
    ratio: bool,
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn ns(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(v) if v < 1e3 => format!("{v:.2} ns"),
        Some(v) if v < 1e6 => format!("{:.2} µs", v / 1e3),
        Some(v) if v < 1e9 => format!("{:.2} ms", v / 1e6),
        Some(v) => format!("{:.2} s", v / 1e9),
    }
}

fn ratio(v: Option<f64>) -> String {
    v.map_or("—".into(), |r| format!("{r:.2}"))
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "—",
    }
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// One criterion comparison: `ours` vs `base` (std Mutex or the seed's baseline) and
/// optionally `alt` (parking_lot, or the semaphore's fair peer).
struct Crit {
    key: &'static str,
    case: &'static str,
    ours: &'static str,
    base: &'static str,
    alt: Option<&'static str>,
    seed: Option<f64>,
    target: Target,
}

/// The criterion comparisons (see the header of `criterion.tsv`).
const CRITERION: &str = include_str!("criterion.tsv");

impl Crit {
    /// One line of `criterion.tsv`: its table and the comparison.
    fn parse(line: &'static str) -> Result<(&'static str, Crit), String> {
        let fields: Vec<&'static str> = line.split('\t').collect();
        let [table, key, case, ours, base, alt, seed, target] = fields[..] else {
            return Err(format!("expected 8 tab-separated fields in {line:?}"));
        };
        let num = |s: &str| {
            s.trim()
                .parse::<f64>()
                .map_err(|e| format!("{s:?} in {line:?}: {e}"))
        };
        let seed = match (seed, seed.split_once('/')) {
            ("-", _) => None,
            (_, Some((a, b))) => Some(num(a)? / num(b)?),
            (s, None) => Some(num(s)?),
        };
        let target = match (target, target.split_once(' ')) {
            ("-", _) => Target::None,
            (_, Some(("max", t))) => Target::Max(num(t)?),
            (_, Some(("min", t))) => Target::Min(num(t)?),
            _ => return Err(format!("target {target:?} in {line:?}")),
        };
        let alt = (alt != "-").then_some(alt);
        let c = Crit {
            key,
            case,
            ours,
            base,
            alt,
            seed,
            target,
        };
        Ok((table, c))
    }
}

/// The comparisons of `table` in `criterion.tsv`, in order (a malformed line is left
/// out; a test parses every line).
fn comparisons(table: &str) -> Vec<Crit> {
    CRITERION
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| Crit::parse(l).ok())
        .filter(|(t, _)| *t == table)
        .map(|(_, c)| c)
        .collect()
}

fn crit_table(
    md: &mut String,
    goals: &mut Vec<Goal>,
    data: &Data,
    rows: &[Crit],
    base_name: &str,
    alt_name: Option<&str>,
) {
    let get = |id: &str| data.crit.get(id).copied();
    if rows.iter().all(|r| get(r.ours).is_none()) {
        md.push_str("_Not measured in this run._\n\n");
        return;
    }
    let _ = write!(md, "| case | ours | {base_name} | ours/{base_name} |");
    if let Some(a) = alt_name {
        let _ = write!(md, " {a} | ours/{a} |");
    }
    md.push_str(" seed ratio | target | met? |\n|---|---:|---:|---:|");
    if alt_name.is_some() {
        md.push_str("---:|---:|");
    }
    md.push_str("---:|---:|---|\n");
    for r in rows {
        let (o, b) = (get(r.ours), get(r.base));
        let q = div(o, b);
        let _ = write!(md, "| {} | {} | {} | {} |", r.case, ns(o), ns(b), ratio(q));
        if alt_name.is_some() {
            let a = r.alt.and_then(get);
            let _ = write!(md, " {} | {} |", ns(a), ratio(div(o, a)));
        }
        let _ = writeln!(
            md,
            " {} | {} | {} |",
            ratio(r.seed),
            r.target.show(""),
            met(r.target.met(q))
        );
        goals.push(Goal {
            key: r.key.into(),
            label: format!("{} / {base_name}", r.case),
            value: q,
            unit: "",
            seed: r.seed,
            target: r.target,
            ratio: true,
        });
    }
    md.push('\n');
}

fn xrow<'a>(data: &'a Data, id: &str) -> Option<&'a Row> {
    data.rows.get(id)
}

fn xmed(data: &Data, id: &str) -> Option<f64> {
    xrow(data, id).map(|r| r.median)
}

fn samples(data: &Data, id: &str) -> String {
    xrow(data, id).map_or("—".into(), |r| r.n.to_string())
}

fn xproc_latency_table(
    md: &mut String,
    data: &Data,
    prefix: &str,
    kinds: &[(&str, &str)],
    base: &str,
    extra: impl Fn(&str, Option<f64>) -> (String, String),
) {
    let _ = writeln!(
        md,
        "| implementation | median | p99 | median / {base} | target | met? | samples |\n|---|---:|---:|---:|---:|---|---:|"
    );
    let b = xmed(data, &format!("{prefix}/{base}"));
    for (kind, label) in kinds {
        let id = format!("{prefix}/{kind}");
        let r = xrow(data, &id);
        let q = div(r.map(|r| r.median), b);
        let (target, m) = extra(kind, q);
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {target} | {m} | {} |",
            ns(r.map(|r| r.median)),
            ns(r.map(|r| r.p99)),
            ratio(q),
            samples(data, &id)
        );
    }
    md.push('\n');
}

const LOCK_KINDS: [(&str, &str); 4] = [
    ("lease", "OwnerLease (blocking acquire)"),
    ("futex_mutex", "futex mutex (Drepper)"),
    ("robust_pthread", "robust pthread mutex"),
    ("flock", "flock"),
];

/// Renders the report.
pub(crate) fn render(data: &Data, m: &Machine) -> Report {
    let mut md = String::new();
    let mut goals: Vec<Goal> = Vec::new();
    let mut body = String::new();

    criterion_tables(&mut body, &mut goals, data);
    handoff_table(&mut body, &mut goals, data);
    wake_table(&mut body, &mut goals, data);
    throughput_table(&mut body, &mut goals, data);
    failover_table(&mut body, &mut goals, data);
    waiter_cpu_table(&mut body, &mut goals, data);
    sem_handoff_table(&mut body, data);
    rw_mix_table(&mut body, &mut goals, data);

    body.push_str("### Sidecar: AdaptiveSpin vs fixed strategies\n\n");
    sidecar_table(&mut body, &mut goals, data);

    summary(&mut md, &goals, m, data.quick);
    md.push_str(&body);
    missed_targets(&mut md, &goals);
    Report {
        markdown: md,
        svg: svg(&goals),
    }
}

/// The single-process criterion tables.
fn criterion_tables(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("## Single-process micro-benchmarks (criterion)\n\n");
    md.push_str(
        "Medians of criterion samples (`median.point_estimate`), same run, same machine. \
         The seed ratio is the seed's published ours/baseline (measured on another machine); \
         compare ratios, not nanoseconds.\n\n",
    );
    md.push_str("### OwnerLease vs `std::sync::Mutex` / `parking_lot::Mutex` (seed 000)\n\n");
    crit_table(
        md,
        goals,
        data,
        &comparisons("owner_lease"),
        "std Mutex",
        Some("parking_lot"),
    );
    md.push_str("### HeartbeatTable vs a mutex-guarded slot\n\n");
    crit_table(
        md,
        goals,
        data,
        &comparisons("heartbeat"),
        "std Mutex",
        Some("parking_lot"),
    );
    md.push_str("### FailoverWatchdog vs `Vec<Mutex<NaiveSlot>>` (seed 002)\n\n");
    md.push_str(
        "The 4-dead case keeps exactly 4 stale slots for the whole measurement (clock epochs \
         with a one-day tick: a scan does not advance the epoch). The seed's bench ticked the \
         epoch on every scan, so after `grace` iterations it was scanning 64 dead slots.\n\n",
    );
    crit_table(
        md,
        goals,
        data,
        &comparisons("failover"),
        "Vec<Mutex>",
        None,
    );
    let bits = data
        .crit
        .get("failover/iter_in_flight_bits/watchdog")
        .map(|v| v / 6.0);
    let _ = writeln!(
        md,
        "iter_in_flight_bits: **{}** per set bit (seed 8.5 ns/bit; target ≤ 2 ns/bit: {}).\n",
        ns(bits),
        met(Target::Max(2.0).met(bits))
    );
    goals.push(Goal {
        key: "failover.iter_bits_per_bit".into(),
        label: "iter_in_flight_bits, ns per bit".into(),
        value: bits,
        unit: " ns",
        seed: Some(8.5),
        target: Target::Max(2.0),
        ratio: false,
    });
    md.push_str("### SharedSemaphore vs `Arc<(Mutex<u32>, Condvar)>` (seed 004)\n\n");
    md.push_str(
        "`SharedSemaphore` always tracks permit holders (dead holders' permits are \
         reclaimed, like SysV `SEM_UNDO`); it has no untracked mode to compare. \
         The fair peer is the baseline rebuilt on `parking_lot`'s mutex and condvar, \
         notifying only when a waiter is recorded: std's `notify_one` makes a \
         `FUTEX_WAKE` system call on every release, even with nobody waiting, which \
         flatters our ratio against the seed's baseline (the targets stay against it).\n\n",
    );
    crit_table(
        md,
        goals,
        data,
        &comparisons("semaphore"),
        "Mutex+Condvar",
        Some("fair peer"),
    );
    md.push_str("### Async waiting vs blocking waiting (`docs/async.md`)\n\n");
    md.push_str(
        "`block_on(lock_async())` vs `lock()` on one lease; the wake latency is measured \
         from just before the holder's release to the moment the sleeping waiter holds the \
         lease (the baseline column is the blocking waiter).\n\n",
    );
    crit_table(md, goals, data, &comparisons("async"), "blocking", None);
    md.push_str("### SeqLock and SharedCell vs `std::sync::Mutex` (`docs/seqlock.md`)\n\n");
    crit_table(md, goals, data, &comparisons("seqlock"), "std Mutex", None);
    md.push_str(
        "### SharedRwLock vs a process-shared `pthread_rwlock_t` (`docs/shared-rwlock.md`)\n\n",
    );
    md.push_str(
        "Uncontended, one thread. The baseline is a `pthread_rwlock_t` initialised with \
         `PTHREAD_PROCESS_SHARED` in a `MAP_SHARED` file mapping. `SharedRwLock` also tracks \
         which process holds it (a dead reader or writer is reclaimed) and fences evicted \
         writers; the pthread lock does neither.\n\n",
    );
    crit_table(
        md,
        goals,
        data,
        &comparisons("shared_rwlock"),
        "pthread rwlock",
        None,
    );
}

/// The cross-process introduction and the handoff round trip.
fn handoff_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("## Cross-process measurements (`cxc-xbench`)\n\n");
    md.push_str(
        "Real processes on shared files in a temporary directory; timestamps are \
         `CLOCK_MONOTONIC`, so one process's timestamp can be subtracted from another's. \
         Median and p99 over all samples (first 5 % of round trips dropped as warm-up).\n\n",
    );
    md.push_str("### Handoff round trip\n\n");
    md.push_str(
        "Two processes pass three locks around (A holds {0,1}, B holds {2}; each step \
         unlocks one and blocks on the one the other holds), so every step is a handoff to \
         a blocked waiter and nobody can barge. One round trip = two handoffs. The raw \
         futex ping-pong (store + `FUTEX_WAKE`, `FUTEX_WAIT` for the reply) is the floor.\n\n",
    );
    let mut kinds: Vec<(&str, &str)> = LOCK_KINDS.to_vec();
    kinds.push(("raw_futex", "raw futex ping-pong"));
    let handoff_q = div(xmed(data, "handoff/lease"), xmed(data, "handoff/raw_futex"));
    xproc_latency_table(md, data, "handoff", &kinds, "raw_futex", |k, q| {
        if k == "lease" {
            (
                Target::Max(1.3).show(""),
                met(Target::Max(1.3).met(q)).into(),
            )
        } else {
            ("—".into(), "—".into())
        }
    });
    goals.push(Goal {
        key: "xproc.handoff".into(),
        label: "blocking handoff RTT / raw futex RTT".into(),
        value: handoff_q,
        unit: "",
        seed: None,
        target: Target::Max(1.3),
        ratio: true,
    });
}

/// Wake latency of a waiter asleep in the kernel.
fn wake_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("### Wake latency of a sleeping waiter\n\n");
    if !data.rows.keys().any(|k| k.starts_with("wake/")) {
        md.push_str("_Not measured in this run._\n\n");
        return;
    }
    let margin = data
        .notes
        .get("wake_margin")
        .map_or("fixed time".to_string(), |m| m.clone());
    let batches = data
        .notes
        .get("wake_batches")
        .map_or(String::new(), |b| format!(": {b}"));
    let settle = data.notes.get("wake_settle").map_or(String::new(), |p| {
        format!(
            ", and the holder then waits {p} before the measured rounds, so that a thread \
             the implementation started in its first wait no longer counts as new load for \
             the scheduler (`benches/src/xbench/wake.rs`)"
        )
    });
    let _ = writeln!(
        md,
        "A waiter process blocks in its lock call on a lock the other process holds. The \
         holder reads the waiter thread's state from `/proc/<pid>/task/<tid>/stat` until it \
         is `S` (asleep in the kernel), and every other thread of the waiter process too, \
         waits a further {margin}, so that no waiter is still spinning, checks again, takes a `CLOCK_MONOTONIC` timestamp and releases; the \
         latency is from that timestamp to the waiter's timestamp taken the moment its lock \
         call returns. One sample per round (then the waiter releases and the holder locks \
         again). The implementations take turns batch by batch, a fresh waiter process per \
         batch{batches}; each process's first round is a warm-up and not counted{settle}. The lease's waiter blocks in \
         `OwnerLease::acquire` and the holder releases with `release_claim`; the raw futex \
         (the floor) is a shared word the waiter `FUTEX_WAIT`s on while it is 0, the holder \
         stores 1 and `FUTEX_WAKE`s one.\n"
    );
    let kinds = [
        ("lease", "OwnerLease (blocking acquire)"),
        ("robust_pthread", "robust pthread mutex"),
        ("flock", "flock"),
        ("raw_futex", "raw futex (wait / store + wake)"),
    ];
    let target = Target::Max(1.3);
    let q = div(xmed(data, "wake/lease"), xmed(data, "wake/raw_futex"));
    xproc_latency_table(md, data, "wake", &kinds, "raw_futex", |k, q| {
        if k == "lease" {
            (target.show(""), met(target.met(q)).into())
        } else {
            ("—".into(), "—".into())
        }
    });
    let placed: Vec<String> = kinds
        .iter()
        .filter_map(|(k, _)| {
            let n = data.notes.get(&format!("wake_same_cpu/{k}"))?;
            Some(format!("{k} {}", n.split(" rounds").next().unwrap_or(n)))
        })
        .collect();
    if !placed.is_empty() {
        let _ = writeln!(
            md,
            "Rounds woken on the releasing process's CPU (the rest on the other, idle CPU, a \
             cross-CPU wake-up): {}.\n",
            placed.join("; ")
        );
    }
    goals.push(Goal {
        key: "xproc.wake".into(),
        label: "wake latency of a sleeping waiter (cross-process) / raw futex".into(),
        value: q,
        unit: "",
        seed: None,
        target,
        ratio: true,
    });
}

/// Contended throughput of two processes.
fn throughput_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("### Contended throughput (2 processes)\n\n");
    let tput_time = if data.quick { "0.3 s" } else { "1 s" };
    let _ = writeln!(
        md,
        "Two processes lock, read the protected value, write it + 1 and unlock, for {tput_time} \
         per trial (the lease writes its payload through its fenced write; the others a word \
         in shared memory). The final value is checked against the operation count. The \
         lease does it three ways: `acquire` + `read_claimed` + `write_claimed` + \
         `release_claim` (two atomic read-modify-writes for the write: WRITE, then publish); \
         a guard (`lock`, `read`, `write`, drop: one for the write); and one `with_lease` \
         call (write and release in one step), which falls back to a blocking round of the \
         first way when the lease is held.\n"
    );
    md.push_str(
        "| implementation | median ops/s | p99 of trials | median / robust pthread | target | met? | trials |\n|---|---:|---:|---:|---:|---|---:|\n",
    );
    let tb = xmed(data, "throughput/robust_pthread");
    let mut tput_kinds = LOCK_KINDS.to_vec();
    tput_kinds.insert(
        1,
        (
            "lease_guard",
            "OwnerLease (guard: `lock`, `read`, `write`, drop)",
        ),
    );
    tput_kinds.insert(
        2,
        (
            "lease_with_lease",
            "OwnerLease (`with_lease`, blocking when held)",
        ),
    );
    for (kind, label) in tput_kinds {
        let id = format!("throughput/{kind}");
        let q = div(xmed(data, &id), tb);
        let goal = match kind {
            "lease" => Some((
                "xproc.throughput",
                "contended throughput (claims) / robust pthread",
                0.9,
            )),
            "lease_guard" => Some((
                "xproc.throughput_guard",
                "contended throughput (guard) / robust pthread",
                0.9,
            )),
            "lease_with_lease" => Some((
                "xproc.throughput_with_lease",
                "contended throughput (`with_lease`) / robust pthread",
                1.2,
            )),
            _ => None,
        };
        throughput_row(md, data, &id, label, q, goal.map(|g| Target::Min(g.2)));
        if let Some((key, label, min)) = goal {
            goals.push(Goal {
                key: key.into(),
                label: label.into(),
                value: q,
                unit: "",
                seed: None,
                target: Target::Min(min),
                ratio: true,
            });
        }
    }
    md.push('\n');
}

/// One row of a throughput table: median and p99 ops/s of `id`, `q` (its ratio to the
/// table's baseline), and `target` (if the row has one) with whether `q` meets it.
fn throughput_row(
    md: &mut String,
    data: &Data,
    id: &str,
    label: &str,
    q: Option<f64>,
    target: Option<Target>,
) {
    let r = xrow(data, id);
    let (t, mm) = match target {
        Some(t) => (t.show(""), met(t.met(q))),
        None => ("—".into(), "—"),
    };
    let _ = writeln!(
        md,
        "| {label} | {} | {} | {} | {t} | {mm} | {} |",
        r.map_or("—".into(), |r| format!("{:.0}", r.median)),
        r.map_or("—".into(), |r| format!("{:.0}", r.p99)),
        ratio(q),
        samples(data, id)
    );
}

/// Read-mostly mix of two processes: SharedRwLock vs a process-shared pthread rwlock.
fn rw_mix_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("### SharedRwLock: read-mostly mix (2 processes, 95 % reads)\n\n");
    if xrow(data, "rw_mix/rwlock").is_none() && xrow(data, "rw_mix/pthread_rwlock").is_none() {
        md.push_str("_Not measured in this run._\n\n");
        return;
    }
    let tput_time = if data.quick { "0.3 s" } else { "1 s" };
    let _ = writeln!(
        md,
        "Two processes, each pinned to a CPU of its own, take a read lock and copy the value \
         out 95 % of the time and the write lock (read the value, write it + 1) 5 % of the \
         time, for {tput_time} per trial, trials interleaved; both draw the same read/write \
         sequence for both locks. The \
         baseline is a `pthread_rwlock_t` initialised `PTHREAD_PROCESS_SHARED` (glibc's \
         default, reader-preferring kind) in a shared file mapping. The final value is \
         checked against the number of writes.\n"
    );
    md.push_str(
        "| implementation | median ops/s | p99 of trials | median / pthread rwlock | target | met? | trials |\n|---|---:|---:|---:|---:|---|---:|\n",
    );
    let b = xmed(data, "rw_mix/pthread_rwlock");
    let mut q = None;
    for (kind, label) in [
        ("rwlock", "SharedRwLock"),
        ("pthread_rwlock", "process-shared pthread rwlock"),
    ] {
        let id = format!("rw_mix/{kind}");
        let ratio_here = div(xmed(data, &id), b);
        let target = (kind == "rwlock").then_some(Target::Min(1.0));
        if target.is_some() {
            q = ratio_here;
        }
        throughput_row(md, data, &id, label, ratio_here, target);
    }
    md.push('\n');
    goals.push(Goal {
        key: "xproc.rw_mix".into(),
        label: "rwlock read-mostly mix / pthread rwlock".into(),
        value: q,
        unit: "",
        seed: None,
        target: Target::Min(1.0),
        ratio: true,
    });
}

/// Failover latency after SIGKILL.
fn failover_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("### Failover latency after SIGKILL\n\n");
    md.push_str(
        "The holder process is SIGKILLed while a second process is blocked waiting; latency \
         is from just before `kill` to the waiter's lock call returning. `lease_os`: the \
         holder claimed for its own pid; the waiter, asleep on the holder's sentinel word \
         too, is woken by the kernel when the holder's process starts to exit and takes the \
         claim over as stale (`docs/owner-lease.md`, \"The sentinel\"; the OS identity's \
         death, later, is the fallback). `lease_heartbeat`: the holder claimed for a pid that is not its own and beats \
         with clock epochs; the claim still names the process that made it \
         (`docs/owner-lease.md`, Identity), so the waiter sees that process exit too, as in \
         `lease_os` (staleness would take the grace).",
    );
    if let Some(n) = data.notes.get("failover_heartbeat") {
        let _ = write!(md, " Settings: {n}.");
    }
    md.push_str(" Robust mutex: `EOWNERDEAD`; flock: released when the kernel closes the dead holder's files.\n\n");
    let fo = [
        ("lease_os", "OwnerLease, OS-identity path"),
        (
            "lease_heartbeat",
            "OwnerLease, claimed for another pid, clock epochs",
        ),
        ("robust_pthread", "robust pthread mutex (EOWNERDEAD)"),
        ("flock", "flock"),
    ];
    let os = xrow(data, "failover/lease_os");
    let os_med = Target::Max(1e6).met(os.map(|r| r.median));
    let os_p99 = Target::Max(5e6).met(os.map(|r| r.p99));
    xproc_latency_table(md, data, "failover", &fo, "robust_pthread", |k, _| {
        if k == "lease_os" {
            (
                "median ≤ 1 ms, p99 ≤ 5 ms".into(),
                format!("{} / {}", met(os_med), met(os_p99)),
            )
        } else {
            ("—".into(), "—".into())
        }
    });
    goals.push(Goal {
        key: "xproc.failover_os_median".into(),
        label: "failover after SIGKILL (OS identity), median".into(),
        value: os.map(|r| r.median / 1e6),
        unit: " ms",
        seed: None,
        target: Target::Max(1.0),
        ratio: false,
    });
    goals.push(Goal {
        key: "xproc.failover_os_p99".into(),
        label: "failover after SIGKILL (OS identity), p99".into(),
        value: os.map(|r| r.p99 / 1e6),
        unit: " ms",
        seed: None,
        target: Target::Max(5.0),
        ratio: false,
    });
    // The speed issue's target: no slower than flock, whose lock the kernel drops when it
    // closes the dead holder's files (earlier in the exit path than a pidfd turns readable).
    goals.push(Goal {
        key: "xproc.failover_vs_flock".into(),
        label: "failover after SIGKILL (OS identity) / flock, medians".into(),
        value: div(os.map(|r| r.median), xmed(data, "failover/flock")),
        unit: "",
        seed: None,
        target: Target::Max(1.0),
        ratio: true,
    });
}

/// CPU burned by a blocked waiter.
fn waiter_cpu_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    md.push_str("### CPU of a blocked waiter\n\n");
    md.push_str(
        "A process blocks for 1 s on a lock the parent holds (or an empty semaphore) and \
         times out; CPU time (user + system, `getrusage`) over the call, in % of one core.\n\n\
         | waiter | median CPU | p99 of trials | target | met? | trials |\n|---|---:|---:|---:|---|---:|\n",
    );
    for (kind, label) in [
        ("lease", "OwnerLease::acquire"),
        ("semaphore", "SharedSemaphore::acquire_timeout"),
        ("robust_pthread", "pthread_mutex_timedlock"),
        ("sysv", "semtimedop"),
    ] {
        let id = format!("blocked_cpu/{kind}");
        let r = xrow(data, &id);
        let ours = matches!(kind, "lease" | "semaphore");
        let t = if ours { Target::Max(1.0) } else { Target::None };
        let v = r.map(|r| r.median);
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {} | {} |",
            r.map_or("—".into(), |r| format!("{:.3} %", r.median)),
            r.map_or("—".into(), |r| format!("{:.3} %", r.p99)),
            if ours {
                "< 1 %".into()
            } else {
                "—".to_string()
            },
            met(t.met(v)),
            samples(data, &id)
        );
        if ours && r.is_some() {
            goals.push(Goal {
                key: format!("xproc.cpu_{kind}"),
                label: format!("CPU of a waiter blocked 1 s ({label})"),
                value: v,
                unit: " %",
                seed: None,
                target: Target::Max(1.0),
                ratio: false,
            });
        }
    }
    md.push('\n');
}

/// Semaphore permit handoff.
fn sem_handoff_table(md: &mut String, data: &Data) {
    md.push_str("### Semaphore permit handoff\n\n");
    if xrow(data, "sem_handoff/semaphore").is_some() {
        md.push_str(
            "Two semaphores of 0/1 permits used as a ping-pong: A releases `s1` and blocks on \
             `s2`, B blocks on `s1` and releases `s2`. One round trip = two permit handoffs \
             to a sleeping acquirer.\n\n",
        );
        xproc_latency_table(
            md,
            data,
            "sem_handoff",
            &[("semaphore", "SharedSemaphore"), ("sysv", "SysV semop")],
            "sysv",
            |_, _| ("—".into(), "—".into()),
        );
    } else {
        md.push_str("_Not measured in this run._\n\n");
    }
}

/// The title, the machine and the table of targets.
fn summary(md: &mut String, goals: &[Goal], m: &Machine, quick: bool) {
    md.push_str("# Benchmarks\n\n");
    if quick {
        md.push_str(
            "> **Quick run** (`cargo xtask bench --quick`): short measurements, indicative \
             only. The committed report comes from a full `cargo xtask bench`.\n\n",
        );
    }
    let _ = writeln!(
        md,
        "Generated by `cargo xtask bench` on {}.\n\n| machine | |\n|---|---|\n| CPU | {} |\n| logical CPUs | {} |\n| kernel | {} |\n| rustc | {} |\n",
        m.date, m.cpu_model, m.cpus, m.kernel, m.rustc
    );
    md.push_str(
        "The machine is shared and noisy (other builds run beside the benches), so every \
         figure is a median; re-run `cargo xtask bench` to reproduce. The chart \
         (`benchmarks.svg`) plots every ratio against its target and the seed's ratio.\n\n\
         ![ratios vs targets](benchmarks.svg)\n\n## Targets\n\n\
         | target | measured | seed | target | met? |\n|---|---:|---:|---:|---|\n",
    );
    for g in goals.iter().filter(|g| !matches!(g.target, Target::None)) {
        let v = g.value.map_or("—".into(), |v| format!("{v:.2}{}", g.unit));
        let s = g.seed.map_or("—".into(), |s| format!("{s:.2}{}", g.unit));
        let _ = writeln!(
            md,
            "| {} | {v} | {s} | {} | {} |",
            g.label,
            g.target.show(g.unit),
            met(g.target.met(g.value))
        );
    }
    md.push('\n');
}

/// Why each missed target was missed (`benches/notes.md`), and the notes for every run.
fn missed_targets(md: &mut String, goals: &[Goal]) {
    let notes = load_notes();
    let missed: Vec<&Goal> = goals
        .iter()
        .filter(|g| g.target.met(g.value) == Some(false))
        .collect();
    md.push_str("## Why targets were missed\n\n");
    if missed.is_empty() {
        md.push_str("Every measured target was met in this run.\n\n");
    }
    for g in &missed {
        let _ = writeln!(
            md,
            "### {} ({} vs target {})\n",
            g.label,
            g.value.map_or("—".into(), |v| format!("{v:.2}{}", g.unit)),
            g.target.show(g.unit)
        );
        match notes.get(&g.key) {
            Some(n) => {
                md.push_str(n.trim());
                md.push_str("\n\n");
            }
            None => {
                md.push_str("_No analysis recorded yet (add a section to `benches/notes.md`)._\n\n")
            }
        }
    }
    if let Some(n) = notes.get("always") {
        md.push_str(n.trim());
        md.push('\n');
    }
}

fn sidecar_table(md: &mut String, goals: &mut Vec<Goal>, data: &Data) {
    let strategies = [
        ("adaptive", "AdaptiveSpin (sidecar)"),
        ("park", "always park"),
        ("spin", "always spin"),
        ("raw_spin", "raw spin ping-pong (floor)"),
    ];
    if !data.rows.keys().any(|k| k.starts_with("sidecar/")) {
        md.push_str("_Not measured in this run._\n\n");
        return;
    }
    md.push_str(
        "The lease handoff of the table above with a hold time: each process holds the lock \
         for the stated time before passing it on. The strategy is published in the file's \
         `HandshakeHeader`, so it applies to both processes; AdaptiveSpin runs in a sidecar \
         thread of the parent and chooses from observed waits (after a warm-up). CPU is both \
         processes' CPU time over the measured phase, in % of one core.\n\n",
    );
    if let Some(n) = data.notes.get("sidecar") {
        let _ = writeln!(md, "{n}.\n");
    }
    md.push_str(
        "| hold | strategy | RTT median | RTT p99 | RTT / raw spin | CPU | target | met? |\n|---|---|---:|---:|---:|---:|---:|---|\n",
    );
    for hold in ["short", "long"] {
        let floor = xmed(data, &format!("sidecar/{hold}/raw_spin"));
        for (s, label) in strategies {
            let id = format!("sidecar/{hold}/{s}");
            let Some(r) = xrow(data, &id) else { continue };
            let cpu = xrow(data, &format!("sidecar_cpu/{hold}/{s}"));
            let q = div(Some(r.median), floor);
            let t = if hold == "short" && s == "adaptive" {
                Target::Max(3.0)
            } else {
                Target::None
            };
            let _ = writeln!(
                md,
                "| {hold} | {label} | {} | {} | {} | {} | {} | {} |",
                ns(Some(r.median)),
                ns(Some(r.p99)),
                ratio(q),
                cpu.map_or("—".into(), |c| format!("{:.0} %", c.median)),
                t.show(""),
                met(t.met(q))
            );
            if matches!(t, Target::Max(_)) {
                goals.push(Goal {
                    key: "xproc.sidecar_short".into(),
                    label: "AdaptiveSpin, short holds: RTT / raw spin RTT".into(),
                    value: q,
                    unit: "",
                    seed: None,
                    target: t,
                    ratio: true,
                });
            }
        }
    }
    md.push('\n');
}

/// `benches/notes.md`: `## key` sections (`## key1, key2` gives several keys one text).
fn load_notes() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(crate::root().join("benches/notes.md")).unwrap_or_default();
    parse_notes(&text)
}

fn parse_notes(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut keys: Vec<String> = Vec::new();
    let mut buf = String::new();
    let mut flush = |keys: &mut Vec<String>, buf: &mut String| {
        for k in keys.drain(..) {
            out.insert(k, buf.clone());
        }
        buf.clear();
    };
    for line in text.lines() {
        if let Some(k) = line.strip_prefix("## ") {
            flush(&mut keys, &mut buf);
            keys = k.split(',').map(|k| k.trim().to_string()).collect();
        } else if !keys.is_empty() {
            buf.push_str(line);
            buf.push('\n');
        }
    }
    flush(&mut keys, &mut buf);
    out
}

/// A horizontal bar chart of every ratio (log scale): the measured ratio as a bar, the
/// seed's ratio as a grey diamond, the target as a red tick.
fn svg(goals: &[Goal]) -> String {
    let bars: Vec<&Goal> = goals.iter().filter(|g| g.ratio).collect();
    let (left, width, row_h, top) = (330.0, 520.0, 22.0, 40.0);
    let height = top + row_h * bars.len() as f64 + 50.0;
    let (lo, hi) = (0.01f64, 100.0f64);
    let x =
        |v: f64| left + width * (v.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10());
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="11">"##,
        w = left + width + 70.0
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">cxc: ours / baseline (log scale; lower is better except throughput)</text>"##
    );
    for t in [0.01, 0.1, 1.0, 10.0, 100.0] {
        let xx = x(t);
        let stroke = if t == 1.0 { "#888" } else { "#ddd" };
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="{stroke}"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            height - 35.0,
            height - 22.0,
            trim(t)
        );
    }
    for (i, g) in bars.iter().enumerate() {
        let y = top + row_h * i as f64;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left - 6.0,
            y + 15.0,
            escape(&g.label)
        );
        if let Some(v) = g.value {
            let color = match g.target.met(Some(v)) {
                Some(true) => "#4a90d9",
                Some(false) => "#e8833a",
                None => "#9bbbe0",
            };
            let x0 = x(lo);
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="14" fill="{color}"/><text x="{:.1}" y="{:.1}">{v:.2}</text>"##,
                y + 4.0,
                (x(v) - x0).max(1.0),
                x(v) + 4.0,
                y + 15.0
            );
        }
        if let Some(sd) = g.seed {
            let (xs, ym) = (x(sd), y + 11.0);
            let _ = writeln!(
                s,
                r##"<path d="M{:.1} {ym:.1} L{xs:.1} {:.1} L{:.1} {ym:.1} L{xs:.1} {:.1} Z" fill="#777"/>"##,
                xs - 4.0,
                ym - 5.0,
                xs + 4.0,
                ym + 5.0
            );
        }
        if let Target::Max(t) | Target::Min(t) = g.target {
            let xt = x(t);
            let _ = writeln!(
                s,
                r##"<line x1="{xt:.1}" y1="{:.1}" x2="{xt:.1}" y2="{:.1}" stroke="#d00" stroke-width="2"/>"##,
                y + 1.0,
                y + 21.0
            );
        }
    }
    let ly = height - 8.0;
    let _ = writeln!(
        s,
        r##"<rect x="10" y="{:.1}" width="10" height="10" fill="#4a90d9"/><text x="24" y="{ly:.1}">met</text><rect x="60" y="{:.1}" width="10" height="10" fill="#e8833a"/><text x="74" y="{ly:.1}">missed</text><rect x="125" y="{:.1}" width="10" height="10" fill="#9bbbe0"/><text x="139" y="{ly:.1}">no target</text><path d="M205 {:.1} L209 {:.1} L213 {:.1} L209 {:.1} Z" fill="#777"/><text x="218" y="{ly:.1}">seed ratio</text><line x1="290" y1="{:.1}" x2="290" y2="{:.1}" stroke="#d00" stroke-width="2"/><text x="296" y="{ly:.1}">target</text>"##,
        ly - 9.0,
        ly - 9.0,
        ly - 9.0,
        ly - 4.0,
        ly - 9.0,
        ly - 4.0,
        ly + 1.0,
        ly - 11.0,
        ly + 1.0
    );
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_data(quick: bool) -> Data {
        Data {
            crit: BTreeMap::new(),
            rows: BTreeMap::new(),
            notes: BTreeMap::new(),
            quick,
        }
    }

    fn machine() -> Machine {
        Machine {
            cpus: 2,
            cpu_model: "test".into(),
            kernel: "Linux".into(),
            rustc: "rustc".into(),
            date: "2026-01-01 00:00 UTC".into(),
        }
    }

    #[test]
    fn renders_with_partial_data() {
        let mut data = no_data(true);
        data.crit
            .insert("owner_lease/acquire_release/lease".into(), 10.0);
        data.crit
            .insert("owner_lease/acquire_release/std_mutex".into(), 20.0);
        data.rows.insert(
            "handoff/lease".into(),
            Row {
                median: 5000.0,
                p99: 9000.0,
                n: 100,
            },
        );
        let m = machine();
        let r = render(&data, &m);
        assert!(
            r.markdown
                .contains("| acquire_release | 10.00 ns | 20.00 ns | 0.50 |")
        );
        assert!(r.markdown.contains("Quick run"));
        assert!(r.svg.starts_with("<svg") && r.svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn renders_the_payload_rows_and_the_fair_peer() {
        let mut data = no_data(false);
        for (id, v) in [
            ("owner_lease/payload48_read_as_owner_held/lease", 3.0),
            ("owner_lease/payload48_read_as_owner_held/std_mutex", 15.0),
            ("owner_lease/payload48_read_as_owner_held/parking_lot", 12.0),
            ("shared_semaphore/acquire_release/semaphore", 4.0),
            ("shared_semaphore/acquire_release/mutex_condvar", 40.0),
            ("shared_semaphore/acquire_release/fair_condvar", 16.0),
        ] {
            data.crit.insert(id.into(), v);
        }
        let md = render(&data, &machine()).markdown;
        assert!(md.contains(
            "| read_as_owner (held), 48 B | 3.00 ns | 15.00 ns | 0.20 | 12.00 ns | 0.25 | — | ≤ 0.15 | **missed** |"
        ));
        assert!(md.contains("| Mutex+Condvar | ours/Mutex+Condvar | fair peer | ours/fair peer |"));
        assert!(md.contains(
            "| acquire + release | 4.00 ns | 40.00 ns | 0.10 | 16.00 ns | 0.25 | 0.35 | ≤ 0.2 | met |"
        ));
    }

    #[test]
    fn renders_the_rwlock_rows_with_their_targets() {
        let mut data = no_data(false);
        for (id, v) in [
            ("shared_rwlock/read_lock_unlock/cxc", 12.0),
            ("shared_rwlock/read_lock_unlock/pthread", 16.0),
            ("shared_rwlock/write_lock_unlock/cxc", 30.0),
            ("shared_rwlock/write_lock_unlock/pthread", 20.0),
        ] {
            data.crit.insert(id.into(), v);
        }
        for (id, median) in [("rw_mix/rwlock", 3.0e7), ("rw_mix/pthread_rwlock", 2.0e7)] {
            data.rows.insert(
                id.into(),
                Row {
                    median,
                    p99: median,
                    n: 5,
                },
            );
        }
        let m = machine();
        let md = render(&data, &m).markdown;
        assert!(md.contains("| read lock + unlock | 12.00 ns | 16.00 ns | 0.75 | — | ≤ 1 | met |"));
        assert!(md.contains(
            "| write lock + unlock | 30.00 ns | 20.00 ns | 1.50 | — | ≤ 1 | **missed** |"
        ));
        assert!(md.contains("| SharedRwLock | 30000000 | 30000000 | 1.50 | ≥ 1 | met | 5 |"));
        assert!(md.contains("rwlock read-mostly mix / pthread rwlock"));
    }

    #[test]
    fn renders_the_wake_latency_table_with_its_target() {
        let mut data = no_data(false);
        for (id, median, p99) in [
            ("wake/lease", 13_000.0, 40_000.0),
            ("wake/robust_pthread", 11_000.0, 30_000.0),
            ("wake/flock", 12_000.0, 35_000.0),
            ("wake/raw_futex", 10_000.0, 25_000.0),
        ] {
            data.rows.insert(
                id.into(),
                Row {
                    median,
                    p99,
                    n: 400,
                },
            );
        }
        data.notes
            .insert("wake_margin".into(), "2.03 ms (test)".into());
        data.notes
            .insert("wake_batches".into(), "4 batches of 100 rounds".into());
        data.notes.insert("wake_settle".into(), "150 ms".into());
        for (k, n) in [("lease", 390), ("raw_futex", 398)] {
            data.notes.insert(
                format!("wake_same_cpu/{k}"),
                format!("{n} of 400 rounds woken on the releasing process's CPU"),
            );
        }
        let md = render(&data, &machine()).markdown;
        assert!(md.contains("### Wake latency of a sleeping waiter"));
        assert!(md.contains("releasing process's CPU (the rest on the other, idle CPU, a cross-CPU wake-up): lease 390 of 400; raw_futex 398 of 400."));
        assert!(md.contains("waits a further 2.03 ms (test), so"));
        assert!(md.contains("a fresh waiter process per batch: 4 batches of 100 rounds;"));
        assert!(
            md.contains("not counted, and the holder then waits 150 ms before the measured rounds")
        );
        assert!(md.contains(
            "| OwnerLease (blocking acquire) | 13.00 µs | 40.00 µs | 1.30 | ≤ 1.3 | met | 400 |"
        ));
        assert!(md.contains(
            "| raw futex (wait / store + wake) | 10.00 µs | 25.00 µs | 1.00 | — | — | 400 |"
        ));
        assert!(md.contains(
            "| wake latency of a sleeping waiter (cross-process) / raw futex | 1.30 | — | ≤ 1.3 | met |"
        ));
        data.rows.get_mut("wake/lease").unwrap().median = 20_000.0;
        let md = render(&data, &machine()).markdown;
        assert!(md.contains("| 2.00 | ≤ 1.3 | **missed** | 400 |"));
        assert!(md.contains("### wake latency of a sleeping waiter (cross-process) / raw futex (2.00 vs target ≤ 1.3)"));
        let md = render(&no_data(false), &machine()).markdown;
        assert!(
            md.contains("### Wake latency of a sleeping waiter\n\n_Not measured in this run._")
        );
    }

    #[test]
    fn every_criterion_line_parses() {
        let lines: Vec<&str> = CRITERION
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        for l in &lines {
            if let Err(e) = Crit::parse(l) {
                panic!("criterion.tsv: {e}");
            }
        }
        let tables = [
            "owner_lease",
            "heartbeat",
            "failover",
            "semaphore",
            "async",
            "seqlock",
            "shared_rwlock",
        ];
        let used: usize = tables.iter().map(|t| comparisons(t).len()).sum();
        assert_eq!(
            used,
            lines.len(),
            "a line names a table the report does not show"
        );
        assert!(tables.iter().all(|t| !comparisons(t).is_empty()));
        let (_, c) = Crit::parse("t\tk\tcase\ta/b/c\ta/b/d\t-\t1.28/16.75\tmin 2").unwrap();
        assert_eq!(c.seed, Some(1.28 / 16.75));
        assert!(matches!(c.target, Target::Min(t) if t == 2.0) && c.alt.is_none());
        assert!(Crit::parse("t\tk\tcase\tours\tbase\t-\t-\tabout 2").is_err());
        assert!(Crit::parse("too\tfew").is_err());
    }

    #[test]
    fn a_notes_heading_may_name_several_keys() {
        let notes = super::parse_notes("# title\n## a, b.c\nshared\n## d\nown\n");
        assert_eq!(notes.get("a").map(String::as_str), Some("shared\n"));
        assert_eq!(notes.get("b.c").map(String::as_str), Some("shared\n"));
        assert_eq!(notes.get("d").map(String::as_str), Some("own\n"));
        assert_eq!(notes.len(), 3);
    }
}

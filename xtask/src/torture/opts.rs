//! Command-line options of `cargo xtask torture` and of the hidden worker subcommand.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;

/// The name `value` has on the command line.
fn spelling(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}

/// The primitive a worker exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub(crate) enum Role {
    Lease,
    Heartbeat,
    Semaphore,
    Cell,
    Rwlock,
}

impl Role {
    /// Every primitive, in order.
    pub(crate) fn all() -> &'static [Role] {
        Role::value_variants()
    }

    pub(crate) fn name(self) -> String {
        spelling(&self)
    }

    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// The primitives one `--primitive` names: one, or `all`.
#[derive(Debug, Clone)]
struct RoleSet(Vec<Role>);

impl RoleSet {
    fn parse(s: &str) -> Result<RoleSet, String> {
        match s {
            "all" => Ok(RoleSet(Role::all().to_vec())),
            s => Ok(RoleSet(vec![
                Role::from_str(s, false).map_err(|_| format!("unknown primitive {s:?}"))?,
            ])),
        }
    }
}

/// How a lease worker process runs its workers (chosen by the supervisor for each
/// spawned process, so restarts change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub(crate) enum LeaseMode {
    /// One worker loop on the main thread.
    Plain,
    /// The worker loop runs on a spawned thread and the main thread exits: the process
    /// is half-exited (`/proc/PID/stat` says `Z`) but alive, and must be treated so.
    #[value(name = "half-exited")]
    Half,
    /// Several sibling threads, each claiming under its own pid number, that release each
    /// other's claims by pid at random (in the middle of writes).
    Siblings,
    /// Both: sibling threads in a process whose main thread exited.
    #[value(name = "half-exited+siblings")]
    HalfSiblings,
}

impl LeaseMode {
    /// Every mode.
    pub(crate) fn all() -> &'static [LeaseMode] {
        LeaseMode::value_variants()
    }

    pub(crate) fn name(self) -> String {
        spelling(&self)
    }

    /// Whether the main thread exits while the workers run.
    pub(crate) fn half_exited(self) -> bool {
        matches!(self, LeaseMode::Half | LeaseMode::HalfSiblings)
    }

    /// Whether the process runs sibling threads.
    pub(crate) fn siblings(self) -> bool {
        matches!(self, LeaseMode::Siblings | LeaseMode::HalfSiblings)
    }
}

/// `cargo xtask torture` arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Chaos phase length in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Worker processes per primitive (1..=16).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    procs: u64,
    /// Seed of every random choice (decimal or 0x-hex; default: from the clock, printed).
    #[arg(long, value_parser = crate::parse_u64)]
    seed: Option<u64>,
    /// lease | heartbeat | semaphore | cell | rwlock | all (default all; may be repeated).
    #[arg(long = "primitive", value_name = "P", value_parser = RoleSet::parse)]
    primitives: Vec<RoleSet>,
    /// Working directory for the shared files (default: a fresh temp directory).
    #[arg(long, value_name = "D")]
    dir: Option<PathBuf>,
    /// Keep the working directory even when the run passes.
    #[arg(long)]
    keep: bool,
    /// After a lease holder is killed inside a write, stop the other lease workers and let
    /// 16 short-lived processes open the lease (as `cxc inspect` would) before anyone takes
    /// over: a regression check for an L5 bug that is fixed (docs/RELIABILITY.md).
    #[arg(long)]
    ident_churn: bool,
}

/// Options of a torture run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) seconds: u64,
    pub(crate) procs: usize,
    pub(crate) seed: u64,
    /// Sorted, without repeats.
    pub(crate) roles: Vec<Role>,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) keep: bool,
    pub(crate) ident_churn: bool,
}

/// Options of one worker process (`xtask torture-worker`, hidden).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WorkerOptions {
    #[arg(long, value_enum)]
    pub(crate) role: Role,
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[arg(long, default_value_t = 0, value_parser = crate::parse_u64)]
    pub(crate) seed: u64,
    #[arg(long, default_value_t = 0)]
    pub(crate) id: usize,
    #[arg(long, default_value_t = 0)]
    pub(crate) inc: u64,
    /// Only open the lease file and exit (`--ident-churn`).
    #[arg(long)]
    pub(crate) open_only: bool,
    /// How a lease worker runs (ignored by the other roles).
    #[arg(long, value_enum, default_value = "plain")]
    pub(crate) lease_mode: LeaseMode,
}

impl From<Args> for Options {
    fn from(a: Args) -> Options {
        let mut roles: Vec<Role> = a.primitives.into_iter().flat_map(|s| s.0).collect();
        if roles.is_empty() {
            roles.extend(Role::all());
        }
        roles.sort();
        roles.dedup();
        Options {
            seconds: a.seconds,
            procs: a.procs as usize,
            seed: a.seed.unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    ^ u64::from(std::process::id())
            }),
            roles,
            dir: a.dir,
            keep: a.keep,
            ident_churn: a.ident_churn,
        }
    }
}

impl Options {
    /// The arguments that reproduce this run (for the supervisor re-exec and the summary).
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--seconds".into(),
            self.seconds.to_string(),
            "--procs".into(),
            self.procs.to_string(),
            "--seed".into(),
            format!("{:#x}", self.seed),
        ];
        if self.roles.len() != Role::all().len() {
            for r in &self.roles {
                v.push("--primitive".into());
                v.push(r.name());
            }
        }
        if let Some(d) = &self.dir {
            v.push("--dir".into());
            v.push(d.display().to_string());
        }
        if self.keep {
            v.push("--keep".into());
        }
        if self.ident_churn {
            v.push("--ident-churn".into());
        }
        v
    }
}

impl WorkerOptions {
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--role".into(),
            self.role.name(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--seed".into(),
            format!("{:#x}", self.seed),
            "--id".into(),
            self.id.to_string(),
            "--inc".into(),
            self.inc.to_string(),
            "--lease-mode".into(),
            self.lease_mode.name(),
        ];
        if self.open_only {
            v.push("--open-only".into());
        }
        v
    }
}

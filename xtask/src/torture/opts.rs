//! Command-line options of `cargo xtask torture` and of the hidden worker subcommand.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) const USAGE: &str = "\
usage: cargo xtask torture [--seconds N] [--procs N] [--seed S] [--primitive P] [--dir D] [--keep] [--ident-churn]
  --seconds N     chaos phase length (default 60)
  --procs N       worker processes per primitive (default 4)
  --seed S        seed of every random choice (decimal or 0x-hex; default: from the clock, printed)
  --primitive P   lease | heartbeat | semaphore | cell | rwlock | all (default all; may be repeated)
  --dir D         working directory for the shared files (default: a fresh temp directory)
  --keep          keep the working directory even when the run passes
  --ident-churn   after a lease holder is killed inside a write, stop the other lease
                  workers and let 16 short-lived processes open the lease (as `cxc inspect`
                  would) before anyone takes over: a regression check for an L5 bug that
                  is fixed (docs/RELIABILITY.md); off by default";

/// The primitive a worker exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Role {
    Lease,
    Heartbeat,
    Semaphore,
    Cell,
    Rwlock,
}

impl Role {
    pub(crate) const ALL: [Role; 5] = [
        Role::Lease,
        Role::Heartbeat,
        Role::Semaphore,
        Role::Cell,
        Role::Rwlock,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Lease => "lease",
            Role::Heartbeat => "heartbeat",
            Role::Semaphore => "semaphore",
            Role::Cell => "cell",
            Role::Rwlock => "rwlock",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown primitive {s:?}"))
    }

    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// How a lease worker process runs its workers (chosen by the supervisor for each
/// spawned process, so restarts change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum LeaseMode {
    /// One worker loop on the main thread.
    Plain,
    /// The worker loop runs on a spawned thread and the main thread exits: the process
    /// is half-exited (`/proc/PID/stat` says `Z`) but alive, and must be treated so.
    Half,
    /// Several sibling threads, each claiming under its own pid number, that release each
    /// other's claims by pid at random (in the middle of writes).
    Siblings,
    /// Both: sibling threads in a process whose main thread exited.
    HalfSiblings,
}

impl LeaseMode {
    pub(crate) const ALL: [LeaseMode; 4] = [
        LeaseMode::Plain,
        LeaseMode::Half,
        LeaseMode::Siblings,
        LeaseMode::HalfSiblings,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LeaseMode::Plain => "plain",
            LeaseMode::Half => "half-exited",
            LeaseMode::Siblings => "siblings",
            LeaseMode::HalfSiblings => "half-exited+siblings",
        }
    }

    fn parse(s: &str) -> Result<LeaseMode, String> {
        LeaseMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown lease mode {s:?}"))
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

/// Options of a torture run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) seconds: u64,
    pub(crate) procs: usize,
    pub(crate) seed: u64,
    pub(crate) roles: Vec<Role>,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) keep: bool,
    pub(crate) ident_churn: bool,
}

/// Options of one worker process.
#[derive(Debug, Clone)]
pub(crate) struct WorkerOptions {
    pub(crate) role: Role,
    pub(crate) dir: PathBuf,
    pub(crate) seed: u64,
    pub(crate) id: usize,
    pub(crate) inc: u64,
    /// Only open the lease file and exit (`--ident-churn`).
    pub(crate) open_only: bool,
    /// How a lease worker runs (ignored by the other roles).
    pub(crate) lease_mode: LeaseMode,
}

fn parse_u64(name: &str, v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    r.map_err(|e| format!("{name}: {v:?}: {e}"))
}

/// Splits `--name value` / `--name=value` pairs; flags without a value are returned with
/// an empty value.
fn pairs(args: &[String], flags: &[&str]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(name) = a.strip_prefix("--") else {
            return Err(format!("unexpected argument {a:?}"));
        };
        if let Some((n, v)) = name.split_once('=') {
            out.push((n.to_owned(), v.to_owned()));
        } else if flags.contains(&name) {
            out.push((name.to_owned(), String::new()));
        } else {
            let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            out.push((name.to_owned(), v.clone()));
        }
    }
    Ok(out)
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            seconds: 60,
            procs: 4,
            seed: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                ^ u64::from(std::process::id()),
            roles: Vec::new(),
            dir: None,
            keep: false,
            ident_churn: false,
        };
        for (name, v) in pairs(args, &["keep", "help", "ident-churn"])? {
            match name.as_str() {
                "seconds" => o.seconds = parse_u64("--seconds", &v)?,
                "procs" => o.procs = parse_u64("--procs", &v)? as usize,
                "seed" => o.seed = parse_u64("--seed", &v)?,
                "primitive" if v == "all" => o.roles.extend(Role::ALL),
                "primitive" => o.roles.push(Role::parse(&v)?),
                "dir" => o.dir = Some(PathBuf::from(v)),
                "keep" => o.keep = true,
                "ident-churn" => o.ident_churn = true,
                "help" => return Err(String::new()),
                _ => return Err(format!("unknown option --{name}")),
            }
        }
        if o.roles.is_empty() {
            o.roles.extend(Role::ALL);
        }
        o.roles.sort();
        o.roles.dedup();
        if o.procs == 0 || o.procs > 16 {
            return Err("--procs must be 1..=16".into());
        }
        Ok(o)
    }

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
        if self.roles.len() != Role::ALL.len() {
            for r in &self.roles {
                v.push("--primitive".into());
                v.push(r.name().into());
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
    pub(crate) fn parse(args: &[String]) -> Result<WorkerOptions, String> {
        let (mut role, mut dir, mut seed, mut id, mut inc) = (None, None, 0, 0, 0);
        let mut open_only = false;
        let mut lease_mode = LeaseMode::Plain;
        for (name, v) in pairs(args, &["open-only"])? {
            match name.as_str() {
                "role" => role = Some(Role::parse(&v)?),
                "dir" => dir = Some(PathBuf::from(v)),
                "seed" => seed = parse_u64("--seed", &v)?,
                "id" => id = parse_u64("--id", &v)? as usize,
                "inc" => inc = parse_u64("--inc", &v)?,
                "open-only" => open_only = true,
                "lease-mode" => lease_mode = LeaseMode::parse(&v)?,
                _ => return Err(format!("unknown worker option --{name}")),
            }
        }
        Ok(WorkerOptions {
            role: role.ok_or("--role is required")?,
            dir: dir.ok_or("--dir is required")?,
            seed,
            id,
            inc,
            open_only,
            lease_mode,
        })
    }

    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--role".into(),
            self.role.name().into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--seed".into(),
            format!("{:#x}", self.seed),
            "--id".into(),
            self.id.to_string(),
            "--inc".into(),
            self.inc.to_string(),
            "--lease-mode".into(),
            self.lease_mode.name().into(),
        ];
        if self.open_only {
            v.push("--open-only".into());
        }
        v
    }
}

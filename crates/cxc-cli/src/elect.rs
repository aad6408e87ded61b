//! `cxc elect PATH [--identity ID] [--lease-duration D] [--restart-delay D] -- CMD ARGS...`:
//! runs the command while this candidate leads the election on PATH (issue #16). The term
//! is held by the keeper process on behalf of the command's process group, as for
//! `lease run` (see `supervise`): renewed while the group lives, the group terminated
//! before the term is given back, and never left running when the wrapper dies.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use cxc::election::{IDENTITY_MAX, LeaderRecord};
use cxc::{ElectionConfig, ElectionError, Elector, Leadership, MmapElection};

use crate::supervise::{self, Ended, Parent, Signals};
use crate::{CliError, EXIT_LEASE_LOST, duration, files};

/// What the published identity carries after the candidate's own: the command's process
/// group (` pgid=4294967295` at most).
const PGID_SUFFIX: &str = " pgid=";
/// The longest `--identity`: the rest of the record holds the process group.
pub(crate) const IDENTITY_LIMIT: usize = IDENTITY_MAX - PGID_SUFFIX.len() - 10;

/// Arguments of `cxc elect`.
#[derive(clap::Args, Debug)]
#[command(after_help = ELECT_EXIT_CODES)]
pub(crate) struct Elect {
    /// The election file (a lease file with a leader record; created if missing).
    path: PathBuf,
    /// This candidate's name, shown to observers (at most 16 bytes). Default
    /// `elect:PID` (the wrapper's pid).
    #[arg(long)]
    identity: Option<String>,
    /// How long a term lasts without renewal: a leader whose keeper stops renewing (the
    /// keeper renews while the command's group lives) is replaced after it.
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    lease_duration: Duration,
    /// After the command ends on its own, wait this long before campaigning again (the
    /// term is given back at once, so a standby takes over meanwhile).
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    restart_delay: Duration,
    /// Run this command line with `$SHELL -c` (`/bin/sh -c` if SHELL is unset or empty), as
    /// flock -c.
    #[arg(short = 'c', long = "command", conflicts_with = "cmd")]
    command: Option<OsString>,
    /// The command and its arguments.
    #[arg(
        required_unless_present = "command",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    cmd: Vec<OsString>,
}

const ELECT_EXIT_CODES: &str = "\
Runs until stopped: while this candidate leads, the command runs with CXC_FENCING_TOKEN
set to the term's token; when the command ends, the term is given back and the candidate
campaigns again after --restart-delay; when the term is lost, the command's process group
is terminated and the candidate campaigns again.

Exit codes:
  N        after SIGTERM/SIGINT/SIGHUP: the command's code (128+S if it died of signal
           S), or 128+S if it came while campaigning
  2        usage error, or the file is missing, foreign or unusable
  75       the wrapper died while the command ran (the group was terminated)
  126      the command was found but could not be run
  127      the command was not found

The group is terminated (SIGTERM, SIGKILL 2 s later) before the term is given back, and
a new leader first terminates the previous leader's recorded group if it still has live
members. See docs/cli.md.";

/// The process group in a published identity.
pub(crate) fn recorded_pgid(identity: &str) -> Option<u32> {
    identity
        .rsplit_once(PGID_SUFFIX)
        .and_then(|(_, g)| g.parse::<u32>().ok())
        .filter(|g| *g != 0)
}

pub(crate) fn run(args: Elect) -> Result<u8, CliError> {
    supervise::run(|parent, signals| keep(args, parent, signals))
}

impl Elect {
    fn argv(&self) -> Vec<OsString> {
        match &self.command {
            Some(c) => vec![crate::supervise::shell(), "-c".into(), c.clone()],
            None => self.cmd.clone(),
        }
    }
}

fn keep(args: Elect, parent: &Parent, signals: &Signals) -> Result<u8, CliError> {
    let identity = match &args.identity {
        Some(id) if id.len() > IDENTITY_LIMIT || id.is_empty() || id.contains(PGID_SUFFIX) => {
            return Err(CliError::usage(format!(
                "--identity must be 1 to {IDENTITY_LIMIT} bytes without `{}`",
                PGID_SUFFIX.trim()
            )));
        }
        Some(id) => id.clone(),
        None => format!(
            "elect:{}",
            rustix::process::getppid().map_or(0, |p| p.as_raw_pid())
        ),
    };
    if args.lease_duration < Duration::from_millis(10) {
        return Err(CliError::usage("--lease-duration must be at least 10ms"));
    }
    let path = files::follow(&args.path);
    let backend = MmapElection::create_or_open(&path, args.lease_duration)
        .map_err(|e| files::error(&args.path, &e))?;
    let config = ElectionConfig::new(identity.clone()).lease_duration(args.lease_duration);
    let elector = Elector::new(backend, config)?;
    let own_group = rustix::process::getpgrp().as_raw_pid().unsigned_abs();
    let period =
        (args.lease_duration / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let what = format!("election {}", args.path.display());
    loop {
        let (leadership, previous) = campaign(&elector, parent, signals, &what)?;
        let token = leadership.token();
        if let Some((prev_token, pgid)) = previous.filter(|(t, g)| *t < token && *g != own_group)
            && supervise::group_alive(pgid)
        {
            // The command of any earlier term on this file: the recorded group may be one
            // that the previous leader was itself ending (and recorded for that) when it
            // died, so its mark is of an older term than `prev_token`.
            let _ = prev_token;
            let theirs = runs_an_earlier_term(&path, pgid, token);
            if theirs {
                cxc_cli::say!(
                    "cxc: {what}: the previous leader's command (process group {pgid}) \
                     outlived its term; terminating it before running"
                );
                // Recorded as ours meanwhile: if this keeper dies before the group is
                // gone, the next leader finds it in the record and ends it.
                publish(&elector, &leadership, &identity, pgid);
                // Renewing the term meanwhile (ending the group can outlast it).
                let mut keep = || !matches!(leadership.renew(), Err(ElectionError::Lost { .. }));
                // Then, as a `lease run` taker does, the keepers of runs nested in that
                // command (`cxc elect E -- cxc sem run S -- job`): ending the group ends
                // only the nested run's wrapper, whose keeper, in a group of its own, ends
                // its own command before it exits.
                if supervise::terminate_group_keeping(pgid, &mut keep) {
                    supervise::wait_nested_keepers_where(
                        &what,
                        "leader's command",
                        pgid,
                        &mut |v| is_earlier_term(&path, v, token),
                        &mut keep,
                    );
                }
            } else {
                cxc_cli::say!(
                    "cxc: {what}: the previous leader named process group {pgid}, but none \
                     of its processes is that leader's command (the number was reused, or \
                     the command cleared its environment); leaving it alone"
                );
            }
        }
        // Run nothing unless the term is still ours (a candidate that took it over while
        // the group was ended runs its own command).
        if matches!(leadership.renew(), Err(ElectionError::Lost { .. })) {
            cxc_cli::say!(
                "cxc: {what}: term (token {token}) lost while the previous command was ended; \
                 nothing was run; campaigning again"
            );
            drop(leadership);
            continue;
        }
        let mut env = vec![
            ("CXC_FENCING_TOKEN", token.to_string().into()),
            ("CXC_ELECT_PATH", path.clone().into_os_string()),
        ];
        if let Some(mark) = run_of(&path, token) {
            env.push((supervise::MARK_VAR, mark.into()));
        }
        let running = supervise::spawn(&args.argv(), &env)?;
        publish(&elector, &leadership, &identity, running.pgid);
        let ended = supervise::supervise(running, parent, signals, period, &mut || {
            !matches!(leadership.renew(), Err(ElectionError::Lost { .. }))
        });
        // Resigns (fenced: a newer term is never ended).
        drop(leadership);
        match ended {
            Ended::WrapperDied => return Ok(EXIT_LEASE_LOST),
            Ended::Exited(code) if signals.seen() => return Ok(code),
            Ended::Exited(code) => {
                cxc_cli::say!(
                    "cxc: {what}: the command exited ({code}); gave the term (token {token}) \
                     back; campaigning again in {:?}",
                    args.restart_delay
                );
                if !parent.pause(signals, args.restart_delay) {
                    if parent.is_gone() {
                        return Ok(EXIT_LEASE_LOST);
                    }
                    let _ = signals.take();
                    return Ok(code);
                }
            }
            Ended::Lost => cxc_cli::say!(
                "cxc: {what}: term (token {token}) lost; the command's process group was \
                 terminated; campaigning again"
            ),
        }
    }
}

/// A term's token and the process group its leader recorded.
type Recorded = (u64, u32);

/// Campaigns until elected, watching the wrapper and signals. Also returns the last
/// process group another leader was seen to record, with its term's token.
fn campaign(
    elector: &Elector<MmapElection>,
    parent: &Parent,
    signals: &Signals,
    what: &str,
) -> Result<(Leadership<MmapElection>, Option<Recorded>), CliError> {
    let retry = elector.config().retry_period;
    let mut previous = None;
    loop {
        // Seen before campaigning: winning overwrites the record.
        // The record itself, also of a leader that died or ran out of time (`observe`
        // says nobody leads then): its group may have outlived it.
        if let Some(l) = elector.backend().recorded_leader()
            && let Some(g) = recorded_pgid(&l.identity)
        {
            previous = Some((l.token, g));
        }
        if let Some(l) = elector.campaign(retry)? {
            return Ok((l, previous));
        }
        if let Some(sig) = signals.take().first() {
            return Err(CliError {
                code: (128 + sig.as_raw()).clamp(0, 255) as u8,
                msg: format!("interrupted while campaigning in {what}"),
            });
        }
        if parent.is_gone() {
            return Err(CliError::usage("the wrapper is gone"));
        }
    }
}

/// Publishes the command's process group in the leader record (fenced by the term).
/// Whether group `pgid` runs the command of an earlier term than `token` on the election
/// file `path` (a member carries that term's mark; marks keep 24 bits of the token).
fn runs_an_earlier_term(path: &std::path::Path, pgid: u32, token: u64) -> bool {
    supervise::group_carries_any(pgid, supervise::MARK_VAR, &mut |v| {
        is_earlier_term(path, v, token)
    })
}

/// Whether the run mark `mark` is that of a term of the election file `path` before term
/// `token`.
fn is_earlier_term(path: &std::path::Path, mark: &str, token: u64) -> bool {
    let Some(mine) = run_of(path, token) else {
        return false;
    };
    let Some((file, _)) = mine.rsplit_once('.') else {
        return false;
    };
    mark.strip_prefix(file)
        .and_then(|t| t.strip_prefix('.'))
        .and_then(|t| t.parse::<u64>().ok())
        .is_some_and(|t| {
            let behind = token.wrapping_sub(t) & 0xFF_FFFF;
            behind != 0 && behind < 1 << 23
        })
}

/// The mark of the command of term `token` on the election file `path` (the processes
/// of that command carry it in [`supervise::MARK_VAR`]).
fn run_of(path: &std::path::Path, token: u64) -> Option<String> {
    supervise::run_mark(path, token)
}

fn publish(elector: &Elector<MmapElection>, l: &Leadership<MmapElection>, id: &str, pgid: u32) {
    let text = format!("{id}{PGID_SUFFIX}{pgid}");
    let mut name = [0u8; IDENTITY_MAX];
    let n = text.len().min(IDENTITY_MAX);
    name[..n].copy_from_slice(&text.as_bytes()[..n]);
    let rec = LeaderRecord {
        token: l.token(),
        pid: std::process::id(),
        len: u32::try_from(n).unwrap_or(0),
        name,
    };
    let _ = elector.backend().lease().write_claimed(l.term(), rec);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_group_is_read_back() {
        assert_eq!(recorded_pgid("elect:12 pgid=345"), Some(345));
        assert_eq!(recorded_pgid("a pgid=1 pgid=9"), Some(9));
        assert_eq!(recorded_pgid("elect:12"), None);
        assert_eq!(recorded_pgid("x pgid=0"), None);
        assert_eq!(recorded_pgid("x pgid=-3"), None);
        assert_eq!(recorded_pgid("x pgid=99999999999"), None);
        assert!(IDENTITY_LIMIT + " pgid=4294967295".len() <= IDENTITY_MAX);
    }
}

//! A command run on a held claim, shared by `lease run`, `sem run` and `rwlock run`.
//!
//! A *shared* hold (a permit, a read lock) does not expire: the keeper only waits for the
//! command's group. An *exclusive* hold (the lease, the write lock) is renewed while the
//! command runs and carries a [`Record`] in its payload: a tag, a run counter and the
//! process group of the command running on it (0: none). The group is recorded after the
//! command started and cleared once it is gone; a run that finds a group recorded (its
//! keeper was SIGKILLed, or stopped past the grace and evicted) terminates that group
//! before running its own command, if the group is that run's: the command of an
//! exclusive run is started with [`MARK_VAR`] naming the file and the run, and a recorded
//! group is terminated only if one of its live members still carries that mark (a
//! recorded number now naming another process's group, after pid reuse, does not).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::{
    Ended, Parent, Signals, Waiting, continue_once, group_alive, group_carries,
    nested_keepers_where, spawn, supervise, terminate_group_keeping,
};
use crate::{CliError, EXIT_LEASE_LOST};

/// The environment variable that marks the processes of an exclusive run's command:
/// `DEV.INODE.RUNS` of the file and the run's counter.
pub(crate) const MARK_VAR: &str = "CXC_RUN_MARK";

/// How often a run that found its file's holder table full tries again for a slot.
pub(crate) const SLOT_POLL: Duration = Duration::from_millis(20);

/// The mark of run `runs` on the file `file` (its device and inode; `None` if the file
/// cannot be looked at, which marks nothing and so ends no recorded group).
pub(crate) fn run_mark(file: &std::path::Path, runs: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    Some(format!("{}.{}.{}", m.dev(), m.ino(), runs & 0xFF_FFFF))
}

/// The run record an exclusive run keeps in its claim's `u64` payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// Exclusive runs so far (24 bits, wrapping).
    pub(crate) runs: u64,
    /// The process group of the command running on the claim.
    pub(crate) pgid: Option<u32>,
}

const TAG: u64 = 0xC5 << 56;
const TAG_MASK: u64 = 0xFF << 56;

impl Record {
    /// The record in `payload`; a payload not written by a run (no tag) counts no runs
    /// and names no group.
    pub(crate) fn decode(payload: u64) -> Record {
        if payload & TAG_MASK == TAG {
            Record {
                runs: (payload >> 32) & 0xFF_FFFF,
                pgid: Some(payload as u32).filter(|p| *p != 0),
            }
        } else {
            Record {
                runs: 0,
                pgid: None,
            }
        }
    }

    /// The payload holding this record.
    pub(crate) fn encode(self) -> u64 {
        TAG | ((self.runs & 0xFF_FFFF) << 32) | u64::from(self.pgid.unwrap_or(0))
    }
}

/// Terminates the group `prev` names if it is not ours, still has live members and is
/// that run's (a live member carries the run's mark on `file`): its keeper is gone or was
/// evicted, so nothing else will. `keep` renews the caller's claim while it waits for
/// the group (up to [`super::KILL_DELAY`] and more); `false` if it reported the claim lost
/// (then the caller must not run its command).
///
/// Then it waits, renewing the claim the same way, for the keepers of runs nested in that
/// run (`cxc lease run A -- cxc sem run B -- job`): ending the recorded group ends only the
/// nested run's wrapper, and its keeper, in a group of its own, ends its own command
/// before it exits (up to [`super::KILL_DELAY`] and more). Each such keeper is sent
/// SIGCONT once: a stopped one would never end its command.
fn end_orphan(
    what: &str,
    file: &std::path::Path,
    prev: Record,
    keep: &mut dyn FnMut() -> bool,
) -> bool {
    let own_group = rustix::process::getpgrp().as_raw_pid().unsigned_abs();
    let Some(pgid) = prev.pgid.filter(|p| *p != own_group) else {
        return true;
    };
    let mark = run_mark(file, prev.runs);
    if group_alive(pgid) {
        let ours = mark
            .as_deref()
            .is_some_and(|m| group_carries(pgid, MARK_VAR, m));
        if ours {
            cxc_cli::say!(
                "cxc: {what}: the previous exclusive command (process group {pgid}) outlived \
                 its claim; terminating it before running"
            );
            if !terminate_group_keeping(pgid, keep) {
                return false;
            }
        } else {
            cxc_cli::say!(
                "cxc: {what}: the payload names process group {pgid}, but none of its \
                 processes is the previous run's command (the number was reused, or the \
                 command cleared its environment); leaving it alone"
            );
        }
    }
    mark.is_none_or(|m| wait_nested_keepers_of(what, pgid, &m, keep))
}

/// Waits until no keeper of a run nested in group `pgid`, the command of the run marked
/// `mark`, is left (see [`end_orphan`]), calling `keep` every [`super::KEEP_EVERY`];
/// `false` as soon as `keep` does.
fn wait_nested_keepers_of(
    what: &str,
    pgid: u32,
    mark: &str,
    keep: &mut dyn FnMut() -> bool,
) -> bool {
    wait_nested_keepers_where(what, "exclusive command", pgid, &mut |v| v == mark, keep)
}

/// [`wait_nested_keepers_of`] for the nested keepers whose run mark satisfies `want`
/// (`cxc elect`: any earlier term's); `whose` names the previous command in the message.
pub(crate) fn wait_nested_keepers_where(
    what: &str,
    whose: &str,
    pgid: u32,
    want: &mut dyn FnMut(&str) -> bool,
    keep: &mut dyn FnMut() -> bool,
) -> bool {
    let mut continued: Vec<u32> = Vec::new();
    loop {
        let live = nested_keepers_where(pgid, MARK_VAR, want);
        if live.is_empty() {
            return true;
        }
        if continued.is_empty() {
            cxc_cli::say!(
                "cxc: {what}: a run nested in the previous {whose} is still ending its own \
                 command; waiting for it before running"
            );
        }
        continue_once(&live, &mut continued);
        if !keep() {
            return false;
        }
        std::thread::sleep(super::KEEP_EVERY);
    }
}

/// A keeper: it waits for its claim, then runs its command on it.
pub(crate) struct Keeper<'a> {
    pub(crate) waiting: &'a Waiting,
    pub(crate) parent: &'a Parent,
    pub(crate) signals: &'a Signals,
    /// When the keeper began: `-w` bounds every wait of the run together.
    pub(crate) started: Instant,
}

impl Keeper<'_> {
    /// Whether the run must stop before its command starts, while it ends a previous
    /// run's command: a signal the wrapper forwarded (exit 128 + the signal) or the
    /// wrapper gone (exit 2), as while it waits for the claim. Nothing is run then; the
    /// claim's record still names the previous group, so the next run ends it.
    fn interruption(&self) -> Option<CliError> {
        if let Some(sig) = self.signals.take().first() {
            return Some(CliError {
                code: (128 + sig.as_raw()).clamp(0, 255) as u8,
                msg: "interrupted while the previous command was ended; nothing was run".into(),
            });
        }
        self.parent.is_gone().then(|| {
            CliError::usage(
                "the wrapper is gone (while the previous command was ended); nothing was run",
            )
        })
    }

    /// Takes the claim as the waiting options say (see [`Waiting::acquire`]).
    pub(crate) fn acquire<T>(
        &self,
        what: &str,
        try_now: impl FnOnce() -> Option<T>,
        wait_for: impl FnMut(Duration) -> Option<T>,
    ) -> Result<T, CliError> {
        self.waiting.acquire(
            what,
            self.parent,
            self.signals,
            self.started,
            try_now,
            wait_for,
        )
    }

    /// Opens a file whose holder table may be full (`open` gives `Ok(None)` then, and
    /// takes a slot when it gives the handle): waits for a slot as for the claim
    /// itself (`-n`, `-w`, signals, a dead wrapper), trying again every
    /// [`SLOT_POLL`]. A slot frees when a holder's process ends (a dead holder's
    /// slot is reclaimed by the next open). Any other error ends the run.
    pub(crate) fn open_with_slot<T>(
        &self,
        what: &str,
        open: impl Fn() -> Result<Option<T>, CliError>,
    ) -> Result<T, CliError> {
        if let Some(t) = open()? {
            return Ok(t);
        }
        let what = format!("a free holder slot of {what}");
        self.acquire(
            &what,
            || None,
            |left| {
                let until = Instant::now() + left;
                loop {
                    match open() {
                        Ok(None) => {}
                        other => return other.transpose(),
                    }
                    let now = Instant::now();
                    if now >= until {
                        return None;
                    }
                    std::thread::sleep(SLOT_POLL.min(until - now));
                }
            },
        )?
    }

    /// Runs the command on a shared hold that needs no renewal and returns the exit code
    /// to report; `payload` (if the claim has one) may name an orphaned exclusive group,
    /// which is terminated first. The caller releases the hold after.
    pub(crate) fn run_shared(
        &self,
        what: &str,
        file: &std::path::Path,
        payload: Option<u64>,
        env: &[(&str, OsString)],
    ) -> Result<u8, CliError> {
        if let Some(p) = payload {
            // A shared hold does not expire: nothing to renew while the group ends.
            let mut stop = None;
            end_orphan(what, file, Record::decode(p), &mut || {
                stop = self.interruption();
                stop.is_none()
            });
            if let Some(e) = stop {
                return Err(e);
            }
        }
        let running = spawn(&self.waiting.argv(), env)?;
        // Shared holds do not expire: nothing to renew.
        let period = Duration::from_secs(1);
        match supervise(running, self.parent, self.signals, period, &mut || true) {
            Ended::Exited(code) => Ok(code),
            Ended::WrapperDied | Ended::Lost => Ok(EXIT_LEASE_LOST),
        }
    }

    /// Runs the command on an exclusive hold, renewed every `period`: ends an orphaned
    /// group the record names, records the command's group while it runs, and returns
    /// the exit code to report, or the error `lost` words (exit 75) if the claim was lost
    /// meanwhile.
    pub(crate) fn run_exclusive(
        &self,
        what: &str,
        file: &std::path::Path,
        hold: &dyn ExclusiveHold,
        env: &[(&str, OsString)],
        period: Duration,
        lost: &str,
    ) -> Result<u8, CliError> {
        let prev = Record::decode(hold.payload().unwrap_or(0));
        let token = hold.fencing_token();
        // Ending an orphan can take longer than the claim's grace: renew meanwhile, and
        // run nothing unless the claim is still ours afterwards (a waiter that took it as
        // stale runs its own command).
        let mut stop = None;
        let ended = end_orphan(what, file, prev, &mut || {
            stop = self.interruption();
            stop.is_none() && hold.renew()
        });
        if let Some(e) = stop {
            return Err(e);
        }
        if !ended || !hold.renew() {
            return Err(CliError {
                code: EXIT_LEASE_LOST,
                msg: format!(
                    "{what} lost (token {token} {lost}) while the previous command was ended; \
                     nothing was run"
                ),
            });
        }
        let runs = prev.runs + 1;
        let mut env = env.to_vec();
        env.push(("CXC_FENCING_TOKEN", token.to_string().into()));
        if let Some(mark) = run_mark(file, runs) {
            env.push((MARK_VAR, mark.into()));
        }
        let record = |pgid| Record { runs, pgid }.encode();
        let running = match spawn(&self.waiting.argv(), &env) {
            Ok(r) => r,
            Err(e) => {
                hold.set_payload(record(None));
                return Err(e);
            }
        };
        hold.set_payload(record(Some(running.pgid)));
        match supervise(running, self.parent, self.signals, period, &mut || {
            hold.renew()
        }) {
            Ended::Exited(code) => {
                hold.set_payload(record(None));
                Ok(code)
            }
            Ended::WrapperDied => {
                hold.set_payload(record(None));
                Ok(EXIT_LEASE_LOST)
            }
            Ended::Lost => Err(CliError {
                code: EXIT_LEASE_LOST,
                msg: format!(
                    "{what} lost (token {token} {lost}); the command's process group was terminated"
                ),
            }),
        }
    }
}

/// The claim of an exclusive run, as [`Keeper::run_exclusive`] uses it.
pub(crate) trait ExclusiveHold {
    /// The claim's payload (`None`: unreadable, e.g. a torn write).
    fn payload(&self) -> Option<u64>;
    /// Writes the claim's payload (best effort: a lost claim refuses it).
    fn set_payload(&self, v: u64);
    /// Shows progress; `false` once the claim is lost.
    fn renew(&self) -> bool;
    /// The fencing token of the claim.
    fn fencing_token(&self) -> u64;
}

/// [`ExclusiveHold`] for a guard with `read`, `write` and `token`, renewed by `$renew`.
macro_rules! exclusive_hold {
    ($guard:ty, $renew:expr) => {
        impl ExclusiveHold for $guard {
            fn payload(&self) -> Option<u64> {
                self.read().ok()
            }

            fn set_payload(&self, v: u64) {
                let _ = self.write(v);
            }

            fn renew(&self) -> bool {
                let renew: fn(&Self) -> bool = $renew;
                renew(self)
            }

            fn fencing_token(&self) -> u64 {
                self.token()
            }
        }
    };
}

// The lease: a beat, and the claim still current (a takeover after a stop shows here).
exclusive_hold!(cxc::LeaseGuard<'_, u64>, |g| g.beat().is_ok()
    && g.is_current());
// The write lock: a beat (an evicted writer's beat is refused).
exclusive_hold!(cxc::WriteGuard<'_, u64>, |g| g.beat().is_ok());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_foreign_payloads_name_no_group() {
        let r = |runs, pgid| Record { runs, pgid };
        assert_eq!(Record::decode(r(7, Some(1234)).encode()), r(7, Some(1234)));
        assert_eq!(Record::decode(r(8, None).encode()), r(8, None));
        assert_eq!(Record::decode(r(1 << 24, None).encode()), r(0, None));
        assert_eq!(Record::decode(0), r(0, None));
        assert_eq!(Record::decode(1234), r(0, None));
    }
}

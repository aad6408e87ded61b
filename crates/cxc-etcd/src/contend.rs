//! The contender queue under `N/` that [`EtcdLease`](crate::EtcdLease) and
//! [`EtcdElection`](crate::EtcdElection) share: the layout of etcd's concurrency package
//! (`concurrency.Mutex` and `concurrency.Election`, `etcdctl lock` and `etcdctl elect`).
//!
//! Each handle contends with one key `N/<session hex>`, created under its session; the
//! key with the lowest create revision is first (holds the lease, leads the election),
//! and that create revision is the fencing token.
//!
//! - **attempt**: `txn(create_revision(N/<s>) == 0) then put(N/<s>, value, lease = s),
//!   get(first N/ by create), reads... else get(N/<s>), get(first N/ by create),
//!   reads...`. First iff our key is the first. If not, our key is deleted again (as
//!   `concurrency.Mutex::TryLock` does), fenced by its create revision, and the first
//!   key looked at once more in the same step.
//! - **wait**: a blocked contender watches the first key for its deletion (release,
//!   resignation or session expiry), then attempts again. A request that fails on the
//!   way (a hung or lost member) is tried again, on the next member, until the caller's
//!   timeout; the wait gives up early only when requests have failed in a row for
//!   members × the request timeout, and at least as many as there are members (see
//!   [`Retries`]).
//! - **unknown outcome**: an attempt whose request timed out (or failed after it was
//!   sent) may still be applied later, and its put would then create our key on a
//!   session that is kept alive: a contender nobody knows of, first once the others
//!   leave. So the session is ended at once (revoked: the late put then fails, or its
//!   key goes with the session), unless the handle holds the claim on it — then the key
//!   exists, a late attempt cannot create it, and the session is ended when the claim
//!   is released instead (a late attempt could otherwise re-create the key after that).
//!   A **release or resignation** whose outcome is unknown ends the session too: its
//!   delete may be applied later, handing the claim to a rival while the handle, which
//!   still finds its key meanwhile, would believe it holds; with the session ended the
//!   claim is lost at once as far as the handle knows, and the key goes with the session.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};

use crate::conn::{Etcd, key_str};
use crate::error::EtcdError;
use crate::session::Session;
use crate::txn::{
    check_name, exists_as, fenced, fenced_delete, first_created, lease_not_found, no_leader,
    nth_get, outcome_unknown, revision, worth_retrying,
};
use crate::wait::{MAX_WAIT, wait_for_delete};

/// One handle's place in the queue of name `N`: its connection, its session and `N/`.
#[derive(Debug)]
pub(crate) struct Contender {
    pub(crate) etcd: Etcd,
    pub(crate) session: Session,
    /// `N/`: the contender prefix.
    prefix: Vec<u8>,
    /// `(session, create revision)` of our key while an attempt found it first (cleared
    /// when it is withdrawn).
    held: Mutex<Option<(i64, i64)>>,
    /// A session (0: none) on which an attempt's outcome is unknown while the handle
    /// held the claim: ended when that claim is withdrawn.
    tainted: AtomicI64,
    /// Held through one attempt (claim, then the withdraw of a key that is not first):
    /// threads sharing the handle attempt one at a time, so one thread's withdraw never
    /// deletes the key another thread's attempt just found first.
    attempting: Mutex<()>,
    /// The run of requests that failed in a row, across this handle's waits and
    /// look-ups of the first key (see [`Retries`]).
    run: Mutex<Run>,
}

/// Our key is first: its create revision and session, and the transaction's response
/// (the caller's reads are its gets from index `reads_at` on).
pub(crate) struct First {
    pub(crate) created: i64,
    pub(crate) session: i64,
    pub(crate) resp: TxnResponse,
    pub(crate) reads_at: usize,
}

/// Someone else is first: its key `owner`, seen at store revision `rev` (the latest
/// revision, so a watch from `rev + 1` starts in sync and gets the delete at once);
/// `still_held`: `owner` still existed at `rev`.
pub(crate) struct Held {
    owner: Vec<u8>,
    rev: i64,
    still_held: bool,
}

impl Contender {
    /// The queue of name `name` on `etcd`, with a new session kept alive as the
    /// connection says. No request is made.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub(crate) fn new(etcd: &Etcd, name: &str) -> Result<Self, EtcdError> {
        check_name(name)?;
        Ok(Contender {
            etcd: etcd.clone(),
            session: Session::new(etcd, etcd.options().keep_alive),
            prefix: format!("{name}/").into_bytes(),
            held: Mutex::new(None),
            tainted: AtomicI64::new(0),
            attempting: Mutex::new(()),
            run: Mutex::new(Run::default()),
        })
    }

    /// `N/`, for messages.
    pub(crate) fn prefix(&self) -> String {
        key_str(&self.prefix)
    }

    /// The contender key of session `s`: `N/<s in lowercase hex>`, as etcd's
    /// `concurrency.Mutex` names it.
    pub(crate) fn key_of(&self, session: i64) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(format!("{session:x}").as_bytes());
        key
    }

    /// The first key's value and create revision, `None` when nobody contends.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub(crate) fn first(&self, op: &'static str) -> Result<Option<(String, u64)>, EtcdError> {
        // Its outcome counts in the handle's run of failures (an election campaign
        // observes the leader between its slices).
        let sent = Instant::now();
        let resp = self.etcd.get(op, &self.prefix, Some(first_created()));
        record(&self.run, sent, &resp, self.etcd.options().request_timeout);
        let resp = resp?;
        Ok(resp.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision() as u64,
            )
        }))
    }

    /// `txn(create_revision(N/<session>) == created ∧ extra) then ops else else_ops`.
    pub(crate) fn fenced(
        &self,
        op: &'static str,
        (session, created): (i64, i64),
        extra: Option<Compare>,
        ops: Vec<TxnOp>,
        else_ops: Vec<TxnOp>,
    ) -> Result<TxnResponse, EtcdError> {
        let key = self.key_of(session);
        fenced(&self.etcd, op, (&key, created), extra, ops, else_ops)
    }

    /// Deletes the key of `session` if it was created at `created` (release, resign).
    ///
    /// # Errors
    /// If the request fails. If its outcome is unknown (it timed out, or failed after it
    /// was sent), the delete may still be applied later (when a hung member resumes), and
    /// a rival then holds while this handle would believe it holds (its key would still
    /// be there meanwhile, and claiming again would find it): the session is ended here
    /// and on the server (revoked in the background; the key goes with it), so the claim
    /// is lost at once as far as the handle knows (`is_lost`, `is_current` without a
    /// request), and the next claim opens a new session.
    pub(crate) fn withdraw(
        &self,
        op: &'static str,
        (session, created): (i64, i64),
    ) -> Result<bool, EtcdError> {
        // A session known or presumed lost took its key with it (or is being revoked).
        let gone = if self.session.lost(session) {
            false
        } else {
            match fenced_delete(&self.etcd, op, &self.key_of(session), created) {
                Ok(gone) => gone,
                Err(e) => {
                    if outcome_unknown(&e) {
                        self.forget(session, created);
                        self.session.expired(session);
                    }
                    return Err(e);
                }
            }
        };
        self.forget(session, created);
        Ok(gone)
    }

    /// The claim `(session, created)` is withdrawn (or its session ended): forget it, and
    /// end a session on which an attempt's outcome was unknown.
    fn forget(&self, session: i64, created: i64) {
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if *held == Some((session, created)) {
                *held = None;
            }
        }
        if self
            .tainted
            .compare_exchange(session, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // An attempt on this session whose outcome is unknown may still put our key
            // again: end the session (see the module's "unknown outcome").
            self.session.expired(session);
        }
    }

    /// After an attempt on `session` whose outcome is unknown: end the session unless
    /// the handle holds the claim on it (then end it at the release).
    fn unknown_outcome(&self, session: i64) {
        let held = *self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_some_and(|(s, _)| s == session) && self.session.alive(session) {
            self.tainted.store(session, Ordering::Release);
        } else {
            self.session.expired(session);
        }
    }

    /// Whether the key of `session` still exists with create revision `created`:
    /// `Ok(false)` without a request if `session` is this handle's and known or presumed
    /// lost.
    pub(crate) fn is_current(&self, (session, created): (i64, i64)) -> Result<bool, EtcdError> {
        if self.session.lost(session) {
            return Ok(false);
        }
        exists_as(&self.etcd, &self.key_of(session), created)
    }

    /// One keep-alive of `session`, then [`Contender::is_current`] (beat, renew).
    pub(crate) fn refresh(&self, (session, created): (i64, i64)) -> Result<bool, EtcdError> {
        Ok(self.session.keep_alive(session)? && self.is_current((session, created))?)
    }

    /// One attempt to be first with `value` in our key, the gets `reads` made in the same
    /// transaction. `op` names it in errors.
    pub(crate) fn attempt(
        &self,
        op: &'static str,
        value: &[u8],
        reads: &[TxnOp],
    ) -> Result<Result<First, Held>, EtcdError> {
        let _one = self.attempting.lock().unwrap_or_else(|e| e.into_inner());
        // A beat-driven session is refreshed first: a claim won late in a wait gets a
        // whole TTL from the claim, not what is left of the session's last refresh.
        let session = self.session.id_refreshed()?;
        match self.attempt_on(op, session, value, reads) {
            // Our session expired since we last used it: open a new one and try again.
            Err(e) if lease_not_found(&e) => {
                self.session.expired(session);
                self.attempt_on(op, self.session.id()?, value, reads)
            }
            r => r,
        }
    }

    fn attempt_on(
        &self,
        op: &'static str,
        session: i64,
        value: &[u8],
        reads: &[TxnOp],
    ) -> Result<Result<First, Held>, EtcdError> {
        let mine = self.key_of(session);
        let mut then = vec![
            TxnOp::put(
                mine.clone(),
                value,
                Some(PutOptions::new().with_lease(session)),
            ),
            TxnOp::get(self.prefix.clone(), Some(first_created())),
        ];
        then.extend(reads.iter().cloned());
        let mut otherwise = vec![TxnOp::get(mine.clone(), None)];
        otherwise.extend(then[1..].iter().cloned());
        let txn = Txn::new()
            .when([Compare::create_revision(mine.clone(), CompareOp::Equal, 0)])
            .and_then(then)
            .or_else(otherwise);
        let resp = match self.etcd.txn(op, &mine, txn) {
            Ok(resp) => resp,
            Err(e) => {
                if outcome_unknown(&e) {
                    self.unknown_outcome(session);
                }
                return Err(e);
            }
        };
        let rev = revision(&resp, op, &mine)?;
        let protocol = |detail| EtcdError::Protocol {
            op,
            key: key_str(&mine),
            detail,
        };
        // The gets of the branch taken: [mine (else only)], first contender, reads.
        let base = usize::from(!resp.succeeded());
        let created = if resp.succeeded() {
            // Our key was created by this txn: its create revision is the txn's.
            rev
        } else {
            // Our key exists already (an earlier attempt whose reply was lost, or our
            // own claim again).
            nth_get(&resp, 0)
                .ok_or(protocol("contender key vanished inside a transaction"))?
                .created
        };
        let first = nth_get(&resp, base).ok_or(protocol("no contender key in a transaction"))?;
        if first.created == created && !self.session.alive(session) {
            // First, but the session ran out while the reply was on its way (a request
            // held up by a hung member, this process stopped): the key dies with the
            // session, and someone else may hold already. Never hand out a claim known
            // lost; end the session (its key goes with it) and report "not first".
            self.session.expired(session);
            return Ok(Err(Held {
                owner: mine,
                rev,
                still_held: false,
            }));
        }
        if first.created == created {
            *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some((session, created));
            return Ok(Ok(First {
                created,
                session,
                resp,
                reads_at: base + 1,
            }));
        }
        // Someone else is first: withdraw our key (as `concurrency.Mutex::TryLock`
        // does), fenced by its create revision, and look at the first key again in
        // the same step.
        let look = TxnOp::get(first.key.clone(), None);
        let del = TxnOp::delete(mine.clone(), None);
        let step = (mine.as_slice(), created);
        let resp = match fenced(
            &self.etcd,
            "withdraw",
            step,
            None,
            vec![del, look.clone()],
            vec![look],
        ) {
            Ok(r) => r,
            Err(e) => {
                // Our key may linger and become first once the others leave: end the
                // session (revoked in the background), which deletes it.
                self.session.expired(session);
                return Err(e);
            }
        };
        let rev = revision(&resp, "withdraw", &mine)?;
        let still_held = nth_get(&resp, 0).is_some_and(|f| f.created == first.created);
        Ok(Err(Held {
            owner: first.key,
            rev,
            still_held,
        }))
    }

    /// Attempts with `attempt` until it is first (`Some`) or `timeout` passes (`None`),
    /// waiting on a watch of the first key for its deletion in between. A failed attempt
    /// is tried again (see [`Retries`]).
    pub(crate) fn wait_first<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut() -> Result<Result<T, Held>, EtcdError>,
    ) -> Result<Option<T>, EtcdError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut retries = Retries::new(&self.etcd, &self.run);
        loop {
            let sent = Instant::now();
            let outcome = attempt();
            let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
            let held = match retries.judge(outcome, sent, left)? {
                Some(Ok(won)) => return Ok(Some(won)),
                Some(Err(held)) => held,
                None if left.is_zero() => return Ok(None),
                None => continue,
            };
            if left.is_zero() {
                return Ok(None);
            }
            if !held.still_held {
                // Released between our attempt and our withdraw: attempt again at once.
                continue;
            }
            wait_for_delete(
                &self.etcd,
                &held.owner,
                false,
                held.rev + 1,
                left.min(MAX_WAIT),
            );
        }
    }
}

/// A run of requests of one handle that failed in a row (see [`Retries`]): kept by the
/// handle across its waits, so a caller that waits in short slices (an election
/// campaign) follows the same rule as one long wait.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Run {
    /// When the first failed request of the run was sent (`None`: no run).
    since: Option<Instant>,
    /// How many requests of the run failed.
    failures: usize,
    /// When the last failure came back.
    last: Option<Instant>,
}

impl Run {
    /// A request answered: the run ends.
    pub(crate) fn answered(&mut self) {
        *self = Run::default();
    }

    /// A request sent at `sent` failed (came back at `now`). It continues the run if it
    /// was sent within `stale` of the run's last failure coming back; otherwise (the
    /// handle made no request for a while, so nothing is known of the time in between) it
    /// starts a new one.
    pub(crate) fn failed(&mut self, sent: Instant, now: Instant, stale: Duration) {
        let continues = self
            .last
            .is_some_and(|last| sent.saturating_duration_since(last) <= stale);
        if !continues || self.since.is_none() {
            self.since = Some(sent);
            self.failures = 0;
        }
        self.failures += 1;
        self.last = Some(now);
    }

    /// How long the run has gone on at `now` (from the sending of its first request), and
    /// how many of its requests failed.
    fn length(&self, now: Instant) -> (Duration, usize) {
        let age = self
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        (age, self.failures)
    }
}

/// Records the outcome of a request sent at `sent` in `run` (any answer ends the run;
/// a failure worth retrying extends it).
pub(crate) fn record<V>(
    run: &Mutex<Run>,
    sent: Instant,
    outcome: &Result<V, EtcdError>,
    stale: Duration,
) {
    let mut run = run.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Ok(_) => run.answered(),
        Err(e) if worth_retrying(e) => run.failed(sent, Instant::now(), stale),
        Err(_) => {}
    }
}

/// The retry rule of a blocked wait: a request that failed with a timeout or a transport
/// error is tried again (the next request goes to the next member) until the caller's
/// deadline, or until requests have failed in a row for at least members × the request
/// timeout (from the sending of the first of them) and at least as many of them as there
/// are members (then no member answered for that long: the error is the wait's result).
/// A failure that came back at once (a refused connection, a member that has no leader
/// while the others elect one) is tried again after a short pause, longer after "no
/// leader" (an etcd election takes about an election timeout): instant failures alone
/// never end a wait before that time. A deadline that passes earlier is a plain timeout
/// of the wait (`Ok(None)` to the caller), so a caller that waits in short slices (an
/// election campaign) goes on with its next slice; the run is the handle's ([`Run`]), so
/// the slices add up.
pub(crate) struct Retries<'a> {
    members: usize,
    /// The request timeout: the run must last members × this before the wait gives up;
    /// a failure sent longer than this after the last one starts a new run.
    request: Duration,
    run: &'a Mutex<Run>,
}

/// Pause before trying again after a request failed at once (refused, reset).
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// Pause before trying again after a member answered that it has no leader (the members
/// are electing one: that takes about an election timeout, 1 s with etcd's defaults).
const NO_LEADER_PAUSE: Duration = Duration::from_millis(100);

impl<'a> Retries<'a> {
    pub(crate) fn new(etcd: &Etcd, run: &'a Mutex<Run>) -> Self {
        Retries {
            members: etcd.members().len(),
            request: etcd.options().request_timeout,
            run,
        }
    }

    /// `Ok(Some(v))` for an answer, `Ok(None)` to try again (after a short pause; the
    /// caller ends the wait as timed out if `left` is zero), `Err` when the wait must end
    /// with the error (`sent`: when the request, or the first of the attempt's requests,
    /// was sent; `left`: time left before the deadline).
    pub(crate) fn judge<V>(
        &mut self,
        outcome: Result<V, EtcdError>,
        sent: Instant,
        left: Duration,
    ) -> Result<Option<V>, EtcdError> {
        record(self.run, sent, &outcome, self.request);
        match outcome {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                if !worth_retrying(&e) {
                    return Err(e);
                }
                let (age, failures) = self
                    .run
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .length(Instant::now());
                let budget = self
                    .request
                    .saturating_mul(u32::try_from(self.members).unwrap_or(u32::MAX));
                if failures >= self.members && age >= budget {
                    return Err(e);
                }
                let pause = if no_leader(&e) {
                    NO_LEADER_PAUSE
                } else {
                    RETRY_PAUSE
                };
                std::thread::sleep(pause.min(left));
                Ok(None)
            }
        }
    }
}

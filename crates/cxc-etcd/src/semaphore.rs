//! [`EtcdSemaphore`]: a permit pool on etcd, with crash recovery by session expiry.
//!
//! # Protocol
//!
//! Keys under the semaphore's name `N`:
//!
//! | key                          | value          | attached to       | meaning              |
//! |------------------------------|----------------|-------------------|----------------------|
//! | `N/max`                      | `max_permits`  | nothing           | the pool's size      |
//! | `N/holders/<session>-<seq>`  | holder tag     | holder's session  | one permit taken     |
//! | `N/cancel/<session>-<seq>`   | empty          | holder's session  | take `<seq>` cancelled |
//!
//! - **take**: read the number of holder keys and the store revision `R` (one
//!   count-only range request); if fewer than `max`, `txn(mod_revision(N/holders/*) < R+1)
//!   then put(N/holders/<session>-<seq>, lease = session)`. The compare covers the whole
//!   prefix: it fails if *any* holder key was created after `R`, so two takers that both
//!   counted `max - 1` cannot both succeed (the second sees the first's key). A key
//!   deleted after `R` only lowers the count, which is safe. On a failed compare, count
//!   again. The take also requires that its cancel key `N/cancel/<session>-<seq>` does
//!   not exist.
//! - **unknown outcome of a take** (its request timed out, or failed after it was sent:
//!   it may still be applied, even much later): `txn(create_revision(N/holders/<s>-<seq>)
//!   == 0) then put(N/cancel/<s>-<seq>, lease = session) else get(N/holders/<s>-<seq>)`
//!   settles it. If the holder key is not there, the cancel key now is, so the take can
//!   never be applied (and if the session is gone, neither can its put); if it is there,
//!   the take was applied and the permit is the handle's. If even that cannot be
//!   settled, the session is ended (revoked; its permits are then reported lost), so no
//!   holder key can outlive the handle's knowledge of it.
//! - **give**: delete one of this handle's holder keys, fenced by its create revision.
//!   A give whose outcome is unknown (it may still be applied, late) takes the permit off
//!   the held list at once (reported lost) and leaves its delete pending: sent again by
//!   the handle's later gives and takes until it is settled or the session ends.
//! - **recovery**: a holder's keys are deleted by etcd when its session expires.
//!
//! Each permit is an [`EtcdPermit`]: its holder key and that key's create revision, the
//! permit's fencing token. A permit is current while its key exists with that create
//! revision ([`EtcdSemaphore::is_current`] asks etcd). A permit whose session is known
//! gone or missed its local deadline (see the session's local expiry) is *lost*: it no
//! longer counts in [`EtcdSemaphore::held`], [`EtcdSemaphore::lost_permits`] hands it out
//! once, and [`EtcdSemaphore::is_lost`] says so without a request, so a holder cut off
//! from every member learns it while it cannot reach etcd.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::PermitPool;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::conn::{Etcd, EtcdOptions, KeepAlive, key_str};
use crate::contend::{Retries, Run};
use crate::error::EtcdError;
use crate::session::{KeepAliveStats, Session};
use crate::txn::{
    check_name, exists_as, fenced_delete, holder_tag, lease_not_found, nth_get, outcome_unknown,
    revision,
};
use crate::wait::{MAX_WAIT, wait_for_delete};

/// How many count-then-take rounds one take attempt makes before it reports contention.
const TAKE_ROUNDS: usize = 32;

/// One permit of an [`EtcdSemaphore`]: its holder key and fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EtcdPermit {
    key: Vec<u8>,
    token: i64,
    session: i64,
}

impl EtcdPermit {
    /// The fencing token: the holder key's create revision. Every permit of the pool
    /// taken later has a larger token; pass it to storage that must refuse the work of a
    /// holder whose permit was lost.
    pub fn token(&self) -> u64 {
        self.token as u64
    }

    /// The etcd lease id of the session the permit lives on.
    pub fn session(&self) -> i64 {
        self.session
    }

    /// The holder key (`N/holders/<session>-<seq>`).
    pub fn key(&self) -> String {
        key_str(&self.key)
    }
}

#[derive(Debug, Default)]
struct Permits {
    /// Permits believed held, most recent last.
    held: Vec<EtcdPermit>,
    /// Permits found lost and not yet handed out by `lost_permits`.
    lost: Vec<EtcdPermit>,
    /// Permits whose give failed with an unknown outcome (the delete may still be
    /// applied, late): no longer held as far as the handle knows; the handle's later
    /// gives and takes send their fenced delete again until it is settled or their
    /// session ends.
    giving: Vec<EtcdPermit>,
}

/// A counting semaphore stored in etcd: at most `max_permits` holder keys exist at any
/// revision, across all processes and machines. Use it through [`PermitPool`].
///
/// Permits belong to the handle that took them (one etcd session, kept alive in the
/// background): [`give`](PermitPool::give) returns one of this handle's permits. If the
/// process dies, its session expires after the TTL and etcd deletes its holder keys:
/// the permits come back by themselves. Dropping the handle revokes the session, which
/// returns its permits at once.
///
/// # Examples
/// ```no_run
/// use cxc_etcd::{Etcd, EtcdOptions, EtcdSemaphore};
/// use cxc_sync::PermitPool;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let etcd = Etcd::connect(&["http://127.0.0.1:2379"], EtcdOptions::default())?;
/// let pool = EtcdSemaphore::open(&etcd, "jobs/workers", 4)?;
/// if pool.take_timeout(std::time::Duration::from_secs(5))? {
///     // ... at most 4 of these run at once, cluster-wide ...
///     pool.give()?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct EtcdSemaphore {
    etcd: Etcd,
    session: Session,
    max: u32,
    holders: Vec<u8>,
    /// `N/cancel/`: the cancel keys of takes whose outcome was unknown.
    cancels: Vec<u8>,
    /// This handle's permits.
    permits: Mutex<Permits>,
    seq: AtomicU64,
    tag: Vec<u8>,
    /// The run of requests that failed in a row, across this handle's waits (see
    /// [`Retries`]).
    run: Mutex<Run>,
}

impl std::fmt::Debug for EtcdSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSemaphore")
            .field("holders", &key_str(&self.holders))
            .field("max", &self.max)
            .field("etcd", &self.etcd)
            .finish()
    }
}

impl EtcdSemaphore {
    /// Opens the semaphore `name` with `max_permits`, creating its `max` key if it does
    /// not exist yet (exactly one racing creator wins; the others check its value).
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name or zero permits;
    /// [`EtcdError::MaxMismatch`] if it exists with another maximum; request errors.
    pub fn open(etcd: &Etcd, name: &str, max_permits: u32) -> Result<Self, EtcdError> {
        check_name(name)?;
        if max_permits == 0 {
            return Err(EtcdError::InvalidOption(
                "max_permits must be at least 1".into(),
            ));
        }
        let max_key = format!("{name}/max").into_bytes();
        let txn = Txn::new()
            .when([Compare::create_revision(
                max_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(max_key.clone(), max_permits.to_string(), None)])
            .or_else([TxnOp::get(max_key.clone(), None)]);
        let resp = etcd.txn("open", &max_key, txn)?;
        if !resp.succeeded() {
            let found = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            });
            let found = String::from_utf8_lossy(&found.unwrap_or_default()).into_owned();
            if found.parse::<u32>().ok() != Some(max_permits) {
                return Err(EtcdError::MaxMismatch {
                    key: key_str(&max_key),
                    expected: max_permits,
                    found,
                });
            }
        }
        Ok(EtcdSemaphore {
            etcd: etcd.clone(),
            // Permits are held until the process dies: no heartbeat in this API.
            session: Session::new(etcd, KeepAlive::Background),
            max: max_permits,
            holders: format!("{name}/holders/").into_bytes(),
            cancels: format!("{name}/cancel/").into_bytes(),
            permits: Mutex::new(Permits::default()),
            seq: AtomicU64::new(0),
            tag: holder_tag(),
            run: Mutex::new(Run::default()),
        })
    }

    /// Connects to `endpoints` with the default [`EtcdOptions`] and opens the semaphore
    /// (see [`EtcdSemaphore::open`]).
    ///
    /// # Errors
    /// As [`Etcd::connect`] and [`EtcdSemaphore::open`].
    pub fn connect<E: AsRef<str>>(
        endpoints: &[E],
        name: &str,
        max_permits: u32,
    ) -> Result<Self, EtcdError> {
        let etcd = Etcd::connect(endpoints, EtcdOptions::default())?;
        Self::open(&etcd, name, max_permits)
    }

    /// Permits this handle holds, not counting those it knows or presumes lost (their
    /// session is gone or missed its local deadline). No request is made.
    pub fn held(&self) -> usize {
        let mut p = self.permits();
        self.prune(&mut p);
        p.held.len()
    }

    /// The loss check: the permits of this handle found lost since the last call (each is
    /// reported once, and no longer counts as held). A permit is lost when its session is
    /// known gone, or missed its local deadline — then etcd may already have handed it to
    /// someone else, so stop the work it guards. No request is made: this works while
    /// etcd is unreachable.
    pub fn lost_permits(&self) -> Vec<EtcdPermit> {
        let mut p = self.permits();
        self.prune(&mut p);
        std::mem::take(&mut p.lost)
    }

    /// The loss notification: blocks until one of this handle's permits is known or
    /// presumed lost, or `timeout` passes, and returns the lost permits (as
    /// [`EtcdSemaphore::lost_permits`]; empty on timeout, and at once if the handle
    /// holds no permit). No request is made.
    pub fn wait_lost(&self, timeout: Duration) -> Vec<EtcdPermit> {
        let session = {
            let mut p = self.permits();
            self.prune(&mut p);
            if !p.lost.is_empty() {
                return std::mem::take(&mut p.lost);
            }
            // Every held permit is on the current session now (the others were pruned).
            match p.held.first() {
                Some(h) => h.session,
                // Nothing held, nothing to lose.
                None => return Vec::new(),
            }
        };
        self.session.wait_lost(session, timeout);
        self.lost_permits()
    }

    /// Whether `permit`, taken by this handle, is no longer held as far as the handle
    /// knows, without a request: its session is known gone or missed its local deadline
    /// (see [`EtcdSemaphore::lost_permits`]), or the handle no longer holds it (it was
    /// given back, its give failed with an unknown outcome, or [`is_current`] found it
    /// gone). Once `true`, it stays `true`. `false` does not prove it current; a permit
    /// of another handle is never reported lost here.
    ///
    /// [`is_current`]: EtcdSemaphore::is_current
    pub fn is_lost(&self, permit: &EtcdPermit) -> bool {
        if self.session.lost(permit.session) {
            return true;
        }
        self.session.owns(permit.session) && !self.permits().held.contains(permit)
    }

    /// Whether `permit` is current: its holder key still exists with the permit's
    /// token. `Ok(false)` without a request if it is known or presumed lost.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn is_current(&self, permit: &EtcdPermit) -> Result<bool, EtcdError> {
        if self.is_lost(permit) {
            return Ok(false);
        }
        let current = exists_as(&self.etcd, &permit.key, permit.token)?;
        if !current {
            let mut p = self.permits();
            if let Some(i) = p.held.iter().position(|h| h == permit) {
                let lost = p.held.remove(i);
                p.lost.push(lost);
            }
        }
        Ok(current)
    }

    /// What the keep-alive of this handle's current session has done (see
    /// [`EtcdLease::keep_alive_stats`](crate::EtcdLease::keep_alive_stats)).
    pub fn keep_alive_stats(&self) -> KeepAliveStats {
        self.session.stats()
    }

    /// Takes a permit if one is free, without blocking, and returns it.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn try_take_permit(&self) -> Result<Option<EtcdPermit>, EtcdError> {
        Ok(self.take_once()?.ok())
    }

    /// Takes a permit, blocking at most `timeout`, and returns it; `Ok(None)` on timeout.
    /// A request that fails on the way (a hung or lost member) is tried again on the next
    /// member until `timeout`.
    ///
    /// # Errors
    /// If no member answers (requests failed in a row for members × the request timeout,
    /// at least one per member; the run of failures is the handle's, across its waits),
    /// or a request failed with an error that is not worth trying again.
    pub fn take_permit(&self, timeout: Duration) -> Result<Option<EtcdPermit>, EtcdError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut retries = Retries::new(&self.etcd, &self.run);
        loop {
            let sent = Instant::now();
            let outcome = self.take_once();
            let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
            let seen = match retries.judge(outcome, sent, left)? {
                Some(Ok(p)) => return Ok(Some(p)),
                Some(Err(rev)) => rev,
                None if left.is_zero() => return Ok(None),
                None => continue,
            };
            if left.is_zero() {
                return Ok(None);
            }
            wait_for_delete(
                &self.etcd,
                &self.holders,
                true,
                seen + 1,
                left.min(MAX_WAIT),
            );
        }
    }

    /// Gives `permit` back: deletes its holder key, fenced by its token. `Ok(false)` if
    /// the key was already gone (the permit was lost, or given back before), or if the
    /// handle no longer holds it ([`EtcdSemaphore::is_lost`]; no request then).
    ///
    /// # Errors
    /// If the request fails. If it was never sent (no member could be connected), the
    /// permit stays held. If its outcome is unknown (it timed out, or failed after it was
    /// sent), the delete may still be applied later, when a hung member resumes, and a
    /// rival then holds the permit: so the handle stops holding it at once — it no
    /// longer counts in [`held`](EtcdSemaphore::held), and [`is_lost`] and
    /// [`is_current`] say lost without a request (for good) — and its delete is sent
    /// again (fenced by the token, so harmless) by `give_permit` of the same permit, and
    /// after their own request succeeded by the handle's other gives and takes, until it
    /// is settled or the permit's session ends. The session is not ended: other permits
    /// may live on it.
    ///
    /// [`is_lost`]: EtcdSemaphore::is_lost
    /// [`is_current`]: EtcdSemaphore::is_current
    pub fn give_permit(&self, permit: &EtcdPermit) -> Result<bool, EtcdError> {
        if !self.session.owns(permit.session) {
            return Ok(false);
        }
        let pending = {
            let mut p = self.permits();
            self.prune(&mut p);
            p.giving.contains(permit)
        };
        if pending {
            // A give of it whose outcome is unknown: send its delete again.
            let given = fenced_delete(&self.etcd, "give", &permit.key, permit.token)?;
            self.permits().giving.retain(|h| h != permit);
            return Ok(given);
        }
        // Not one the handle no longer holds (given back, or lost: its key went with its
        // session, or is being revoked).
        if self.is_lost(permit) {
            self.permits().lost.retain(|h| h != permit);
            return Ok(false);
        }
        match fenced_delete(&self.etcd, "give", &permit.key, permit.token) {
            Ok(given) => {
                {
                    let mut p = self.permits();
                    p.held.retain(|h| h != permit);
                    p.lost.retain(|h| h != permit);
                }
                self.retry_gives();
                Ok(given)
            }
            Err(e) => {
                if outcome_unknown(&e) {
                    let mut p = self.permits();
                    if let Some(i) = p.held.iter().position(|h| h == permit) {
                        let giving = p.held.remove(i);
                        p.giving.push(giving);
                    }
                }
                Err(e)
            }
        }
    }

    fn permits(&self) -> std::sync::MutexGuard<'_, Permits> {
        self.permits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the permits of sessions that are no longer alive to the lost list, and
    /// forgets the pending gives of such sessions (their keys went with them).
    fn prune(&self, p: &mut Permits) {
        let (lost, held): (Vec<_>, Vec<_>) = std::mem::take(&mut p.held)
            .into_iter()
            .partition(|h| self.session.lost(h.session));
        p.held = held;
        p.lost.extend(lost);
        p.giving.retain(|h| !self.session.lost(h.session));
    }

    /// Sends the delete of every pending give again (see [`EtcdSemaphore::give_permit`]),
    /// stopping at the first that fails (it stays pending). Whether one was settled.
    fn retry_gives(&self) -> bool {
        let pending = {
            let mut p = self.permits();
            self.prune(&mut p);
            p.giving.clone()
        };
        let mut settled = false;
        for permit in pending {
            if fenced_delete(&self.etcd, "give", &permit.key, permit.token).is_err() {
                break;
            }
            self.permits().giving.retain(|h| *h != permit);
            settled = true;
        }
        settled
    }

    /// The number of holder keys and the revision it was read at.
    fn count(&self) -> Result<(u32, i64), EtcdError> {
        let resp = self.etcd.get(
            "count",
            &self.holders,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )?;
        let rev = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| EtcdError::Protocol {
                op: "count",
                key: key_str(&self.holders),
                detail: "no response header",
            })?;
        Ok((u32::try_from(resp.count()).unwrap_or(u32::MAX), rev))
    }

    /// One take: `Ok(Ok(permit))` taken, `Ok(Err(rev))` full at revision `rev`.
    ///
    /// Bounded: after `TAKE_ROUNDS` lost races (other takers' keys appearing between our
    /// count and our transaction) it reports the pool as busy at the last revision
    /// counted, as if it were full; `take_permit` then waits for a give (at most 1 s)
    /// and tries again.
    fn take_once(&self) -> Result<Result<EtcdPermit, i64>, EtcdError> {
        let mut last = 0;
        for _ in 0..TAKE_ROUNDS {
            let (count, rev) = self.count()?;
            last = rev;
            // A member answers: send the deletes of pending gives again first (one of
            // them may be what fills the pool); count again if one was settled.
            if self.retry_gives() {
                continue;
            }
            if count >= self.max {
                return Ok(Err(rev));
            }
            let session = self.session.id()?;
            let r = self.put_holder(session, rev);
            let r = match r {
                Err(e) if lease_not_found(&e) => {
                    self.session.expired(session);
                    continue;
                }
                r => r?,
            };
            if let Some(permit) = r {
                return Ok(Ok(permit));
            }
            // Another holder key appeared since we counted: count again.
        }
        // Lost every race: report the pool busy; a waiting take watches for a delete
        // (at most 1 s) and tries again.
        Ok(Err(last))
    }

    fn put_holder(&self, session: i64, counted_at: i64) -> Result<Option<EtcdPermit>, EtcdError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let suffix = format!("{session:016x}-{seq}");
        let mut key = self.holders.clone();
        key.extend_from_slice(suffix.as_bytes());
        let mut cancel = self.cancels.clone();
        cancel.extend_from_slice(suffix.as_bytes());
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.holders.clone(), CompareOp::Less, counted_at + 1)
                    .with_prefix(),
                Compare::version(cancel.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                key.clone(),
                self.tag.clone(),
                Some(PutOptions::new().with_lease(session)),
            )]);
        let token = match self.etcd.txn("take", &key, txn) {
            Ok(resp) if !resp.succeeded() => return Ok(None),
            Ok(resp) => revision(&resp, "take", &key)?,
            Err(e) if outcome_unknown(&e) => match self.settle(session, &key, cancel, e)? {
                Some(token) => token,
                None => return Ok(None),
            },
            Err(e) => return Err(e),
        };
        if !self.session.alive(session) {
            // Taken, but the session ran out while the answer was on its way: the key
            // dies with the session, and the permit may be another's already. Never
            // hand out a permit known lost (as a claim attempt, `contend.rs`): end the
            // session (its key goes with it) and count again.
            self.session.expired(session);
            return Ok(None);
        }
        let permit = EtcdPermit {
            token,
            key,
            session,
        };
        self.permits().held.push(permit.clone());
        Ok(Some(permit))
    }

    /// Settles a take of `key` on `session` whose outcome is unknown (see the module's
    /// protocol): `Some(token)` if it was applied, `None` if it never will be. `Err` (the
    /// take's error `unknown`, or the session's loss) when that cannot be settled; the
    /// session is then ended.
    fn settle(
        &self,
        session: i64,
        key: &[u8],
        cancel: Vec<u8>,
        unknown: EtcdError,
    ) -> Result<Option<i64>, EtcdError> {
        let txn = Txn::new()
            .when([Compare::create_revision(key.to_vec(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                cancel,
                Vec::new(),
                Some(PutOptions::new().with_lease(session)),
            )])
            .or_else([TxnOp::get(key.to_vec(), None)]);
        // One try per member: `run` sends each to the next member after a failure.
        for _ in 0..self.etcd.members().len() {
            match self.etcd.txn("take (settle)", key, txn.clone()) {
                Ok(resp) if resp.succeeded() => return Ok(None),
                Ok(resp) => {
                    // The else branch ran: the key existed, and its get (in the same
                    // transaction) names its create revision. Without it, the answer is
                    // malformed: not settled.
                    match nth_get(&resp, 0) {
                        Some(found) => return Ok(Some(found.created)),
                        None => break,
                    }
                }
                // The session is gone: the late put fails, or its key went with it.
                Err(e) if lease_not_found(&e) => {
                    self.session.expired(session);
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        self.session.expired(session);
        Err(unknown)
    }
}

impl PermitPool for EtcdSemaphore {
    type Error = EtcdError;

    fn try_take(&self) -> Result<bool, EtcdError> {
        Ok(self.try_take_permit()?.is_some())
    }

    /// Waits on an etcd watch of the holder keys for a deletion (a give or a session
    /// expiry), then takes again.
    fn take_timeout(&self, timeout: Duration) -> Result<bool, EtcdError> {
        Ok(self.take_permit(timeout)?.is_some())
    }

    /// Returns this handle's most recent permit that is not known lost. `Ok(false)` if it
    /// holds none, or if that permit was lost meanwhile (the pool had recovered it).
    /// Sends the deletes of pending gives again (see
    /// [`EtcdSemaphore::give_permit`]) after its own succeeded, or when it holds none.
    ///
    /// # Errors
    /// As [`EtcdSemaphore::give_permit`]: a permit whose give was never sent stays held;
    /// one whose give has an unknown outcome is no longer held (its delete is sent again
    /// later).
    fn give(&self) -> Result<bool, EtcdError> {
        // Taken off the held list under the lock, so threads giving at once give
        // different permits.
        let permit = {
            let mut p = self.permits();
            self.prune(&mut p);
            p.held.pop()
        };
        let Some(permit) = permit else {
            self.retry_gives();
            return Ok(false);
        };
        match fenced_delete(&self.etcd, "give", &permit.key, permit.token) {
            Ok(given) => {
                self.retry_gives();
                Ok(given)
            }
            Err(e) => {
                let mut p = self.permits();
                if outcome_unknown(&e) {
                    // It may still be applied, late: no longer held (sent again later).
                    p.giving.push(permit);
                } else {
                    // Never sent: still held.
                    p.held.push(permit);
                }
                Err(e)
            }
        }
    }

    fn available(&self) -> Result<u32, EtcdError> {
        Ok(self.max.saturating_sub(self.count()?.0))
    }

    fn max(&self) -> u32 {
        self.max
    }
}

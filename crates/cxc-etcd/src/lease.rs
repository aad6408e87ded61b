//! [`EtcdLease<T>`]: the fenced lease on etcd, and its [`EtcdClaim`].
//!
//! # Protocol
//!
//! The lease named `N` is a lock in the layout of etcd's concurrency package
//! (`concurrency.Mutex`, `concurrency.Election`, `etcdctl lock N`, `etcdctl elect N`):
//!
//! | key               | value                    | attached to         | meaning                      |
//! |-------------------|--------------------------|---------------------|------------------------------|
//! | `N/<session hex>` | holder tag (`host:pid`)  | holder's session    | one contender; the one with the lowest create revision holds |
//! | `N.value`         | the payload's bytes      | nothing (persists)  | the guarded payload (outside the contender prefix) |
//!
//! - **claim**: `txn(create_revision(N/<s>) == 0) then put(N/<s>, lease = s),
//!   get(first N/ by create), get(N.value) else get(N/<s>), get(first N/ by create),
//!   get(N.value)`. The claim holds iff our key is the first; its create revision is the
//!   generation. If not, our key is deleted again (as `concurrency.Mutex::TryLock` does).
//! - **write**: `txn(create_revision(N/<s>) == generation ∧ mod_revision(N.value) ==
//!   known) then put(N.value)`, where `known` is the value's version this handle last
//!   read or wrote under the claim. A request delivered late finds a newer version and
//!   is refused. After a write whose outcome is unknown the handle forgets `known`, and
//!   writes fail with [`EtcdError::Conflict`] until it reads again.
//! - **read / release**: `txn(create_revision(N/<s>) == generation) then get(N.value) /
//!   delete(N/<s>)`.
//! - **failover**: the contender key is deleted by etcd when the holder's session
//!   expires.
//!
//! Revisions only grow (they survive restarts: they are in etcd's write-ahead log), and
//! every claim creates its key anew, so a later claim always has a larger generation:
//! the create revision is a fencing token.

use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::Duration;

use cxc_sync::FencedLease;
use etcd_client::{Compare, CompareOp, TxnOp};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::conn::{Etcd, EtcdOptions, key_str};
use crate::contend::{Contender, First, Held};
use crate::error::EtcdError;
use crate::session::KeepAliveStats;
use crate::txn::{holder_tag, nth_get, revision};

/// A claim on an [`EtcdLease`]: the generation (fencing token) and the session it was
/// made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtcdClaim {
    generation: i64,
    session: i64,
}

impl EtcdClaim {
    /// The fencing token: the create revision of the claim's contender key. Strictly
    /// greater for every later claim of the same lease (also for claims made through
    /// `etcdctl lock` or etcd's `concurrency.Mutex` on the same name).
    pub fn generation(&self) -> u64 {
        self.generation as u64
    }

    /// The etcd lease id of the session the claim lives on.
    pub fn session(&self) -> i64 {
        self.session
    }
}

/// The payload version a handle knows: the value key's mod revision under a claim.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    /// The claim's generation the version was learnt under (0: none).
    generation: i64,
    /// The value key's mod revision (0: the key does not exist); `None` after a write
    /// whose outcome is unknown.
    version: Option<i64>,
}

/// A fenced lease on a payload `T`, stored in etcd: the same claims, fencing tokens and
/// crash recovery as [`OwnerLease`](cxc_sync::OwnerLease), across machines. Use it
/// through [`FencedLease`].
///
/// Each handle is one holder identity (one etcd session); give each contender its own
/// handle. Threads sharing a handle share its claim and the payload version it knows
/// (see [`write`](FencedLease::write)): for the fencing they are one holder. Dropping the handle revokes its session, which releases its claim at once; a
/// holder that dies without dropping (SIGKILL, power loss, partition) is replaced when
/// its session's TTL runs out.
///
/// # Examples
/// ```no_run
/// use cxc_etcd::EtcdLease;
/// use cxc_sync::FencedLease;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let lease = EtcdLease::connect(&["http://127.0.0.1:2379"], "jobs/leader", 0u64)?;
/// if let Some(claim) = lease.acquire(std::time::Duration::from_secs(10))? {
///     let v = lease.read(&claim)?.unwrap_or(0);
///     if !lease.write(&claim, v + 1)? {
///         // We lost the lease meanwhile: etcd refused the stale write.
///     }
///     lease.release(&claim)?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct EtcdLease<T> {
    /// The contender keys under `N/` (etcd's lock and election layout) and the session.
    queue: Contender,
    value: Vec<u8>,
    tag: Vec<u8>,
    initial: Vec<u8>,
    known: Mutex<Known>,
    _payload: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for EtcdLease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLease")
            .field("prefix", &self.queue.prefix())
            .field("etcd", &self.queue.etcd)
            .finish()
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> EtcdLease<T> {
    /// A lease named `name` on `etcd`. Its contender keys live under `name/` (the layout
    /// of etcd's `concurrency.Mutex` and `etcdctl lock name`), its payload at
    /// `name.value`. `initial` is what [`read`](FencedLease::read) returns while no value
    /// was ever written. No request is made until the first claim.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str, initial: T) -> Result<Self, EtcdError> {
        Ok(EtcdLease {
            queue: Contender::new(etcd, name)?,
            value: format!("{name}.value").into_bytes(),
            tag: holder_tag(),
            initial: initial.as_bytes().to_vec(),
            known: Mutex::new(Known::default()),
            _payload: PhantomData,
        })
    }

    /// Connects to `endpoints` with the default [`EtcdOptions`] and makes a lease on that
    /// connection (see [`EtcdLease::new`]).
    ///
    /// # Errors
    /// As [`Etcd::connect`] and [`EtcdLease::new`].
    pub fn connect<E: AsRef<str>>(
        endpoints: &[E],
        name: &str,
        initial: T,
    ) -> Result<Self, EtcdError> {
        let etcd = Etcd::connect(endpoints, EtcdOptions::default())?;
        Self::new(&etcd, name, initial)
    }

    /// The connection.
    pub fn etcd(&self) -> &Etcd {
        &self.queue.etcd
    }

    /// The current holder's tag and generation, `None` when vacant. The holder may be
    /// another program using etcd's lock recipe on the same name (`etcdctl lock`); its
    /// tag is then whatever that program stored (empty for `etcdctl lock`).
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn holder(&self) -> Result<Option<(String, u64)>, EtcdError> {
        self.queue.first("holder")
    }

    /// Whether `claim` is known lost without asking etcd: it was made on this handle's
    /// session and that session expired, was found gone, or missed its local deadline
    /// (the instant its last refresh was sent plus the TTL, before which etcd cannot have
    /// expired it). `false` does not prove the claim current; ask
    /// [`is_current`](FencedLease::is_current) for that.
    pub fn is_lost(&self, claim: &EtcdClaim) -> bool {
        self.queue.session.lost(claim.session)
    }

    /// The loss notification: blocks until `claim` is known or presumed lost (as
    /// [`EtcdLease::is_lost`]; `true`) or `timeout` passes (`false`). Wakes when the
    /// keep-alive finds the session gone, and at the session's local deadline if no
    /// refresh moved it. No request is made, so it answers while etcd is unreachable.
    /// A claim that is not this handle's is reported lost at once.
    pub fn wait_lost(&self, claim: &EtcdClaim, timeout: Duration) -> bool {
        self.queue.session.wait_lost(claim.session, timeout)
    }

    /// What the keep-alive of this handle's current session has done: refreshes, failed
    /// attempts, and the longest gap between two refreshes (keep it below the TTL).
    pub fn keep_alive_stats(&self) -> KeepAliveStats {
        self.queue.session.stats()
    }

    fn learn(&self, generation: i64, version: Option<i64>) {
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Known {
            generation,
            version,
        };
    }

    /// The version known under `generation`, if any.
    fn known(&self, generation: i64) -> Option<i64> {
        let k = *self.known.lock().unwrap_or_else(|e| e.into_inner());
        if k.generation == generation {
            k.version
        } else {
            None
        }
    }

    /// One claim attempt: the claim, or who holds the lease.
    fn claim_once(&self) -> Result<Result<EtcdClaim, Held>, EtcdError> {
        let value = TxnOp::get(self.value.clone(), None);
        let First {
            created,
            session,
            resp,
            reads_at,
        } = match self.queue.attempt("claim", &self.tag, &[value])? {
            Ok(first) => first,
            Err(held) => return Ok(Err(held)),
        };
        // A new claim learns the payload's version. Claiming again what this handle
        // already holds does not: after a write with an unknown outcome only a read
        // makes the version known again (the caller must look at the value).
        let version = nth_get(&resp, reads_at).map_or(0, |v| v.modified);
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.generation != created {
            *known = Known {
                generation: created,
                version: Some(version),
            };
        }
        Ok(Ok(EtcdClaim {
            generation: created,
            session,
        }))
    }

    /// `txn(create_revision(N/<s>) == claim.generation ∧ extra) then ops else else_ops`.
    fn fenced(
        &self,
        op: &'static str,
        claim: &EtcdClaim,
        extra: Option<Compare>,
        ops: Vec<TxnOp>,
        else_ops: Vec<TxnOp>,
    ) -> Result<etcd_client::TxnResponse, EtcdError> {
        let step = (claim.session, claim.generation);
        self.queue.fenced(op, step, extra, ops, else_ops)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, EtcdError> {
        T::read_from_bytes(bytes).map_err(|_| EtcdError::Decode {
            key: key_str(&self.value),
            expected: size_of::<T>(),
            found: bytes.len(),
        })
    }

    fn conflict(&self) -> EtcdError {
        EtcdError::Conflict {
            key: key_str(&self.value),
        }
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> FencedLease for EtcdLease<T> {
    type Claim = EtcdClaim;
    type Value = T;
    type Error = EtcdError;

    fn try_claim(&self) -> Result<Option<EtcdClaim>, EtcdError> {
        Ok(self.claim_once()?.ok())
    }

    /// Waits on an etcd watch of the holder's key for its deletion (release or session
    /// expiry), then claims again.
    fn acquire(&self, timeout: Duration) -> Result<Option<EtcdClaim>, EtcdError> {
        self.queue.wait_first(timeout, || self.claim_once())
    }

    /// Reads the payload if `claim` is current, and learns its version (so writes can go
    /// ahead again after an [`EtcdError::Conflict`]).
    fn read(&self, claim: &EtcdClaim) -> Result<Option<T>, EtcdError> {
        if self.is_lost(claim) {
            return Ok(None);
        }
        let get = TxnOp::get(self.value.clone(), None);
        let resp = self.fenced("read", claim, None, vec![get], vec![])?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let (version, bytes) = match nth_get(&resp, 0) {
            Some(f) => (f.modified, f.value),
            None => (0, self.initial.clone()),
        };
        let value = self.decode(&bytes)?;
        self.learn(claim.generation, Some(version));
        Ok(Some(value))
    }

    /// Writes the payload if `claim` is current **and** the payload is still at the
    /// version this handle last read or wrote under the claim: `txn(create_revision(N/<s>)
    /// == generation ∧ mod_revision(N.value) == known) then put(N.value)`.
    ///
    /// # Errors
    /// [`EtcdError::Conflict`] (nothing written) if the claim is current but the
    /// version is unknown or moved: after a write that timed out or failed in transit
    /// (it may still be applied late; the version check makes sure it cannot land after
    /// a newer write), after a write through another handle under the same claim, or
    /// when this handle neither made the claim nor read or wrote under it. Read again,
    /// then write. A write that fails with any error leaves the version unknown, for
    /// every thread sharing the handle, until one of them reads.
    fn write(&self, claim: &EtcdClaim, value: T) -> Result<bool, EtcdError> {
        if self.is_lost(claim) {
            // Known or presumed lost: its session is gone or being revoked.
            return Ok(false);
        }
        let Some(known) = self.known(claim.generation) else {
            // Tell a stale claim (Ok(false)) from a current one with an unknown version.
            return if self.is_current(claim)? {
                Err(self.conflict())
            } else {
                Ok(false)
            };
        };
        let put = TxnOp::put(self.value.clone(), value.as_bytes().to_vec(), None);
        let cmp = Compare::mod_revision(self.value.clone(), CompareOp::Equal, known);
        let check = TxnOp::get(self.queue.key_of(claim.session), None);
        let resp = match self.fenced("write", claim, Some(cmp), vec![put], vec![check]) {
            Ok(r) => r,
            Err(e) => {
                // Unknown outcome: no write goes out until the version is read again.
                self.learn(claim.generation, None);
                return Err(e);
            }
        };
        if resp.succeeded() {
            let rev = revision(&resp, "write", &self.value)?;
            self.learn(claim.generation, Some(rev));
            return Ok(true);
        }
        match nth_get(&resp, 0) {
            Some(f) if f.created == claim.generation => {
                self.learn(claim.generation, None);
                Err(self.conflict())
            }
            _ => Ok(false),
        }
    }

    /// Refreshes the claim's session (one keep-alive), then checks the claim is current.
    fn beat(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        self.queue.refresh((claim.session, claim.generation))
    }

    /// Deletes the claim's key, fenced by its generation.
    ///
    /// # Errors
    /// If the request fails. If its outcome is unknown (a timeout, or a failure after it
    /// was sent: the delete may be applied late), the handle's session is ended at once
    /// (revoked in the background, the key goes with it): the claim is then lost
    /// ([`EtcdLease::is_lost`], [`is_current`](FencedLease::is_current) `false` without a
    /// request), and claiming again gets a new claim on a new session.
    fn release(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        self.queue
            .withdraw("release", (claim.session, claim.generation))
    }

    /// Asks etcd whether the claim's contender key still exists with the claim's
    /// generation. `Ok(false)` without a request if the claim was made on this handle's
    /// session and that session is known or presumed lost ([`EtcdLease::is_lost`]).
    fn is_current(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        self.queue.is_current((claim.session, claim.generation))
    }

    fn generation(claim: &EtcdClaim) -> u64 {
        claim.generation()
    }
}

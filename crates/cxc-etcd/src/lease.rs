//! [`EtcdLease<T>`]: the fenced lease on etcd, and its [`EtcdClaim`].
//!
//! # Protocol
//!
//! Keys under the lease's name `N`:
//!
//! | key         | value                    | attached to         | meaning                    |
//! |-------------|--------------------------|---------------------|----------------------------|
//! | `N/owner`   | holder tag (`host:pid`)  | holder's session    | present ⇔ the lease is held |
//! | `N/value`   | the payload's bytes      | nothing (persists)  | the guarded payload        |
//!
//! - **claim**: `txn(create_revision(N/owner) == 0) then put(N/owner, lease = session)
//!   else get(N/owner)`. The generation is the owner key's create revision (the txn's
//!   revision); in the else branch, an owner key on our own session is our claim.
//! - **write / read / release**: `txn(create_revision(N/owner) == generation) then
//!   put(N/value) / get(N/value) / delete(N/owner)`. etcd evaluates the compare and applies
//!   the operation as one step, so a stale claim's operation is refused by the server.
//! - **failover**: the owner key is deleted by etcd when the holder's session expires.
//!
//! Revisions only grow (they survive restarts: they are in etcd's write-ahead log), and
//! every claim creates the owner key anew, so a later claim always has a larger
//! generation: the create revision is a fencing token.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use cxc_sync::FencedLease;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::conn::{Etcd, EtcdOptions, key_str};
use crate::error::EtcdError;
use crate::session::Session;
use crate::wait::{MAX_WAIT, wait_for_delete};

/// A claim on an [`EtcdLease`]: the generation (fencing token) and the session it was
/// made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtcdClaim {
    generation: i64,
    session: i64,
}

impl EtcdClaim {
    /// The fencing token: the owner key's create revision. Strictly greater for every
    /// later claim of the same lease.
    pub fn generation(&self) -> u64 {
        self.generation as u64
    }

    /// The etcd lease id of the session the claim lives on.
    pub fn session(&self) -> i64 {
        self.session
    }
}

/// A fenced lease on a payload `T`, stored in etcd: the same claims, fencing tokens and
/// crash recovery as [`OwnerLease`](cxc_sync::OwnerLease), across machines. Use it
/// through [`FencedLease`].
///
/// Each handle is one holder identity (one etcd session); give each contender its own
/// handle. Dropping the handle revokes its session, which releases its claim at once; a
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
    etcd: Etcd,
    session: Session,
    owner: Vec<u8>,
    value: Vec<u8>,
    tag: Vec<u8>,
    initial: Vec<u8>,
    _payload: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for EtcdLease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLease")
            .field("owner_key", &key_str(&self.owner))
            .field("etcd", &self.etcd)
            .finish()
    }
}

/// `host:pid`, stored in the owner key for people reading etcd.
pub(crate) fn holder_tag() -> Vec<u8> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id()).into_bytes()
}

pub(crate) fn check_name(name: &str) -> Result<(), EtcdError> {
    if name.is_empty() {
        return Err(EtcdError::InvalidOption("empty key name".into()));
    }
    Ok(())
}

/// The header revision of a response.
pub(crate) fn revision(resp: &TxnResponse, op: &'static str, key: &[u8]) -> Result<i64, EtcdError> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| EtcdError::Protocol {
            op,
            key: key_str(key),
            detail: "no response header",
        })
}

/// Whether `e` says the session lease no longer exists.
pub(crate) fn lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::Request {
            source: etcd_client::Error::GRpcStatus(s),
            ..
        } => s.message().contains("requested lease not found"),
        _ => false,
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> EtcdLease<T> {
    /// A lease named `name` (a key prefix) on `etcd`. `initial` is what
    /// [`read`](FencedLease::read) returns while no value was ever written. No request is
    /// made until the first claim.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str, initial: T) -> Result<Self, EtcdError> {
        check_name(name)?;
        Ok(EtcdLease {
            etcd: etcd.clone(),
            session: Session::new(etcd, etcd.options().keep_alive),
            owner: format!("{name}/owner").into_bytes(),
            value: format!("{name}/value").into_bytes(),
            tag: holder_tag(),
            initial: initial.as_bytes().to_vec(),
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
        Self::new(
            &Etcd::connect(endpoints, EtcdOptions::default())?,
            name,
            initial,
        )
    }

    /// The connection.
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// The current holder's tag (`host:pid`) and generation, `None` when vacant.
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub fn holder(&self) -> Result<Option<(String, u64)>, EtcdError> {
        let mut kv = self.etcd.client().kv_client();
        let key = self.owner.clone();
        let resp = self.etcd.run(
            "holder",
            &self.owner,
            async move { kv.get(key, None).await },
        )?;
        Ok(resp.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision() as u64,
            )
        }))
    }

    /// One claim attempt: the claim, or the revision at which the lease was seen held.
    fn claim_once(&self) -> Result<Result<EtcdClaim, i64>, EtcdError> {
        let session = self.session.id()?;
        match self.claim_on(session) {
            // Our session expired since we last used it: open a new one and try again.
            Err(e) if lease_not_found(&e) => {
                self.session.expired(session);
                self.claim_on(self.session.id()?)
            }
            r => r,
        }
    }

    fn claim_on(&self, session: i64) -> Result<Result<EtcdClaim, i64>, EtcdError> {
        let owner = self.owner.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(owner.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                owner.clone(),
                self.tag.clone(),
                Some(PutOptions::new().with_lease(session)),
            )])
            .or_else([TxnOp::get(owner, None)]);
        let resp = self.txn("claim", &self.owner, txn)?;
        let rev = revision(&resp, "claim", &self.owner)?;
        if resp.succeeded() {
            // The owner key was created by this txn: its create revision is the txn's.
            return Ok(Ok(EtcdClaim {
                generation: rev,
                session,
            }));
        }
        let held = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.lease(), kv.create_revision())),
            _ => None,
        });
        Ok(match held {
            // Already ours (claiming again is idempotent, as for `OwnerLease`).
            Some((lease, generation)) if lease == session => Ok(EtcdClaim {
                generation,
                session,
            }),
            _ => Err(rev),
        })
    }

    fn txn(&self, op: &'static str, key: &[u8], txn: Txn) -> Result<TxnResponse, EtcdError> {
        let mut kv = self.etcd.client().kv_client();
        self.etcd.run(op, key, async move { kv.txn(txn).await })
    }

    /// `txn(create_revision(owner) == claim.generation) then ops`.
    fn fenced(
        &self,
        op: &'static str,
        claim: &EtcdClaim,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse, EtcdError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.owner.clone(),
                CompareOp::Equal,
                claim.generation,
            )])
            .and_then(ops);
        self.txn(op, &self.owner, txn)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, EtcdError> {
        T::read_from_bytes(bytes).map_err(|_| EtcdError::Decode {
            key: key_str(&self.value),
            expected: size_of::<T>(),
            found: bytes.len(),
        })
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> FencedLease for EtcdLease<T> {
    type Claim = EtcdClaim;
    type Value = T;
    type Error = EtcdError;

    fn try_claim(&self) -> Result<Option<EtcdClaim>, EtcdError> {
        Ok(self.claim_once()?.ok())
    }

    /// Waits on an etcd watch of the owner key for its deletion (release or session
    /// expiry), then claims again.
    fn acquire(&self, timeout: Duration) -> Result<Option<EtcdClaim>, EtcdError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let seen = match self.claim_once()? {
                Ok(c) => return Ok(Some(c)),
                Err(rev) => rev,
            };
            let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Ok(None);
            }
            wait_for_delete(&self.etcd, &self.owner, false, seen + 1, left.min(MAX_WAIT));
        }
    }

    fn read(&self, claim: &EtcdClaim) -> Result<Option<T>, EtcdError> {
        let resp = self.fenced("read", claim, vec![TxnOp::get(self.value.clone(), None)])?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let stored = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map(|kv| kv.value().to_vec())),
            _ => None,
        });
        let bytes = stored.flatten().unwrap_or_else(|| self.initial.clone());
        self.decode(&bytes).map(Some)
    }

    fn write(&self, claim: &EtcdClaim, value: T) -> Result<bool, EtcdError> {
        let put = TxnOp::put(self.value.clone(), value.as_bytes().to_vec(), None);
        Ok(self.fenced("write", claim, vec![put])?.succeeded())
    }

    /// Refreshes the claim's session (one keep-alive), then checks the claim is current.
    fn beat(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        Ok(self.session.keep_alive(claim.session)? && self.is_current(claim)?)
    }

    fn release(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        let del = TxnOp::delete(self.owner.clone(), None);
        Ok(self.fenced("release", claim, vec![del])?.succeeded())
    }

    fn is_current(&self, claim: &EtcdClaim) -> Result<bool, EtcdError> {
        Ok(self.holder()?.is_some_and(|(_, g)| g == claim.generation()))
    }

    fn generation(claim: &EtcdClaim) -> u64 {
        claim.generation()
    }
}

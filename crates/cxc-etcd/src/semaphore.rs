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
//!
//! - **take**: read the number of holder keys and the store revision `R` (one
//!   count-only range request); if fewer than `max`, `txn(mod_revision(N/holders/*) < R+1)
//!   then put(N/holders/<session>-<seq>, lease = session)`. The compare covers the whole
//!   prefix: it fails if *any* holder key was created after `R`, so two takers that both
//!   counted `max - 1` cannot both succeed (the second sees the first's key). A key
//!   deleted after `R` only lowers the count, which is safe. On a failed compare, count
//!   again.
//! - **give**: delete one of this handle's holder keys, fenced by its create revision.
//! - **recovery**: a holder's keys are deleted by etcd when its session expires.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::PermitPool;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::conn::{Etcd, EtcdOptions, KeepAlive, key_str};
use crate::error::EtcdError;
use crate::lease::{check_name, holder_tag, lease_not_found, revision};
use crate::session::Session;
use crate::wait::{MAX_WAIT, wait_for_delete};

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
    /// This handle's holder keys and their create revisions, most recent last.
    held: Mutex<Vec<(Vec<u8>, i64)>>,
    seq: AtomicU64,
    tag: Vec<u8>,
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
        let mut kv = etcd.client().kv_client();
        let resp = etcd.run("open", &max_key, async move { kv.txn(txn).await })?;
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
            held: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            tag: holder_tag(),
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
        Self::open(
            &Etcd::connect(endpoints, EtcdOptions::default())?,
            name,
            max_permits,
        )
    }

    /// Permits this handle holds (as far as it knows: a permit whose session expired is
    /// counted until it is given back).
    pub fn held(&self) -> usize {
        self.held_keys().len()
    }

    fn held_keys(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<u8>, i64)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of holder keys and the revision it was read at.
    fn count(&self) -> Result<(u32, i64), EtcdError> {
        let mut kv = self.etcd.client().kv_client();
        let prefix = self.holders.clone();
        let resp = self.etcd.run("count", &self.holders, async move {
            kv.get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
        })?;
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

    /// One take: `Ok(Ok(()))` taken, `Ok(Err(rev))` full at revision `rev`.
    fn take_once(&self) -> Result<Result<(), i64>, EtcdError> {
        loop {
            let (count, rev) = self.count()?;
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
            if r {
                return Ok(Ok(()));
            }
            // Another holder key appeared since we counted: count again.
        }
    }

    fn put_holder(&self, session: i64, counted_at: i64) -> Result<bool, EtcdError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut key = self.holders.clone();
        key.extend_from_slice(format!("{session:016x}-{seq}").as_bytes());
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.holders.clone(), CompareOp::Less, counted_at + 1)
                    .with_prefix(),
            ])
            .and_then([TxnOp::put(
                key.clone(),
                self.tag.clone(),
                Some(PutOptions::new().with_lease(session)),
            )]);
        let mut kv = self.etcd.client().kv_client();
        let resp = self
            .etcd
            .run("take", &key, async move { kv.txn(txn).await })?;
        if resp.succeeded() {
            let created = revision(&resp, "take", &key)?;
            self.held_keys().push((key, created));
        }
        Ok(resp.succeeded())
    }
}

impl PermitPool for EtcdSemaphore {
    type Error = EtcdError;

    fn try_take(&self) -> Result<bool, EtcdError> {
        Ok(self.take_once()?.is_ok())
    }

    /// Waits on an etcd watch of the holder keys for a deletion (a give or a session
    /// expiry), then takes again.
    fn take_timeout(&self, timeout: Duration) -> Result<bool, EtcdError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let seen = match self.take_once()? {
                Ok(()) => return Ok(true),
                Err(rev) => rev,
            };
            let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Ok(false);
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

    /// Returns this handle's most recent permit. `Ok(false)` if it holds none, or if that
    /// permit was already lost (its session expired, so the pool had recovered it).
    fn give(&self) -> Result<bool, EtcdError> {
        let Some((key, created)) = self.held_keys().pop() else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                created,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let mut kv = self.etcd.client().kv_client();
        let k = key.clone();
        match self.etcd.run("give", &k, async move { kv.txn(txn).await }) {
            Ok(resp) => Ok(resp.succeeded()),
            Err(e) => {
                // Unknown outcome: keep the permit so a later give retries (the fenced
                // delete makes a second attempt harmless).
                self.held_keys().push((key, created));
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

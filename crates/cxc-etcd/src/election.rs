//! [`EtcdElection`]: leader election on etcd with etcd's own recipe
//! (`concurrency.Election`, `etcdctl elect`); the fenced resource that goes with it is
//! [`EtcdFencedKey`](crate::EtcdFencedKey).
//!
//! # Protocol
//!
//! The election named `N` uses the layout of `concurrency.Election`:
//!
//! | key               | value                   | attached to          | meaning |
//! |-------------------|-------------------------|----------------------|---------|
//! | `N/<session hex>` | the candidate's identity (etcd: its proposal) | candidate's session | one candidate; the one with the lowest create revision leads |
//!
//! - **campaign**: `txn(create_revision(N/<s>) == 0) then put(N/<s>, identity, lease =
//!   s), get(first N/ by create) else get(N/<s>), get(first N/ by create)`. It leads iff
//!   its key is the first; the key's create revision is the term's token. If not, the
//!   key is withdrawn again (fenced by its create revision) and the candidate waits on a
//!   watch for the leader's key to go, then tries again. (`concurrency.Election` queues
//!   instead; a queued Go or `etcdctl elect` candidate created before a Rust retry leads
//!   first, which is the same order.)
//! - **renew**: one keep-alive of the session, then the key must still exist with the
//!   term's create revision. With [`KeepAlive::OnBeat`](crate::KeepAlive::OnBeat) only
//!   renewals refresh the session: progress-driven.
//! - **resign**: `txn(create_revision(N/<s>) == token) then delete(N/<s>)`. If its
//!   outcome is unknown the session is ended (the key goes with it).
//! - **observe**: `get(first N/ by create)`: its value is the leader's identity (what
//!   `etcdctl elect -l N` prints), its create revision the token.

use std::time::Duration;

use cxc_sync::election::{ElectionBackend, Leader};

use crate::conn::Etcd;
use crate::contend::{Contender, Held};
use crate::error::EtcdError;

/// A won term on etcd: the token (the create revision of the leader key) and the
/// session it lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtcdTerm {
    revision: i64,
    session: i64,
}

impl EtcdTerm {
    /// The fencing token: the create revision of the leader key.
    pub fn token(&self) -> u64 {
        self.revision as u64
    }

    /// The etcd lease id of the session the term lives on.
    pub fn session(&self) -> i64 {
        self.session
    }
}

/// [`ElectionBackend`] on etcd, interoperable with `etcdctl elect` and Go's
/// `concurrency.Election` on the same name. Each handle is one candidate (one
/// session); how the session is kept alive is the connection's
/// [`KeepAlive`](crate::KeepAlive): `OnBeat` for progress-driven terms (the term ends
/// one TTL after the last renewal), `Background` for terms that last as long as the
/// process.
pub struct EtcdElection {
    /// The candidate keys under `N/` and the session.
    queue: Contender,
}

impl std::fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElection")
            .field("prefix", &self.queue.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdElection {
    /// The election named `name` on `etcd` (candidate keys under `name/`). No request is
    /// made until the first campaign.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Self, EtcdError> {
        Ok(EtcdElection {
            queue: Contender::new(etcd, name)?,
        })
    }

    /// The connection.
    pub fn etcd(&self) -> &Etcd {
        &self.queue.etcd
    }

    fn campaign_once(&self, identity: &str) -> Result<Result<EtcdTerm, Held>, EtcdError> {
        Ok(self
            .queue
            .attempt("campaign", identity.as_bytes(), &[])?
            .map(|first| EtcdTerm {
                revision: first.created,
                session: first.session,
            }))
    }
}

impl ElectionBackend for EtcdElection {
    type Term = EtcdTerm;
    type Error = EtcdError;

    fn try_lead(&self, identity: &str) -> Result<Option<EtcdTerm>, EtcdError> {
        Ok(self.campaign_once(identity)?.ok())
    }

    /// Waits on a watch of the leader's key for its deletion (resignation or session
    /// expiry), then campaigns again.
    fn lead_timeout(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<Option<EtcdTerm>, EtcdError> {
        self.queue
            .wait_first(timeout, || self.campaign_once(identity))
    }

    fn renew(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        self.queue.refresh((term.session, term.revision))
    }

    fn is_current(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        self.queue.is_current((term.session, term.revision))
    }

    /// Deletes the term's key, fenced by its token. A resignation whose outcome is
    /// unknown ends the candidate's session at once (as a lease release does, see
    /// [`EtcdLease`](crate::EtcdLease)'s `release`): campaigning again wins a new term.
    fn resign(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        self.queue.withdraw("resign", (term.session, term.revision))
    }

    fn leader(&self) -> Result<Option<Leader>, EtcdError> {
        let first = self.queue.first("leader")?;
        Ok(first.map(|(identity, token)| Leader { identity, token }))
    }

    /// Session loss only (no request): a key deleted by someone else is found by
    /// [`renew`](ElectionBackend::renew) / [`is_current`](ElectionBackend::is_current).
    fn wait_lost(&self, term: &EtcdTerm, timeout: Duration) -> Result<bool, EtcdError> {
        Ok(self.queue.session.wait_lost(term.session, timeout))
    }

    fn token(term: &EtcdTerm) -> u64 {
        term.token()
    }
}

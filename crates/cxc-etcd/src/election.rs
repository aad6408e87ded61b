//! [`EtcdElection`]: leader election on etcd with etcd's own recipe
//! (`concurrency.Election`, `etcdctl elect`), and [`EtcdFencedKey`], a fenced resource
//! in etcd.
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
//! - **resign**: `txn(create_revision(N/<s>) == token) then delete(N/<s>)`.
//! - **observe**: `get(first N/ by create)`: its value is the leader's identity (what
//!   `etcdctl elect -l N` prints), its create revision the token.

use std::time::{Duration, Instant};

use cxc_sync::election::{ElectionBackend, FencedResource, Leader};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use crate::conn::{Etcd, key_str};
use crate::error::EtcdError;
use crate::lease::{check_name, lease_not_found, revision};
use crate::session::Session;
use crate::wait::{MAX_WAIT, wait_for_delete};

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
    etcd: Etcd,
    session: Session,
    prefix: Vec<u8>,
}

impl std::fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElection")
            .field("prefix", &key_str(&self.prefix))
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Won(EtcdTerm),
    Held { leader: Vec<u8>, rev: i64 },
}

fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// `(create revision, mod revision, key, value)` of the first key of the `n`th get of a
/// transaction.
fn nth_get(resp: &TxnResponse, n: usize) -> Option<(i64, i64, Vec<u8>, Vec<u8>)> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .nth(n)
        .and_then(|g| {
            g.kvs().first().map(|kv| {
                (
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.key().to_vec(),
                    kv.value().to_vec(),
                )
            })
        })
}

impl EtcdElection {
    /// The election named `name` on `etcd` (candidate keys under `name/`). No request is
    /// made until the first campaign.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Self, EtcdError> {
        check_name(name)?;
        Ok(EtcdElection {
            etcd: etcd.clone(),
            session: Session::new(etcd, etcd.options().keep_alive),
            prefix: format!("{name}/").into_bytes(),
        })
    }

    /// The connection.
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    fn key_of(&self, session: i64) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(format!("{session:x}").as_bytes());
        key
    }

    fn protocol(key: &[u8], detail: &'static str) -> EtcdError {
        EtcdError::Protocol {
            op: "campaign",
            key: key_str(key),
            detail,
        }
    }

    fn campaign_once(&self, identity: &str) -> Result<Attempt, EtcdError> {
        let session = self.session.id()?;
        match self.campaign_on(session, identity) {
            Err(e) if lease_not_found(&e) => {
                self.session.expired(session);
                self.campaign_on(self.session.id()?, identity)
            }
            r => r,
        }
    }

    fn campaign_on(&self, session: i64, identity: &str) -> Result<Attempt, EtcdError> {
        let mine = self.key_of(session);
        let first = TxnOp::get(self.prefix.clone(), Some(first_created()));
        let txn = Txn::new()
            .when([Compare::create_revision(mine.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    mine.clone(),
                    identity.as_bytes().to_vec(),
                    Some(PutOptions::new().with_lease(session)),
                ),
                first.clone(),
            ])
            .or_else([TxnOp::get(mine.clone(), None), first]);
        let resp = self.etcd.txn("campaign", &mine, txn)?;
        let rev = revision(&resp, "campaign", &mine)?;
        let base = usize::from(!resp.succeeded());
        let my_rev = if resp.succeeded() {
            rev
        } else {
            nth_get(&resp, 0)
                .ok_or(Self::protocol(
                    &mine,
                    "candidate key vanished inside a transaction",
                ))?
                .0
        };
        let (first_rev, _, first_key, _) =
            nth_get(&resp, base).ok_or(Self::protocol(&mine, "no candidate key"))?;
        if first_rev == my_rev {
            return Ok(Attempt::Won(EtcdTerm {
                revision: my_rev,
                session,
            }));
        }
        let withdraw = Txn::new()
            .when([Compare::create_revision(
                mine.clone(),
                CompareOp::Equal,
                my_rev,
            )])
            .and_then([TxnOp::delete(mine.clone(), None)]);
        let resp = match self.etcd.txn("withdraw", &mine, withdraw) {
            Ok(r) => r,
            Err(e) => {
                // Our key may linger and lead once the others leave: end the session.
                self.session.expired(session);
                return Err(e);
            }
        };
        Ok(Attempt::Held {
            leader: first_key,
            rev: revision(&resp, "withdraw", &mine)?,
        })
    }
}

impl ElectionBackend for EtcdElection {
    type Term = EtcdTerm;
    type Error = EtcdError;

    fn try_lead(&self, identity: &str) -> Result<Option<EtcdTerm>, EtcdError> {
        Ok(match self.campaign_once(identity)? {
            Attempt::Won(t) => Some(t),
            Attempt::Held { .. } => None,
        })
    }

    /// Waits on a watch of the leader's key for its deletion (resignation or session
    /// expiry), then campaigns again.
    fn lead_timeout(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<Option<EtcdTerm>, EtcdError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let (leader, seen) = match self.campaign_once(identity)? {
                Attempt::Won(t) => return Ok(Some(t)),
                Attempt::Held { leader, rev } => (leader, rev),
            };
            let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Ok(None);
            }
            wait_for_delete(&self.etcd, &leader, false, seen + 1, left.min(MAX_WAIT));
        }
    }

    fn renew(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        Ok(self.session.keep_alive(term.session)? && self.is_current(term)?)
    }

    fn is_current(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        if self.session.owns(term.session) && !self.session.alive(term.session) {
            return Ok(false);
        }
        let key = self.key_of(term.session);
        let resp = self.etcd.get("is_current", &key, None)?;
        Ok(resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == term.revision))
    }

    fn resign(&self, term: &EtcdTerm) -> Result<bool, EtcdError> {
        let key = self.key_of(term.session);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                term.revision,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        Ok(self.etcd.txn("resign", &key, txn)?.succeeded())
    }

    fn leader(&self) -> Result<Option<Leader>, EtcdError> {
        let resp = self
            .etcd
            .get("leader", &self.prefix, Some(first_created()))?;
        Ok(resp.kvs().first().map(|kv| Leader {
            identity: String::from_utf8_lossy(kv.value()).into_owned(),
            token: kv.create_revision() as u64,
        }))
    }

    /// Session loss only (no request): a key deleted by someone else is found by
    /// [`renew`](ElectionBackend::renew) / [`is_current`](ElectionBackend::is_current).
    fn wait_lost(&self, term: &EtcdTerm, timeout: Duration) -> Result<bool, EtcdError> {
        Ok(self.session.wait_lost(term.session, timeout))
    }

    fn token(term: &EtcdTerm) -> u64 {
        term.token()
    }
}

/// A [`FencedResource`] in etcd: the data at key `R`, the high-water mark at `R.fence`
/// (decimal). A write reads both, refuses an older token, and commits with a
/// transaction that compares both keys' mod revisions (retrying if another writer came
/// between), so check and write are one step on the server.
#[derive(Debug, Clone)]
pub struct EtcdFencedKey {
    etcd: Etcd,
    data: Vec<u8>,
    fence: Vec<u8>,
}

struct Loaded {
    mark: u64,
    fence_rev: i64,
    data: Vec<u8>,
    data_rev: i64,
}

impl EtcdFencedKey {
    /// The resource at key `name`.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Self, EtcdError> {
        check_name(name)?;
        Ok(EtcdFencedKey {
            etcd: etcd.clone(),
            data: name.as_bytes().to_vec(),
            fence: format!("{name}.fence").into_bytes(),
        })
    }

    /// The high-water mark, the data, and both keys' mod revisions (0: absent).
    fn load(&self) -> Result<Loaded, EtcdError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.fence.clone(), None),
            TxnOp::get(self.data.clone(), None),
        ]);
        let resp = self.etcd.txn("fenced read", &self.data, txn)?;
        let fence = match nth_get(&resp, 0) {
            None => (0, 0),
            Some((_, m, _, v)) => {
                let mark = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| EtcdError::Protocol {
                        op: "fenced read",
                        key: key_str(&self.fence),
                        detail: "the fence is not a decimal token",
                    })?;
                (mark, m)
            }
        };
        let (data, data_rev) = nth_get(&resp, 1).map_or((Vec::new(), 0), |(_, m, _, v)| (v, m));
        Ok(Loaded {
            mark: fence.0,
            fence_rev: fence.1,
            data,
            data_rev,
        })
    }

    fn put(&self, token: u64, data: &[u8], append: bool) -> Result<bool, EtcdError> {
        loop {
            let Loaded {
                mark,
                fence_rev,
                data: old,
                data_rev,
            } = self.load()?;
            if token < mark {
                return Ok(false);
            }
            let value = if append {
                let mut v = old;
                v.extend_from_slice(data);
                v
            } else {
                data.to_vec()
            };
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(self.fence.clone(), CompareOp::Equal, fence_rev),
                    Compare::mod_revision(self.data.clone(), CompareOp::Equal, data_rev),
                ])
                .and_then([
                    TxnOp::put(self.fence.clone(), token.to_string(), None),
                    TxnOp::put(self.data.clone(), value, None),
                ]);
            if self.etcd.txn("fenced write", &self.data, txn)?.succeeded() {
                return Ok(true);
            }
        }
    }
}

impl FencedResource for EtcdFencedKey {
    type Error = EtcdError;

    fn write(&self, token: u64, data: &[u8]) -> Result<bool, EtcdError> {
        self.put(token, data, false)
    }

    fn append(&self, token: u64, data: &[u8]) -> Result<bool, EtcdError> {
        self.put(token, data, true)
    }

    fn read(&self) -> Result<(u64, Vec<u8>), EtcdError> {
        let l = self.load()?;
        Ok((l.mark, l.data))
    }
}

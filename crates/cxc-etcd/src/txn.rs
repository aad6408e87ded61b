//! Small pieces of the etcd protocol that every primitive uses: name checks, the holder
//! tag, reading transaction responses, and the fenced check and delete of a key by its
//! create revision.

use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::conn::{Etcd, classify, key_str};
use crate::error::EtcdError;

/// `host:pid`, stored in the contender and holder keys for people reading etcd.
pub(crate) fn holder_tag() -> Vec<u8> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id()).into_bytes()
}

/// [`EtcdError::InvalidOption`] for an empty key name.
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

/// Whether `e` is a member's answer that it has no leader (the members are electing one).
pub(crate) fn no_leader(e: &EtcdError) -> bool {
    match e {
        EtcdError::Request {
            source: etcd_client::Error::GRpcStatus(s),
            ..
        } => s.message().contains("no leader"),
        _ => false,
    }
}

/// Whether a request that failed with `e` may still be applied (now or later): anything
/// but a request that never left this process or a refusal of the session lease. A put
/// in such a request can create a key after the caller gave up on it.
pub(crate) fn outcome_unknown(e: &EtcdError) -> bool {
    match e {
        EtcdError::Timeout { .. } => true,
        EtcdError::Request { source, .. } => {
            !lease_not_found(e) && classify(source) != crate::conn::Failure::NotSent
        }
        _ => false,
    }
}

/// Whether a blocked wait may try again after `e` (the next request goes to another
/// member: [`Etcd::run`] moved the preference on): a timeout or a failed request, not a
/// malformed answer or a refused option.
pub(crate) fn worth_retrying(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Timeout { .. } | EtcdError::Request { .. })
}

/// The first key of a prefix by create revision (etcd's `WithFirstCreate`).
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// One key as a transaction's get returned it.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Its create revision.
    pub(crate) created: i64,
    /// Its mod revision.
    pub(crate) modified: i64,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

/// The first key of the `n`th get in a transaction's responses (`None`: no such get, or
/// it found nothing).
pub(crate) fn nth_get(resp: &TxnResponse, n: usize) -> Option<Found> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .nth(n)
        .and_then(|g| {
            g.kvs().first().map(|kv| Found {
                created: kv.create_revision(),
                modified: kv.mod_revision(),
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
            })
        })
}

/// `txn(create_revision(key) == created ∧ extra) then ops else else_ops`: a step that
/// etcd applies only while `key` is the one created at revision `created`.
pub(crate) fn fenced(
    etcd: &Etcd,
    op: &'static str,
    (key, created): (&[u8], i64),
    extra: Option<Compare>,
    ops: Vec<TxnOp>,
    else_ops: Vec<TxnOp>,
) -> Result<TxnResponse, EtcdError> {
    let mut cmp = vec![Compare::create_revision(key, CompareOp::Equal, created)];
    cmp.extend(extra);
    let txn = Txn::new().when(cmp).and_then(ops).or_else(else_ops);
    etcd.txn(op, key, txn)
}

/// Deletes `key` if it is the one created at revision `created`; whether it did.
pub(crate) fn fenced_delete(
    etcd: &Etcd,
    op: &'static str,
    key: &[u8],
    created: i64,
) -> Result<bool, EtcdError> {
    let del = TxnOp::delete(key, None);
    Ok(fenced(etcd, op, (key, created), None, vec![del], vec![])?.succeeded())
}

/// Asks etcd whether `key` exists and was created at revision `created`.
pub(crate) fn exists_as(etcd: &Etcd, key: &[u8], created: i64) -> Result<bool, EtcdError> {
    let resp = etcd.get("is_current", key, None)?;
    Ok(resp
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == created))
}

//! [`EtcdError`]: why an etcd-backed primitive could not answer.

use std::time::Duration;

/// Why an etcd-backed lease or semaphore could not be built or could not answer.
///
/// Contention is never an error (the trait methods return `Ok(None)` / `Ok(false)`);
/// these are failures of the client, the server or the data found in it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// The client's runtime thread could not be started.
    #[error("cannot start the etcd client runtime")]
    Runtime(#[source] std::io::Error),
    /// The client could not be built for these endpoints.
    #[error("cannot connect to etcd at {endpoints}")]
    Connect {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A request failed (server unreachable, refused, or an unexpected gRPC status).
    #[error("etcd {op} on {key:?} failed")]
    Request {
        /// The operation (`"claim"`, `"write"`, …).
        op: &'static str,
        /// The key it was about.
        key: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A request got no answer in time: the request timeout passed (a hung or
    /// restarting member), the call was cancelled in flight, or etcd itself answered
    /// "request timed out". Its outcome is unknown: a write or release may or may not
    /// have been applied, possibly later.
    #[error("etcd {op} on {key:?} got no answer within {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The key it was about.
        key: String,
        /// The request timeout that passed.
        timeout: Duration,
    },
    /// The server answered something a correct server does not (e.g. no header).
    #[error("etcd {op} on {key:?}: unexpected response: {detail}")]
    Protocol {
        /// The operation.
        op: &'static str,
        /// The key it was about.
        key: String,
        /// What was wrong.
        detail: &'static str,
    },
    /// The stored value has the wrong size for the payload type.
    #[error("value at {key:?}: expected {expected} bytes, found {found}")]
    Decode {
        /// The value key.
        key: String,
        /// `size_of::<T>()`.
        expected: usize,
        /// The stored length.
        found: usize,
    },
    /// The semaphore exists with another maximum.
    #[error("semaphore {key:?}: expected max_permits {expected}, found {found:?}")]
    MaxMismatch {
        /// The semaphore's `max` key.
        key: String,
        /// The maximum asked for.
        expected: u32,
        /// What the key holds.
        found: String,
    },
    /// A fenced write was not sent (or not applied) because this handle does not know
    /// the payload's current version under this claim, while the claim itself is still
    /// current: an earlier write's outcome was unknown (it timed out or failed in
    /// transit and may still be applied late), another handle wrote under the same claim
    /// first, or this handle neither made the claim nor read or wrote under it. Nothing
    /// was written.
    /// Read under the claim (which learns the version) and decide again.
    #[error(
        "etcd write on {key:?}: the value's version under this claim is unknown or moved; read it again before writing"
    )]
    Conflict {
        /// The value key.
        key: String,
    },
    /// An argument is out of range (an empty name, zero permits, a zero or too long TTL…).
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

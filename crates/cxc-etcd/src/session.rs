//! A session: one etcd lease (TTL) that a handle attaches its keys to, granted lazily,
//! granted anew after it expired, optionally kept alive by a background task, revoked
//! when the handle is dropped.
//!
//! Every key a handle owns (the lease's owner key, a semaphore's holder keys) is put with
//! the session's lease id, so etcd deletes them itself when the session expires: that is
//! the failover of a holder that died, hung (with [`KeepAlive::OnBeat`]) or was cut off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::{Etcd, KeepAlive};
use crate::error::EtcdError;

/// Session lease id 0 means "none" to etcd.
pub(crate) const NO_LEASE: i64 = 0;

#[derive(Debug, Default)]
struct State {
    /// The current lease id, `NO_LEASE` if none is known to be alive.
    id: i64,
    /// Set by the background keep-alive when it finds `id` gone. (The keeper never
    /// takes the mutex: it runs on the runtime's only worker, which a thread holding the
    /// mutex may be waiting on.)
    gone: Arc<AtomicBool>,
    /// The background keep-alive task of `id`.
    keeper: Option<tokio::task::JoinHandle<()>>,
}

/// One handle's session.
#[derive(Debug)]
pub(crate) struct Session {
    etcd: Etcd,
    background: bool,
    state: Mutex<State>,
}

impl Session {
    pub(crate) fn new(etcd: &Etcd, keep_alive: KeepAlive) -> Self {
        Session {
            etcd: etcd.clone(),
            background: keep_alive == KeepAlive::Background,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session's lease id, granting a new lease if there is none.
    ///
    /// # Errors
    /// If the grant fails.
    pub(crate) fn id(&self) -> Result<i64, EtcdError> {
        let mut st = self.state();
        if st.id != NO_LEASE && !st.gone.load(Ordering::Acquire) {
            return Ok(st.id);
        }
        let ttl = self.etcd.options().ttl_secs();
        let mut lease = self.etcd.client().lease_client();
        let resp = self.etcd.run(
            "lease grant",
            b"",
            async move { lease.grant(ttl, None).await },
        )?;
        if let Some(k) = st.keeper.take() {
            k.abort();
        }
        st.id = resp.id();
        st.gone = Arc::new(AtomicBool::new(false));
        if self.background {
            // Refresh every third of the granted TTL (the server may have raised it).
            let period = Duration::from_millis((resp.ttl().max(1) as u64) * 1000 / 3);
            st.keeper = Some(self.etcd.spawn(keeper(
                self.etcd.client(),
                resp.id(),
                period,
                st.gone.clone(),
            )));
        }
        Ok(st.id)
    }

    /// Forgets `id` if it is the current session (it expired): the next claim grants a
    /// new one.
    pub(crate) fn expired(&self, id: i64) {
        let mut st = self.state();
        if st.id == id {
            st.id = NO_LEASE;
            if let Some(k) = st.keeper.take() {
                k.abort();
            }
        }
    }

    /// Refreshes lease `id` once. `Ok(false)` if it no longer exists (expired or revoked).
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub(crate) fn keep_alive(&self, id: i64) -> Result<bool, EtcdError> {
        let mut lease = self.etcd.client().lease_client();
        let alive = self.etcd.run("keep-alive", b"", async move {
            keep_alive_once(&mut lease, id).await
        })?;
        if !alive {
            self.expired(id);
        }
        Ok(alive)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let (id, keeper) = {
            let mut st = self.state();
            (std::mem::replace(&mut st.id, NO_LEASE), st.keeper.take())
        };
        if let Some(k) = keeper {
            k.abort();
        }
        // Revoke so that our keys vanish at once instead of after the TTL. Best effort,
        // and never block inside an async context.
        if id != NO_LEASE && tokio::runtime::Handle::try_current().is_err() {
            let mut lease = self.etcd.client().lease_client();
            let _ = self.etcd.block_on(async move {
                tokio::time::timeout(Duration::from_secs(1), lease.revoke(id)).await
            });
        }
    }
}

/// One keep-alive round trip: `Ok(false)` if the lease is gone.
async fn keep_alive_once(
    lease: &mut etcd_client::LeaseClient,
    id: i64,
) -> Result<bool, etcd_client::Error> {
    match lease.keep_alive(id).await {
        Ok(_) => Ok(true),
        // etcd-client reports a TTL of 0 (lease not found) as this variant.
        Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The background keep-alive of lease `id`: refreshes it every `period`; retries soon
/// after a transport error (e.g. while the server restarts); ends when the lease is gone
/// (and then forgets it, so the next claim grants a new session) or the session dropped.
async fn keeper(client: etcd_client::Client, id: i64, period: Duration, gone: Arc<AtomicBool>) {
    let mut lease = client.lease_client();
    let mut wait = period;
    loop {
        tokio::time::sleep(wait).await;
        match tokio::time::timeout(period, keep_alive_once(&mut lease, id)).await {
            Ok(Ok(true)) => wait = period,
            Ok(Ok(false)) => {
                gone.store(true, Ordering::Release);
                return;
            }
            // Unreachable or slow server: try again soon (the TTL still runs server-side).
            Ok(Err(_)) | Err(_) => wait = RETRY,
        }
    }
}

/// How soon the background keep-alive retries after a failed refresh.
const RETRY: Duration = Duration::from_millis(100);

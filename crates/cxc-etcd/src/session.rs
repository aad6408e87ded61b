//! A session: one etcd lease (TTL) that a handle attaches its keys to, granted lazily,
//! granted anew after it expired, optionally kept alive by a background task, revoked
//! when the handle is dropped.
//!
//! Every key a handle owns (the lease's contender key, a semaphore's holder keys) is put
//! with the session's lease id, so etcd deletes them itself when the session expires:
//! that is the failover of a holder that died, hung (with [`KeepAlive::OnBeat`]) or was
//! cut off.
//!
//! # Local expiry
//!
//! The session also keeps a local deadline: the instant a refresh was *sent* plus the
//! granted TTL. etcd starts the TTL when the refresh reaches its leader, which is later,
//! so the server never expires the session before the local deadline. Once the deadline
//! passes without a refresh, the session is *presumed lost*: another client may hold what
//! it held. The handle then stops refreshing it, revokes it (best effort), and reports
//! its claims and permits lost ([`Session::alive`]) without asking the server, which may
//! be unreachable.
//!
//! # Keep-alive budget (background)
//!
//! A refresh is due every TTL/3 after the last success. Each attempt goes to one member
//! with a deadline of TTL/6 (never more than the request timeout, never more than half
//! of what is left before the local deadline); a member that misses it is left for the
//! next endpoint at once. With one hung follower a refresh lands at most
//! TTL/3 + TTL/6 + one round trip after the previous one, half the TTL: the other half is
//! the margin for scheduling delays and a second failed member. A hung leader adds the
//! election of a new one (up to twice etcd's election timeout), during which no member
//! can refresh: the TTL must cover that too (see docs/etcd.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{Etcd, Failure, KeepAlive, Members, RUNTIME_THREAD, classify};
use crate::error::EtcdError;

/// Session lease id 0 means "none" to etcd.
pub(crate) const NO_LEASE: i64 = 0;

/// Pause after every member failed one refresh attempt, before trying them again.
const ROUND_PAUSE: Duration = Duration::from_millis(50);
/// The shortest deadline of one refresh attempt.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// What the keep-alive of a handle's current session has done so far (see
/// [`EtcdLease::keep_alive_stats`](crate::EtcdLease::keep_alive_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeepAliveStats {
    /// Successful refreshes (background or by `beat`).
    pub refreshes: u64,
    /// Refresh attempts that failed or missed their deadline (each was followed at once
    /// by an attempt on the next member).
    pub failed_attempts: u64,
    /// The longest time between the sending of two successive successful refreshes
    /// (the first counted from the grant). Compare it with the TTL: the session survives
    /// while this stays below it.
    pub max_gap: Duration,
}

/// The liveness of one etcd lease as this process knows it.
#[derive(Debug)]
pub(crate) struct Life {
    /// Set when the lease is known gone (etcd said so, or the local deadline passed).
    gone: AtomicBool,
    /// The local deadline, in nanoseconds after `base`.
    deadline_ns: AtomicU64,
    base: Instant,
    ttl: Duration,
    /// When the last successful refresh (or the grant) was sent, ns after `base`.
    last_ns: AtomicU64,
    refreshes: AtomicU64,
    failed: AtomicU64,
    max_gap_ns: AtomicU64,
    /// Wakes [`Life::wait_lost`] when the lease is found gone.
    lost_lock: Mutex<()>,
    lost_cv: Condvar,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Life {
    fn new(sent: Instant, ttl: Duration) -> Self {
        Life {
            gone: AtomicBool::new(false),
            deadline_ns: AtomicU64::new(ns(ttl)),
            base: sent,
            ttl,
            last_ns: AtomicU64::new(0),
            refreshes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            max_gap_ns: AtomicU64::new(0),
            lost_lock: Mutex::new(()),
            lost_cv: Condvar::new(),
        }
    }

    /// Marks the lease gone and wakes the waiters.
    fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
        let _g = self.lost_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.lost_cv.notify_all();
    }

    /// Blocks until the lease is known or presumed lost (`true`), or `until` passes
    /// (`false`). Wakes when the keep-alive finds it gone, and at the local deadline.
    fn wait_lost(&self, until: Instant) -> bool {
        let mut g = self.lost_lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if !self.alive() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            // The deadline may move on (refreshes): wake at it, and check again.
            let wake = (until - now).min(self.left() + Duration::from_millis(1));
            g = self
                .lost_cv
                .wait_timeout(g, wake)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A refresh sent at `sent` succeeded.
    fn refreshed(&self, sent: Instant) {
        let at = ns(sent.saturating_duration_since(self.base));
        self.deadline_ns
            .fetch_max(at.saturating_add(ns(self.ttl)), Ordering::AcqRel);
        let last = self.last_ns.fetch_max(at, Ordering::AcqRel);
        self.max_gap_ns
            .fetch_max(at.saturating_sub(last), Ordering::Relaxed);
        self.refreshes.fetch_add(1, Ordering::Relaxed);
    }

    fn stats(&self) -> KeepAliveStats {
        KeepAliveStats {
            refreshes: self.refreshes.load(Ordering::Relaxed),
            failed_attempts: self.failed.load(Ordering::Relaxed),
            max_gap: Duration::from_nanos(self.max_gap_ns.load(Ordering::Relaxed)),
        }
    }

    /// Time left before the local deadline (zero once past it).
    fn left(&self) -> Duration {
        let deadline = self.base + Duration::from_nanos(self.deadline_ns.load(Ordering::Acquire));
        deadline.saturating_duration_since(Instant::now())
    }

    /// Alive as far as this process can tell: not known gone, deadline not passed.
    fn alive(&self) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        if self.left().is_zero() {
            // (No notify: every waiter also wakes at the deadline by itself.)
            self.gone.store(true, Ordering::Release);
            return false;
        }
        true
    }
}

#[derive(Debug)]
struct State {
    /// The current lease id, `NO_LEASE` if none was granted yet (or it was forgotten).
    id: i64,
    /// Liveness of `id`. (The keeper never takes the mutex: it runs on the runtime's
    /// only worker, which a thread holding the mutex may be waiting on.)
    life: Arc<Life>,
    /// The background keep-alive task of `id`.
    keeper: Option<tokio::task::JoinHandle<()>>,
    /// Every lease id this session was granted, `id` included (8 bytes per grant; a
    /// session is granted anew only after it was lost), for [`Session::owns`]: a claim
    /// made on any of them that is no longer the live one stays lost for good.
    granted: std::collections::HashSet<i64>,
}

/// One handle's session.
#[derive(Debug)]
pub(crate) struct Session {
    etcd: Etcd,
    background: bool,
    state: Mutex<State>,
    /// Serialises grants. The state lock is never held across a request, so the loss
    /// checks (`alive`, `lost`, `wait_lost`), which take it, never wait for a sibling
    /// thread's grant.
    granting: Mutex<()>,
}

impl Session {
    pub(crate) fn new(etcd: &Etcd, keep_alive: KeepAlive) -> Self {
        let life = Life::new(Instant::now(), Duration::ZERO);
        life.gone.store(true, Ordering::Release);
        Session {
            etcd: etcd.clone(),
            background: keep_alive == KeepAlive::Background,
            state: Mutex::new(State {
                id: NO_LEASE,
                life: Arc::new(life),
                keeper: None,
                granted: std::collections::HashSet::new(),
            }),
            granting: Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session's lease id, granting a new lease if there is none alive.
    ///
    /// # Errors
    /// If the grant fails.
    pub(crate) fn id(&self) -> Result<i64, EtcdError> {
        {
            let st = self.state();
            if st.id != NO_LEASE && st.life.alive() {
                return Ok(st.id);
            }
        }
        let _granting = self.granting.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut st = self.state();
            if st.id != NO_LEASE && st.life.alive() {
                // Another thread granted one while this one waited.
                return Ok(st.id);
            }
            let old = std::mem::replace(&mut st.id, NO_LEASE);
            st.life.mark_gone();
            if let Some(k) = st.keeper.take() {
                k.abort();
            }
            if old != NO_LEASE {
                // Presumed lost: make sure it is (its keys must not outlive our belief).
                self.revoke_in_background(old);
            }
        }
        let ttl = self.etcd.options().checked_ttl_secs()?;
        let sent = Instant::now();
        let resp = self.etcd.run("lease grant", b"", |c| {
            let mut lease = c.lease_client();
            async move { lease.grant(ttl, None).await }
        })?;
        // The server may have raised the TTL to its minimum.
        let granted = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(1).max(1));
        let mut st = self.state();
        st.id = resp.id();
        st.life = Arc::new(Life::new(sent, granted));
        let id = st.id;
        st.granted.insert(id);
        if self.background {
            st.keeper = Some(self.etcd.spawn(keeper(
                self.etcd.members().clone(),
                resp.id(),
                granted,
                self.etcd.options().request_timeout,
                st.life.clone(),
            )));
        }
        Ok(st.id)
    }

    /// [`id`](Self::id), refreshing a beat-driven session's live lease first (one
    /// keep-alive), so a claim made on it has a whole TTL from now. A background session
    /// is kept fresh by its keeper and is not refreshed here.
    ///
    /// # Errors
    /// If the grant or the keep-alive fails.
    pub(crate) fn id_refreshed(&self) -> Result<i64, EtcdError> {
        let id = self.id()?;
        if self.background {
            return Ok(id);
        }
        let fresh = {
            let st = self.state();
            // Just granted: it has its whole TTL already.
            st.id == id
                && st.life.last_ns.load(Ordering::Acquire) == 0
                && st.life.base.elapsed() < Duration::from_millis(100)
        };
        if fresh || self.keep_alive(id)? {
            return Ok(id);
        }
        // Gone meanwhile: `keep_alive` forgot it; grant a new one.
        self.id()
    }

    /// Whether lease `id` is this session's current lease and alive as far as this
    /// process can tell (no request is made).
    pub(crate) fn alive(&self, id: i64) -> bool {
        let st = self.state();
        st.id == id && id != NO_LEASE && st.life.alive()
    }

    /// Blocks until lease `id` is known or presumed lost (`true`, at once if it is not
    /// this session's current lease), or `timeout` passes (`false`). No request is made.
    pub(crate) fn wait_lost(&self, id: i64, timeout: Duration) -> bool {
        let life = {
            let st = self.state();
            if st.id != id || id == NO_LEASE {
                return true;
            }
            st.life.clone()
        };
        let until = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        life.wait_lost(until)
    }

    /// Whether something made on lease `id` is known or presumed lost without asking etcd:
    /// `id` was granted to this session and is no longer its live lease (it expired, was
    /// found gone, or missed its local deadline).
    pub(crate) fn lost(&self, id: i64) -> bool {
        self.owns(id) && !self.alive(id)
    }

    /// Whether lease `id` was granted to this session (any of its grants).
    pub(crate) fn owns(&self, id: i64) -> bool {
        id != NO_LEASE && self.state().granted.contains(&id)
    }

    /// The keep-alive statistics of the current session (all zero before the first
    /// grant).
    pub(crate) fn stats(&self) -> KeepAliveStats {
        let st = self.state();
        if st.id == NO_LEASE {
            return KeepAliveStats::default();
        }
        st.life.stats()
    }

    /// Forgets `id` if it is the current session (it expired): the next claim grants a
    /// new one.
    pub(crate) fn expired(&self, id: i64) {
        let mut st = self.state();
        if st.id == id {
            st.life.mark_gone();
            st.id = NO_LEASE;
            if let Some(k) = st.keeper.take() {
                k.abort();
            }
            drop(st);
            // Make sure it is gone (its keys must not outlive our belief).
            self.revoke_in_background(id);
        }
    }

    /// Refreshes lease `id` once. `Ok(false)` if it no longer exists (expired or revoked)
    /// or is presumed lost (its local deadline passed).
    ///
    /// # Errors
    /// If the server cannot be reached.
    pub(crate) fn keep_alive(&self, id: i64) -> Result<bool, EtcdError> {
        let life = {
            let st = self.state();
            if st.id != id || !st.life.alive() {
                drop(st);
                self.expired(id);
                return Ok(false);
            }
            st.life.clone()
        };
        let sent = Instant::now();
        let alive = self.etcd.run("keep-alive", b"", |c| {
            let mut lease = c.lease_client();
            async move { keep_alive_once(&mut lease, id).await }
        })?;
        if alive {
            life.refreshed(sent);
        } else {
            self.expired(id);
        }
        Ok(alive)
    }

    fn revoke_in_background(&self, id: i64) {
        let members = self.etcd.members().clone();
        let timeout = self.etcd.options().request_timeout;
        drop(self.etcd.spawn(async move {
            revoke(&members, id, timeout).await;
        }));
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
        // Revoke so that our keys vanish at once instead of after the TTL (best effort,
        // at most about a second).
        if id != NO_LEASE {
            let members = self.etcd.members().clone();
            let revoking = async move { revoke(&members, id, Duration::from_secs(1)).await };
            if tokio::runtime::Handle::try_current().is_err() {
                self.etcd.block_on(revoking);
            } else if std::thread::current().name() == Some(RUNTIME_THREAD) {
                // On the connection's own runtime: waiting here would stall it.
                drop(self.etcd.spawn(revoking));
            } else {
                // Inside another runtime, where `block_on` would panic: the connection's
                // runtime sends the revoke and this thread waits for it.
                let (tx, rx) = std::sync::mpsc::channel();
                drop(self.etcd.spawn(async move {
                    revoking.await;
                    let _ = tx.send(());
                }));
                let _ = rx.recv_timeout(Duration::from_millis(1100));
            }
        }
    }
}

/// Revokes lease `id`, trying each member once within `timeout` in all.
async fn revoke(members: &Members, id: i64, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, async {
        let first = members.preferred();
        for k in 0..members.len() {
            let mut lease = members.client(first + k).lease_client();
            let per = timeout / u32::try_from(members.len()).unwrap_or(1).max(1);
            if let Ok(Ok(_)) = tokio::time::timeout(per, lease.revoke(id)).await {
                return;
            }
        }
    })
    .await;
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

/// The background keep-alive of lease `id` (granted `ttl`): refreshes it every TTL/3;
/// each attempt has its own deadline (see the module's keep-alive budget) and a failed
/// attempt moves on to the next member at once. Ends when the lease is gone, when the
/// local deadline passes (then revokes it: it is presumed lost), or when the session is
/// dropped.
async fn keeper(members: Arc<Members>, id: i64, ttl: Duration, request: Duration, life: Arc<Life>) {
    let period = ttl / 3;
    let per_try = (ttl / 6).min(request);
    let n = members.len();
    loop {
        tokio::time::sleep(period).await;
        let mut next = members.preferred();
        let mut failed_in_row = 0usize;
        loop {
            let left = life.left();
            if left.is_zero() || life.gone.load(Ordering::Acquire) {
                life.mark_gone();
                revoke(&members, id, per_try.max(MIN_ATTEMPT)).await;
                return;
            }
            let deadline = per_try.min(left / 2).max(MIN_ATTEMPT);
            let mut lease = members.client(next).lease_client();
            let sent = Instant::now();
            match tokio::time::timeout(deadline, keep_alive_once(&mut lease, id)).await {
                Ok(Ok(true)) => {
                    life.refreshed(sent);
                    members.prefer(next);
                    break;
                }
                Ok(Ok(false)) => {
                    life.mark_gone();
                    return;
                }
                Ok(Err(e)) => {
                    life.failed.fetch_add(1, Ordering::Relaxed);
                    members.failed(next);
                    if classify(&e) == Failure::NotSent {
                        members.reconnect(next).await;
                    }
                }
                Err(_) => {
                    life.failed.fetch_add(1, Ordering::Relaxed);
                    members.failed(next);
                }
            }
            next = (next + 1) % n;
            failed_in_row += 1;
            if failed_in_row.is_multiple_of(n) {
                tokio::time::sleep(ROUND_PAUSE.min(left / 4)).await;
            }
        }
    }
}

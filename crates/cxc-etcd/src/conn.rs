//! [`Etcd`]: a connection (client + the runtime thread that drives it) and its
//! [`EtcdOptions`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::EtcdError;

/// How the session (etcd lease) of a handle is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepAlive {
    /// A task on the connection's runtime refreshes the session every third of its TTL,
    /// so a claim lasts as long as the process (and its link to a quorum of etcd) lives:
    /// failover happens when the process dies or is cut off, after the TTL. Each refresh
    /// has a deadline of a sixth of the TTL per member; a member that misses it (hung,
    /// unreachable) is skipped at once for the next endpoint, so one hung follower delays
    /// a refresh by at most TTL/6 (a hung leader also by the election of a new one: keep
    /// the TTL above four election timeouts). The analogue of [`OwnerLease`](cxc_sync::OwnerLease)'s
    /// OS-identity failover.
    #[default]
    Background,
    /// Only [`beat`](cxc_sync::FencedLease::beat) refreshes the session: a holder that
    /// does not beat within the TTL loses its claim even if its process is alive. The
    /// analogue of `OwnerLease`'s heartbeat grace. A beat that comes after the session's
    /// local deadline (the last refresh's send time + TTL) returns `false`: the claim is
    /// presumed lost and the session is ended. (Semaphores always use `Background`.)
    OnBeat,
}

/// Options of a connection and of the sessions its handles open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// Session TTL: how long after its holder dies (or stops beating) a claim or permit
    /// is given up. Rounded up to whole seconds (etcd's unit); zero and values above
    /// etcd's maximum (9,000,000,000 s) are refused by [`Etcd::connect`] with
    /// [`EtcdError::InvalidOption`]. The server may raise it to its own minimum
    /// (1.5 × election timeout, 2 s with etcd's default settings). Default 5 s.
    pub ttl: Duration,
    /// How sessions are kept alive (default [`KeepAlive::Background`]).
    pub keep_alive: KeepAlive,
    /// How long one request may take before it fails with [`EtcdError::Timeout`]
    /// (default 5 s).
    pub request_timeout: Duration,
    /// How long connecting to an endpoint may take (default 2 s).
    pub connect_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            ttl: Duration::from_secs(5),
            keep_alive: KeepAlive::Background,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

impl EtcdOptions {
    /// Sets [`EtcdOptions::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`EtcdOptions::keep_alive`].
    pub fn keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// Sets [`EtcdOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`EtcdOptions::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The TTL in whole seconds (rounded up), as granted to etcd.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for a zero TTL or one above etcd's maximum.
    pub(crate) fn checked_ttl_secs(&self) -> Result<i64, EtcdError> {
        if self.ttl.is_zero() {
            return Err(EtcdError::InvalidOption(
                "the session TTL must be above zero".into(),
            ));
        }
        let secs = self
            .ttl
            .as_secs()
            .checked_add(u64::from(self.ttl.subsec_nanos() > 0))
            .filter(|&s| s <= MAX_TTL_SECS)
            .ok_or_else(|| {
                EtcdError::InvalidOption(format!(
                    "session TTL {:?} is above etcd's maximum of {MAX_TTL_SECS} s",
                    self.ttl
                ))
            })?;
        // `secs <= MAX_TTL_SECS` fits an i64.
        Ok(secs as i64)
    }
}

/// The longest TTL etcd grants (`MaxLeaseTTL` in etcd's lessor: 9,000,000,000 s).
pub(crate) const MAX_TTL_SECS: u64 = 9_000_000_000;

/// gRPC status codes (`tonic::Code` discriminants) this crate tells apart.
const CODE_CANCELLED: i32 = 1;
const CODE_DEADLINE_EXCEEDED: i32 = 4;
const CODE_UNAVAILABLE: i32 = 14;

/// The name of a connection's runtime threads.
pub(crate) const RUNTIME_THREAD: &str = "cxc-etcd";

/// How a request error is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request was never delivered (no connection could be made): safe to send again.
    NotSent,
    /// A deadline passed (ours or the server's): the outcome is unknown.
    Timeout,
    /// Anything else (refused, failed in transit, an error from the server).
    Other,
}

/// Classifies an error of the client.
pub(crate) fn classify(e: &etcd_client::Error) -> Failure {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            let code = s.code() as i32;
            if code == CODE_DEADLINE_EXCEEDED || code == CODE_CANCELLED {
                return Failure::Timeout;
            }
            // etcd's own timeouts ("etcdserver: request timed out", also "…, possibly
            // due to previous leader failure" / "… connection lost") are Unavailable:
            // the proposal may still be committed, the outcome is unknown.
            if code == CODE_UNAVAILABLE && s.message().contains("request timed out") {
                return Failure::Timeout;
            }
            // tonic reports a failed TCP connect as Unavailable with the connector's
            // message; the request never left this process.
            let text = format!("{s:?}");
            if code == CODE_UNAVAILABLE
                && (text.contains("tcp connect error") || text.contains("Connection refused"))
            {
                return Failure::NotSent;
            }
            Failure::Other
        }
        etcd_client::Error::TransportError(_) => Failure::NotSent,
        _ => Failure::Other,
    }
}

/// One member's channel. Each endpoint gets its own client, so a hung member only delays
/// the requests sent to it, and a caller can move on to another member at once.
pub(crate) struct Member {
    url: String,
    client: std::sync::Mutex<Client>,
}

/// The members of a connection and which one requests go to first. Shared with the
/// background tasks (which must not hold the runtime itself).
pub(crate) struct Members {
    list: Vec<Member>,
    /// Index of the member requests go to first; moved on when that member fails.
    preferred: AtomicUsize,
    copts: ConnectOptions,
}

impl Members {
    /// How many members.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The member to try first.
    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.list.len()
    }

    /// Member `i` answered: prefer it.
    pub(crate) fn prefer(&self, i: usize) {
        self.preferred.store(i % self.list.len(), Ordering::Relaxed);
    }

    /// Member `i` failed: move the preference on, if it still points at `i`.
    pub(crate) fn failed(&self, i: usize) {
        let n = self.list.len();
        let _ = self.preferred.compare_exchange(
            i % n,
            (i + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A clone of member `i`'s client.
    pub(crate) fn client(&self, i: usize) -> Client {
        let m = &self.list[i % self.list.len()];
        m.client.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces member `i`'s client by a fresh one (a new channel, no reconnect backoff
    /// left over from an outage). Keeps the old one if the new one cannot be built.
    pub(crate) async fn reconnect(&self, i: usize) {
        let m = &self.list[i % self.list.len()];
        if let Ok(c) = Client::connect([m.url.as_str()], Some(self.copts.clone())).await {
            *m.client.lock().unwrap_or_else(|e| e.into_inner()) = c;
        }
    }
}

struct Inner {
    /// `Some` until drop.
    rt: Option<tokio::runtime::Runtime>,
    members: Arc<Members>,
    opts: EtcdOptions,
    endpoints: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Dropping a runtime inside another runtime's context panics; never block there.
            if tokio::runtime::Handle::try_current().is_ok() {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_millis(500));
            }
        }
    }
}

/// A connection to an etcd cluster: one client (channel) per endpoint and one runtime
/// thread that drives them, behind a blocking API. Cheap to clone; every
/// [`EtcdLease`](crate::EtcdLease) and [`EtcdSemaphore`](crate::EtcdSemaphore) built from
/// it shares the connection.
///
/// Requests go to one preferred member; a member that times out or cannot be reached
/// loses the preference, so the next request goes to the next endpoint. Session
/// keep-alives do the same within one refresh (see [`KeepAlive::Background`]).
///
/// # Panics
/// The blocking methods of the handles built on it panic if called from inside an
/// async runtime (tokio forbids blocking there): call them from ordinary threads, or
/// through `spawn_blocking`.
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.inner.endpoints)
            .field("opts", &self.inner.opts)
            .finish()
    }
}

impl Etcd {
    /// Connects to `endpoints` (e.g. `["http://127.0.0.1:2379"]`), one channel per
    /// endpoint. The connection is made lazily: this succeeds while the servers are down,
    /// and requests fail until they are up.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for no endpoints, a zero timeout, or a TTL that is
    /// zero or above etcd's maximum (9,000,000,000 s);
    /// [`EtcdError::Runtime`] if the runtime thread cannot start;
    /// [`EtcdError::Connect`] for a malformed endpoint.
    pub fn connect<E: AsRef<str>>(endpoints: &[E], opts: EtcdOptions) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::InvalidOption("no etcd endpoints".into()));
        }
        if opts.request_timeout.is_zero() || opts.connect_timeout.is_zero() {
            return Err(EtcdError::InvalidOption(
                "request and connect timeouts must be above zero".into(),
            ));
        }
        opts.checked_ttl_secs()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(RUNTIME_THREAD)
            // The library's threads (`cxc_mmf::orphan`), until each ends.
            .on_thread_start(cxc_mmf::orphan::ours)
            .enable_all()
            .build()
            .map_err(EtcdError::Runtime)?;
        let list: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_owned()).collect();
        let joined = list.join(",");
        // No gRPC-level request timeout: `run` bounds every request itself and reports
        // `EtcdError::Timeout` (a gRPC deadline would race it and surface as Cancelled).
        let copts = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            // A member cut off from the leader answers at once instead of waiting.
            .with_require_leader(true)
            // HTTP/2 pings find a dead connection; etcd refuses pings more often than
            // every 5 s (`--grpc-keepalive-min-time`), so stay above that.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let mut members = Vec::with_capacity(list.len());
        for url in &list {
            let client = rt
                .block_on(Client::connect([url.as_str()], Some(copts.clone())))
                .map_err(|source| EtcdError::Connect {
                    endpoints: joined.clone(),
                    source,
                })?;
            members.push(Member {
                url: url.clone(),
                client: std::sync::Mutex::new(client),
            });
        }
        // The runtime's threads are the library's (registered, `cxc_mmf::orphan::ours`)
        // and keep sessions alive: they must not keep alive a
        // process whose main thread exited and whose own threads all ended. So one task
        // looks once a second (`cxc_mmf::orphan`), for as long as the connection lives.
        drop(rt.spawn(async {
            let mut next = cxc_mmf::orphan::LOOK_IDLE;
            loop {
                tokio::time::sleep(next).await;
                next = cxc_mmf::orphan::look();
            }
        }));
        Ok(Etcd {
            inner: Arc::new(Inner {
                rt: Some(rt),
                members: Arc::new(Members {
                    list: members,
                    preferred: AtomicUsize::new(0),
                    copts,
                }),
                opts,
                endpoints: joined,
            }),
        })
    }

    /// The options this connection was made with.
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.opts
    }

    /// The endpoints, comma-separated.
    pub fn endpoints(&self) -> &str {
        &self.inner.endpoints
    }

    /// A clone of the async client of the preferred member (for requests this crate does
    /// not wrap).
    pub fn client(&self) -> Client {
        let m = &self.inner.members;
        m.client(m.preferred())
    }

    pub(crate) fn members(&self) -> &Arc<Members> {
        &self.inner.members
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // `rt` is only taken in `Drop`.
        self.inner.rt.as_ref().expect("runtime present until drop")
    }

    /// Runs one request on the preferred member, bounded by the request timeout. A
    /// request that could not be delivered (no connection) is sent to the next member
    /// within the same deadline; a member that failed loses the preference (and its
    /// channel is rebuilt after a connection failure).
    ///
    /// Every deadline that passes is [`EtcdError::Timeout`].
    pub(crate) fn run<T, F, Fut>(&self, op: &'static str, key: &[u8], f: F) -> Result<T, EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.opts.request_timeout;
        let members = self.inner.members.clone();
        let timed_out = || EtcdError::Timeout {
            op,
            key: key_str(key),
            timeout,
        };
        let trying = AtomicUsize::new(members.preferred());
        let result = self.rt().block_on(async {
            tokio::time::timeout(timeout, async {
                let n = members.len();
                let first = members.preferred();
                let mut last = None;
                for k in 0..n {
                    let i = (first + k) % n;
                    trying.store(i, Ordering::Relaxed);
                    // A fresh channel gets one more try on the same member.
                    for attempt in 0..2 {
                        match f(members.client(i)).await {
                            Ok(v) => {
                                members.prefer(i);
                                return Ok(v);
                            }
                            Err(e) if classify(&e) == Failure::NotSent => {
                                members.reconnect(i).await;
                                last = Some(e);
                                if attempt == 1 {
                                    members.failed(i);
                                }
                            }
                            Err(e) => {
                                members.failed(i);
                                return Err(e);
                            }
                        }
                    }
                }
                Err(last.unwrap_or(etcd_client::Error::EndpointsNotManaged))
            })
            .await
        });
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) if classify(&source) == Failure::Timeout => Err(timed_out()),
            Ok(Err(source)) => Err(EtcdError::Request {
                op,
                key: key_str(key),
                source,
            }),
            Err(_) => {
                // The member we were waiting on did not answer in time: the next request
                // goes elsewhere.
                members.failed(trying.load(Ordering::Relaxed));
                Err(timed_out())
            }
        }
    }

    /// One transaction through [`Etcd::run`].
    pub(crate) fn txn(
        &self,
        op: &'static str,
        key: &[u8],
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse, EtcdError> {
        self.run(op, key, |c| {
            let mut kv = c.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
    }

    /// One range request through [`Etcd::run`].
    pub(crate) fn get(
        &self,
        op: &'static str,
        key: &[u8],
        opts: Option<etcd_client::GetOptions>,
    ) -> Result<etcd_client::GetResponse, EtcdError> {
        self.run(op, key, |c| {
            let mut kv = c.kv_client();
            let (key, opts) = (key.to_vec(), opts.clone());
            async move { kv.get(key, opts).await }
        })
    }

    /// Runs a future that cannot fail (waits) on the runtime.
    pub(crate) fn block_on<T>(&self, fut: impl Future<Output = T>) -> T {
        self.rt().block_on(fut)
    }

    /// Spawns a background task on the runtime.
    pub(crate) fn spawn(
        &self,
        fut: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.rt().spawn(fut)
    }
}

/// A key for messages (lossy UTF-8).
pub(crate) fn key_str(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

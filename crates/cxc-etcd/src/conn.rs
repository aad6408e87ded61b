//! [`Etcd`]: a connection (client + the runtime thread that drives it) and its
//! [`EtcdOptions`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::EtcdError;

/// How the session (etcd lease) of a handle is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepAlive {
    /// A task on the connection's runtime refreshes the session every third of its TTL,
    /// so a claim lasts as long as the process (and its link to etcd) lives: failover
    /// happens when the process dies or is cut off, after the TTL. The analogue of
    /// [`OwnerLease`](cxc_sync::OwnerLease)'s OS-identity failover.
    #[default]
    Background,
    /// Only [`beat`](cxc_sync::FencedLease::beat) refreshes the session: a holder that
    /// does not beat within the TTL loses its claim even if its process is alive. The
    /// analogue of `OwnerLease`'s heartbeat grace. (Semaphores always use `Background`.)
    OnBeat,
}

/// Options of a connection and of the sessions its handles open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// Session TTL: how long after its holder dies (or stops beating) a claim or permit
    /// is given up. Rounded up to whole seconds (etcd's unit), at least 1 s; the server
    /// may raise it to its own minimum (1.5 × election timeout, 2 s by default).
    /// Default 5 s.
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

    /// The TTL in whole seconds, as granted to etcd.
    pub(crate) fn ttl_secs(&self) -> i64 {
        let s = self.ttl.as_secs() + u64::from(self.ttl.subsec_nanos() > 0);
        i64::try_from(s.max(1)).unwrap_or(i64::MAX)
    }
}

struct Inner {
    /// `Some` until drop.
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
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

/// A connection to an etcd cluster: the async client and one runtime thread that drives
/// it, behind a blocking API. Cheap to clone; every [`EtcdLease`](crate::EtcdLease) and
/// [`EtcdSemaphore`](crate::EtcdSemaphore) built from it shares the connection.
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
    /// Connects to `endpoints` (e.g. `["http://127.0.0.1:2379"]`). The connection is made
    /// lazily: this succeeds while the server is down, and requests fail until it is up.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for no endpoints or a zero timeout;
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
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cxc-etcd")
            .enable_all()
            .build()
            .map_err(EtcdError::Runtime)?;
        let list: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_owned()).collect();
        let joined = list.join(",");
        let copts = ConnectOptions::new()
            .with_timeout(opts.request_timeout)
            .with_connect_timeout(opts.connect_timeout)
            // HTTP/2 pings find a dead connection; etcd refuses pings more often than
            // every 5 s (`--grpc-keepalive-min-time`), so stay above that.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let client = rt
            .block_on(Client::connect(list, Some(copts)))
            .map_err(|source| EtcdError::Connect {
                endpoints: joined.clone(),
                source,
            })?;
        Ok(Etcd {
            inner: Arc::new(Inner {
                rt: Some(rt),
                client,
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

    /// A clone of the async client (for requests this crate does not wrap).
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // `rt` is only taken in `Drop`.
        self.inner.rt.as_ref().expect("runtime present until drop")
    }

    /// Runs one request on the runtime, bounded by the request timeout.
    pub(crate) fn run<T>(
        &self,
        op: &'static str,
        key: &[u8],
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        let timeout = self.inner.opts.request_timeout;
        // The timer must be made inside the runtime: build it in the async block.
        match self
            .rt()
            .block_on(async move { tokio::time::timeout(timeout, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(EtcdError::Request {
                op,
                key: key_str(key),
                source,
            }),
            Err(_) => Err(EtcdError::Timeout {
                op,
                key: key_str(key),
                timeout,
            }),
        }
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

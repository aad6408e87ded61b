//! Leader election on any backend, fenced and progress-driven (issue #16).
//!
//! An [`Elector`] campaigns for leadership through an [`ElectionBackend`] — the mapped
//! lease file ([`MmapElection`]) or etcd (`cxc_etcd::EtcdElection`, etcd's own election
//! recipe). [`Elector::campaign`] returns a [`Leadership`]: its [`token`](Leadership::token)
//! is the fencing token of the term (strictly greater for every later leader), to be
//! handed to a [`FencedResource`] with every write.
//!
//! **Renewal is progress-driven by default**: the leader's work loop calls
//! [`Leadership::renew`]. A leader that does not renew within the lease duration loses
//! leadership even though its process lives (a standby takes over, and the old leader's
//! next `renew` reports the loss). A background renewer
//! ([`Renewal::Background`]) keeps a live process leading even when its work is stuck:
//! use it only when the work cannot get stuck, or is fenced anyway.
//!
//! Events (`StartedLeading`, `StoppedLeading`, `NewLeader`) arrive on channels from
//! [`Elector::events`], sent when a call of the elector finds them out (no thread watches
//! otherwise). See `docs/leader-election.md`.

mod fenced;
mod leadership;
mod mmap;

use std::fmt::Debug;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use fenced::{FencedFile, FencedFileError, FencedResource};
pub use leadership::Leadership;
pub use mmap::{IDENTITY_MAX, LeaderRecord, MmapElection, MmapElectionError};

/// The leader as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    /// The identity the leader campaigned with (empty if it did not say, e.g. while a
    /// freshly elected leader on the mapped file has not yet written it).
    pub identity: String,
    /// The fencing token of its term.
    pub token: u64,
}

/// An election: campaign, renew, resign, observe. Implemented by [`MmapElection`] (the
/// lease file) and by `cxc_etcd::EtcdElection` (etcd's `concurrency.Election` layout).
///
/// # Errors
/// `Err` only when the backend failed; losing a race or a term is `Ok(None)` /
/// `Ok(false)`.
pub trait ElectionBackend: Send + Sync + 'static {
    /// A won term: who leads and with which token.
    type Term: Copy + Debug + Send + Sync + 'static;
    /// Why the backend could not answer.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Becomes leader if nobody leads (or the leader failed over), without blocking.
    fn try_lead(&self, identity: &str) -> Result<Option<Self::Term>, Self::Error>;

    /// Becomes leader, blocking at most `timeout`; `Ok(None)` on timeout.
    fn lead_timeout(
        &self,
        identity: &str,
        timeout: Duration,
    ) -> Result<Option<Self::Term>, Self::Error>;

    /// Proves the leader makes progress (heartbeat / keep-alive); `Ok(false)` when the
    /// term is over.
    fn renew(&self, term: &Self::Term) -> Result<bool, Self::Error>;

    /// Whether `term` is still the current term.
    fn is_current(&self, term: &Self::Term) -> Result<bool, Self::Error>;

    /// Ends `term` if it is current (a stale term never ends a newer one).
    fn resign(&self, term: &Self::Term) -> Result<bool, Self::Error>;

    /// The current leader, `None` when nobody leads.
    fn leader(&self) -> Result<Option<Leader>, Self::Error>;

    /// Blocks until `term` is known lost (`true`) or `timeout` passes (`false`).
    fn wait_lost(&self, term: &Self::Term, timeout: Duration) -> Result<bool, Self::Error>;

    /// The term's fencing token.
    fn token(term: &Self::Term) -> u64;
}

/// How a leader's term is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Renewal {
    /// Only [`Leadership::renew`] renews: a leader whose work loop stops calling it loses
    /// leadership within the lease duration, even while its process lives.
    #[default]
    Progress,
    /// A thread renews every `renew_period` while the [`Leadership`] lives. **Risk**: a
    /// leader whose work is stuck (deadlock, endless loop, waiting on a dead peer) keeps
    /// leading as long as its process lives; only its death or a stop past the lease
    /// duration ends the term. Fence every write anyway.
    Background,
}

/// The settings of an [`Elector`] (client-go's `LeaderElectionConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectionConfig {
    /// Who campaigns (shown to observers; at most [`IDENTITY_MAX`] bytes on the mapped
    /// file).
    pub identity: String,
    /// How long a term lasts without renewal: on the mapped file the heartbeat grace
    /// (a standby takes over after it), and on every backend the leader's own deadline
    /// (a `renew` after it reports the loss and resigns). On etcd the server side is the
    /// session TTL of the connection; set both alike. Default 1 s.
    pub lease_duration: Duration,
    /// How often the background renewer renews ([`Renewal::Background`]). Default
    /// lease duration / 3.
    pub renew_period: Duration,
    /// How often a standby looks again (a blocked campaign also wakes on a release or a
    /// holder's death). Default 50 ms.
    pub retry_period: Duration,
    /// Whether dropping a [`Leadership`] resigns at once (client-go's
    /// `ReleaseOnCancel`); otherwise the term runs out after the lease duration.
    /// Default true.
    pub release_on_cancel: bool,
    /// How the term is renewed. Default [`Renewal::Progress`].
    pub renewal: Renewal,
}

impl ElectionConfig {
    /// The defaults for `identity`.
    pub fn new(identity: impl Into<String>) -> Self {
        ElectionConfig {
            identity: identity.into(),
            lease_duration: Duration::from_secs(1),
            renew_period: Duration::from_millis(333),
            retry_period: Duration::from_millis(50),
            release_on_cancel: true,
            renewal: Renewal::Progress,
        }
    }

    /// Sets the lease duration (and the renew period to a third of it).
    pub fn lease_duration(mut self, d: Duration) -> Self {
        self.lease_duration = d;
        self.renew_period = d / 3;
        self
    }

    fn validate(&self) -> Result<(), ElectionError> {
        let bad = |why: &str| Err(ElectionError::InvalidConfig(why.to_owned()));
        if self.identity.is_empty() {
            return bad("empty identity");
        }
        if self.lease_duration.is_zero() {
            return bad("zero lease duration");
        }
        if self.renewal == Renewal::Background
            && (self.renew_period.is_zero() || self.renew_period >= self.lease_duration)
        {
            return bad("the renew period must be positive and shorter than the lease duration");
        }
        if self.retry_period.is_zero() {
            return bad("zero retry period");
        }
        Ok(())
    }
}

crate::macros::setters!(ElectionConfig {
    renew_period: Duration,
    retry_period: Duration,
    release_on_cancel: bool,
    renewal: Renewal,
});

/// What an [`Elector`] tells its subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionEvent {
    /// This elector became leader with `token`.
    StartedLeading {
        /// The term's fencing token.
        token: u64,
    },
    /// This elector's term `token` ended (lost, expired, stepped down or dropped): sent
    /// when a call finds it over (`renew`, `is_current`, `wait_lost`, `step_down`,
    /// `resign`, the drop, or the background renewer). A term that ends while none of
    /// these runs is reported only at the next one: keep a thread in
    /// [`Leadership::wait_lost`] to be told at the local deadline.
    StoppedLeading {
        /// The ended term's token.
        token: u64,
    },
    /// A leader was observed that differs from the last one observed (also this elector
    /// itself when it wins).
    NewLeader {
        /// The leader's identity.
        identity: String,
        /// Its term's token.
        token: u64,
    },
}

/// Why an election call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// The term is over: superseded, expired (not renewed within the lease duration),
    /// or stepped down. Stop the leader's work.
    #[error("leadership of term {token} lost")]
    Lost {
        /// The lost term's token.
        token: u64,
    },
    /// The configuration is unusable.
    #[error("invalid election config: {0}")]
    InvalidConfig(String),
    /// The backend failed (the outcome of the call is unknown).
    #[error("election backend: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A thread the election needs could not be started (e.g. `EAGAIN` at a pids limit):
    /// from [`Elector::campaign`] with [`Renewal::Background`], after the won term was
    /// resigned again (nothing is left held).
    #[error("cannot start the election's renewer thread: {0}")]
    Thread(#[source] std::io::Error),
}

fn backend<E: std::error::Error + Send + Sync + 'static>(e: E) -> ElectionError {
    ElectionError::Backend(Box::new(e))
}

type Subscribers = Arc<Mutex<Vec<Sender<ElectionEvent>>>>;

fn emit(subs: &Subscribers, ev: &ElectionEvent) {
    lock(subs).retain(|s| s.send(ev.clone()).is_ok());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A candidate: campaigns through a backend with a config.
pub struct Elector<B: ElectionBackend> {
    backend: Arc<B>,
    config: Arc<ElectionConfig>,
    subscribers: Subscribers,
    last_seen: Mutex<Option<Leader>>,
}

impl<B: ElectionBackend> Debug for Elector<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<B: ElectionBackend> Elector<B> {
    /// A candidate on `backend`.
    ///
    /// # Errors
    /// [`ElectionError::InvalidConfig`] for an empty identity, a zero lease duration or
    /// retry period, or (with [`Renewal::Background`] only) a renew period that is zero
    /// or not shorter than the lease duration.
    pub fn new(backend: B, config: ElectionConfig) -> Result<Self, ElectionError> {
        config.validate()?;
        Ok(Elector {
            backend: Arc::new(backend),
            config: Arc::new(config),
            subscribers: Arc::default(),
            last_seen: Mutex::new(None),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The config.
    pub fn config(&self) -> &ElectionConfig {
        &self.config
    }

    /// A new channel of this elector's events (from now on).
    pub fn events(&self) -> Receiver<ElectionEvent> {
        let (tx, rx) = channel();
        lock(&self.subscribers).push(tx);
        rx
    }

    /// The current leader, announcing it as [`ElectionEvent::NewLeader`] if it differs
    /// from the last one observed.
    ///
    /// # Errors
    /// [`ElectionError::Backend`].
    pub fn observe(&self) -> Result<Option<Leader>, ElectionError> {
        let leader = self.backend.leader().map_err(backend)?;
        if let Some(l) = &leader {
            self.seen(l);
        }
        Ok(leader)
    }

    fn seen(&self, l: &Leader) {
        let mut last = lock(&self.last_seen);
        if last.as_ref() != Some(l) && !(l.identity.is_empty() && last.is_some()) {
            *last = Some(l.clone());
            drop(last);
            emit(
                &self.subscribers,
                &ElectionEvent::NewLeader {
                    identity: l.identity.clone(),
                    token: l.token,
                },
            );
        }
    }

    /// Campaigns until elected or `timeout` passes (`Ok(None)`): the backend's
    /// [`lead_timeout`](ElectionBackend::lead_timeout) in slices of the retry period,
    /// observing the leader between them (announced as [`ElectionEvent::NewLeader`]),
    /// never after `timeout`: `Ok(None)` comes as late after `timeout` as the backend
    /// call (or the observation) that was under way then.
    ///
    /// # Errors
    /// [`ElectionError::Backend`]; [`ElectionError::Thread`] if the term was won but its
    /// background renewer ([`Renewal::Background`]) could not be started: the term is
    /// resigned again before this returns.
    pub fn campaign(&self, timeout: Duration) -> Result<Option<Leadership<B>>, ElectionError> {
        let start = Instant::now();
        let id = &self.config.identity;
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let slice = left.min(self.config.retry_period);
            let won = if slice.is_zero() {
                self.backend.try_lead(id)
            } else {
                self.backend.lead_timeout(id, slice)
            }
            .map_err(backend)?;
            if let Some(term) = won {
                return self.start(term, start).map(Some);
            }
            // No observation after the timeout: it would only make `Ok(None)` later
            // (by a whole request on a backend that does not answer).
            if start.elapsed() >= timeout {
                return Ok(None);
            }
            // Observing is best effort while campaigning.
            let _ = self.observe();
            if start.elapsed() >= timeout {
                return Ok(None);
            }
        }
    }

    /// A won term, announced, with its background renewer if the config asks for one.
    /// If that cannot start, the term is resigned (announced as `StoppedLeading`) and the
    /// error returned.
    fn start(&self, term: B::Term, _since: Instant) -> Result<Leadership<B>, ElectionError> {
        let token = B::token(&term);
        emit(&self.subscribers, &ElectionEvent::StartedLeading { token });
        self.seen(&Leader {
            identity: self.config.identity.clone(),
            token,
        });
        let mut l = Leadership::begin(
            self.backend.clone(),
            self.config.clone(),
            term,
            self.subscribers.clone(),
        );
        l.start_renewer()?;
        Ok(l)
    }
}

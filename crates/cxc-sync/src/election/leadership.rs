//! A won term: [`Leadership`], its renewal (in the work loop or a background thread) and
//! its end (step down, loss, drop).

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{
    ElectionBackend, ElectionConfig, ElectionError, ElectionEvent, Renewal, Subscribers, backend,
    emit, lock,
};

struct Shared {
    /// When the term began here (the time base of `last_renew`).
    began: Instant,
    /// When the last successful renewal was *sent*, in ns after `began` (the term's local
    /// deadline is this plus the lease duration). An atomic, not a mutex: a child made by
    /// `fork` while the parent's renewer updated it must not find it locked for good.
    last_renew: AtomicU64,
    lost: AtomicBool,
    stop: (Mutex<bool>, Condvar),
}

impl Shared {
    /// Time since the last successful renewal was sent.
    fn since_renewal(&self) -> Duration {
        self.began.elapsed().saturating_sub(Duration::from_nanos(
            self.last_renew.load(Ordering::Acquire),
        ))
    }

    /// Records a successful renewal sent at `sent` (never moves the time back).
    fn renewed(&self, sent: Instant) {
        let ns = sent.saturating_duration_since(self.began).as_nanos();
        self.last_renew
            .fetch_max(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::AcqRel);
    }
}

/// What a renewer needs (shared by the [`Leadership`] and its background thread).
struct Core<B: ElectionBackend> {
    backend: Arc<B>,
    config: Arc<ElectionConfig>,
    term: B::Term,
    shared: Arc<Shared>,
    subscribers: Subscribers,
}

impl<B: ElectionBackend> Core<B> {
    fn token(&self) -> u64 {
        B::token(&self.term)
    }

    /// Marks the term lost (once), announcing it.
    fn mark_lost(&self) {
        if !self.shared.lost.swap(true, Ordering::AcqRel) {
            emit(
                &self.subscribers,
                &ElectionEvent::StoppedLeading {
                    token: self.token(),
                },
            );
        }
    }

    /// Past our own deadline: a standby may lead already. Resign (fenced: a newer term
    /// is never ended) so one can at once, and stop.
    fn expire(&self) {
        if !self.shared.lost.load(Ordering::Acquire) {
            let _ = self.backend.resign(&self.term);
        }
        self.mark_lost();
    }

    fn expired(&self) -> bool {
        self.shared.since_renewal() > self.config.lease_duration
    }

    fn renew(&self) -> Result<(), ElectionError> {
        let lost = ElectionError::Lost {
            token: self.token(),
        };
        if self.shared.lost.load(Ordering::Acquire) {
            return Err(lost);
        }
        if self.expired() {
            self.expire();
            return Err(lost);
        }
        let sent = Instant::now();
        match self.backend.renew(&self.term) {
            Ok(true) => {
                self.shared.renewed(sent);
                Ok(())
            }
            Ok(false) => {
                self.mark_lost();
                Err(lost)
            }
            Err(e) => Err(backend(e)),
        }
    }

    /// The background renewer's loop: renews every `renew_period` until stopped or lost.
    /// It also looks, once a second, whether the process has any thread of its own left
    /// (`cxc_mmf::orphan`): a renewer must not keep alive, and leading, a process whose
    /// main thread exited and whose other threads all ended.
    fn background(&self) {
        let (m, cv) = &self.shared.stop;
        let mut looks = cxc_mmf::orphan::Looker::new();
        let mut next_renew = Instant::now() + self.config.renew_period;
        let mut stop = lock(m);
        while !*stop {
            let wait = next_renew
                .saturating_duration_since(Instant::now())
                .min(looks.tick());
            let (s, _) = cv
                .wait_timeout(stop, wait)
                .unwrap_or_else(|e| e.into_inner());
            stop = s;
            if *stop {
                break;
            }
            drop(stop);
            looks.tick();
            if Instant::now() >= next_renew {
                next_renew = Instant::now() + self.config.renew_period;
                // A backend error is retried at the next period; the deadline ends it.
                if let Err(ElectionError::Lost { .. }) = self.renew() {
                    return;
                }
            }
            stop = lock(m);
        }
    }
}

/// A won term. Call [`renew`](Self::renew) from the work loop at least once per lease
/// duration; pass [`token`](Self::token) with every write to a
/// [`FencedResource`](crate::FencedResource).
/// Dropping it resigns if the config says `release_on_cancel`.
#[must_use = "leadership ends (or runs out) when dropped"]
pub struct Leadership<B: ElectionBackend> {
    backend: Arc<B>,
    config: Arc<ElectionConfig>,
    term: B::Term,
    shared: Arc<Shared>,
    subscribers: Subscribers,
    renewer: Option<std::thread::JoinHandle<()>>,
    /// The pid of the process that won the term: a forked child's copy (another pid)
    /// neither joins the parent's renewer thread (it does not exist in the child) nor
    /// resigns.
    proc: u32,
}

impl<B: ElectionBackend> Debug for Leadership<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term)
            .field("lost", &self.shared.lost.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<B: ElectionBackend> Leadership<B> {
    /// A term just won (the caller announced it), without its background renewer: see
    /// [`start_renewer`](Self::start_renewer).
    pub(super) fn begin(
        backend: Arc<B>,
        config: Arc<ElectionConfig>,
        term: B::Term,
        subscribers: Subscribers,
    ) -> Self {
        let shared = Arc::new(Shared {
            began: Instant::now(),
            last_renew: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            stop: (Mutex::new(false), Condvar::new()),
        });
        Leadership {
            backend,
            config,
            term,
            shared,
            subscribers,
            renewer: None,
            proc: cxc_mmf::identity::current_proc(),
        }
    }

    /// Starts the background renewer if the config asks for one.
    ///
    /// # Errors
    /// [`ElectionError::Thread`] if the thread cannot be started (e.g. a pids limit): the
    /// term is then resigned (a standby can lead at once) and marked lost
    /// (`StoppedLeading`), so no term is left that nobody renews.
    pub(super) fn start_renewer(&mut self) -> Result<(), ElectionError> {
        if self.config.renewal != Renewal::Background {
            return Ok(());
        }
        let core = self.core();
        // Registered as the library's (`cxc_mmf::orphan::ours`): it does not count as
        // a thread of the application (a thread the backend starts from it does).
        let spawned = std::thread::Builder::new()
            .name("cxc-election".into())
            .spawn(move || {
                cxc_mmf::orphan::ours();
                core.background()
            });
        match spawned {
            Ok(h) => {
                self.renewer = Some(h);
                Ok(())
            }
            Err(e) => {
                let _ = self.backend.resign(&self.term);
                self.core().mark_lost();
                Err(ElectionError::Thread(e))
            }
        }
    }

    fn core(&self) -> Core<B> {
        Core {
            backend: self.backend.clone(),
            config: self.config.clone(),
            term: self.term,
            shared: self.shared.clone(),
            subscribers: self.subscribers.clone(),
        }
    }

    /// The fencing token of this term: strictly greater for every later term.
    pub fn token(&self) -> u64 {
        B::token(&self.term)
    }

    /// The backend's term.
    pub fn term(&self) -> &B::Term {
        &self.term
    }

    /// Renews the term (the work loop's proof of progress).
    ///
    /// # Errors
    /// [`ElectionError::Lost`] if the term is over — including when the last renewal
    /// is older than the lease duration (the leader then resigns); after it every call
    /// fails the same way. [`ElectionError::Backend`] if the backend failed (retry
    /// before the deadline).
    pub fn renew(&self) -> Result<(), ElectionError> {
        self.core().renew()
    }

    /// Whether the term is still current: not lost, within its local deadline, and
    /// current on the backend.
    ///
    /// # Errors
    /// [`ElectionError::Backend`].
    pub fn is_current(&self) -> Result<bool, ElectionError> {
        let core = self.core();
        if self.shared.lost.load(Ordering::Acquire) {
            return Ok(false);
        }
        if core.expired() {
            core.expire();
            return Ok(false);
        }
        if self.backend.is_current(&self.term).map_err(backend)? {
            Ok(true)
        } else {
            core.mark_lost();
            Ok(false)
        }
    }

    /// Whether the term is known lost (no backend request): also in a forked child, whose
    /// copy of the term never led.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::Acquire) || self.core().expired() || self.forked()
    }

    /// Blocks until the term is lost (`true`: superseded, or its local deadline passed
    /// without renewal; at once in a forked child, whose copy never led) or `timeout`
    /// passes (`false`).
    ///
    /// # Errors
    /// [`ElectionError::Backend`].
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool, ElectionError> {
        let start = Instant::now();
        let core = self.core();
        loop {
            if self.shared.lost.load(Ordering::Acquire) || self.forked() {
                return Ok(true);
            }
            let deadline_in = self
                .config
                .lease_duration
                .saturating_sub(self.shared.since_renewal());
            if deadline_in.is_zero() && core.expired() {
                core.expire();
                return Ok(true);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(false);
            }
            let slice = left.min(deadline_in.max(Duration::from_millis(1)));
            if self.backend.wait_lost(&self.term, slice).map_err(backend)? {
                core.mark_lost();
                return Ok(true);
            }
        }
    }

    /// Ends the term now (resigns), so a standby can lead at once.
    ///
    /// # Errors
    /// [`ElectionError::Lost`] if the term was already over; [`ElectionError::Backend`].
    pub fn step_down(mut self) -> Result<(), ElectionError> {
        self.stop_renewer();
        self.resign_term()
    }

    /// [`step_down`](Self::step_down) through a shared reference, for a term that other
    /// threads use meanwhile (e.g. one blocked in [`wait_lost`](Self::wait_lost), which
    /// then returns `true`): resigns now and tells the background renewer to stop
    /// (without waiting for it; dropping the `Leadership` joins it). A second call, or a
    /// call after `step_down`'s resignation, reports `Lost`.
    ///
    /// # Errors
    /// As [`step_down`](Self::step_down).
    pub fn resign(&self) -> Result<(), ElectionError> {
        self.signal_renewer();
        self.resign_term()
    }

    fn resign_term(&self) -> Result<(), ElectionError> {
        let core = self.core();
        // A term whose local deadline passed without renewal is over, as `renew` says,
        // even if nobody took it over yet: it is still resigned below (a standby then
        // leads at once), and reported `Lost`.
        let was_lost = self.shared.lost.load(Ordering::Acquire) || core.expired();
        if self.forked() {
            // A forked child's copy never leads (the term belongs to the parent's
            // process): nothing to resign.
            core.mark_lost();
            return Err(ElectionError::Lost {
                token: self.token(),
            });
        }
        let resigned = self.backend.resign(&self.term);
        core.mark_lost();
        match resigned {
            Err(e) => Err(backend(e)),
            Ok(true) if !was_lost => Ok(()),
            Ok(_) => Err(ElectionError::Lost {
                token: self.token(),
            }),
        }
    }

    /// Whether this is a forked child's copy of the term.
    fn forked(&self) -> bool {
        self.proc != cxc_mmf::identity::current_proc()
    }

    fn signal_renewer(&self) {
        let (m, cv) = &self.shared.stop;
        *lock(m) = true;
        cv.notify_all();
    }

    fn stop_renewer(&mut self) {
        if let Some(h) = self.renewer.take() {
            if self.forked() {
                // The renewer is a thread of the parent: joining it here would wait
                // forever.
                std::mem::forget(h);
                return;
            }
            self.signal_renewer();
            let _ = h.join();
        }
    }
}

impl<B: ElectionBackend> Drop for Leadership<B> {
    fn drop(&mut self) {
        self.stop_renewer();
        if self.config.release_on_cancel
            && !self.forked()
            && !self.shared.lost.load(Ordering::Acquire)
        {
            let _ = self.backend.resign(&self.term);
        }
        self.core().mark_lost();
    }
}

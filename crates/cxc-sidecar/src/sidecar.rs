//! [`Sidecar`]: the registry of observed instances, the poll that drains their rings and
//! runs their policies, and the optional background thread ([`SidecarThread`]).
//!
//! # Locking
//! Two kinds of locks, both held only for bookkeeping, never while user code runs (policy
//! callbacks, `AdaptiveInstance` methods, or drops of policies and instances):
//! - the registry (`Sidecar::slots`): the list of registered instances;
//! - one state lock per instance: its ring cursor, stats and policy.
//!
//! A poll snapshots the registry, then for each instance: marks it busy (an instance
//! already being polled by a concurrent poll is skipped), drains its ring, updates its
//! stats, *takes the policy out*, calls it with no lock held, applies its decision, and
//! puts the policy back (unless `set_policy` replaced it meanwhile). So a policy may
//! register or drop [`SidecarBox`](crate::SidecarBox)es, set policies, or even call
//! [`Sidecar::poll`] without deadlocking.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxc_mmf::Kind;

use crate::handshake::Strategy;
use crate::instance::{AdaptiveInstance, InstanceId};
use crate::policy::Policy;
use crate::ring::Observation;
use crate::stats::Stats;

/// Shortest interval of the background thread.
const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// Observes registered [`AdaptiveInstance`]s: drains their rings, keeps [`Stats`], runs
/// their [`Policy`]s and applies the strategies they choose.
///
/// There is one process-global sidecar ([`Sidecar::global`]), which
/// [`SidecarBox::new`](crate::SidecarBox::new) registers with. Nothing runs by itself:
/// call [`poll`](Self::poll) or start a background thread with [`spawn`](Self::spawn).
/// Separate sidecars ([`Sidecar::new`]) are for tests and special set-ups.
///
/// # Examples
/// ```standalone_crate
/// use std::time::Duration;
/// use cxc_sidecar::Sidecar;
///
/// let thread = Sidecar::global().spawn(Duration::from_millis(100))?;
/// // ... register instances with `SidecarBox::new`; the thread polls them ...
/// drop(thread); // stops and joins the thread
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Sidecar {
    slots: Mutex<Vec<Arc<Slot>>>,
    next_id: AtomicU64,
}

/// One registered instance.
struct Slot {
    id: InstanceId,
    instance: Weak<dyn AdaptiveInstance>,
    /// Set while a poll processes this instance.
    busy: AtomicBool,
    state: Mutex<SlotState>,
}

struct SlotState {
    cursor: u64,
    stats: Stats,
    /// `None` while a poll has taken it out to call it.
    policy: Option<Box<dyn Policy>>,
    policy_name: Option<String>,
    /// Bumped by every `set_policy`/`clear_policy`.
    policy_epoch: u64,
}

/// What one [`Sidecar::poll`] did.
#[derive(Debug, Clone, Default)]
pub struct PollReport {
    /// One entry per instance processed by this poll.
    pub instances: Vec<InstanceReport>,
}

impl PollReport {
    /// The entry of instance `id`, if this poll processed it.
    pub fn get(&self, id: InstanceId) -> Option<&InstanceReport> {
        self.instances.iter().find(|r| r.id == id)
    }

    /// Observations drained from all instances.
    pub fn observed(&self) -> usize {
        self.instances.iter().map(|r| r.observations.len()).sum()
    }
}

/// What one poll did for one instance.
#[derive(Debug, Clone)]
pub struct InstanceReport {
    /// The instance.
    pub id: InstanceId,
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Observations recorded since the previous poll, in order.
    pub observations: Vec<Observation>,
    /// Observations lost since the previous poll (overwritten, unfinished or torn).
    pub lost: u64,
    /// The strategy the policy chose and its generation, if it changed one.
    pub applied: Option<(Strategy, u32)>,
}

/// A snapshot of one registered instance ([`Sidecar::instances`]).
#[derive(Debug, Clone)]
pub struct InstanceInfo {
    /// The instance.
    pub id: InstanceId,
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// The strategy in its file.
    pub strategy: Strategy,
    /// The strategy's generation.
    pub generation: u32,
    /// The name of its policy, if it has one.
    pub policy: Option<String>,
    /// Its stats as of the last poll.
    pub stats: Stats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while these locks are held (no user code runs under them),
    // but do not let one poison the sidecar.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Clears a slot's busy flag, also when a poll unwinds.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Default for Sidecar {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("instances", &self.len())
            .finish_non_exhaustive()
    }
}

static GLOBAL: Sidecar = Sidecar::new();

impl Sidecar {
    /// A sidecar with no instances. Most programs use [`Sidecar::global`] instead.
    pub const fn new() -> Self {
        Sidecar {
            slots: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
        }
    }

    /// The process-global sidecar.
    pub fn global() -> &'static Sidecar {
        &GLOBAL
    }

    /// Registers an instance (weakly: the caller keeps it alive and calls
    /// [`unregister`](Self::unregister) when done; [`SidecarBox`](crate::SidecarBox) does
    /// both). Observations recorded before registration are not reported.
    pub fn register(
        &self,
        instance: Weak<dyn AdaptiveInstance>,
        policy: Option<Box<dyn Policy>>,
    ) -> InstanceId {
        let cursor = instance.upgrade().map_or(0, |i| i.ring().head());
        let policy_name = policy.as_ref().map(|p| p.name().to_owned());
        let id = InstanceId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let slot = Arc::new(Slot {
            id,
            instance,
            busy: AtomicBool::new(false),
            state: Mutex::new(SlotState {
                cursor,
                stats: Stats::default(),
                policy,
                policy_name,
                policy_epoch: 0,
            }),
        });
        lock(&self.slots).push(slot);
        id
    }

    /// Removes an instance; `false` if it was not registered. A poll already processing
    /// it finishes with it. Never blocks on a poll, so it may be called from a policy.
    pub fn unregister(&self, id: InstanceId) -> bool {
        let removed = {
            let mut slots = lock(&self.slots);
            slots
                .iter()
                .position(|s| s.id == id)
                .map(|i| slots.swap_remove(i))
        };
        // Dropped here, outside the registry lock: it may drop a policy (user code).
        removed.is_some()
    }

    fn slot(&self, id: InstanceId) -> Option<Arc<Slot>> {
        lock(&self.slots).iter().find(|s| s.id == id).cloned()
    }

    fn snapshot(&self) -> Vec<Arc<Slot>> {
        lock(&self.slots).clone()
    }

    /// Sets (replaces) the policy of instance `id`; `false` if it is not registered.
    pub fn set_policy(&self, id: InstanceId, policy: Box<dyn Policy>) -> bool {
        self.replace_policy(id, Some(policy))
    }

    /// Removes the policy of instance `id`; `false` if it is not registered.
    pub fn clear_policy(&self, id: InstanceId) -> bool {
        self.replace_policy(id, None)
    }

    fn replace_policy(&self, id: InstanceId, policy: Option<Box<dyn Policy>>) -> bool {
        let Some(slot) = self.slot(id) else {
            return false;
        };
        let name = policy.as_ref().map(|p| p.name().to_owned());
        let old = {
            let mut st = lock(&slot.state);
            st.policy_epoch += 1;
            st.policy_name = name;
            std::mem::replace(&mut st.policy, policy)
        };
        drop(old);
        true
    }

    /// Number of registered instances.
    pub fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Whether no instance is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stats of instance `id` as of its last poll.
    pub fn stats(&self, id: InstanceId) -> Option<Stats> {
        let slot = self.slot(id)?;
        let stats = lock(&slot.state).stats.clone();
        Some(stats)
    }

    /// A snapshot of every registered (and still alive) instance.
    pub fn instances(&self) -> Vec<InstanceInfo> {
        let mut out = Vec::new();
        for slot in self.snapshot() {
            let Some(inst) = slot.instance.upgrade() else {
                continue;
            };
            let (kind, name) = (inst.kind(), inst.name());
            let (strategy, generation) = inst.handshake().current();
            let (policy, stats) = {
                let st = lock(&slot.state);
                (st.policy_name.clone(), st.stats.clone())
            };
            out.push(InstanceInfo {
                id: slot.id,
                kind,
                name,
                strategy,
                generation,
                policy,
                stats,
            });
        }
        out
    }

    /// Drains the new observations of every registered instance, updates their stats,
    /// runs their policies and applies the strategies chosen. Instances another poll is
    /// processing at the same moment are skipped. Never blocks on anything but short
    /// bookkeeping locks.
    pub fn poll(&self) -> PollReport {
        let mut report = PollReport::default();
        for slot in self.snapshot() {
            if slot.instance.strong_count() == 0 {
                // Registered with `register` and dropped without `unregister`.
                self.unregister(slot.id);
                continue;
            }
            // A panicking instance method must not take the polling thread down.
            if let Ok(Some(r)) = catch_unwind(AssertUnwindSafe(|| poll_one(&slot))) {
                report.instances.push(r);
            }
        }
        report
    }

    /// Starts a background thread that polls every `interval` (at least 1 ms) until the
    /// returned handle is dropped or [`stopped`](SidecarThread::stop).
    ///
    /// The thread (named `cxc-sidecar`) also looks once a second whether the process has
    /// a thread of its own left (`cxc_mmf::orphan`): in a process whose main thread
    /// exited and whose other threads all ended it ends the process, as its last thread
    /// would have, instead of polling for ever.
    ///
    /// # Errors
    /// The OS error if the thread cannot be created.
    pub fn spawn(&'static self, interval: Duration) -> std::io::Result<SidecarThread> {
        let interval = interval.max(MIN_INTERVAL);
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("cxc-sidecar".into())
            .spawn(move || {
                // It must not keep alive a process none of whose own threads is left
                // (a handle left on an exited main thread's stack is never dropped).
                cxc_mmf::orphan::ours();
                let mut looks = cxc_mmf::orphan::Looker::new();
                let mut next_poll = Instant::now();
                loop {
                    if Instant::now() >= next_poll {
                        let _ = self.poll();
                        next_poll = Instant::now() + interval;
                    }
                    let wait = next_poll
                        .saturating_duration_since(Instant::now())
                        .min(looks.tick());
                    match rx.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        // Stop requested (or the handle is gone).
                        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            })?;
        Ok(SidecarThread {
            stop: Some(tx),
            handle: Some(handle),
        })
    }
}

/// Polls one instance (see the module docs for the locking).
fn poll_one(slot: &Slot) -> Option<InstanceReport> {
    if slot.busy.swap(true, Ordering::Acquire) {
        return None;
    }
    let _busy = Busy(&slot.busy);
    let instance = slot.instance.upgrade()?;
    let cursor = lock(&slot.state).cursor;
    let mut batch = instance.ring().read_since(cursor);
    let counters = instance.counters();
    let (kind, name) = (instance.kind(), instance.name());
    let (strategy, generation) = instance.handshake().current();
    let (mut policy, epoch, stats) = {
        let mut st = lock(&slot.state);
        st.cursor = batch.next;
        st.stats.absorb(&batch);
        st.stats.counters = counters;
        st.stats.strategy = strategy;
        st.stats.generation = generation;
        let policy = st.policy.take();
        let stats = policy.is_some().then(|| st.stats.clone());
        (policy, st.policy_epoch, stats)
    };
    let mut applied = None;
    let mut panicked = false;
    if let (Some(p), Some(stats)) = (policy.as_mut(), stats.as_ref()) {
        let decided = catch_unwind(AssertUnwindSafe(|| {
            match p.observe(&batch.observations, stats) {
                Some(s) if s.normalized() != strategy => Some((s.normalized(), instance.apply(s))),
                _ => None,
            }
        }));
        match decided {
            Ok(a) => applied = a,
            Err(_) => panicked = true,
        }
    }
    let (leftover, _exported) = {
        let mut st = lock(&slot.state);
        if let Some((s, g)) = applied {
            st.stats.strategy_changes += 1;
            st.stats.strategy = s;
            st.stats.generation = g;
        }
        if panicked {
            st.stats.policy_panics += 1;
        }
        let replaced = st.policy_epoch != epoch;
        if panicked && !replaced {
            st.policy_name = None;
        }
        if !panicked && !replaced {
            st.policy = policy.take();
        }
        (policy, cfg!(feature = "metrics").then(|| st.stats.clone()))
    };
    // A replaced or panicked policy is dropped here, with no lock held.
    drop(leftover);
    #[cfg(feature = "metrics")]
    if let Some(stats) = &_exported {
        crate::export::export(kind, &name, stats);
    }
    Some(InstanceReport {
        id: slot.id,
        kind,
        name,
        observations: std::mem::take(&mut batch.observations),
        lost: batch.lost,
        applied,
    })
}

/// The background thread of a [`Sidecar`] ([`Sidecar::spawn`]). Dropping it stops the
/// thread promptly (it does not wait for the next interval) and joins it.
#[derive(Debug)]
pub struct SidecarThread {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl SidecarThread {
    /// Stops and joins the thread (the same as dropping the handle).
    pub fn stop(self) {
        drop(self);
    }

    /// Whether the thread is still running.
    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for SidecarThread {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            // Dropped by a policy running on the sidecar thread itself: it stops after
            // this poll; joining itself would deadlock.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

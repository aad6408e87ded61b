//! Python bindings of cxc: `cxc.Lease`, `cxc.Semaphore`, `cxc.HeartbeatTable`,
//! `cxc.Watchdog`, `cxc.Elector` (module `cxc._cxc`; the Python package `cxc` adds the
//! asyncio coroutines and the exception classes, see `python/cxc/`).
//!
//! Blocking calls release the GIL and wait in slices of [`SLICE`], checking for signals
//! (Ctrl-C) between slices. The asyncio coroutines await an [`AsyncWaiter`]: the Rust
//! future of the `async` feature, polled on the event loop's thread and woken through
//! `loop.call_soon_threadsafe` (docs/python.md).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cxc::election::{IDENTITY_MAX, LeaderRecord, MmapElectionError};
use cxc::{
    ElectionConfig, ElectionError, Elector, FailoverWatchdog, GuardError, HeartbeatError,
    HeartbeatTable, Leadership, LeaseError, MmapElection, MmfError, OwnedLeaseGuard,
    OwnedRegistration, OwnerLease, SemaphoreError, SemaphoreOptions, SharedSemaphore,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyType};

/// The lease payload: 48 raw bytes.
type Payload = [u8; 48];

/// How long a blocking call waits without the GIL before it checks for signals.
const SLICE: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------
// Errors: the classes live in `cxc/_errors.py` (multiple inheritance is simpler there).

static ERRORS: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

fn err_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS.get_or_try_init(py, || Ok::<_, PyErr>(py.import("cxc._errors")?.unbind()))?;
    Ok(m.bind(py).getattr(name)?.downcast_into::<PyType>()?)
}

fn raise(
    name: &str,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>>,
) -> PyErr {
    Python::with_gil(|py| {
        let made = err_class(py, name).and_then(|cls| {
            let a = args(py)?;
            cls.call1(a.downcast_into::<pyo3::types::PyTuple>()?)
        });
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

fn error(name: &str, msg: String) -> PyErr {
    raise(name, move |py| Ok((msg,).into_pyobject(py)?.into_any()))
}

fn file_error(e: &MmfError, fallback: &std::path::Path) -> PyErr {
    let (errno, path) = match e {
        MmfError::NotFound { path } => (Some(2), path.clone()),
        MmfError::AlreadyExists { path } => (Some(17), path.clone()),
        MmfError::Io { path, source, .. } => (source.raw_os_error(), path.clone()),
        _ => (None, fallback.to_path_buf()),
    };
    let msg = e.to_string();
    raise("FileError", move |py| {
        Ok(
            (errno.unwrap_or(0), msg, path.to_string_lossy().into_owned())
                .into_pyobject(py)?
                .into_any(),
        )
    })
}

fn lease_error(e: LeaseError, path: &std::path::Path) -> PyErr {
    match e {
        LeaseError::File(f) => file_error(&f, path),
        LeaseError::InvalidOption(_) => PyValueError::new_err(e.to_string()),
        other => error("Error", other.to_string()),
    }
}

fn sem_error(e: SemaphoreError, path: &std::path::Path) -> PyErr {
    match e {
        SemaphoreError::File(f) => file_error(&f, path),
        other => error("Error", other.to_string()),
    }
}

fn hb_error(e: HeartbeatError, path: &std::path::Path) -> PyErr {
    match e {
        HeartbeatError::File(f) => file_error(&f, path),
        HeartbeatError::Fenced { .. } => error("LostError", e.to_string()),
        other => error("Error", other.to_string()),
    }
}

fn guard_error(e: GuardError) -> PyErr {
    match e {
        GuardError::Lost { .. } => error("LostError", e.to_string()),
        GuardError::Inconsistent => error("InconsistentError", e.to_string()),
        other => error("Error", other.to_string()),
    }
}

fn timeout_error(what: &str, t: Duration) -> PyErr {
    error(
        "Timeout",
        format!("{what}: not acquired within {:.3} s", t.as_secs_f64()),
    )
}

fn released(what: &str) -> PyErr {
    error("Error", format!("this {what} was already released"))
}

/// A timeout in seconds: `None` is no limit, a negative one is 0 (do not wait); NaN and
/// values too large for a `Duration` raise `ValueError`.
fn duration(secs: Option<f64>) -> PyResult<Option<Duration>> {
    secs.map(|s| {
        if s.is_nan() {
            return Err(PyValueError::new_err("invalid timeout: nan"));
        }
        Duration::try_from_secs_f64(s.max(0.0))
            .map_err(|_| PyValueError::new_err(format!("invalid timeout: {s}")))
    })
    .transpose()
}

/// A `grace` (a lease duration) in seconds: zero, negative and NaN values raise
/// `ValueError` (a zero grace would let any process supersede a live holder within a
/// millisecond of its last beat), and so do values too large for the clock.
fn grace_duration(secs: f64) -> PyResult<Duration> {
    if secs.is_nan() || secs <= 0.0 {
        return Err(PyValueError::new_err(format!(
            "invalid grace: {secs} (seconds, more than 0)"
        )));
    }
    let grace = duration(Some(secs))?.unwrap_or_default();
    // Kept in whole milliseconds (the lease clock's tick) as 63-bit counts.
    if grace.as_millis() >= u128::from(u64::MAX >> 1) {
        return Err(PyValueError::new_err(format!(
            "invalid grace: {secs} (too long)"
        )));
    }
    Ok(grace)
}

/// Locks one of the binding's `std::sync::Mutex`es. Each is held only with the GIL and
/// never across anything that may let the GIL go (no `unblocked`, no Python code, no
/// Python object built or dropped under it), so no other thread can `os.fork()` while
/// it is held (forking from Python needs the GIL) and a child never inherits one locked.
/// State that a call holds without the GIL is behind cxc's fork-safe locks instead (the
/// watchdog's scan state).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// Blocking waits

/// Set once the interpreter's exit ran its last `atexit` hook (see [`ExitGuard`]): from
/// then on only the exiting thread may take the GIL. Only daemon threads still run then
/// besides the exiting thread (non-daemon ones were joined before `atexit`).
static EXITING: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// Whether this thread runs the interpreter's exit (and may still use cxc normally
    /// after its `atexit` hooks, e.g. in finalizers).
    static EXIT_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Threads other than the exiting one that are about to take the GIL back, or hold it
/// for a call that may release and retake it ([`unblocked`] after its wait, [`deliver`]).
static WANT_GIL: AtomicUsize = AtomicUsize::new(0);

/// Registered with `atexit` at import as a callable that does nothing, and owned by
/// `atexit` alone: CPython drops it when it clears its callbacks, which it does right
/// after it ran the *last* of them (`atexit_callfuncs` ends with `atexit_cleanup`, from
/// 3.9 to 3.14; a hook registered while they run is not run, and dropped there too) and
/// before it marks the runtime finalizing (from which point a thread other than the
/// exiting one that takes the GIL is ended by `pthread_exit`). Its drop is the exit
/// handshake with [`announce_gil`]. (A program that calls the private
/// `atexit._run_exitfuncs()` or `atexit._clear()` itself starts it then, as it ran the
/// package's hook before.)
///
/// The hook's own place in the `atexit` order does not matter: a hook registered before
/// `cxc` was imported runs after this one (`atexit` is LIFO) and may still stop and join
/// a worker thread that uses cxc (`test_attack5.py`). An earlier design set [`EXITING`]
/// in the hook itself, and such a worker then parked for good in its next call: the
/// exit hung.
#[pyclass(module = "cxc._cxc", frozen)]
struct ExitGuard;

#[pymethods]
impl ExitGuard {
    fn __call__(&self) {}
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        interpreter_exiting();
    }
}

/// The exit handshake (run by [`ExitGuard`]'s drop, on the exiting thread, GIL held).
fn interpreter_exiting() {
    EXIT_THREAD.with(|t| t.set(true));
    // SYNC: exit handshake with `announce_gil` (SeqCst on both sides: either a thread
    // sees EXITING and never takes the GIL, or we see it counted and wait for it).
    EXITING.store(true, Ordering::SeqCst);
    if WANT_GIL.load(Ordering::SeqCst) == 0 {
        return;
    }
    // A thread that passed its check just before: let it take the GIL now, while that is
    // still safe, and finish (bounded, so a stuck one never holds the exit up for long).
    // `with_gil` only borrows the GIL this thread holds (a dealloc runs with it).
    Python::with_gil(|py| {
        py.allow_threads(|| {
            let until = Instant::now() + Duration::from_secs(1);
            while WANT_GIL.load(Ordering::SeqCst) > 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    });
}

/// Before a thread other than the exiting one takes the GIL (back): counts it in
/// [`WANT_GIL`], or, once the interpreter's exit ran its last `atexit` hook ([`EXITING`]),
/// sleeps until the process ends instead. CPython up to 3.13 ends a thread that takes the
/// GIL during finalization with `pthread_exit`, whose forced unwinding through Rust frames
/// aborts the whole process ("FATAL: exception not rethrown"). The caller calls
/// [`gil_taken`] once it no longer needs the GIL back.
fn announce_gil() {
    if EXIT_THREAD.with(|t| t.get()) {
        return;
    }
    // SYNC: exit handshake with `interpreter_exiting`.
    WANT_GIL.fetch_add(1, Ordering::SeqCst);
    if EXITING.load(Ordering::SeqCst) {
        WANT_GIL.fetch_sub(1, Ordering::SeqCst);
        loop {
            std::thread::park();
        }
    }
}

/// Ends what [`announce_gil`] began.
fn gil_taken() {
    if !EXIT_THREAD.with(|t| t.get()) {
        WANT_GIL.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `f` without the GIL (`allow_threads`), then takes it back through
/// [`announce_gil`]: a daemon thread still blocked in a wait when the program exits
/// sleeps until the process is gone instead of aborting it (`test_attack2.py`,
/// `test_daemon_thread_blocked_in_a_wait_does_not_abort_the_exit`). Before this was a
/// handshake, a wait whose slice ended just as `atexit` ran still aborted (3 of 40 exits
/// of its `wait_lost` case).
fn unblocked<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    let r = py.allow_threads(|| {
        let r = f();
        announce_gil();
        r
    });
    gil_taken();
    r
}

/// Waits for `attempt` to succeed in slices, without the GIL, checking signals between
/// slices. `slice(left)` blocks at most `left` and returns `Some`
/// when acquired.
fn wait_sliced<G: Send>(
    py: Python<'_>,
    timeout: Option<Duration>,
    mut slice: impl FnMut(Duration) -> Option<G> + Send,
) -> PyResult<Option<G>> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        };
        if let Some(g) = unblocked(py, || slice(left)) {
            return Ok(Some(g));
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

/// Wakes a thread parked in [`wait_sliced`]'s lease slice.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

// ---------------------------------------------------------------------------------------
// Lease

/// A cross-process mutex in a file, whose holder's crash or hang releases it.
#[pyclass(module = "cxc._cxc", subclass, frozen)]
#[derive(Debug)]
struct Lease {
    inner: Arc<OwnerLease<Payload>>,
    path: PathBuf,
}

impl Lease {
    /// Blocks for the lease: `try_lock_owned` first, then the owned lock future polled
    /// on this thread (parked between wake-ups), in slices.
    fn acquire(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
    ) -> PyResult<Option<OwnedLeaseGuard<Payload>>> {
        if let Some(g) = self.inner.clone().try_lock_owned() {
            return Ok(Some(g));
        }
        let mut fut = Box::pin(self.inner.clone().lock_owned_async());
        // The waker is made on the first slice: `unblocked` runs it on this same thread.
        let mut waker: Option<Waker> = None;
        wait_sliced(py, timeout, move |left| {
            let w =
                waker.get_or_insert_with(|| Waker::from(Arc::new(Unpark(std::thread::current()))));
            let mut cx = Context::from_waker(w);
            let end = Instant::now() + left;
            loop {
                if let Poll::Ready(g) = Pin::as_mut(&mut fut).poll(&mut cx) {
                    return Some(g);
                }
                let now = Instant::now();
                if now >= end {
                    return None;
                }
                std::thread::park_timeout(end - now);
            }
        })
    }
}

#[pymethods]
impl Lease {
    #[new]
    #[pyo3(signature = (path, *, create = true, grace = 1.0))]
    fn new(py: Python<'_>, path: PathBuf, create: bool, grace: f64) -> PyResult<Self> {
        let grace = grace_duration(grace)?;
        let lease = unblocked(py, || {
            let b = OwnerLease::builder(&path).grace(grace);
            if create {
                b.create_or_open([0u8; 48]).map(|(l, _)| l)
            } else {
                b.open()
            }
        })
        .map_err(|e| lease_error(e, &path))?;
        Ok(Lease {
            inner: Arc::new(lease),
            path,
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Blocks until the lease is held (at most `timeout` seconds; `None`: forever) and
    /// returns the guard. Raises `cxc.Timeout` (a `TimeoutError`) on timeout.
    #[pyo3(signature = (timeout = None))]
    fn lock(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<LeaseGuard> {
        let t = duration(timeout)?;
        match self.acquire(py, t)? {
            Some(g) => Ok(LeaseGuard::new(g)),
            None => Err(timeout_error("lease", t.unwrap_or_default())),
        }
    }

    /// The guard if the lease is free (or its holder dead or stale), else `None`.
    fn try_lock(&self) -> Option<LeaseGuard> {
        self.inner.clone().try_lock_owned().map(LeaseGuard::new)
    }

    /// For the coroutine `Lease.lock_async`: a waiter whose Rust future
    /// (`lock_owned_async`) is polled by the event loop.
    fn _async_waiter(&self) -> AsyncWaiter {
        let lease = self.inner.clone();
        AsyncWaiter::new(Box::pin(async move {
            Got::Lease(lease.lock_owned_async().await)
        }))
    }

    fn __repr__(&self) -> String {
        format!("cxc.Lease({:?})", self.path)
    }
}

/// A held lease; a context manager. Leaving the `with` block (or `release()`) releases.
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct LeaseGuard {
    guard: Mutex<Option<OwnedLeaseGuard<Payload>>>,
    token: u64,
}

impl LeaseGuard {
    fn new(g: OwnedLeaseGuard<Payload>) -> Self {
        LeaseGuard {
            token: g.token(),
            guard: Mutex::new(Some(g)),
        }
    }

    /// Runs `f` on the guard; the Python error is made once the lock is let go (see
    /// [`lock`]).
    fn with<R>(
        &self,
        f: impl FnOnce(&OwnedLeaseGuard<Payload>) -> Result<R, GuardError>,
    ) -> PyResult<R> {
        let r = lock(&self.guard).as_ref().map(f);
        match r {
            Some(r) => r.map_err(guard_error),
            None => Err(released("lease guard")),
        }
    }
}

#[pymethods]
impl LeaseGuard {
    /// The fencing token of this claim (grows with every claim of the file).
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// The 48-byte payload. Raises `LostError` if the claim was lost,
    /// `InconsistentError` if the previous holder died mid-update (write a value or call
    /// `acknowledge_inconsistent()`).
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.with(|g| g.read())?;
        Ok(PyBytes::new(py, &v))
    }

    /// Publishes `data` (at most 48 bytes, zero-padded to 48) in one atomic step.
    fn write(&self, data: &[u8]) -> PyResult<()> {
        if data.len() > 48 {
            return Err(PyValueError::new_err(format!(
                "the lease payload holds at most 48 bytes, got {}",
                data.len()
            )));
        }
        let mut v = [0u8; 48];
        v[..data.len()].copy_from_slice(data);
        self.with(|g| g.write(v))
    }

    /// Refreshes the holder's heartbeat (a holder must beat within the lease's grace, or
    /// another process may take the lease over).
    fn beat(&self) -> PyResult<()> {
        self.with(|g| g.beat())
    }

    /// Whether this claim still holds the lease.
    fn is_current(&self) -> bool {
        lock(&self.guard).as_ref().is_some_and(|g| g.is_current())
    }

    /// Whether this claim took over from a holder that died mid-update.
    #[getter]
    fn payload_may_be_inconsistent(&self) -> PyResult<bool> {
        self.with(|g| Ok(g.payload_may_be_inconsistent()))
    }

    /// Accepts the payload as it is after a takeover from a holder that died mid-update.
    fn acknowledge_inconsistent(&self) -> PyResult<()> {
        self.with(|g| {
            g.acknowledge_inconsistent();
            Ok(())
        })
    }

    /// Whether the guard was released (by `release()` or the `with` block).
    #[getter]
    fn released(&self) -> bool {
        lock(&self.guard).is_none()
    }

    /// Releases the lease. Raises `LostError` if the claim had been lost meanwhile;
    /// a second call does nothing.
    fn release(&self) -> PyResult<()> {
        let g = lock(&self.guard).take();
        match g {
            Some(g) => g.unlock().map_err(guard_error),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases; a lost claim raises `LostError` unless an exception is propagating.
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let r = self.release();
        if exc_type.is_none_or(|t| t.is_none()) {
            r?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cxc.LeaseGuard token={}{}>",
            self.token,
            if self.released() { " released" } else { "" }
        )
    }
}

// ---------------------------------------------------------------------------------------
// Semaphore

/// A counting semaphore in a file; a dead holder's permits come back.
#[pyclass(module = "cxc._cxc", subclass, frozen)]
#[derive(Debug)]
struct Semaphore {
    inner: Arc<SharedSemaphore>,
    path: PathBuf,
    /// When `try_acquire` last looked for dead holders (rate limit).
    reclaimed_at: Mutex<Option<Instant>>,
}

/// How often a failing `try_acquire` looks for dead holders' permits (as a blocked
/// acquirer does).
const RECLAIM_EVERY: Duration = Duration::from_millis(20);

impl Semaphore {
    fn acquire_inner(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
    ) -> PyResult<Option<HeldPermit>> {
        if let Some(p) = HeldPermit::try_acquire(&self.inner) {
            return Ok(Some(p));
        }
        let sem = self.inner.clone();
        wait_sliced(py, timeout, move |left| {
            let p = sem.acquire_timeout(left)?;
            std::mem::forget(p);
            Some(HeldPermit::taken(sem.clone()))
        })
    }
}

#[pymethods]
impl Semaphore {
    #[new]
    #[pyo3(signature = (path, permits, *, create = true))]
    fn new(py: Python<'_>, path: PathBuf, permits: u32, create: bool) -> PyResult<Self> {
        let sem = unblocked(py, || {
            if create {
                SharedSemaphore::create_or_open(
                    &path,
                    permits,
                    permits,
                    &SemaphoreOptions::default(),
                )
                .map(|(s, _)| s)
            } else {
                SharedSemaphore::open(&path)
            }
        })
        .map_err(|e| sem_error(e, &path))?;
        if !create && sem.max_permits() != permits {
            return Err(error(
                "Error",
                format!(
                    "{}: the semaphore has {} permits, not {permits}",
                    path.display(),
                    sem.max_permits()
                ),
            ));
        }
        Ok(Semaphore {
            inner: Arc::new(sem),
            path,
            reclaimed_at: Mutex::new(None),
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Free permits now.
    #[getter]
    fn available(&self) -> u32 {
        self.inner.available()
    }

    /// The permit count the file was created with.
    #[getter]
    fn max_permits(&self) -> u32 {
        self.inner.max_permits()
    }

    /// Blocks for a permit (at most `timeout` seconds; `None`: forever). Raises
    /// `cxc.Timeout` (a `TimeoutError`) on timeout.
    #[pyo3(signature = (timeout = None))]
    fn acquire(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<SemaphorePermit> {
        let t = duration(timeout)?;
        match self.acquire_inner(py, t)? {
            Some(p) => Ok(SemaphorePermit::new(p)),
            None => Err(timeout_error("semaphore", t.unwrap_or_default())),
        }
    }

    /// A permit if one is free now, else `None`. When none is free it first returns
    /// dead holders' permits to the pool (at most every 20 ms per handle, as a blocked
    /// acquirer does), so a killed holder's permit is found without a blocking call.
    fn try_acquire(&self, py: Python<'_>) -> Option<SemaphorePermit> {
        if let Some(p) = HeldPermit::try_acquire(&self.inner) {
            return Some(SemaphorePermit::new(p));
        }
        let due = {
            let mut at = lock(&self.reclaimed_at);
            let due = at.is_none_or(|t| t.elapsed() >= RECLAIM_EVERY);
            if due {
                *at = Some(Instant::now());
            }
            due
        };
        if due && unblocked(py, || self.inner.reclaim_dead()) > 0 {
            return HeldPermit::try_acquire(&self.inner).map(SemaphorePermit::new);
        }
        None
    }

    /// Returns the permits of holders that died (their whole process gone) to the pool;
    /// the number returned. A blocked `acquire` does this by itself.
    fn reclaim_dead(&self, py: Python<'_>) -> u32 {
        unblocked(py, || self.inner.reclaim_dead())
    }

    /// For the coroutine `Semaphore.acquire_async`: a waiter whose Rust future
    /// (`acquire_async`) is polled by the event loop.
    fn _async_waiter(&self) -> AsyncWaiter {
        let sem = self.inner.clone();
        AsyncWaiter::new(Box::pin(async move {
            // The permit borrows `sem` (owned by this future); it is forgotten and
            // returned by the `HeldPermit`, as `try_acquire_owned` does.
            std::mem::forget(sem.acquire_async().await);
            Got::Permit(HeldPermit::taken(sem))
        }))
    }

    fn __repr__(&self) -> String {
        format!(
            "cxc.Semaphore({:?}, {})",
            self.path,
            self.inner.max_permits()
        )
    }
}

/// A permit held by this process that owns its `Arc` (as `OwnedPermit`, which has no
/// public constructor from a forgotten `Permit`); dropping it returns the permit.
/// A copy inherited by a forked child stays the parent's: dropping it there returns
/// nothing (the child's own permits are not touched).
#[derive(Debug)]
struct HeldPermit {
    sem: Arc<SharedSemaphore>,
    /// The process that took it.
    proc: u32,
}

impl HeldPermit {
    /// A permit this process just took (and forgot).
    fn taken(sem: Arc<SharedSemaphore>) -> Self {
        HeldPermit {
            sem,
            proc: std::process::id(),
        }
    }

    fn try_acquire(sem: &Arc<SharedSemaphore>) -> Option<Self> {
        std::mem::forget(sem.try_acquire()?);
        Some(HeldPermit::taken(sem.clone()))
    }
}

impl Drop for HeldPermit {
    fn drop(&mut self) {
        if self.proc == std::process::id() {
            // Cannot fail for a permit this process took (see `Permit`'s `Drop`).
            let _ = self.sem.release();
        }
    }
}

/// One held permit; a context manager. Leaving the `with` block (or `release()`)
/// returns it.
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct SemaphorePermit(Mutex<Option<HeldPermit>>);

impl SemaphorePermit {
    fn new(p: HeldPermit) -> Self {
        SemaphorePermit(Mutex::new(Some(p)))
    }
}

#[pymethods]
impl SemaphorePermit {
    /// Returns the permit; a second call does nothing.
    fn release(&self) {
        let p = lock(&self.0).take();
        drop(p);
    }

    /// Whether the permit was returned.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.0).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<cxc.SemaphorePermit{}>",
            if self.released() { " released" } else { "" }
        )
    }
}

// ---------------------------------------------------------------------------------------
// Heartbeat table and watchdog

/// A table of worker heartbeats and in-flight work bits (manual epochs: each watchdog
/// scan is one epoch).
#[pyclass(module = "cxc._cxc", name = "HeartbeatTable", frozen)]
#[derive(Debug)]
struct HeartbeatTableHandle {
    inner: Arc<HeartbeatTable>,
    path: PathBuf,
}

#[pymethods]
impl HeartbeatTableHandle {
    #[new]
    #[pyo3(signature = (path, capacity = 64, *, create = true))]
    fn new(py: Python<'_>, path: PathBuf, capacity: usize, create: bool) -> PyResult<Self> {
        let table = unblocked(py, || {
            if create {
                match HeartbeatTable::create(&path, capacity) {
                    Err(HeartbeatError::File(MmfError::AlreadyExists { .. })) => {
                        HeartbeatTable::open(&path, capacity)
                    }
                    r => r,
                }
            } else {
                HeartbeatTable::open(&path, capacity)
            }
        })
        .map_err(|e| hb_error(e, &path))?;
        Ok(Self {
            inner: Arc::new(table),
            path,
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The number of slots.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// Registers this process (or `pid`) and returns its `Registration` (a context
    /// manager that unregisters on exit).
    #[pyo3(signature = (pid = None))]
    fn join(&self, pid: Option<u32>) -> PyResult<Registration> {
        let pid = pid.unwrap_or_else(std::process::id);
        let reg = self
            .inner
            .clone()
            .join_owned_as(pid)
            .map_err(|e| hb_error(e, &self.path))?;
        Ok(Registration {
            slot: reg.slot(),
            reg: Mutex::new(Some(reg)),
        })
    }

    /// `(pid, last_seen_epoch, in_flight, fenced)` of `slot`, or `None` if free.
    fn snapshot(&self, slot: usize) -> Option<(u32, u64, u64, bool)> {
        self.inner
            .snapshot(slot)
            .filter(|s| s.pid != 0)
            .map(|s| (s.pid, s.last_seen_epoch, s.in_flight_bitmap, s.fenced))
    }

    fn __repr__(&self) -> String {
        format!(
            "cxc.HeartbeatTable({:?}, {})",
            self.path,
            self.inner.capacity()
        )
    }
}

/// A worker's slot in a heartbeat table: acts only for the registration it made (a
/// later registration of the same slot, even by this process, is never touched).
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct Registration {
    slot: usize,
    /// `None` once released.
    reg: Mutex<Option<OwnedRegistration>>,
}

impl Registration {
    /// Runs `f` on the registration; `cxc.Error` once released, `LostError` when `f`
    /// says the registration was fenced (or its slot reused).
    fn act(
        &self,
        f: impl FnOnce(&OwnedRegistration) -> Result<(), HeartbeatError>,
    ) -> PyResult<()> {
        // The Python error is made once the lock is let go (see [`lock`]).
        let r = lock(&self.reg).as_ref().map(f);
        let Some(r) = r else {
            return Err(released("registration"));
        };
        match r {
            Ok(()) => Ok(()),
            Err(HeartbeatError::BitOutOfRange { .. }) => {
                Err(PyValueError::new_err("bit must be in 0..64"))
            }
            Err(_) => Err(error(
                "LostError",
                format!(
                    "slot {} was fenced: a watchdog reclaimed its work (register again)",
                    self.slot
                ),
            )),
        }
    }
}

#[pymethods]
impl Registration {
    /// The slot index.
    #[getter]
    fn slot(&self) -> usize {
        self.slot
    }

    /// Refreshes the heartbeat; `LostError` if a watchdog fenced this worker.
    fn beat(&self) -> PyResult<()> {
        self.act(|r| r.beat())
    }

    /// Marks work unit `bit` (0..64) in flight.
    fn mark(&self, bit: u8) -> PyResult<()> {
        self.act(|r| r.mark_in_flight(bit))
    }

    /// Clears work unit `bit` (0..64).
    fn clear(&self, bit: u8) -> PyResult<()> {
        self.act(|r| r.clear_in_flight(bit))
    }

    /// The in-flight bitmap of this registration; 0 once it was fenced, its slot
    /// reused, or released.
    #[getter]
    fn in_flight(&self) -> u64 {
        lock(&self.reg)
            .as_ref()
            .and_then(OwnedRegistration::in_flight)
            .unwrap_or(0)
    }

    /// Unregisters; a second call does nothing.
    fn release(&self) {
        let taken = lock(&self.reg).take();
        if let Some(r) = taken {
            let _ = r.unregister();
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.release();
        false
    }
}

/// A `FailoverWatchdog` that owns (an `Arc` of) its table.
struct OwnedWatchdog {
    // Declared before `_table`: dropped first, while the table it borrows is alive.
    wd: FailoverWatchdog<'static>,
    _table: Arc<HeartbeatTable>,
}

impl std::fmt::Debug for OwnedWatchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.wd.fmt(f)
    }
}

impl OwnedWatchdog {
    fn new(table: Arc<HeartbeatTable>, grace: u64) -> Self {
        // SAFETY: the table lives in the `Arc`'s heap allocation, which does not move and
        // is kept alive by `_table` for as long as `wd` exists (`wd` is dropped first, by
        // field order); the `'static` reference never leaves this struct.
        let t: &'static HeartbeatTable = unsafe { &*Arc::as_ptr(&table) };
        OwnedWatchdog {
            wd: FailoverWatchdog::with_grace(t, grace),
            _table: table,
        }
    }
}

/// Finds workers that stopped beating or died, and reclaims their in-flight work.
///
/// No lock of the binding's around it: `FailoverWatchdog` is `Sync` and keeps its scan
/// state behind a fork-safe lock, so a child forked while another thread is in `scan()`
/// (without the GIL) takes that state over afresh. A `std::sync::Mutex` here was copied
/// locked into such a child, whose first `scan()` / `reclaim()` then waited for ever
/// with the GIL held (`test_attack5.py`: 2 to 10 forks in 20).
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct Watchdog(OwnedWatchdog);

#[pymethods]
impl Watchdog {
    #[new]
    #[pyo3(signature = (table, grace = 3))]
    fn new(table: &HeartbeatTableHandle, grace: u64) -> Self {
        Watchdog(OwnedWatchdog::new(table.inner.clone(), grace))
    }

    /// Ticks the epoch and reports dead slots with work in flight:
    /// a list of `(slot, pid, in_flight)`.
    fn scan(&self, py: Python<'_>) -> Vec<(usize, u32, u64)> {
        unblocked(py, || {
            self.0
                .wd
                .scan()
                .dead_slots
                .into_iter()
                .map(|(slot, s)| (slot, s.pid, s.in_flight_bitmap))
                .collect()
        })
    }

    /// Fences a slot reported by the last `scan` and takes its in-flight bits (exactly
    /// once across watchdogs; 0 if another took them).
    fn reclaim(&self, slot: usize) -> u64 {
        self.0.wd.reclaim(slot)
    }
}

// ---------------------------------------------------------------------------------------
// asyncio: the Rust futures of the `async` feature, polled by the event loop

/// What an async waiter resolves to.
enum Got {
    Lease(OwnedLeaseGuard<Payload>),
    Permit(HeldPermit),
}

/// A waiter's Rust future (`lock_owned_async`, or `acquire_async` owning its handle).
type WaitFuture = Pin<Box<dyn Future<Output = Got> + Send>>;

/// Where a wake-up goes: the waiter's event loop, a weak reference to the `AsyncWaiter`,
/// and the package's `_poll_waiter` (scheduled with the waiter as its argument). Weak, so
/// that the cxc reactor (which holds the waker while the Rust future waits) never keeps a
/// waiter alive: a waiter whose task and loop are gone is collected, and its drop
/// deregisters it. Cleared when the waiter is done.
struct WakeTarget {
    /// Set by a wake, cleared by the poll it scheduled: one scheduled poll at a time.
    scheduled: AtomicBool,
    target: Mutex<Option<WakeTo>>,
}

/// `(event loop, weak reference to the waiter, the function to schedule)`.
type WakeTo = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

impl Wake for WakeTarget {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// Called by the cxc reactor thread with its registry locked: must not take the GIL
    /// (a thread holding the GIL may be waiting for that registry in `poll` or `drop`).
    /// Hands the wake-up to the bridge thread, which takes the GIL and calls
    /// `loop.call_soon_threadsafe`.
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            // The bridge thread lives as long as the process: the send cannot fail.
            let _ = bridge().send(self.clone());
        }
    }
}

/// The one thread per process that turns wake-ups into `loop.call_soon_threadsafe`, and
/// the process it belongs to.
struct Bridge {
    pid: u32,
    tx: std::sync::mpsc::Sender<Arc<WakeTarget>>,
}

/// This process's [`Bridge`]; null until the first wake-up. A child made by `fork`
/// inherits the parent's pointer but not its thread: it sees another pid and starts a
/// bridge of its own (lock-free, so no lock a parent thread held at the fork is needed).
static BRIDGE: AtomicPtr<Bridge> = AtomicPtr::new(std::ptr::null_mut());

/// The sender of this process's wake-up thread (started on first use).
fn bridge() -> &'static std::sync::mpsc::Sender<Arc<WakeTarget>> {
    let me = std::process::id();
    let mut cur = BRIDGE.load(Ordering::Acquire);
    loop {
        // SAFETY: a non-null `BRIDGE` comes from `Box::into_raw` below and is never freed
        // once installed (a replaced one belongs to the parent of a fork: it is leaked).
        if let Some(b) = unsafe { cur.as_ref() }
            && b.pid == me
        {
            return &b.tx;
        }
        let (tx, rx) = std::sync::mpsc::channel::<Arc<WakeTarget>>();
        let spawned = std::thread::Builder::new()
            .name("cxc-asyncio-wake".into())
            .spawn(move || {
                cxc::mmf::orphan::ours();
                for w in rx {
                    deliver(&w);
                }
            });
        if spawned.is_err() {
            // Without the thread every wake-up is lost; the receiver was dropped with the
            // closure, so `send` fails and waiters only complete by their timeout.
            eprintln!("cxc: could not start the asyncio wake-up thread");
        }
        let new = Box::into_raw(Box::new(Bridge { pid: me, tx }));
        match BRIDGE.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `new` was just installed and is never freed (see above).
            Ok(_) => return &unsafe { &*new }.tx,
            Err(found) => {
                // Another thread installed one first: drop ours (its thread ends when the
                // sender goes) and use theirs.
                // SAFETY: `new` came from `Box::into_raw` and was never shared.
                drop(unsafe { Box::from_raw(new) });
                cur = found;
            }
        }
    }
}

fn deliver(w: &WakeTarget) {
    // SAFETY: `Py_IsInitialized` may be called at any time, without the GIL.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return;
    }
    // Once the interpreter began to exit, this thread (not a Python thread) never takes
    // the GIL again (`announce_gil`). A delivery's `call_soon_threadsafe` releases and
    // retakes the GIL in its self-pipe `send`, so it stays counted until it is done:
    // `test_async_waiters_across_processes` aborted in 5 of 40 runs when a wake-up from
    // another process's release arrived as this one exited. An `asyncio` wait started by
    // an `atexit` hook is therefore not woken (only its timeout ends it).
    announce_gil();
    deliver_now(w);
    gil_taken();
}

fn deliver_now(w: &WakeTarget) {
    Python::with_gil(|py| {
        let target = lock(&w.target)
            .as_ref()
            .map(|(l, weak, poll)| (l.clone_ref(py), weak.clone_ref(py), poll.clone_ref(py)));
        let Some((event_loop, weak, poll)) = target else {
            return;
        };
        // The waiter, unless it was collected meanwhile (then nobody waits).
        let Ok(waiter) = weak.call0(py) else {
            return;
        };
        if waiter.is_none(py) {
            return;
        }
        // A closed loop raises RuntimeError: its waiters are gone with it.
        let _ = event_loop.call_method1(py, "call_soon_threadsafe", (poll, waiter));
    });
}

/// One `await lease.lock_async()` / `await sem.acquire_async()`: owns the Rust future,
/// polled on the event loop's thread (by the package's `_poll_waiter`, right after
/// `start` and whenever the cxc reactor wakes it). No thread per waiter: the reactor (2
/// threads) and the wake-up bridge (1 thread) serve every waiter of the process. Dropping
/// the future (`cancel`, `expire`, completion) leaves no claim, no permit and no
/// registered waiter.
///
/// The asyncio future is completed (`set_result`, `set_exception`) by the package's
/// Python code, not under the extension's frames: that runs the loop's `call_soon`, which
/// may let the GIL go, and a daemon loop thread that takes the GIL back while the
/// interpreter finalizes is ended by `pthread_exit` (CPython < 3.14), whose unwinding
/// through Rust frames aborts the process (`test_attack5.py`, `call_soon`: 2 to 3 of 4
/// exits aborted when `_poll` called `set_result` itself).
///
/// The waiter takes part in Python's cycle collection (`__traverse__`, `__clear__`): a
/// waiter whose task was dropped unfinished (e.g. its loop closed under it) is collected
/// with the task, which drops its Rust future.
#[pyclass(module = "cxc._cxc", frozen, weakref)]
struct AsyncWaiter {
    fut: Mutex<Option<WaitFuture>>,
    wake: Arc<WakeTarget>,
    waker: Waker,
    /// The asyncio future the awaiting coroutine waits on (set by `start`).
    result: Mutex<Option<Py<PyAny>>>,
}

impl AsyncWaiter {
    fn new(fut: WaitFuture) -> Self {
        let wake = Arc::new(WakeTarget {
            scheduled: AtomicBool::new(false),
            target: Mutex::new(None),
        });
        AsyncWaiter {
            fut: Mutex::new(Some(fut)),
            waker: Waker::from(wake.clone()),
            wake,
            result: Mutex::new(None),
        }
    }

    /// Drops the Rust future and the wake target (after it, no wake-up is delivered).
    fn finish(&self) {
        let fut = lock(&self.fut).take();
        drop(fut);
        let target = lock(&self.wake.target).take();
        drop(target);
    }
}

#[pymethods]
impl AsyncWaiter {
    /// Binds the waiter to `event_loop` and the asyncio future `result`; a wake-up
    /// schedules `poll(waiter)` on the loop (the caller then polls once).
    fn start(
        slf: &Bound<'_, Self>,
        event_loop: Py<PyAny>,
        result: Py<PyAny>,
        poll: Py<PyAny>,
    ) -> PyResult<()> {
        let me = slf.get();
        let weak = pyo3::types::PyWeakrefReference::new(slf)?
            .into_any()
            .unbind();
        // What was there before (nothing, unless `start` is called twice) is dropped
        // once the locks are let go (see [`lock`]).
        let old_target = lock(&me.wake.target).replace((event_loop, weak, poll));
        let old_result = lock(&me.result).replace(result);
        drop((old_target, old_result));
        Ok(())
    }

    /// The asyncio future given to `start` (`None` before it, or once cleared).
    #[getter]
    fn _future(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.result).as_ref().map(|f| f.clone_ref(py))
    }

    /// Polls the Rust future (on the loop's thread): the guard or permit once it is
    /// ready, else `None`. The caller sets it as the asyncio future's result (or releases
    /// it); it calls this only while that future is pending.
    fn _poll(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.wake.scheduled.store(false, Ordering::Release);
        let ready = {
            let mut fut = lock(&self.fut);
            let Some(f) = fut.as_mut() else {
                return Ok(None);
            };
            match f.as_mut().poll(&mut Context::from_waker(&self.waker)) {
                Poll::Ready(got) => {
                    *fut = None;
                    got
                }
                Poll::Pending => return Ok(None),
            }
        };
        self.finish();
        // On error `got` is dropped, which releases the guard or permit.
        Ok(Some(match ready {
            Got::Lease(g) => Py::new(py, LeaseGuard::new(g))?.into_any(),
            Got::Permit(p) => Py::new(py, SemaphorePermit::new(p))?.into_any(),
        }))
    }

    /// Gives up (the awaiting task was cancelled, or the asyncio future is done): drops
    /// the Rust future.
    fn cancel(&self) {
        self.finish();
    }

    /// The timeout passed: drops the Rust future and returns the `cxc.Timeout` the
    /// caller fails the asyncio future with if it is still pending.
    fn expire(&self, py: Python<'_>, what: &str, timeout: f64) -> PyResult<Py<PyAny>> {
        self.finish();
        let t = duration(Some(timeout))?.unwrap_or_default();
        Ok(timeout_error(what, t).into_value(py).into_any())
    }

    /// Whether the Rust future is still alive (waiting).
    #[getter]
    fn waiting(&self) -> bool {
        lock(&self.fut).is_some()
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // Never block in the collector: a lock held elsewhere skips that edge (the
        // object then just looks reachable this round).
        if let Ok(r) = self.result.try_lock()
            && let Some(f) = r.as_ref()
        {
            visit.call(f)?;
        }
        if let Ok(t) = self.wake.target.try_lock()
            && let Some((event_loop, weak, poll)) = t.as_ref()
        {
            visit.call(event_loop)?;
            visit.call(weak)?;
            visit.call(poll)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        self.finish();
        let result = lock(&self.result).take();
        drop(result);
    }
}

impl Drop for AsyncWaiter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Async waiters registered with this process's cxc reactor now (0 once every
/// `lock_async` / `acquire_async` completed, was cancelled or timed out).
#[pyfunction]
fn async_waiters() -> usize {
    cxc::async_waiters()
}

// ---------------------------------------------------------------------------------------
// Leader election on a lease file

fn election_error(e: ElectionError, path: &std::path::Path) -> PyErr {
    match e {
        ElectionError::Lost { .. } => error("LostError", e.to_string()),
        ElectionError::InvalidConfig(why) => PyValueError::new_err(why),
        ElectionError::Backend(b) => match b.downcast::<MmapElectionError>() {
            Ok(m) => mmap_election_error(*m, path),
            Err(b) => error("Error", format!("election backend: {b}")),
        },
        other => error("Error", other.to_string()),
    }
}

fn mmap_election_error(e: MmapElectionError, path: &std::path::Path) -> PyErr {
    match e {
        MmapElectionError::Lease(l) => lease_error(l, path),
        MmapElectionError::IdentityTooLong { .. } | MmapElectionError::LeaseDuration(_) => {
            PyValueError::new_err(e.to_string())
        }
        other => error("Error", format!("{}: {other}", path.display())),
    }
}

/// A candidate in the leader election on a lease file (progress-driven renewal).
#[pyclass(module = "cxc._cxc", name = "Elector", subclass, frozen)]
struct ElectorHandle {
    inner: Arc<Elector<MmapElection>>,
    path: PathBuf,
    /// No identity was given: it is `py:PID` of the process that campaigns.
    default_identity: bool,
    /// The process that made `inner`.
    pid: u32,
    /// A forked child's own elector (default identity only), made on its first use.
    /// Locked only with the GIL and only to look it up or store it, never while it is
    /// made (without the GIL): a child forked by another thread meanwhile (a grandchild of
    /// the handle's process) would inherit it locked and wait for ever (see [`lock`]).
    forked: Mutex<Option<(u32, Arc<Elector<MmapElection>>)>>,
}

/// The elector of election file `path` for `identity` (the file must exist unless
/// `create`).
fn open_elector(
    path: &std::path::Path,
    create: bool,
    grace: Duration,
    identity: String,
) -> PyResult<Elector<MmapElection>> {
    let backend = if create {
        MmapElection::create_or_open(path, grace)
    } else {
        OwnerLease::builder(path)
            .open::<LeaderRecord>()
            .map_err(MmapElectionError::from)
            .and_then(|l| MmapElection::new(l, grace))
    }
    .map_err(|e| mmap_election_error(e, path))?;
    let config = ElectionConfig::new(identity).lease_duration(grace);
    Elector::new(backend, config).map_err(|e| election_error(e, path))
}

impl ElectorHandle {
    /// This process's elector: in a forked child of the process that made the handle,
    /// with a default identity, one of its own (named `py:<its pid>`).
    fn elector(&self, py: Python<'_>) -> PyResult<Arc<Elector<MmapElection>>> {
        let me = std::process::id();
        if !self.default_identity || me == self.pid {
            return Ok(self.inner.clone());
        }
        let mine = |f: &Option<(u32, Arc<Elector<MmapElection>>)>| {
            f.as_ref()
                .filter(|(pid, _)| *pid == me)
                .map(|(_, e)| e.clone())
        };
        let found = mine(&lock(&self.forked));
        if let Some(e) = found {
            return Ok(e);
        }
        let grace = self.inner.config().lease_duration;
        let e = Arc::new(unblocked(py, || {
            open_elector(&self.path, false, grace, format!("py:{me}"))
        })?);
        // Another thread of this process may have stored one meanwhile: theirs is used
        // (ours, never campaigned with, is dropped). What is replaced or dropped goes
        // once the lock is let go.
        let (chosen, unused) = {
            let mut forked = lock(&self.forked);
            match mine(&forked) {
                Some(theirs) => (theirs, None),
                None => (e.clone(), forked.replace((me, e))),
            }
        };
        drop(unused);
        Ok(chosen)
    }
}

#[pymethods]
impl ElectorHandle {
    #[new]
    #[pyo3(signature = (path, *, create = true, grace = 1.0, identity = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        create: bool,
        grace: f64,
        identity: Option<String>,
    ) -> PyResult<Self> {
        let grace = grace_duration(grace)?;
        let default_identity = identity.is_none();
        let pid = std::process::id();
        let identity = identity.unwrap_or_else(|| format!("py:{pid}"));
        if identity.is_empty() || identity.len() > IDENTITY_MAX {
            return Err(PyValueError::new_err(format!(
                "the identity must be 1 to {IDENTITY_MAX} bytes, got {}",
                identity.len()
            )));
        }
        let inner = unblocked(py, || open_elector(&path, create, grace, identity))?;
        Ok(ElectorHandle {
            inner: Arc::new(inner),
            path,
            default_identity,
            pid,
            forked: Mutex::new(None),
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// This candidate's identity (shown to observers).
    #[getter]
    fn identity(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.elector(py)?.config().identity.clone())
    }

    /// The lease duration in seconds: a leader that does not renew within it is replaced.
    #[getter]
    fn grace(&self) -> f64 {
        self.inner.config().lease_duration.as_secs_f64()
    }

    /// Blocks until elected (at most `timeout` seconds; `None`: forever) and returns the
    /// `Leadership`. Raises `cxc.Timeout` (a `TimeoutError`) on timeout.
    #[pyo3(signature = (timeout = None))]
    fn campaign(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<LeadershipHandle> {
        let t = duration(timeout)?;
        let deadline = t.and_then(|t| Instant::now().checked_add(t));
        loop {
            // Looked up for every slice: a signal handler run by `check_signals` may have
            // forked, and a child that goes on campaigning does so as itself.
            let elector = self.elector(py)?;
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            let won = unblocked(py, || elector.campaign(left))
                .map_err(|e| election_error(e, &self.path))?;
            if let Some(l) = won {
                return Ok(LeadershipHandle::new(l, &self.path));
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout_error("election", t.unwrap_or_default()));
            }
        }
    }

    /// The `Leadership` if this candidate wins without waiting (nobody leads, or the
    /// leader died or stopped renewing), else `None`.
    fn try_campaign(&self, py: Python<'_>) -> PyResult<Option<LeadershipHandle>> {
        let won = self
            .elector(py)?
            .campaign(Duration::ZERO)
            .map_err(|e| election_error(e, &self.path))?;
        Ok(won.map(|l| LeadershipHandle::new(l, &self.path)))
    }

    /// The current leader as `(identity, token)`, or `None` when nobody leads.
    fn leader(&self) -> PyResult<Option<(String, u64)>> {
        let l = self
            .inner
            .observe()
            .map_err(|e| election_error(e, &self.path))?;
        Ok(l.map(|l| (l.identity, l.token)))
    }

    fn __repr__(&self) -> String {
        format!(
            "cxc.Elector({:?}, identity={:?})",
            self.path,
            self.inner.config().identity
        )
    }
}

/// A won term; a context manager that steps down on exit.
#[pyclass(module = "cxc._cxc", name = "Leadership", frozen)]
struct LeadershipHandle {
    /// The term, shared: `is_current`, `renew` and `wait_lost` clone the `Arc` under the
    /// lock and work without it (a thread blocked in `wait_lost` holds no lock, so
    /// `step_down` is prompt, also in a child forked meanwhile); `step_down` takes it out
    /// and resigns through the `Arc`.
    inner: RwLock<Option<Arc<Leadership<MmapElection>>>>,
    token: u64,
    path: PathBuf,
}

impl LeadershipHandle {
    fn new(l: Leadership<MmapElection>, path: &std::path::Path) -> Self {
        LeadershipHandle {
            token: l.token(),
            path: path.to_path_buf(),
            inner: RwLock::new(Some(Arc::new(l))),
        }
    }

    /// The term, if not stepped down (the lock is held only to clone the `Arc`).
    fn term(&self) -> Option<Arc<Leadership<MmapElection>>> {
        read(&self.inner).clone()
    }

    fn stepped_down_error(&self) -> PyErr {
        error(
            "LostError",
            format!("leadership of term {} was stepped down", self.token),
        )
    }
}

#[pymethods]
impl LeadershipHandle {
    /// The fencing token of this term: strictly greater for every later leader.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// Whether this term still leads: not lost, renewed within the lease duration, and
    /// current in the file.
    fn is_current(&self, py: Python<'_>) -> PyResult<bool> {
        let term = self.term();
        unblocked(py, || match term {
            Some(l) => l.is_current(),
            None => Ok(false),
        })
        .map_err(|e| election_error(e, &self.path))
    }

    /// Renews the term (the work loop's proof of progress): call it at least once per
    /// lease duration. Raises `LostError` once the term is over (superseded, not renewed
    /// in time, or stepped down).
    fn renew(&self, py: Python<'_>) -> PyResult<()> {
        let term = self.term();
        match unblocked(py, || term.map(|l| l.renew())) {
            Some(r) => r.map_err(|e| election_error(e, &self.path)),
            None => Err(self.stepped_down_error()),
        }
    }

    /// Blocks (GIL released, Ctrl-C interrupts) until the term is lost (`True`) or
    /// `timeout` seconds pass (`False`; `None`: no limit).
    #[pyo3(signature = (timeout = None))]
    fn wait_lost(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let t = duration(timeout)?;
        let deadline = t.and_then(|t| Instant::now().checked_add(t));
        loop {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            let term = self.term();
            let lost = unblocked(py, || match term {
                Some(l) => l.wait_lost(left),
                None => Ok(true),
            });
            if lost.map_err(|e| election_error(e, &self.path))? {
                return Ok(true);
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// Ends the term now so a standby can lead at once. Raises `LostError` if the term
    /// was already over; a second call does nothing.
    fn step_down(&self, py: Python<'_>) -> PyResult<()> {
        let Some(l) = write(&self.inner).take() else {
            return Ok(());
        };
        // `resign` reports `Lost` for a term already over, also one past its lease
        // duration without renewal that no standby took yet (it still resigns it).
        // Through the `Arc`: a `wait_lost` in another thread may hold a clone (it then
        // returns `True`); the last clone's drop stops the renewer.
        unblocked(py, || l.resign()).map_err(|e| election_error(e, &self.path))
    }

    /// Whether `step_down()` was called (or the `with` block left).
    #[getter]
    fn stepped_down(&self) -> bool {
        read(&self.inner).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Steps down; a lost term raises `LostError` unless an exception is propagating.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let r = self.step_down(py);
        if exc_type.is_none_or(|t| t.is_none()) {
            r?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cxc.Leadership token={}{}>",
            self.token,
            if self.stepped_down() {
                " stepped down"
            } else {
                ""
            }
        )
    }
}

// ---------------------------------------------------------------------------------------

/// The native part of the `cxc` package.
#[pymodule]
fn _cxc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Lease>()?;
    m.add_class::<LeaseGuard>()?;
    m.add_class::<Semaphore>()?;
    m.add_class::<SemaphorePermit>()?;
    m.add_class::<HeartbeatTableHandle>()?;
    m.add_class::<Registration>()?;
    m.add_class::<Watchdog>()?;
    m.add_class::<ElectorHandle>()?;
    m.add_class::<LeadershipHandle>()?;
    m.add_class::<AsyncWaiter>()?;
    m.add_function(wrap_pyfunction!(async_waiters, m)?)?;
    // Owned by `atexit` alone: its drop, after the last hook, is the exit handshake.
    let guard = Py::new(m.py(), ExitGuard)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (guard,))?;
    Ok(())
}

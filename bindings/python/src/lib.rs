//! Python bindings of cxc: `cxc.Lease`, `cxc.Semaphore`, `cxc.HeartbeatTable`,
//! `cxc.Watchdog` (module `cxc._cxc`; the Python package `cxc` adds asyncio helpers and
//! the exception classes, see `python/cxc/`).
//!
//! Blocking calls release the GIL and wait in slices of [`SLICE`], checking for signals
//! (Ctrl-C) between slices.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cxc::{
    FailoverWatchdog, GuardError, HeartbeatError, HeartbeatTable, LeaseError, MmfError,
    OwnedLeaseGuard, OwnedPermit, OwnerLease, SemaphoreError, SemaphoreOptions, SharedSemaphore,
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

fn duration(secs: Option<f64>) -> PyResult<Option<Duration>> {
    secs.map(|s| {
        Duration::try_from_secs_f64(s.max(0.0))
            .map_err(|_| PyValueError::new_err(format!("invalid timeout: {s}")))
    })
    .transpose()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// Cancellation token for the asyncio helpers.

/// A flag that makes a blocking acquire give up at its next slice (set by the asyncio
/// helpers when the awaiting task is cancelled).
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug, Default)]
struct CancelToken(Arc<AtomicBool>);

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> Self {
        Self::default()
    }
    /// Asks the blocking call to give up.
    fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether `cancel` was called.
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Waits for `attempt` to succeed in slices, without the GIL, checking signals and the
/// cancel flag between slices. `slice(left)` blocks at most `left` and returns `Some`
/// when acquired.
fn wait_sliced<G: Send>(
    py: Python<'_>,
    timeout: Option<Duration>,
    cancel: Option<&CancelToken>,
    mut slice: impl FnMut(Duration) -> Option<G> + Send,
) -> PyResult<Option<G>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        };
        if let Some(g) = py.allow_threads(|| slice(left)) {
            if cancel.is_some_and(CancelToken::cancelled) {
                drop(g);
                return Ok(None);
            }
            return Ok(Some(g));
        }
        py.check_signals()?;
        if cancel.is_some_and(CancelToken::cancelled) {
            return Ok(None);
        }
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
        cancel: Option<&CancelToken>,
    ) -> PyResult<Option<OwnedLeaseGuard<Payload>>> {
        if let Some(g) = self.inner.clone().try_lock_owned() {
            return Ok(Some(g));
        }
        let mut fut = Box::pin(self.inner.clone().lock_owned_async());
        // The waker is made on the first slice: `allow_threads` runs on this same thread.
        let mut waker: Option<Waker> = None;
        wait_sliced(py, timeout, cancel, move |left| {
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
        let grace = duration(Some(grace))?.unwrap_or_default();
        let lease = py
            .allow_threads(|| {
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
        match self.acquire(py, t, None)? {
            Some(g) => Ok(LeaseGuard::new(g)),
            None => Err(timeout_error("lease", t.unwrap_or_default())),
        }
    }

    /// The guard if the lease is free (or its holder dead or stale), else `None`.
    fn try_lock(&self) -> Option<LeaseGuard> {
        self.inner.clone().try_lock_owned().map(LeaseGuard::new)
    }

    /// For the asyncio helper: as `lock`, returning `None` once `cancel` is set.
    #[pyo3(signature = (timeout, cancel))]
    fn _lock_cancellable(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        cancel: &CancelToken,
    ) -> PyResult<Option<LeaseGuard>> {
        let t = duration(timeout)?;
        match self.acquire(py, t, Some(cancel))? {
            Some(g) => Ok(Some(LeaseGuard::new(g))),
            None if cancel.cancelled() => Ok(None),
            None => Err(timeout_error("lease", t.unwrap_or_default())),
        }
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

    fn with<R>(&self, f: impl FnOnce(&OwnedLeaseGuard<Payload>) -> PyResult<R>) -> PyResult<R> {
        match lock(&self.guard).as_ref() {
            Some(g) => f(g),
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
        let v = self.with(|g| g.read().map_err(guard_error))?;
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
        self.with(|g| g.write(v).map_err(guard_error))
    }

    /// Refreshes the holder's heartbeat (a holder must beat within the lease's grace, or
    /// another process may take the lease over).
    fn beat(&self) -> PyResult<()> {
        self.with(|g| g.beat().map_err(guard_error))
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
}

impl Semaphore {
    fn acquire_inner(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
        cancel: Option<&CancelToken>,
    ) -> PyResult<Option<OwnedPermit>> {
        if let Some(p) = self.inner.clone().try_acquire_owned() {
            return Ok(Some(p));
        }
        let sem = self.inner.clone();
        wait_sliced(py, timeout, cancel, move |left| {
            sem.clone().acquire_owned_timeout(left)
        })
    }
}

#[pymethods]
impl Semaphore {
    #[new]
    #[pyo3(signature = (path, permits, *, create = true))]
    fn new(py: Python<'_>, path: PathBuf, permits: u32, create: bool) -> PyResult<Self> {
        let sem = py
            .allow_threads(|| {
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
        match self.acquire_inner(py, t, None)? {
            Some(p) => Ok(SemaphorePermit::new(p)),
            None => Err(timeout_error("semaphore", t.unwrap_or_default())),
        }
    }

    /// A permit if one is free now, else `None`.
    fn try_acquire(&self) -> Option<SemaphorePermit> {
        self.inner
            .clone()
            .try_acquire_owned()
            .map(SemaphorePermit::new)
    }

    /// For the asyncio helper: as `acquire`, returning `None` once `cancel` is set.
    #[pyo3(signature = (timeout, cancel))]
    fn _acquire_cancellable(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        cancel: &CancelToken,
    ) -> PyResult<Option<SemaphorePermit>> {
        let t = duration(timeout)?;
        match self.acquire_inner(py, t, Some(cancel))? {
            Some(p) => Ok(Some(SemaphorePermit::new(p))),
            None if cancel.cancelled() => Ok(None),
            None => Err(timeout_error("semaphore", t.unwrap_or_default())),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "cxc.Semaphore({:?}, {})",
            self.path,
            self.inner.max_permits()
        )
    }
}

/// One held permit; a context manager. Leaving the `with` block (or `release()`)
/// returns it.
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct SemaphorePermit(Mutex<Option<OwnedPermit>>);

impl SemaphorePermit {
    fn new(p: OwnedPermit) -> Self {
        SemaphorePermit(Mutex::new(Some(p)))
    }
}

#[pymethods]
impl SemaphorePermit {
    /// Returns the permit; a second call does nothing.
    fn release(&self) {
        drop(lock(&self.0).take());
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
        let table = py
            .allow_threads(|| {
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
        let slot = self
            .inner
            .register(pid)
            .map_err(|e| hb_error(e, &self.path))?;
        Ok(Registration {
            table: self.inner.clone(),
            slot,
            done: AtomicBool::new(false),
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

/// A worker's slot in a heartbeat table.
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct Registration {
    table: Arc<HeartbeatTable>,
    slot: usize,
    done: AtomicBool,
}

impl Registration {
    fn check(&self, ok: bool) -> PyResult<()> {
        if self.done.load(Ordering::SeqCst) {
            return Err(released("registration"));
        }
        if ok {
            Ok(())
        } else {
            Err(error(
                "LostError",
                format!(
                    "slot {} was fenced: a watchdog reclaimed its work",
                    self.slot
                ),
            ))
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
        self.check(!self.done.load(Ordering::SeqCst) && self.table.beat(self.slot))
    }

    /// Marks work unit `bit` (0..64) in flight.
    fn mark(&self, bit: u8) -> PyResult<()> {
        if bit >= 64 {
            return Err(PyValueError::new_err("bit must be in 0..64"));
        }
        self.check(!self.done.load(Ordering::SeqCst) && self.table.mark_in_flight(self.slot, bit))
    }

    /// Clears work unit `bit` (0..64).
    fn clear(&self, bit: u8) -> PyResult<()> {
        if bit >= 64 {
            return Err(PyValueError::new_err("bit must be in 0..64"));
        }
        self.check(!self.done.load(Ordering::SeqCst) && self.table.clear_in_flight(self.slot, bit))
    }

    /// The in-flight bitmap.
    #[getter]
    fn in_flight(&self) -> u64 {
        self.table
            .snapshot(self.slot)
            .map_or(0, |s| s.in_flight_bitmap)
    }

    /// Unregisters; a second call does nothing.
    fn release(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.table.unregister(self.slot);
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

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.table.unregister(self.slot);
        }
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
#[pyclass(module = "cxc._cxc", frozen)]
#[derive(Debug)]
struct Watchdog(Mutex<OwnedWatchdog>);

#[pymethods]
impl Watchdog {
    #[new]
    #[pyo3(signature = (table, grace = 3))]
    fn new(table: &HeartbeatTableHandle, grace: u64) -> Self {
        Watchdog(Mutex::new(OwnedWatchdog::new(table.inner.clone(), grace)))
    }

    /// Ticks the epoch and reports dead slots with work in flight:
    /// a list of `(slot, pid, in_flight)`.
    fn scan(&self, py: Python<'_>) -> Vec<(usize, u32, u64)> {
        py.allow_threads(|| {
            lock(&self.0)
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
        lock(&self.0).wd.reclaim(slot)
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
    m.add_class::<CancelToken>()?;
    Ok(())
}

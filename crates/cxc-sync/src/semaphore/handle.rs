//! `SharedSemaphore`: the type, its file (layout parameters, create/open), accessors.

use std::path::Path;

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, Origin, TypeFingerprint};

use super::error::{SemaphoreError, SemaphoreOptions};
use super::layout::{HEAD_SIZE, HolderSlot, SLOT_SIZE, SemHead};
use super::raw::RawSemaphore;
use super::word;

/// Format version in `params[1]`: the bit layouts of `word.rs`. Version 2: two `OP` bits
/// and a 28-bit `SEQ` in the count word, the handed book in the head, identity tags in
/// owner words (version 1: one `OP` bit, untracked transitions, start-time tags).
const PROTOCOL: u64 = 2;
/// A counting semaphore shared by processes through a mapped file.
///
/// At most [`max_permits`](SharedSemaphore::max_permits) permits are out at any time,
/// across all processes. Permits held by a process that dies are returned by
/// [`reclaim_dead`](SharedSemaphore::reclaim_dead), and blocked acquirers do that
/// themselves, like SysV `SEM_UNDO`. Blocked acquirers sleep in the kernel.
///
/// # Examples
/// ```
/// use cxc_sync::SharedSemaphore;
/// # fn main() -> Result<(), cxc_sync::SemaphoreError> {
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("pool.sem");
/// let sem = SharedSemaphore::create(&path, 2, 2)?;
/// let other = SharedSemaphore::open(&path)?; // e.g. in another process
/// assert_eq!(other.max_permits(), 2);
/// let a = sem.acquire();
/// let b = other.try_acquire().expect("one permit left");
/// assert!(sem.try_acquire().is_none());
/// drop((a, b));
/// assert_eq!(sem.available(), 2);
/// # Ok(())
/// # }
/// ```
pub struct SharedSemaphore {
    pub(super) map: Mapped<SemHead, HolderSlot>,
    pub(super) max: u32,
    /// This process's holder slot, cached.
    pub(super) holder: crate::holders::HolderCache,
    /// Whether a `SidecarBox` observes this handle (then transitions are recorded).
    pub(super) observed: cxc_sidecar::Observed,
    /// Whether this handle's blocked acquires spin first (their recent length).
    pub(super) spin: crate::park::SpinGauge,
}

pub(super) fn check_params(p: &[u64; 4]) -> Result<(), MmfError> {
    let mismatch = |name, expected: String, found| MmfError::ParamMismatch {
        name,
        expected,
        found,
    };
    if !(1..=u64::from(word::MAX_PERMITS)).contains(&p[0]) {
        return Err(mismatch(
            "max_permits",
            format!("1..={}", word::MAX_PERMITS),
            p[0],
        ));
    }
    if p[1] != PROTOCOL {
        return Err(mismatch(
            "protocol",
            format!(
                "{PROTOCOL} (this build reads semaphore format version {PROTOCOL} only; the \
                 file has version {})",
                p[1]
            ),
            p[1],
        ));
    }
    if p[3] != 0 {
        return Err(mismatch("reserved param 3", "0".into(), p[3]));
    }
    Ok(())
}

pub(super) fn expect(check: &dyn Fn(&[u64; 4]) -> Result<(), MmfError>) -> Expect<'_> {
    Expect {
        kind: Kind::Semaphore,
        head_size: HEAD_SIZE,
        slot_size: SLOT_SIZE,
        capacity: None,
        max_capacity: u64::from(word::MAX_HOLDERS),
        payload: TypeFingerprint::NONE,
        check_params: check,
    }
}

fn layout(initial: u32, max: u32, opts: &SemaphoreOptions) -> Result<Layout, SemaphoreError> {
    if max == 0 || max > word::MAX_PERMITS || initial > max {
        return Err(SemaphoreError::InvalidPermits {
            initial,
            max,
            limit: word::MAX_PERMITS,
        });
    }
    if opts.holders == 0 || opts.holders > word::MAX_HOLDERS {
        return Err(SemaphoreError::InvalidCapacity {
            requested: opts.holders,
            limit: word::MAX_HOLDERS,
        });
    }
    Ok(Layout {
        kind: Kind::Semaphore,
        head_size: HEAD_SIZE,
        slot_size: SLOT_SIZE,
        capacity: u64::from(opts.holders),
        payload: TypeFingerprint::NONE,
        params: [u64::from(max), PROTOCOL, crate::holders::pid_namespace(), 0],
    })
}

#[cfg(all(feature = "async", not(cxc_loom)))]
impl Drop for SharedSemaphore {
    fn drop(&mut self) {
        // Before the mapping goes: this process's async reactor forgets its wake word
        // (and the groups of futures leaked with `mem::forget`).
        crate::asyncs::forget_words(&[self.wake_addr()]);
    }
}

impl SharedSemaphore {
    /// Largest `max_permits` a semaphore can have (2^24 - 1).
    pub const MAX_PERMITS: u32 = word::MAX_PERMITS;
    /// Largest holder-table capacity (1023).
    pub const MAX_HOLDERS: u32 = word::MAX_HOLDERS;

    /// Creates a semaphore file at `path` with `initial` of `max_permits` permits
    /// available and the default [`SemaphoreOptions`]. Never clobbers an existing file.
    ///
    /// # Errors
    /// [`SemaphoreError::InvalidPermits`] if `max_permits` is 0 or above
    /// [`SharedSemaphore::MAX_PERMITS`] or `initial > max_permits`;
    /// [`SemaphoreError::File`] if the file cannot be created (e.g. it exists).
    pub fn create(
        path: impl AsRef<Path>,
        initial: u32,
        max_permits: u32,
    ) -> Result<Self, SemaphoreError> {
        Self::create_with(path, initial, max_permits, &SemaphoreOptions::default())
    }

    /// [`SharedSemaphore::create`] with explicit options (file mode, holder capacity).
    ///
    /// # Errors
    /// As [`SharedSemaphore::create`], plus [`SemaphoreError::InvalidCapacity`].
    pub fn create_with(
        path: impl AsRef<Path>,
        initial: u32,
        max_permits: u32,
        opts: &SemaphoreOptions,
    ) -> Result<Self, SemaphoreError> {
        let layout = layout(initial, max_permits, opts)?;
        let map = Mapped::create(path, layout, &create_options(opts), |h: &SemHead, _| {
            h.init(initial, max_permits)
        })?;
        Self::from_map(map)
    }

    /// Opens an existing semaphore file; `max_permits` and the holder capacity are read
    /// from it.
    ///
    /// The process is registered in the holder table at once (see
    /// [`SharedSemaphore::register`]): a process never takes or returns permits untracked.
    ///
    /// # Errors
    /// [`SemaphoreError::File`] for a missing, foreign, corrupt or incompatible file
    /// (e.g. [`MmfError::ParamMismatch`] for an out-of-range `max_permits` or another
    /// format version); [`SemaphoreError::TableFull`] if every holder slot belongs to a
    /// live process; [`SemaphoreError::ForeignPidNamespace`] if the file was created in
    /// another pid namespace.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SemaphoreError> {
        let map = Mapped::open(path, &expect(&check_params))?;
        Self::from_map(map)
    }

    /// Opens an existing semaphore file for inspection (e.g. `cxc inspect`) without
    /// taking a holder slot. The handle registers on first use instead: if the table is
    /// then full, `try_acquire` returns `None` and `acquire` waits for a slot (it never
    /// takes a permit untracked).
    ///
    /// # Errors
    /// As [`SharedSemaphore::open`], except `TableFull`.
    pub fn open_unregistered(path: impl AsRef<Path>) -> Result<Self, SemaphoreError> {
        let map = Mapped::open(path, &expect(&check_params))?;
        Self::from_map_lazy(map)
    }

    /// Creates the file, or opens it if it exists (or another process creates it at the
    /// same time). An existing file must have the same `max_permits`; `initial` and
    /// `opts.holders` only apply when this call creates it.
    ///
    /// # Errors
    /// As [`SharedSemaphore::create`] and [`SharedSemaphore::open`];
    /// [`MmfError::ParamMismatch`] if the file's `max_permits` differs.
    pub fn create_or_open(
        path: impl AsRef<Path>,
        initial: u32,
        max_permits: u32,
        opts: &SemaphoreOptions,
    ) -> Result<(Self, Origin), SemaphoreError> {
        let layout = layout(initial, max_permits, opts)?;
        let check = |p: &[u64; 4]| {
            check_params(p)?;
            if p[0] != u64::from(max_permits) {
                return Err(MmfError::ParamMismatch {
                    name: "max_permits",
                    expected: max_permits.to_string(),
                    found: p[0],
                });
            }
            Ok(())
        };
        let (map, origin) = Mapped::create_or_open(
            path,
            layout,
            &create_options(opts),
            &expect(&check),
            |h: &SemHead, _| h.init(initial, max_permits),
        )?;
        Ok((Self::from_map(map)?, origin))
    }

    /// The handle, with this process registered in the holder table.
    fn from_map(map: Mapped<SemHead, HolderSlot>) -> Result<Self, SemaphoreError> {
        let sem = Self::from_map_lazy(map)?;
        sem.holder_slow()?;
        Ok(sem)
    }

    /// The handle, not yet registered.
    fn from_map_lazy(map: Mapped<SemHead, HolderSlot>) -> Result<Self, SemaphoreError> {
        // Validated by `check_params` (open) or `layout` (create).
        let max = u32::try_from(map.info().layout.params[0])
            .unwrap_or(word::MAX_PERMITS)
            .min(word::MAX_PERMITS);
        super::error::check_namespace(map.info().layout.params[2])?;
        Ok(SharedSemaphore {
            map,
            max,
            holder: crate::holders::HolderCache::new(),
            observed: cxc_sidecar::Observed::new(),
            spin: crate::park::SpinGauge::new(),
        })
    }

    /// The shared strategy and its generation.
    pub fn strategy(&self) -> (cxc_sidecar::Strategy, u32) {
        self.map.head().handshake.current()
    }

    /// The observations still in the file's ring, oldest first.
    pub fn recent_observations(&self) -> Vec<cxc_sidecar::Observation> {
        self.map.head().ring.snapshot()
    }

    /// The protocol view of this file.
    #[inline]
    pub(super) fn raw(&self) -> RawSemaphore<'_> {
        RawSemaphore {
            head: self.map.head(),
            slots: self.map.slots(),
            max: self.max,
        }
    }

    /// The most permits that can be available (stored in the file).
    #[inline]
    pub fn max_permits(&self) -> u32 {
        self.max
    }

    /// Permits available right now (one atomic load; stale as soon as it returns).
    #[inline]
    pub fn available(&self) -> u32 {
        self.raw().available().min(self.max)
    }

    /// Number of holder slots in the file.
    pub fn holder_capacity(&self) -> usize {
        self.map.slots().len()
    }

    /// The path the file was created or opened at.
    pub fn path(&self) -> &Path {
        self.map.path()
    }
}

fn create_options(opts: &SemaphoreOptions) -> CreateOptions {
    CreateOptions {
        mode: opts.mode,
        init_timeout: opts.init_timeout,
    }
}

impl std::fmt::Debug for SharedSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSemaphore")
            .field("path", &self.map.path())
            .field("available", &self.available())
            .field("max_permits", &self.max)
            .finish()
    }
}

crate::macros::instrumented!(
    SharedSemaphore,
    cxc_mmf::Kind::Semaphore,
    &super::layout::ctr::NAMES
);

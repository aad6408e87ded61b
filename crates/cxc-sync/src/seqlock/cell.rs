//! [`SharedCell<T>`]: a [`SeqLock<T>`] in a file of its own (kind `cell`).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use cxc_mmf::{
    CreateOptions, Expect, FileSpec, Kind, Layout, Mapped, MmfError, Origin, TypeFingerprint,
};
use cxc_sidecar::{AdaptiveInstance, HandshakeHeader, ObservationRing, OpCode, counter_values};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::handle::{check_payload, init_state};
use super::state::{SeqState, counter};
use super::{Abandoned, SeqLock, SeqLockError, WriteError, Written};

/// Size of the cell's fixed block (`docs/shared-cell.md`).
pub(super) const HEAD_SIZE: u32 = size_of::<SeqState>() as u32;

/// Cell files, described once for `create`, `open` and `inspect`.
pub(super) static FILE: FileSpec = FileSpec {
    kind: Kind::Cell,
    head_size: HEAD_SIZE,
    slot_size: 0,
    max_capacity: 0,
    check_params,
};
/// Version of the cell protocol, stored in header `params[0]`. Version 1 was built on
/// the lease's state block; version 2 has its own (`docs/shared-cell.md`).
const CELL_PROTOCOL: u64 = 2;

fn protocol_mismatch(found: u64) -> MmfError {
    MmfError::ParamMismatch {
        name: "cell_protocol",
        expected: CELL_PROTOCOL.to_string(),
        found,
    }
}

pub(super) fn check_params(params: &[u64; 4]) -> Result<(), MmfError> {
    if params[0] != CELL_PROTOCOL {
        return Err(protocol_mismatch(params[0]));
    }
    if params[1..] != [0, 0, 0] {
        return Err(MmfError::ParamMismatch {
            name: "reserved",
            expected: "0".into(),
            found: params[1..].iter().fold(0, |a, p| a | p),
        });
    }
    Ok(())
}

/// One value of at most 48 bytes in a mapped file: any process may
/// [`store`](Self::store) or [`update`](Self::update) it, every process may
/// [`load`](Self::load) it without blocking. The unconditional seqlock cell: no owner,
/// no claim to keep; a writer that stalls or dies mid-store never exposes its bytes and
/// never wedges the cell (`docs/shared-cell.md`).
///
/// # Examples
/// ```
/// use cxc_sync::SharedCell;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let path = dir.path().join("config.cell");
/// let cell = SharedCell::create(&path, [0u64; 3])?;
/// cell.store([1, 2, 3])?;
/// let other = SharedCell::<[u64; 3]>::open(&path)?; // e.g. in another process
/// other.update(|v| v[2] += 1)?;
/// assert_eq!(cell.load(), [1, 2, 4]);
/// # Ok(())
/// # }
/// ```
pub struct SharedCell<T> {
    lock: SeqLock<T>,
    observed: AtomicBool,
}

impl<T> std::fmt::Debug for SharedCell<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCell")
            .field("path", &self.lock.map().map(|m| m.path()))
            .field("lock", &self.lock)
            .finish()
    }
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> SharedCell<T> {
    /// Creates a cell file holding `initial` (mode 0600). Never clobbers.
    ///
    /// # Errors
    /// [`SeqLockError::PayloadTooLarge`]/[`SeqLockError::PayloadAlign`] for an unsuitable
    /// `T`; [`SeqLockError::File`] if the file exists or cannot be written.
    pub fn create(path: impl AsRef<Path>, initial: T) -> Result<Self, SeqLockError> {
        let layout = Self::layout()?;
        let map = Mapped::create(path, layout, &CreateOptions::default(), |s, _| {
            init_state(s, &initial)
        })?;
        Ok(Self::from_map(map))
    }

    /// Creates the cell, or opens it if another process created it first (exactly one
    /// racing process initialises it with its `initial`).
    ///
    /// # Errors
    /// As [`create`](Self::create) and [`open`](Self::open).
    pub fn create_or_open(
        path: impl AsRef<Path>,
        initial: T,
    ) -> Result<(Self, Origin), SeqLockError> {
        let layout = Self::layout()?;
        let (map, origin) = Mapped::create_or_open(
            path,
            layout,
            &CreateOptions::default(),
            &Self::expect(),
            |s, _| init_state(s, &initial),
        )?;
        Ok((Self::from_map(map), origin))
    }

    /// Opens an existing cell file, validating the header, the layout and that it was
    /// created for this `T`.
    ///
    /// # Errors
    /// [`SeqLockError::File`] with the exact mismatch; payload errors as for `create`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SeqLockError> {
        check_payload::<T>()?;
        let path = path.as_ref();
        let map = Mapped::open(path, &Self::expect()).map_err(|e| {
            // A cell of another protocol version has another block size: name the
            // versions rather than the size.
            match cxc_mmf::peek(path) {
                Ok(info)
                    if info.layout.kind == Kind::Cell && info.layout.params[0] != CELL_PROTOCOL =>
                {
                    protocol_mismatch(info.layout.params[0])
                }
                _ => e,
            }
        })?;
        Ok(Self::from_map(map))
    }

    fn layout() -> Result<Layout, SeqLockError> {
        check_payload::<T>()?;
        Ok(FILE.layout(0, TypeFingerprint::of::<T>(), [CELL_PROTOCOL, 0, 0, 0]))
    }

    fn expect() -> Expect<'static> {
        FILE.expect(Some(0), TypeFingerprint::of::<T>())
    }

    fn from_map(map: Mapped<SeqState>) -> Self {
        SharedCell {
            lock: SeqLock::from_map(map),
            observed: AtomicBool::new(false),
        }
    }

    /// The current value; never blocks, never torn.
    #[inline]
    pub fn load(&self) -> T {
        self.lock.read()
    }

    /// Replaces the value (see [`SeqLock::write`]).
    ///
    /// # Errors
    /// As [`SeqLock::write`].
    #[inline]
    pub fn store(&self, value: T) -> Result<Written, WriteError> {
        let w = self.lock.write(value)?;
        if w.abandoned.is_some() {
            self.note_takeover(w);
        }
        Ok(w)
    }

    /// Applies `f` to the current value and publishes the result (see
    /// [`SeqLock::update`]).
    ///
    /// # Errors
    /// As [`SeqLock::update`].
    pub fn update(&self, f: impl FnOnce(&mut T)) -> Result<Written, WriteError> {
        let w = self.lock.update(f)?;
        if w.abandoned.is_some() {
            self.note_takeover(w);
        }
        Ok(w)
    }

    /// Sets this handle's stall timeout (see [`SeqLock::set_stall_timeout`]).
    pub fn set_stall_timeout(&mut self, timeout: Duration) {
        self.lock.set_stall_timeout(timeout);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.lock.map().map_or(Path::new(""), |m| m.path())
    }

    /// The cumulative counters (writer slots reserved and reclaimed, update claims taken
    /// over from dead and stalled updaters, update conflicts).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        counter_values(&counter::NAMES, &self.lock.state().counters)
    }

    #[cold]
    fn note_takeover(&self, w: Written) {
        if !self.observed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Update-claim takeovers are recorded with the lease's takeover op codes
        // (`docs/shared-cell.md`).
        let op = match w.abandoned {
            Some(Abandoned::Died) => OpCode::LeaseClaimDeadOwner,
            _ => OpCode::LeaseClaimStale,
        };
        self.lock.state().ring.record(op, 0, 0);
    }
}

impl<T> AdaptiveInstance for SharedCell<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + 'static,
{
    fn kind(&self) -> Kind {
        Kind::Cell
    }

    fn name(&self) -> String {
        self.path().display().to_string()
    }

    fn ring(&self) -> &ObservationRing {
        &self.lock.state().ring
    }

    fn handshake(&self) -> &HandshakeHeader {
        &self.lock.state().handshake
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        SharedCell::counters(self)
    }

    fn set_observed(&self, observed: bool) {
        self.observed
            .store(observed, std::sync::atomic::Ordering::Relaxed);
    }
}

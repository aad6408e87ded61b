//! What the caller asks of `create` and `open`, and what `create_or_open` did.

use std::time::Duration;

use crate::error::MmfError;
use crate::header::{Kind, Layout, TypeFingerprint};

/// How `create` makes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    /// Permission bits of the new file (default `0o600`). Applied exactly (not masked by
    /// the umask).
    pub mode: u32,
    /// How long `open`/`create_or_open` wait for another process's creation to finish.
    pub init_timeout: Duration,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            mode: 0o600,
            init_timeout: Duration::from_secs(2),
        }
    }
}

/// A primitive's file kind, described once: what `create` writes ([`layout`]) and what
/// `open` and snapshots require ([`expect`]) come from the same fields.
///
/// [`layout`]: FileSpec::layout
/// [`expect`]: FileSpec::expect
///
/// ```
/// use cxc_mmf::{FileSpec, Kind, MmfError, TypeFingerprint};
///
/// fn check(_: &[u64; 4]) -> Result<(), MmfError> { Ok(()) }
/// static SPEC: FileSpec = FileSpec {
///     kind: Kind::Test,
///     head_size: 64,
///     slot_size: 0,
///     max_capacity: 0,
///     check_params: check,
/// };
/// let layout = SPEC.layout(0, TypeFingerprint::of::<u64>(), [1, 0, 0, 0]);
/// let expect = SPEC.expect(Some(0), layout.payload);
/// assert_eq!((layout.kind, expect.kind), (Kind::Test, Kind::Test));
/// assert_eq!(layout.head_size, expect.head_size);
/// ```
#[derive(Debug)]
pub struct FileSpec {
    /// The primitive kind.
    pub kind: Kind,
    /// The fixed block size this build uses.
    pub head_size: u32,
    /// The slot size this build uses (0: no slots).
    pub slot_size: u32,
    /// Largest slot count accepted from a file.
    pub max_capacity: u64,
    /// Validates the primitive parameters; returns a [`MmfError::ParamMismatch`] on error.
    pub check_params: fn(&[u64; 4]) -> Result<(), MmfError>,
}

impl FileSpec {
    /// The layout of a new file of this kind.
    pub fn layout(&self, capacity: u64, payload: TypeFingerprint, params: [u64; 4]) -> Layout {
        Layout {
            kind: self.kind,
            head_size: self.head_size,
            slot_size: self.slot_size,
            capacity,
            payload,
            params,
        }
    }

    /// What opening a file of this kind requires: `capacity` slots (`None`: the file's,
    /// at most `max_capacity`) and `payload`.
    pub fn expect(
        &'static self,
        capacity: Option<u64>,
        payload: TypeFingerprint,
    ) -> Expect<'static> {
        Expect {
            kind: self.kind,
            head_size: self.head_size,
            slot_size: self.slot_size,
            capacity,
            max_capacity: self.max_capacity,
            payload,
            check_params: &self.check_params,
        }
    }
}

/// What `open` requires of a file, beyond the generic header checks.
pub struct Expect<'a> {
    /// The primitive kind.
    pub kind: Kind,
    /// The fixed block size this build uses for `kind`.
    pub head_size: u32,
    /// The slot size this build uses for `kind`.
    pub slot_size: u32,
    /// The exact slot count the caller expects, or `None` to take it from the file.
    pub capacity: Option<u64>,
    /// Largest slot count accepted from a file. A semaphore, rwlock or heartbeat file also
    /// needs at least one slot: one with none is refused.
    pub max_capacity: u64,
    /// The payload type.
    pub payload: TypeFingerprint,
    /// Validates the primitive parameters; returns a [`MmfError::ParamMismatch`] on error.
    pub check_params: &'a dyn Fn(&[u64; 4]) -> Result<(), MmfError>,
}

impl std::fmt::Debug for Expect<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expect")
            .field("kind", &self.kind)
            .field("head_size", &self.head_size)
            .field("slot_size", &self.slot_size)
            .field("capacity", &self.capacity)
            .field("max_capacity", &self.max_capacity)
            .field("payload", &self.payload)
            .finish_non_exhaustive()
    }
}

/// Whether `create_or_open` made the file or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This call created and initialised the file.
    Created,
    /// Another process had created it; this call opened and validated it.
    Opened,
}

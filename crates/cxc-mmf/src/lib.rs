//! Validated shared-memory files for the cxc primitives.
//!
//! Every cxc primitive lives in one file: a fixed 128-byte header ([`header`]) followed by
//! the primitive's fixed block and its slots. This crate owns that format:
//!
//! - [`Mapped`]: a validated mapping that hands out only atomic views ([`AtomicView`]),
//!   never byte slices; bounds and alignment are checked once, when it is made. A
//!   `#[repr(C)]` struct of atomics becomes a view through [`atomic_layout!`].
//! - [`Mapped::create`] never clobbers (the file is written under a temporary name and
//!   renamed into place with `RENAME_NOREPLACE`), [`Mapped::open`] validates every header
//!   field before any typed view exists, and [`Mapped::create_or_open`] resolves start-up
//!   races so exactly one process initialises.
//! - [`MmfError`]: one typed variant per failure, naming what was expected and found.
//! - [`identity`]: process identity (pidfs inode or pid + start time, pid namespace, boot
//!   id) and liveness (dead = the whole thread group is gone), used for crash detection.
//! - [`orphan`]: the look that a library's long-lived thread makes so that it never keeps
//!   alive a process none of whose own threads is left.
//! - [`peek`]: read the header of any cxc file without knowing its kind (read-only).
//! - [`Snapshot`]: a validated private copy of a file, read through a read-only mapping
//!   with loads only (for tools such as `cxc inspect`).
//!
//! # Examples
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, TypeFingerprint};
//!
//! # fn main() -> Result<(), cxc_mmf::MmfError> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("counter.cxc");
//! let layout = Layout {
//!     kind: Kind::Test,
//!     head_size: 64,
//!     slot_size: 0,
//!     capacity: 0,
//!     payload: TypeFingerprint::NONE,
//!     params: [0; 4],
//! };
//! let a: Mapped<AtomicU64> = Mapped::create(
//!     &path,
//!     layout,
//!     &CreateOptions::default(),
//!     |c: &AtomicU64, _: &[()]| c.store(1, Ordering::Relaxed),
//! )?;
//! let expect = Expect {
//!     kind: Kind::Test,
//!     head_size: 64,
//!     slot_size: 0,
//!     capacity: Some(0),
//!     max_capacity: 0,
//!     payload: TypeFingerprint::NONE,
//!     check_params: &|_| Ok(()),
//! };
//! let b: Mapped<AtomicU64> = Mapped::open(&path, &expect)?;
//! a.head().fetch_add(1, Ordering::AcqRel);
//! assert_eq!(b.head().load(Ordering::Acquire), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Limits
//! A process that truncates a mapped file under another process makes that process's next
//! access fault (SIGBUS); that is hostile, not something validation at open can prevent.

mod error;
pub mod header;
pub mod identity;
pub mod orphan;
mod region;

pub use error::{FoundKind, MmfError};
pub use header::{
    FORMAT_VERSION, HEADER_LEN, HeaderInfo, Kind, Layout, MAGIC, MAX_FILE_LEN, TypeFingerprint,
};
#[doc(hidden)]
pub use region::__private;
pub use region::{
    AtomicView, CreateOptions, Expect, FileSpec, Mapped, Origin, Snapshot, exit_on_bus_error, peek,
    read_words,
};

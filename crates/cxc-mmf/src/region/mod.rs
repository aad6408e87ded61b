//! Create, open and validate a mapped file, and hand out typed atomic views of it.
//!
//! - `atomic`: [`AtomicView`], the types a mapping hands out, and `atomic_layout!`.
//! - `codec`: the header's fields, read and written through atomics; its checksum.
//! - `options`: [`CreateOptions`], [`Expect`], [`Origin`].
//! - `validate`: format, lengths, checksum and caller expectations; view shapes.
//! - `view`: [`AtomicView`] and [`Mapped`] with its accessors.
//! - `open`: opening and validating an existing file, [`peek`].
//! - `create`: creating, initialising and publishing a new file.
//! - `snapshot`: [`Snapshot`], a private copy of a file read through a read-only mapping.
//!
//! Files depend only on the ones listed before them.

mod atomic;
mod codec;
mod create;
mod open;
mod options;
mod snapshot;
mod validate;
mod view;

pub use atomic::{__private, AtomicView};
pub use open::peek;
pub use options::{CreateOptions, Expect, FileSpec, Origin};
pub use snapshot::{Snapshot, exit_on_bus_error, read_words};
pub use view::Mapped;

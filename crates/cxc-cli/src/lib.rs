//! The library half of the `cxc` command: decoding any cxc file for `inspect`/`watch`.
//!
//! - [`inspect_file`] / [`inspect_file_json`]: the whole `cxc inspect` output for one
//!   file, or a one-line error (what fuzzers and other tools call).
//! - [`load`] reads and validates a file into a [`View`]; [`render::text`] and
//!   [`render::json`] draw it; [`watch`] redraws it in place.
//! - [`CliError`] and the exit codes ([`EXIT_ERROR`], [`EXIT_TIMEOUT`],
//!   [`EXIT_LEASE_LOST`]) shared with the binary.
#![forbid(unsafe_code)]

mod error;
pub mod files;
mod inspect;
pub mod prometheus;
pub mod render;

use std::path::Path;

pub use error::{
    CliError, EXIT_CANNOT_EXEC, EXIT_ERROR, EXIT_LEASE_LOST, EXIT_NOT_FOUND, EXIT_TIMEOUT,
};
pub use inspect::{
    CELL_BYTES, CellBytes, CellView, HeartbeatView, MIN_WATCH_INTERVAL, SemaphoreView, State, View,
    load, watch,
};

/// What `cxc inspect PATH` prints, or the one-line error it reports.
///
/// # Errors
/// The message `cxc inspect` prints (after `cxc: `) for a missing, foreign, corrupt or
/// unsupported file.
///
/// # Examples
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let path = dir.path().join("jobs.sem");
/// cxc::SharedSemaphore::create(&path, 2, 3)?;
/// let text = cxc_cli::inspect_file(&path)?;
/// assert!(text.contains("permits:     2/3 available"));
/// assert!(cxc_cli::inspect_file(dir.path().join("missing")).is_err());
/// # Ok(())
/// # }
/// ```
pub fn inspect_file(path: impl AsRef<Path>) -> Result<String, String> {
    load(path.as_ref())
        .map(|v| render::text(&v))
        .map_err(|e| e.msg)
}

/// What `cxc inspect --json PATH` prints (one line of JSON, without the newline), or the
/// one-line error it reports.
///
/// # Errors
/// As [`inspect_file`].
pub fn inspect_file_json(path: impl AsRef<Path>) -> Result<String, String> {
    load(path.as_ref())
        .map(|v| render::json(&v).to_string())
        .map_err(|e| e.msg)
}

/// Whether process `pid` lives, as `inspect` marks owners and holders: `dead` (no such
/// process, or another process with that pid than the recorded identity `unique`),
/// `alive`, or `unknown` (`/proc` cannot tell, or the recorded identity is of another
/// form). Reads `/proc` only.
pub fn liveness_mark(pid: u32, unique: Option<u64>) -> &'static str {
    use cxc::mmf::identity::{FALLBACK_BIT, Identity, proc_group_alive};
    if pid == 0 {
        return "unknown";
    }
    match proc_group_alive(pid) {
        None => "unknown",
        Some(false) => "dead",
        Some(true) => match unique {
            None => "alive",
            Some(u) => match Identity::of_pid(pid) {
                Some(id) if id.unique == u => "alive",
                Some(id) if (id.unique ^ u) & FALLBACK_BIT == 0 => "dead",
                _ => "unknown",
            },
        },
    }
}

//! The library half of the `cxc` command: decoding any cxc file for `inspect`/`watch`.
//!
//! - [`inspect_file`] / [`inspect_file_json`]: the whole `cxc inspect` output for one
//!   file, or a one-line error (what fuzzers and other tools call).
//! - [`load`] reads and validates a file into a [`View`]; [`render::text`] and
//!   [`render::json`] draw it; [`watch`] redraws it in place.
//! - [`CliError`] and the exit codes ([`EXIT_ERROR`], [`EXIT_TIMEOUT`],
//!   [`EXIT_LEASE_LOST`], [`EXIT_NOT_FOUND`], [`EXIT_CANNOT_EXEC`]) shared with the binary.
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
    CELL_BYTES, CellBytes, CellView, DEMO_BOARD_HEAD, DEMO_BOARD_UNIT, HeartbeatView,
    MIN_WATCH_INTERVAL, SemaphoreView, State, TestView, View, load, watch,
};

/// Writes one line to stderr, formatted as `eprintln!` does, and ignores a failed write.
///
/// `eprintln!` panics when the write fails (stderr a pipe whose reader is gone: the Rust
/// runtime ignores SIGPIPE, so the write returns `EPIPE`; or `/dev/full`), which turned a
/// message into a crash (exit 101), or, in a keeper's monitor thread, into a signal that
/// no longer ended the run. A message that cannot be written is dropped; the exit code
/// still says what happened. The line is written in one `write(2)` where the kernel
/// allows it, so lines of concurrent runs sharing a stderr do not interleave.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::write_stderr(&::std::format!("{}\n", ::std::format_args!($($arg)*)))
    };
}

/// Writes `text` to stdout (as [`write_stdout`]) and ignores a failed write: for the
/// report of a command whose exit code tells its result by itself (`cxc create`: the
/// file was made whether or not the line was read).
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {{
        let _ = $crate::write_stdout(&::std::format!("{}\n", ::std::format_args!($($arg)*)));
    }};
}

/// Writes `text` to stderr, ignoring a failed write (see [`say!`]).
pub fn write_stderr(text: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Writes `text` to stdout and flushes it; the error if that failed.
///
/// # Errors
/// The failed write (see [`stdout_outcome`] for how the commands treat it).
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// What a failed write of a command's report to stdout means (docs/cli.md, "Output that
/// cannot be written"): a reader that is gone (`EPIPE`: `cxc inspect F | head -1`) ends
/// the command quietly with success, as a program that SIGPIPE ends prints nothing; any
/// other error (`/dev/full`: `ENOSPC`) is the command's failure, exit 2.
///
/// # Errors
/// [`EXIT_ERROR`] with `cannot write to stdout: ...` for an error other than `EPIPE`.
pub fn stdout_outcome(written: std::io::Result<()>) -> Result<(), CliError> {
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::usage(format!("cannot write to stdout: {e}"))),
    }
}

/// A file's path as the Prometheus report labels it: the path itself when it is UTF-8,
/// else with every backslash doubled and every byte that is not UTF-8 written as `\xHH`,
/// so distinct paths always get distinct label values (a lossy conversion would show the
/// files `x\xff` and `x\xfe` both as `x\u{fffd}`, and their series twice).
///
/// # Examples
/// ```
/// use std::os::unix::ffi::OsStrExt;
/// use std::path::Path;
///
/// let odd = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/a\\b\xff"));
/// assert_eq!(cxc_cli::path_name(odd), r"/tmp/a\\b\xff");
/// // A UTF-8 path is named as it is, so it never collides with an escaped one.
/// assert_eq!(cxc_cli::path_name(Path::new(r"/tmp/a\b")), r"/tmp/a\b");
/// ```
pub fn path_name(path: &Path) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', r"\\"));
        for b in chunk.invalid() {
            let _ = write!(out, r"\x{b:02x}");
        }
    }
    out
}

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

/// The command line of live process `pid` (read from `/proc/PID/cmdline`, arguments
/// joined by spaces, at most 200 characters), if readable and not empty (kernel threads
/// and zombies have none).
pub fn cmdline(pid: u32) -> Option<String> {
    if pid == 0 {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let line = args.join(" ");
    if line.is_empty() {
        return None;
    }
    Some(match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line,
    })
}

/// How long ago live process `pid` started (from `/proc/PID/stat` and `/proc/uptime`).
pub fn process_age(pid: u32) -> Option<std::time::Duration> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name: state is field 3, starttime field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start_ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
    let age = up - start_ticks as f64 / hz;
    (age >= 0.0).then(|| std::time::Duration::from_secs_f64(age))
}

/// The command line and age of holder `pid`, shown only when its liveness `mark` is
/// `alive` (a dead holder's pid may name another process by now).
pub fn holder_process(pid: u32, mark: &str) -> (Option<String>, Option<std::time::Duration>) {
    if mark == "alive" {
        (cmdline(pid), process_age(pid))
    } else {
        (None, None)
    }
}

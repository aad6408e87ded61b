//! The CLI's one-line error and its exit codes.

/// Exit code when `--wait` ran out, or `--nonblock` found the claim taken (as flock(1);
/// `-E`/`--conflict-exit-code` changes it).
pub const EXIT_TIMEOUT: u8 = 1;
/// Exit code when the command could not be found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code when the command was found but could not be run.
pub const EXIT_CANNOT_EXEC: u8 = 126;
/// Exit code for usage errors and unusable files.
pub const EXIT_ERROR: u8 = 2;
/// Exit code when the lease was lost while the command ran (the command's process group
/// was terminated).
pub const EXIT_LEASE_LOST: u8 = 75;

/// A one-line error and the exit code for it.
#[derive(Debug)]
pub struct CliError {
    /// The process exit code.
    pub code: u8,
    /// The message, printed after `cxc: `.
    pub msg: String,
}

impl CliError {
    /// An error with [`EXIT_ERROR`].
    pub fn usage(msg: impl Into<String>) -> Self {
        CliError {
            code: EXIT_ERROR,
            msg: msg.into(),
        }
    }
}

impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError::usage(e.to_string())
    }
}

//! The CLI's one-line error and its exit codes.

/// Exit code when `--wait` ran out.
pub const EXIT_TIMEOUT: u8 = 1;
/// Exit code for usage errors and unusable files.
pub const EXIT_ERROR: u8 = 2;
/// Exit code when the lease was lost while the command ran.
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

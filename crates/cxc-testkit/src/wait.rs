//! Polling with a deadline.

use std::path::Path;
use std::time::{Duration, Instant};

/// Polls `cond` every millisecond until it holds (`true`) or `timeout` has passed
/// (`false`); `cond` is always tried at least once, and once more at the deadline.
///
/// ```
/// use std::time::Duration;
/// let mut n = 0;
/// assert!(cxc_testkit::wait_until(Duration::from_secs(5), || { n += 1; n == 3 }));
/// assert!(!cxc_testkit::wait_until(Duration::from_millis(5), || false));
/// ```
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `path` exists (e.g. a marker file a child touches), at most `timeout`.
///
/// ```
/// use std::time::Duration;
/// let missing = std::env::temp_dir().join("cxc-testkit-no-such-file");
/// assert!(!cxc_testkit::wait_for_path(&missing, Duration::from_millis(5)));
/// ```
pub fn wait_for_path(path: &Path, timeout: Duration) -> bool {
    wait_until(timeout, || path.exists())
}

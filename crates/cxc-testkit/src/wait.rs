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

/// A child's wait for a marker `path` its parent creates: polls every 50 µs (the
/// moment matters to tests that time what follows), and exits the child with status 4
/// if `path` has not appeared within `patience` (the parent failed or went away).
pub fn child_wait_for_path(path: &Path, patience: Duration) {
    let t = Instant::now();
    while !path.exists() {
        if t.elapsed() > patience {
            std::process::exit(4);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Serializes the tests of one test binary that must not overlap (e.g. tests that
/// time cross-process wake-ups on a 2-core machine): hold the guard for the test's
/// length. A test that panicked while holding it does not poison it for the others.
///
/// ```
/// let _one_at_a_time = cxc_testkit::serial();
/// ```
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

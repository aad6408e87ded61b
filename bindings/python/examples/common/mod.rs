//! What the interop examples share: holding for a while.

use std::io::Write;
use std::time::{Duration, Instant};

/// Prints `line` (flushed: the test reading it learns at once that this process holds),
/// then calls `keep` every `period` for `secs` seconds (a decimal number, as given on
/// the command line).
pub fn hold_for(secs: &str, line: &str, period: Duration, mut keep: impl FnMut()) {
    let secs: f64 = secs.parse().expect("seconds");
    let mut out = std::io::stdout();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        keep();
        std::thread::sleep(period);
    }
}

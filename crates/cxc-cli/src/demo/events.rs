//! The demo's shared timeline: every process appends one line per event to `events.log`
//! (`O_APPEND`, one `write` per line, so lines from different processes never mix).

use std::io::Write;
use std::path::Path;

/// One timeline entry.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) t_ns: u64,
    pub(crate) who: String,
    pub(crate) what: String,
}

/// Appends an event for `who` (e.g. "coordinator-A", "worker-2").
pub(crate) fn log(dir: &Path, who: &str, what: &str) {
    let line = format!("{} {} {}\n", cxc::sidecar::monotonic_ns(), who, what);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("events.log"))
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Reads the timeline, oldest first.
pub(crate) fn read(dir: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let mut events: Vec<Event> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            Some(Event {
                t_ns: parts.next()?.parse().ok()?,
                who: parts.next()?.to_string(),
                what: parts.next().unwrap_or("").to_string(),
            })
        })
        .collect();
    events.sort_by_key(|e| e.t_ns);
    events
}

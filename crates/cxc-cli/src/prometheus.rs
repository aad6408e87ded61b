//! `--format prometheus`: the Prometheus text exposition format (counters end in
//! `_total`, every family has HELP and TYPE lines and its samples together), and the
//! `watch --textfile` loop that rewrites a node-exporter textfile-collector file
//! atomically.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use crate::inspect::{State, View};
use crate::{CliError, liveness_mark};

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<String>,
}

#[derive(Default)]
struct Families(Vec<Family>);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Families {
    fn add(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        labels: &[(&str, String)],
        value: u64,
    ) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let sample = format!("{name}{{{}}} {value}", labels.join(","));
        match self.0.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push(sample),
            None => self.0.push(Family {
                name,
                kind,
                help,
                samples: vec![sample],
            }),
        }
    }
}

/// The exposition-format report of `views` (one family block per metric, all files).
pub fn render(views: &[View]) -> String {
    let mut f = Families::default();
    for v in views {
        let path = crate::path_name(&v.path);
        let p = || ("path", path.clone());
        match &v.state {
            State::Lease(l) => {
                f.add(
                    "cxc_lease_held",
                    "gauge",
                    "1 if the lease has an owner.",
                    &[p()],
                    u64::from(l.owner.is_some()),
                );
                f.add(
                    "cxc_lease_generation",
                    "gauge",
                    "Generation (fencing token) of the current or last claim.",
                    &[p()],
                    l.generation,
                );
                f.add(
                    "cxc_lease_heartbeat_age_epochs",
                    "gauge",
                    "Epochs since the holder's last heartbeat.",
                    &[p()],
                    l.epoch.saturating_sub(l.heartbeat_epoch),
                );
                f.add(
                    "cxc_lease_waiters",
                    "gauge",
                    "Processes blocked waiting for the lease.",
                    &[p()],
                    u64::from(l.waiters),
                );
                if let Some(pid) = l.owner {
                    f.add(
                        "cxc_lease_owner_info",
                        "gauge",
                        "The lease owner: pid and liveness (dead, alive, unknown).",
                        &[
                            p(),
                            ("pid", pid.to_string()),
                            ("state", liveness_mark(pid, l.owner_start).into()),
                        ],
                        1,
                    );
                }
                for (n, c) in cxc::lease::counter::NAMES.iter().zip(l.counters) {
                    f.add(
                        "cxc_lease_events_total",
                        "counter",
                        "Cumulative lease events, by event.",
                        &[p(), ("event", (*n).into())],
                        c,
                    );
                }
            }
            State::Semaphore(m) => {
                f.add(
                    "cxc_semaphore_permits_available",
                    "gauge",
                    "Permits available now.",
                    &[p()],
                    u64::from(m.available),
                );
                f.add(
                    "cxc_semaphore_permits_max",
                    "gauge",
                    "Most permits that can be available.",
                    &[p()],
                    u64::from(m.max),
                );
                f.add(
                    "cxc_semaphore_holder_slots",
                    "gauge",
                    "Slots of the holder table.",
                    &[p()],
                    m.holder_capacity as u64,
                );
                for h in &m.holders {
                    f.add(
                        "cxc_semaphore_holder_permits",
                        "gauge",
                        "Permits held by a holder: slot, pid and liveness.",
                        &[
                            p(),
                            ("slot", h.slot.to_string()),
                            ("pid", h.pid.to_string()),
                            ("state", liveness_mark(h.pid, None).into()),
                        ],
                        u64::from(h.held),
                    );
                }
                let st = &m.stats;
                for (n, c) in [
                    ("contended", st.contended),
                    ("sleeps", st.sleeps),
                    ("timeouts", st.timeouts),
                    ("wakes", st.wakes),
                    ("overflow_rejected", st.overflow_rejected),
                    ("reclaimed_permits", st.reclaimed_permits),
                    ("reclaimed_holders", st.reclaimed_holders),
                    ("registered", st.registered),
                    ("table_full", st.table_full),
                    ("not_held_rejected", st.not_held_rejected),
                    ("disowned", st.disowned),
                    ("reclaim_scans", st.reclaim_scans),
                ] {
                    f.add(
                        "cxc_semaphore_events_total",
                        "counter",
                        "Cumulative semaphore events, by event.",
                        &[p(), ("event", n.into())],
                        c,
                    );
                }
            }
            State::Cell(c) => {
                f.add(
                    "cxc_cell_info",
                    "gauge",
                    "A shared cell's published value (hex), always 1.",
                    &[p(), ("value", c.hex())],
                    1,
                );
                f.add(
                    "cxc_cell_value_bytes",
                    "gauge",
                    "Bytes of a shared cell's value.",
                    &[p()],
                    c.value.len() as u64,
                );
                for (n, v) in &c.counters {
                    f.add(
                        "cxc_cell_events_total",
                        "counter",
                        "Cumulative shared-cell events, by event.",
                        &[p(), ("event", (*n).into())],
                        *v,
                    );
                }
            }
            State::Heartbeat(h) => {
                f.add(
                    "cxc_heartbeat_slots",
                    "gauge",
                    "Slots of the heartbeat table.",
                    &[p()],
                    h.capacity as u64,
                );
                f.add(
                    "cxc_heartbeat_slots_in_use",
                    "gauge",
                    "Registered or fenced slots.",
                    &[p()],
                    h.slots.len() as u64,
                );
                f.add(
                    "cxc_heartbeat_epoch",
                    "gauge",
                    "The table's current epoch.",
                    &[p()],
                    h.epoch,
                );
                for (i, s) in &h.slots {
                    f.add(
                        "cxc_heartbeat_slot_lag_epochs",
                        "gauge",
                        "Epochs since a slot's last heartbeat: slot, pid and liveness.",
                        &[
                            p(),
                            ("slot", i.to_string()),
                            ("pid", s.pid.to_string()),
                            ("state", liveness_mark(s.pid, None).into()),
                        ],
                        h.epoch.saturating_sub(s.last_seen_epoch),
                    );
                }
                for (n, c) in &h.counters {
                    f.add(
                        "cxc_heartbeat_events_total",
                        "counter",
                        "Cumulative heartbeat-table events, by event.",
                        &[p(), ("event", (*n).into())],
                        *c,
                    );
                }
            }
            State::RwLock(r) => {
                f.add(
                    "cxc_rwlock_write_locked",
                    "gauge",
                    "1 if a writer holds the lock (or drains its readers).",
                    &[p()],
                    u64::from(r.writer.is_some()),
                );
                f.add(
                    "cxc_rwlock_token",
                    "gauge",
                    "Fencing token of the current or last write lock.",
                    &[p()],
                    r.token,
                );
                f.add(
                    "cxc_rwlock_read_holds",
                    "gauge",
                    "Read holds of all processes.",
                    &[p()],
                    r.holders.iter().map(|h| h.readers).sum(),
                );
                if let Some((slot, pid)) = r.writer {
                    f.add(
                        "cxc_rwlock_writer_info",
                        "gauge",
                        "The writer: slot, pid and liveness (dead, alive, unknown).",
                        &[
                            p(),
                            ("slot", slot.to_string()),
                            ("pid", pid.to_string()),
                            ("state", liveness_mark(pid, None).into()),
                        ],
                        1,
                    );
                }
                for (n, c) in &r.counters {
                    f.add(
                        "cxc_rwlock_events_total",
                        "counter",
                        "Cumulative rwlock events, by event.",
                        &[p(), ("event", (*n).into())],
                        *c,
                    );
                }
            }
            // Test-kind files (the demo's board) hold no metrics of a primitive.
            State::Test(_) => {}
        }
    }
    let mut out = String::new();
    for fam in &f.0 {
        let _ = writeln!(out, "# HELP {} {}", fam.name, fam.help);
        let _ = writeln!(out, "# TYPE {} {}", fam.name, fam.kind);
        for s in &fam.samples {
            let _ = writeln!(out, "{s}");
        }
    }
    out
}

/// Rewrites `out` every `interval` (at least the watch floor) with the report of
/// `paths`, atomically (a temporary file in the same directory, renamed over it).
///
/// # Errors
/// A file that cannot be loaded, or `out` that cannot be written.
pub fn textfile_loop(
    paths: &[std::path::PathBuf],
    out: &Path,
    interval: Duration,
) -> Result<(), CliError> {
    textfile_loop_waiting(paths, out, interval, false)
}

/// [`textfile_loop`], and with `wait_for_file` a file that does not exist yet (and was
/// never seen) is waited for, as `watch --wait-for-file` does: `out` is first written
/// once every file loads. The report keeps `out`'s permission bits if it exists, else
/// gets `0644` (a collector often runs as another user).
///
/// # Errors
/// As [`textfile_loop`].
pub fn textfile_loop_waiting(
    paths: &[std::path::PathBuf],
    out: &Path,
    interval: Duration,
    wait_for_file: bool,
) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let interval = interval.max(crate::MIN_WATCH_INTERVAL);
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let cannot = |e: &dyn std::fmt::Display| {
        CliError::usage(format!("{}: cannot write: {e}", out.display()))
    };
    let mut seen = false;
    loop {
        let views = paths
            .iter()
            .map(|p| crate::load(p))
            .collect::<Result<Vec<_>, _>>();
        let views = match views {
            Ok(v) => v,
            Err(_) if wait_for_file && !seen && paths.iter().any(|p| !p.exists()) => {
                std::thread::sleep(interval);
                continue;
            }
            Err(e) => return Err(e),
        };
        seen = true;
        let text = render(&views);
        let mode = std::fs::metadata(out)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644);
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| cannot(&e))?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(|e| cannot(&e))?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| cannot(&e))?;
        tmp.persist(out).map_err(|e| cannot(&e.error))?;
        std::thread::sleep(interval);
    }
}

//! Loading any cxc file for `inspect` and `watch`: detect the kind from the header, then
//! open it with the primitive's own validation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cxc::Kind;
use cxc::mmf::HeaderInfo;

use crate::CliError;

/// Everything `inspect` shows about one file.
#[derive(Debug)]
pub struct View {
    /// The file.
    pub path: PathBuf,
    /// Its validated header.
    pub info: HeaderInfo,
    /// The primitive's state.
    pub state: State,
    /// The shared strategy and its generation.
    pub strategy: (cxc::Strategy, u32),
    /// Observations still in the file's ring, oldest first.
    pub recent: Vec<cxc::Observation>,
}

/// The primitive-specific part of a [`View`].
#[derive(Debug)]
pub enum State {
    /// A lease's status (payload type not checked).
    Lease(cxc::LeaseStatus),
    /// A heartbeat table's slots and counters.
    Heartbeat(HeartbeatView),
    /// A semaphore's permits, holders and counters.
    Semaphore(SemaphoreView),
    /// A shared cell's published value and counters.
    Cell(CellView),
}

/// The payload of the cells `cxc create cell` makes and `inspect` decodes: 48 raw bytes
/// (the largest value a cell holds).
pub type CellBytes = [u8; CELL_BYTES];
/// Bytes of [`CellBytes`].
pub const CELL_BYTES: usize = 48;

/// A shared cell's state.
#[derive(Debug)]
pub struct CellView {
    /// The published value.
    pub value: CellBytes,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
}

impl CellView {
    /// The value as lowercase hex, two digits a byte.
    pub fn hex(&self) -> String {
        self.value.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn cell(path: &Path, info: &HeaderInfo) -> Result<cxc::SharedCell<CellBytes>, CliError> {
    let payload = info.layout.payload;
    if payload != cxc::mmf::TypeFingerprint::of::<CellBytes>() {
        return Err(CliError::usage(format!(
            "{}: a cell of a {}-byte payload type this build cannot decode (inspect reads \
             the cells `cxc create cell` makes: {CELL_BYTES} raw bytes)",
            path.display(),
            payload.size
        )));
    }
    cxc::SharedCell::<CellBytes>::open(path)
        .map_err(|e| CliError::usage(crate::files::message(path, &e)))
}

/// A semaphore's state.
#[derive(Debug)]
pub struct SemaphoreView {
    /// Permits available now.
    pub available: u32,
    /// The most permits that can be available.
    pub max: u32,
    /// Processes recorded as holding permits.
    pub holders: Vec<cxc::HolderInfo>,
    /// Slots in the holder table.
    pub holder_capacity: usize,
    /// Cumulative counters.
    pub stats: cxc::SemaphoreStats,
}

/// A heartbeat table's state.
#[derive(Debug)]
pub struct HeartbeatView {
    /// Number of slots.
    pub capacity: usize,
    /// The table's current epoch.
    pub epoch: u64,
    /// The epoch source.
    pub epoch_mode: cxc::EpochMode,
    /// Registered (or fenced-with-bits) slots: index and snapshot.
    pub slots: Vec<(usize, cxc::HeartbeatSnapshot)>,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
}

fn heartbeat(t: &cxc::HeartbeatTable) -> HeartbeatView {
    let slots = (0..t.capacity())
        .filter_map(|i| t.snapshot(i).map(|s| (i, s)))
        .filter(|(_, s)| s.pid != 0 || s.in_flight_bitmap != 0)
        .collect();
    let counters = cxc::heartbeat_counter::NAMES
        .iter()
        .zip(t.counters())
        .filter(|(n, _)| !n.is_empty())
        .map(|(n, c)| (*n, c))
        .collect();
    HeartbeatView {
        capacity: t.capacity(),
        epoch: t.global_epoch(),
        epoch_mode: t.epoch_mode(),
        slots,
        counters,
    }
}

/// Reads and validates `path`.
///
/// # Errors
/// [`CliError`] with [`EXIT_ERROR`](crate::EXIT_ERROR) for a missing, foreign, corrupt or
/// unsupported file.
pub fn load(path: &Path) -> Result<View, CliError> {
    let info = cxc::mmf::peek(path)?;
    let (state, strategy, recent) = match info.layout.kind {
        Kind::Lease => {
            let mut l = cxc::lease::inspect(path)?;
            let recent = std::mem::take(&mut l.recent);
            let strategy = l.strategy;
            (State::Lease(l), strategy, recent)
        }
        Kind::Heartbeat => {
            let t = cxc::HeartbeatTable::open_any(path)?;
            (
                State::Heartbeat(heartbeat(&t)),
                t.strategy(),
                t.recent_observations(),
            )
        }
        Kind::Semaphore => {
            let s = cxc::SharedSemaphore::open_unregistered(path)?;
            let view = SemaphoreView {
                available: s.available(),
                max: s.max_permits(),
                holders: s.holders(),
                holder_capacity: s.holder_capacity(),
                stats: s.stats(),
            };
            (
                State::Semaphore(view),
                s.strategy(),
                s.recent_observations(),
            )
        }
        Kind::Cell => {
            use cxc::AdaptiveInstance;
            let c = cell(path, &info)?;
            let view = CellView {
                value: c.load(),
                counters: cxc::SharedCell::counters(&c),
            };
            (
                State::Cell(view),
                c.handshake().current(),
                c.ring().snapshot(),
            )
        }
        other => {
            return Err(CliError::usage(format!(
                "{}: {other} files are not supported by this build",
                path.display()
            )));
        }
    };
    Ok(View {
        path: path.to_path_buf(),
        info,
        state,
        strategy,
        recent,
    })
}

/// The shortest `watch` interval: shorter ones are raised to it.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Redraws the view every `interval` (at least [`MIN_WATCH_INTERVAL`]) until interrupted:
/// in place on a terminal, as plain successive reports (separated by a blank line)
/// otherwise. `out_format` renders one view.
///
/// # Errors
/// Exit 2 when the file is missing (unless `wait_for_file`: then it waits for it to
/// appear) or stops being a cxc file; other errors are shown and retried.
pub fn watch(
    path: &Path,
    interval: Duration,
    wait_for_file: bool,
    render: &dyn Fn(&View) -> String,
) -> Result<(), CliError> {
    use std::io::IsTerminal;
    let interval = interval.max(MIN_WATCH_INTERVAL);
    let mut out = std::io::stdout();
    let tty = out.is_terminal();
    let mut seen = false;
    loop {
        let text = match load(path) {
            Ok(v) => {
                seen = true;
                render(&v)
            }
            Err(e) => {
                let missing = !path.exists();
                let waiting = missing && wait_for_file && !seen;
                if !waiting && (missing || !seen) {
                    return Err(e);
                }
                format!("{}\n", e.msg)
            }
        };
        let written = if tty {
            // Clear the screen and home the cursor, then draw.
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            writeln!(out, "{text}")
        };
        // A closed pipe (e.g. `| head`) ends the watch.
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

//! Loading any cxc file for `inspect` and `watch`: detect the kind from the header, then
//! read it with the primitive's own validation, read-only (a private copy taken through
//! a read-only mapping with loads only: nothing is written, nothing registered).

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
    /// The shared strategy and its generation (`None`: the kind has none).
    pub strategy: Option<(cxc::Strategy, u32)>,
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
    /// A reader-writer lock's writer, holders and counters.
    RwLock(cxc::RwLockSnapshot),
    /// A file of the test kind (such as the demo's work board), as raw words.
    Test(TestView),
}

/// The payload of the cells `cxc create cell` makes: 48 raw bytes (the largest value a
/// cell holds).
pub type CellBytes = [u8; CELL_BYTES];
/// Bytes of [`CellBytes`].
pub const CELL_BYTES: usize = 48;

/// A shared cell's state.
#[derive(Debug)]
pub struct CellView {
    /// The published value: the payload type's bytes.
    pub value: Vec<u8>,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
}

impl CellView {
    /// The value as lowercase hex, two digits a byte.
    pub fn hex(&self) -> String {
        hex(&self.value)
    }
}

/// `bytes` as lowercase hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first `size` bytes of payload words (native byte order, as stored).
pub(crate) fn payload_bytes(words: &[u64], size: u32) -> Vec<u8> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes[..(size as usize).min(bytes.len())].to_vec()
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

/// A file of the test kind, shown as words.
#[derive(Debug)]
pub struct TestView {
    /// The fixed block's words.
    pub head: Vec<u64>,
    /// Each slot's words.
    pub slots: Vec<Vec<u64>>,
    /// Names of the head and slot words when the layout is the demo's work board
    /// (`cxc demo`), else `None`.
    pub names: Option<(&'static [&'static str], &'static [&'static str])>,
}

/// Names of the demo board's head words (the demo's `board.rs`, in order).
pub const DEMO_BOARD_HEAD: [&str; 8] = [
    "units",
    "done",
    "shutdown",
    "in_use",
    "max_in_use",
    "violations",
    "completions",
    "cap",
];
/// Names of the demo board's unit words (the demo's `board.rs`, in order).
pub const DEMO_BOARD_UNIT: [&str; 4] = ["state", "done", "reclaimed", "starts"];

fn test_view(info: &HeaderInfo, words: &[u64]) -> TestView {
    let l = &info.layout;
    let head_words = (l.head_size / 8) as usize;
    let slot_words = (l.slot_size / 8) as usize;
    let head = words.iter().take(head_words).copied().collect();
    let slots = if slot_words == 0 {
        Vec::new()
    } else {
        words
            .get(head_words..)
            .unwrap_or_default()
            .chunks_exact(slot_words)
            .take(usize::try_from(l.capacity).unwrap_or(usize::MAX))
            .map(<[u64]>::to_vec)
            .collect()
    };
    let board = head_words == DEMO_BOARD_HEAD.len()
        && slot_words == DEMO_BOARD_UNIT.len()
        && l.params == [0; 4]
        && l.payload == cxc::mmf::TypeFingerprint::NONE;
    TestView {
        head,
        slots,
        names: board.then_some((&DEMO_BOARD_HEAD[..], &DEMO_BOARD_UNIT[..])),
    }
}

/// Reads and validates `path` without writing anything: the file is opened and mapped
/// read-only and copied with loads only (no identity registered, no counter bumped), so
/// read permission is enough.
///
/// # Errors
/// [`CliError`] with [`EXIT_ERROR`](crate::EXIT_ERROR) for a missing, foreign, corrupt or
/// unsupported file.
pub fn load(path: &Path) -> Result<View, CliError> {
    let file_err =
        |e: &dyn crate::files::FileError| CliError::usage(crate::files::message(path, e));
    let info = cxc::mmf::peek(path).map_err(|e| file_err(&e))?;
    let (state, strategy, recent) = match info.layout.kind {
        Kind::Lease => {
            let mut l = cxc::lease::inspect(path).map_err(|e| file_err(&e))?;
            let recent = std::mem::take(&mut l.recent);
            let strategy = l.strategy;
            (State::Lease(l), Some(strategy), recent)
        }
        Kind::Heartbeat => {
            let t = cxc::HeartbeatTable::inspect(path).map_err(|e| file_err(&e))?;
            let slots = t
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.map(|s| (i, s)))
                .filter(|(_, s)| s.pid != 0 || s.in_flight_bitmap != 0)
                .collect();
            let counters = cxc::heartbeat_counter::NAMES
                .iter()
                .zip(t.counters)
                .filter(|(n, _)| !n.is_empty())
                .map(|(n, c)| (*n, c))
                .collect();
            let view = HeartbeatView {
                capacity: t.capacity,
                epoch: t.epoch,
                epoch_mode: t.epoch_mode,
                slots,
                counters,
            };
            (State::Heartbeat(view), Some(t.strategy), t.recent)
        }
        Kind::Semaphore => {
            let s = cxc::SharedSemaphore::inspect(path).map_err(|e| file_err(&e))?;
            let view = SemaphoreView {
                available: s.available,
                max: s.max_permits,
                holders: s.holders,
                holder_capacity: s.holder_capacity,
                stats: s.stats,
            };
            (State::Semaphore(view), Some(s.strategy), s.recent)
        }
        Kind::Cell => {
            let c = cxc::SharedCell::<()>::inspect(path).map_err(|e| file_err(&e))?;
            let view = CellView {
                value: payload_bytes(&c.value_words, c.payload_type.size),
                counters: c.counters,
            };
            (State::Cell(view), Some(c.strategy), c.recent)
        }
        Kind::RwLock => {
            let mut r = cxc::SharedRwLock::<()>::inspect(path).map_err(|e| file_err(&e))?;
            let recent = std::mem::take(&mut r.recent);
            let strategy = r.strategy;
            (State::RwLock(r), Some(strategy), recent)
        }
        Kind::Test => {
            let (info, words) = cxc::mmf::read_words(path).map_err(|e| file_err(&e))?;
            (State::Test(test_view(&info, &words)), None, Vec::new())
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
/// appear) or stops being a cxc file, or stdout cannot be written (other than a reader
/// that is gone: that ends the watch with success); other errors are shown and retried.
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
                // Once seen, only an I/O error is shown and retried: a file that is
                // there but no longer a valid cxc file (its header refused) ends the
                // watch, as a missing one does.
                let not_cxc = !missing
                    && matches!(cxc::mmf::peek(path), Err(m) if !matches!(m, cxc::MmfError::Io { .. }));
                if !waiting && (missing || !seen || not_cxc) {
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
        // A closed pipe (e.g. `| head`) ends the watch quietly, with success; another
        // failed write (`/dev/full`) with exit 2 (`crate::stdout_outcome`).
        if let Err(e) = written.and_then(|()| out.flush()) {
            return crate::stdout_outcome(Err(e));
        }
        std::thread::sleep(interval);
    }
}

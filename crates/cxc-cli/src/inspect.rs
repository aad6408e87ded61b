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
pub(crate) struct View {
    pub(crate) path: PathBuf,
    pub(crate) info: HeaderInfo,
    pub(crate) state: State,
    /// The shared strategy and its generation.
    pub(crate) strategy: (cxc::Strategy, u32),
    /// Observations still in the file's ring, oldest first.
    pub(crate) recent: Vec<cxc::Observation>,
}

/// The primitive-specific part of a [`View`].
#[derive(Debug)]
pub(crate) enum State {
    Lease(cxc::LeaseStatus),
    Heartbeat(HeartbeatView),
    Semaphore(SemaphoreView),
}

/// A semaphore's state.
#[derive(Debug)]
pub(crate) struct SemaphoreView {
    pub(crate) available: u32,
    pub(crate) max: u32,
    pub(crate) holders: Vec<cxc::HolderInfo>,
    pub(crate) holder_capacity: usize,
    pub(crate) stats: cxc::SemaphoreStats,
}

/// A heartbeat table's state.
#[derive(Debug)]
pub(crate) struct HeartbeatView {
    pub(crate) capacity: usize,
    pub(crate) epoch: u64,
    pub(crate) epoch_mode: cxc::EpochMode,
    /// Registered (or fenced-with-bits) slots: index and snapshot.
    pub(crate) slots: Vec<(usize, cxc::HeartbeatSnapshot)>,
    pub(crate) counters: Vec<(&'static str, u64)>,
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
pub(crate) fn load(path: &Path) -> Result<View, CliError> {
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
            let s = cxc::SharedSemaphore::open(path)?;
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

/// Redraws the view every `interval` until interrupted.
pub(crate) fn watch(path: &Path, interval: Duration) -> Result<(), CliError> {
    let mut out = std::io::stdout();
    loop {
        let text = match load(path) {
            Ok(v) => crate::render::text(&v),
            Err(e) => format!("{}\n", e.msg),
        };
        // Clear the screen and home the cursor, then draw.
        let _ = write!(out, "\x1b[H\x1b[2J{text}");
        let _ = out.flush();
        std::thread::sleep(interval);
    }
}

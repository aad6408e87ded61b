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
}

/// The primitive-specific part of a [`View`].
#[derive(Debug)]
pub(crate) enum State {
    Lease(cxc::LeaseStatus),
}

/// Reads and validates `path`.
pub(crate) fn load(path: &Path) -> Result<View, CliError> {
    let info = cxc::mmf::peek(path)?;
    let state = match info.layout.kind {
        Kind::Lease => State::Lease(cxc::lease::inspect(path)?),
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

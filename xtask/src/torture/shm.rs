//! Shared bookkeeping files of the torture run: `Kind::Test` cxc files holding a head of
//! 8 words and `n` word slots, mapped by the supervisor and every worker. They hold the
//! checkers' state (never the state of the primitive under test).

use std::path::Path;
use std::sync::atomic::AtomicU64;

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};

/// Upper bound on the slots of a bookkeeping file (the file layer caps files at 1 GiB).
const MAX_WORDS: u64 = 1 << 26;

/// A mapped array of shared words: `head(0..8)` and `word(0..len)`.
pub(crate) struct Words {
    map: Mapped<[AtomicU64; 8], AtomicU64>,
}

impl Words {
    /// Creates the file with `n` zeroed slots; `tag` names the file's role (checked at open).
    pub(crate) fn create(path: &Path, tag: u64, n: usize) -> Result<Self, String> {
        let layout = Layout {
            kind: Kind::Test,
            head_size: 64,
            slot_size: 8,
            capacity: n as u64,
            payload: TypeFingerprint::NONE,
            params: [tag, 0, 0, 0],
        };
        let map = Mapped::create(path, layout, &CreateOptions::default(), |_, _| {})
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        Ok(Words { map })
    }

    /// Opens a file made by [`Words::create`] with the same `tag`.
    pub(crate) fn open(path: &Path, tag: u64) -> Result<Self, String> {
        let check = move |p: &[u64; 4]| {
            if p[0] == tag {
                Ok(())
            } else {
                Err(MmfError::ParamMismatch {
                    name: "torture_tag",
                    expected: tag.to_string(),
                    found: p[0],
                })
            }
        };
        let expect = Expect {
            kind: Kind::Test,
            head_size: 64,
            slot_size: 8,
            capacity: None,
            max_capacity: MAX_WORDS,
            payload: TypeFingerprint::NONE,
            check_params: &check,
        };
        let map =
            Mapped::open(path, &expect).map_err(|e| format!("open {}: {e}", path.display()))?;
        Ok(Words { map })
    }

    /// Head word `i` (0..8).
    pub(crate) fn head(&self, i: usize) -> &AtomicU64 {
        &self.map.head()[i]
    }

    /// Slot word `i`; panics if out of range (the checkers compute indices from the layout
    /// they created, so an out-of-range index is a bug in the torture code).
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        &self.map.slots()[i]
    }

    /// Slot word `i`, if in range.
    pub(crate) fn get(&self, i: usize) -> Option<&AtomicU64> {
        self.map.slot(i)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.slots().len()
    }
}

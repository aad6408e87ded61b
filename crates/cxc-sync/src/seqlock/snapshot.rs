//! [`SharedCell::inspect`]: a cell file's state, read without writing (for tools such as
//! `cxc inspect`).

use std::path::Path;

use cxc_mmf::{Snapshot, TypeFingerprint};
use cxc_sidecar::counter_values;

use super::cell::FILE;
use super::state::{PAYLOAD_WORDS, SeqState, counter};
use super::{SeqLockError, SharedCell};
use crate::primitive::Ordering;

/// A cell file's state, as [`SharedCell::inspect`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CellStatus {
    /// The published value's words (the payload type's bytes, zero-padded to 48); zeros
    /// if no two copies in a row agreed on the publication.
    pub value_words: [u64; PAYLOAD_WORDS],
    /// Payload type recorded in the file.
    pub payload_type: TypeFingerprint,
    /// Named cumulative counters.
    pub counters: Vec<(&'static str, u64)>,
    /// The shared strategy and its generation.
    pub strategy: (cxc_sidecar::Strategy, u32),
    /// The observations still in the file's ring, oldest first.
    pub recent: Vec<cxc_sidecar::Observation>,
}

/// How many more copies [`SharedCell::inspect`] takes at most to find the value whole.
const SNAPSHOT_TRIES: u32 = 20;

impl SharedCell<()> {
    /// Reads the state of the cell file at `path`, of any payload type, without writing
    /// anything: the file is opened and mapped read-only and copied with loads only
    /// ([`cxc_mmf::Snapshot`]); no writer slot is reserved. Read permission is enough
    /// (another user's file, a read-only mount). The value is taken from a copy only when
    /// a second copy shows the same publication (`pub_word`, whose version grows with
    /// every publication): then no publication happened while the published buffer was
    /// copied, and writers only fill unpublished buffers.
    ///
    /// # Errors
    /// [`SeqLockError::File`] if the file is not a valid cell file or cannot be read.
    pub fn inspect(path: impl AsRef<Path>) -> Result<CellStatus, SeqLockError> {
        let path = path.as_ref();
        let payload = cxc_mmf::peek(path)?.layout.payload;
        let expect = FILE.expect(Some(0), payload);
        let mut snap: Snapshot<SeqState> = Snapshot::read(path, &expect)?;
        let mut value = None;
        for _ in 0..SNAPSHOT_TRIES {
            let next: Snapshot<SeqState> = Snapshot::read(path, &expect)?;
            let (words, seen) = snap.head().read_words::<PAYLOAD_WORDS>();
            if next.head().pub_word.load(Ordering::Acquire) == seen {
                value = Some(words);
                break;
            }
            snap = next;
        }
        let st = snap.head();
        Ok(CellStatus {
            value_words: value.unwrap_or_default(),
            payload_type: payload,
            counters: counter_values(&counter::NAMES, &st.counters),
            strategy: st.handshake.current(),
            recent: st.ring.snapshot(),
        })
    }
}

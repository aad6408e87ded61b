//! The lock's state word: one `u64` naming the writer, the published payload buffer, the
//! writer's staging buffer, the quarantined buffers and the fencing token, so every
//! writer transition is one CAS.
//!
//! | bits   | field    | meaning                                                          |
//! |--------|----------|------------------------------------------------------------------|
//! | 0..10  | `WRITER` | holder slot + 1 of the write-lock holder (draining or holding); 0 = none |
//! | 10..13 | `PUB`    | the buffer readers read (the published payload)                  |
//! | 13..16 | `STAGE`  | the writer's staging buffer; equal to `PUB` when it has none     |
//! | 16..24 | `Q`      | one bit per buffer: quarantined for an evicted writer that may still store into it |
//! | 24..64 | `TOKEN`  | fencing token: +1 on every write lock (40 bits)                  |
//!
//! Readers are not in this word: each process counts its read holds in its own holder
//! slot (`RwSlot::readers`), see `raw.rs`.

pub(crate) use crate::payload::BufferFields;

/// Writer field: holder slot + 1; 0 = no writer.
pub(crate) const WRITER_MASK: u64 = (1 << 10) - 1;
const PUB_SHIFT: u32 = 10;
const STAGE_SHIFT: u32 = 13;
const BUF_FIELD: u64 = 0b111;
const Q_SHIFT: u32 = 16;
const Q_MASK: u64 = 0xFF << Q_SHIFT;
const TOKEN_SHIFT: u32 = 24;
/// Number of payload buffers.
pub(crate) const BUFS: usize = 8;
/// Largest holder-table capacity the writer field can name.
pub(crate) const MAX_HOLDERS: u32 = WRITER_MASK as u32;

/// A state word value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

crate::payload::buffer_fields!(Word);

impl Word {
    /// The writer's holder slot, if a writer holds (or is draining readers).
    #[inline]
    pub(crate) fn writer(self) -> Option<usize> {
        match self.0 & WRITER_MASK {
            0 => None,
            w => Some(w as usize - 1),
        }
    }

    /// The fencing token (of the current or the last write lock).
    #[inline]
    pub(crate) fn token(self) -> u64 {
        self.0 >> TOKEN_SHIFT
    }

    /// Claimed by `slot` with the next token and staging buffer `stage`.
    #[inline]
    pub(crate) fn claimed(self, slot: usize, stage: Option<usize>) -> Word {
        let w = Word(
            (self.0 & !WRITER_MASK & ((1 << TOKEN_SHIFT) - 1))
                | ((self.token().wrapping_add(1) & ((1 << 40) - 1)) << TOKEN_SHIFT)
                | (slot as u64 + 1).min(WRITER_MASK),
        );
        w.with_stage(stage)
    }

    /// Sets the staging buffer (`None`: no staging buffer).
    #[inline]
    pub(crate) fn with_stage(self, stage: Option<usize>) -> Word {
        let s = stage.unwrap_or(self.published()) as u64 & BUF_FIELD;
        Word((self.0 & !(BUF_FIELD << STAGE_SHIFT)) | (s << STAGE_SHIFT))
    }

    /// Buffer `b` quarantined.
    #[inline]
    pub(crate) fn with_quarantined(self, b: usize) -> Word {
        Word(self.0 | (1 << (Q_SHIFT + (b as u32 & 7))))
    }

    /// Buffer `b` out of quarantine.
    #[inline]
    pub(crate) fn without_quarantined(self, b: usize) -> Word {
        Word(self.0 & !(1 << (Q_SHIFT + (b as u32 & 7))))
    }

    /// After a write: the staged buffer is published, the old published buffer becomes
    /// the staging buffer.
    #[inline]
    pub(crate) fn published_swap(self) -> Word {
        let p = self.published() as u64;
        let s = (self.0 >> STAGE_SHIFT) & BUF_FIELD;
        let cleared = self.0 & !((BUF_FIELD << PUB_SHIFT) | (BUF_FIELD << STAGE_SHIFT));
        Word(cleared | (s << PUB_SHIFT) | (p << STAGE_SHIFT))
    }

    /// No writer, keeping the published buffer, token and quarantine.
    #[inline]
    pub(crate) fn vacated(self) -> Word {
        Word(self.0 & !WRITER_MASK).with_stage(None)
    }

    /// The fields that stay fixed while a claim holds (everything but Q).
    #[inline]
    pub(crate) fn sans_quarantine(self) -> u64 {
        self.0 & !Q_MASK
    }

    /// The claim's identity: writer and token.
    #[inline]
    pub(crate) fn id(self) -> u64 {
        self.0 & (WRITER_MASK | !((1 << TOKEN_SHIFT) - 1))
    }
}

/// A quarantine record: which claim a quarantined buffer belongs to (`token << 10 |
/// slot + 1`). Records only grow (`fetch_max`), so a late evicter can never replace the
/// record of a newer claim with an older one.
#[inline]
pub(crate) fn quarantine_tag(w: Word) -> u64 {
    (w.token() << 10) | (w.0 & WRITER_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let w = Word(0).claimed(4, Some(3));
        assert_eq!(w.writer(), Some(4));
        assert_eq!(w.published(), 0);
        assert_eq!(w.stage(), Some(3));
        assert_eq!(w.token(), 1);
        let s = w.published_swap();
        assert_eq!((s.published(), s.stage()), (3, Some(0)));
        assert_eq!(s.id(), w.id());
        let q = s.with_quarantined(6);
        crate::payload::assert_quarantined(q, 6);
        assert_eq!(q.without_quarantined(6), s);
        let v = q.vacated();
        assert_eq!(v.writer(), None);
        assert_eq!((v.published(), v.stage(), v.token()), (3, None, 1));
        assert!(v.is_quarantined(6));
        let w2 = v.claimed(MAX_HOLDERS as usize - 1, None);
        assert_eq!(w2.writer(), Some(MAX_HOLDERS as usize - 1));
        assert_eq!(w2.token(), 2);
        assert!(w2.is_quarantined(6));
        assert_ne!(w2.id(), w.id());
        assert!(quarantine_tag(w2) > quarantine_tag(w));
    }

    #[test]
    fn token_wraps_without_touching_other_fields() {
        let w = Word((((1u64 << 40) - 1) << TOKEN_SHIFT) | (2 << PUB_SHIFT));
        let c = w.claimed(0, None);
        assert_eq!(c.token(), 0);
        assert_eq!(c.published(), 2);
        assert_eq!(c.writer(), Some(0));
    }

    #[test]
    fn no_free_buffer_when_all_busy() {
        let busy = (2..BUFS).fold(Word(0).with_stage(Some(1)), |w, b| w.with_quarantined(b));
        crate::payload::assert_all_busy(busy, busy.without_quarantined(4));
    }
}

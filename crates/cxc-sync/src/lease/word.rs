//! The lease's claim word: one `u64` that names the holder, the generation, the published
//! payload buffer, the holder's staging buffer, an in-flight write and the quarantined
//! buffers, so that every transition between them is one CAS.
//!
//! | bits   | field   | meaning                                                          |
//! |--------|---------|------------------------------------------------------------------|
//! | 0..8   | holder  | identity-table slot + 1 of the holder, 0 = vacant                |
//! | 8..11  | pub     | the buffer readers read (the published payload)                  |
//! | 11..14 | stage   | the holder's staging buffer; equal to `pub` when it has none     |
//! | 14     | WRITE   | a writer of this claim is filling `stage` (or runs `with_lease`) |
//! | 15..23 | Q       | one bit per buffer: quarantined for a superseded, live writer    |
//! | 23     | PRIVATE | a guard's claim: one writer, which writes without WRITE          |
//! | 24..64 | gen     | low 40 bits of the generation, +1 on every claim                 |
//!
//! Transitions (every one a CAS on the whole word; `docs/owner-lease.md` has the table):
//!
//! | from                       | to                                         | by                 |
//! |----------------------------|--------------------------------------------|--------------------|
//! | vacant                     | holder h, gen+1, stage = a free buffer     | claim              |
//! | held, not WRITE            | WRITE                                      | writer (start)     |
//! | held, WRITE                | pub <-> stage swapped, not WRITE           | writer (publish)   |
//! | held                       | vacant, stage = pub                        | release            |
//! | held, WRITE                | vacant or new holder, Q += stage           | release / takeover |
//! | held, not WRITE            | new holder, gen+1, stage = a free buffer   | takeover           |
//! | held, PRIVATE              | new holder or vacant, Q += stage           | takeover / release by another |
//! | Q has bit b                | Q -= b                                     | b's writer, or a proof of its death |

pub(crate) use crate::payload::BufferFields;

/// Holder field: identity-table slot + 1; 0 = vacant.
pub(crate) const HOLDER_MASK: u64 = 0xFF;
const PUB_SHIFT: u32 = 8;
const STAGE_SHIFT: u32 = 11;
const BUF_FIELD: u64 = 0b111;
/// A writer of the current claim is filling its staging buffer.
pub(crate) const WRITE_BIT: u64 = 1 << 14;
const Q_SHIFT: u32 = 15;
/// The quarantine bits.
pub(crate) const Q_MASK: u64 = 0xFF << Q_SHIFT;
/// The claim is a guard's (`LeaseGuard`): its single writer stages without setting WRITE,
/// so whoever supersedes it must assume a write may be in flight.
pub(crate) const PRIVATE_BIT: u64 = 1 << 23;
pub(crate) const GEN_SHIFT: u32 = 24;
/// Bits of the generation kept in the word (the full generation is `term`-relative).
pub(crate) const GEN_BITS: u32 = 64 - GEN_SHIFT;
pub(crate) const GEN_ONE: u64 = 1 << GEN_SHIFT;
pub(crate) const GEN_MASK: u64 = !(GEN_ONE - 1);
/// The bits that identify a claim: holder and generation.
pub(crate) const ID_MASK: u64 = HOLDER_MASK | GEN_MASK;
/// Number of payload buffers.
pub(crate) const BUFS: usize = 8;

/// A claim word value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

crate::payload::buffer_fields!(Word);

impl Word {
    /// Holder slot + 1 (0 = vacant).
    #[inline]
    pub(crate) fn holder(self) -> u8 {
        (self.0 & HOLDER_MASK) as u8
    }

    #[inline]
    pub(crate) fn is_vacant(self) -> bool {
        self.holder() == 0
    }

    /// The claim's identity bits (holder + generation).
    #[inline]
    pub(crate) fn id(self) -> u64 {
        self.0 & ID_MASK
    }

    #[inline]
    pub(crate) fn writing(self) -> bool {
        self.0 & WRITE_BIT != 0
    }

    /// Whether a write of this claim may be in flight (WRITE, or a guard's claim).
    #[inline]
    pub(crate) fn may_be_writing(self) -> bool {
        self.0 & (WRITE_BIT | PRIVATE_BIT) != 0
    }

    #[inline]
    pub(crate) fn private(self) -> bool {
        self.0 & PRIVATE_BIT != 0
    }

    #[inline]
    pub(crate) fn with_private(self, on: bool) -> Word {
        self.with_bit(PRIVATE_BIT, on)
    }

    #[inline]
    fn with_bit(self, bit: u64, on: bool) -> Word {
        Word(if on { self.0 | bit } else { self.0 & !bit })
    }

    /// The low generation bits (the word's generation field).
    #[inline]
    pub(crate) fn gen_low(self) -> u64 {
        self.0 >> GEN_SHIFT
    }

    #[inline]
    pub(crate) fn with_holder(self, holder: u8) -> Word {
        Word((self.0 & !HOLDER_MASK) | u64::from(holder))
    }

    /// Sets the staging buffer (`None`: no staging buffer).
    #[inline]
    pub(crate) fn with_stage(self, stage: Option<usize>) -> Word {
        let s = stage.unwrap_or(self.published()) as u64;
        Word((self.0 & !(BUF_FIELD << STAGE_SHIFT)) | (s << STAGE_SHIFT))
    }

    #[inline]
    pub(crate) fn with_write(self, on: bool) -> Word {
        self.with_bit(WRITE_BIT, on)
    }

    #[inline]
    pub(crate) fn with_quarantined(self, buf: usize) -> Word {
        Word(self.0 | (1 << (Q_SHIFT + buf as u32)))
    }

    #[inline]
    pub(crate) fn without_quarantined(self, buf: usize) -> Word {
        Word(self.0 & !(1 << (Q_SHIFT + buf as u32)))
    }

    /// The next generation (the low bits wrap; `term` disambiguates).
    #[inline]
    pub(crate) fn next_gen(self) -> Word {
        Word((self.0 & !GEN_MASK) | (self.0 & GEN_MASK).wrapping_add(GEN_ONE))
    }

    /// After a successful write: the staged buffer is published and the old published
    /// buffer becomes the staging buffer; WRITE is clear.
    #[inline]
    pub(crate) fn published_swap(self) -> Word {
        let p = self.published() as u64;
        let s = (self.0 >> STAGE_SHIFT) & BUF_FIELD;
        let cleared = self.0 & !((BUF_FIELD << PUB_SHIFT) | (BUF_FIELD << STAGE_SHIFT) | WRITE_BIT);
        Word(cleared | (s << PUB_SHIFT) | (p << STAGE_SHIFT))
    }

    /// Vacant, keeping the published buffer, generation and quarantine; no staging
    /// buffer, no WRITE, not private.
    #[inline]
    pub(crate) fn vacated(self) -> Word {
        Word(self.0 & !(HOLDER_MASK | WRITE_BIT | PRIVATE_BIT))
            .with_holder(0)
            .with_stage(None)
    }

    /// The fields that stay fixed while a claim writes (everything but Q).
    #[inline]
    pub(crate) fn sans_quarantine(self) -> u64 {
        self.0 & !Q_MASK
    }
}

/// A quarantine record: which claim a quarantined buffer belongs to, as
/// `full generation << 8 | holder`. Records only grow (`fetch_max`), so a late, stale
/// taker can never replace the record of a newer claim with an older one.
#[inline]
pub(crate) fn quarantine_tag(full_generation: u64, holder: u8) -> u64 {
    (full_generation << 8) | u64::from(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let w = Word(0).with_holder(5).with_stage(Some(3)).next_gen();
        assert_eq!(w.holder(), 5);
        assert_eq!(w.published(), 0);
        assert_eq!(w.stage(), Some(3));
        assert_eq!(w.gen_low(), 1);
        let w = w.with_write(true);
        assert!(w.writing());
        let s = w.published_swap();
        assert_eq!(s.published(), 3);
        assert_eq!(s.stage(), Some(0));
        assert!(!s.writing());
        assert_eq!(s.id(), w.id());
        let q = s.with_quarantined(6);
        crate::payload::assert_quarantined(q, 6);
        assert_eq!(q.without_quarantined(6), s);
        let v = q.vacated();
        assert!(v.is_vacant());
        assert_eq!(v.stage(), None);
        assert_eq!(v.published(), 3);
        assert!(v.is_quarantined(6));
    }

    #[test]
    fn free_buffer_none_when_all_busy() {
        let busy = (2..BUFS).fold(Word(0).with_stage(Some(1)), |w, b| w.with_quarantined(b));
        crate::payload::assert_all_busy(busy, busy.without_quarantined(4));
    }
}

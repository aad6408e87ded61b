//! A payload `T` kept as 8-byte words in a file's buffers (the rwlock's, and the same
//! scheme as the lease's and the seqlock's): whether `T` fits, how many words it takes,
//! the conversions, and which buffer of a set is free.

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Why a payload type does not fit a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misfit {
    /// `size_of::<T>()` (`found`) is larger than the buffer (`max`).
    TooLarge { max: usize, found: usize },
    /// `align_of::<T>()` (`found`) is larger than the buffer's alignment (`max`, 8).
    Align { max: usize, found: usize },
}

/// `From<Misfit>` for an error enum with `PayloadTooLarge { max, found }` and
/// `PayloadAlign { max, found }` variants, so `check_fit::<T>(n)?` reports either.
#[cfg_attr(cxc_loom, allow(unused_macros))]
macro_rules! misfit_into {
    ($($error:ty),*) => {$(
        impl From<$crate::payload::Misfit> for $error {
            fn from(m: $crate::payload::Misfit) -> Self {
                match m {
                    $crate::payload::Misfit::TooLarge { max, found } => {
                        Self::PayloadTooLarge { max, found }
                    }
                    $crate::payload::Misfit::Align { max, found } => {
                        Self::PayloadAlign { max, found }
                    }
                }
            }
        }
    )*};
}
#[cfg(not(cxc_loom))]
misfit_into!(
    crate::LeaseError,
    crate::SeqLockError,
    crate::rwlock::RwLockError
);

/// Whether a `T` fits a buffer of `max_bytes` bytes aligned to 8.
pub(crate) fn check_fit<T>(max_bytes: usize) -> Result<(), Misfit> {
    if size_of::<T>() > max_bytes {
        return Err(Misfit::TooLarge {
            max: max_bytes,
            found: size_of::<T>(),
        });
    }
    if align_of::<T>() > 8 {
        return Err(Misfit::Align {
            max: 8,
            found: align_of::<T>(),
        });
    }
    Ok(())
}

/// Words that hold a `T` (the rest of a buffer is never read or written).
pub(crate) const fn words_of<T>() -> usize {
    size_of::<T>().div_ceil(8)
}

/// `value` as `W` words (the rest zero; a `T` larger than `W` words, which `check_fit`
/// rules out, gives all zeros).
pub(crate) fn to_words<T: IntoBytes + Immutable, const W: usize>(value: &T) -> [u64; W] {
    let mut words = [0u64; W];
    let src = value.as_bytes();
    if let Some(dst) = words.as_mut_bytes().get_mut(..src.len()) {
        dst.copy_from_slice(src);
    }
    words
}

/// The `T` in `words` (`None` only if `T` does not fit, which `check_fit` rules out).
pub(crate) fn from_words<T: FromBytes, const W: usize>(words: &[u64; W]) -> Option<T> {
    T::read_from_bytes(words.as_bytes().get(..size_of::<T>())?).ok()
}

/// [`BufferFields`] for a word type `$t(u64)` whose module defines `PUB_SHIFT`,
/// `STAGE_SHIFT` and `Q_SHIFT`.
macro_rules! buffer_fields {
    ($t:ty) => {
        impl $crate::payload::BufferFields for $t {
            const PUB_SHIFT: u32 = PUB_SHIFT;
            const STAGE_SHIFT: u32 = STAGE_SHIFT;
            const Q_SHIFT: u32 = Q_SHIFT;

            #[inline(always)]
            fn bits(self) -> u64 {
                self.0
            }
        }
    };
}
pub(crate) use buffer_fields;

/// The buffer fields of a state word, as the lease's claim word and the rwlock's state
/// word both carry them: the published buffer and the staging buffer (3 bits each; a
/// staging buffer equal to the published one means none) and one quarantine bit per
/// buffer, at the shifts the word type names.
pub(crate) trait BufferFields: Copy {
    /// Shift of the published-buffer field.
    const PUB_SHIFT: u32;
    /// Shift of the staging-buffer field.
    const STAGE_SHIFT: u32;
    /// Shift of the 8 quarantine bits.
    const Q_SHIFT: u32;

    /// The word's bits.
    fn bits(self) -> u64;

    /// The published buffer.
    #[inline]
    fn published(self) -> usize {
        ((self.bits() >> Self::PUB_SHIFT) & 0b111) as usize
    }

    /// The staging buffer, `None` when there is none (stage == published).
    #[inline]
    fn stage(self) -> Option<usize> {
        let s = ((self.bits() >> Self::STAGE_SHIFT) & 0b111) as usize;
        (s != self.published()).then_some(s)
    }

    /// The quarantine bits.
    #[inline]
    fn quarantine(self) -> u8 {
        (self.bits() >> Self::Q_SHIFT) as u8
    }

    /// Whether buffer `b` is quarantined.
    #[inline]
    fn is_quarantined(self, b: usize) -> bool {
        self.quarantine() & (1 << b) != 0
    }

    /// The first buffer that is neither published, staged nor quarantined.
    #[inline]
    fn free_buffer(self) -> Option<usize> {
        let mut busy = self.quarantine() | (1 << self.published());
        if let Some(s) = self.stage() {
            busy |= 1 << s;
        }
        let free = !busy;
        (free != 0).then(|| free.trailing_zeros() as usize)
    }
}

/// The check both word types' tests run: with every buffer but one (the published one,
/// 0) busy, `busy` has no free buffer, and `one_freed` (the same with buffer 4 out of
/// quarantine) has buffer 4.
#[cfg(test)]
pub(crate) fn assert_all_busy<W: BufferFields>(busy: W, one_freed: W) {
    assert_eq!(busy.free_buffer(), None);
    assert_eq!(one_freed.free_buffer(), Some(4));
}

/// The check both word types' tests run on a word `q` with buffer `b` quarantined (and
/// buffers 0 and 3 published and staged): `b` is quarantined and buffer 1 is the first
/// free one.
#[cfg(test)]
pub(crate) fn assert_quarantined<W: BufferFields>(q: W, b: usize) {
    assert!(q.is_quarantined(b));
    assert_eq!(q.free_buffer(), Some(1));
}

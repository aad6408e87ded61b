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

/// The first buffer of a set of at most 8 that is neither published, staged nor
/// quarantined (`quarantine`: one bit per buffer).
#[inline]
pub(crate) fn free_buffer(quarantine: u8, published: usize, stage: Option<usize>) -> Option<usize> {
    let mut busy = quarantine | (1 << published);
    if let Some(s) = stage {
        busy |= 1 << s;
    }
    let free = !busy;
    (free != 0).then(|| free.trailing_zeros() as usize)
}

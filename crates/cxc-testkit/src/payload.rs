//! A payload whose torn copies are detected: for tests of the primitives that publish
//! a multi-word value (seqlock, shared cell, lease payloads).

/// Five words derived from `v` and their checksum (FNV-1a over the five): a copy made of
/// words from two different writes fails [`intact`].
///
/// ```
/// let w = cxc_testkit::sealed(7);
/// assert!(cxc_testkit::intact(&w));
/// let mut torn = w;
/// torn[2] = cxc_testkit::sealed(8)[2];
/// assert!(!cxc_testkit::intact(&torn));
/// ```
pub fn sealed(v: u64) -> [u64; 6] {
    let mut w = [v, v ^ 0x5555, v.rotate_left(7), !v, v.wrapping_mul(3), 0];
    w[5] = w[..5].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x).wrapping_mul(0x100_0000_01b3)
    });
    w
}

/// True if `w` is what [`sealed`] makes of its first word.
pub fn intact(w: &[u64; 6]) -> bool {
    sealed(w[0]) == *w
}

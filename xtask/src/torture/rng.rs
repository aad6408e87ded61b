//! A small deterministic PRNG (SplitMix64): every random choice of a run derives from
//! `--seed`, so a run's schedule of operations and chaos can be replayed.

/// SplitMix64 (Steele, Lea, Flood 2014): one add and a mix per output.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

/// The SplitMix64 finaliser, also used to derive independent streams.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(mix(seed))
    }

    /// An independent stream for `(seed, a, b, c)`, e.g. (seed, role, worker id, incarnation).
    pub(crate) fn derive(seed: u64, a: u64, b: u64, c: u64) -> Self {
        Rng::new(mix(mix(mix(seed ^ a) ^ b) ^ c))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }

    /// Uniform in `lo..hi` (`lo < hi`).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).max(1))
    }

    /// True with probability `percent`/100.
    pub(crate) fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let mut a = Rng::derive(7, 1, 2, 3);
        let mut b = Rng::derive(7, 1, 2, 3);
        for _ in 0..1000 {
            let x = a.range(10, 20);
            assert_eq!(x, b.range(10, 20));
            assert!((10..20).contains(&x));
        }
        assert_ne!(
            Rng::derive(7, 1, 2, 3).next_u64(),
            Rng::derive(7, 1, 2, 4).next_u64()
        );
    }
}

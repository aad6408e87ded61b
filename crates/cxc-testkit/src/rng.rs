//! The one seeded generator (SplitMix64): every random choice of a test or a torture run
//! derives from one printed seed, so a failing run can be replayed.

use std::time::{SystemTime, UNIX_EPOCH};

/// Environment variable that fixes the seed of [`Rng::for_test`] (decimal or `0x` hex).
pub const SEED_VAR: &str = "CXC_TEST_SEED";

/// The SplitMix64 finaliser (Steele, Lea, Flood 2014), also used to derive streams and to
/// hash words.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64: one add and a mix per output; deterministic for a seed.
///
/// ```
/// use cxc_testkit::Rng;
/// let mut a = Rng::new(7);
/// let mut b = Rng::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!((10..20).contains(&a.range(10, 20)));
/// assert_eq!(Rng::new(7).seed(), 7);
/// ```
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    state: u64,
}

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Rng {
            seed,
            state: mix(seed),
        }
    }

    /// An independent stream for `(seed, a, b, c)`, e.g. (seed, role, worker id,
    /// incarnation), so each process of a run draws its own numbers from the run's seed.
    pub fn derive(seed: u64, a: u64, b: u64, c: u64) -> Self {
        let mut r = Rng::new(mix(mix(mix(seed ^ a) ^ b) ^ c));
        r.seed = seed;
        r
    }

    /// A generator for a test: seeded from [`SEED_VAR`] if set, else from the clock and
    /// the pid. Prints the seed and how to replay it on stderr, which the test harness
    /// shows when the test fails.
    ///
    /// # Panics
    ///
    /// If [`SEED_VAR`] is set but is not a number.
    pub fn for_test() -> Self {
        let seed = match std::env::var(SEED_VAR) {
            Ok(s) => parse_seed(&s)
                .unwrap_or_else(|| panic!("{SEED_VAR}={s:?} is not a decimal or 0x-hex u64")),
            Err(_) => {
                let ns = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                mix(ns ^ (u64::from(std::process::id()) << 32))
            }
        };
        eprintln!("cxc-testkit: seed {seed:#x} (replay with {SEED_VAR}={seed:#x})");
        Rng::new(seed)
    }

    /// The seed this stream was made from (for [`Rng::derive`], the run's seed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in `0..n`; 0 if `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..hi`; `lo` if the range is empty.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo))
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
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
        assert_eq!(Rng::derive(7, 1, 2, 3).seed(), 7);
    }

    #[test]
    fn ranges_are_covered_and_empty_ranges_are_safe() {
        let mut r = Rng::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[r.below(10) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.range(5, 3), 5);
        assert!(!r.percent(0));
        assert!(r.percent(100));
    }

    #[test]
    fn bytes_have_the_length_asked_and_vary() {
        let mut r = Rng::new(3);
        for len in [0, 1, 7, 8, 9, 1000] {
            assert_eq!(r.bytes(len).len(), len);
        }
        let b = r.bytes(1000);
        let zeros = b.iter().filter(|&&x| x == 0).count();
        assert!(zeros < 50, "{zeros} zero bytes of 1000");
        assert_ne!(Rng::new(3).bytes(16), Rng::new(4).bytes(16));
    }

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2A "), Some(42));
        assert_eq!(parse_seed("0XfF"), Some(255));
        assert_eq!(parse_seed("x"), None);
    }
}

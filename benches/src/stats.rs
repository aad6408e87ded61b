//! Summaries of repeated measurements.

/// Median, 99th percentile and count of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median (mean of the two middle samples for an even count).
    pub median: f64,
    /// The 99th percentile (nearest rank).
    pub p99: f64,
    /// Number of samples.
    pub n: usize,
}

/// Summarises `samples` (any order). `None` when there are none.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    // Nearest-rank percentile: the smallest sample with at least 99 % at or below it.
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    Some(Summary {
        median,
        p99: s[rank - 1],
        n,
    })
}

/// The median of `samples` (any order; `NaN` when there are none).
pub fn median(samples: &[f64]) -> f64 {
    summarize(samples).map_or(f64::NAN, |s| s.median)
}

/// Nanoseconds per call of `f`, over `n` calls in a row (monomorphised: no indirect call
/// per operation). The interleaved checks of the criterion benches time each side with it.
pub fn ns_per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = std::time::Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e9 / f64::from(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p99() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&v).unwrap();
        assert_eq!(s.median, 50.5);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.n, 100);
        assert_eq!(summarize(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert!(summarize(&[]).is_none());
    }
}

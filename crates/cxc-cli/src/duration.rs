//! Parsing durations such as `250ms`, `2s`, `1.5s`, `3m`, `1h 30m` (humantime's syntax); a
//! bare number is seconds.

use std::time::Duration;

/// The longest duration accepted (about 31 years): a larger one is a typo.
const MAX: Duration = Duration::from_secs(1_000_000_000);

/// Parses a human duration.
pub(crate) fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && (0.0..=MAX.as_secs_f64()).contains(&secs) => {
            Duration::from_secs_f64(secs)
        }
        Ok(_) => return Err(format!("duration `{s}` is out of range")),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("`{s}` is not a duration (e.g. 500ms, 2s, 1m): {e}"))?,
    };
    if d > MAX {
        return Err(format!("duration `{s}` is out of range"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse("abc").is_err());
        assert!(parse("5 parsecs").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("-1").is_err());
        assert!(parse("100y").is_err());
    }
}

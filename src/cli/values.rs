//! Parsers for argument values shared by several commands (sizes, durations), so that a
//! bad value is refused while parsing, before anything touches the network.

use crate::units::{check_drive_size, parse_size};

/// `--size` of `create`: a human size that is a valid drive size.
pub fn drive_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s).map_err(|e| e.to_string())?;
    check_drive_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// A human size (`512M`, `1G`) in bytes, such as `--cache-size`.
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Longest `--flush-delay`: an hour of writes that only memory holds is
/// already more than anyone should risk.
const MAX_FLUSH_DELAY_SECS: f64 = 3600.0;

/// A duration such as `--flush-delay`: seconds (`30`, `0.5`, `30s`), `500ms`,
/// minutes (`5m`) or `1h`, from 0 up to an hour.
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    let secs = duration_secs(s)?;
    if secs > MAX_FLUSH_DELAY_SECS {
        return Err(format!("duration '{s}' is longer than the limit of 1 hour"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Longest `--idle-timeout`: a week.
const MAX_IDLE_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// `--idle-timeout` of `serve`: a duration as [`duration`] reads it, of at
/// least a second (less would close a connection before its first request)
/// and at most a week.
pub fn idle_timeout(s: &str) -> Result<std::time::Duration, String> {
    match duration_secs(s) {
        Ok(secs) if (1.0..=MAX_IDLE_SECS).contains(&secs) => {
            Ok(std::time::Duration::from_secs_f64(secs))
        }
        _ => Err(format!(
            "invalid duration '{s}'; give at least 1 second and at most a week: seconds (90, \
             90s), minutes (30m) or hours (2h)"
        )),
    }
}

/// The seconds a duration text gives: a number with `ms`, `s`, `m` or `h`
/// (seconds without one); never negative or infinite.
fn duration_secs(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let bad = || format!("invalid duration '{s}'; give seconds (30, 0.5, 30s), 500ms, 5m or 1h");
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    Ok(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_takes_seconds_milliseconds_and_minutes() {
        use std::time::Duration;
        assert_eq!(duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(duration("-1").is_err());
        assert!(duration("soon").is_err());
        assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(duration("2h").is_err());
        assert!(duration("61m").is_err());
    }

    #[test]
    fn drive_size_applies_the_drive_rules() {
        assert_eq!(drive_size("10G"), Ok(10 << 30));
        assert!(drive_size("1M")
            .unwrap_err()
            .contains("smallest drive is 16M"));
        assert!(drive_size("10X")
            .unwrap_err()
            .contains("invalid size '10X'"));
    }
}

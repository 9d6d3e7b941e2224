//! Human units on the command line: durations, byte sizes, large counts.

use std::time::{Duration, UNIX_EPOCH};

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 2m)"))
}

/// A retention period; `None` = forever.
#[derive(Debug, Clone, Copy)]
pub struct Ttl(pub Option<Duration>);

pub fn parse_ttl(s: &str) -> Result<Ttl, String> {
    if s == "forever" {
        return Ok(Ttl(None));
    }
    parse_duration(s)
        .map(|d| Ttl(Some(d)))
        .map_err(|e| format!("{e}, or \"forever\""))
}

/// `64MiB`, `1GiB`, `512KiB`, `10MB`, or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?} (examples: 64MiB, 1GiB, 1048576)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1_000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        _ => {
            return Err(format!(
                "unknown size unit {unit:?} in {s:?} (use B, KiB, MiB, GiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// `10000000000`, `10_000_000_000` or `1e10`.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    match t.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f <= u64::MAX as f64 && f.fract() == 0.0 => {
            Ok(f as u64)
        }
        _ => Err(format!("invalid count {s:?} (examples: 1000000, 1e9)")),
    }
}

pub fn format_size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Unix milliseconds as RFC 3339 UTC, to the second.
pub fn format_time(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn counts_and_durations() {
        assert_eq!(parse_count("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_count("10_000"), Ok(10_000));
        assert!(parse_count("-5").is_err());
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err());
    }
}

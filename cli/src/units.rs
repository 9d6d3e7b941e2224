//! Human units on the command line: durations, byte sizes, large counts.

use std::time::{Duration, UNIX_EPOCH};

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    wasq_core::duration::parse(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 2m)"))
}

/// A retention period; `None` = forever.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ttl(pub Option<Duration>);

pub(crate) fn parse_ttl(s: &str) -> Result<Ttl, String> {
    if s == "forever" {
        return Ok(Ttl(None));
    }
    parse_duration(s)
        .map(|d| Ttl(Some(d)))
        .map_err(|e| format!("{e}, or \"forever\""))
}

/// `64MiB`, `1GiB`, `512KiB`, `10MB`, or plain bytes.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
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

/// `10000000000`, `10_000_000_000`, `1e10` or `2.5e9`: exactly the number written (a
/// float would round `1.2345678901234567e18` and take `18446744073709551616` for
/// `u64::MAX`), or an error.
pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid count {s:?} (examples: 1000000, 1e9)");
    let t = s.trim().replace('_', "");
    let (mantissa, exp) = match t.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().map_err(|_| bad())?),
        None => (t.as_str(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let int = int.strip_prefix('+').unwrap_or(int);
    if int.len() + frac.len() == 0 || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // int.frac × 10^exp = digits × 10^scale
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let scale = i64::from(exp) - frac.len() as i64;
    let (kept, dropped) = if scale < 0 {
        digits.split_at(digits.len().saturating_sub(scale.unsigned_abs() as usize))
    } else {
        (digits, "")
    };
    if dropped.bytes().any(|b| b != b'0') {
        return Err(format!("{} (a count is a whole number)", bad()));
    }
    if kept.is_empty() {
        return Ok(0);
    }
    let too_large = || format!("count {s:?} is too large (at most {})", u64::MAX);
    let n: u64 = kept.parse().map_err(|_| too_large())?;
    let scale = u32::try_from(scale.max(0)).map_err(|_| too_large())?;
    10u64
        .checked_pow(scale)
        .and_then(|p| n.checked_mul(p))
        .ok_or_else(too_large)
}

pub(crate) fn format_size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Unix milliseconds as RFC 3339 UTC, to the second.
pub(crate) fn format_time(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Unix milliseconds as RFC 3339 UTC, to the millisecond.
pub(crate) fn format_time_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
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
        assert_eq!(parse_count("2.5e9"), Ok(2_500_000_000));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err());
    }

    /// Found by `counts_are_exact`: through f64, 2^64 became u64::MAX and 19 significant
    /// digits were rounded.
    #[test]
    fn counts_are_never_rounded() {
        assert!(
            parse_count("18446744073709551616")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_count("1.8446744073709551616e19").is_err());
        assert_eq!(
            parse_count("1.8446744073709551615e19"),
            Ok(18_446_744_073_709_551_615)
        );
        assert_eq!(
            parse_count("1.2345678901234567e18"),
            Ok(1_234_567_890_123_456_700)
        );
        assert!(parse_count("1.5").unwrap_err().contains("whole number"));
        assert_eq!(parse_count("1000e-3"), Ok(1));
    }

    /// humantime 2.4 panics on these (see wasq_core::duration).
    #[test]
    fn durations_past_the_maximum_are_errors() {
        assert!(parse_duration("18446744073709551615s 1000000000ns").is_err());
        assert!(parse_ttl("18446744073709551615s 999999999ns 1ns").is_err());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn number() -> impl Strategy<Value = u64> {
            prop_oneof![
                0u64..10_000,
                Just(u64::MAX),
                Just(u64::MAX / 1024),
                Just(u64::MAX / 1000 + 1),
                any::<u64>(),
            ]
        }

        const SIZE_UNITS: &[(&str, u64)] = &[
            ("", 1),
            ("b", 1),
            ("k", 1 << 10),
            ("KiB", 1 << 10),
            ("kb", 1_000),
            ("M", 1 << 20),
            ("MiB", 1 << 20),
            ("MB", 1_000_000),
            ("g", 1 << 30),
            ("GiB", 1 << 30),
            ("gb", 1_000_000_000),
        ];

        proptest! {
            #![proptest_config(crate::proptest_cases(3000))]

            /// Sizes are the number times the unit, or "too large"; any text is a size or
            /// an error.
            #[test]
            fn sizes_are_number_times_unit(
                n in number(),
                (unit, mult) in prop::sample::select(SIZE_UNITS.to_vec()),
                pad in prop::sample::select(vec!["", " ", "  "]),
            ) {
                let text = format!("{pad}{n}{pad}{unit}{pad}");
                match n.checked_mul(mult) {
                    Some(v) => prop_assert_eq!(parse_size(&text), Ok(v)),
                    None => prop_assert!(parse_size(&text).unwrap_err().contains("too large")),
                }
            }

            #[test]
            fn any_text_is_a_size_count_duration_or_an_error(text in ".{0,30}") {
                let _ = parse_size(&text);
                let _ = parse_count(&text);
                let _ = parse_ttl(&text);
            }

            /// A count written plainly, with `_`, or in scientific notation with the point
            /// anywhere is exactly that number; past u64::MAX it is an error.
            #[test]
            fn counts_are_exact(
                n in any::<u128>().prop_map(|n| n >> (n % 128)),
                point in any::<prop::sample::Index>(),
                extra in 0u32..4,
                underscore in prop::option::of(any::<prop::sample::Index>()),
            ) {
                let want = u64::try_from(n.saturating_mul(10u128.pow(extra))).ok();
                let digits = n.to_string();
                // n = d.ddd × 10^e, with the point `e` digits from the right.
                let e = point.index(digits.len());
                let (int, frac) = digits.split_at(digits.len() - e);
                let frac = if frac.is_empty() { String::new() } else { format!(".{frac}") };
                let mut sci = format!("{int}{frac}e{}", e as u32 + extra);
                if let Some(at) = underscore {
                    sci.insert(at.index(int.len() + 1), '_');
                }
                let plain = n.to_string();
                match want {
                    Some(v) => {
                        prop_assert_eq!(parse_count(&sci), Ok(v), "{}", sci);
                        if extra == 0 {
                            prop_assert_eq!(parse_count(&plain), Ok(v));
                        }
                    }
                    None => {
                        prop_assert!(parse_count(&sci).is_err(), "{}", sci);
                    }
                }
            }

            /// The CLI reads durations as the server does (wasq_core::duration).
            #[test]
            fn durations_match_the_server(
                text in prop_oneof![
                    "[0-9]{1,20} ?(ns|ms|s|m|h|d|days|w|y|x)( [0-9]{1,20}(ns|s|h))?",
                    ".{0,20}",
                ],
            ) {
                let server = wasq_core::duration::parse(&text).ok();
                prop_assert_eq!(parse_duration(&text).ok(), server);
                prop_assert_eq!(parse_ttl(&text).ok().and_then(|t| t.0), server);
                prop_assert!(parse_ttl("forever").unwrap().0.is_none());
            }
        }
    }
}

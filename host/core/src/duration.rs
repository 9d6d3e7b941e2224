//! Durations as people write them (`500ms`, `30s`, `1h 30m`, `7days`): humantime's syntax,
//! without its panic.
//!
//! humantime 2.4 panics ("overflow in Duration::new") instead of returning an error when
//! its terms add up to exactly `u64::MAX` seconds and one second of nanoseconds, e.g.
//! `18446744073709551615s 1000000000ns` (chronotope/humantime#66, open). Durations come
//! from API query strings, so [`parse`] hands humantime one term at a time (a single
//! term cannot reach that state) and adds the terms up itself, with overflow checked.

use std::time::Duration;

pub use humantime::DurationError;

/// `humantime::parse_duration`, term by term: the same values and errors, never a panic.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let mut total = Duration::ZERO;
    for term in terms(text) {
        // humantime takes a bare `0` as the whole text, not as a last term (`1s0`).
        if term == "0" && text != "0" {
            return Err(DurationError::UnknownUnit {
                start: text.len(),
                end: text.len(),
                unit: String::new(),
                value: 0,
            });
        }
        let d = humantime::parse_duration(term)?;
        total = total.checked_add(d).ok_or(DurationError::NumberOverflow)?;
    }
    Ok(total)
}

/// Splits where humantime starts a new term: at a digit after a unit's letters (spaces
/// may come between). Anything else stays in its term, so humantime still sees and
/// reports it.
fn terms(text: &str) -> impl Iterator<Item = &str> {
    let mut cuts = vec![0];
    let mut in_unit = false;
    for (i, c) in text.char_indices() {
        if c.is_ascii_digit() {
            if in_unit {
                cuts.push(i);
            }
            in_unit = false;
        } else if c.is_ascii_alphabetic() || c == 'µ' {
            in_unit = true;
        }
    }
    cuts.push(text.len());
    (0..cuts.len() - 1).map(move |i| &text[cuts[i]..cuts[i + 1]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What humantime answers, with its panic caught.
    fn reference(text: &str) -> Option<Result<Duration, DurationError>> {
        std::panic::catch_unwind(|| humantime::parse_duration(text)).ok()
    }

    #[test]
    fn terms_add_up_and_overflow_is_an_error() {
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1h30m 2s500ms"), Ok(Duration::from_millis(5_402_500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse(" 7days "), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert!(parse("5").is_err());
        assert!(parse("5s x").is_err());
        assert!(parse("0ns0").is_err(), "a bare 0 only as the whole text");
        // humantime overflows its running sum of nanoseconds here; the sum fits.
        assert!(reference("1ns18446744073709551615ns").unwrap().is_err());
        assert_eq!(
            parse("1ns18446744073709551615ns"),
            Ok(Duration::from_nanos(u64::MAX) + Duration::from_nanos(1))
        );
        // humantime itself panics on these (chronotope/humantime#66).
        for text in [
            "18446744073709551615s 1000000000ns",
            "18446744073709551615s 999999999ns 1ns",
            "18446744073709551615s 0.5s 0.5s",
        ] {
            assert_eq!(reference(text), None, "{text}: humantime was fixed?");
            assert_eq!(parse(text), Err(DurationError::NumberOverflow), "{text}");
        }
        assert_eq!(
            parse("18446744073709551615s 999999999ns"),
            Ok(Duration::MAX)
        );
    }

    /// Units and their length in nanoseconds.
    const UNITS: &[(&str, u128)] = &[
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("secs", 1_000_000_000),
        ("m", 60_000_000_000),
        ("min", 60_000_000_000),
        ("h", 3_600_000_000_000),
        ("d", 86_400_000_000_000),
        ("days", 86_400_000_000_000),
        ("w", 7 * 86_400_000_000_000),
        ("M", 2_630_016_000_000_000),
        ("y", 31_557_600_000_000_000),
    ];

    /// A term: a number (sometimes huge, sometimes with a fraction) and a unit.
    fn term() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            0u64..100,
            Just(999_999_999u64),
            Just(1_000_000_000),
            Just(u64::MAX),
            Just(u64::MAX / 60),
            any::<u64>(),
        ];
        let unit = prop::sample::select(vec![
            "ns", "us", "µs", "ms", "s", "sec", "m", "min", "h", "hours", "d", "days", "w", "M",
            "y", "", "x", "ss",
        ]);
        (number, prop::option::of("[0-9]{1,4}"), " ?", unit).prop_map(|(n, frac, space, unit)| {
            match frac {
                Some(f) => format!("{n}.{f}{space}{unit}"),
                None => format!("{n}{space}{unit}"),
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if std::env::var_os("PROPTEST_CASES").is_some() {
                ProptestConfig::default().cases
            } else {
                4000
            },
            ..ProptestConfig::default()
        })]

        /// The same answer as humantime wherever humantime answers, an overflow error where
        /// it panics, and the sum of its terms.
        #[test]
        fn durations_parse_like_humantime_without_panicking(
            terms in prop::collection::vec(term(), 0..5),
            sep in prop::sample::select(vec!["", " ", "  ", "\t"]),
            noise in prop::option::of((any::<prop::sample::Index>(), r"[ .\-+a-z0-9µ_]")),
        ) {
            let mut text = terms.join(sep);
            if let Some((at, c)) = noise {
                let mut chars: Vec<char> = text.chars().collect();
                chars.insert(at.index(chars.len() + 1), c.chars().next().unwrap());
                text = chars.into_iter().collect();
            }
            match reference(&text) {
                Some(Ok(d)) => prop_assert_eq!(parse(&text), Ok(d)),
                // humantime also overflows on its running sum of nanoseconds
                // (`1ns18446744073709551615ns`); adding whole terms, wasq may not.
                Some(Err(DurationError::NumberOverflow)) => {}
                Some(Err(_)) => prop_assert!(parse(&text).is_err(), "{:?}", text),
                None => prop_assert_eq!(parse(&text), Err(DurationError::NumberOverflow)),
            }
        }

        /// Terms in any unit add up to the value computed here, in nanoseconds.
        #[test]
        fn durations_are_the_sum_of_their_terms(
            terms in prop::collection::vec(
                (0u64..1 << 32, prop::sample::select(UNITS.to_vec()), prop::option::of(0u32..1_000_000_000)),
                1..5,
            ),
            sep in prop::sample::select(vec!["", " ", " \t "]),
        ) {
            let mut want: u128 = 0;
            let text: Vec<String> = terms
                .iter()
                .map(|&(n, (unit, ns), frac)| {
                    want += u128::from(n) * ns;
                    match frac {
                        // Nanoseconds of a second, written with all nine digits.
                        Some(f) if unit == "s" => {
                            want += u128::from(f);
                            format!("{n}.{f:09}{unit}")
                        }
                        _ => format!("{n}{unit}"),
                    }
                })
                .collect();
            let text = text.join(sep);
            let got = parse(&text).map(|d| d.as_nanos());
            prop_assert_eq!(got, Ok(want), "{}", text);
        }

        /// Any text at all: no panic.
        #[test]
        fn any_text_is_a_duration_or_an_error(text in ".{0,40}") {
            let _ = parse(&text);
        }
    }
}

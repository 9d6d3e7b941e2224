//! Fuzzing cron expressions (proptest): arbitrary text and cron-shaped expressions — every
//! field syntax croner knows, odd values, zones with unusual daylight saving — through the
//! deploy check, the scheduler's parse and every tick search. None may panic, each call
//! finishes within a bound, and what a search finds is where it says.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use wasq_core::Missed;

use super::*;

/// Per call. A bounded search takes well under a millisecond even in a debug build; the
/// unbounded ones this guards against took 35-150 ms.
const BOUND: Duration = Duration::from_millis(25);

const ZONES: &[&str] = &[
    "UTC",
    "America/New_York",
    "Europe/London",
    // Half-hour daylight saving, and a zone that moved across the date line.
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Kathmandu",
    "America/Santiago",
];

/// Runs `f`, asserting it takes under [`BOUND`]. Slow work is slow every time, a busy
/// machine only now and then: a call over the bound is timed twice more and the fastest
/// counts.
fn timed<T>(what: &str, f: impl Fn() -> T) -> T {
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let out = f();
        fastest = fastest.min(started.elapsed());
        if fastest < BOUND {
            return out;
        }
    }
    panic!("{what} took {fastest:?}, over the bound of {BOUND:?}");
}

fn schedule(crons: Vec<String>, tz: &str) -> Schedule {
    Schedule {
        crons,
        tz: tz.into(),
        missed: Missed::Skip,
        paused: false,
        resumed_at: None,
    }
}

/// One field of values `lo..=hi` as cron syntax spells it — values, ranges, steps, lists
/// and the field's own specials — now and then with values out of range.
fn field(lo: u32, hi: u32, specials: &'static [&'static str]) -> BoxedStrategy<String> {
    let v = move || prop_oneof![9 => lo..=hi, 1 => 0u32..6000].boxed();
    prop_oneof![
        3 => Just("*".to_string()),
        3 => v().prop_map(|v| v.to_string()),
        2 => (v(), v()).prop_map(|(a, b)| format!("{a}-{b}")),
        2 => (1u32..=hi + 1).prop_map(|s| format!("*/{s}")),
        1 => (v(), v(), 1u32..40).prop_map(|(a, b, s)| format!("{a}-{b}/{s}")),
        2 => proptest::collection::vec(v(), 1..5).prop_map(|v| v
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")),
        1 => prop::sample::select(specials).prop_map(str::to_string),
    ]
    .boxed()
}

/// Anything croner might meet in a field.
fn junk_field() -> BoxedStrategy<String> {
    prop_oneof![
        "[0-9LW#?*/,A-Z-]{1,8}",
        prop::sample::select(vec![
            "@yearly", "@every", "L-2", "0#0", "*/0", "1-", ",", "//"
        ])
        .prop_map(str::to_string),
    ]
    .boxed()
}

fn cron_shaped() -> impl Strategy<Value = String> {
    let sec = || field(0, 59, &["?"]);
    let min = || field(0, 59, &["?"]);
    let hour = || field(0, 23, &["?"]);
    let dom = || field(1, 31, &["L", "LW", "15W", "1W", "31W", "L-3", "?"]);
    let month = || field(1, 12, &["JAN", "FEB", "FEB,APR-JUN", "DEC", "?"]);
    let dow = || {
        field(
            0,
            7,
            &["MON", "SUN-SAT", "5#5", "1#1", "5L", "L", "FRI#3", "?"],
        )
    };
    let year = || field(1970, 2200, &["2026", "2035", "1-5000", "4999-5000"]);
    let five = (min(), hour(), dom(), month(), dow())
        .prop_map(|(a, b, c, d, e)| format!("{a} {b} {c} {d} {e}"));
    let six = (sec(), min(), hour(), dom(), month(), dow())
        .prop_map(|(s, a, b, c, d, e)| format!("{s} {a} {b} {c} {d} {e}"));
    let seven = (sec(), min(), hour(), dom(), month(), dow(), year())
        .prop_map(|(s, a, b, c, d, e, y)| format!("{s} {a} {b} {c} {d} {e} {y}"));
    // Dates that are rare or never come (February 30th, a year long past or far off):
    // the searches that cost most.
    let rare = (
        sec(),
        prop::sample::select(vec!["29", "30", "31", "30,31", "L", "29W"]),
        prop::sample::select(vec!["2", "FEB", "2,4", "4,6,9,11", "2,4,6,9,11"]),
        prop::sample::select(vec!["*", "MON", "5#5", "?"]),
        prop::sample::select(vec!["", " 2020", " 2031", " 2040", " 4999", " 1999-2024/5"]),
    )
        .prop_map(|(s, d, m, w, y)| format!("{s} 0 0 {d} {m} {w}{y}"));
    prop_oneof![
        3 => five,
        3 => six,
        2 => seven,
        2 => rare,
        1 => proptest::collection::vec(junk_field(), 0..9).prop_map(|f| f.join(" ")),
        1 => prop::sample::select(vec![
            "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
            "@reboot", "@every 5m",
        ])
        .prop_map(str::to_string),
    ]
}

/// Times from before the epoch to past croner's last year, most near now.
fn instant() -> impl Strategy<Value = Millis> {
    prop_oneof![
        8 => 1_700_000_000_000i64..4_200_000_000_000,
        1 => -80_000_000_000_000i64..200_000_000_000_000,
        1 => prop::sample::select(vec![Millis::MIN, -1, 0, Millis::MAX]),
    ]
}

/// Every search an expression goes through, checked for what it returns.
fn search_all(e: &Entry, now: Millis) {
    match timed("next_after", || e.next_after(now)) {
        Next::At(t) => assert!(t > now, "{:?} after {now}: {t}", e.expr),
        Next::NoneUntil(t) => assert!(t >= now, "{:?} none until {t} < {now}", e.expr),
    }
    let ticks = timed("upcoming", || e.upcoming(now, 5));
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
    assert!(ticks.iter().all(|t| *t > now));
    let back = now.saturating_sub(400 * 24 * 3600 * 1000);
    if let Some(t) = timed("latest_in", || e.latest_in(back, now)) {
        assert!(
            back < t && t <= now,
            "{:?}: {t} outside ({back}, {now}]",
            e.expr
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_is_refused_or_searched_within_bounds(
        text in ".{0,200}",
        tz in ".{0,80}",
        now in instant(),
    ) {
        let s = schedule(vec![text], &tz);
        let _ = timed("check", || check(&s, now));
        let (entries, _) = timed("entries", || entries(&s));
        for e in &entries {
            search_all(e, now);
        }
    }

    #[test]
    fn cron_shaped_expressions_are_refused_or_searched_within_bounds(
        exprs in proptest::collection::vec(cron_shaped(), 1..4),
        tz in prop::sample::select(ZONES),
        now in instant(),
    ) {
        let s = schedule(exprs, tz);
        let checked = timed("check", || check(&s, now));
        let (entries, problems) = timed("entries", || entries(&s));
        // What a deploy accepts, the scheduler runs, and it has a tick within the horizon.
        if checked.is_ok() {
            prop_assert!(problems.is_empty(), "{problems:?}");
            for e in &entries {
                prop_assert!(matches!(e.next_after(now), Next::At(_)), "{:?}", e.expr);
            }
        }
        for e in &entries {
            search_all(e, now);
        }
    }
}

//! Cron expressions: what a deploy may hold, and tick searches whose cost is bounded.
//!
//! croner finds a match by stepping the calendar and gives up only at the year 5000, so one
//! search for an expression that never fires (`0 0 30 2 *`) costs 35-150 ms, and the
//! scheduler and `GET /v1/schedules` search every expression (issue 10, finding 4). Here
//! every search stops [`SEARCH_YEARS`] calendar years past its start: the pattern's year
//! range is clamped to them, and croner fails at once when it steps out of it. A deploy is
//! refused unless every expression fires within that horizon (leap days do), so accepted
//! expressions have ticks to find, and an expression that stops firing (a year field in
//! the past) costs one bounded search per horizon. One more loop escapes the clamp: croner
//! steps a day at a time until the day-of-month and day-of-week fields match, whatever the
//! month and year, so a day pattern that matches no date at all (`L` alone as a weekday)
//! would still step to the year 5000; such a pattern is caught first by trying it on two
//! years of dates (see [`Entry::days_match`]). Callers run searches on blocking threads
//! under a time budget (`schedule.rs`, `api.rs`).

use std::str::FromStr;
use std::sync::OnceLock;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use wasq_core::Schedule;
use wasq_core::clock::Millis;

/// Cron expressions one function may have.
pub(crate) const MAX_CRONS: usize = 16;
/// Characters in one cron expression.
pub(crate) const MAX_CRON_LEN: usize = 128;
/// Characters in a time zone name (the longest IANA name has 32).
const MAX_TZ_LEN: usize = 64;
/// How far one search looks: the rest of its start year and this many more. Eight years
/// hold a leap day wherever they start (2096 to 2104 has none in between).
pub(crate) const SEARCH_YEARS: i32 = 8;

/// One parsed expression of a schedule.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub expr: String,
    cron: Cron,
    tz: Tz,
    /// Whether any date matches the day fields; found on the first search.
    days_match: OnceLock<bool>,
}

/// What a bounded search found after a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The first tick.
    At(Millis),
    /// No tick up to and including this time; search again from it.
    NoneUntil(Millis),
}

/// The schedule's time zone; the error names it (bounded, escaped).
fn zone(schedule: &Schedule) -> Result<Tz, String> {
    if schedule.tz.len() > MAX_TZ_LEN {
        return Err(format!(
            "the time zone name is {} characters long; use an IANA name such as America/New_York",
            schedule.tz.len()
        ));
    }
    Tz::from_str(&schedule.tz).map_err(|_| {
        format!(
            "unknown time zone {:?} (use an IANA name such as America/New_York)",
            schedule.tz
        )
    })
}

/// Parses one expression; the error names it (bounded, escaped).
fn parse_one(expr: &str, tz: Tz) -> Result<Entry, String> {
    if expr.len() > MAX_CRON_LEN {
        return Err(format!(
            "a cron expression is {} characters long, over the limit of {MAX_CRON_LEN}",
            expr.len()
        ));
    }
    // Expressions reach run triggers, logs and terminals: no tabs, newlines or escapes,
    // which croner would otherwise take as field separators or reject less clearly.
    if !expr.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        return Err(format!(
            "invalid cron expression {expr:?}: use printable ASCII characters and spaces only"
        ));
    }
    let cron =
        Cron::from_str(expr).map_err(|e| format!("invalid cron expression {expr:?}: {e}"))?;
    Ok(Entry {
        expr: expr.to_owned(),
        cron,
        tz,
        days_match: OnceLock::new(),
    })
}

/// The expressions the scheduler runs: each that parses, up to [`MAX_CRONS`], with the
/// problems of the rest (schedules stored before the limits, logged by the caller).
pub(crate) fn entries(schedule: &Schedule) -> (Vec<Entry>, Vec<String>) {
    let tz = match zone(schedule) {
        Ok(tz) => tz,
        Err(e) => return (vec![], vec![e]),
    };
    let mut out = vec![];
    let mut problems = vec![];
    for expr in &schedule.crons {
        if out.len() == MAX_CRONS {
            problems.push(format!(
                "{} cron expressions, over the limit of {MAX_CRONS}: the rest are ignored",
                schedule.crons.len()
            ));
            break;
        }
        match parse_one(expr, tz) {
            Ok(e) => out.push(e),
            Err(e) => problems.push(e),
        }
    }
    (out, problems)
}

/// Checks a schedule being deployed at `now`: a known zone, 1 to [`MAX_CRONS`]
/// expressions that parse, each firing within [`SEARCH_YEARS`]. The error names the
/// problem and the expression.
pub(crate) fn check(schedule: &Schedule, now: Millis) -> Result<(), String> {
    let tz = zone(schedule)?;
    match schedule.crons.len() {
        0 => return Err("a schedule needs at least one cron expression".into()),
        n if n > MAX_CRONS => {
            return Err(format!(
                "{n} cron expressions; a function may have at most {MAX_CRONS}"
            ));
        }
        _ => {}
    }
    for expr in &schedule.crons {
        let entry = parse_one(expr, tz)?;
        if let Next::NoneUntil(_) = entry.next_after(now) {
            return Err(format!(
                "cron expression {expr:?} does not fire in the next {SEARCH_YEARS} years \
                 (it never matches a real date, or too rarely): wasq refuses it"
            ));
        }
    }
    Ok(())
}

/// A time in the zone; times chrono cannot hold are clamped to the ones it can.
fn at(ms: Millis, tz: Tz) -> DateTime<Tz> {
    let utc = Utc.timestamp_millis_opt(ms).single().unwrap_or(if ms < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    });
    utc.with_timezone(&tz)
}

/// Start of a UTC year, less a day (no zone is a day off UTC): every time before it lies
/// in that year or earlier in any zone.
fn before_year(year: i32) -> Millis {
    Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0)
        .single()
        .map_or(Millis::MAX, |t| t.timestamp_millis() - 24 * 3600 * 1000)
}

/// A year as croner's year component holds it (1..=5000 in croner 4).
fn year_bound(year: i32) -> u16 {
    u16::try_from(year.clamp(0, i32::from(u16::MAX))).unwrap_or(u16::MAX)
}

impl Entry {
    /// Whether some date matches the day-of-month and day-of-week fields. Day patterns
    /// repeat month by month (a day number, the last day, the weekday nearest a day, the
    /// n-th or last weekday, or any of these); one that matches a date matches one in
    /// every few months, so two years of dates (a leap day among them) tell.
    fn days_match(&self) -> bool {
        *self.days_match.get_or_init(|| {
            let mut date = NaiveDate::from_ymd_opt(2024, 1, 1).expect("a real date");
            for _ in 0..731 {
                let weekday =
                    croner::Weekday::from_days_from_sunday(date.weekday().num_days_from_sunday());
                let pattern = &self.cron.pattern;
                if pattern
                    .day_match(date.year(), date.month(), date.day(), weekday)
                    .unwrap_or(false)
                {
                    return true;
                }
                date = date.succ_opt().expect("2025 has a successor");
            }
            false
        })
    }

    /// The first tick after `after`, searched up to the end of the year [`SEARCH_YEARS`]
    /// after `after`'s year.
    pub(crate) fn next_after(&self, after: Millis) -> Next {
        let from = at(after, self.tz);
        let last_year = from.year().saturating_add(SEARCH_YEARS);
        let none = Next::NoneUntil(before_year(last_year.saturating_add(1)).max(after));
        // Outside croner's years the clamp below would not bound the search.
        if !(1..=croner::YEAR_UPPER_LIMIT).contains(&from.year()) || !self.days_match() {
            return none;
        }
        let mut cron = self.cron.clone();
        let years = &mut cron.pattern.years;
        years.max = years.max.min(year_bound(last_year));
        match cron.find_next_occurrence(&from, false) {
            Ok(t) if t.timestamp_millis() > after => Next::At(t.timestamp_millis()),
            _ => none,
        }
    }

    /// The latest tick in (`after`, `until`], searched back at most [`SEARCH_YEARS`] years
    /// before `until`'s year.
    pub(crate) fn latest_in(&self, after: Millis, until: Millis) -> Option<Millis> {
        if until <= after {
            return None;
        }
        let to = at(until, self.tz);
        if !(1..=croner::YEAR_UPPER_LIMIT).contains(&to.year()) || !self.days_match() {
            return None;
        }
        let first_year = at(after, self.tz)
            .year()
            .max(to.year().saturating_sub(SEARCH_YEARS));
        let mut cron = self.cron.clone();
        let years = &mut cron.pattern.years;
        years.min = years.min.max(year_bound(first_year));
        let t = cron.find_previous_occurrence(&to, true).ok()?;
        let ms = t.timestamp_millis();
        (after < ms && ms <= until).then_some(ms)
    }

    /// The next `n` ticks after `after` (fewer when there are none within the horizon).
    pub(crate) fn upcoming(&self, mut after: Millis, n: usize) -> Vec<Millis> {
        let mut out = vec![];
        while out.len() < n {
            match self.next_after(after) {
                Next::At(t) => {
                    out.push(t);
                    after = t;
                }
                Next::NoneUntil(_) => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use wasq_core::Missed;

    use super::*;

    fn schedule(crons: &[&str], tz: &str) -> Schedule {
        Schedule {
            crons: crons.iter().map(|c| c.to_string()).collect(),
            tz: tz.into(),
            missed: Missed::Skip,
            paused: false,
            resumed_at: None,
        }
    }

    pub(super) fn entry(expr: &str, tz: &str) -> Entry {
        let (mut e, problems) = entries(&schedule(&[expr], tz));
        assert_eq!(problems, Vec::<String>::new());
        e.remove(0)
    }

    pub(super) fn ms(rfc3339: &str) -> Millis {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis()
    }

    pub(super) fn utc(ms: Millis) -> String {
        at(ms, Tz::UTC).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn upcoming(expr: &str, tz: &str, after: &str, n: usize) -> Vec<String> {
        entry(expr, tz)
            .upcoming(ms(after), n)
            .into_iter()
            .map(utc)
            .collect()
    }

    #[test]
    fn seconds_field_ticks_every_second() {
        let e = entry("*/1 * * * * *", "UTC");
        let t0 = ms("2026-01-01T00:00:00.500Z");
        let ticks = e.upcoming(t0, 10);
        assert_eq!(utc(ticks[0]), "2026-01-01T00:00:01Z");
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 1000));
    }

    #[test]
    fn new_york_around_the_spring_and_autumn_changes() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT. A 02:30 daily job fires right after the
        // gap, at 03:00 EDT (07:00Z); the day before at 02:30 EST (07:30Z), after at 06:30Z.
        assert_eq!(
            upcoming("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3),
            [
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z"
            ]
        );
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST. A 01:30 job fires once, at the first
        // 01:30 (EDT, 05:30Z).
        assert_eq!(
            upcoming("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
    }

    #[test]
    fn bad_schedules_are_named() {
        let now = ms("2026-06-01T00:00:00Z");
        let bad = |crons: &[&str], tz: &str| check(&schedule(crons, tz), now).unwrap_err();
        assert!(bad(&["61 * * * *"], "UTC").contains("\"61 * * * *\""));
        assert!(bad(&["* * * * *"], "Mars/Olympus").contains("unknown time zone"));
        assert!(bad(&[&"x".repeat(100)], "UTC").starts_with("invalid cron expression \"xxx"));
        assert!(bad(&["* * * * *"], &"A".repeat(10_000)).contains("10000 characters"));
        assert!(bad(&[], "UTC").contains("at least one"));
        let many: Vec<String> = (0..1440)
            .map(|i| format!("{} {} 30 2 *", i % 60, i / 60))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            bad(&many, "UTC"),
            "1440 cron expressions; a function may have at most 16"
        );
        let long = format!("0 0 * * * {}", "1,".repeat(100));
        assert!(bad(&[&long], "UTC").contains("over the limit of 128"));
        assert!(bad(&["0 0\n* * *"], "UTC").contains("printable ASCII"));
        assert!(bad(&["0 0 *\u{1b}]0;x * *"], "UTC").contains("\\u{1b}"));
        // Never fires, or too rarely.
        for never in [
            "0 0 30 2 *",
            "0 0 31 2,4,6,9,11 *",
            "0 0 0 1 1 * 2020",
            "0 0 0 1 1 * 2040",
        ] {
            let e = bad(&[never], "UTC");
            assert!(
                e.contains("does not fire in the next 8 years"),
                "{never}: {e}"
            );
            assert!(e.contains(never), "{e}");
        }
        // A day pattern no date matches (croner would step day by day to the year 5000).
        let e = bad(&["48 */24 * 1 L"], "America/New_York");
        assert!(e.contains("does not fire"), "{e}");
        // Rare but fine: leap days, a year within the horizon.
        for fine in ["0 0 29 2 *", "0 0 0 1 1 * 2033", "0 0 L 2 *"] {
            check(&schedule(&[fine], "UTC"), now).unwrap_or_else(|e| panic!("{fine}: {e}"));
        }
    }

    #[test]
    fn leap_days_are_found_across_a_century_without_one() {
        assert_eq!(
            upcoming("0 0 29 2 *", "UTC", "2096-03-01T00:00:00Z", 1),
            ["2104-02-29T00:00:00Z"]
        );
    }

    #[test]
    fn searches_for_ticks_that_never_come_are_bounded() {
        // Unbounded, croner steps to the year 5000: 35-150 ms per search.
        let e = entry("0 0 31 2,4,6,9,11 *", "UTC");
        let t0 = ms("2026-06-01T00:00:00Z");
        let started = Instant::now();
        for _ in 0..100 {
            let Next::NoneUntil(until) = e.next_after(t0) else {
                panic!("found a tick")
            };
            assert_eq!(utc(until), "2034-12-31T00:00:00Z");
            assert_eq!(e.latest_in(0, t0), None);
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "200 bounded searches took {:?}",
            started.elapsed()
        );
        // Searching again from the end of the horizon goes on from there.
        let e = entry("0 0 0 1 1 * 2040", "UTC");
        let Next::NoneUntil(until) = e.next_after(t0) else {
            panic!()
        };
        assert_eq!(e.next_after(until), Next::At(ms("2040-01-01T00:00:00Z")));
    }

    #[test]
    fn latest_finds_the_tick_to_catch_up() {
        let e = entry("0 9 * * *", "UTC");
        let now = ms("2026-01-02T10:00:00Z");
        assert_eq!(
            e.latest_in(0, now).map(utc).as_deref(),
            Some("2026-01-02T09:00:00Z")
        );
        assert_eq!(e.latest_in(ms("2026-01-02T09:00:00Z"), now), None);
        assert_eq!(
            e.latest_in(ms("2026-01-01T12:00:00Z"), ms("2026-01-02T09:00:00Z"))
                .map(utc)
                .as_deref(),
            Some("2026-01-02T09:00:00Z")
        );
        assert_eq!(
            upcoming("0 9 * * *", "UTC", "2026-01-02T10:00:00Z", 2),
            ["2026-01-03T09:00:00Z", "2026-01-04T09:00:00Z"]
        );
    }
}

#[cfg(test)]
mod fuzz;

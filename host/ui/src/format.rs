//! Times, sizes, durations and untrusted text as the pages show them.

use wasq_core::clock::Millis;
use wasq_core::text;

/// `2026-12-04 17:36:45 UTC` (the dashboard shows UTC, like the API).
pub(crate) fn time(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// `340 ms`, `2.5 s`, `4 min 10 s`, `3 h 2 min`, `2 d 4 h`.
pub(crate) fn duration(ms: Millis) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{} h {} min", s / 3600, s / 60 % 60),
        _ => format!("{} d {} h", s / 86_400, s / 3600 % 24),
    }
}

/// `512 B`, `1.5 KiB`, `12.0 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// One line of untrusted text, at most `max` bytes (control characters made visible).
pub(crate) fn line(s: &str, max: usize) -> String {
    text::escape_line(s, max)
}

/// A block of untrusted text (newlines kept), at most `max` bytes, saying what was cut.
pub(crate) fn block(s: &str, max: usize) -> String {
    let (mut out, whole) = text::escape_controls(s, true, max);
    if !whole {
        out.push_str(&format!(
            "\n… cut: {} in all (the API answers it whole)",
            bytes(s.len() as u64)
        ));
    }
    out
}

/// JSON bytes pretty-printed (as they are when they are not JSON), at most `max` bytes.
pub(crate) fn json(raw: &[u8], max: usize) -> String {
    let text = match serde_json::from_slice::<serde_json::Value>(raw) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(raw).into_owned(),
    };
    block(&text, max)
}

/// The first group of a run id: enough to tell runs apart on a page (the list links the
/// whole id).
pub(crate) fn short_id(id: &str) -> String {
    line(id.get(..13).unwrap_or(id), 40)
}

/// A `datetime-local` field's value (`2026-12-04T17:30`, read as UTC) as RFC 3339; `None`
/// for an empty field or one that is not such a time.
pub fn datetime_local_to_rfc3339(v: &str) -> Option<String> {
    let v = v.trim();
    let parsed = chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S"))
        .ok()?;
    Some(
        parsed
            .and_utc()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// The inverse of [`datetime_local_to_rfc3339`], to fill the field again.
pub fn rfc3339_to_datetime_local(v: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.naive_utc().format("%Y-%m-%dT%H:%M").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(duration(340), "340 ms");
        assert_eq!(duration(2_500), "2.5 s");
        assert_eq!(duration(250_000), "4 min 10 s");
        assert_eq!(duration(10_920_000), "3 h 2 min");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            datetime_local_to_rfc3339("2026-12-04T17:30").as_deref(),
            Some("2026-12-04T17:30:00Z")
        );
        assert_eq!(datetime_local_to_rfc3339("yesterday"), None);
        assert_eq!(
            rfc3339_to_datetime_local("2026-12-04T17:30:00Z"),
            "2026-12-04T17:30"
        );
    }

    #[test]
    fn untrusted_text_is_bounded_and_control_free() {
        let l = line("a\u{1b}[31mb\nc", 100);
        assert!(!l.contains('\u{1b}') && !l.contains('\n'), "{l}");
        let b = block(&"x".repeat(5000), 100);
        assert!(b.len() < 200 && b.contains("cut: 4.9 KiB"), "{b}");
        assert_eq!(json(br#"{"a":1}"#, 100), "{\n  \"a\": 1\n}");
    }
}

//! Everything the CLI prints. Text that came over HTTP was chosen, at some point, by a
//! tenant or a guest (names, labels, progress, log lines, error messages), and the
//! terminal it reaches may be the operator's: it is escaped and bounded here
//! ([`wasq_core::text`]) before it is printed, field by field. JSON output stays JSON, with
//! the characters a terminal could act on written as `\uXXXX`.
//!
//! Writing to a closed stdout (`wasq runs show ID | head -3`) ends the program quietly,
//! exit 0, like other Unix tools, instead of panicking as `println!` does.

use std::io::Write;

use serde_json::Value;
use wasq_core::text;

/// Names, ids, statuses, labels, event names, progress: one short line each.
pub(crate) const SHORT: usize = 256;
/// Messages and log lines (the sandbox stores at most 16 KiB of either).
pub(crate) const LONG: usize = 16 << 10;
/// JSON values (inputs, outputs) shown in a table cell.
pub(crate) const CELL_JSON: usize = 100;

/// One line of untrusted text, escaped and at most `max` bytes (with a marker past it).
pub(crate) fn line(s: &str, max: usize) -> String {
    text::escape_line(s, max)
}

/// A short field of a JSON object: a string is shown escaped, anything else as compact
/// JSON, null as nothing.
pub(crate) fn field(v: &Value) -> String {
    match v {
        Value::String(s) => line(s, SHORT),
        v => json_cell(v, SHORT),
    }
}

/// A JSON value as compact, escaped JSON in at most `max` bytes (null as nothing).
pub(crate) fn json_cell(v: &Value, max: usize) -> String {
    if v.is_null() {
        return String::new();
    }
    line(&json(v, false), max)
}

/// Characters serde_json leaves raw in strings that a terminal may act on: DEL, C1
/// controls, bidi overrides (it escapes C0 controls itself; outside strings, a raw newline
/// is layout).
fn json_unsafe(c: char) -> bool {
    c >= ' ' && text::is_unsafe_char(c)
}

/// JSON text with every character of [`json_unsafe`] as a `\uXXXX` escape, so it is still
/// the same JSON. Outside strings JSON text is ASCII, so escaping every such character of
/// the whole text only touches strings.
pub(crate) fn json(v: &Value, pretty: bool) -> String {
    let raw = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    }
    .unwrap_or_else(|_| v.to_string());
    if !raw.chars().any(json_unsafe) {
        return raw;
    }
    let mut out = String::with_capacity(raw.len() + 16);
    for c in raw.chars() {
        if json_unsafe(c) {
            // All of them are in the Basic Multilingual Plane: one \uXXXX each.
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes one line to stdout, or ends the program: quietly on a closed pipe, with a
/// message on any other write error.
pub(crate) fn write_line(mut w: impl Write, args: std::fmt::Arguments<'_>) {
    let written = w.write_fmt(args).and_then(|()| w.write_all(b"\n"));
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// `println!` that ends the program quietly when stdout is a closed pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write_line(std::io::stdout().lock(), format_args!($($arg)*))
    };
}

/// `eprintln!` that does not panic when stderr is closed: the line is lost, the command
/// goes on and still exits with its own code (a failure must not turn into exit 0).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub(crate) use {errln, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_stays_json_with_every_unsafe_character_escaped() {
        let v = serde_json::json!({"m": "\x1b]0;t\x07 \u{9b}2J \u{202e}x \x7f \n", "n": 1});
        for pretty in [false, true] {
            let s = json(&v, pretty);
            let raw: Vec<char> = s.chars().filter(|&c| text::is_unsafe_char(c)).collect();
            assert!(raw.iter().all(|&c| c == '\n' && pretty), "{s:?}");
            assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v, "{s}");
        }
        assert!(json(&v, false).contains(r"\u009b2J \u202ex \u007f \n"));
    }

    #[test]
    fn fields_are_one_bounded_line() {
        assert_eq!(field(&Value::from("a\nb\x1b")), "a\\nb\\u{1b}");
        assert_eq!(field(&Value::Null), "");
        assert_eq!(field(&serde_json::json!(3)), "3");
        let long = field(&Value::from("e".repeat(1 << 20)));
        assert!(
            long.len() < SHORT + 32 && long.ends_with(" bytes]"),
            "{long}"
        );
        assert_eq!(
            json_cell(&serde_json::json!({"k": "\u{202e}"}), 100),
            r#"{"k":"\u202e"}"#
        );
    }
}

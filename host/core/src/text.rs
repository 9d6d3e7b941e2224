//! Untrusted text made safe to store and to print: guests and tenants choose the bytes of
//! log lines, step and event names, progress messages, labels and error messages, and a
//! terminal obeys escape sequences. Everything that shows such text (the sandbox storing
//! a log line, the server writing the audit trail, the CLI printing a table) escapes it
//! here, the one place that decides which characters are dangerous.

use std::fmt::Write;

/// Characters that must never reach a terminal or a log viewer raw: C0 and C1 control
/// characters and DEL (escape sequences, CR/LF forged lines, BEL, NUL), the Unicode
/// bidirectional controls that reorder the text around them ("Trojan Source"), and the
/// Unicode line and paragraph separators (line breaks to some viewers).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// What [`escape`] leaves as it is.
#[derive(Debug, Clone, Copy)]
struct Keep {
    newlines: bool,
    tabs: bool,
}

/// Escapes `s` into at most `max` bytes; returns the text and how many bytes of `s` it
/// covers. An escape is never cut in half: it is either whole or left out.
fn escape(s: &str, keep: Keep, max: usize) -> (String, usize) {
    let mut out = String::with_capacity(s.len().min(max));
    for (at, c) in s.char_indices() {
        let start = out.len();
        match c {
            '\t' if keep.tabs => out.push(c),
            '\n' if keep.newlines => out.push(c),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
        if out.len() > max {
            out.truncate(start);
            return (out, at);
        }
    }
    (out, s.len())
}

/// Makes guest text safe to store and show: the characters of [`is_unsafe_char`] become
/// visible escapes (`\n`, `\r`, `\u{1b}`, `\u{202e}`). Tabs stay, and so do newlines when
/// `keep_newlines` (text wasq composed, such as a backtrace). Stops before `max` bytes; the
/// bool says whether everything fitted.
///
/// Backslashes are left alone, so escaping escaped text changes nothing.
pub fn escape_controls(s: &str, keep_newlines: bool, max: usize) -> (String, bool) {
    let keep = Keep {
        newlines: keep_newlines,
        tabs: true,
    };
    let (out, covered) = escape(s, keep, max);
    (out, covered == s.len())
}

/// One line of untrusted text for a terminal, a table cell or a one-line record: every
/// unsafe character escaped, tabs and newlines included, and at most `max` bytes of it
/// (plus a marker such as `…[+20971400 bytes]` saying how much of the text was left out).
pub fn escape_line(s: &str, max: usize) -> String {
    let keep = Keep {
        newlines: false,
        tabs: false,
    };
    let (mut out, covered) = escape(s, keep, max);
    if covered < s.len() {
        let _ = write!(out, "…[+{} bytes]", s.len() - covered);
    }
    out
}

/// Cuts `s` to at most `max` bytes on a char boundary.
pub fn truncate_utf8(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("aéb".into(), 2), "a");
        assert_eq!(truncate_utf8("aéb".into(), 3), "aé");
        assert_eq!(truncate_utf8("ab".into(), 10), "ab");
    }

    const EVIL: &str =
        "\x1b[31mred\x1b[0m\nINFO forged\rover\x07\u{9b}2J\u{202e}evil\u{2066}\x7f\x00\tend";

    #[test]
    fn every_dangerous_character_becomes_visible() {
        assert_eq!(
            escape_line(EVIL, usize::MAX),
            "\\u{1b}[31mred\\u{1b}[0m\\nINFO forged\\rover\\u{7}\\u{9b}2J\\u{202e}evil\\u{2066}\\u{7f}\\u{0}\\tend"
        );
        assert_eq!(
            escape_line("title\x1b]0;pwned\x07 \u{2028}next \u{61c}", usize::MAX),
            "title\\u{1b}]0;pwned\\u{7} \\u{2028}next \\u{61c}"
        );
        let (kept, complete) = escape_controls("a\n\tb\r\x1b", true, usize::MAX);
        assert_eq!(kept, "a\n\tb\\r\\u{1b}");
        assert!(complete);
        assert_eq!(escape_controls("a\nb", false, 100).0, "a\\nb");
    }

    #[test]
    fn plain_text_and_other_scripts_pass_unchanged() {
        for s in [
            "",
            "plain ascii",
            "Grüße, 你好, مرحبا, emoji 🎉",
            r"C:\path \u{1b} escaped",
        ] {
            assert_eq!(escape_line(s, usize::MAX), s);
            assert_eq!(escape_controls(s, false, usize::MAX), (s.to_owned(), true));
        }
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = escape_line(EVIL, usize::MAX);
        assert_eq!(escape_line(&once, usize::MAX), once);
        assert!(!once.chars().any(is_unsafe_char));
    }

    #[test]
    fn long_text_is_cut_with_a_marker_and_escapes_are_never_split() {
        let huge = "n".repeat(20 << 20);
        let shown = escape_line(&huge, 256);
        assert_eq!(
            shown,
            format!("{}…[+{} bytes]", "n".repeat(256), (20 << 20) - 256)
        );

        // "ab" fits in 4 bytes, the 6-byte escape of ESC does not: it is left out whole.
        assert_eq!(escape_line("ab\x1bcd", 4), "ab…[+3 bytes]");
        assert_eq!(
            escape_controls("ab\x1bcd", false, 4),
            ("ab".to_owned(), false)
        );
        // Multi-byte characters are not split either.
        assert_eq!(escape_line("éé", 3), "é…[+2 bytes]");
        assert_eq!(escape_line("exact", 5), "exact");
    }
}

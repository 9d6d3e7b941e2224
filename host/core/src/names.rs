//! The rules for names that travel between tenants, guests, stores and terminals: function
//! names and event names. One set of rules for the API and for guests, so a guest cannot
//! store a name the API would refuse (a 20 MB event name, one with escape sequences).

/// Longest function name.
pub const MAX_FUNCTION_NAME: usize = 64;
/// Longest event name.
pub const MAX_EVENT_NAME: usize = 128;
/// Largest `wait-for-event` filter (JSON), in bytes.
pub const MAX_EVENT_FILTER: usize = 4096;
/// Longest run id a guest may join (a UUID is 36 characters).
pub const MAX_RUN_ID: usize = 64;

/// Function names appear in URLs, logs and CLI tables: 1-64 ASCII letters, digits, `-`,
/// `_` or `.`, starting with a letter or digit.
pub fn check_function_name(name: &str) -> Result<(), String> {
    if is_plain_name(name, MAX_FUNCTION_NAME) {
        Ok(())
    } else {
        Err(format!(
            "invalid function name {}: use 1-{MAX_FUNCTION_NAME} letters, digits, '-', '_' or \
             '.', starting with a letter or digit",
            quoted(name)
        ))
    }
}

/// The shape of function and queue names: 1-`max` ASCII letters, digits, `-`, `_` or
/// `.`, starting with a letter or digit.
pub fn is_plain_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Event names are typed on command lines and matched by waiters: 1-128 ASCII letters,
/// digits, `-`, `_`, `.`, `:` or `/`.
pub fn check_event_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_EVENT_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid event name {}: use 1-{MAX_EVENT_NAME} letters, digits, '-', '_', '.', \
             ':' or '/'",
            quoted(name)
        ))
    }
}

/// A run id as a guest passes it to `join`: plain and short.
pub fn check_run_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_RUN_ID
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!("invalid run id {}", quoted(id)))
    }
}

/// A name quoted for an error message: Rust-escaped (no control characters reach the
/// reader) and cut to 80 characters, so a 20 MB name makes a short message.
pub fn quoted(name: &str) -> String {
    const SHOWN: usize = 80;
    let mut cut: String = name.chars().take(SHOWN).collect();
    let more = name.chars().count() > SHOWN;
    if more {
        cut.push('…');
    }
    let mut q = format!("{cut:?}");
    if more {
        q.push_str(&format!(" ({} bytes)", name.len()));
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_rules() {
        assert!(check_function_name("send-email_v2.1").is_ok());
        for bad in ["", "-x", "a b", "é", &"x".repeat(65), "bad\u{1b}[0m"] {
            assert!(check_function_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_event_name("user.signup:v1/eu").is_ok());
        for bad in ["", "bad name {x}:", &"e".repeat(129), "a\nb"] {
            assert!(check_event_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_run_id("01a22fd7-ec1f-76d6-a057-9316feba19a7").is_ok());
        assert!(check_run_id("../etc").is_err());
    }

    #[test]
    fn a_huge_name_makes_a_short_escaped_message() {
        let huge = format!("\u{1b}]0;OWNED\u{7}{}", "n".repeat(20_000_000));
        let e = check_event_name(&huge).unwrap_err();
        assert!(e.len() < 300, "{} bytes", e.len());
        assert!(!e.contains('\u{1b}') && e.contains("\\u{1b}"), "{e}");
        assert!(e.contains("20000010 bytes"), "{e}");
    }
}

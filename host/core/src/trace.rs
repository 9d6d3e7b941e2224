//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent` a run
//! keeps of what created it (an API request, a parent attempt, a cron tick), so that every
//! attempt, in whatever process, continues that trace.
//!
//! Core only validates and carries the value; spans are the server's. A client's header is
//! untrusted text: [`TraceParent::parse`] accepts only the format (55 characters of
//! lowercase hex and dashes), so nothing else reaches a store. `tracestate` is not kept.

use serde::{Deserialize, Serialize};

/// A W3C `traceparent` header value, version `00`:
/// `00-<32 hex: trace id>-<16 hex: parent span id>-<2 hex: flags>`, always
/// [`TraceParent::LEN`] characters. Built only by [`TraceParent::parse`] and
/// [`TraceParent::new`], so it is always well formed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TraceParent(String);

impl TraceParent {
    /// The length of a version-00 `traceparent`.
    pub const LEN: usize = 55;

    /// A header value as the W3C recommendation parses it: version `00` exactly
    /// [`TraceParent::LEN`] characters; a later version at least that, with a `-` after
    /// them if longer (its extra fields are dropped, the value is kept as version 00).
    /// Lowercase hex only; version `ff`, an all-zero trace id or parent id are invalid.
    /// A value that does not parse is to be ignored (a new trace starts), not refused.
    pub fn parse(s: &str) -> Result<TraceParent, String> {
        let bad = |why: &str| Err(format!("not a W3C traceparent ({why})"));
        let b = s.as_bytes();
        if b.len() < Self::LEN {
            return bad("too short");
        }
        // Every slice below is within these bytes.
        if !b[..Self::LEN].is_ascii() {
            return bad("not ASCII");
        }
        let version = &s[..2];
        if !is_hex(version) || version == "ff" {
            return bad("bad version");
        }
        if (version == "00" && b.len() != Self::LEN)
            || (b.len() > Self::LEN && b[Self::LEN] != b'-')
        {
            return bad("bad length");
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return bad("bad separators");
        }
        let (trace_id, parent_id, flags) = (&s[3..35], &s[36..52], &s[53..55]);
        if !is_hex(trace_id) || !is_hex(parent_id) || !is_hex(flags) {
            return bad("not lowercase hex");
        }
        if trace_id.bytes().all(|c| c == b'0') || parent_id.bytes().all(|c| c == b'0') {
            return bad("an all-zero id");
        }
        Ok(TraceParent(format!("00-{trace_id}-{parent_id}-{flags}")))
    }

    /// The value for a span: `None` when either id is zero (no valid span).
    pub fn new(trace_id: u128, span_id: u64, sampled: bool) -> Option<TraceParent> {
        (trace_id != 0 && span_id != 0).then(|| {
            TraceParent(format!(
                "00-{trace_id:032x}-{span_id:016x}-{:02x}",
                u8::from(sampled)
            ))
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The id of the span that created the run: 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        &self.0[36..52]
    }

    /// The trace flags' `sampled` bit.
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.0[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }

    /// The trace id as a number.
    pub fn trace_id_u128(&self) -> u128 {
        u128::from_str_radix(self.trace_id(), 16).unwrap_or(0)
    }

    /// The parent span id as a number.
    pub fn parent_id_u64(&self) -> u64 {
        u64::from_str_radix(self.parent_id(), 16).unwrap_or(0)
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for TraceParent {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        TraceParent::parse(&s)
    }
}

impl From<TraceParent> for String {
    fn from(t: TraceParent) -> String {
        t.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_example_parses_and_reads_back() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.as_str(), GOOD);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(t.trace_id_u128(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.parent_id_u64(), 0x00f067aa0ba902b7);
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn new_formats_what_parse_reads() {
        let t =
            TraceParent::new(0x4bf92f3577b34da6a3ce929d0e0e4736, 0xf067aa0ba902b7, true).unwrap();
        assert_eq!(t.as_str(), GOOD);
        assert_eq!(TraceParent::parse(t.as_str()).unwrap(), t);
        assert!(TraceParent::new(0, 1, true).is_none());
        assert!(TraceParent::new(1, 0, true).is_none());
    }

    #[test]
    fn a_later_version_is_kept_as_version_00() {
        let later = format!("cc{}-what-comes-next", &GOOD[2..]);
        assert_eq!(TraceParent::parse(&later).unwrap().as_str(), GOOD);
        assert_eq!(
            TraceParent::parse(&format!("01{}", &GOOD[2..]))
                .unwrap()
                .as_str(),
            GOOD
        );
    }

    #[test]
    fn anything_else_is_not_a_traceparent() {
        for bad in [
            "",
            "00",
            &GOOD[..54],
            &format!("{GOOD}-"),
            &format!("{GOOD}0"),
            &format!("cc{}0", &GOOD[2..]),
            &GOOD.to_uppercase(),
            &format!("ff{}", &GOOD[2..]),
            &format!("0g{}", &GOOD[2..]),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-\u{e9}",
            "00-4bf92f3577b34da6a3ce929d0e0e47\u{e9}-00f067aa0ba902b7-01",
            "0\u{e9}-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn serde_checks_the_format() {
        let t: TraceParent = serde_json::from_str(&format!("\"{GOOD}\"")).unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{GOOD}\""));
        assert!(serde_json::from_str::<TraceParent>("\"00-nope\"").is_err());
    }
}

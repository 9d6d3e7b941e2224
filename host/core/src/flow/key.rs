//! Key expressions (`input.customer.id`, `input.items[0]`): where in a run's input its
//! flow-control keys come from, parsed once at deploy and evaluated at enqueue.

use serde::{Deserialize, Serialize};

use super::*;

/// Keys go into store keys and indexes: long ones are replaced by `#` and a 64-bit
/// FNV-1a hash of themselves (stable across versions and hosts).
pub(super) fn bounded_key(key: &str) -> String {
    if key.len() <= MAX_KEY_BYTES {
        return key.to_owned();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("#{h:016x}")
}

/// A key expression: a path into the run's input.
///
/// ```text
/// expr    = "input" segment*
/// segment = "." name            field of an object; name = [A-Za-z_][A-Za-z0-9_-]*
///         | "[" digits "]"      element of an array, from 0
///         | "[" string "]"      field of an object, any name: a JSON string literal
/// ```
///
/// At most 256 characters and 16 segments, no spaces. Examples: `input.customer.id`,
/// `input.items[0].sku`, `input["user name"]`, `input` (the whole input).
///
/// Evaluation ([`KeyExpr::eval`]) turns the value found into a key: a string is its
/// contents, any other value its compact JSON (`42`, `true`, `{"a":1,"b":2}`, object
/// fields sorted by name, so field order in the input does not matter). A path that does
/// not exist (missing field, index past the end, a field of a non-object, input that is
/// not JSON) gives the key `null` — so do JSON `null` and the string `"null"`: runs
/// without the field share one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyExpr {
    source: String,
    path: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Field(String),
    Index(usize),
}

impl KeyExpr {
    pub fn parse(source: &str) -> Result<KeyExpr, String> {
        let bad = |why: String| {
            Err(format!(
                "invalid key expression {source:?}: {why} (expected a path into the input such as input.customer.id or input.items[0].sku)"
            ))
        };
        if source.len() > MAX_EXPR_LEN {
            return bad(format!("longer than {MAX_EXPR_LEN} characters"));
        }
        let Some(mut rest) = source.strip_prefix("input") else {
            return bad("it must start with `input`".into());
        };
        let mut path = Vec::new();
        while !rest.is_empty() {
            if path.len() == MAX_SEGMENTS {
                return bad(format!("more than {MAX_SEGMENTS} segments"));
            }
            if let Some(r) = rest.strip_prefix('.') {
                let end = r
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(r.len());
                let name = &r[..end];
                match name.chars().next() {
                    Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
                    Some(_) => {
                        return bad(format!(
                            "field name {name:?} must start with a letter or '_' (use input[\"{name}\"] or an index [n])"
                        ));
                    }
                    None => return bad("a '.' must be followed by a field name".into()),
                }
                path.push(Segment::Field(name.to_owned()));
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix('[') {
                if r.starts_with('"') {
                    // A JSON string literal: find its closing quote, honouring escapes.
                    let mut escaped = false;
                    let mut close = None;
                    for (i, c) in r.char_indices().skip(1) {
                        match c {
                            _ if escaped => escaped = false,
                            '\\' => escaped = true,
                            '"' => {
                                close = Some(i);
                                break;
                            }
                            _ => {}
                        }
                    }
                    let Some(close) = close else {
                        return bad("unterminated string in [\"...\"]".into());
                    };
                    let name: String = match serde_json::from_str(&r[..=close]) {
                        Ok(n) => n,
                        Err(e) => return bad(format!("bad string in [\"...\"]: {e}")),
                    };
                    let Some(after) = r[close + 1..].strip_prefix(']') else {
                        return bad("expected ']' after the string".into());
                    };
                    path.push(Segment::Field(name));
                    rest = after;
                } else {
                    let end = r.find(']').unwrap_or(r.len());
                    let digits = &r[..end];
                    if end == r.len() {
                        return bad("missing ']'".into());
                    }
                    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                        return bad(format!(
                            "[{digits}] must hold an index (digits) or a quoted field name"
                        ));
                    }
                    let Ok(i) = digits.parse() else {
                        return bad(format!("index {digits} is too large"));
                    };
                    path.push(Segment::Index(i));
                    rest = &r[end + 1..];
                }
            } else {
                return bad(format!(
                    "unexpected {:?}: segments are .name, [n] or [\"name\"]",
                    rest.chars().next().unwrap_or(' ')
                ));
            }
        }
        Ok(KeyExpr {
            source: source.to_owned(),
            path,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The key of `input` (see the type's docs).
    pub fn eval(&self, input: &serde_json::Value) -> String {
        let found = self.path.iter().try_fold(input, |v, seg| match seg {
            Segment::Field(name) => v.as_object().and_then(|o| o.get(name)),
            Segment::Index(i) => v.as_array().and_then(|a| a.get(*i)),
        });
        match found {
            None | Some(serde_json::Value::Null) => "null".to_owned(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }
    }
}

impl std::fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

impl TryFrom<String> for KeyExpr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        KeyExpr::parse(&s)
    }
}

impl From<KeyExpr> for String {
    fn from(k: KeyExpr) -> String {
        k.source
    }
}

impl std::str::FromStr for KeyExpr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyExpr::parse(s)
    }
}

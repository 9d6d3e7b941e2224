//! Flow control: which runs of a function may start, and when.
//!
//! A function's [`FlowControl`] (part of its settings, pinned on every run like the rest)
//! holds up to four limits, each optionally *keyed* by a [`KeyExpr`] evaluated against the
//! run's input, and a priority:
//!
//! - **concurrency**: at most `limit` runs with the same key execute at once; the others
//!   stay queued and start as slots free up.
//! - **throttle**: at most `limit` runs with the same key *start* per `period_ms` (a sliding
//!   window); the others stay queued and start when the window allows. Only first starts
//!   count: retries and resumes after a sleep or wait are not throttled.
//! - **rate limit**: at most `limit` runs with the same key are *accepted* per `period_ms`;
//!   the others are recorded at once as [`crate::RunStatus::Skipped`]
//!   ([`crate::ErrorReason::RateLimited`]) and never run.
//! - **debounce**: a run waits `period_ms`; another run with the same key created meanwhile
//!   replaces it (the replaced run ends as skipped, [`crate::ErrorReason::Debounced`], its
//!   error naming its successor) and waits `period_ms` itself, so a burst starts only its
//!   last run, with its input.
//! - **priority**: lower starts first. Runs are ordered by *rank* = the time they became
//!   due + `priority × priority_aging_ms`, so a run waiting long enough overtakes runs of
//!   a better priority that arrived later: nothing starves. Ties keep creation order.
//!
//! Keys are evaluated once, in Rust, when the run is created ([`FlowControl::plan`]); the
//! stores keep the computed [`Gate`]s on the run and never parse JSON.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

mod key;

pub use key::KeyExpr;
use key::bounded_key;

/// Priorities a function or run may ask for.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;
/// The default aging step: one priority level is worth one minute of waiting.
pub const DEFAULT_PRIORITY_AGING_MS: u64 = 60_000;
/// Limits of concurrency, throttle and rate limit.
pub const FLOW_LIMIT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Periods of throttle, rate limit and debounce: 1 ms to 7 days.
pub const FLOW_PERIOD_RANGE: std::ops::RangeInclusive<u64> = 1..=7 * 24 * 3600 * 1000;
/// Computed keys longer than this are replaced by a hash of themselves.
pub const MAX_KEY_BYTES: usize = 200;
const MAX_EXPR_LEN: usize = 256;
const MAX_SEGMENTS: usize = 16;

/// A function's flow control; every part is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FlowControl {
    pub concurrency: Option<ConcurrencyLimit>,
    pub throttle: Option<RateLimit>,
    pub rate_limit: Option<RateLimit>,
    pub debounce: Option<Debounce>,
    /// Lower starts first; a run may override it.
    pub priority: i32,
    /// What one priority level is worth in waiting time (see the module docs).
    pub priority_aging_ms: u64,
}

impl Default for FlowControl {
    fn default() -> Self {
        FlowControl {
            concurrency: None,
            throttle: None,
            rate_limit: None,
            debounce: None,
            priority: 0,
            priority_aging_ms: DEFAULT_PRIORITY_AGING_MS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConcurrencyLimit {
    pub limit: u32,
    /// `None`: one limit for the whole function.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub key: Option<KeyExpr>,
}

/// `limit` per `period_ms`, per key: a throttle or a rate limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RateLimit {
    pub limit: u32,
    pub period_ms: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub key: Option<KeyExpr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Debounce {
    pub period_ms: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub key: Option<KeyExpr>,
}

/// The keys a run was created with (evaluated key expressions, over [`MAX_KEY_BYTES`]
/// replaced by their hash as in [`Gate::id`]), for display.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FlowKeys {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debounce: Option<String>,
}

impl FlowKeys {
    pub fn is_empty(&self) -> bool {
        *self == FlowKeys::default()
    }
}

/// One limit as it applies to one run: the limit's identity within the tenant (kind,
/// function and key), and its numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// `<kind>:<function>` or `<kind>:<function>:<key>`, kind one of `c` (concurrency), `t`
    /// (throttle), `r` (rate limit), `d` (debounce). Function names hold no `:`, so two
    /// functions never share a gate.
    pub id: String,
    /// Runs at once (concurrency) or per period (throttle, rate limit); 0 for debounce.
    pub limit: u32,
    /// 0 for concurrency.
    pub period_ms: u64,
}

impl Gate {
    /// Whether a concurrency gate with `running` runs holding it lets no other run start.
    pub fn is_full(&self, running: u64) -> bool {
        running >= u64::from(self.limit)
    }

    /// When a window gate (throttle, rate limit) opens again, given its `limit`-th newest
    /// entry (`None`: it has fewer): `None` while it is open now. The entry leaves the
    /// window `period_ms` after it was made, and the gate opens with it.
    pub fn closed_until(&self, limit_th_newest: Option<Millis>, now: Millis) -> Option<Millis> {
        let opens = limit_th_newest? + self.period_ms as Millis;
        (opens > now).then_some(opens)
    }

    /// Entries older than this have left the window at `now` and may be forgotten.
    pub fn window_start(&self, now: Millis) -> Millis {
        now - self.period_ms as Millis
    }
}

/// What the store applies when it creates a run: [`FlowControl`] evaluated for its input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowPlan {
    pub priority: i32,
    /// `priority × priority_aging_ms`: added to the due time to rank the run.
    pub rank_offset: i64,
    pub concurrency: Option<Gate>,
    pub throttle: Option<Gate>,
    pub rate_limit: Option<Gate>,
    pub debounce: Option<Gate>,
    pub keys: FlowKeys,
}

impl FlowControl {
    /// True when nothing but the default priority is set.
    pub fn is_default(&self) -> bool {
        *self == FlowControl::default()
    }

    /// Evaluates the keys against `input` (JSON; anything else has every key `null`) and
    /// picks the priority (`priority` overrides the function's).
    pub fn plan(&self, function: &str, input: &[u8], priority: Option<i32>) -> FlowPlan {
        let input: serde_json::Value =
            serde_json::from_slice(input).unwrap_or(serde_json::Value::Null);
        let priority = priority.unwrap_or(self.priority);
        let mut keys = FlowKeys::default();
        let gate = |kind: &str, key: Option<&KeyExpr>, limit, period_ms| {
            // The shown key is the one the gate uses: bounded too, or a 2 MiB input field
            // would be copied onto the run record and into its rate-limit error.
            let value = key.map(|k| bounded_key(&k.eval(&input)));
            let id = match &value {
                None => format!("{kind}:{function}"),
                Some(v) => format!("{kind}:{function}:{v}"),
            };
            (
                Gate {
                    id,
                    limit,
                    period_ms,
                },
                value,
            )
        };
        let concurrency = self.concurrency.as_ref().map(|c| {
            let (g, v) = gate("c", c.key.as_ref(), c.limit, 0);
            keys.concurrency = v;
            g
        });
        let throttle = self.throttle.as_ref().map(|t| {
            let (g, v) = gate("t", t.key.as_ref(), t.limit, t.period_ms);
            keys.throttle = v;
            g
        });
        let rate_limit = self.rate_limit.as_ref().map(|r| {
            let (g, v) = gate("r", r.key.as_ref(), r.limit, r.period_ms);
            keys.rate_limit = v;
            g
        });
        let debounce = self.debounce.as_ref().map(|d| {
            let (g, v) = gate("d", d.key.as_ref(), 0, d.period_ms);
            keys.debounce = v;
            g
        });
        FlowPlan {
            priority,
            rank_offset: i64::from(priority).saturating_mul(self.priority_aging_ms as i64),
            concurrency,
            throttle,
            rate_limit,
            debounce,
            keys,
        }
    }

    /// Checks the numbers (key expressions are checked when parsed).
    pub fn validate(&self) -> Result<(), String> {
        let limit = |what: &str, n: u32| {
            if FLOW_LIMIT_RANGE.contains(&n) {
                Ok(())
            } else {
                Err(format!(
                    "{what} limit must be between {} and {}, got {n}",
                    FLOW_LIMIT_RANGE.start(),
                    FLOW_LIMIT_RANGE.end()
                ))
            }
        };
        let period = |what: &str, ms: u64| {
            if FLOW_PERIOD_RANGE.contains(&ms) {
                Ok(())
            } else {
                Err(format!(
                    "{what} period must be between 1ms and 7 days, got {ms} ms"
                ))
            }
        };
        if let Some(c) = &self.concurrency {
            limit("concurrency", c.limit)?;
        }
        if let Some(t) = &self.throttle {
            limit("throttle", t.limit)?;
            period("throttle", t.period_ms)?;
        }
        if let Some(r) = &self.rate_limit {
            limit("rate_limit", r.limit)?;
            period("rate_limit", r.period_ms)?;
        }
        if let Some(d) = &self.debounce {
            period("debounce", d.period_ms)?;
        }
        check_priority(self.priority)?;
        if !(1..=24 * 3600 * 1000).contains(&self.priority_aging_ms) {
            return Err(format!(
                "priority_aging must be between 1ms and 24h, got {} ms",
                self.priority_aging_ms
            ));
        }
        Ok(())
    }
}

pub fn check_priority(p: i32) -> Result<(), String> {
    if PRIORITY_RANGE.contains(&p) {
        Ok(())
    } else {
        Err(format!(
            "priority must be between {} and {}, got {p}",
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(expr: &str, input: serde_json::Value) -> String {
        KeyExpr::parse(expr).unwrap().eval(&input)
    }

    #[test]
    fn paths_evaluate_to_keys() {
        let input = json!({
            "customer": {"id": 42, "name": "Ada"},
            "items": [{"sku": "A-1"}, {"sku": "B-2"}],
            "user name": "x",
            "flag": true,
            "none": null,
            "obj": {"b": 1, "a": [1, 2]},
        });
        assert_eq!(key("input.customer.id", input.clone()), "42");
        assert_eq!(key("input.customer.name", input.clone()), "Ada");
        assert_eq!(key("input.items[0].sku", input.clone()), "A-1");
        assert_eq!(key("input.items[1].sku", input.clone()), "B-2");
        assert_eq!(key("input[\"user name\"]", input.clone()), "x");
        assert_eq!(key("input[\"customer\"][\"id\"]", input.clone()), "42");
        assert_eq!(key("input.flag", input.clone()), "true");
        assert_eq!(
            key("input.obj", input.clone()),
            r#"{"a":[1,2],"b":1}"#,
            "fields sorted"
        );
        assert_eq!(key("input.items[0]", input.clone()), r#"{"sku":"A-1"}"#);
    }

    #[test]
    fn missing_paths_are_null() {
        let input = json!({"customer": {"id": 42}, "items": [], "s": "text"});
        for expr in [
            "input.nope",
            "input.customer.nope.deeper",
            "input.items[0].sku",
            "input.customer[0]",
            "input.s.len",
            "input.none",
        ] {
            assert_eq!(key(expr, input.clone()), "null", "{expr}");
        }
        let k = KeyExpr::parse("input.a").unwrap();
        assert_eq!(k.eval(&serde_json::Value::Null), "null");
        assert_eq!(key("input", json!("whole")), "whole");
    }

    #[test]
    fn bad_expressions_are_rejected_with_a_reason() {
        for (expr, why) in [
            ("", "start with `input`"),
            ("customer.id", "start with `input`"),
            ("input.", "followed by a field name"),
            ("input..a", "followed by a field name"),
            ("input.1a", "must start with a letter"),
            ("input[x]", "index (digits)"),
            ("input[1", "missing ']'"),
            ("input[]", "index (digits)"),
            ("input[\"a]", "unterminated"),
            ("input[\"a\"", "expected ']'"),
            ("input.a b", "unexpected"),
            ("inputs.a", "unexpected"),
            ("input[99999999999999999999999]", "too large"),
        ] {
            let err = KeyExpr::parse(expr).unwrap_err();
            assert!(err.contains(why), "{expr:?}: {err}");
        }
        let long = format!("input{}", ".a".repeat(17));
        assert!(KeyExpr::parse(&long).unwrap_err().contains("segments"));
        let huge = format!("input.{}", "a".repeat(300));
        assert!(KeyExpr::parse(&huge).unwrap_err().contains("longer"));
    }

    #[test]
    fn expressions_round_trip_through_serde() {
        let k = KeyExpr::parse("input.items[0][\"a.b\"]").unwrap();
        let s = serde_json::to_string(&k).unwrap();
        assert_eq!(s, r#""input.items[0][\"a.b\"]""#);
        assert_eq!(serde_json::from_str::<KeyExpr>(&s).unwrap(), k);
        assert!(serde_json::from_str::<KeyExpr>(r#""nope""#).is_err());
    }

    #[test]
    fn plans_name_gates_by_function_and_key() {
        let flow = FlowControl {
            concurrency: Some(ConcurrencyLimit {
                limit: 2,
                key: Some(KeyExpr::parse("input.c").unwrap()),
            }),
            throttle: Some(RateLimit {
                limit: 5,
                period_ms: 1000,
                key: None,
            }),
            rate_limit: None,
            debounce: Some(Debounce {
                period_ms: 300,
                key: Some(KeyExpr::parse("input.missing").unwrap()),
            }),
            priority: 3,
            priority_aging_ms: 100,
        };
        let p = flow.plan("f", br#"{"c": "acme"}"#, None);
        assert_eq!(p.concurrency.as_ref().unwrap().id, "c:f:acme");
        assert_eq!(p.concurrency.as_ref().unwrap().limit, 2);
        assert_eq!(
            p.throttle,
            Some(Gate {
                id: "t:f".into(),
                limit: 5,
                period_ms: 1000
            })
        );
        assert_eq!(p.debounce.as_ref().unwrap().id, "d:f:null");
        assert_eq!(p.rate_limit, None);
        assert_eq!((p.priority, p.rank_offset), (3, 300));
        assert_eq!(p.keys.concurrency.as_deref(), Some("acme"));
        assert_eq!(p.keys.throttle, None);
        assert_eq!(p.keys.debounce.as_deref(), Some("null"));
        let p = flow.plan("f", b"not json", Some(-2));
        assert_eq!(p.concurrency.unwrap().id, "c:f:null");
        assert_eq!(p.rank_offset, -200);
        let long = format!(r#"{{"c": "{}"}}"#, "x".repeat(500));
        let long_plan = flow.plan("f", long.as_bytes(), None);
        let id = long_plan.concurrency.unwrap().id;
        assert!(id.starts_with("c:f:#") && id.len() == 4 + 17, "{id}");
        // Regression: the shown key (on the run, in errors) was the 500-byte value itself.
        assert_eq!(long_plan.keys.concurrency.as_deref(), Some(&id[4..]));
    }

    #[test]
    fn old_settings_without_flow_load_with_defaults() {
        let flow: FlowControl = serde_json::from_str("{}").unwrap();
        assert!(flow.is_default());
        assert_eq!(flow.priority_aging_ms, DEFAULT_PRIORITY_AGING_MS);
        assert!(flow.validate().is_ok());
        let bad = FlowControl {
            throttle: Some(RateLimit {
                limit: 0,
                period_ms: 1000,
                key: None,
            }),
            ..FlowControl::default()
        };
        assert!(bad.validate().unwrap_err().contains("throttle limit"));
        assert!(
            FlowControl {
                priority: 5000,
                ..FlowControl::default()
            }
            .validate()
            .is_err()
        );
    }
}

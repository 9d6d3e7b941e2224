//! The flow-control deploy parameters (`concurrency_limit`, `throttle=5/1s`, ...), parsed
//! and checked into [`FlowControl`]; see `wasq_core::flow` for what each one does.

use wasq_core::flow::{ConcurrencyLimit, Debounce, FlowControl, KeyExpr, RateLimit};

use crate::api::DeployParams;
use crate::error::ApiError;

fn bad(message: String) -> ApiError {
    ApiError::bad_request("bad_settings", message)
}

fn key(param: &str, expr: &Option<String>) -> Result<Option<KeyExpr>, ApiError> {
    expr.as_deref()
        .map(|e| KeyExpr::parse(e.trim()).map_err(|m| bad(format!("{param}: {m}"))))
        .transpose()
}

fn duration_ms(param: &str, text: &str) -> Result<u64, ApiError> {
    let d = wasq_core::duration::parse(text.trim()).map_err(|e| {
        bad(format!(
            "{param}: {text:?} is not a duration like 500ms, 1s or 2m: {e}"
        ))
    })?;
    Ok(d.as_millis().min(u128::from(u64::MAX)) as u64)
}

/// `N/DURATION`, e.g. `5/1s`: N runs per period.
fn rate(param: &str, text: &str, key: Option<KeyExpr>) -> Result<RateLimit, ApiError> {
    let Some((n, period)) = text.split_once('/') else {
        return Err(bad(format!(
            "{param} must be N/DURATION, like 5/1s (5 runs per second), got {text:?}"
        )));
    };
    let limit = n.trim().parse().map_err(|_| {
        bad(format!(
            "{param}: {n:?} is not a number of runs (in {text:?}, expected N/DURATION like 5/1s)"
        ))
    })?;
    Ok(RateLimit {
        limit,
        period_ms: duration_ms(param, period)?,
        key,
    })
}

/// A `*_key` parameter needs its limit.
fn needs(param: &str, key: &Option<String>, limit: &str, set: bool) -> Result<(), ApiError> {
    if key.is_some() && !set {
        return Err(bad(format!("{param} needs {limit}")));
    }
    Ok(())
}

impl DeployParams {
    /// The function's flow control from the parameters, checked.
    pub(crate) fn flow(&self) -> Result<FlowControl, ApiError> {
        needs(
            "concurrency_key",
            &self.concurrency_key,
            "concurrency_limit",
            self.concurrency_limit.is_some(),
        )?;
        needs(
            "throttle_key",
            &self.throttle_key,
            "throttle",
            self.throttle.is_some(),
        )?;
        needs(
            "rate_limit_key",
            &self.rate_limit_key,
            "rate_limit",
            self.rate_limit.is_some(),
        )?;
        needs(
            "debounce_key",
            &self.debounce_key,
            "debounce",
            self.debounce.is_some(),
        )?;
        let d = FlowControl::default();
        let flow = FlowControl {
            concurrency: self
                .concurrency_limit
                .map(|limit| {
                    Ok::<_, ApiError>(ConcurrencyLimit {
                        limit,
                        key: key("concurrency_key", &self.concurrency_key)?,
                    })
                })
                .transpose()?,
            throttle: self
                .throttle
                .as_deref()
                .map(|t| rate("throttle", t, key("throttle_key", &self.throttle_key)?))
                .transpose()?,
            rate_limit: self
                .rate_limit
                .as_deref()
                .map(|r| {
                    rate(
                        "rate_limit",
                        r,
                        key("rate_limit_key", &self.rate_limit_key)?,
                    )
                })
                .transpose()?,
            debounce: self
                .debounce
                .as_deref()
                .map(|p| {
                    Ok::<_, ApiError>(Debounce {
                        period_ms: duration_ms("debounce", p)?,
                        key: key("debounce_key", &self.debounce_key)?,
                    })
                })
                .transpose()?,
            priority: self.priority.unwrap_or(d.priority),
            priority_aging_ms: self
                .priority_aging
                .as_deref()
                .map(|a| duration_ms("priority_aging", a))
                .transpose()?
                .unwrap_or(d.priority_aging_ms),
        };
        flow.validate().map_err(bad)?;
        Ok(flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(query: &str) -> Result<FlowControl, String> {
        let uri: axum::http::Uri = format!("/f?{query}").parse().unwrap();
        let axum::extract::Query(p) =
            axum::extract::Query::<DeployParams>::try_from_uri(&uri).map_err(|e| e.to_string())?;
        p.flow().map_err(|e| e.message)
    }

    #[test]
    fn parameters_parse_into_flow_control() {
        let f = params(
            "concurrency_limit=2&concurrency_key=input.customer.id&throttle=5/1s&throttle_key=input.a\
             &rate_limit=10/1m&debounce=500ms&debounce_key=input.items[0].sku&priority=-3\
             &priority_aging=50ms",
        )
        .unwrap();
        let c = f.concurrency.unwrap();
        assert_eq!((c.limit, c.key.unwrap().as_str()), (2, "input.customer.id"));
        let t = f.throttle.unwrap();
        assert_eq!((t.limit, t.period_ms), (5, 1000));
        let r = f.rate_limit.unwrap();
        assert_eq!((r.limit, r.period_ms, r.key), (10, 60_000, None));
        assert_eq!(f.debounce.unwrap().period_ms, 500);
        assert_eq!((f.priority, f.priority_aging_ms), (-3, 50));
        assert!(params("").unwrap().is_default());
    }

    #[test]
    fn bad_parameters_say_what_is_wrong() {
        for (query, want) in [
            ("throttle=5", "N/DURATION"),
            ("throttle=x/1s", "not a number"),
            ("throttle=5/soon", "not a duration"),
            ("throttle=0/1s", "throttle limit"),
            ("rate_limit=5/0s", "rate_limit period"),
            ("throttle_key=input.a", "throttle_key needs throttle"),
            (
                "concurrency_limit=1&concurrency_key=customer",
                "start with `input`",
            ),
            ("concurrency_limit=0", "concurrency limit"),
            ("debounce=1s&debounce_key=input.", "debounce_key"),
            ("priority=5000", "priority must be between"),
            ("priority_aging=0ms", "priority_aging"),
            // humantime 2.4 panics on these (see wasq_core::duration): a dropped
            // connection instead of a 400.
            (
                "debounce=18446744073709551615s%201000000000ns",
                "not a duration",
            ),
            (
                "throttle=1/18446744073709551615s%20999999999ns%201ns",
                "not a duration",
            ),
        ] {
            let err = params(query).unwrap_err();
            assert!(err.contains(want), "{query}: {err}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn cases(default: u32) -> ProptestConfig {
            let mut config = ProptestConfig::default();
            if std::env::var_os("PROPTEST_CASES").is_none() {
                config.cases = default;
            }
            config
        }

        /// Every byte percent-encoded, so any text reaches the parser as it is.
        fn enc(text: &str) -> String {
            text.bytes().map(|b| format!("%{b:02X}")).collect()
        }

        const UNITS: &[(&str, u64)] = &[
            ("ms", 1),
            ("s", 1000),
            ("m", 60_000),
            ("h", 3_600_000),
            ("d", 86_400_000),
        ];

        fn period() -> impl Strategy<Value = (String, u64)> {
            (0u64..20_000, prop::sample::select(UNITS.to_vec()))
                .prop_map(|(n, (unit, ms))| (format!("{n}{unit}"), n * ms))
        }

        /// Text like the values these parameters take, and some that is nothing like it.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                r"[0-9]{0,6}/[0-9]{0,20} ?[a-zµ]{0,3}",
                r"[0-9 ]{0,20}[a-z]{0,3}( [0-9]{1,20}[a-z]{0,2}){0,2}",
                r#"input[\.\[\]"a-z0-9]{0,12}"#,
                ".{0,16}",
            ]
        }

        proptest! {
            #![proptest_config(cases(2000))]

            /// `N/DURATION` gives N per the duration computed here, within the documented
            /// ranges, else a 400 naming the parameter.
            #[test]
            fn rates_parse_to_limit_and_period(
                n in prop_oneof![0u32..20_000, any::<u32>()],
                (text, ms) in period(),
                which in prop::sample::select(vec!["throttle", "rate_limit"]),
                space in prop::sample::select(vec!["", " "]),
            ) {
                let query = format!("{which}={}", enc(&format!("{n}{space}/{space}{text}")));
                let got = params(&query);
                let ok = (1..=10_000).contains(&n) && (1..=7 * 86_400_000).contains(&ms);
                if ok {
                    let flow = got.unwrap();
                    let rate = if which == "throttle" { flow.throttle } else { flow.rate_limit };
                    let rate = rate.unwrap();
                    prop_assert_eq!((rate.limit, rate.period_ms), (n, ms));
                } else {
                    let err = got.unwrap_err();
                    prop_assert!(err.contains(which), "{}: {}", query, err);
                }
            }

            /// Debounce and priority aging: the duration computed here, or a 400.
            #[test]
            fn periods_parse_to_milliseconds((text, ms) in period()) {
                let got = params(&format!("debounce={}", enc(&text)));
                match got {
                    Ok(f) => prop_assert_eq!(f.debounce.unwrap().period_ms, ms),
                    Err(e) => prop_assert!(ms == 0 || ms > 7 * 86_400_000, "{}: {}", text, e),
                }
                let got = params(&format!("priority_aging={}", enc(&text)));
                match got {
                    Ok(f) => prop_assert_eq!(f.priority_aging_ms, ms),
                    Err(e) => prop_assert!(ms == 0 || ms > 86_400_000, "{}: {}", text, e),
                }
            }

            /// Any values for every flow parameter: a checked FlowControl or a sentence,
            /// never a panic.
            #[test]
            fn any_flow_parameters_are_settings_or_an_error(
                values in prop::collection::vec(
                    (prop::sample::select(vec![
                        "concurrency_limit", "concurrency_key", "throttle", "throttle_key",
                        "rate_limit", "rate_limit_key", "debounce", "debounce_key",
                        "priority", "priority_aging",
                    ]), value()),
                    0..6,
                ),
            ) {
                let query: Vec<String> =
                    values.iter().map(|(k, v)| format!("{k}={}", enc(v))).collect();
                match params(&query.join("&")) {
                    Ok(flow) => prop_assert!(flow.validate().is_ok()),
                    Err(e) => prop_assert!(!e.is_empty()),
                }
            }
        }
    }
}

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
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
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
        ] {
            let err = params(query).unwrap_err();
            assert!(err.contains(want), "{query}: {err}");
        }
    }
}

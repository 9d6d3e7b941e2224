//! `wasq deploy` flow-control flags, and how `wasq functions show` prints them back.

use clap::Args;
use serde_json::Value;

/// Flow control of a function; the server checks the values (README, "Flow control").
#[derive(Debug, Args)]
pub(crate) struct FlowArgs {
    /// At most N runs executing at once (per --concurrency-key when given); the rest wait.
    #[arg(long, value_name = "N")]
    concurrency_limit: Option<u32>,
    /// Splits the concurrency limit by a key from the input, e.g. input.customer.id.
    #[arg(long, value_name = "EXPR")]
    concurrency_key: Option<String>,
    /// At most N runs start per period, the rest wait: N/DURATION, e.g. 5/1s.
    #[arg(long, value_name = "N/DURATION")]
    throttle: Option<String>,
    /// Splits the throttle by a key from the input.
    #[arg(long, value_name = "EXPR")]
    throttle_key: Option<String>,
    /// At most N runs accepted per period, the rest are recorded as skipped: N/DURATION.
    #[arg(long, value_name = "N/DURATION")]
    rate_limit: Option<String>,
    /// Splits the rate limit by a key from the input.
    #[arg(long, value_name = "EXPR")]
    rate_limit_key: Option<String>,
    /// Runs wait this long; a later run with the same key replaces them (only the last
    /// of a burst starts, with its input), e.g. 1s.
    #[arg(long, value_name = "DURATION")]
    debounce: Option<String>,
    /// Splits the debounce by a key from the input.
    #[arg(long, value_name = "EXPR")]
    debounce_key: Option<String>,
    /// Lower starts first (-1000 to 1000, default 0).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// What one priority level is worth in waiting time, so low priorities never starve
    /// (default 1m).
    #[arg(long, value_name = "DURATION")]
    priority_aging: Option<String>,
}

impl FlowArgs {
    /// Takes every setting the command line left out from a manifest's `[deploy]`.
    pub(crate) fn fill_from(&mut self, m: &crate::manifest::DeploySettings) {
        let text = |flag: &mut Option<String>, from: &Option<String>| {
            if flag.is_none() {
                flag.clone_from(from);
            }
        };
        text(&mut self.concurrency_key, &m.concurrency_key);
        text(&mut self.throttle, &m.throttle);
        text(&mut self.throttle_key, &m.throttle_key);
        text(&mut self.rate_limit, &m.rate_limit);
        text(&mut self.rate_limit_key, &m.rate_limit_key);
        text(&mut self.debounce, &m.debounce);
        text(&mut self.debounce_key, &m.debounce_key);
        text(&mut self.priority_aging, &m.priority_aging);
        self.concurrency_limit = self.concurrency_limit.or(m.concurrency_limit);
        self.priority = self.priority.or(m.priority);
    }

    /// The deploy query parameters.
    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        let mut add = |name, v: &Option<String>| q.extend(v.clone().map(|v| (name, v)));
        add("concurrency_key", &self.concurrency_key);
        add("throttle", &self.throttle);
        add("throttle_key", &self.throttle_key);
        add("rate_limit", &self.rate_limit);
        add("rate_limit_key", &self.rate_limit_key);
        add("debounce", &self.debounce);
        add("debounce_key", &self.debounce_key);
        add("priority_aging", &self.priority_aging);
        q.extend(
            self.concurrency_limit
                .map(|n| ("concurrency_limit", n.to_string())),
        );
        q.extend(self.priority.map(|n| ("priority", n.to_string())));
        q
    }
}

fn per_key(limit: &Value) -> String {
    match limit["key"].as_str() {
        Some(k) => format!(" per {k}"),
        None => String::new(),
    }
}

fn period(ms: &Value) -> String {
    let ms = ms.as_u64().unwrap_or(0);
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// One line per flow-control setting of a function's `settings`, for `functions show`.
pub(crate) fn describe(settings: &Value) -> Vec<String> {
    let f = &settings["flow"];
    let mut out = Vec::new();
    if f["concurrency"].is_object() {
        let c = &f["concurrency"];
        out.push(format!(
            "concurrency: at most {} running{}",
            c["limit"],
            per_key(c)
        ));
    }
    if f["throttle"].is_object() {
        let t = &f["throttle"];
        out.push(format!(
            "throttle: {} starts per {}{} (the rest wait)",
            t["limit"],
            period(&t["period_ms"]),
            per_key(t)
        ));
    }
    if f["rate_limit"].is_object() {
        let r = &f["rate_limit"];
        out.push(format!(
            "rate limit: {} runs per {}{} (the rest are skipped)",
            r["limit"],
            period(&r["period_ms"]),
            per_key(r)
        ));
    }
    if f["debounce"].is_object() {
        let d = &f["debounce"];
        out.push(format!(
            "debounce: {}{} (only the last run of a burst starts)",
            period(&d["period_ms"]),
            per_key(d)
        ));
    }
    let priority = f["priority"].as_i64().unwrap_or(0);
    let aging = f["priority_aging_ms"].as_u64().unwrap_or(60_000);
    out.push(format!(
        "priority: {priority} (lower first; one level = {} of waiting)",
        period(&Value::from(aging))
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_back_in_words() {
        let s = serde_json::json!({"flow": {
            "concurrency": {"limit": 2, "key": "input.customer.id"},
            "throttle": {"limit": 5, "period_ms": 1000},
            "rate_limit": {"limit": 10, "period_ms": 60000, "key": "input.a"},
            "debounce": {"period_ms": 1500},
            "priority": -1,
            "priority_aging_ms": 50
        }});
        assert_eq!(
            describe(&s),
            [
                "concurrency: at most 2 running per input.customer.id",
                "throttle: 5 starts per 1s (the rest wait)",
                "rate limit: 10 runs per 1m per input.a (the rest are skipped)",
                "debounce: 1s 500ms (only the last run of a burst starts)",
                "priority: -1 (lower first; one level = 50ms of waiting)",
            ]
        );
        assert_eq!(
            describe(&serde_json::json!({})),
            ["priority: 0 (lower first; one level = 1m of waiting)"]
        );
    }
}

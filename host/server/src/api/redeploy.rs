//! What a redeploy keeps: deploying new code under an existing name keeps the function's
//! settings, events and schedule, except what the request gives (`reset_settings=true`
//! starts from the defaults instead); and what it changed, in words, for the answer.

use serde_json::Value;
use wasq_core::Function;

use super::DeployParams;

impl DeployParams {
    /// Whether any flow-control parameter is given: flow control is then replaced as a
    /// whole (its parts depend on each other: a key needs its limit).
    pub(super) fn has_flow(&self) -> bool {
        self.concurrency_limit.is_some()
            || self.concurrency_key.is_some()
            || self.throttle.is_some()
            || self.throttle_key.is_some()
            || self.rate_limit.is_some()
            || self.rate_limit_key.is_some()
            || self.debounce.is_some()
            || self.debounce_key.is_some()
            || self.priority.is_some()
            || self.priority_aging.is_some()
    }

    /// What this deploy starts from: the function's current settings, unless there is
    /// none or the request resets them.
    pub(super) fn base<'f>(&self, existing: Option<&'f Function>) -> Option<&'f Function> {
        existing.filter(|_| self.reset_settings != Some(true))
    }
}

/// `path: old -> new` for each setting, event list or schedule that differs (the component
/// itself too), in a stable order.
pub(super) fn changes(old: &Function, new: &Function) -> Vec<String> {
    let view = |f: &Function| {
        let mut schedule = serde_json::to_value(&f.schedule).unwrap_or(Value::Null);
        // Pausing and resuming are the schedule's state, not its settings.
        if let Some(s) = schedule.as_object_mut() {
            s.remove("paused");
            s.remove("resumed_at");
        }
        serde_json::json!({
            "component": format!("sha256:{}", f.digest.get(..12).unwrap_or_default()),
            "settings": f.settings,
            "events": f.events,
            "schedule": schedule,
        })
    };
    let mut out = vec![];
    diff("", &view(old), &view(new), &mut out);
    out
}

fn diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff(
                    &p,
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if old != new => out.push(format!("{path}: {old} -> {new}")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_differences_are_named_by_path() {
        let mut out = vec![];
        diff(
            "",
            &json!({"a": {"b": 1, "c": [1]}, "d": null}),
            &json!({"a": {"b": 2, "c": [1]}, "d": "x"}),
            &mut out,
        );
        assert_eq!(out, vec!["a.b: 1 -> 2", "d: null -> \"x\""]);
    }
}

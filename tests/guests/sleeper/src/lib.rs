//! Durable sleep: input `{"sleep_ms": N}`. Step "before", a sleep of N ms, step "after".
//! Proves a long sleep frees the worker (the run is replayed when due) and that the
//! wake-up time survives replays and host restarts. Output: the attempt each step body
//! ran in and the Unix ms times around the sleep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, context, info, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    sleep_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn sleeper(input: Input) -> Result<Value, Error> {
    let before: Value = step::run("before", || {
        info!("before the sleep");
        Ok(json!({ "attempt": context::info().attempt, "at": now_ms() }))
    })?;
    step::sleep("nap", Duration::from_millis(input.sleep_ms));
    let after: Value = step::run("after", || {
        info!("after the sleep");
        Ok(json!({ "attempt": context::info().attempt, "at": now_ms() }))
    })?;
    Ok(json!({ "before": before, "after": after }))
}

wasq_guest::task!(sleeper);

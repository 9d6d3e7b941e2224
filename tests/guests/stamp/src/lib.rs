//! The latency benchmark's run: returns how late it started, in microseconds, against the
//! time the producer meant it to start (`{"t": <epoch µs>}` in its input: the intended
//! send time, or the due time of a delayed run), and the time it started (`at_us`, epoch
//! µs: a cron tick's run has no `t`, and the benchmark compares `at_us` with the tick's
//! `scheduled_at`). Reading the wall clock first thing, inside the sandbox, counts
//! everything a user waits for: the create, the wake-up, the claim and the instantiation.

use std::time::{SystemTime, UNIX_EPOCH};

use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::Error;

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    /// When the run was meant to start, in microseconds since the Unix epoch.
    t: Option<i64>,
}

fn stamp(input: Input) -> Result<Value, Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    Ok(match input.t {
        Some(t) => json!({ "late_us": now - t, "at_us": now }),
        None => json!({ "at_us": now }),
    })
}

wasq_guest::task!(stamp);

//! wait-for-event: input `{"event": "order.paid", "filter": {...} | null, "timeout_ms": N}`
//! (0 = forever). Suspends until a matching event or the timeout; output
//! `{"got": <event data> | null}`. Logs "waiting" outside steps, so replays are visible.

use std::time::Duration;
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, info};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    event: String,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    timeout_ms: u64,
}

fn waiter(input: Input) -> Result<Value, Error> {
    info!("waiting for {}", input.event);
    let timeout = (input.timeout_ms > 0).then(|| Duration::from_millis(input.timeout_ms));
    let got: Option<Value> = events::wait_for("wait", &input.event, input.filter, timeout)?;
    Ok(json!({ "got": got }))
}

wasq_guest::task!(waiter);

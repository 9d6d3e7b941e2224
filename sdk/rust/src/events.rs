//! Events: wait for one (the run suspends without holding a worker), or send one.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::bindings::wasq::task::step as wit;

/// Suspends the run until an event named `event` whose data matches `filter` is sent, and
/// returns its data parsed as `T`; `Ok(None)` when `timeout` passes first (`None` waits
/// forever).
///
/// `name` makes the wait a durable step: on replay the same result comes back at once.
/// `filter` is a JSON object of dotted paths into the event's data and the values they
/// must equal: `json!({"user_id": 42})` matches `{"user_id": 42, "plan": "pro"}`. Only
/// events sent after the run started waiting count.
///
/// ```no_run
/// # use std::time::Duration;
/// # use wasq_guest::{events, serde_json::{json, Value}, Error};
/// # fn job() -> Result<(), Error> {
/// let activated: Option<Value> = events::wait_for(
///     "wait-activation", "user.activated", Some(json!({"user_id": 42})), Some(Duration::from_secs(86400)),
/// )?;
/// # Ok(()) }
/// ```
pub fn wait_for<T: DeserializeOwned>(
    name: &str,
    event: &str,
    filter: Option<serde_json::Value>,
    timeout: Option<Duration>,
) -> Result<Option<T>, Error> {
    let filter = filter.map(|f| f.to_string());
    let millis = timeout.map_or(0, |t| {
        u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
    });
    match wit::wait_for_event(name, event, filter.as_deref(), millis) {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::fatal(format!(
                "event {event:?} data does not fit the expected type: {e}"
            ))
        }),
    }
}

/// Sends event `event` with `data`, exactly once per run however often it is replayed:
/// it starts the functions subscribed to `event` and resumes runs waiting for it.
pub fn send<T: Serialize>(name: &str, event: &str, data: &T) -> Result<(), Error> {
    let data = serde_json::to_vec(data).map_err(|e| Error::fatal(format!("event data: {e}")))?;
    wit::send_event(name, event, &data);
    Ok(())
}

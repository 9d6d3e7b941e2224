//! Durable steps: work that runs once per run, however many attempts the run takes.
//!
//! The host stores a step's output before [`run`] returns it. On every later attempt (after a
//! retryable error, a trap, or a host restart) the same step returns that stored output and
//! its body is skipped. Code *outside* steps re-runs on every attempt and must be
//! deterministic: begin the same steps, in the same order, each time.
//!
//! The guarantee, precisely:
//! - a **completed** step's body never runs again: not on a retry, a resume, or after its
//!   worker crashed or was paused (a worker that wakes up past its lease starts nothing);
//! - a body that was **running** when its worker died, was paused past its lease or lost
//!   its store, may run again in a later attempt (at least once, like Temporal
//!   activities), because its output was never stored. Make side effects inside a step
//!   idempotent: send [`idempotency_key`] (the same on every run of the same step of the
//!   same run) to APIs that deduplicate by it, e.g. with
//!   [`Request::idempotent`](crate::http::Request::idempotent).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::Error;
use crate::bindings::wasq::task::step as wit;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Runs `body` as the durable step `name`, or returns its output stored by an earlier attempt.
///
/// 1. Asks the host whether step `name` already completed in this run.
/// 2. If it did, parses the stored JSON as `T` and returns it **without calling `body`**.
/// 3. Otherwise calls `body`. On `Ok(value)` it stores `value` as JSON, then returns it.
///    On `Err(error)` it returns the error and stores nothing, so the next attempt runs
///    `body` again.
///
/// Names may repeat: the host matches steps by name and by how many times that name was
/// begun earlier in the attempt (the second `run("fetch", ..)` is the second "fetch" step).
///
/// A stored output that no longer parses as `T` (the job's code changed between attempts)
/// and a value that cannot be serialised are fatal errors.
///
/// ```no_run
/// # use wasq_guest::{step, Error};
/// # fn fetch_user(id: u64) -> Result<String, Error> { Ok(format!("user {id}")) }
/// # fn job(id: u64) -> Result<(), Error> {
/// let user: String = step::run("load-user", || fetch_user(id))?;
/// # Ok(()) }
/// ```
pub fn run<T, F>(name: &str, body: F) -> Result<T, Error>
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> Result<T, Error>,
{
    // Counted like the host counts them: the n-th step of this name in the attempt.
    let occurrence = BEGUN.with_borrow_mut(|begun| {
        let n = begun.entry(name.to_owned()).or_insert(0);
        *n += 1;
        *n - 1
    });
    if let Some(stored) = wit::begin(name) {
        return serde_json::from_slice(&stored).map_err(|e| {
            Error::fatal(format!(
                "step {name:?}: stored output does not fit the step's type: {e}"
            ))
        });
    }
    let key = format!(
        "wasq-{}-{name}-{occurrence}",
        crate::bindings::wasq::task::context::info().run_id
    );
    let outer = CURRENT.replace(Some(key));
    let value = body();
    CURRENT.set(outer);
    let value = value?;
    let output = serde_json::to_vec(&value)
        .map_err(|e| Error::fatal(format!("step {name:?}: cannot serialise output: {e}")))?;
    wit::complete(name, &output);
    Ok(value)
}

thread_local! {
    /// Steps begun in this attempt, by name (each attempt is a fresh instance).
    static BEGUN: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
    /// The idempotency key of the step whose body is running.
    static CURRENT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Inside a step's body: a key naming this step of this run, the same every time the
/// body runs (`wasq-RUN-NAME-N`), so an API that deduplicates requests by a key (Stripe's
/// `Idempotency-Key`, a database's unique column) performs the effect once even when the
/// body runs twice (see the module docs). `None` outside a step body.
///
/// ```no_run
/// # use wasq_guest::{http, step, Error};
/// # fn job() -> Result<(), Error> {
/// step::run("charge", || {
///     let key = step::idempotency_key().expect("inside a step");
///     http::Request::post("https://api.example.com/charges", r#"{"cents": 500}"#)
///         .header("idempotency-key", key)
///         .send()?;
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub fn idempotency_key() -> Option<String> {
    CURRENT.with_borrow(Clone::clone)
}

/// Durable sleep: pauses the run for `duration`, counted from the first time the run
/// reaches this sleep.
///
/// The wake-up time is stored like a step output, so a retry or a host restart neither
/// restarts nor skips the sleep. Short remaining waits (up to about a second) are slept in
/// the attempt; longer ones end the attempt and free the worker: the run is `sleeping`
/// and is replayed from the start when due — completed steps return their stored output,
/// so only the code outside steps runs again.
///
/// ```no_run
/// # use std::time::Duration;
/// # fn job() {
/// wasq_guest::step::sleep("cool-down", Duration::from_secs(3600));
/// # }
/// ```
pub fn sleep(name: &str, duration: std::time::Duration) {
    wit::sleep(
        name,
        u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
    );
}

/// Durable sleep until a wall-clock time (`SystemTime`); see [`sleep`].
pub fn sleep_until(name: &str, until: std::time::SystemTime) {
    let ms = until
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    wit::sleep_until(name, ms);
}

//! Child runs: start other functions from a job, and wait for their results without
//! holding a worker.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::bindings::wasq::task::step as wit;

fn input_bytes<I: Serialize>(input: &I) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(input).map_err(|e| Error::fatal(format!("child input: {e}")))
}

fn output<O: DeserializeOwned>(
    function: &str,
    result: Result<Vec<u8>, String>,
) -> Result<O, Error> {
    match result {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            Error::fatal(format!(
                "output of {function} does not fit the expected type: {e}"
            ))
        }),
        // A child that failed for good is this run's failure; retrying it would not help.
        Err(message) => Err(Error::fatal(format!("{function} failed: {message}"))),
    }
}

/// Starts `function` with `input` as a child run and returns its run id, without
/// waiting. `name` makes the start durable: a replay returns the same id and starts
/// nothing. Collect the result later with [`join`].
pub fn invoke<I: Serialize>(name: &str, function: &str, input: &I) -> Result<String, Error> {
    Ok(wit::invoke(name, function, &input_bytes(input)?))
}

/// Starts `function` and suspends this run until it ends; returns its output. A child
/// that fails or is cancelled is a fatal error here.
pub fn call<I: Serialize, O: DeserializeOwned>(
    name: &str,
    function: &str,
    input: &I,
) -> Result<O, Error> {
    output(function, wit::call(name, function, &input_bytes(input)?))
}

/// Suspends until run `run_id` (from [`invoke`]) ends; returns its output. Invoke N
/// children first, then join each: they run in parallel.
pub fn join<O: DeserializeOwned>(name: &str, run_id: &str) -> Result<O, Error> {
    output(run_id, wit::join(name, run_id))
}

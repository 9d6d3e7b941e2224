//! Proves each error kind reaches the host as the matching WIT `run-error`: input
//! `{"kind": "fatal" | "retryable" | "retry_after", "message": "...", "after_ms": N}`
//! (`after_ms` only for "retry_after", default 1000) returns that error with that message.

use wasq_guest::Error;
use wasq_guest::serde::Deserialize;

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    kind: String,
    message: String,
    #[serde(default = "default_after_ms")]
    after_ms: u64,
}

fn default_after_ms() -> u64 {
    1000
}

fn fail(input: Input) -> Result<(), Error> {
    Err(match input.kind.as_str() {
        "fatal" => Error::fatal(input.message),
        "retryable" => Error::retryable(input.message),
        "retry_after" => Error::retry_after_ms(input.after_ms, input.message),
        other => Error::fatal(format!(
            "unknown kind {other:?}: expected \"fatal\", \"retryable\" or \"retry_after\""
        )),
    })
}

wasq_guest::task!(fail);

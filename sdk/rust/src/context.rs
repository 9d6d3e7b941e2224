//! Facts about the run the current attempt belongs to.

use crate::bindings::wasq::task::context as wit;
use serde::{Deserialize, Serialize};

/// The run this attempt belongs to, as returned by [`info`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The run's id.
    pub run_id: String,
    /// The name of the function (job) being run.
    pub function: String,
    /// The tenant that owns the run.
    pub tenant: String,
    /// This attempt's number: 1 for the first attempt.
    pub attempt: u32,
    /// The most attempts the retry policy allows.
    pub max_attempts: u32,
    /// What started the run: `"api"`, `"event:<name>"`, `"cron:<schedule>"` or
    /// `"child:<run-id>"`.
    pub trigger: String,
}

/// Returns the facts about the current run and attempt.
///
/// `attempt` differs between attempts: branching on it outside a step makes the job
/// non-deterministic. Read it inside a step body, or only for logging.
pub fn info() -> RunInfo {
    let wit::RunInfo {
        run_id,
        function,
        tenant,
        attempt,
        max_attempts,
        trigger,
    } = wit::info();
    RunInfo {
        run_id,
        function,
        tenant,
        attempt,
        max_attempts,
        trigger,
    }
}

/// How long this attempt has left before its wall-clock limit (the function's timeout)
/// stops it; zero once it has passed.
///
/// A job with a long loop checks it and, when little is left, stores what it has done in
/// a step and returns a retryable error: the next attempt replays that step and goes on
/// from there instead of starting over (Celery's soft time limit). Its value differs
/// between attempts: use it to decide when to checkpoint, not inside a step's result.
pub fn time_left() -> std::time::Duration {
    std::time::Duration::from_millis(wit::time_left())
}

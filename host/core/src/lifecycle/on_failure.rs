//! Failure handlers (`on_failure`, Inngest's `onFailure`, the dead-letter alert): a run
//! that ends failed or cancelled starts its function's handler once, with what went wrong.

use serde_json::json;

use crate::model::{RunStatus, bytes_as_json};
use crate::store::{EnqueueRequest, RunDetail};

/// The trigger of a handler run: `on_failure:<run id>`. Handler runs never start
/// handlers themselves, so a handler that fails (or is its own function's handler)
/// cannot start a chain.
pub const HANDLER_TRIGGER: &str = "on_failure:";

/// The run of the handler that `dead` starts, if any: `dead` ended failed or cancelled,
/// its function (as pinned when it was created) names a handler, and it is not a handler
/// run itself. The handler's input: the run's id, function, status, input and error, and
/// every attempt's error. It is `dead`'s child (so it is admitted like work already
/// accepted, and `runs list --parent` finds it), and its idempotency key holds it to once
/// per end: a run retried by hand and failing again starts the handler again.
pub fn failure_handler(dead: &RunDetail) -> Option<EnqueueRequest> {
    let run = &dead.run;
    if !matches!(run.status, RunStatus::Failed | RunStatus::Cancelled)
        || run.trigger.starts_with(HANDLER_TRIGGER)
    {
        return None;
    }
    let handler = run.settings.on_failure.clone()?;
    let attempts: Vec<_> = dead
        .attempts
        .iter()
        .filter(|a| a.error.is_some())
        .map(|a| json!({ "attempt": a.number, "worker": a.worker, "error": a.error }))
        .collect();
    let input = json!({
        "run_id": run.id,
        "function": run.function,
        "status": run.status,
        "input": bytes_as_json::to_value(&run.input),
        "error": run.error,
        "attempts": attempts,
    });
    Some(EnqueueRequest {
        tenant: run.tenant.clone(),
        function: handler,
        input: input.to_string().into_bytes(),
        trigger: format!("{HANDLER_TRIGGER}{}", run.id),
        due_at: None,
        idempotency_key: Some(format!("{HANDLER_TRIGGER}{}:{}", run.id, run.attempt)),
        retry: None,
        parent: Some(run.id.clone()),
        priority: None,
        // The handler continues the dead run's trace (the server puts the span that saw
        // the end in its place when it has one).
        trace: run.trace.clone(),
    })
}

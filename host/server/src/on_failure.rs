//! Failure handlers: the process that sees a run end failed or cancelled — the worker
//! that ended its attempt, or the API server that cancelled it while it was not running —
//! starts the handler run core computes (`lifecycle::failure_handler`), once per end
//! (its idempotency key).
//!
//! Not in the store's transition: a run failed by the cap on lost leases inside a claim,
//! or a process killed between the end and the handler's start, starts no handler (see
//! the README's failure handlers).

use wasq_core::{RunStatus, lifecycle};

use crate::App;

/// Starts the failure handler of run `id` if it ended in `status` and has one.
pub(crate) async fn after_end(app: &App, tenant: &str, id: &str, status: RunStatus) {
    if !matches!(status, RunStatus::Failed | RunStatus::Cancelled) {
        return;
    }
    let detail = match app.store.run(tenant, id).await {
        Ok(Some(d)) => d,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(run = id, error = %e, "cannot read the run to start its failure handler");
            return;
        }
    };
    let Some(mut req) = lifecycle::failure_handler(&detail) else {
        return;
    };
    // The span that saw the end (the worker's finish, the API's cancel) when spans are
    // exported; else the dead run's own context.
    req.trace = crate::telemetry::current_or(|| req.trace.take());
    let handler = req.function.clone();
    match app.store.enqueue(req).await {
        Ok(e) if e.created => {
            tracing::info!(run = id, %handler, handler_run = %e.run.id, "failure handler started");
            app.wake.notify_one();
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(run = id, %handler, error = %e, "could not start the failure handler")
        }
    }
}

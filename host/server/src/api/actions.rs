//! What users do to a run by hand — cancel (with its descendants) and retry — and the id
//! they name it by: a whole id or a unique prefix of one.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use wasq_core::ids::{self, IdRef};
use wasq_core::*;

use super::query;
use crate::App;
use crate::auth::TenantScope;
use crate::error::ApiError;

/// The whole id of the tenant's run that `raw` names: itself, or the one run whose id
/// starts with it. 404 when none does; 400 `ambiguous_id` with the candidates when
/// several do.
pub(super) async fn resolve(app: &App, tenant: &str, raw: &str) -> Result<String, ApiError> {
    let prefix = match ids::parse_id_ref(raw) {
        IdRef::Whole(id) => return Ok(id),
        IdRef::Prefix(p) => p,
    };
    let mut found = app
        .store
        .run_ids(tenant, &prefix, ids::PREFIX_CANDIDATES + 1)
        .await?;
    match found.len() {
        0 => Err(ApiError::not_found(format!(
            "no run id starts with {prefix:?}"
        ))),
        1 => Ok(found.remove(0)),
        n => {
            let more = if n > ids::PREFIX_CANDIDATES {
                " and more"
            } else {
                ""
            };
            found.truncate(ids::PREFIX_CANDIDATES);
            Err(ApiError::bad_request(
                "ambiguous_id",
                format!(
                    "{prefix:?} starts several run ids: {}{more}; give more of the id",
                    found.join(", ")
                ),
            ))
        }
    }
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelParams {
    /// Also cancel the run's children, and theirs.
    #[serde(default)]
    cascade: bool,
}

#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    tag = "runs",
    summary = "Cancel a run",
    description = "At once when queued, sleeping or waiting; a running attempt is interrupted. The run's `error` becomes `{\"reason\": \"cancelled\", \"message\": \"by key:ID\"}` and its log says who cancelled it.",
    params(("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)"), CancelParams),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The cancelled run", body = Run),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no run id starts with it", body = crate::error::ErrorBody),
        (status = 409, description = "`conflict`: the run already ended", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn cancel_run(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
    params: Result<Query<CancelParams>, QueryRejection>,
) -> Result<Json<Run>, ApiError> {
    let cascade = query(params)?.cascade;
    let id = resolve(&app, &scope.tenant, &id).await?;
    let by = scope.caller.actor();
    let run = cancel_one(&app, RunAction::cancel(&scope.tenant, &id, &by)).await?;
    crate::admin::audit(&app, &scope.tenant, &scope.caller, "run.cancel", id.clone()).await;
    if cascade {
        // Depth first over the run's descendants; those already ended are left alone.
        let by = format!("{by}, with its ancestor run {id} (cascade)");
        let mut parents = vec![run.id.clone()];
        while let Some(parent) = parents.pop() {
            let q = RunQuery {
                tenant: scope.tenant.clone(),
                parent: Some(parent),
                limit: 1000,
                ..RunQuery::default()
            };
            for child in app.store.runs(q).await? {
                if !child.status.is_terminal() {
                    let action = RunAction::cancel(&scope.tenant, &child.id, &by);
                    match cancel_one(&app, action).await {
                        Ok(_)
                        | Err(ApiError {
                            code: "conflict", ..
                        }) => {}
                        Err(e) => return Err(e),
                    }
                }
                parents.push(child.id);
            }
        }
    }
    Ok(Json(run))
}

async fn cancel_one(app: &App, action: RunAction) -> Result<Run, ApiError> {
    let run = app.store.cancel(action).await?;
    if run.status == RunStatus::Running {
        // Ours: interrupt it now. Another process's: it learns at its next lease renewal.
        app.in_flight.cancel(&run.id);
    } else {
        // Cancelled at once: no worker will see it end.
        if run.settings.on_failure.is_some() {
            crate::on_failure::after_end(app, &run.tenant, &run.id, run.status).await;
        }
        crate::notify::after_end(app, &run, run.status).await;
    }
    Ok(run)
}

#[utoipa::path(
    post,
    path = "/v1/runs/{id}/retry",
    tag = "runs",
    summary = "Retry a failed or cancelled run",
    description = "Queues it again with a fresh budget of attempts; completed steps are kept. Its log says who retried it.",
    params(("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)")),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The run, queued again", body = Run),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no run id starts with it", body = crate::error::ErrorBody),
        (status = 409, description = "`conflict`: the run is not failed or cancelled", body = crate::error::ErrorBody),
        (status = 429, description = "`quota_exceeded`: the tenant has `max_queued` runs queued (see `Retry-After`)", body = crate::error::ErrorBody),
        (status = 503, description = "`store_full`: the store guard refuses new work; or `unavailable`: the store is unreachable", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn retry_run(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
) -> Result<Json<Run>, ApiError> {
    app.guard.admit()?;
    let id = resolve(&app, &scope.tenant, &id).await?;
    let action = RunAction::retry(&scope.tenant, &id, &scope.caller.actor());
    let run = app.store.retry(action).await?;
    crate::admin::audit(&app, &scope.tenant, &scope.caller, "run.retry", id.clone()).await;
    app.wake.notify_one();
    Ok(Json(run))
}

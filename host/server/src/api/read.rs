//! Reading runs: listings, one run, its steps and its logs. Every answer is bounded in
//! size whatever the run stored (issue: a run with 400 MB of steps answered 400 MB): a run
//! lists its steps without their outputs and no log lines; steps, one step's output and
//! log lines have routes of their own, paged; listings leave out big inputs and outputs.
//!
//! The bounds (documented in the README, "HTTP API"):
//! - `GET /v1/runs/{id}`: the run with its input (at most 4 MiB), output (4 MiB), the
//!   latest 100 executions and the first 1000 steps without outputs: about 10 MiB at most.
//! - `GET /v1/runs`: at most 1000 runs; inputs and outputs over 4 KiB are left out, errors
//!   cut to 4 KiB: about 10 MiB at most.
//! - `GET /v1/runs/{id}/steps`: at most 1000 steps a page, without outputs.
//! - `GET /v1/runs/{id}/steps/{name}/{occurrence}`: one output, at most 4 MiB.
//! - `GET /v1/runs/{id}/logs`: at most 10,000 lines and 4 MiB a page (a page always holds
//!   at least one line; one line is at most 1 MiB).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use wasq_core::*;

use super::query;
use crate::App;
use crate::auth::TenantScope;
use crate::error::ApiError;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    /// Only this function's runs.
    function: Option<String>,
    /// Only the children of this run (a unique prefix of its id will do).
    parent: Option<String>,
    /// Only runs in this status (`queued`, `running`, ..., `skipped`).
    status: Option<String>,
    /// Runs to list, 1-1000 (default 50).
    limit: Option<usize>,
    /// Only runs listed after this one (the last id of the previous page): older ones.
    before: Option<String>,
    /// Only runs created at or after this time (RFC 3339).
    since: Option<String>,
    /// Only runs created before this time (RFC 3339).
    until: Option<String>,
}

fn parse_time(name: &str, value: &str) -> Result<wasq_core::clock::Millis, ApiError> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            ApiError::bad_request(
                "bad_query",
                format!(
                    "{name} must be an RFC 3339 time such as 2026-12-24T18:00:00Z, got {}: {e}",
                    names::quoted(value)
                ),
            )
        })
}

/// Inputs and outputs up to this size are listed whole; bigger ones are left out.
const LISTED_BLOB_BYTES: usize = 4 << 10;
/// Error messages are cut to this in listings.
const LISTED_ERROR_BYTES: usize = 4 << 10;

/// A run as a listing shows it: big inputs and outputs left out (read the run for them),
/// with their sizes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Listed {
    #[serde(flatten)]
    run: Run,
    /// Set when the input was over 4 KiB and is left out (`null`): its size.
    #[serde(skip_serializing_if = "Option::is_none")]
    input_omitted_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_omitted_bytes: Option<usize>,
}

impl Listed {
    fn new(mut run: Run) -> Listed {
        let mut input_omitted_bytes = None;
        if run.input.len() > LISTED_BLOB_BYTES {
            input_omitted_bytes = Some(run.input.len());
            run.input = b"null".to_vec();
        }
        let mut output_omitted_bytes = None;
        if let Some(out) = &run.output
            && out.len() > LISTED_BLOB_BYTES
        {
            output_omitted_bytes = Some(out.len());
            run.output = None;
        }
        if let Some(e) = &mut run.error
            && e.message.len() > LISTED_ERROR_BYTES
        {
            e.message =
                wasq_core::text::truncate_utf8(std::mem::take(&mut e.message), LISTED_ERROR_BYTES);
            e.message
                .push_str(" … (cut; read the run for the whole message)");
        }
        Listed {
            run,
            input_omitted_bytes,
            output_omitted_bytes,
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    summary = "Runs, newest first",
    description = "An input or output over 4 KiB is left out (`null`, with `input_omitted_bytes` / `output_omitted_bytes`); error messages are cut at 4 KiB.",
    params(ListParams),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The runs", body = Vec<Listed>),
        (status = 400, description = "`bad_query`: a bad parameter; `ambiguous_id`: a `parent` prefix of several runs", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no run id starts with `parent`", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn list_runs(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Vec<Listed>>, ApiError> {
    let p = query(params)?;
    let status = p
        .status
        .map(|s| s.parse::<RunStatus>())
        .transpose()
        .map_err(|e| ApiError::bad_request("bad_query", e))?;
    let limit = p.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be between 1 and 1000, got {limit}"),
        ));
    }
    // Like every run route, `parent` takes a unique prefix of an id.
    let parent = match p.parent {
        Some(id) => Some(super::actions::resolve(&app, &scope.tenant, &id).await?),
        None => None,
    };
    if let Some(b) = &p.before
        && !ids::is_run_id(b)
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("before must be a whole run id, got {}", names::quoted(b)),
        ));
    }
    let since = p.since.map(|t| parse_time("since", &t)).transpose()?;
    let until = p.until.map(|t| parse_time("until", &t)).transpose()?;
    // `until` is a `before` bound too: whichever lists fewer runs.
    let before = match (
        p.before.map(|b| b.to_ascii_lowercase()),
        until.map(ids::time_floor),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let q = RunQuery {
        tenant: scope.tenant.clone(),
        function: p.function,
        status,
        parent,
        before,
        since,
        limit,
    };
    let runs = app.store.runs(q).await?;
    Ok(Json(runs.into_iter().map(Listed::new).collect()))
}

/// A run as `GET /v1/runs/{id}` shows it: its detail, and its webhook deliveries when its
/// function notifies.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct RunView {
    #[serde(flatten)]
    detail: RunDetail,
    /// Its webhook deliveries, when its function notifies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    deliveries: Vec<wasq_core::notify::Delivery>,
}

#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    tag = "runs",
    summary = "A run with its latest executions and first steps",
    description = "The run (with `stored_bytes` and `log_bytes`), its latest 100 executions (`attempts`; `attempts_total` counts them all) and its first 1000 steps without their outputs (`steps_total`). No log lines.",
    params(("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)")),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The run", body = RunView),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids; `bad_query`: a bad parameter", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such run", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn get_run(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    let id = super::actions::resolve(&app, &scope.tenant, &id).await?;
    let detail = app
        .store
        .run(&scope.tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id:?} not found")))?;
    let deliveries = if detail.run.settings.notify.urls.is_empty() {
        Vec::new()
    } else {
        app.store.deliveries(&scope.tenant, &id).await?
    };
    Ok(Json(RunView { detail, deliveries }))
}

/// `GET /v1/webhooks/secret`: the key the tenant's webhooks are signed with.
#[utoipa::path(
    get,
    path = "/v1/webhooks/secret",
    tag = "webhooks",
    summary = "The key the tenant's webhooks are signed with",
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The secret", body = crate::openapi::WebhookSecret),
    ),
)]
pub(crate) async fn webhook_secret(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "secret": crate::notify::tenant_secret(&app, &scope.tenant) }))
}

/// `skip` and `limit` of a paged route.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct Page {
    /// Items to skip (default 0).
    skip: Option<usize>,
    /// Items in the page: steps 1-1000 (default 1000), log lines 1-10,000 (default 1000).
    limit: Option<usize>,
}

impl Page {
    fn get(self, default: usize, max: usize) -> Result<(usize, usize), ApiError> {
        let limit = self.limit.unwrap_or(default);
        if !(1..=max).contains(&limit) {
            return Err(ApiError::bad_request(
                "bad_query",
                format!("limit must be between 1 and {max}, got {limit}"),
            ));
        }
        Ok((self.skip.unwrap_or(0), limit))
    }
}

#[utoipa::path(
    get,
    path = "/v1/runs/{id}/steps",
    tag = "runs",
    summary = "A run's steps in completion order, without their outputs",
    params(("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)"), Page),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "A page of steps, at most 1000", body = Vec<StepInfo>),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids; `bad_query`: a bad parameter", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such run", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn list_steps(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
    params: Result<Query<Page>, QueryRejection>,
) -> Result<Json<Vec<StepInfo>>, ApiError> {
    let (skip, limit) = query(params)?.get(1000, 1000)?;
    let id = super::actions::resolve(&app, &scope.tenant, &id).await?;
    Ok(Json(
        app.store.steps(&scope.tenant, &id, skip, limit).await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/runs/{id}/steps/{name}/{occurrence}",
    tag = "runs",
    summary = "One step with its output",
    params(
        ("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)"),
        ("name" = String, Path, description = "The step's name"),
        ("occurrence" = u32, Path, description = "0 for the first step of this name in the run, 1 for the second, ..."),
    ),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The step", body = StepRecord),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids; `bad_query`: a bad parameter", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such run or step", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn get_step(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path((id, name, occurrence)): Path<(String, String, u32)>,
) -> Result<Json<StepRecord>, ApiError> {
    let id = super::actions::resolve(&app, &scope.tenant, &id).await?;
    app.store
        .step(&scope.tenant, &id, &name, occurrence)
        .await?
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "step {} #{occurrence} of run {id:?} not found",
                names::quoted(&name)
            ))
        })
}

/// A page of log lines stops at this many bytes of messages (but holds one line at least).
const LOG_PAGE_BYTES: usize = 4 << 20;

#[utoipa::path(
    get,
    path = "/v1/runs/{id}/logs",
    tag = "runs",
    summary = "A run's log lines",
    description = "Guest `log` lines, stdout, stderr and wasq's own notes, after the first `skip`; at most 4 MiB of messages a page (one line at least).",
    params(("id" = String, Path, description = "A run id, or a unique prefix of one (hex digits and dashes, any case)"), Page),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "A page of log lines", body = Vec<LogLine>),
        (status = 400, description = "`ambiguous_id`: the prefix starts several run ids; `bad_query`: a bad parameter", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such run", body = crate::error::ErrorBody),
    ),
)]
pub(super) async fn get_logs(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
    params: Result<Query<Page>, QueryRejection>,
) -> Result<Json<Vec<LogLine>>, ApiError> {
    let (skip, limit) = query(params)?.get(1000, 10_000)?;
    let id = super::actions::resolve(&app, &scope.tenant, &id).await?;
    let mut lines = app.store.logs(&scope.tenant, &id, skip, limit).await?;
    // Stores only ever return lines of the caller's own runs, so only an empty page needs
    // the run read, to tell "no lines (yet)" from 404.
    if lines.is_empty() && app.store.run(&scope.tenant, &id).await?.is_none() {
        return Err(ApiError::not_found(format!("run {id:?} not found")));
    }
    let mut bytes = 0;
    let keep = lines
        .iter()
        .take_while(|l| {
            bytes += l.message.len();
            bytes <= LOG_PAGE_BYTES
        })
        .count();
    lines.truncate(keep.max(1));
    Ok(Json(lines))
}

/// `GET /v1/workers`: the workers heard from in the last `WORKER_GONE_MS`, by id (any
/// key: attempts already name their workers to tenants).
#[utoipa::path(
    get,
    path = "/v1/workers",
    tag = "queues",
    summary = "The workers executing runs, with their queues and slots in use",
    description = "Every worker process (`wasq worker`, `wasq dev`, `wasq server --concurrency N`) heard from in the last 30 s: its id (`host-pid`, as attempts name it), the queues it takes (empty: all), its slots and how many were busy at its last heartbeat (every 5 s), when it started and was last heard from (Unix ms). A worker that stopped cleanly is gone at once.",
    security(("tenant_key" = []), ("operator_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "The workers, by id", body = Vec<wasq_core::WorkerBeat>),
    ),
)]
pub(crate) async fn list_workers(
    State(app): State<Arc<App>>,
) -> Result<Json<Vec<wasq_core::WorkerBeat>>, ApiError> {
    let since = app.now() - wasq_core::workers::WORKER_GONE_MS;
    Ok(Json(app.store.workers(since).await?))
}

/// `GET /v1/queues`: runs waiting to start and running per queue, for every queue a
/// function of the tenant names or a run waits in, by name.
#[utoipa::path(
    get,
    path = "/v1/queues",
    tag = "queues",
    summary = "Each queue with its runs waiting to start and running",
    description = "Every queue a function of the tenant names or a run waits in, by name; delayed and backing-off runs count as waiting.",
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The queues", body = Vec<QueueDepth>),
    ),
)]
pub(crate) async fn list_queues(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Result<Json<Vec<QueueDepth>>, ApiError> {
    let mut depths = app.store.queue_depths(&scope.tenant).await?;
    for f in app.store.functions(&scope.tenant).await? {
        if !depths.iter().any(|d| d.queue == f.settings.queue) {
            depths.push(QueueDepth {
                queue: f.settings.queue,
                queued: 0,
                running: 0,
            });
        }
    }
    depths.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(Json(depths))
}

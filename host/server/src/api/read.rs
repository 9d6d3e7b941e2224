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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    function: Option<String>,
    /// Only the children of this run.
    parent: Option<String>,
    status: Option<String>,
    limit: Option<usize>,
}

/// Inputs and outputs up to this size are listed whole; bigger ones are left out.
const LISTED_BLOB_BYTES: usize = 4 << 10;
/// Error messages are cut to this in listings.
const LISTED_ERROR_BYTES: usize = 4 << 10;

/// A run as a listing shows it: big inputs and outputs left out (read the run for them),
/// with their sizes.
#[derive(Debug, Serialize)]
pub(super) struct Listed {
    #[serde(flatten)]
    run: Run,
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
    let q = RunQuery {
        tenant: scope.tenant.clone(),
        function: p.function,
        status,
        parent,
        limit,
    };
    let runs = app.store.runs(q).await?;
    Ok(Json(runs.into_iter().map(Listed::new).collect()))
}

/// A run as `GET /v1/runs/{id}` shows it: its detail, and its webhook deliveries when its
/// function notifies.
#[derive(Debug, Serialize)]
pub(super) struct RunView {
    #[serde(flatten)]
    detail: RunDetail,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    deliveries: Vec<wasq_core::notify::Delivery>,
}

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
pub(crate) async fn webhook_secret(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "secret": crate::notify::tenant_secret(&app, &scope.tenant) }))
}

/// `skip` and `limit` of a paged route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Page {
    skip: Option<usize>,
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

/// `GET /v1/queues`: runs waiting to start and running per queue, for every queue a
/// function of the tenant names or a run waits in, by name.
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

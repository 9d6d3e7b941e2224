//! The HTTP API under `/v1`, plus `/healthz`. Reading runs, steps and logs (the answers
//! that must stay bounded whatever a run stored) is in `read.rs`; cancels, retries and
//! what a run id may be abbreviated to in `actions.rs`. Every handler is described by its
//! `#[utoipa::path]`, which `crate::openapi` gathers into the OpenAPI document (its test
//! fails for a route without one): the handlers' modules are `pub(crate)` for that.

pub(crate) mod actions;
pub(crate) mod batch;
pub(crate) mod deploy;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod tenant_events;
pub(crate) mod watch;

pub use deploy::DeployParams;
use deploy::*;
use runs::*;
use schedules::*;
pub(crate) use watch::Streams;
pub(crate) mod read;
mod redeploy;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use wasq_core::flow;
use wasq_core::*;

use crate::App;
use crate::auth::TenantScope;
use crate::error::ApiError;

pub(crate) fn router(app: Arc<App>) -> Router {
    // A streaming bound: the body is read up to this and no further (see `upload_body`).
    let upload_limit = app.config.sandbox.max_component_bytes;
    let authenticated = Router::new()
        .route("/v1/functions", get(list_functions))
        .route(
            "/v1/functions/{name}",
            put(deploy)
                .get(get_function)
                .layer(DefaultBodyLimit::max(upload_limit))
                .layer(axum::middleware::from_fn_with_state(
                    app.clone(),
                    upload_budget,
                ))
                .layer(axum::middleware::from_fn_with_state(
                    app.clone(),
                    refuse_declared_oversize,
                )),
        )
        .route("/v1/functions/{name}/runs", axum::routing::post(create_run))
        .route(
            "/v1/functions/{name}/runs:batch",
            axum::routing::post(batch::create_runs)
                .layer(DefaultBodyLimit::max(batch::MAX_BATCH_BODY))
                .layer(axum::middleware::from_fn(batch::refuse_declared_oversize)),
        )
        .route("/v1/runs", get(read::list_runs))
        .route("/v1/events", axum::routing::post(send_event))
        .route("/v1/schedules", get(list_schedules))
        .route("/v1/queues", get(read::list_queues))
        .route("/v1/workers", get(read::list_workers))
        .route("/v1/webhooks/secret", get(read::webhook_secret))
        .route(
            "/v1/functions/{name}/schedule/{action}",
            axum::routing::post(schedule_action),
        )
        .route("/v1/runs/{id}", get(read::get_run))
        .route("/v1/runs/{id}/logs", get(read::get_logs))
        .route("/v1/runs/{id}/events", get(watch::run_events))
        .route("/v1/runs:events", get(tenant_events::stream))
        .route("/v1/runs/{id}/steps", get(read::list_steps))
        .route(
            "/v1/runs/{id}/steps/{name}/{occurrence}",
            get(read::get_step),
        )
        .route(
            "/v1/runs/{id}/cancel",
            axum::routing::post(actions::cancel_run),
        )
        .route(
            "/v1/runs/{id}/retry",
            axum::routing::post(actions::retry_run),
        )
        .merge(crate::admin::routes())
        .route("/metrics", get(crate::metrics::scrape))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            crate::auth::authenticate,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        // The OpenAPI document and its reference page: public, like /healthz.
        .merge(crate::openapi::routes())
        .merge(authenticated)
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::middleware::from_fn(close_after_refused_body))
        // Each request's server span (telemetry.rs), outermost: it sees the route matched.
        .layer(axum::middleware::from_fn(crate::telemetry::request_span))
        .with_state(app)
}

/// A request refused with its body unread (a 401 before an upload, a 413, a 503): hyper
/// closes the connection after the answer, and without saying so a client may send its
/// next request on that closing connection (and see it cut). `Connection: close` tells it
/// to open a new one. Error answers to requests with a body only: they are rare.
async fn close_after_refused_body(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let has_body = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || req.headers().contains_key(header::TRANSFER_ENCODING);
    let mut resp = next.run(req).await;
    let refused = resp.status().is_client_error() || resp.status().is_server_error();
    if has_body && refused {
        resp.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    summary = "Whether the server answers",
    description = "No key needed.",
    responses((status = 200, description = "It does", body = crate::openapi::Health)),
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::bad_request("bad_query", e.body_text()))
}

/// Function names appear in URLs, logs and CLI tables: the rules guests follow too
/// (`wasq_core::names`).
fn check_name(name: &str) -> Result<(), ApiError> {
    wasq_core::names::check_function_name(name).map_err(|m| ApiError::bad_request("bad_name", m))
}

#[utoipa::path(
    get,
    path = "/v1/functions/{name}",
    tag = "functions",
    summary = "A deployed function",
    params(("name" = String, Path, description = "The function's name")),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The function with its settings, events and schedule", body = Function),
        (status = 404, description = "`not_found`: no function of this name", body = crate::error::ErrorBody),
    ),
)]
async fn get_function(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(name): Path<String>,
) -> Result<Json<Function>, ApiError> {
    function_or_404(&app, &scope.tenant, &name).await.map(Json)
}

async fn function_or_404(app: &App, tenant: &str, name: &str) -> Result<Function, ApiError> {
    app.store
        .function(tenant, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("function {name:?} not found")))
}

#[utoipa::path(
    get,
    path = "/v1/functions",
    tag = "functions",
    summary = "Deployed functions",
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The tenant's functions, by name", body = Vec<Function>),
    ),
)]
async fn list_functions(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Result<Json<Vec<Function>>, ApiError> {
    Ok(Json(app.store.functions(&scope.tenant).await?))
}

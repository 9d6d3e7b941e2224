//! The HTTP API under `/v1`, plus `/healthz`. Reading runs, steps and logs (the answers
//! that must stay bounded whatever a run stored) is in `read.rs`; cancels, retries and
//! what a run id may be abbreviated to in `actions.rs`.

mod actions;
mod read;
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

use crate::auth::TenantScope;
use crate::error::ApiError;
use crate::{App, MAX_MEMORY_FLOOR};

pub fn router(app: Arc<App>) -> Router {
    // A streaming bound: the body is read up to this and no further (see `upload_body`).
    let upload_limit = app.sandbox_config.max_component_bytes;
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
        .route("/v1/runs", get(read::list_runs))
        .route("/v1/events", axum::routing::post(send_event))
        .route("/v1/schedules", get(list_schedules))
        .route(
            "/v1/functions/{name}/schedule/{action}",
            axum::routing::post(schedule_action),
        )
        .route("/v1/runs/{id}", get(read::get_run))
        .route("/v1/runs/{id}/logs", get(read::get_logs))
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
        .merge(authenticated)
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::middleware::from_fn(close_after_refused_body))
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

/// Deploy settings, all optional; query parameters of `PUT /v1/functions/{name}`. A
/// redeploy keeps what is not given (see `redeploy`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    pub timeout_ms: Option<u64>,
    pub fuel: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub max_attempts: Option<u32>,
    pub initial_backoff_ms: Option<u64>,
    pub max_backoff_ms: Option<u64>,
    /// `exponential` (default) or `fixed`.
    pub backoff: Option<Backoff>,
    pub jitter: Option<bool>,
    /// Retry traps (timeout, fuel, memory, panic); default true.
    pub retry_traps: Option<bool>,
    /// Comma-separated event names that start a run of the function.
    pub events: Option<String>,
    /// Cron expressions that start runs, separated by `;` (5 fields, or 6 with seconds).
    pub cron: Option<String>,
    /// IANA time zone of the cron expressions (default UTC).
    pub tz: Option<String>,
    /// Ticks missed while no server ran: `skip` (default) or `latest` (fire it once).
    pub missed: Option<Missed>,
    /// Comma-separated hosts the function may send HTTP requests to: `api.example.com`,
    /// `*.example.com` (subdomains, not the apex), IP literals. Default: none.
    pub allow_hosts: Option<String>,
    /// Flow control (see `wasq_core::flow`; parsed in `crate::flow`). Runs executing at
    /// once, per `concurrency_key` when given.
    pub concurrency_limit: Option<u32>,
    /// A key expression into the input, e.g. `input.customer.id`.
    pub concurrency_key: Option<String>,
    /// At most N first starts per period, the rest wait: `N/DURATION`, e.g. `5/1s`.
    pub throttle: Option<String>,
    pub throttle_key: Option<String>,
    /// At most N runs accepted per period, the rest are recorded as skipped: `N/DURATION`.
    pub rate_limit: Option<String>,
    pub rate_limit_key: Option<String>,
    /// Runs wait this long (e.g. `1s`); a later run with the same key replaces them.
    pub debounce: Option<String>,
    pub debounce_key: Option<String>,
    /// Lower starts first (-1000..=1000, default 0).
    pub priority: Option<i32>,
    /// What one priority level is worth in waiting time (default `1m`).
    pub priority_aging: Option<String>,
    /// Start from the defaults, not from the function's current settings, events and
    /// schedule.
    pub reset_settings: Option<bool>,
}

impl DeployParams {
    /// The schedule asked for, checked by `crate::cron::check` (limits, and a first tick
    /// within the search horizon) on a blocking thread, since it searches ticks.
    async fn schedule(&self) -> Result<Option<Schedule>, ApiError> {
        let Some(cron) = &self.cron else {
            if self.tz.is_some() || self.missed.is_some() {
                return Err(ApiError::bad_request(
                    "bad_schedule",
                    "tz and missed need a cron expression",
                ));
            }
            return Ok(None);
        };
        let mut crons: Vec<String> = vec![];
        for c in cron.split(';').map(str::trim).filter(|c| !c.is_empty()) {
            // The same expression twice would fire each tick once anyway.
            if !crons.iter().any(|have| have == c) {
                crons.push(c.to_owned());
            }
        }
        let schedule = Schedule {
            crons,
            tz: self.tz.clone().unwrap_or_else(|| "UTC".into()),
            missed: self.missed.unwrap_or_default(),
            paused: false,
            resumed_at: None,
        };
        let checked = schedule.clone();
        tokio::task::spawn_blocking(move || crate::cron::check(&checked, SystemClock.now_ms()))
            .await
            .map_err(|e| StoreError::Internal(format!("checking the schedule failed: {e}")))?
            .map_err(|e| ApiError::bad_request("bad_schedule", e))?;
        Ok(Some(schedule))
    }
}

/// Event names: what users type on command lines and match in filters; the rules guests
/// follow too.
fn check_event_name(name: &str) -> Result<(), ApiError> {
    wasq_core::names::check_event_name(name).map_err(|m| ApiError::bad_request("bad_event", m))
}

impl DeployParams {
    /// `d` (the defaults, or the settings a redeploy keeps) with what is given here.
    fn settings(&self, d: FunctionSettings, max_memory: u64) -> Result<FunctionSettings, ApiError> {
        let s = FunctionSettings {
            limits: Limits {
                timeout_ms: self.timeout_ms.unwrap_or(d.limits.timeout_ms),
                fuel: self.fuel.unwrap_or(d.limits.fuel),
                memory_bytes: self.memory_bytes.unwrap_or(d.limits.memory_bytes),
            },
            retry: RetryPolicy {
                max_attempts: self.max_attempts.unwrap_or(d.retry.max_attempts),
                initial_backoff_ms: self
                    .initial_backoff_ms
                    .unwrap_or(d.retry.initial_backoff_ms),
                max_backoff_ms: self.max_backoff_ms.unwrap_or(d.retry.max_backoff_ms),
                backoff: self.backoff.unwrap_or(d.retry.backoff),
                jitter: self.jitter.unwrap_or(d.retry.jitter),
                retry_traps: self.retry_traps.unwrap_or(d.retry.retry_traps),
            },
            allow_hosts: match &self.allow_hosts {
                Some(_) => self.allow_hosts()?,
                None => d.allow_hosts,
            },
            flow: if self.has_flow() {
                self.flow()?
            } else {
                d.flow
            },
        };
        let bad = |m: String| Err(ApiError::bad_request("bad_settings", m));
        if !(1..=24 * 3600 * 1000).contains(&s.limits.timeout_ms) {
            return bad(format!(
                "timeout_ms must be between 1 and 86400000, got {}",
                s.limits.timeout_ms
            ));
        }
        if s.limits.fuel == 0 {
            return bad("fuel must be at least 1".into());
        }
        if !(MAX_MEMORY_FLOOR..=max_memory).contains(&s.limits.memory_bytes) {
            return bad(format!(
                "memory_bytes must be between {MAX_MEMORY_FLOOR} and this server's ceiling of {max_memory}, got {}",
                s.limits.memory_bytes
            ));
        }
        check_retry(&s.retry)?;
        Ok(s)
    }

    /// The allow-list, each entry checked and normalised, without duplicates.
    fn allow_hosts(&self) -> Result<Vec<String>, ApiError> {
        let mut out: Vec<String> = Vec::new();
        for raw in self.allow_hosts.iter().flat_map(|l| l.split(',')) {
            if raw.trim().is_empty() {
                continue;
            }
            let host = wasq_sandbox::normalize_allow_host(raw)
                .map_err(|e| ApiError::bad_request("bad_settings", e))?;
            if !out.contains(&host) {
                out.push(host);
            }
        }
        if out.len() > wasq_sandbox::MAX_ALLOW_HOSTS {
            return Err(ApiError::bad_request(
                "bad_settings",
                format!(
                    "allow_hosts has {} entries, over the limit of {}",
                    out.len(),
                    wasq_sandbox::MAX_ALLOW_HOSTS
                ),
            ));
        }
        Ok(out)
    }
}

async fn deploy(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(name): Path<String>,
    params: Result<Query<DeployParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = upload_body(body, app.sandbox_config.max_component_bytes)?;
    check_name(&name)?;
    app.guard.admit()?;
    let params = query(params)?;
    let existing = app.store.function(&scope.tenant, &name).await?;
    let base = params.base(existing.as_ref());
    let kept_settings = base.map_or_else(FunctionSettings::default, |f| f.settings.clone());
    let settings = params.settings(kept_settings, app.sandbox_config.max_memory_bytes)?;
    let events: Vec<String> = match &params.events {
        None => base.map(|f| f.events.clone()).unwrap_or_default(),
        Some(list) => list
            .split(',')
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect(),
    };
    for e in &events {
        check_event_name(e)?;
    }
    let kept = base.and_then(|f| f.schedule.clone());
    let mut schedule = match kept {
        Some(kept) if params.cron.is_none() => {
            if params.tz.is_none() && params.missed.is_none() {
                // Kept, and active again if it was paused (below: a resume).
                Some(Schedule {
                    paused: false,
                    ..kept
                })
            } else {
                // A new zone or missed-tick policy for the schedule it has.
                let mut p = params.clone();
                p.cron = Some(kept.crons.join(";"));
                p.tz = p.tz.or(Some(kept.tz));
                p.missed = p.missed.or(Some(kept.missed));
                p.schedule().await?
            }
        }
        _ => params.schedule().await?,
    };
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "bad_component",
            "the request body is empty: send the component's bytes",
        ));
    }
    let quotas = app
        .directory
        .tenant(&scope.tenant)
        .await?
        .map_or(app.config.default_quotas, |t| t.quotas);
    check_quotas(&quotas, &settings, body.len())?;
    // Validation compiles the component under limits before anything is stored, so a
    // component that reaches the store (and a worker) is known to load.
    let digest = app
        .sandbox
        .validate(&body)
        .await
        .map_err(|e| ApiError::bad_request("bad_component", e.to_string()))?;
    if let (Some(new), Some(old)) = (
        &mut schedule,
        existing.as_ref().and_then(|f| f.schedule.clone()),
    ) {
        // A redeploy makes a paused schedule active again: a resume, whose missed ticks
        // follow the policy like any other's.
        new.resumed_at = if old.paused {
            Some(SystemClock.now_ms())
        } else {
            old.resumed_at
        };
    }
    let function = app
        .store
        .deploy(DeployRequest {
            tenant: scope.tenant.clone(),
            name,
            digest,
            component: body.to_vec(),
            settings,
            events,
            schedule,
        })
        .await?;
    tracing::info!(tenant = %scope.tenant, function = %function.name, digest = %function.digest, "deployed");
    crate::admin::audit(
        &app,
        &scope.tenant,
        &scope.caller,
        "deploy",
        format!("{} {}", function.name, function.digest),
    )
    .await;
    let mut answer =
        serde_json::to_value(&function).map_err(|e| StoreError::Internal(e.to_string()))?;
    let status = match &existing {
        Some(old) => {
            // What this redeploy changed, in words (the CLI prints them).
            answer["changed"] = redeploy::changes(old, &function).into();
            StatusCode::OK
        }
        None => StatusCode::CREATED,
    };
    Ok((status, Json(answer)).into_response())
}

fn upload_too_large(max: usize) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "too_large",
        message: format!("the upload is over this server's limit of {max} bytes per component"),
        retry_after_ms: None,
    }
}

/// Waits for room in the budget of upload bytes in flight (`HttpLimits::
/// upload_bytes_in_flight`) before a deploy reads its body, and holds it until the deploy
/// answered; 503 after `upload_wait`. Counted in KiB.
async fn upload_budget(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.method() != axum::http::Method::PUT {
        return next.run(req).await;
    }
    let max = app.sandbox_config.max_component_bytes as u64;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(max)
        .min(max);
    let limits = &app.config.http;
    let total_kib = (limits.upload_bytes_in_flight >> 10).clamp(1, u64::from(u32::MAX >> 3));
    let kib = (declared.div_ceil(1024)).clamp(1, total_kib) as u32;
    let room = app.uploads.clone().acquire_many_owned(kib);
    match tokio::time::timeout(limits.upload_wait, room).await {
        Ok(Ok(permit)) => {
            let resp = next.run(req).await;
            drop(permit);
            resp
        }
        _ => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "busy",
            message: format!(
                "too many uploads in progress ({} MiB at once): try again",
                limits.upload_bytes_in_flight >> 20
            ),
            retry_after_ms: Some(5_000),
        }
        .into_response(),
    }
}

/// An upload whose Content-Length is over the server's limit is refused before a byte
/// of its body is read.
async fn refuse_declared_oversize(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let max = app.sandbox_config.max_component_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return upload_too_large(max).into_response();
    }
    next.run(req).await
}

/// The body of an upload. `DefaultBodyLimit` stops reading it at the server's limit, so
/// a bigger one without a Content-Length (chunked, a 1 GiB stream) is refused after at
/// most that many bytes, never buffered whole; the tenant's own, smaller quota is checked
/// once the body is in.
fn upload_body(body: Result<Bytes, BytesRejection>, max: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            upload_too_large(max)
        } else {
            ApiError::bad_request("bad_body", e.body_text())
        }
    })
}

/// The tenant's ceilings on what a function may ask for.
fn check_quotas(q: &Quotas, settings: &FunctionSettings, size: usize) -> Result<(), ApiError> {
    let quota = |status, message: String| ApiError {
        status,
        code: "quota_exceeded",
        message,
        retry_after_ms: None,
    };
    if size as u64 > q.max_component_bytes {
        return Err(quota(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the component is {size} bytes; this tenant may upload at most {}",
                q.max_component_bytes
            ),
        ));
    }
    if settings.limits.fuel > q.max_fuel_per_run {
        return Err(quota(
            StatusCode::BAD_REQUEST,
            format!(
                "fuel {} exceeds this tenant's ceiling of {} per run",
                settings.limits.fuel, q.max_fuel_per_run
            ),
        ));
    }
    if settings.limits.memory_bytes > q.max_memory_per_run {
        return Err(quota(
            StatusCode::BAD_REQUEST,
            format!(
                "memory_bytes {} exceeds this tenant's ceiling of {} per run",
                settings.limits.memory_bytes, q.max_memory_per_run
            ),
        ));
    }
    Ok(())
}

/// A function's schedule as `wasq cron list` shows it.
#[derive(Debug, Serialize)]
struct ScheduleView {
    function: String,
    cron: String,
    tz: String,
    missed: Missed,
    paused: bool,
    /// The next five ticks, Unix ms.
    next: Vec<i64>,
}

/// Tick searches one `GET /v1/schedules` may spend; past it, the remaining schedules are
/// listed without their next ticks.
const LIST_SCHEDULES_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

async fn list_schedules(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    let functions = app.store.functions(&scope.tenant).await?;
    // Searching ticks is CPU work: on a blocking thread, within a budget.
    let views = tokio::task::spawn_blocking(move || {
        let now = SystemClock.now_ms();
        let deadline = std::time::Instant::now() + LIST_SCHEDULES_BUDGET;
        let mut out = vec![];
        for f in functions {
            let Some(s) = &f.schedule else { continue };
            for entry in crate::cron::entries(s).0 {
                let next = if s.paused || std::time::Instant::now() >= deadline {
                    vec![]
                } else {
                    entry.upcoming(now, 5)
                };
                out.push(ScheduleView {
                    function: f.name.clone(),
                    next,
                    cron: entry.expr,
                    tz: s.tz.clone(),
                    missed: s.missed,
                    paused: s.paused,
                });
            }
        }
        out
    })
    .await
    .map_err(|e| StoreError::Internal(format!("listing schedules failed: {e}")))?;
    Ok(Json(views))
}

/// `pause`, `resume` or `run-now` (one run, now, outside the schedule). The action is
/// checked before anything is read or written, and audited once it has succeeded.
async fn schedule_action(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path((name, action)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let action = match action.as_str() {
        "pause" => "schedule.pause",
        "resume" => "schedule.resume",
        "run-now" => "schedule.run-now",
        // Not echoed: the path segment is the caller's, of any length and content.
        _ => {
            return Err(ApiError::not_found(
                "no such schedule action: use pause, resume or run-now",
            ));
        }
    };
    let f = function_or_404(&app, &scope.tenant, &name).await?;
    let Some(mut schedule) = f.schedule.clone() else {
        return Err(ApiError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: format!("function {name:?} has no schedule"),
            retry_after_ms: None,
        });
    };
    let response = if action == "schedule.run-now" {
        app.guard.admit()?;
        let run = app
            .store
            .enqueue(EnqueueRequest {
                tenant: f.tenant,
                function: f.name,
                input: serde_json::json!({ "cron": "run-now" })
                    .to_string()
                    .into_bytes(),
                trigger: "cron:run-now".into(),
                due_at: None,
                idempotency_key: None,
                retry: None,
                parent: None,
                priority: None,
            })
            .await?
            .run;
        app.wake.notify_one();
        (StatusCode::CREATED, Json(run)).into_response()
    } else {
        let pause = action == "schedule.pause";
        if schedule.paused == pause {
            // Already so: resuming an active schedule must not move `resumed_at`, which
            // would drop the ticks of the last second.
            Json(f).into_response()
        } else {
            schedule.paused = pause;
            if !pause {
                // The ticks up to now were missed: the scheduler applies the policy.
                schedule.resumed_at = Some(SystemClock.now_ms());
            }
            // Redeploys the same component with the schedule changed: one transition.
            let component =
                app.store.component(&f.digest).await?.ok_or_else(|| {
                    ApiError::not_found(format!("component {} not found", f.digest))
                })?;
            let f = app
                .store
                .deploy(DeployRequest {
                    tenant: f.tenant,
                    name: f.name,
                    digest: f.digest,
                    component,
                    settings: f.settings,
                    events: f.events,
                    schedule: Some(schedule),
                })
                .await?;
            Json(f).into_response()
        }
    };
    crate::admin::audit(&app, &scope.tenant, &scope.caller, action, name).await;
    Ok(response)
}

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

async fn list_functions(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Result<Json<Vec<Function>>, ApiError> {
    Ok(Json(app.store.functions(&scope.tenant).await?))
}

/// Per-run overrides, query parameters of `POST /v1/functions/{name}/runs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunParams {
    /// Answer when the run ends, if it ends within this long (e.g. `30s`, at most 5m):
    /// 200 with the ended run; else 202 with the run as it is.
    wait: Option<String>,
    max_attempts: Option<u32>,
    initial_backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    backoff: Option<Backoff>,
    jitter: Option<bool>,
    retry_traps: Option<bool>,
    /// Overrides the function's priority for this run (lower starts first).
    priority: Option<i32>,
}

impl RunParams {
    fn overrides_retry(&self) -> bool {
        self.max_attempts.is_some()
            || self.initial_backoff_ms.is_some()
            || self.max_backoff_ms.is_some()
            || self.backoff.is_some()
            || self.jitter.is_some()
            || self.retry_traps.is_some()
    }

    /// The function's policy with this run's overrides, checked like a deploy's.
    fn retry(&self, base: RetryPolicy) -> Result<RetryPolicy, ApiError> {
        let p = RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(base.max_attempts),
            initial_backoff_ms: self.initial_backoff_ms.unwrap_or(base.initial_backoff_ms),
            max_backoff_ms: self.max_backoff_ms.unwrap_or(base.max_backoff_ms),
            backoff: self.backoff.unwrap_or(base.backoff),
            jitter: self.jitter.unwrap_or(base.jitter),
            retry_traps: self.retry_traps.unwrap_or(base.retry_traps),
        };
        check_retry(&p)?;
        Ok(p)
    }
}

fn check_retry(p: &RetryPolicy) -> Result<(), ApiError> {
    if !(1..=100).contains(&p.max_attempts) {
        return Err(ApiError::bad_request(
            "bad_settings",
            format!(
                "max_attempts must be between 1 and 100, got {}",
                p.max_attempts
            ),
        ));
    }
    if p.initial_backoff_ms > p.max_backoff_ms {
        return Err(ApiError::bad_request(
            "bad_settings",
            "initial_backoff_ms must not exceed max_backoff_ms",
        ));
    }
    Ok(())
}

async fn create_run(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(name): Path<String>,
    params: Result<Query<RunParams>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    app.guard.admit()?;
    let params = query(params)?;
    let wait = params
        .wait
        .as_deref()
        .map(|w| {
            wasq_core::duration::parse(w)
                .ok()
                .filter(|d| *d <= MAX_WAIT)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_query",
                        format!("wait must be a duration up to 5m, like 30s, got {w:?}"),
                    )
                })
        })
        .transpose()?;
    // Subscribed before the run exists, so its end cannot be missed.
    let finished = app.finished.subscribe();
    let input = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".to_vec()
    } else {
        body.to_vec()
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&input) {
        return Err(ApiError::bad_request(
            "bad_input",
            format!("the run input is not valid JSON: {e}"),
        ));
    }
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 255)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_idempotency_key",
                        "Idempotency-Key must be 1-255 visible ASCII characters",
                    )
                })?;
            Some(key.to_owned())
        }
    };
    if let Some(p) = params.priority {
        flow::check_priority(p).map_err(|m| ApiError::bad_request("bad_query", m))?;
    }
    let retry = if params.overrides_retry() {
        let f = function_or_404(&app, &scope.tenant, &name).await?;
        Some(params.retry(f.settings.retry)?)
    } else {
        None
    };
    let Enqueued { run, created } = app
        .store
        .enqueue(EnqueueRequest {
            tenant: scope.tenant.clone(),
            function: name,
            input,
            trigger: "api".into(),
            due_at: None,
            idempotency_key,
            retry,
            parent: None,
            priority: params.priority,
        })
        .await?;
    if created {
        app.wake.notify_one();
    }
    let location = format!("/v1/runs/{}", run.id);
    if let Some(wait) = wait {
        let (ended, run) = wait_for_end(&app, run, wait, finished).await?;
        let status = if ended {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        return Ok((status, [(header::LOCATION, location)], Json(run)).into_response());
    }
    // 200 with the existing run for a repeated Idempotency-Key, as Stripe answers.
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, [(header::LOCATION, location)], Json(run)).into_response())
}

const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Waits until `run` ends or `wait` passes; (ended, latest state). Ends in this process
/// are announced on `finished`; the store is re-read every 250 ms for ends elsewhere.
async fn wait_for_end(
    app: &App,
    mut run: Run,
    wait: std::time::Duration,
    mut finished: tokio::sync::broadcast::Receiver<RunId>,
) -> Result<(bool, Run), ApiError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if run.status.is_terminal() {
            return Ok((true, run));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok((false, run)),
            _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            id = finished.recv() => {
                if matches!(&id, Ok(id) if *id != run.id) {
                    continue;
                }
            }
        }
        run = app
            .store
            .run(&run.tenant, &run.id)
            .await?
            .map(|d| d.run)
            .ok_or_else(|| ApiError::not_found(format!("run {:?} not found", run.id)))?;
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventBody {
    name: String,
    #[serde(default)]
    data: serde_json::Value,
    /// Deduplication key: the same id within 24 hours is accepted once.
    id: Option<String>,
}

async fn send_event(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    body: Bytes,
) -> Result<Response, ApiError> {
    let event: EventBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "bad_event",
            format!("expected {{\"name\": ..., \"data\": ..., \"id\": ...}}: {e}"),
        )
    })?;
    check_event_name(&event.name)?;
    app.guard.admit()?;
    if event
        .id
        .as_ref()
        .is_some_and(|id| id.is_empty() || id.len() > 255)
    {
        return Err(ApiError::bad_request(
            "bad_event",
            "an event id must be 1-255 characters",
        ));
    }
    let sent = app
        .store
        .send_event(EventRequest {
            tenant: scope.tenant.clone(),
            name: event.name,
            data: event.data,
            id: event.id,
        })
        .await?;
    if !sent.started.is_empty() || !sent.resumed.is_empty() {
        app.wake.notify_one();
    }
    Ok((StatusCode::ACCEPTED, Json(sent)).into_response())
}

//! `PUT /v1/functions/{name}`: a deploy's settings from its query, the upload read within
//! its budget (size, concurrent uploads), checked against the tenant's quotas, compiled
//! and stored.

use super::*;

/// Deploy settings, all optional; query parameters of `PUT /v1/functions/{name}`. A
/// redeploy keeps what is not given (see `redeploy`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    /// Wall-clock limit of one attempt, in ms.
    pub timeout_ms: Option<u64>,
    /// Fuel (roughly, wasm instructions) one attempt may burn.
    pub fuel: Option<u64>,
    /// Linear memory one attempt may grow to.
    pub memory_bytes: Option<u64>,
    /// Attempts in all, the first included.
    pub max_attempts: Option<u32>,
    /// Delay before the second attempt, in ms.
    pub initial_backoff_ms: Option<u64>,
    /// The longest delay between attempts, in ms.
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
    /// Flow control (see `wasq_core::flow`; parsed in `crate::flow_params`). Runs executing at
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
    /// The function a run of this one starts when it ends failed or cancelled (empty:
    /// none).
    pub on_failure: Option<String>,
    /// The queue its runs wait in (default `default`): workers started with `--queues`
    /// take only the queues they name.
    pub queue: Option<String>,
    /// Comma-separated URLs that get a signed POST when a run ends (empty: none; a comma
    /// inside a URL is written `%2C`).
    pub notify: Option<String>,
    /// Also POST when an attempt fails and the run will be retried.
    pub notify_attempts: Option<bool>,
    /// Start from the defaults, not from the function's current settings, events and
    /// schedule.
    pub reset_settings: Option<bool>,
}

impl DeployParams {
    /// The schedule asked for, checked by `crate::cron::check` (limits, and a first tick
    /// within the search horizon) on a blocking thread, since it searches ticks.
    pub(crate) async fn schedule(
        &self,
        now: wasq_core::clock::Millis,
    ) -> Result<Option<Schedule>, ApiError> {
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
        tokio::task::spawn_blocking(move || crate::cron::check(&checked, now))
            .await
            .map_err(|e| StoreError::Internal(format!("checking the schedule failed: {e}")))?
            .map_err(|e| ApiError::bad_request("bad_schedule", e))?;
        Ok(Some(schedule))
    }
}

/// Event names: what users type on command lines and match in filters; the rules guests
/// follow too.
pub(crate) fn check_event_name(name: &str) -> Result<(), ApiError> {
    wasq_core::names::check_event_name(name).map_err(|m| ApiError::bad_request("bad_event", m))
}

impl DeployParams {
    /// `d` (the defaults, or the settings a redeploy keeps) with what is given here.
    pub(crate) fn settings(
        &self,
        d: FunctionSettings,
        max_memory: u64,
    ) -> Result<FunctionSettings, ApiError> {
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
            on_failure: match self.on_failure.as_deref() {
                None => d.on_failure,
                Some("") => None,
                Some(name) => {
                    wasq_core::names::check_function_name(name).map_err(|m| {
                        ApiError::bad_request("bad_settings", format!("on_failure: {m}"))
                    })?;
                    Some(name.to_owned())
                }
            },
            notify: self.notify(d.notify)?,
            queue: match self.queue.as_deref() {
                None => d.queue,
                Some(q) => {
                    wasq_core::queues::check_queue_name(q).map_err(|m| {
                        ApiError::bad_request("bad_settings", format!("queue: {m}"))
                    })?;
                    q.to_owned()
                }
            },
        };
        s.limits
            .validate(max_memory)
            .and_then(|()| s.retry.validate())
            .map_err(|m| ApiError::bad_request("bad_settings", m))?;
        Ok(s)
    }

    /// The webhooks asked for (`notify`, `notify_attempts`), over the kept ones `d`.
    fn notify(
        &self,
        d: wasq_core::notify::NotifySettings,
    ) -> Result<wasq_core::notify::NotifySettings, ApiError> {
        use wasq_core::notify::{MAX_NOTIFY_URLS, check_notify_url_shape};
        let bad = |m: String| ApiError::bad_request("bad_settings", format!("notify: {m}"));
        let urls = match &self.notify {
            None => d.urls,
            Some(list) => {
                let mut urls: Vec<String> = Vec::new();
                for url in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                    check_notify_url_shape(url).map_err(bad)?;
                    wasq_sandbox::check_webhook_url(url).map_err(bad)?;
                    if !urls.iter().any(|u| u == url) {
                        urls.push(url.to_owned());
                    }
                }
                if urls.len() > MAX_NOTIFY_URLS {
                    return Err(bad(format!(
                        "{} URLs given; a function notifies at most {MAX_NOTIFY_URLS}",
                        urls.len()
                    )));
                }
                urls
            }
        };
        Ok(wasq_core::notify::NotifySettings {
            urls,
            attempts: self.notify_attempts.unwrap_or(d.attempts),
        })
    }

    /// The allow-list, each entry checked and normalised, without duplicates.
    pub(crate) fn allow_hosts(&self) -> Result<Vec<String>, ApiError> {
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

#[utoipa::path(
    put,
    path = "/v1/functions/{name}",
    tag = "functions",
    summary = "Deploy a component as a function",
    description = "The body is the component's bytes. A redeploy keeps the function's settings, events and schedule except those given (`reset_settings=true` starts from the defaults) and answers 200 with what changed; a first deploy answers 201. The component is validated and compiled under limits before anything is stored.",
    params(("name" = String, Path, description = "The function's name: 1-64 letters, digits, `-`, `_`, `.`"), DeployParams),
    security(("tenant_key" = [])),
    request_body(content = inline(crate::openapi::Component), content_type = "application/wasm", description = "A WebAssembly component of the `wasq:task` world"),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "Replaced: the function and what changed", body = crate::openapi::Redeployed),
        (status = 201, description = "Created", body = Function),
        (status = 400, description = "`bad_component` (not a component, unsupported features or imports, did not compile within bounds), `bad_settings`, `bad_schedule`, `bad_name`, `bad_event`, `bad_query`, `quota_exceeded` (over the tenant's fuel or memory ceiling)", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: over the upload limit (or the tenant's `max_component_bytes`)", body = crate::error::ErrorBody),
        (status = 503, description = "`busy` (too many uploads at once), `store_full` or `unavailable`", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn deploy(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(name): Path<String>,
    params: Result<Query<DeployParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = upload_body(body, app.config.sandbox.max_component_bytes)?;
    check_name(&name)?;
    app.guard.admit()?;
    let params = query(params)?;
    let existing = app.store.function(&scope.tenant, &name).await?;
    let base = params.base(existing.as_ref());
    let kept_settings = base.map_or_else(FunctionSettings::default, |f| f.settings.clone());
    let settings = params.settings(kept_settings, app.config.sandbox.max_memory_bytes)?;
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
                p.schedule(app.now()).await?
            }
        }
        _ => params.schedule(app.now()).await?,
    };
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "bad_component",
            "the request body is empty: send the component's bytes",
        ));
    }
    let quotas = app
        .store
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
            Some(app.now())
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

pub(crate) fn upload_too_large(max: usize) -> ApiError {
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
pub(crate) async fn upload_budget(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.method() != axum::http::Method::PUT {
        return next.run(req).await;
    }
    let max = app.config.sandbox.max_component_bytes as u64;
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
pub(crate) async fn refuse_declared_oversize(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let max = app.config.sandbox.max_component_bytes;
    if declares_over(&req, max) {
        return upload_too_large(max).into_response();
    }
    next.run(req).await
}

/// Whether the request's Content-Length is over `max` bytes.
pub(crate) fn declares_over(req: &axum::extract::Request, max: usize) -> bool {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > max as u64)
}

/// The body of an upload. `DefaultBodyLimit` stops reading it at the server's limit, so
/// a bigger one without a Content-Length (chunked, a 1 GiB stream) is refused after at
/// most that many bytes, never buffered whole; the tenant's own, smaller quota is checked
/// once the body is in.
pub(crate) fn upload_body(
    body: Result<Bytes, BytesRejection>,
    max: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            upload_too_large(max)
        } else {
            ApiError::bad_request("bad_body", e.body_text())
        }
    })
}

/// The tenant's ceilings on what a function may ask for.
pub(crate) fn check_quotas(
    q: &Quotas,
    settings: &FunctionSettings,
    size: usize,
) -> Result<(), ApiError> {
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

//! `POST /v1/functions/{name}/runs` (with an optional wait for the end) and
//! `POST /v1/events`.

use super::*;

/// Per-run overrides, query parameters of `POST /v1/functions/{name}/runs`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunParams {
    /// Answer when the run ends, if it ends within this long (e.g. `30s`, at most 5m):
    /// 200 with the ended run; else 202 with the run as it is.
    pub(crate) wait: Option<String>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) initial_backoff_ms: Option<u64>,
    pub(crate) max_backoff_ms: Option<u64>,
    pub(crate) backoff: Option<Backoff>,
    pub(crate) jitter: Option<bool>,
    pub(crate) retry_traps: Option<bool>,
    /// Overrides the function's priority for this run (lower starts first).
    pub(crate) priority: Option<i32>,
    /// Start no sooner than this long from now (e.g. `30s`, `2h`).
    pub(crate) delay: Option<String>,
    /// Start no sooner than this time (RFC 3339, e.g. `2026-12-24T18:00:00Z`); a time
    /// already past means now.
    pub(crate) at: Option<String>,
}

impl RunParams {
    /// When the run is due, if it asked to start later: `?delay=` or `?at=`, not both,
    /// within [`lifecycle::MAX_START_DELAY_MS`].
    pub(crate) fn start_at(&self, now: clock::Millis) -> Result<Option<clock::Millis>, ApiError> {
        let bad = |m: String| ApiError::bad_request("bad_query", m);
        let at = match (&self.delay, &self.at) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(bad("give delay or at, not both".into()));
            }
            (Some(d), None) => {
                let d = wasq_core::duration::parse(d).map_err(|e| {
                    bad(format!(
                        "delay must be a duration like 30s or 2h, got {d:?}: {e}"
                    ))
                })?;
                now.saturating_add(
                    clock::Millis::try_from(d.as_millis()).unwrap_or(clock::Millis::MAX),
                )
            }
            (None, Some(t)) => chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| {
                    bad(format!(
                        "at must be an RFC 3339 time like 2026-12-24T18:00:00Z, got {t:?}: {e}"
                    ))
                })?
                .timestamp_millis(),
        };
        lifecycle::requested_start(at, now).map(Some).map_err(bad)
    }

    pub(crate) fn overrides_retry(&self) -> bool {
        self.max_attempts.is_some()
            || self.initial_backoff_ms.is_some()
            || self.max_backoff_ms.is_some()
            || self.backoff.is_some()
            || self.jitter.is_some()
            || self.retry_traps.is_some()
    }

    /// The function's policy with this run's overrides, checked like a deploy's.
    pub(crate) fn retry(&self, base: RetryPolicy) -> Result<RetryPolicy, ApiError> {
        let p = RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(base.max_attempts),
            initial_backoff_ms: self.initial_backoff_ms.unwrap_or(base.initial_backoff_ms),
            max_backoff_ms: self.max_backoff_ms.unwrap_or(base.max_backoff_ms),
            backoff: self.backoff.unwrap_or(base.backoff),
            jitter: self.jitter.unwrap_or(base.jitter),
            retry_traps: self.retry_traps.unwrap_or(base.retry_traps),
        };
        p.validate()
            .map_err(|m| ApiError::bad_request("bad_settings", m))?;
        Ok(p)
    }
}

#[utoipa::path(
    post,
    path = "/v1/functions/{name}/runs",
    tag = "runs",
    summary = "Start a run of a function",
    description = "The body is the run's JSON input (empty: `{}`). 201 with the run, `queued` (its `due_at` is when it may start), or `skipped` when the function's rate limit dropped it (a record, not an error). The retry parameters override the function's policy for this run.",
    params(
        ("name" = String, Path, description = "The function's name"),
        RunParams,
        ("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters: a repeat within 24 h answers 200 with the first run"),
    ),
    security(("tenant_key" = [])),
    request_body(content = serde_json::Value, content_type = "application/json", description = "The run's input: any JSON value"),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "With `wait`: the run ended in time, with its output. Without: an earlier run of this `Idempotency-Key`", body = Run, headers(("Location" = String, description = "`/v1/runs/{id}`"))),
        (status = 201, description = "The run", body = Run, headers(("Location" = String, description = "`/v1/runs/{id}`"))),
        (status = 202, description = "With `wait`: the run had not ended in time; as it is", body = Run, headers(("Location" = String, description = "`/v1/runs/{id}`"))),
        (status = 400, description = "`bad_input` (not JSON), `bad_query`, `bad_settings`, `bad_name`, `bad_idempotency_key`", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no function of this name", body = crate::error::ErrorBody),
        (status = 429, description = "`quota_exceeded`: the tenant has `max_queued` runs queued", body = crate::error::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "`store_full`: the store guard refuses new work; or `unavailable`: the store is unreachable. Nothing was created", body = crate::error::ErrorBody),
        (status = 507, description = "`storage_quota`: the tenant is at its `max_stored_bytes`", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn create_run(
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
    // Subscribed before the run exists, so its end cannot be missed; only by a request
    // that waits (a receiver costs the channel's lock twice and its drop a walk over what
    // was sent meanwhile).
    let finished = wait.map(|_| app.finished.subscribe());
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
    let idempotency_key = headers
        .get("idempotency-key")
        .map(|v| idempotency_key(v.to_str().ok()))
        .transpose()?;
    if let Some(p) = params.priority {
        flow::check_priority(p).map_err(|m| ApiError::bad_request("bad_query", m))?;
    }
    let due_at = params.start_at(app.now())?;
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
            due_at,
            idempotency_key,
            retry,
            parent: None,
            priority: params.priority,
            // The request span's context (or the client's header, when spans are not
            // exported): every attempt of the run continues that trace.
            trace: crate::telemetry::current_or(|| crate::telemetry::incoming(&headers)),
        })
        .await?;
    if created {
        app.wake.notify_one();
    }
    let location = format!("/v1/runs/{}", run.id);
    if let (Some(wait), Some(finished)) = (wait, finished) {
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

/// An idempotency key as given (`None`: not visible ASCII), checked.
pub(crate) fn idempotency_key(key: Option<&str>) -> Result<String, ApiError> {
    key.filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| (b' '..=b'~').contains(&b)))
        .map(str::to_owned)
        .ok_or_else(|| {
            ApiError::bad_request(
                "bad_idempotency_key",
                "an idempotency key must be 1-255 visible ASCII characters",
            )
        })
}

pub(crate) const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Waits until `run` ends or `wait` passes; (ended, latest state). Ends in this process
/// are announced on `finished`; the store is re-read every 250 ms for ends elsewhere.
pub(crate) async fn wait_for_end(
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventBody {
    /// 1-128 letters, digits, `-`, `_`, `.`, `:`, `/`.
    #[schema(example = "user.signup")]
    pub(crate) name: String,
    /// Any JSON: the input of the runs it starts, what waiting runs receive.
    #[serde(default)]
    pub(crate) data: serde_json::Value,
    /// Deduplication key: the same id within 24 hours is accepted once.
    pub(crate) id: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/events",
    tag = "events",
    summary = "Send an event",
    description = "Starts the functions subscribed to it and resumes runs waiting for it.",
    security(("tenant_key" = [])),
    request_body = EventBody,
    responses(
        crate::openapi::TenantRefusals,
        (status = 202, description = "The runs it started and resumed (`accepted: false`: its id was seen before)", body = EventSent),
        (status = 400, description = "`bad_event`: not that shape, a bad name or id", body = crate::error::ErrorBody),
        (status = 429, description = "`quota_exceeded`: the runs it would start do not fit under `max_queued`; nothing recorded", body = crate::error::ErrorBody),
        (status = 503, description = "`store_full`: the store guard refuses new work; or `unavailable`: the store is unreachable", body = crate::error::ErrorBody),
        (status = 507, description = "`storage_quota`: they do not fit in `max_stored_bytes`", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn send_event(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    headers: HeaderMap,
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
            // The runs it starts continue the request's trace.
            trace: crate::telemetry::current_or(|| crate::telemetry::incoming(&headers)),
        })
        .await?;
    if !sent.started.is_empty() || !sent.resumed.is_empty() {
        app.wake.notify_one();
    }
    Ok((StatusCode::ACCEPTED, Json(sent)).into_response())
}

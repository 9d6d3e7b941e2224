//! `POST /v1/functions/{name}/runs` (with an optional wait for the end) and
//! `POST /v1/events`.

use super::*;

/// Per-run overrides, query parameters of `POST /v1/functions/{name}/runs`.
#[derive(Debug, Default, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventBody {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) data: serde_json::Value,
    /// Deduplication key: the same id within 24 hours is accepted once.
    pub(crate) id: Option<String>,
}

pub(crate) async fn send_event(
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

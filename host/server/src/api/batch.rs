//! `POST /v1/functions/{name}/runs:batch`: up to [`MAX_BATCH`] runs of one function in one
//! request and one store call (`Queue::enqueue_batch`), all or nothing — BullMQ's
//! `addBulk`, RQ's `enqueue_many`, Celery's `group`.

use super::*;

/// The most bytes a batch's body may have: 1,000 inputs of 8 KiB each, and their
/// fields. A bigger body is refused (413) before it is read whole, and before any of it
/// is read when its Content-Length says so.
pub(crate) const MAX_BATCH_BODY: usize = 8 << 20;

fn batch_too_large() -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "too_large",
        message: format!(
            "a batch's body is at most {} MiB: split it",
            MAX_BATCH_BODY >> 20
        ),
        retry_after_ms: None,
    }
}

/// A batch whose Content-Length is over [`MAX_BATCH_BODY`] is refused unread.
pub(crate) async fn refuse_declared_oversize(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if declares_over(&req, MAX_BATCH_BODY) {
        return batch_too_large().into_response();
    }
    next.run(req).await
}

/// Up to 1,000 runs of one function.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Batch {
    runs: Vec<BatchRun>,
}

/// One run of a batch: what a single create takes as its body, header and query.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchRun {
    /// The run's input (default `{}`).
    input: Option<serde_json::Value>,
    /// As the `Idempotency-Key` header of a single create.
    idempotency_key: Option<String>,
    /// As `?delay=` of a single create.
    delay: Option<String>,
    /// As `?at=` of a single create.
    at: Option<String>,
    priority: Option<i32>,
}

#[utoipa::path(
    post,
    path = "/v1/functions/{name}/runs:batch",
    tag = "runs",
    summary = "Start up to 1,000 runs of a function at once",
    description = "All or nothing, in one store call; every run counts against `max_queued`.",
    params(("name" = String, Path, description = "The function's name")),
    security(("tenant_key" = [])),
    request_body = Batch,
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "None was created: every idempotency key was seen before", body = crate::openapi::BatchCreated),
        (status = 201, description = "The runs, in order", body = crate::openapi::BatchCreated),
        (status = 400, description = "`bad_batch` (0 or over 1,000 runs), `bad_input` (not that shape), `bad_name`, or a single create's code for a bad field, naming the run (`runs[3]: ...`)", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no function of this name", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: over 8 MiB of body", body = crate::error::ErrorBody),
        (status = 429, description = "`quota_exceeded`: the batch does not fit under `max_queued`; none is created (see `Retry-After`)", body = crate::error::ErrorBody),
        (status = 503, description = "`store_full`: the store guard refuses new work; or `unavailable`: the store is unreachable", body = crate::error::ErrorBody),
        (status = 507, description = "`storage_quota`: the tenant is at its `max_stored_bytes`", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn create_runs(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    app.guard.admit()?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            batch_too_large()
        } else {
            ApiError::bad_request("bad_body", e.body_text())
        }
    })?;
    let batch: Batch = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "bad_input",
            format!("the body must be {{\"runs\": [{{\"input\": ...}}, ...]}}: {e}"),
        )
    })?;
    if batch.runs.is_empty() || batch.runs.len() > MAX_BATCH {
        return Err(ApiError::bad_request(
            "bad_batch",
            format!(
                "a batch holds 1 to {MAX_BATCH} runs, this one {}",
                batch.runs.len()
            ),
        ));
    }
    let now = app.now();
    // Every run of the batch continues the request's trace.
    let trace = crate::telemetry::current_or(|| crate::telemetry::incoming(&headers));
    let reqs = batch
        .runs
        .into_iter()
        .enumerate()
        .map(|(i, run)| {
            let which = |e: ApiError| ApiError {
                message: format!("runs[{i}]: {}", e.message),
                ..e
            };
            let idempotency_key = run
                .idempotency_key
                .as_deref()
                .map(|k| idempotency_key(Some(k)))
                .transpose()
                .map_err(which)?;
            if let Some(p) = run.priority {
                flow::check_priority(p)
                    .map_err(|m| which(ApiError::bad_request("bad_batch", m)))?;
            }
            let when = RunParams {
                delay: run.delay,
                at: run.at,
                ..RunParams::default()
            };
            let due_at = when.start_at(now).map_err(which)?;
            let input = run
                .input
                .map_or_else(|| b"{}".to_vec(), |v| v.to_string().into_bytes());
            Ok(EnqueueRequest {
                tenant: scope.tenant.clone(),
                function: name.clone(),
                input,
                trigger: "api".into(),
                due_at,
                idempotency_key,
                retry: None,
                parent: None,
                priority: run.priority,
                trace: trace.clone(),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let made = app.store.enqueue_batch(reqs).await?;
    let created = made.iter().filter(|e| e.created).count();
    if created > 0 {
        app.wake.notify_one();
    }
    let status = if created > 0 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let runs: Vec<Run> = made.into_iter().map(|e| e.run).collect();
    let answer = serde_json::json!({ "created": created, "runs": runs });
    Ok((status, Json(answer)).into_response())
}

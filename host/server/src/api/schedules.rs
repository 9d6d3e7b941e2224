//! Schedules: the cron list with next fire times, and pause / resume / run now.

use super::*;

/// A function's schedule as `wasq cron list` shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ScheduleView {
    pub(crate) function: String,
    pub(crate) cron: String,
    pub(crate) tz: String,
    pub(crate) missed: Missed,
    pub(crate) paused: bool,
    /// The next five ticks, Unix ms.
    pub(crate) next: Vec<i64>,
}

/// Tick searches one `GET /v1/schedules` may spend; past it, the remaining schedules are
/// listed without their next ticks.
pub(crate) const LIST_SCHEDULES_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

#[utoipa::path(
    get,
    path = "/v1/schedules",
    tag = "schedules",
    summary = "Every cron expression of the tenant's functions, with its next five ticks",
    description = "Fewer ticks when it has none within 8 years; none when paused or when the request's 500 ms of tick searching ran out.",
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "One entry per cron expression", body = Vec<ScheduleView>),
    ),
)]
pub(crate) async fn list_schedules(
    State(app): State<Arc<App>>,
    scope: TenantScope,
) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    let scheduled = app.store.schedules(&scope.tenant).await?;
    // Searching ticks is CPU work: on a blocking thread, within a budget.
    let views = tokio::task::spawn_blocking(move || {
        let now = app.now();
        let deadline = std::time::Instant::now() + LIST_SCHEDULES_BUDGET;
        let mut out = vec![];
        for Scheduled {
            function,
            schedule: s,
        } in scheduled
        {
            for entry in crate::cron::entries(&s).0 {
                let next = if s.paused || std::time::Instant::now() >= deadline {
                    vec![]
                } else {
                    entry.upcoming(now, 5)
                };
                out.push(ScheduleView {
                    function: function.clone(),
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
#[utoipa::path(
    post,
    path = "/v1/functions/{name}/schedule/{action}",
    tag = "schedules",
    summary = "Pause or resume a function's schedule, or start one run now",
    description = "Ticks missed while paused follow the function's `missed` policy. Pausing a paused schedule or resuming an active one changes nothing. Audited once it succeeded.",
    params(
        ("name" = String, Path, description = "The function's name"),
        ("action" = crate::openapi::ScheduleAction, Path, description = "`pause`, `resume` or `run-now`"),
    ),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "`pause`, `resume`: the function", body = Function),
        (status = 201, description = "`run-now`: the run", body = Run),
        (status = 404, description = "`not_found`: another action (checked first), or no function of this name", body = crate::error::ErrorBody),
        (status = 409, description = "`conflict`: the function has no schedule", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn schedule_action(
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
                trace: crate::telemetry::current_or(|| None),
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
                schedule.resumed_at = Some(app.now());
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

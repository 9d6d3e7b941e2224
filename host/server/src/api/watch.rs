//! `GET /v1/runs/{id}/events`: a run's life as Server-Sent Events, until it ends.
//!
//! The stream is read from the store, not from this process's memory: every 100 ms (and
//! at once when the run ends in this process) the server reads what the run recorded since
//! the last read, so a worker on another machine reaches a client of any API server.
//! Events, in the order the run recorded them:
//! - `status`: `{"status", "attempt", "due_at", "updated_at", "wait"}`, first `queued`, then
//!   each waiting state seen (`queued` again for a retry, `sleeping`, `waiting`);
//! - `attempt`: an execution started (`{"attempt", "worker", "started_at"}`) and, when it
//!   ended, `attempt_end` (`{"attempt", "finished_at", "error", "suspended_until"}`);
//! - `step`: a completed step, without its output (`StepInfo`);
//! - `progress`: `{"percent", "message"}` when it changed;
//! - `log`: a log line;
//! - `end`: the ended run, after everything it recorded; then the stream closes.
//!
//! Each event's id is a cursor `E.S.L` (execution events, steps and log lines sent so
//! far): a client that reconnects with `Last-Event-ID` gets what followed, with nothing
//! missed or repeated, and the current status and progress first. What the store keeps
//! bounds what can be replayed: the latest 100 executions of a run.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use serde_json::json;

use super::*;

/// How often a stream reads the run.
const POLL: Duration = Duration::from_millis(100);
/// Lines or steps read per page.
const PAGE: usize = 1000;

/// Where a stream is: what it sent so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Cursor {
    /// Execution events: an execution's start, then its end (2 per ended execution).
    executions: u64,
    steps: usize,
    logs: usize,
}

impl Cursor {
    fn id(&self) -> String {
        format!("{}.{}.{}", self.executions, self.steps, self.logs)
    }

    fn parse(s: &str) -> Option<Cursor> {
        let mut parts = s.trim().split('.').map(str::parse::<u64>);
        let (Some(Ok(e)), Some(Ok(s)), Some(Ok(l)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Cursor {
            executions: e,
            steps: usize::try_from(s).ok()?,
            logs: usize::try_from(l).ok()?,
        })
    }
}

/// Event streams open per tenant.
#[derive(Default)]
pub(crate) struct Streams(std::sync::Mutex<std::collections::HashMap<String, usize>>);

/// One open stream of a tenant; closing it (the client went, the run ended) gives the
/// room back.
pub(super) struct Opened {
    app: Arc<App>,
    tenant: String,
}

impl Streams {
    pub(super) fn open(app: &Arc<App>, tenant: &str) -> Result<Opened, ApiError> {
        let max = app.config.http.max_event_streams_per_tenant;
        let mut open = app.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(tenant.to_owned()).or_default();
        if *n >= max {
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "too_many_streams",
                message: format!(
                    "tenant {tenant:?} has {max} run event streams open on this server, its most: close one first"
                ),
                retry_after_ms: Some(1000),
            });
        }
        *n += 1;
        Ok(Opened {
            app: app.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let mut open = self.app.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

struct Watch {
    _opened: Opened,
    app: Arc<App>,
    tenant: String,
    id: String,
    cursor: Cursor,
    /// The last status and progress sent (`None`: none yet).
    status: Option<(RunStatus, u32)>,
    progress: Option<Option<Progress>>,
    pending: VecDeque<Event>,
    first: bool,
    done: bool,
}

impl Watch {
    fn event(&self, kind: &str, data: serde_json::Value) -> Event {
        Event::default()
            .event(kind)
            .id(self.cursor.id())
            .data(data.to_string())
    }

    /// Reads the run and queues what it recorded since the last read, in the order it was
    /// recorded (executions, steps and log lines merged by time, each in its own order).
    async fn read(&mut self) -> Result<(), StoreError> {
        let Some(detail) = self.app.store.run(&self.tenant, &self.id).await? else {
            self.done = true;
            return Ok(());
        };
        let run = &detail.run;
        if self.first && run.status != RunStatus::Skipped {
            // When it was first due: its due time until an attempt started.
            let due_at = if run.attempt == 0 {
                run.due_at
            } else {
                run.created_at
            };
            let queued = json!({
                "status": "queued",
                "attempt": 0,
                "due_at": due_at,
                "updated_at": run.created_at,
            });
            self.pending.push_back(self.event("status", queued));
            self.status = Some((RunStatus::Queued, 0));
        }
        self.first = false;

        // What is new of each kind, oldest first: (time, kind, event data).
        let mut executions = VecDeque::new();
        // The listed executions are the latest of `attempts_total`; a cursor before them
        // starts at the first listed.
        let skipped = detail
            .attempts_total
            .saturating_sub(detail.attempts.len() as u64);
        let mut next = self.cursor.executions.max(2 * skipped);
        for (i, a) in detail.attempts.iter().enumerate() {
            let k = skipped + i as u64;
            if next == 2 * k {
                next += 1;
                let data =
                    json!({ "attempt": a.number, "worker": a.worker, "started_at": a.started_at });
                executions.push_back((a.started_at, "attempt", data));
            }
            if let Some(at) = a.finished_at
                && next == 2 * k + 1
            {
                next += 1;
                let data = json!({
                    "attempt": a.number,
                    "finished_at": at,
                    "error": a.error,
                    "suspended_until": a.suspended_until,
                });
                executions.push_back((at, "attempt_end", data));
            }
        }
        self.cursor.executions = self.cursor.executions.max(2 * skipped);
        let mut steps = VecDeque::new();
        if detail.steps_total as usize > self.cursor.steps {
            let new = if self.cursor.steps < detail.steps.len() {
                detail.steps[self.cursor.steps..].to_vec()
            } else {
                let store = &self.app.store;
                store
                    .steps(&self.tenant, &self.id, self.cursor.steps, PAGE)
                    .await?
            };
            for step in new {
                let data = serde_json::to_value(&step).unwrap_or_default();
                steps.push_back((step.completed_at, "step", data));
            }
        }
        let mut logs = VecDeque::new();
        loop {
            let skip = self.cursor.logs + logs.len();
            let page = self
                .app
                .store
                .logs(&self.tenant, &self.id, skip, PAGE)
                .await?;
            let full = page.len() == PAGE;
            for line in page {
                let data = serde_json::to_value(&line).unwrap_or_default();
                logs.push_back((line.at, "log", data));
            }
            if !full {
                break;
            }
        }
        // Merge: the earliest head first; at the same millisecond an execution's start,
        // then steps, then log lines, then its end.
        let rank = |kind: &str| match kind {
            "attempt" => 0,
            "step" => 1,
            "log" => 2,
            _ => 3,
        };
        loop {
            let heads = [executions.front(), steps.front(), logs.front()];
            let Some(pick) = (0..3)
                .filter(|&i| heads[i].is_some())
                .min_by_key(|&i| heads[i].map(|(at, kind, _)| (*at, rank(kind))))
            else {
                break;
            };
            let (_, kind, data) = match pick {
                0 => executions.pop_front(),
                1 => steps.pop_front(),
                _ => logs.pop_front(),
            }
            .expect("picked a head");
            match kind {
                "step" => self.cursor.steps += 1,
                "log" => self.cursor.logs += 1,
                _ => self.cursor.executions += 1,
            }
            self.pending.push_back(self.event(kind, data));
        }

        if self.progress.as_ref() != Some(&run.progress) {
            self.progress = Some(run.progress.clone());
            if let Some(p) = &run.progress {
                let data = json!({ "percent": p.percent, "message": p.message });
                self.pending.push_back(self.event("progress", data));
            }
        }
        let now = (run.status, run.attempt);
        if run.status.is_terminal() {
            // Everything it recorded was read above, after it ended: the last event.
            let data = serde_json::to_value(run).unwrap_or_default();
            self.pending.push_back(self.event("end", data));
            self.done = true;
        } else if run.status != RunStatus::Running && self.status != Some(now) {
            let data = json!({
                "status": run.status,
                "attempt": run.attempt,
                "due_at": run.due_at,
                "updated_at": run.updated_at,
                "wait": run.wait,
            });
            self.pending.push_back(self.event("status", data));
        }
        self.status = Some(now);
        Ok(())
    }

    async fn next(mut self) -> Option<(Result<Event, Infallible>, Watch)> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some((Ok(e), self));
            }
            if self.done {
                return None;
            }
            if !self.first {
                let mut ended = self.app.finished.subscribe();
                let id = self.id.clone();
                let wait = tokio::time::timeout(POLL, async move {
                    while let Ok(done) = ended.recv().await {
                        if done == id {
                            break;
                        }
                    }
                });
                tokio::select! {
                    _ = wait => {}
                    // The server is stopping: the client reconnects (to another server)
                    // with its Last-Event-ID and loses nothing.
                    () = self.app.shutdown.cancelled() => return None,
                }
            }
            if let Err(e) = self.read().await {
                // The client reconnects with its Last-Event-ID and loses nothing.
                tracing::debug!(run = %self.id, error = %e, "run events: store read failed");
                let data = json!({ "error": e.to_string() });
                self.pending.push_back(self.event("error", data));
                self.done = true;
            }
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/runs/{id}/events",
    tag = "runs",
    summary = "A run's life as Server-Sent Events, until it ends",
    description = "Events `status`, `attempt`, `attempt_end`, `step`, `progress`, `log` in the order recorded, and last `end` with the run; then the stream closes. Read from the store every 100 ms, so a worker on another machine reaches any API server's stream. Each event's id is a cursor: reconnecting with `Last-Event-ID` resumes after it. A keep-alive comment every 15 s. A tenant holds at most 64 streams open on one server.",
    params(
        ("id" = String, Path, description = "A run id, or a unique prefix of one"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (an id the stream sent, like `4.2.17`)"),
    ),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The stream", body = String, content_type = "text/event-stream"),
        (status = 400, description = "`ambiguous_id`, or `bad_event_id`: a Last-Event-ID this stream did not send", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such run", body = crate::error::ErrorBody),
        (status = 429, description = "`too_many_streams`: the tenant has 64 streams open on this server", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn run_events(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = super::actions::resolve(&app, &scope.tenant, &id).await?;
    if app.store.run(&scope.tenant, &id).await?.is_none() {
        return Err(ApiError::not_found(format!("run {id:?} not found")));
    }
    let cursor = match headers.get("last-event-id") {
        None => Cursor::default(),
        Some(v) => v.to_str().ok().and_then(Cursor::parse).ok_or_else(|| {
            ApiError::bad_request(
                "bad_event_id",
                "Last-Event-ID must be an id this stream sent, like 4.2.17",
            )
        })?,
    };
    let resumed = cursor != Cursor::default();
    let watch = Watch {
        _opened: Streams::open(&app, &scope.tenant)?,
        app,
        tenant: scope.tenant,
        id,
        cursor,
        status: None,
        progress: None,
        pending: VecDeque::new(),
        first: !resumed,
        done: false,
    };
    let stream = futures_util::stream::unfold(watch, Watch::next);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

//! `GET /v1/runs:events?function=&status=`: every status change of the tenant's runs as
//! Server-Sent Events (BullMQ's `QueueEvents`), read from the store's tenant feed
//! (`wasq_core::feed`), so changes made by workers anywhere reach any API server.
//!
//! The stream keeps the feed recorded while it is open (renewing `listen_feed`), reads it
//! every 250 ms and sends each change that passes its filters as an event `run`:
//! `{"id", "function", "status", "attempt", "at"}`. Its id is the feed's cursor: a client
//! that reconnects with `Last-Event-ID` within 30 s (the feed stays recorded that long)
//! and within the last 10,000 changes misses none. A stream opened without one starts
//! from now. It counts against the tenant's event streams on this server.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use wasq_core::feed::{FEED_LISTEN_MS, FeedEntry, MAX_FEED_PAGE, is_cursor};

use super::watch::Opened;
use super::*;

/// How often a stream reads the feed.
const POLL: Duration = Duration::from_millis(250);
/// How often a stream renews the feed's recording (a third of how long one renewal lasts).
const RENEW_EVERY_MS: i64 = FEED_LISTEN_MS / 3;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filters {
    /// Only this function's runs.
    function: Option<String>,
    /// Only changes to this status (`queued`, `running`, ..., `skipped`).
    status: Option<String>,
}

struct Follow {
    _opened: Opened,
    app: Arc<App>,
    tenant: String,
    function: Option<String>,
    status: Option<RunStatus>,
    cursor: String,
    renewed_at: i64,
    pending: std::collections::VecDeque<FeedEntry>,
    /// A read failed: the stream ends after saying so (the client reconnects with its
    /// Last-Event-ID and loses nothing).
    done: bool,
}

impl Follow {
    fn wanted(&self, e: &FeedEntry) -> bool {
        self.function.as_ref().is_none_or(|f| *f == e.function)
            && self.status.is_none_or(|s| s == e.status)
    }

    async fn read(&mut self) -> Result<(), StoreError> {
        let now = self.app.now();
        if now - self.renewed_at >= RENEW_EVERY_MS {
            self.app
                .store
                .listen_feed(&self.tenant, now + FEED_LISTEN_MS)
                .await?;
            self.renewed_at = now;
        }
        let page = self
            .app
            .store
            .feed(&self.tenant, Some(&self.cursor), MAX_FEED_PAGE)
            .await?;
        self.cursor = page.next;
        for e in page.entries {
            if self.wanted(&e) {
                self.pending.push_back(e);
            }
        }
        Ok(())
    }

    async fn next(mut self) -> Option<(Result<Event, Infallible>, Follow)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(e) = self.pending.pop_front() {
                let data = serde_json::json!({
                    "id": e.run_id,
                    "function": e.function,
                    "status": e.status,
                    "attempt": e.attempt,
                    "at": e.at,
                });
                let event = Event::default()
                    .event("run")
                    .id(e.cursor)
                    .data(data.to_string());
                return Some((Ok(event), self));
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                // The server is stopping: the client reconnects (to another server) with
                // its Last-Event-ID and loses nothing.
                () = self.app.shutdown.cancelled() => return None,
            }
            if let Err(e) = self.read().await {
                tracing::debug!(tenant = %self.tenant, error = %e, "tenant events: store read failed");
                self.done = true;
                let data = serde_json::json!({ "error": e.to_string() });
                let event = Event::default().event("error").data(data.to_string());
                return Some((Ok(event), self));
            }
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/runs:events",
    tag = "runs",
    operation_id = "follow_runs",
    summary = "Every status change of the tenant's runs, as Server-Sent Events",
    description = "Events `run`: `{\"id\", \"function\", \"status\", \"attempt\", \"at\"}`, from when the stream opens, in the order the store made them, from any process. Each event's id is a cursor: reconnecting within 30 s with `Last-Event-ID` misses nothing. A keep-alive comment every 15 s. Counts against the tenant's 64 streams per server.",
    params(
        Filters,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (an id the stream sent)"),
    ),
    security(("tenant_key" = [])),
    responses(
        crate::openapi::TenantRefusals,
        (status = 200, description = "The stream", body = String, content_type = "text/event-stream"),
        (status = 400, description = "`bad_query`, `bad_name` (a bad filter), `bad_event_id` (a malformed Last-Event-ID)", body = crate::error::ErrorBody),
        (status = 429, description = "`too_many_streams`: the tenant has 64 streams open on this server", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn stream(
    State(app): State<Arc<App>>,
    scope: TenantScope,
    params: Result<Query<Filters>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let filters = query(params)?;
    if let Some(f) = &filters.function {
        check_name(f)?;
    }
    let status = match &filters.status {
        None => None,
        Some(s) => Some(
            s.parse::<RunStatus>()
                .map_err(|e| ApiError::bad_request("bad_query", format!("status: {e}")))?,
        ),
    };
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .filter(|c| is_cursor(c))
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_event_id",
                        "Last-Event-ID must be an id this stream sent",
                    )
                })?
                .to_owned(),
        ),
    };
    let opened = super::watch::Streams::open(&app, &scope.tenant)?;
    let now = app.now();
    app.store
        .listen_feed(&scope.tenant, now + FEED_LISTEN_MS)
        .await?;
    let cursor = match resume {
        Some(c) => c,
        None => app.store.feed(&scope.tenant, None, 0).await?.next,
    };
    let follow = Follow {
        _opened: opened,
        app,
        tenant: scope.tenant,
        function: filters.function,
        status,
        cursor,
        renewed_at: now,
        pending: Default::default(),
        done: false,
    };
    let stream = futures_util::stream::unfold(follow, Follow::next);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

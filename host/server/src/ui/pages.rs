//! The dashboard's handlers: each reads through the API as the signed-in key (see
//! `ui.rs`) and renders a `wasq_ui` page. Actions are form posts that check the CSRF
//! token, call the API, and redirect back with a fixed notice (never echoed text).

use std::sync::Arc;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use wasq_core::{AuditEntry, Function, LogLine, Run, RunDetail};
use wasq_ui::pages::{self as page, Health, RunFilter};

use super::{Session, html, page_error};
use crate::App;
use crate::auth::Caller;

/// Runs per page of the list.
const PAGE: usize = 50;
/// Runs the last hour's figures are computed from at most (the listing's bound).
const RECENT: usize = 1000;
const HOUR_MS: i64 = 3_600_000;

#[derive(Debug, Deserialize)]
pub(super) struct Done {
    done: Option<String>,
}

/// What an action's redirect says, by the action's name.
fn notice(done: Option<&str>) -> Option<&'static str> {
    Some(match done? {
        "retry" => "Queued again: the run will retry with a fresh budget of attempts.",
        "cancel" => "Cancelled.",
        "pause" => "Schedule paused.",
        "resume" => "Schedule resumed.",
        "run-now" => "Started one run now.",
        _ => return None,
    })
}

pub(super) async fn home(session: Session) -> Redirect {
    match session.caller {
        Caller::Admin => Redirect::to("/ui/tenants"),
        Caller::Tenant { .. } => Redirect::to("/ui/runs"),
    }
}

pub(super) async fn login_form() -> Response {
    html(page::Login { error: None })
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    key: String,
}

pub(super) async fn login(
    State(app): State<Arc<App>>,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let key = form
        .map(|Form(f)| f.key.trim().to_owned())
        .unwrap_or_default();
    let refused = |message: &str| {
        let mut resp = html(page::Login {
            error: Some(message.to_owned()),
        });
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        resp
    };
    // A key is ~50 ASCII characters; anything else cannot be one (and must not become a
    // cookie header).
    if key.is_empty() || key.len() > 200 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return refused("Enter an API key (wasq_…).");
    }
    match crate::auth::caller_for_key(&app, &key).await {
        Ok(_) => {}
        Err(resp) if resp.status() == StatusCode::UNAUTHORIZED => {
            return refused("That key is not valid: it is unknown, malformed or revoked.");
        }
        Err(resp) => {
            return page_error(
                None,
                resp.status(),
                "the store cannot be reached: try again",
            );
        }
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, super::session_cookie(&key)),
            (header::LOCATION, "/ui".to_owned()),
        ],
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// The CSRF check of every action: the form's token must be the session's.
fn checked(session: &Session, form: Result<Form<CsrfForm>, FormRejection>) -> Option<Response> {
    let token = form.map(|Form(f)| f.csrf).unwrap_or_default();
    (!session.csrf_ok(&token)).then(|| {
        page_error(
            Some(session.layout("")),
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page and try again",
        )
    })
}

pub(super) async fn logout(
    session: Session,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if let Some(refused) = checked(&session, form) {
        return refused;
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, super::cleared_cookie()),
            (header::LOCATION, "/ui/login".to_owned()),
        ],
    )
        .into_response()
}

/// Pages of tenants' runs: the operator key has none.
fn tenant_only(session: &Session) -> Option<Response> {
    session
        .tenant()
        .is_none()
        .then(|| Redirect::to("/ui/tenants").into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct RunsParams {
    function: Option<String>,
    status: Option<String>,
    since: Option<String>,
    until: Option<String>,
    q: Option<String>,
    before: Option<String>,
}

fn query_string(pairs: &[(&str, &str)]) -> String {
    let kept: Vec<_> = pairs.iter().filter(|(_, v)| !v.is_empty()).collect();
    serde_urlencoded::to_string(kept).unwrap_or_default()
}

pub(super) async fn runs(
    session: Session,
    params: Result<Query<RunsParams>, QueryRejection>,
) -> Response {
    if let Some(r) = tenant_only(&session) {
        return r;
    }
    let p = params.map(|Query(p)| p).unwrap_or_default();
    let text = |v: &Option<String>| v.as_deref().unwrap_or("").trim().to_owned();
    let filter = RunFilter {
        function: text(&p.function),
        status: text(&p.status),
        since: text(&p.since),
        until: text(&p.until),
        q: text(&p.q),
    };
    // An id or prefix: the run itself, when it names one.
    let mut not_found = None;
    if !filter.q.is_empty() {
        match session.get::<RunDetail>(&run_path(&filter.q)).await {
            Ok(d) => return Redirect::to(&format!("/ui/runs/{}", d.run.id)).into_response(),
            Err(e) if e.status.is_server_error() => return session.refused(e),
            // Not found, or a prefix of several runs (the message lists them).
            Err(e) => not_found = Some(e.message),
        }
    }
    let functions: Vec<Function> = session.get("/v1/functions").await.unwrap_or_default();
    let before = text(&p.before);
    let own = [
        ("function", filter.function.as_str()),
        ("status", filter.status.as_str()),
        ("since", filter.since.as_str()),
        ("until", filter.until.as_str()),
    ];
    let here = format!("/ui/runs?{}", query_string(&own));
    let mut view = page::Runs::new(
        session.layout("runs"),
        filter.clone(),
        functions.into_iter().map(|f| f.name).collect(),
        here,
    );
    if let Some(message) = not_found {
        view.error = Some(wasq_core::text::escape_line(&message, 1000));
        return html(view);
    }
    let since = wasq_ui::datetime_local_to_rfc3339(&filter.since).unwrap_or_default();
    let until = wasq_ui::datetime_local_to_rfc3339(&filter.until).unwrap_or_default();
    let limit = PAGE.to_string();
    let api_query = query_string(&[
        ("function", &filter.function),
        ("status", &filter.status),
        ("since", &since),
        ("until", &until),
        ("before", &before),
        ("limit", &limit),
    ]);
    match session
        .get::<Vec<Run>>(&format!("/v1/runs?{api_query}"))
        .await
    {
        Ok(runs) => {
            if runs.len() == PAGE
                && let Some(last) = runs.last()
            {
                let mut next = own.to_vec();
                next.push(("before", &last.id));
                view.older = Some(query_string(&next));
            }
            view.rows = runs.iter().map(page::RunRow::of).collect();
            view.live = before.is_empty();
        }
        Err(e) => view.error = Some(wasq_core::text::escape_line(&e.message, 500)),
    }
    html(view)
}

/// The API path of run `id` (an id or a prefix); anything else cannot name a run, and
/// the API answers 404 for it without it reaching a URL unescaped.
fn run_path(id: &str) -> String {
    let plain =
        !id.is_empty() && id.len() <= 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    format!("/v1/runs/{}", if plain { id } else { "-" })
}

pub(super) async fn run(
    session: Session,
    Path(id): Path<String>,
    done: Result<Query<Done>, QueryRejection>,
) -> Response {
    if let Some(r) = tenant_only(&session) {
        return r;
    }
    let detail: RunDetail = match session.get(&run_path(&id)).await {
        Ok(d) => d,
        Err(e) => return session.refused(e),
    };
    let id = detail.run.id.clone();
    let logs: Vec<LogLine> = session
        .get(&format!("/v1/runs/{id}/logs?limit=1000"))
        .await
        .unwrap_or_default();
    let children: Vec<Run> = session
        .get(&format!("/v1/runs?parent={id}&limit=100"))
        .await
        .unwrap_or_default();
    let done = done.ok().and_then(|Query(d)| d.done);
    let layout = session.layout("runs").notice(notice(done.as_deref()));
    html(page::RunPage::new(
        layout,
        &detail,
        &logs,
        &children,
        session.app.now(),
    ))
}

pub(super) async fn run_action(
    session: Session,
    Path((id, action)): Path<(String, String)>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if let Some(refused) = checked(&session, form) {
        return refused;
    }
    if !matches!(action.as_str(), "retry" | "cancel") {
        return page_error(
            Some(session.layout("runs")),
            StatusCode::NOT_FOUND,
            "no such action",
        );
    }
    let path = format!("{}/{action}", run_path(&id));
    match session.post(&path).await {
        Ok(_) => Redirect::to(&format!("/ui/runs/{id}?done={action}")).into_response(),
        Err(e) => session.refused(e),
    }
}

/// Runs created in the last hour (the newest [`RECENT`]) and whether the bound cut them.
async fn recent(session: &Session, function: Option<&str>) -> (Vec<Run>, bool) {
    let since = chrono::DateTime::from_timestamp_millis(session.app.now() - HOUR_MS)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    let limit = RECENT.to_string();
    let q = query_string(&[
        ("function", function.unwrap_or("")),
        ("since", &since),
        ("limit", &limit),
    ]);
    let runs: Vec<Run> = session
        .get(&format!("/v1/runs?{q}"))
        .await
        .unwrap_or_default();
    let sampled = runs.len() == RECENT;
    (runs, sampled)
}

pub(super) async fn functions(session: Session) -> Response {
    if let Some(r) = tenant_only(&session) {
        return r;
    }
    let list: Vec<Function> = match session.get("/v1/functions").await {
        Ok(l) => l,
        Err(e) => return session.refused(e),
    };
    let (recent, sampled) = recent(&session, None).await;
    let rows = list
        .iter()
        .map(|f| {
            let own: Vec<Run> = recent
                .iter()
                .filter(|r| r.function == f.name)
                .cloned()
                .collect();
            page::FunctionRow::of(f, Health::of(&own, sampled))
        })
        .collect();
    html(page::Functions {
        layout: session.layout("functions"),
        rows,
    })
}

pub(super) async fn function(session: Session, Path(name): Path<String>) -> Response {
    if let Some(r) = tenant_only(&session) {
        return r;
    }
    if wasq_core::names::check_function_name(&name).is_err() {
        return page_error(
            Some(session.layout("functions")),
            StatusCode::NOT_FOUND,
            "no such function",
        );
    }
    let f: Function = match session.get(&format!("/v1/functions/{name}")).await {
        Ok(f) => f,
        Err(e) => return session.refused(e),
    };
    let (recent, sampled) = recent(&session, Some(&name)).await;
    html(page::FunctionPage::new(
        session.layout("functions"),
        &f,
        Health::of(&recent, sampled),
    ))
}

pub(super) async fn schedules(
    session: Session,
    done: Result<Query<Done>, QueryRejection>,
) -> Response {
    if let Some(r) = tenant_only(&session) {
        return r;
    }
    let list: Vec<serde_json::Value> = match session.get("/v1/schedules").await {
        Ok(l) => l,
        Err(e) => return session.refused(e),
    };
    let done = done.ok().and_then(|Query(d)| d.done);
    html(page::Schedules {
        layout: session.layout("schedules").notice(notice(done.as_deref())),
        rows: list.iter().map(page::ScheduleRow::of).collect(),
    })
}

pub(super) async fn schedule_action(
    session: Session,
    Path((name, action)): Path<(String, String)>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if let Some(refused) = checked(&session, form) {
        return refused;
    }
    if wasq_core::names::check_function_name(&name).is_err()
        || !matches!(action.as_str(), "pause" | "resume" | "run-now")
    {
        return page_error(
            Some(session.layout("schedules")),
            StatusCode::NOT_FOUND,
            "no such schedule action",
        );
    }
    match session
        .post(&format!("/v1/functions/{name}/schedule/{action}"))
        .await
    {
        Ok(_) => Redirect::to(&format!("/ui/schedules?done={action}")).into_response(),
        Err(e) => session.refused(e),
    }
}

pub(super) async fn queues(session: Session) -> Response {
    let Some(tenant) = session.tenant().map(str::to_owned) else {
        return Redirect::to("/ui/tenants").into_response();
    };
    let depths: Vec<serde_json::Value> = match session.get("/v1/queues").await {
        Ok(d) => d,
        Err(e) => return session.refused(e),
    };
    // Run counts per function and state have no route: read them as /metrics does.
    let load = match session.app.store.load(&tenant).await {
        Ok(l) => l,
        Err(e) => {
            return session.refused(super::refused(
                StatusCode::SERVICE_UNAVAILABLE,
                e.to_string(),
            ));
        }
    };
    let now = session.app.now();
    let (recent, sampled) = recent(&session, None).await;
    let (chart, chart_note) = page::Queues::chart(&recent, now, sampled);
    let workers: Vec<wasq_core::WorkerBeat> = match session.get("/v1/workers").await {
        Ok(w) => w,
        Err(e) => return session.refused(e),
    };
    html(page::Queues {
        layout: session.layout("queues"),
        queues: depths
            .iter()
            .map(|d| {
                (
                    page::Queues::name(d["queue"].as_str().unwrap_or("")),
                    d["queued"].as_u64().unwrap_or(0),
                    d["running"].as_u64().unwrap_or(0),
                )
            })
            .collect(),
        counts: load
            .counts
            .iter()
            .map(|(f, s, n)| page::Count {
                name: page::Queues::name(f),
                status: s.as_str().to_owned(),
                count: *n,
            })
            .collect(),
        oldest: page::Queues::oldest(load.oldest_queued_at, now),
        workers: workers
            .iter()
            .map(|w| page::WorkerRow::of(w, now))
            .collect(),
        chart,
        chart_note,
    })
}

pub(super) async fn tenants(session: Session) -> Response {
    if session.tenant().is_some() {
        return page_error(
            Some(session.layout("")),
            StatusCode::FORBIDDEN,
            "tenants are the operator's: sign in with the operator key",
        );
    }
    match session.get::<Vec<serde_json::Value>>("/v1/tenants").await {
        Ok(list) => html(page::Tenants {
            layout: session.layout("tenants"),
            rows: list.iter().map(page::TenantRow::of).collect(),
        }),
        Err(e) => session.refused(e),
    }
}

pub(super) async fn audit(session: Session) -> Response {
    match session.get::<Vec<AuditEntry>>("/v1/audit?limit=200").await {
        Ok(list) => html(page::Audit {
            layout: session.layout("audit"),
            rows: list.iter().map(page::AuditRow::of).collect(),
        }),
        Err(e) => session.refused(e),
    }
}

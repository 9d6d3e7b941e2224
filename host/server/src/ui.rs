//! The dashboard at `/ui`: sessions, CSRF, and reading through the API. Pages are
//! rendered by `wasq_ui`; the handlers are in `ui/pages.rs`.
//!
//! The key decision: the dashboard is a client of the API, in process. A page reads what
//! it shows by sending the signed-in key's requests to the API's own router, so the
//! dashboard can see and do exactly what that key can through the API — tenant scoping,
//! bounds and validation are the API's, written once — and no page reads a store
//! directly except the queue health's run counts, which have no route.
//!
//! Sessions: signing in with an API key sets it as an HttpOnly, SameSite=Strict cookie
//! scoped to `/ui`, so a revoked key signs its sessions out at their next request (the
//! key is checked on every request, as for the API). Every form that changes something
//! carries a token derived from the server secret and the key (HMAC), checked in
//! constant time; a POST whose `Origin` or `Sec-Fetch-Site` says it came from another
//! site is refused before that. Pages are sent with a Content-Security-Policy that allows
//! only the dashboard's own scripts and styles, and may not be framed.

mod pages;

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;
use tower::ServiceExt;
use wasq_ui::pages::{ErrorPage, Layout};

use crate::App;
use crate::auth::Caller;

/// The session cookie: the API key itself (see the module's note).
const COOKIE: &str = "wasq_session";
/// Sessions last 12 hours.
const SESSION_SECS: u64 = 12 * 3600;

pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/ui", get(pages::home))
        .route("/ui/", get(pages::home))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/assets/{file}", get(asset))
        .route("/ui/runs", get(pages::runs))
        .route("/ui/runs/{id}", get(pages::run))
        .route("/ui/runs/{id}/{action}", post(pages::run_action))
        .route("/ui/functions", get(pages::functions))
        .route("/ui/functions/{name}", get(pages::function))
        .route("/ui/schedules", get(pages::schedules))
        .route(
            "/ui/schedules/{name}/{action}",
            post(pages::schedule_action),
        )
        .route("/ui/queues", get(pages::queues))
        .route("/ui/tenants", get(pages::tenants))
        .route("/ui/audit", get(pages::audit))
        .layer(axum::middleware::from_fn(guard))
        .layer(Extension(Arc::new(ApiRouter::default())))
}

/// The API's router, for the dashboard's in-process requests (built on first use: it
/// contains the dashboard's routes too).
#[derive(Default)]
pub(crate) struct ApiRouter(OnceLock<Router>);

/// Refuses cross-site form posts and adds the pages' security headers.
async fn guard(req: Request, next: Next) -> Response {
    if req.method() == Method::POST && cross_site(req.headers()) {
        return page_error(
            None,
            StatusCode::FORBIDDEN,
            "a form posted from another site is refused",
        );
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Whether the browser says the request came from another site: `Sec-Fetch-Site`, or
/// else an `Origin` whose host is not the `Host` asked for.
fn cross_site(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        return !matches!(site, "same-origin" | "none");
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_none_or(|(_, rest)| rest != host),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match wasq_ui::assets::get(&file) {
        Some((ctype, bytes)) => (
            [
                (header::CONTENT_TYPE, ctype),
                (header::CACHE_CONTROL, "public, max-age=86400"),
            ],
            bytes,
        )
            .into_response(),
        None => page_error(None, StatusCode::NOT_FOUND, "no such file"),
    }
}

/// A signed-in browser: its key, who that is, and a client for the API as that key.
pub(crate) struct Session {
    app: Arc<App>,
    api: Router,
    key: String,
    caller: Caller,
}

impl FromRequestParts<Arc<App>> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/ui/login").into_response();
        let Some(key) = cookie(&parts.headers, COOKIE) else {
            return Err(to_login());
        };
        // An unknown or revoked key: sign in again. A store that cannot answer is not a
        // reason to sign out: its error page.
        let caller = crate::auth::caller_for_key(app, &key)
            .await
            .map_err(|resp| {
                if resp.status() == StatusCode::UNAUTHORIZED {
                    to_login()
                } else {
                    page_error(
                        None,
                        resp.status(),
                        "the store cannot be reached: try again",
                    )
                }
            })?;
        let router = parts
            .extensions
            .get::<Arc<ApiRouter>>()
            .expect("the dashboard's routes carry the API router")
            .0
            .get_or_init(|| crate::api::router(app.clone()))
            .clone();
        Ok(Session {
            app: app.clone(),
            api: router,
            key,
            caller,
        })
    }
}

/// What the API answered when it refused: its status and message.
pub(crate) struct Refused {
    status: StatusCode,
    message: String,
}

impl Session {
    fn csrf(&self) -> String {
        csrf_token(&self.app, &self.key)
    }

    /// Whether `token` is this session's form token.
    fn csrf_ok(&self, token: &str) -> bool {
        bool::from(self.csrf().as_bytes().ct_eq(token.as_bytes()))
    }

    fn layout(&self, nav: &'static str) -> Layout {
        let (who, operator) = match &self.caller {
            Caller::Admin => ("operator".to_owned(), true),
            Caller::Tenant { tenant, .. } => (wasq_core::text::escape_line(tenant, 64), false),
        };
        Layout {
            who,
            operator,
            csrf: self.csrf(),
            nav,
            notice: None,
        }
    }

    fn tenant(&self) -> Option<&str> {
        match &self.caller {
            Caller::Tenant { tenant, .. } => Some(tenant),
            Caller::Admin => None,
        }
    }

    /// `GET path` on the API as this session's key.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Refused> {
        self.call(Method::GET, path).await
    }

    /// `POST path` (no body) on the API as this session's key.
    async fn post(&self, path: &str) -> Result<serde_json::Value, Refused> {
        self.call(Method::POST, path).await
    }

    async fn call<T: DeserializeOwned>(&self, method: Method, path: &str) -> Result<T, Refused> {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.key))
            .body(Body::empty())
            .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("bad address: {e}")))?;
        let resp = self
            .api
            .clone()
            .oneshot(req)
            .await
            .unwrap_or_else(|never| match never {});
        let status = resp.status();
        // API answers are bounded (see api/read.rs); 16 MiB is above every one of them.
        let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
            .await
            .map_err(|e| refused(StatusCode::BAD_GATEWAY, format!("reading the answer: {e}")))?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("the API answered {status}"));
            return Err(refused(status, message));
        }
        serde_json::from_slice(&body)
            .map_err(|e| refused(StatusCode::BAD_GATEWAY, format!("reading the answer: {e}")))
    }

    /// A page for what the API refused.
    fn refused(&self, r: Refused) -> Response {
        page_error(Some(self.layout("")), r.status, &r.message)
    }
}

fn refused(status: StatusCode, message: String) -> Refused {
    Refused { status, message }
}

/// The form token of the session of `key`.
fn csrf_token(app: &App, key: &str) -> String {
    hex::encode(&app.keyring.derive(&format!("ui-csrf\0{key}"))[..16])
}

/// The value of cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

fn session_cookie(key: &str) -> String {
    format!("{COOKIE}={key}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECS}")
}

fn cleared_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

fn html(page: impl askama::Template) -> Response {
    match page.render() {
        Ok(body) => Html(body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the page failed: {e}"),
        )
            .into_response(),
    }
}

fn page_error(layout: Option<Layout>, status: StatusCode, message: &str) -> Response {
    let mut resp = html(ErrorPage::new(layout, status.as_u16(), message));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_posts_are_told_apart() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(!cross_site(&h(&[])), "no header: a non-browser client");
        assert!(!cross_site(&h(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&h(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&h(&[("sec-fetch-site", "same-site")])));
        assert!(!cross_site(&h(&[
            ("origin", "http://127.0.0.1:7070"),
            ("host", "127.0.0.1:7070")
        ])));
        assert!(cross_site(&h(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:7070")
        ])));
        assert!(cross_site(&h(&[("origin", "null"), ("host", "a")])));
    }

    #[test]
    fn the_session_cookie_is_read_among_others() {
        let mut m = HeaderMap::new();
        m.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; wasq_session=wasq_k; b=2"),
        );
        assert_eq!(cookie(&m, COOKIE).as_deref(), Some("wasq_k"));
        assert!(session_cookie("k").contains("HttpOnly; SameSite=Strict"));
    }
}

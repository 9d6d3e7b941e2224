//! The document against the router it describes, both ways.
//!
//! axum has no public list of a router's routes, and the router is not built from the
//! document (it stays plain axum, with its per-route layers), so:
//!
//! - **Router → document** (the direction that fails in practice: someone adds a
//!   `.route(...)` and no `#[utoipa::path]`, or forgets to list it in `ApiDoc`): the
//!   router's paths are read from its `Debug` output, which prints axum's path table, and
//!   the methods each path serves are found by asking the real router — a request of each
//!   method with the operator key: 405 means the path does not serve that method; anything
//!   else but the fallback's 404 means it does. (Not without a key: the authentication
//!   layer wraps each path's whole method router, so a wrong method gets 401 too. With the
//!   operator key a tenant route answers 403 before its handler runs, and an operator
//!   route's handler sees sample parameters and an empty body: nothing it can act on, in a
//!   throwaway in-memory store.) Every such
//!   (method, path) must be an operation of the document, written the same way. Pages for
//!   people (`/docs`, the dashboard under `/ui`) are not API operations and are left out.
//!   Reading `Debug` is axum's implementation, not its API: if a new axum prints it
//!   differently, `router_paths` finds too few paths and the test says so, it does not
//!   pass quietly.
//! - **Document → router** (a documented path with a typo, or a route removed and still
//!   described): each documented operation is sent to the router with sample path
//!   parameters, and must be served: neither the router's fallback (404 "no such route")
//!   nor 405. This uses no `Debug` at all.
//!
//! Beside that, the document is checked for what OpenAPI validators and readers need:
//! every `{param}` declared as a path parameter, every `$ref` resolving, every
//! operation tagged, with a success answer and, unless public, a key.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::{get, post};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::{App, Assembled, Config, StoreBackend, api, assemble};

/// Paths that serve pages for people, not API operations.
const PAGES: &[&str] = &["/docs", "/ui"];
/// Operations that need no key.
const PUBLIC: &[&str] = &["/healthz", "/v1/openapi.json"];
/// The methods a route may serve (HEAD comes with GET in axum).
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
];

/// The daemon on the in-memory store, and its operator key.
async fn app() -> (Arc<App>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::dev(dir.path().to_path_buf());
    config.listen = None;
    config.store = StoreBackend::Memory;
    config.sandbox.max_instances = 2;
    config.sandbox.cache_dir = None;
    let Assembled { app, admin_key, .. } =
        assemble(config, &CancellationToken::new()).await.unwrap();
    (app, admin_key, dir)
}

fn document() -> Value {
    serde_json::from_str(super::document()).expect("the document is JSON")
}

fn is_page(path: &str) -> bool {
    PAGES.iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// A concrete path for a route pattern: each `{param}` (or `{*rest}`) becomes `sample`.
fn sample(pattern: &str) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').expect("a closed {param}") + open;
        out.push_str("sample");
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The paths of axum's path table, as the router's `Debug` prints them:
/// `RouteId(3): "/v1/runs"` (axum 0.8's `Node`).
fn router_paths(router: &Router) -> BTreeSet<String> {
    let printed = format!("{router:?}");
    let mut paths = BTreeSet::new();
    let mut rest = printed.as_str();
    while let Some(at) = rest.find("RouteId(") {
        rest = &rest[at + "RouteId(".len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Some(after) = rest[digits..].strip_prefix("): \"") else {
            continue;
        };
        let end = after.find('"').expect("a closed string");
        let path = &after[..end];
        // The fallback's own catch-all routes.
        if !path.contains("__private__axum") {
            paths.insert(path.to_owned());
        }
        rest = &after[end..];
    }
    assert!(
        paths.contains("/healthz") && paths.contains("/v1/runs/{id}") && paths.len() >= 25,
        "found too few routes in the router's Debug output (did axum change how it prints \
         its path table?): {paths:?}"
    );
    paths
}

/// Whether the router serves `method` at `path` (a concrete path), asked with the operator
/// key `key`: neither its fallback's 404 nor 405.
async fn serves(router: &Router, key: &str, method: &Method, path: &str) -> bool {
    let req = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    match res.status() {
        StatusCode::METHOD_NOT_ALLOWED => false,
        StatusCode::NOT_FOUND => {
            let body = axum::body::to_bytes(res.into_body(), 1 << 20)
                .await
                .unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            v["error"]["message"] != "no such route"
        }
        _ => true,
    }
}

/// (method, path) of every operation of the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            if METHODS
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(method))
            {
                ops.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    ops
}

/// What the router serves that the document does not describe, and what the document
/// describes that the router does not serve.
type Mismatch = (Vec<(String, String)>, Vec<(String, String)>);

async fn compare(router: &Router, key: &str, doc: &Value) -> Mismatch {
    let documented = documented(doc);

    // Router → document.
    let mut served = BTreeSet::new();
    for path in router_paths(router) {
        if is_page(&path) {
            continue;
        }
        for method in &METHODS {
            if serves(router, key, method, &sample(&path)).await {
                served.insert((method.as_str().to_owned(), path.clone()));
            }
        }
    }
    let undocumented = served.difference(&documented).cloned().collect();

    // Document → router, asking the router itself.
    let mut unrouted = vec![];
    for (method, path) in &documented {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        if !serves(router, key, &m, &sample(path)).await {
            unrouted.push((method.clone(), path.clone()));
        }
    }
    (undocumented, unrouted)
}

#[tokio::test]
async fn every_route_is_documented_and_every_operation_is_routed() {
    let (app, key, _dir) = app().await;
    let (undocumented, unrouted) = compare(&api::router(app), &key, &document()).await;
    assert!(
        undocumented.is_empty(),
        "routes without an operation in the OpenAPI document (give the handler a \
         #[utoipa::path] and list it in ApiDoc's paths): {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "documented operations the router does not serve: {unrouted:?}"
    );
}

/// The comparison above fails both ways: a route added without a description, a method
/// added to a documented path, and a described operation that is not routed.
#[tokio::test]
async fn the_comparison_finds_what_is_missing_either_way() {
    let (app, key, _dir) = app().await;
    let router = api::router(app)
        .route("/v1/undocumented", get(|| async { "" }))
        .route("/v1/functions/{name}/undocumented", post(|| async { "" }));
    let mut doc = document();
    let paths = doc["paths"].as_object_mut().unwrap();
    paths.remove("/v1/queues");
    paths.insert(
        "/v1/described/{id}".into(),
        serde_json::json!({"get": {"responses": {}}}),
    );
    paths["/healthz"]["post"] = serde_json::json!({"responses": {}});
    let (undocumented, unrouted) = compare(&router, &key, &doc).await;
    let pair = |m: &str, p: &str| (m.to_owned(), p.to_owned());
    assert_eq!(
        undocumented,
        [
            pair("GET", "/v1/queues"),
            pair("GET", "/v1/undocumented"),
            pair("POST", "/v1/functions/{name}/undocumented"),
        ]
    );
    assert_eq!(
        unrouted,
        [pair("GET", "/v1/described/{id}"), pair("POST", "/healthz")]
    );
}

#[test]
fn the_sample_paths_and_page_prefixes_are_what_the_test_thinks() {
    assert_eq!(
        sample("/v1/runs/{id}/steps/{name}/{occurrence}"),
        "/v1/runs/sample/steps/sample/sample"
    );
    assert_eq!(sample("/docs/{*rest}"), "/docs/sample");
    assert!(is_page("/docs") && is_page("/docs/") && is_page("/ui/runs/{id}"));
    assert!(!is_page("/v1/runs") && !is_page("/uix"));
}

/// Every `$ref` in `v`, recursively.
fn refs<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_document_is_complete() {
    let doc = document();
    assert_eq!(doc["info"]["title"], "wasq");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let schemes = &doc["components"]["securitySchemes"];
    for key in ["tenant_key", "operator_key"] {
        assert_eq!(schemes[key]["type"], "http", "{key}");
        assert_eq!(schemes[key]["scheme"], "bearer", "{key}");
    }

    let mut operation_ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let what = format!("{method} {path}");
            assert!(
                operation_ids.insert(op["operationId"].as_str().unwrap().to_owned()),
                "{what}: a repeated operationId"
            );
            assert!(!op["tags"].as_array().unwrap().is_empty(), "{what}: no tag");
            assert!(op["summary"].is_string(), "{what}: no summary");
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|code| code.starts_with('2')),
                "{what}: no success answer"
            );
            // Every `{param}` of the path is a declared path parameter, and no other.
            let declared: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .map(|p| p["name"].as_str().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            let in_path: BTreeSet<&str> = path
                .split('{')
                .skip(1)
                .map(|s| s.split('}').next().unwrap())
                .collect();
            assert_eq!(declared, in_path, "{what}: path parameters");
            if PUBLIC.contains(&path.as_str()) {
                assert!(op.get("security").is_none(), "{what}: public, yet a key");
            } else {
                assert!(
                    !op["security"].as_array().unwrap().is_empty(),
                    "{what}: no key"
                );
                for code in ["401", "500", "503"] {
                    assert!(responses.contains_key(code), "{what}: no {code}");
                }
                // Every error answer has the one error shape.
                for (code, r) in responses {
                    if code.starts_with('4') || code.starts_with('5') {
                        assert_eq!(
                            r["content"]["application/json"]["schema"]["$ref"],
                            "#/components/schemas/ErrorBody",
                            "{what}: {code}"
                        );
                    }
                }
            }
        }
    }

    let mut all = vec![];
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}: not a schema of this document"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} does not resolve"
        );
    }
}

#[tokio::test]
async fn the_document_and_the_reference_page_need_no_key() {
    let (app, _key, _dir) = app().await;
    let router = api::router(app);
    let get = |path: &'static str| {
        let router = router.clone();
        async move {
            let req = Request::get(path).body(Body::empty()).unwrap();
            let res = router.oneshot(req).await.unwrap();
            let status = res.status();
            let kind = res
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = axum::body::to_bytes(res.into_body(), 16 << 20)
                .await
                .unwrap();
            (status, kind, body)
        }
    };
    let (status, kind, body) = get("/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(kind, "application/json");
    assert_eq!(body, super::document().as_bytes());
    let (status, _, _) = get("/docs").await;
    assert!(status.is_redirection(), "{status}");
    let (status, kind, body) = get("/docs/").await;
    assert_eq!(status, 200);
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(String::from_utf8_lossy(&body).contains("swagger-ui"));
    let (status, _, body) = get("/docs/swagger-initializer.js").await;
    assert_eq!(status, 200);
    let init = String::from_utf8_lossy(&body);
    assert!(init.contains("/v1/openapi.json"), "{init}");
}

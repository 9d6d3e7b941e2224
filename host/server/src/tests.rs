//! The daemon's router and worker on the in-memory store (`StoreBackend::Memory`): no
//! file, no socket, no Redis — requests go through `tower::ServiceExt::oneshot`, so these
//! run in milliseconds. The end-to-end tests in `tests/` cover the same routes over real
//! HTTP with real components.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use wasq_core::*;

use crate::{App, Assembled, Config, StoreBackend, api, assemble, worker};

struct Fixture {
    app: Arc<App>,
    key: String,
    _dir: tempfile::TempDir,
}

async fn fixture(clock: ManualClock) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::dev(dir.path().to_path_buf());
    config.listen = None;
    config.store = StoreBackend::Memory;
    config.clock = Arc::new(clock);
    config.sandbox.max_instances = 2;
    config.sandbox.cache_dir = None;
    let Assembled { app, dev_key, .. } = assemble(config, &CancellationToken::new()).await.unwrap();
    Fixture {
        app,
        key: dev_key.unwrap(),
        _dir: dir,
    }
}

/// One request through the router: (status, JSON body).
async fn call(
    f: &Fixture,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Body::from(body.to_owned())).unwrap();
    let res = api::router(f.app.clone()).oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

/// A function stored directly (its component is not a real one: these tests never run
/// it in the sandbox, except to see that failing).
async fn function(f: &Fixture, name: &str, max_attempts: u32) {
    let mut settings = FunctionSettings::default();
    settings.retry.max_attempts = max_attempts;
    settings.retry.jitter = false;
    f.app
        .store
        .deploy(DeployRequest {
            tenant: DEFAULT_TENANT.into(),
            name: name.into(),
            digest: "0".repeat(64),
            component: b"not a component".to_vec(),
            settings,
            events: vec![],
            schedule: None,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_router_checks_keys_and_answers_runs_without_a_socket() {
    let f = fixture(ManualClock::new(1_767_225_600_000)).await;
    let key = f.key.clone();
    let (status, body) = call(&f, "GET", "/v1/runs", None, "").await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = call(&f, "GET", "/v1/runs", Some("wasq_nope"), "").await;
    assert_eq!(status, 401);
    let (status, body) = call(&f, "POST", "/v1/functions/ghost/runs", Some(&key), "{}").await;
    assert_eq!(status, 404, "{body}");

    function(&f, "job", 3).await;
    let (status, run) = call(
        &f,
        "POST",
        "/v1/functions/job/runs",
        Some(&key),
        r#"{"n": 1}"#,
    )
    .await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "queued");
    assert_eq!(
        run["created_at"], 1_767_225_600_000i64,
        "by the injected clock"
    );
    let id = run["id"].as_str().unwrap().to_owned();
    let (status, got) = call(&f, "GET", &format!("/v1/runs/{id}"), Some(&key), "").await;
    assert_eq!((status, &got["input"]), (200, &json!({"n": 1})));
    let (status, list) = call(&f, "GET", "/v1/runs?status=queued", Some(&key), "").await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().unwrap().len(), 1);

    let (status, cancelled) =
        call(&f, "POST", &format!("/v1/runs/{id}/cancel"), Some(&key), "").await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let (status, again) = call(&f, "POST", &format!("/v1/runs/{id}/cancel"), Some(&key), "").await;
    assert_eq!(status, 409, "{again}");
}

/// The worker loop on the memory store: a run whose component cannot be loaded fails
/// with reason `host`, retried by its policy's backoff as the clock moves.
#[tokio::test]
async fn the_worker_fails_a_run_it_cannot_load_and_retries_it_by_the_clock() {
    let clock = ManualClock::new(1_767_225_600_000);
    let f = fixture(clock.clone()).await;
    function(&f, "broken", 2).await;
    let run = f
        .app
        .store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "broken".into(),
            input: b"{}".to_vec(),
            trigger: "test".into(),
            ..EnqueueRequest::default()
        })
        .await
        .unwrap()
        .run;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(worker::run(f.app.clone(), shutdown.clone()));
    let detail = |attempts: usize| {
        let store = f.app.store.clone();
        let id = run.id.clone();
        async move {
            for _ in 0..500 {
                let d = store.run(DEFAULT_TENANT, &id).await.unwrap().unwrap();
                if d.attempts.len() >= attempts && d.run.status != RunStatus::Running {
                    return d;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("run {id} did not get {attempts} attempts");
        }
    };
    let first = detail(1).await;
    assert_eq!(first.run.status, RunStatus::Queued, "retried: {first:?}");
    let error = first.attempts[0].error.clone().unwrap();
    assert_eq!(error.reason, ErrorReason::Host, "{error}");
    // Due after the policy's backoff (1 s, no jitter), by the clock.
    assert_eq!(
        first.run.due_at,
        first.attempts[0].finished_at.unwrap() + 1_000
    );
    clock.advance(1_000);
    let second = detail(2).await;
    assert_eq!(second.run.status, RunStatus::Failed, "{second:?}");
    assert_eq!(second.run.attempt, 2);
    shutdown.cancel();
    worker.await.unwrap();
}

#[tokio::test]
async fn a_slot_frees_when_the_guest_is_done_and_ends_waiting_for_the_store_are_bounded() {
    use futures_util::FutureExt;
    use tokio::sync::Semaphore;
    let f = fixture(ManualClock::new(1_767_225_600_000)).await;
    let (slots, ends) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
    let take = || slots.clone().try_acquire_owned().unwrap();
    let mut a = worker::Slot::new(f.app.clone(), take(), ends.clone());
    assert_eq!(f.app.in_flight.executing(), 1);
    // a's guest is done: its slot takes the next run while a's end is being stored.
    a.executed().await;
    assert_eq!(
        (slots.available_permits(), f.app.in_flight.executing()),
        (1, 0)
    );
    let mut b = worker::Slot::new(f.app.clone(), take(), ends.clone());
    // b's guest is done too, but a's end holds the only place for an end: b keeps its
    // slot, so no third run starts while the store is behind.
    assert!(b.executed().now_or_never().is_none());
    assert_eq!(
        (slots.available_permits(), f.app.in_flight.executing()),
        (0, 1)
    );
    drop(a);
    b.executed().await;
    assert_eq!(
        (slots.available_permits(), f.app.in_flight.executing()),
        (1, 0)
    );
    drop(b);
    assert_eq!(ends.available_permits(), 1);
}

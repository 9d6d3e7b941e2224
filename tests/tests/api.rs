//! Done-means 5 and the API's answers to bad input: a clear status and message, and
//! nothing stored.

use wasq_tests::{Daemon, guest};

fn message(body: &serde_json::Value) -> String {
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_uploads_are_refused_with_a_reason_and_nothing_is_stored() {
    let d = Daemon::start().await;
    // An empty but valid core module: magic, version 1.
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    // An empty but valid component: magic, component version + layer.
    let empty_component = b"\0asm\x0d\0\x01\0".to_vec();
    let cases: [(&str, Vec<u8>, &[&str]); 4] = [
        (
            "not-wasm",
            b"#!/bin/sh\necho pwned\n".to_vec(),
            &["not a WebAssembly"],
        ),
        ("core-module", core_module, &["core", "module", "component"]),
        ("no-run-export", empty_component, &["run"]),
        ("truncated", guest("echo")[..200].to_vec(), &[]),
    ];
    for (name, bytes, words) in cases {
        let (status, body) = d.api.put(&format!("/v1/functions/{name}"), bytes).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["code"], "bad_component", "{name}: {body}");
        let msg = message(&body);
        assert!(!msg.is_empty(), "{name}: a reason is given");
        for w in words {
            assert!(
                msg.to_lowercase().contains(&w.to_lowercase()),
                "{name}: {msg:?} should mention {w:?}"
            );
        }
        let (status, _) = d.api.get(&format!("/v1/functions/{name}")).await;
        assert_eq!(status, 404, "{name} must not be stored");
    }
    let (_, fns) = d.api.get("/v1/functions").await;
    assert_eq!(fns, serde_json::json!([]), "nothing stored");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;

    let (s, b) = d.api.post("/v1/functions/echo/runs", "{not json").await;
    assert_eq!(s, 400, "{b}");
    assert!(message(&b).contains("not valid JSON"), "{b}");

    let (s, b) = d.api.post("/v1/functions/nope/runs", "{}").await;
    assert_eq!(s, 404, "{b}");
    assert!(message(&b).contains("nope"), "{b}");

    let (s, b) = d
        .api
        .put("/v1/functions/echo?memory_bytes=1", guest("echo"))
        .await;
    assert_eq!(s, 400, "{b}");
    assert!(message(&b).contains("memory_bytes"), "{b}");

    let (s, b) = d
        .api
        .put("/v1/functions/echo?timeout=5", guest("echo"))
        .await;
    assert_eq!(s, 400, "unknown setting: {b}");
    assert!(message(&b).contains("timeout"), "{b}");

    let (s, b) = d.api.put("/v1/functions/bad%20name", guest("echo")).await;
    assert_eq!(s, 400, "{b}");
    assert!(message(&b).contains("invalid function name"), "{b}");

    let (s, b) = d.api.get("/v1/runs?status=done").await;
    assert_eq!(s, 400, "{b}");
    assert!(message(&b).contains("unknown status"), "{b}");

    let (s, b) = d.api.get("/v1/runs/01234567-no-such-run").await;
    assert_eq!(s, 404, "{b}");

    // The settings that were refused did not change the deployed function.
    let (_, f) = d.api.get("/v1/functions/echo").await;
    assert_eq!(f["settings"]["limits"]["memory_bytes"], 64 << 20);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_can_be_listed_and_inspected() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    let mut ids = vec![];
    for i in 0..3 {
        ids.push(d.api.start_run("echo", &format!(r#"{{"i":{i}}}"#)).await);
    }
    for id in &ids {
        d.api.wait_run(id, std::time::Duration::from_secs(30)).await;
    }
    let (s, list) = d
        .api
        .get("/v1/runs?function=echo&status=succeeded&limit=2")
        .await;
    assert_eq!(s, 200);
    let got: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        got,
        [ids[2].clone(), ids[1].clone()],
        "newest first, limited"
    );
    // The next page: after the last id of this one.
    let (s, next) = d
        .api
        .get(&format!("/v1/runs?function=echo&limit=2&before={}", got[1]))
        .await;
    assert_eq!(s, 200, "{next}");
    assert_eq!(next.as_array().unwrap().len(), 1);
    assert_eq!(next[0]["id"], ids[0].as_str());
    // A time range: every run was created in the last minute, none in the future.
    let (s, recent) = d
        .api
        .get("/v1/runs?since=2026-01-01T00:00:00Z&until=2999-01-01T00:00:00Z")
        .await;
    assert_eq!((s, recent.as_array().unwrap().len()), (200, 3), "{recent}");
    let (_, none) = d.api.get("/v1/runs?until=2026-01-01T00:00:00Z").await;
    assert_eq!(none, serde_json::json!([]));
    for bad in [
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
        "before=abc",
    ] {
        let (s, body) = d.api.get(&format!("/v1/runs?{bad}")).await;
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (400, Some("bad_query")),
            "{bad}: {body}"
        );
    }
    let run = d.api.run(&ids[0]).await;
    assert_eq!(run["output"], serde_json::json!({"i": 0}));
    assert_eq!(run["input"], serde_json::json!({"i": 0}));
    assert_eq!(run["trigger"], "api");
    let (s, health) = d.api.get("/healthz").await;
    assert_eq!((s, health["status"].as_str()), (200, Some("ok")));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_creation_can_wait_for_the_output() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    d.api.deploy("sleeper", guest("sleeper"), "").await;

    let (status, run) = d
        .api
        .post("/v1/functions/echo/runs?wait=10s", r#"{"hi":1}"#)
        .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(
        (run["status"].as_str(), &run["output"]),
        (Some("succeeded"), &serde_json::json!({"hi": 1}))
    );

    let started = std::time::Instant::now();
    let (status, run) = d
        .api
        .post(
            "/v1/functions/sleeper/runs?wait=300ms",
            r#"{"sleep_ms":5000}"#,
        )
        .await;
    assert_eq!(status, 202, "not done within the wait: {run}");
    assert!(
        !matches!(
            run["status"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ),
        "{run}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "answered at the end of the wait"
    );

    let (status, body) = d.api.post("/v1/functions/echo/runs?wait=10m", "{}").await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("up to 5m"), "{body}");
    d.stop().await;
}

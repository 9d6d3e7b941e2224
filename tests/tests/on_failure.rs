//! Failure handlers (issue 15): a run that exhausts its retries, or is cancelled, starts
//! its function's `on_failure` handler once, with its input and every attempt's error; a
//! handler run never starts a handler itself.

use std::time::Duration;

use serde_json::Value;
use wasq_tests::{Api, Daemon, guest, run_cli};

/// The runs `parent` started (its handler, here), waiting up to 10 s for `n` of them.
async fn children(api: &Api, parent: &str, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, runs) = api.get(&format!("/v1/runs?parent={parent}")).await;
        assert_eq!(status, 200, "{runs}");
        let runs = runs.as_array().unwrap().clone();
        if runs.len() >= n || std::time::Instant::now() > deadline {
            return runs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_run_starts_its_failure_handler_once_with_its_errors() {
    let daemon = Daemon::start().await;
    let api = &daemon.api;
    // The handler echoes what it was given: its output is its input.
    api.deploy("alert", guest("echo"), "").await;
    // Deployed by the CLI, as a user would: --on-failure.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fail.wasm");
    std::fs::write(&file, guest("fail")).unwrap();
    let (code, _, err) = run_cli(api.cli().args([
        "deploy",
        file.to_str().unwrap(),
        "--name",
        "charge",
        "--max-attempts",
        "3",
        "--backoff",
        "10ms",
        "--on-failure",
        "alert",
    ]));
    assert_eq!(code, 0, "{err}");
    let (_, f) = api.get("/v1/functions/charge").await;
    assert_eq!(f["settings"]["on_failure"], "alert", "{f}");

    let id = api
        .start_run(
            "charge",
            r#"{"kind": "retryable", "message": "card declined", "who": "ada"}"#,
        )
        .await;
    let dead = api.wait_run(&id, Duration::from_secs(30)).await;
    assert_eq!(dead["status"], "failed", "{dead}");
    let handlers = children(api, &id, 1).await;
    assert_eq!(handlers.len(), 1, "{handlers:?}");
    let h = api
        .wait_run(handlers[0]["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(h["function"], "alert");
    assert_eq!(h["status"], "succeeded", "{h}");
    assert_eq!(h["trigger"], format!("on_failure:{id}"));
    let report = &h["output"];
    assert_eq!(report["run_id"], id.as_str());
    assert_eq!(report["function"], "charge");
    assert_eq!(report["status"], "failed");
    assert_eq!(report["input"]["who"], "ada");
    assert_eq!(report["error"]["message"], "card declined", "{report}");
    let attempts = report["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "every attempt's error: {report}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a["attempt"], i + 1);
        assert_eq!(a["error"]["reason"], "retryable");
        assert_eq!(a["error"]["message"], "card declined");
    }
    // Once: nothing more starts later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(children(api, &id, 2).await.len(), 1);

    // A manual retry that fails again starts it again (a new end).
    let (status, body) = api.post(&format!("/v1/runs/{id}/retry"), "").await;
    assert_eq!(status, 200, "{body}");
    api.wait_until(&id, Duration::from_secs(30), |r| {
        r["status"] == "failed" && r["attempt"].as_u64() > Some(3)
    })
    .await;
    assert_eq!(children(api, &id, 2).await.len(), 2);

    // A run cancelled before it started: the handler hears of it too.
    let (status, delayed) = api
        .post(
            "/v1/functions/charge/runs?delay=1h",
            r#"{"kind": "fatal", "message": "x"}"#,
        )
        .await;
    assert_eq!(status, 201, "{delayed}");
    let delayed = delayed["id"].as_str().unwrap().to_owned();
    let (status, body) = api.post(&format!("/v1/runs/{delayed}/cancel"), "").await;
    assert_eq!(status, 200, "{body}");
    let handlers = children(api, &delayed, 1).await;
    assert_eq!(handlers.len(), 1, "{handlers:?}");
    let h = api
        .wait_run(handlers[0]["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(h["output"]["status"], "cancelled", "{h}");
    assert_eq!(h["output"]["attempts"], serde_json::json!([]));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_handler_starts_no_handler_of_its_own() {
    let daemon = Daemon::start().await;
    let api = &daemon.api;
    // Its own handler, and failing on every input it gets from a dead run.
    api.deploy("loop", guest("fail"), "max_attempts=1&on_failure=loop")
        .await;
    let id = api
        .start_run("loop", r#"{"kind": "fatal", "message": "boom"}"#)
        .await;
    assert_eq!(
        api.wait_run(&id, Duration::from_secs(30)).await["status"],
        "failed"
    );
    let handlers = children(api, &id, 1).await;
    assert_eq!(handlers.len(), 1, "{handlers:?}");
    let h = handlers[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        api.wait_run(&h, Duration::from_secs(30)).await["status"],
        "failed"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(children(api, &h, 1).await.is_empty(), "no chain");
    let (_, all) = api.get("/v1/runs?function=loop").await;
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");

    // A bad handler name is refused at deploy.
    let (status, body) = api
        .put("/v1/functions/x?on_failure=no%20spaces", guest("echo"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("on_failure: "),
        "{body}"
    );
    daemon.stop().await;
}

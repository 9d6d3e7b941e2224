//! Durable execution against the real daemon: retries resume at the failed step with the
//! policy's backoff, long sleeps free the worker, cancellation, manual retry and
//! idempotency keys.

use std::time::{Duration, Instant};

use serde_json::Value;
use wasq_tests::{Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

fn count_logs(run: &Value, message: &str) -> usize {
    run["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["message"] == message)
        .count()
}

fn ms(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_resumes_at_the_failed_step_after_the_policy_backoff() {
    let d = Daemon::start().await;
    let policy = "max_attempts=3&initial_backoff_ms=300&max_backoff_ms=10000&jitter=false";
    d.api.deploy("flaky", guest("flaky"), policy).await;
    let id = d.api.start_run("flaky", r#"{"succeed_on":3}"#).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(
        run["output"],
        serde_json::json!({"one": 1, "two": 3, "three": 3})
    );
    assert_eq!(
        count_logs(&run, "step one ran"),
        1,
        "step one's body ran once: {run:#}"
    );
    let attempts = run["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    for (i, expected) in [(1, 300), (2, 600)] {
        let gap = ms(&attempts[i]["started_at"]) - ms(&attempts[i - 1]["finished_at"]);
        // The worker looks for due runs every 200 ms; allow that plus scheduling noise.
        assert!(
            (expected..expected + 700).contains(&gap),
            "backoff before attempt {}: {gap} ms, policy says {expected} ms",
            i + 1
        );
        assert_eq!(attempts[i - 1]["error"]["reason"], "retryable");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_sleep_frees_the_only_slot_and_wakes_on_time() {
    let d = Daemon::start_with(|c| c.concurrency = 1).await;
    d.api.deploy("sleeper", guest("sleeper"), "").await;
    d.api.deploy("echo", guest("echo"), "").await;
    let sleeper = d.api.start_run("sleeper", r#"{"sleep_ms":2000}"#).await;
    d.api
        .wait_until(&sleeper, WAIT, |r| r["status"] == "sleeping")
        .await;

    let echo = d.api.start_run("echo", r#"{"while":"sleeping"}"#).await;
    let done = d.api.wait_run(&echo, Duration::from_millis(1500)).await;
    assert_eq!(done["status"], "succeeded", "the slot was free: {done:#}");
    assert_eq!(
        d.api.run(&sleeper).await["status"],
        "sleeping",
        "still asleep"
    );

    let run = d.api.wait_run(&sleeper, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let slept = ms(&run["output"]["after"]["at"]) - ms(&run["output"]["before"]["at"]);
    assert!((2000..3500).contains(&slept), "slept {slept} ms for 2000");
    assert_eq!(run["output"]["before"]["attempt"], 1);
    assert_eq!(
        run["output"]["after"]["attempt"], 1,
        "a sleep is not a retry"
    );
    assert_eq!(count_logs(&run, "before the sleep"), 1);
    let attempts = run["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        2,
        "two executions of one attempt: {attempts:#?}"
    );
    assert!(attempts[0]["suspended_until"].is_i64());
    assert_eq!(
        run["steps"][1]["name"], "nap",
        "the sleep is a step: {run:#}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_sleeps_happen_inside_the_attempt() {
    let d = Daemon::start().await;
    d.api.deploy("sleeper", guest("sleeper"), "").await;
    let id = d.api.start_run("sleeper", r#"{"sleep_ms":300}"#).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(
        run["attempts"].as_array().unwrap().len(),
        1,
        "not suspended: {run:#}"
    );
    let slept = ms(&run["output"]["after"]["at"]) - ms(&run["output"]["before"]["at"]);
    assert!(slept >= 300, "slept {slept} ms");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_running_and_sleeping_runs() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "spin",
            guest("spin"),
            "timeout_ms=60000&fuel=100000000000000",
        )
        .await;
    d.api.deploy("sleeper", guest("sleeper"), "").await;

    let spin = d.api.start_run("spin", "{}").await;
    d.api
        .wait_until(&spin, WAIT, |r| r["status"] == "running")
        .await;
    let asked = Instant::now();
    let (status, body) = d.api.post(&format!("/v1/runs/{spin}/cancel"), "").await;
    assert_eq!(status, 200, "{body}");
    let run = d.api.wait_run(&spin, Duration::from_secs(1)).await;
    assert_eq!(run["status"], "cancelled", "{run:#}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "took {:?}",
        asked.elapsed()
    );

    let sleeper = d.api.start_run("sleeper", r#"{"sleep_ms":60000}"#).await;
    d.api
        .wait_until(&sleeper, WAIT, |r| r["status"] == "sleeping")
        .await;
    let (status, body) = d.api.post(&format!("/v1/runs/{sleeper}/cancel"), "").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );

    let (status, body) = d.api.post(&format!("/v1/runs/{sleeper}/cancel"), "").await;
    assert_eq!(status, 409, "already cancelled: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already cancelled"),
        "{body}"
    );
    let (status, _) = d.api.post("/v1/runs/no-such-run/cancel", "").await;
    assert_eq!(status, 404);

    // A cancelled run can be retried by hand.
    let (status, body) = d.api.post(&format!("/v1/runs/{spin}/retry"), "").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("queued")),
        "{body}"
    );
    d.api
        .wait_until(&spin, WAIT, |r| r["status"] == "running")
        .await;
    d.api.post(&format!("/v1/runs/{spin}/cancel"), "").await;
    d.api.wait_run(&spin, Duration::from_secs(2)).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_are_kept_and_can_be_retried_by_hand() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "fail",
            guest("fail"),
            "max_attempts=2&initial_backoff_ms=10",
        )
        .await;
    let id = d
        .api
        .start_run("fail", r#"{"kind":"fatal","message":"no such card"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        (run["status"].as_str(), run["attempt"].as_u64()),
        (Some("failed"), Some(1))
    );
    let (_, dead) = d.api.get("/v1/runs?status=failed&function=fail").await;
    assert_eq!(dead[0]["id"], id.as_str(), "listed as failed");

    let (status, body) = d.api.post(&format!("/v1/runs/{id}/retry"), "").await;
    assert_eq!(status, 200, "{body}");
    let run = d
        .api
        .wait_until(&id, WAIT, |r| r["status"] == "failed" && r["attempt"] == 2)
        .await;
    let errors: Vec<_> = run["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["error"]["reason"].clone())
        .collect();
    assert_eq!(errors, ["fatal", "fatal"], "every attempt's error is kept");

    let (status, body) = d.api.post(&format!("/v1/runs/{id}/retry"), "").await;
    assert_eq!(status, 200, "a failed run can be retried again: {body}");
    d.api
        .wait_until(&id, WAIT, |r| r["status"] == "failed" && r["attempt"] == 3)
        .await;

    d.api.deploy("echo", guest("echo"), "").await;
    let ok = d.api.start_run("echo", "{}").await;
    d.api.wait_run(&ok, WAIT).await;
    let (status, body) = d.api.post(&format!("/v1/runs/{ok}/retry"), "").await;
    assert_eq!(status, 409, "succeeded runs are not retried: {body}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_posts_with_one_idempotency_key_make_one_run() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    let http = d.api.http.clone();
    let url = format!("{}/v1/functions/echo/runs", d.api.base);
    let posts = (0..100).map(|i| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let resp = http
                .post(url)
                .header("idempotency-key", "order-42")
                .body(format!(r#"{{"try":{i}}}"#))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let run: Value = resp.json().await.unwrap();
            (status, run["id"].as_str().unwrap().to_owned())
        })
    });
    let mut results = vec![];
    for p in posts {
        results.push(p.await.unwrap());
    }
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 1, "exactly one POST creates the run");
    assert!(results.iter().all(|(s, _)| *s == 201 || *s == 200));
    let first = &results[0].1;
    assert!(
        results.iter().all(|(_, id)| id == first),
        "every answer names the same run"
    );
    let (_, runs) = d.api.get("/v1/runs?function=echo").await;
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs:#}");

    let (status, body) = d
        .api
        .post("/v1/functions/echo/runs?max_attempts=0", "{}")
        .await;
    assert_eq!(status, 400, "{body}");
    d.stop().await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_can_cascade_to_children() {
    let d = Daemon::start().await;
    d.api.deploy("family", guest("family"), "").await;
    d.api
        .deploy(
            "spin",
            guest("spin"),
            "timeout_ms=60000&fuel=100000000000000",
        )
        .await;
    let parent = d
        .api
        .start_run("family", r#"{"fan_out":2,"child":"spin"}"#)
        .await;
    d.api
        .wait_until(&parent, WAIT, |r| r["status"] == "waiting")
        .await;
    let children = || async {
        let (_, kids) = d.api.get(&format!("/v1/runs?parent={parent}")).await;
        kids.as_array().unwrap().clone()
    };
    let deadline = Instant::now() + WAIT;
    while !children().await.iter().all(|c| c["status"] == "running") || children().await.len() < 2 {
        assert!(Instant::now() < deadline, "children never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = d
        .api
        .post(&format!("/v1/runs/{parent}/cancel?cascade=true"), "")
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    for child in children().await {
        let id = child["id"].as_str().unwrap();
        let run = d.api.wait_run(id, Duration::from_secs(2)).await;
        assert_eq!(run["status"], "cancelled", "{run:#}");
        // Its reason says who cancelled it, and why.
        let why = run["error"]["message"].as_str().unwrap_or_default();
        assert!(
            run["error"]["reason"] == "cancelled"
                && why.starts_with("by key:")
                && why.ends_with(&format!("with its ancestor run {parent} (cascade)")),
            "{run:#}"
        );
    }
    // `parent` takes a unique prefix of the id, in any case, like the run routes.
    let prefix = parent[..30].to_uppercase();
    let (status, kids) = d.api.get(&format!("/v1/runs?parent={prefix}")).await;
    assert_eq!(
        (status, kids.as_array().map(Vec::len)),
        (200, Some(2)),
        "{kids}"
    );
    d.stop().await;
}

/// Retention by the server's clock: a succeeded run goes once `result_ttl` has passed
/// since it ended, a failed one once `failure_ttl` has; the purge wakes when the clock
/// moves, so the test moves a manual clock by hours instead of waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_runs_are_purged_past_their_retention() {
    const HOUR: i64 = 3_600_000;
    let clock = wasq_core::ManualClock::new(1_767_225_600_000);
    let c = clock.clone();
    let d = Daemon::start_with(move |config| {
        config.clock = std::sync::Arc::new(c);
        config.result_ttl = Some(Duration::from_secs(3600));
        config.failure_ttl = Some(Duration::from_secs(2 * 3600));
        config.purge_interval = Duration::from_secs(60);
    })
    .await;
    d.api.deploy("echo", guest("echo"), "").await;
    d.api.deploy("fail", guest("fail"), "").await;
    let ok = d.api.start_run("echo", "{}").await;
    let bad = d
        .api
        .start_run("fail", r#"{"kind": "fatal", "message": "no"}"#)
        .await;
    assert_eq!(d.api.wait_run(&ok, WAIT).await["status"], "succeeded");
    assert_eq!(d.api.wait_run(&bad, WAIT).await["status"], "failed");
    let exists = |id: String| {
        let api = d.api.clone();
        async move { api.get(&format!("/v1/runs/{id}")).await.0 == 200 }
    };
    let gone = |id: String| {
        let api = d.api.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            while api.get(&format!("/v1/runs/{id}")).await.0 != 404 {
                assert!(Instant::now() < deadline, "run {id} was not purged");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    clock.advance(HOUR + 120_000);
    gone(ok.clone()).await;
    assert!(
        exists(bad.clone()).await,
        "a failed run is kept for failure_ttl"
    );
    clock.advance(HOUR);
    gone(bad.clone()).await;
    d.stop().await;
}

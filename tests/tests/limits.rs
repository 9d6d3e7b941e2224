//! Done-means 3: hostile guests against the real daemon. Each is contained with the
//! right reason, and after each the same daemon still completes a normal run.

use std::time::Duration;

use serde_json::Value;
use wasq_tests::{Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

async fn assert_daemon_still_healthy(d: &Daemon, round: &str) {
    let id = d
        .api
        .start_run("echo", &format!(r#"{{"after":"{round}"}}"#))
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "echo after {round}: {run:#}");
    assert_eq!(run["output"], serde_json::json!({ "after": round }));
}

async fn failed_run(d: &Daemon, function: &str, input: &str) -> Value {
    let id = d.api.start_run(function, input).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed", "{function}: {run:#}");
    assert_eq!(run["attempt"], 1, "max_attempts=1 means one attempt");
    run
}

fn attempt_ms(run: &Value) -> i64 {
    let a = &run["attempts"][0];
    a["finished_at"].as_i64().unwrap() - a["started_at"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_contained_and_the_daemon_carries_on() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    // Plenty of fuel, 1 s of wall clock: only the timeout can stop it.
    d.api
        .deploy(
            "spin-timeout",
            guest("spin"),
            "timeout_ms=1000&fuel=100000000000000&max_attempts=1",
        )
        .await;
    // Little fuel, a long timeout: only fuel can stop it.
    d.api
        .deploy(
            "spin-fuel",
            guest("spin"),
            "timeout_ms=60000&fuel=50000000&max_attempts=1",
        )
        .await;
    d.api
        .deploy(
            "alloc",
            guest("alloc"),
            "memory_bytes=67108864&max_attempts=1",
        )
        .await;
    d.api
        .deploy("panic", guest("panic"), "max_attempts=1")
        .await;
    assert_daemon_still_healthy(&d, "start").await;

    // An infinite loop ends as failed with reason "timeout", near the configured limit.
    let run = failed_run(&d, "spin-timeout", "{}").await;
    assert_eq!(run["error"]["reason"], "timeout", "{run:#}");
    let ms = attempt_ms(&run);
    assert!(
        (1000..2500).contains(&ms),
        "stopped after {ms} ms, limit 1000 ms"
    );
    assert_daemon_still_healthy(&d, "timeout").await;

    // Fuel exhaustion ends as "out of fuel", well before the timeout.
    let run = failed_run(&d, "spin-fuel", "{}").await;
    assert_eq!(run["error"]["reason"], "out_of_fuel", "{run:#}");
    assert!(
        run["error"]["message"].as_str().unwrap().contains("fuel"),
        "{run:#}"
    );
    assert!(attempt_ms(&run) < 30_000);
    assert_eq!(
        run["attempts"][0]["fuel_used"], 50_000_000,
        "all the fuel was used"
    );
    assert_daemon_still_healthy(&d, "fuel").await;

    // A 1 GiB allocation is refused under a 64 MiB limit.
    let run = failed_run(&d, "alloc", r#"{"mib":1024}"#).await;
    assert_eq!(run["error"]["reason"], "out_of_memory", "{run:#}");
    let msg = run["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("67108864") || msg.contains("64 MiB"),
        "names the limit: {msg}"
    );
    assert_daemon_still_healthy(&d, "memory").await;
    // ... while an allocation under the limit is fine.
    let id = d.api.start_run("alloc", r#"{"mib":8}"#).await;
    let ok = d.api.wait_run(&id, WAIT).await;
    assert_eq!(ok["status"], "succeeded", "{ok:#}");

    // A panic fails the attempt with the trap message, including the panic text.
    let run = failed_run(&d, "panic", "{}").await;
    assert_eq!(run["error"]["reason"], "trap", "{run:#}");
    let msg = run["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("guest panic: boom"),
        "panic text in the error: {msg}"
    );
    assert!(msg.contains("unreachable"), "trap text in the error: {msg}");
    let logs = run["logs"].as_array().unwrap();
    assert!(
        logs.iter()
            .any(|l| l["source"] == "stderr" && l["message"].as_str().unwrap().contains("boom")),
        "stderr captured into the run's log: {logs:#?}"
    );
    assert_daemon_still_healthy(&d, "panic").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_errors_follow_the_retry_policy() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "fail",
            guest("fail"),
            "max_attempts=3&initial_backoff_ms=10&max_backoff_ms=20",
        )
        .await;

    let id = d
        .api
        .start_run("fail", r#"{"kind":"fatal","message":"bad card"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        (run["status"].as_str(), run["attempt"].as_u64()),
        (Some("failed"), Some(1)),
        "fatal: {run:#}"
    );
    assert_eq!(run["error"]["reason"], "fatal");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad card")
    );

    let id = d
        .api
        .start_run("fail", r#"{"kind":"retryable","message":"flaky"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        (run["status"].as_str(), run["attempt"].as_u64()),
        (Some("failed"), Some(3)),
        "retryable: {run:#}"
    );
    let attempts = run["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert!(
        attempts.iter().all(|a| a["error"]["reason"] == "retryable"),
        "{attempts:#?}"
    );
    d.stop().await;
}

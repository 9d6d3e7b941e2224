//! Events, wait-for-event and child runs against the real daemon.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_core::ManualClock;
use wasq_tests::{Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

async fn send(d: &Daemon, body: Value) -> Value {
    let (status, sent) = d.api.post("/v1/events", &body.to_string()).await;
    assert_eq!(status, 202, "{sent}");
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_event_resumes_a_waiting_run_and_others_do_not() {
    let d = Daemon::start_with(|c| c.concurrency = 1).await;
    d.api.deploy("waiter", guest("waiter"), "").await;
    d.api.deploy("echo", guest("echo"), "").await;
    let input = json!({"event": "order.paid", "filter": {"order.id": "A1"}, "timeout_ms": 0});
    let id = d.api.start_run("waiter", &input.to_string()).await;
    let run = d
        .api
        .wait_until(&id, WAIT, |r| r["status"] == "waiting")
        .await;
    assert_eq!(run["wait"]["on"]["event"]["name"], "order.paid", "{run:#}");

    // The waiting run holds no slot: with one slot, other work goes on.
    let echo = d.api.start_run("echo", "{}").await;
    assert_eq!(
        d.api.wait_run(&echo, Duration::from_secs(5)).await["status"],
        "succeeded"
    );

    let miss = send(
        &d,
        json!({"name": "order.paid", "data": {"order": {"id": "B2"}}}),
    )
    .await;
    assert_eq!(miss["resumed"], json!([]), "{miss}");
    let other = send(
        &d,
        json!({"name": "order.shipped", "data": {"order": {"id": "A1"}}}),
    )
    .await;
    assert_eq!(other["resumed"], json!([]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.api.run(&id).await["status"], "waiting", "still waiting");

    let hit = send(
        &d,
        json!({"name": "order.paid", "data": {"order": {"id": "A1"}, "amount": 12}, "id": "pay-1"}),
    )
    .await;
    assert_eq!(hit["resumed"], json!([id]), "{hit}");
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(
        run["output"]["got"],
        json!({"order": {"id": "A1"}, "amount": 12})
    );
    assert_eq!(run["attempt"], 1, "a wait is not a retry");

    let dup = send(&d, json!({"name": "order.paid", "data": {}, "id": "pay-1"})).await;
    assert_eq!(dup["accepted"], false, "an event id is a dedup key: {dup}");

    let (status, body) = d.api.post("/v1/events", r#"{"data": {}}"#).await;
    assert_eq!(status, 400, "no name: {body}");
    let (status, body) = d.api.post("/v1/events", r#"{"name": "bad name!"}"#).await;
    assert_eq!(status, 400, "{body}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_times_out_with_no_event() {
    // On a manual clock: the hour's timeout passes when the test says so.
    let clock = ManualClock::new(1_767_225_600_000);
    let c = clock.clone();
    let d = Daemon::start_with(move |config| config.clock = Arc::new(c)).await;
    // One attempt: a retry's backoff would wait for the clock too.
    d.api
        .deploy("waiter", guest("waiter"), "max_attempts=1")
        .await;
    let id = d
        .api
        .start_run("waiter", r#"{"event":"never","timeout_ms":3600000}"#)
        .await;
    d.api
        .wait_until(&id, WAIT, |r| r["status"] == "waiting")
        .await;
    clock.advance(3_599_000);
    // Claims go on meanwhile (a worker polls several times a second): still waiting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.api.run(&id).await["status"], "waiting", "not yet");
    clock.advance(1_000);
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"], json!({"got": null}));
    let attempts = run["attempts"].as_array().unwrap();
    let waited =
        attempts[1]["started_at"].as_i64().unwrap() - attempts[0]["finished_at"].as_i64().unwrap();
    assert_eq!(
        waited, 3_600_000,
        "resumed when the hour was up, by the server's clock"
    );

    // A bad filter is the guest's bug: it fails loudly instead of never matching.
    let id = d
        .api
        .start_run("waiter", r#"{"event":"x","filter":[1]}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid wait-for-event filter"),
        "{run:#}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_waiting_forever_ends_it_at_once() {
    let d = Daemon::start().await;
    d.api.deploy("waiter", guest("waiter"), "").await;
    let id = d.api.start_run("waiter", r#"{"event":"never"}"#).await;
    d.api
        .wait_until(&id, WAIT, |r| r["status"] == "waiting")
        .await;
    let asked = Instant::now();
    let (status, run) = d.api.post(&format!("/v1/runs/{id}/cancel"), "").await;
    assert_eq!(
        (status, run["status"].as_str()),
        (200, Some("cancelled")),
        "{run}"
    );
    assert!(asked.elapsed() < Duration::from_secs(1));
    let sent = send(&d, json!({"name": "never"})).await;
    assert_eq!(sent["resumed"], json!([]), "a cancelled run is not resumed");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_start_subscribed_functions_once_per_id() {
    let d = Daemon::start().await;
    d.api
        .deploy("greeter", guest("echo"), "events=user.signup,user.invited")
        .await;
    let sent = send(
        &d,
        json!({"name": "user.signup", "data": {"user": 7}, "id": "signup-7"}),
    )
    .await;
    let started = sent["started"].as_array().unwrap();
    assert_eq!(started.len(), 1, "{sent}");
    let run = d.api.wait_run(started[0].as_str().unwrap(), WAIT).await;
    assert_eq!(run["status"], "succeeded");
    assert_eq!(
        run["output"],
        json!({"user": 7}),
        "the event's data is the input"
    );
    assert_eq!(run["trigger"], "event:user.signup");
    let again = send(
        &d,
        json!({"name": "user.signup", "data": {"user": 7}, "id": "signup-7"}),
    )
    .await;
    assert_eq!(
        (
            again["accepted"].as_bool(),
            again["started"].as_array().map(Vec::len)
        ),
        (Some(false), Some(0))
    );

    // A guest's send-event does the same, once.
    d.api.deploy("family", guest("family"), "").await;
    let id = d
        .api
        .start_run("family", r#"{"send":"user.invited","data":{"user":8}}"#)
        .await;
    assert_eq!(d.api.wait_run(&id, WAIT).await["status"], "succeeded");
    let (_, runs) = d.api.get("/v1/runs?function=greeter").await;
    let triggers: Vec<_> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["trigger"].clone())
        .collect();
    assert_eq!(
        triggers,
        [json!("event:user.invited"), json!("event:user.signup")]
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_ten_children_and_fan_in_their_results() {
    let d = Daemon::start().await;
    d.api.deploy("family", guest("family"), "").await;
    d.api.deploy("square", guest("family"), "").await;
    let id = d
        .api
        .start_run("family", r#"{"fan_out":10,"child":"square"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"]["sum"], 385, "1² + … + 10²");
    let executions = run["attempts"].as_array().unwrap().len();
    assert!(
        executions > 1,
        "the parent was replayed after waiting ({executions} executions)"
    );
    let (_, children) = d.api.get("/v1/runs?function=square&limit=100").await;
    let children = children.as_array().unwrap();
    assert_eq!(children.len(), 10, "replays started no extra children");
    assert!(
        children
            .iter()
            .all(|c| c["parent"] == id.as_str() && c["status"] == "succeeded")
    );

    let id = d
        .api
        .start_run("family", r#"{"call":"square","value":12}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["output"], json!({"called": 144}), "{run:#}");

    let id = d
        .api
        .start_run("family", r#"{"call":"no-such-function","value":1}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such function"),
        "{run:#}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cannot_start_children_without_bound() {
    let d = Daemon::start_with(|c| c.sandbox.max_durable_ops = 10).await;
    d.api
        .deploy("family", guest("family"), "max_attempts=1")
        .await;
    d.api.deploy("square", guest("family"), "").await;
    let id = d
        .api
        .start_run("family", r#"{"fan_out":50,"child":"square"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let msg = run["error"]["message"].as_str().unwrap();
    assert!(msg.contains("more than 10 durable steps"), "{msg}");
    let (_, children) = d.api.get(&format!("/v1/runs?parent={id}&limit=1000")).await;
    assert_eq!(
        children.as_array().unwrap().len(),
        10,
        "the cap stopped the fan-out"
    );
    d.stop().await;
}

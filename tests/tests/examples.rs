//! The durable examples in guest-examples/rust, end to end: the order saga and the
//! onboarding flow.

use std::time::Duration;

use serde_json::json;
use wasq_tests::{Daemon, example_path, run_cli};

const WAIT: Duration = Duration::from_secs(60);

fn example(name: &str) -> Vec<u8> {
    std::fs::read(example_path(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saga_compensates_in_reverse_when_shipping_fails() {
    let d = Daemon::start().await;
    d.api.deploy("order-saga", example("order_saga"), "").await;
    let order = json!({"order_id": "A1", "sku": "book", "quantity": 2, "amount_cents": 4200});

    let id = d.api.start_run("order-saga", &order.to_string()).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"]["tracking"], "trk-A1");

    let mut failing = order.clone();
    failing["fail_at"] = json!("ship");
    let id = d.api.start_run("order-saga", &failing.to_string()).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert_eq!(run["attempt"], 1, "a fatal failure is not retried");
    assert_eq!(run["error"]["reason"], "fatal");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ship failed for order A1; compensated")
    );
    let steps: Vec<_> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "reserve-inventory",
            "charge-payment",
            "refund-payment",
            "release-inventory"
        ]
    );

    // Every step is visible in `wasq runs show`.
    let (code, out, err) = run_cli(d.api.cli().args(["runs", "show", &id]));
    assert_eq!(code, 0, "{err}");
    let at = |name: &str| {
        out.find(name)
            .unwrap_or_else(|| panic!("{name} missing from:\n{out}"))
    };
    assert!(at("reserve-inventory") < at("charge-payment"));
    assert!(
        at("charge-payment") < at("refund-payment"),
        "compensations after the work"
    );
    assert!(
        at("refund-payment") < at("release-inventory"),
        "compensations in reverse order"
    );
    assert!(out.contains("fatal: ship failed"), "{out}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn onboarding_waits_for_activation_or_re_engages() {
    let d = Daemon::start().await;
    d.api.deploy("onboarding", example("onboarding"), "").await;

    let id = d
        .api
        .start_run(
            "onboarding",
            r#"{"user_id":1,"email":"a@example.com","activation_window_ms":60000}"#,
        )
        .await;
    d.api
        .wait_until(&id, WAIT, |r| r["status"] == "waiting")
        .await;
    let other = json!({"name": "user.activated", "data": {"user_id": 2}});
    let (_, sent) = d.api.post("/v1/events", &other.to_string()).await;
    assert_eq!(sent["resumed"], json!([]), "another user's activation");
    let mine = json!({"name": "user.activated", "data": {"user_id": 1}});
    let (_, sent) = d.api.post("/v1/events", &mine.to_string()).await;
    assert_eq!(sent["resumed"], json!([id]));
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        run["output"],
        json!({"user_id": 1, "status": "activated"}),
        "{run:#}"
    );

    let id = d
        .api
        .start_run(
            "onboarding",
            r#"{"user_id":3,"email":"c@example.com","activation_window_ms":1000}"#,
        )
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        run["output"],
        json!({"user_id": 3, "status": "re-engaged"}),
        "{run:#}"
    );
    let welcome = run["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .unwrap()
                .starts_with("sending welcome")
        })
        .count();
    assert_eq!(
        welcome, 1,
        "the welcome email went out once across the wait"
    );
    d.stop().await;
}

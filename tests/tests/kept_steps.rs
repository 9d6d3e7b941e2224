//! When a completed step is stored. The worker keeps a step back to store it with the
//! attempt's end (one write instead of two), but never behind an effect that leaves the
//! sandbox, and never for long: these tests watch the store from outside while the guest
//! goes on after its step.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasq_tests::{Api, Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

/// A loopback HTTP server that, on each request, asks the API which steps the newest run
/// of `effects` has stored at that moment, and keeps the answers.
async fn step_watcher(api: Api) -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (seen, answers) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 2048];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let (_, runs) = api.get("/v1/runs?function=effects&limit=1").await;
            let id = runs[0]["id"].as_str().unwrap().to_owned();
            let (_, steps) = api.get(&format!("/v1/runs/{id}/steps")).await;
            let _ = seen.send(steps);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    (url, answers)
}

fn step_names(steps: &Value) -> Vec<String> {
    let list = steps.as_array().or_else(|| steps["steps"].as_array());
    list.unwrap_or_else(|| panic!("not a step list: {steps}"))
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_is_stored_before_the_request_that_follows_it() {
    let d = Daemon::start_with(|c| c.sandbox.allow_loopback_egress = true).await;
    d.api
        .deploy(
            "effects",
            guest("effects"),
            "max_attempts=1&allow_hosts=127.0.0.1",
        )
        .await;
    let (url, mut seen) = step_watcher(d.api.clone()).await;
    let input = json!({"effect": "step_then_http", "url": url}).to_string();
    let id = d.api.start_run("effects", &input).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let steps = seen.recv().await.expect("the guest's request arrived");
    assert_eq!(
        step_names(&steps),
        ["first"],
        "when the request arrived, the step before it was stored"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_is_stored_soon_while_the_guest_computes_on() {
    let d = Daemon::start().await;
    d.api
        .deploy("effects", guest("effects"), "max_attempts=1")
        .await;
    let input = json!({"effect": "step_then_compute", "ms": 3000}).to_string();
    let id = d.api.start_run("effects", &input).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let run = d.api.run(&id).await;
        if run["steps_total"] == 1 {
            assert_eq!(
                run["status"], "running",
                "the step was stored while the guest computed, not with its end: {run:#}"
            );
            break;
        }
        assert!(
            run["status"] == "queued" || run["status"] == "running",
            "the run ended before its step was seen: {run:#}"
        );
        assert!(
            Instant::now() < deadline,
            "the step was never stored: {run:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    d.stop().await;
}

//! Every language's examples (guest-examples/<lang>/), built with `wasq build` from their
//! wasq.toml and deployed with `wasq deploy` (its settings), then run through the real
//! daemon. (The Rust examples run in examples.rs; the Python agent, with
//! its kill -9, in agent.rs.)

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use wasq_tests::{Api, Daemon, repo_root, run_cli};

/// Builds and deploys guest-examples/<path> with the CLI; its folder.
fn build_and_deploy(api: &Api, path: &str) -> PathBuf {
    let dir = repo_root().join("guest-examples").join(path);
    for verb in ["build", "deploy"] {
        let mut cmd = api.cli();
        cmd.current_dir(&dir).arg(verb);
        // JS examples install componentize-js from npm's cache, never the network.
        cmd.env("npm_config_offline", "true");
        let (code, out, err) = run_cli(&mut cmd);
        assert_eq!(code, 0, "wasq {verb} in {path}: {out}\n{err}");
    }
    dir
}

async fn run(api: &Api, function: &str, input: Value) -> Value {
    let id = api.start_run(function, &input.to_string()).await;
    let run = api.wait_run(&id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "succeeded", "{function}: {run}");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_report_sleeps_between_sections_and_reports_progress() {
    let d = Daemon::start().await;
    build_and_deploy(&d.api, "python/report");
    let input = json!({"title": "Weekly", "sections": ["sales", "support", "ops"], "pause": 1.5});
    let run = run(&d.api, "report", input).await;
    assert_eq!(run["output"]["title"], "Weekly");
    assert_eq!(run["output"]["grand_total"], 4723, "{run}");
    assert_eq!(run["output"]["sections"].as_array().map(Vec::len), Some(3));
    // The pauses suspended the run (each a resume: a new attempt that replays the steps).
    let detail = d.api.run_detail(run["id"].as_str().unwrap()).await;
    let steps = detail["steps"].as_array().cloned().unwrap_or_default();
    assert!(steps.len() >= 5, "3 sections and 2 sleeps: {detail}");
    let logs = d.api.logs(run["id"].as_str().unwrap()).await;
    for section in ["sales", "support", "ops"] {
        let n = logs
            .iter()
            .filter(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&format!("section {section}:")))
            })
            .count();
        assert_eq!(n, 1, "section {section} was built once: {logs:#?}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_checksum_halves_an_image_and_checksums_it() {
    let d = Daemon::start().await;
    build_and_deploy(&d.api, "c/checksum");
    let image = json!({"width": 4, "height": 2, "pixels": [0, 10, 20, 30, 40, 50, 60, 70]});
    let run = run(&d.api, "checksum", image).await;
    // CRC-32 and Adler-32 of [25, 45], as Python's zlib computes them.
    assert_eq!(
        run["output"],
        json!({"width": 2, "height": 1, "pixels": [25, 45], "crc32": "9f06e792", "adler32": "00610047"})
    );
    // Input that is not an image is refused for good, not retried.
    let id = d.api.start_run("checksum", r#"{"width": 3}"#).await;
    let bad = d.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(bad["status"], "failed", "{bad}");
    assert_eq!(bad["attempt"], 1, "a fatal error is not retried: {bad}");
    d.stop().await;
}

/// The example's stand-in email API (node), on a free port.
struct Mailer(std::process::Child, String);

impl Mailer {
    async fn start() -> Mailer {
        let port = wasq_tests::free_port();
        let child = std::process::Command::new("node")
            .arg(repo_root().join("guest-examples/js/send-welcome-email/standin.mjs"))
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("node runs the stand-in");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the mailer did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Mailer(child, base)
    }
}

impl Drop for Mailer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_welcome_email_and_onboarding_flow() {
    let d = Daemon::start_with(|c| c.sandbox.allow_loopback_egress = true).await;
    let mailer = Mailer::start().await;
    build_and_deploy(&d.api, "js/send-welcome-email");
    build_and_deploy(&d.api, "js/onboarding");

    let input = json!({"email": "ada@example.com", "name": "Ada", "api": mailer.1});
    let run = run(&d.api, "send-welcome-email", input).await;
    assert_eq!(
        run["output"],
        json!({"email": "ada@example.com", "messageId": "msg_1"})
    );

    // The flow sleeps, then waits for this user's activation: another user's event does
    // not resume it, this user's does.
    let input = json!({"userId": 42, "email": "ada@example.com", "name": "Ada",
        "api": mailer.1, "pause": "2s", "activationTimeout": "1h"});
    let id = d.api.start_run("onboarding", &input.to_string()).await;
    // (It also waits, earlier, on its `call` of send-welcome-email: not that wait.)
    d.api
        .wait_until(&id, Duration::from_secs(60), |r| {
            r["status"] == "waiting" && r["wait"]["on"]["event"]["name"] == "user.activated"
        })
        .await;
    for data in [json!({"user_id": 7}), json!({"user_id": 42, "plan": "pro"})] {
        let body = json!({"name": "user.activated", "data": data});
        let (status, sent) = d.api.post("/v1/events", &body.to_string()).await;
        assert_eq!(status, 202, "{sent}");
    }
    let done = d.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let out = &done["output"];
    assert_eq!(
        (&out["activated"], &out["plan"], &out["followUp"]),
        (&json!(true), &json!("pro"), &json!("tips")),
        "{done}"
    );
    d.stop().await;
}

//! The durable AI agent (guest-examples/python/agent): each model call and each tool call
//! is a step, against the example's OpenAI-style stand-in server. `wasq dev` is killed -9
//! while the agent waits on its second model call and started again on the same data: the
//! run completes with the answer an undisturbed run gives, and no model or tool call whose
//! step had completed is sent again (the stand-in counts calls by idempotency key; only
//! the call in flight at the kill may repeat).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_tests::{DevProcess, free_port, repo_root, run_cli, wasq};

struct StandIn {
    child: Child,
    base: String,
}

impl StandIn {
    async fn start(dir: &Path, delay_s: f64) -> StandIn {
        let port = free_port();
        let child = Command::new("python3")
            .arg(dir.join("standin.py"))
            .args(["--port", &port.to_string(), "--delay", &delay_s.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the stand-in");
        let s = StandIn {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while reqwest::get(format!("{}/calls", s.base)).await.is_err() {
            assert!(Instant::now() < deadline, "the stand-in did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    }

    /// Its counts for one conversation (the run id).
    async fn calls(&self, run: &str) -> Value {
        let all: Value = reqwest::get(format!("{}/calls", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        all[run].clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli_ok(cmd: &mut Command) -> String {
    let (code, out, err) = run_cli(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    out
}

async fn until(what: &str, within: Duration, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_resumes_without_repeating_a_completed_model_call() {
    let example = repo_root().join("guest-examples/python/agent");
    let out = cli_ok(wasq().current_dir(&example).arg("build"));
    assert!(out.starts_with("built agent.wasm"), "{out}");

    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let port = free_port();
    let args = ["--allow-loopback-egress", "--lease", "2s"];
    let mut dev = DevProcess::spawn(&data, port, &args).await;
    let deployed = cli_ok(dev.api.cli().current_dir(&example).arg("deploy"));
    assert!(deployed.starts_with("deployed agent "), "{deployed}");

    // An undisturbed run first: the answer to compare with.
    let quick = StandIn::start(&example, 0.0).await;
    let question = "What is the weather in Oslo?";
    let input = |api: &str| json!({"question": question, "api": api}).to_string();
    let id = dev.api.start_run("agent", &input(&quick.base)).await;
    let calm = dev.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(calm["status"], "succeeded", "{calm}");
    let answer = calm["output"]["answer"].clone();
    assert!(
        answer.as_str().is_some_and(|a| a.contains("Oslo")),
        "{calm}"
    );

    // Now kill -9 the daemon while the agent waits on its second model call.
    let slow = StandIn::start(&example, 2.0).await;
    let id = dev.api.start_run("agent", &input(&slow.base)).await;
    until(
        "the second model call",
        Duration::from_secs(60),
        async || slow.calls(&id).await["model_calls"] == 2,
    )
    .await;
    let before = slow.calls(&id).await;
    dev.kill9();
    let mut dev = DevProcess::spawn(&data, port, &args).await;
    let run = dev.api.wait_run(&id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        run["output"]["answer"], answer,
        "the same answer as undisturbed"
    );
    assert!(
        run["attempt"].as_u64() >= Some(2),
        "the kill cost an attempt: {run}"
    );

    // model-1 and the weather tool completed before the kill: sent once. model-2 was in
    // flight and may be sent again; nothing else may.
    let after = slow.calls(&id).await;
    let model_2 = format!("wasq-{id}-model-2-0");
    let repeated: Vec<&str> = after["repeated"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        repeated.iter().all(|k| *k == model_2),
        "completed calls repeated: {repeated:?} (before the kill: {before}, after: {after})"
    );
    assert_eq!(after["tool_calls"], 1, "{after}");
    eprintln!(
        "agent: killed during model call 2; {} model calls in all (3 without the kill), repeated {repeated:?}; answer {answer}",
        after["model_calls"]
    );
    dev.kill9();
}

//! The sandbox grants a guest no environment, no files and no network: a probing guest
//! asks for each and must be refused every time, while a real listener waits on loopback.

use std::time::Duration;

use wasq_tests::{Daemon, guest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probing_guest_finds_no_env_no_files_and_no_network() {
    // The kernel completes a TCP handshake into the backlog without accept(), so a
    // non-blocking accept after the run tells whether the guest ever connected.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();

    // The test process has plenty of environment variables (PATH, CARGO_*): a leak shows.
    let d = Daemon::start().await;
    d.api
        .deploy("probe", guest("probe"), "max_attempts=1")
        .await;
    let id = d
        .api
        .start_run("probe", &format!(r#"{{"port":{port}}}"#))
        .await;
    let run = d.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let out = &run["output"];
    assert_eq!(
        out["env"],
        serde_json::json!([]),
        "no environment variables: {out:#}"
    );
    assert!(
        out["args"].as_array().unwrap().len() <= 1,
        "no arguments: {out:#}"
    );
    for probe in [
        "read_passwd",
        "list_root",
        "list_cwd",
        "write_tmp",
        "tcp",
        "dns",
    ] {
        let got = out[probe].as_str().unwrap();
        assert!(
            got.starts_with("denied"),
            "{probe} must be denied, got {got:?}"
        );
    }
    d.stop().await;
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the guest must not reach the loopback listener: {accepted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_welcome_email_example_runs() {
    let d = Daemon::start().await;
    let bytes = std::fs::read(wasq_tests::example_path("send_welcome_email")).unwrap();
    d.api.deploy("send-welcome-email", bytes, "").await;
    let id = d
        .api
        .start_run(
            "send-welcome-email",
            r#"{"user_id":42,"email":"ada@example.com"}"#,
        )
        .await;
    let run = d.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(
        run["output"],
        serde_json::json!({"status": "sent", "user_id": 42})
    );
    let logs = run["logs"].as_array().unwrap();
    assert!(
        logs.iter().any(|l| l["message"]
            .as_str()
            .unwrap()
            .contains("sending welcome email to ada@example.com")),
        "{logs:#?}"
    );
    assert_eq!(run["steps"][0]["name"], "send-email");

    // Bad input is a fatal error: one attempt, no retries.
    let id = d
        .api
        .start_run("send-welcome-email", r#"{"email":"ada@example.com"}"#)
        .await;
    let run = d.api.wait_run(&id, Duration::from_secs(60)).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["reason"], "fatal");
    assert_eq!(run["attempt"], 1);
    d.stop().await;
}

//! Text a tenant or a guest chose never reaches a terminal raw (README, "Limits"): the
//! real `wasq` CLI against the real daemon, with a guest that puts ANSI and OSC escapes,
//! a forged CR/LF line, C1 controls and bidi overrides in everything it can; and against
//! a hostile server, for every field a server could fill. Plus `| head` without a panic.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wasq_core::text::is_unsafe_char;
use wasq_tests::{Daemon, guest, run_cli, wasq};

/// A colour, a window title (OSC), a forged line, C1 CSI, DEL and a right-to-left override.
const EVIL: &str = "\x1b[31mRED\x1b[0m \x1b]0;pwned title\x07 \r\n2026-01-01 succeeded FORGED \u{9b}2J \u{202e}desrever\u{202c} \x7f";
/// How the CLI shows the start of it.
const SHOWN: &str = r"\u{1b}[31mRED\u{1b}[0m \u{1b}]0;pwned title\u{7} \r\n2026-01-01 succeeded FORGED \u{9b}2J \u{202e}desrever\u{202c} \u{7f}";
const WAIT: Duration = Duration::from_secs(60);

/// No raw control, C1 or bidi character anywhere (newlines between lines apart), and no
/// line that starts with the forged text.
#[track_caller]
fn assert_clean(what: &str, out: &str) {
    let raw: Vec<char> = out
        .chars()
        .filter(|&c| c != '\n' && is_unsafe_char(c))
        .collect();
    assert!(raw.is_empty(), "{what} printed raw {raw:?}:\n{out}");
    assert!(
        !out.lines()
            .any(|l| l.trim_start().starts_with("2026-01-01 succeeded FORGED")),
        "{what} printed a forged line:\n{out}"
    );
}

#[track_caller]
fn cli_ok(what: &str, cmd: &mut Command) -> String {
    let (code, out, err) = run_cli(cmd);
    assert_eq!(code, 0, "{what}: {out} {err}");
    assert_clean(what, &out);
    assert_clean(what, &err);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_guest_writes_reaches_the_cli_escaped() {
    let d = Daemon::start().await;
    d.api
        .deploy("escapes", guest("escapes"), "max_attempts=1")
        .await;

    // Waiting for an event, with the guest's progress message, then failing
    // with its error message: the live status lines and the error line.
    let input = json!({"evil": EVIL, "wait_ms": 1500, "fail": true}).to_string();
    let (code, out, err) = run_cli(
        d.api
            .cli()
            .args(["run", "escapes", "--wait", "--input", &input]),
    );
    assert_eq!(code, 1, "the run fails: {out} {err}");
    assert_clean("run --wait", &out);
    assert_clean("run --wait (stderr)", &err);
    assert!(
        err.contains(&format!("waiting for event escapes.wait: progress {SHOWN}")),
        "status line: {err}"
    );
    let error_line = err.lines().last().unwrap();
    assert!(
        error_line.starts_with("error: run ")
            && error_line.contains(&format!("fatal: error {SHOWN}")),
        "{err}"
    );
    let (_, runs) = d.api.get("/v1/runs?function=escapes").await;
    let failed = runs[0]["id"].as_str().unwrap().to_owned();

    let out = cli_ok("runs show", d.api.cli().args(["runs", "show", &failed]));
    assert!(out.contains(&format!("step {SHOWN}")), "step name: {out}");
    assert!(
        out.contains(&format!("fatal: error {SHOWN}")),
        "error: {out}"
    );

    let out = cli_ok("runs logs", d.api.cli().args(["runs", "logs", &failed]));
    assert!(out.contains(&format!("log {SHOWN}")), "{out}");
    // Stdout is split into lines at its newlines: the forged line is a log line of its own,
    // with its own time and source in front.
    assert!(out.contains(r"stdout \u{1b}[31mRED\u{1b}[0m"), "{out}");

    // JSON output stays JSON, the same values, with C1 and bidi characters as \uXXXX.
    let out = cli_ok(
        "runs show --output json",
        d.api
            .cli()
            .args(["runs", "show", &failed, "--output", "json"]),
    );
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["steps"], d.api.run(&failed).await["steps"]);
    assert!(out.contains(r"\u009b2J \u202edesrever"), "{out}");
    let out = cli_ok(
        "runs logs --output json",
        d.api
            .cli()
            .args(["runs", "logs", &failed, "--output", "json"]),
    );
    assert!(
        out.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok())
    );

    // A run that succeeds with the text in its output: `run --wait` and `runs list`.
    let input = json!({"evil": EVIL}).to_string();
    let out = cli_ok(
        "run --wait (output)",
        d.api
            .cli()
            .args(["run", "escapes", "--wait", "--input", &input]),
    );
    let output: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(output["said"], format!("output {EVIL}"));
    let out = cli_ok("runs list", d.api.cli().args(["runs", "list"]));
    assert!(out.contains(r#"{"said":"output \u001b[31mRED"#), "{out}");

    // Tenant input the server stores: an event id, a key label with a bidi override.
    let out = cli_ok(
        "events send",
        d.api
            .cli()
            .args(["events", "send", "user.signup", "--id", EVIL]),
    );
    assert!(out.contains(SHOWN), "{out}");
    let label = "\u{202e}lanif_v2\u{202c}";
    cli_ok(
        "keys create",
        d.api
            .cli()
            .args(["keys", "create", "--tenant", "default", "--label", label]),
    );
    let out = cli_ok(
        "keys list",
        d.api.cli().args(["keys", "list", "--tenant", "default"]),
    );
    assert!(out.contains(r"\u{202e}lanif_v2\u{202c}"), "{out}");
    // The same verbs for programs: the API's answer as JSON (the label as stored).
    let out = cli_ok(
        "keys create --output json",
        d.api.cli().args([
            "keys", "create", "--tenant", "default", "--label", "ci", "--output", "json",
        ]),
    );
    let key: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(key["key"].as_str().unwrap().starts_with("wasq_"), "{key}");
    let out = cli_ok(
        "webhooks secret --output json",
        d.api.cli().args(["webhooks", "secret", "--output", "json"]),
    );
    let secret: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        secret["secret"].as_str().unwrap().starts_with("whsec_"),
        "{secret}"
    );

    // The audit trail as the operator sees it, after a tenant tried to forge an entry.
    let forged = "pause%1B%5D0%3Bpwned%07%0D%0A2026-01-01%20succeeded%20FORGED";
    d.api
        .post(&format!("/v1/functions/escapes/schedule/{forged}"), "")
        .await;
    cli_ok("audit", d.admin.cli().arg("audit"));
    cli_ok(
        "audit --output json",
        d.admin.cli().args(["audit", "--output", "json"]),
    );
    let (_, entries) = d.admin.get("/v1/audit").await;
    for e in entries.as_array().unwrap() {
        for f in ["tenant", "actor", "action", "target"] {
            let text = e[f].as_str().unwrap();
            assert!(!text.chars().any(is_unsafe_char), "stored raw: {e}");
        }
    }
    d.stop().await;
}

/// A server answering with hostile text in every field the CLI prints (a compromised
/// store, a future route): each verb must escape and bound it. Answers are chosen by
/// path; the run `wasq run` starts is `waiting` (on a 20 MB event name) for three polls,
/// then `failed`.
async fn hostile_server() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let huge = format!("{EVIL}{}", "e".repeat(20 << 20));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let polls = polls.clone();
            let huge = huge.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let target = head.split(' ').nth(1).unwrap_or("");
                let path = target.split('?').next().unwrap_or("");
                let e = EVIL;
                let run = |status: &str| {
                    json!({"id": e, "function": e, "status": status, "attempt": 2, "trigger": e,
                        "input": {"k": e}, "output": e, "progress": {"percent": 50, "message": e},
                        "wait": {"on": {"event": {"name": huge}}},
                        "error": {"reason": e, "message": e},
                        "steps": (0..3000).map(|i| json!({"name": format!("{e}{i}"), "occurrence": 0, "attempt": 1, "output": e})).collect::<Vec<_>>(),
                        "attempts": [{"number": 1, "worker": e, "started_at": 0, "fuel_used": e, "error": {"reason": e, "message": e}}]})
                };
                let function = json!({"name": e, "digest": e, "size_bytes": 1,
                    "settings": {"limits": {"timeout_ms": e, "fuel": e, "memory_bytes": 1}, "retry": {"max_attempts": e},
                        "allow_hosts": [e], "flow": {"concurrency": {"limit": e, "key": e}, "throttle": {"limit": 1, "period_ms": 1, "key": e}}}});
                let (status, body) = match path {
                    "/v1/tenants" => (
                        200,
                        json!([{"name": e, "quotas": {"max_running": e, "max_queued": e}, "usage": {}}]),
                    ),
                    "/v1/tenants/t/keys" => (200, json!([{"id": e, "label": e}])),
                    "/v1/audit" => (
                        200,
                        json!([{"at": 0, "tenant": e, "actor": e, "action": e, "target": e}]),
                    ),
                    "/v1/schedules" => (
                        200,
                        json!([{"function": e, "cron": e, "tz": e, "missed": e, "next": []}]),
                    ),
                    "/v1/functions" => (200, json!([function])),
                    "/v1/functions/f" => (200, function),
                    "/v1/functions/f/runs" => (201, json!({"id": "w"})),
                    // Far more rows than a pipe holds, so `runs list | head -1` closes
                    // the pipe while wasq still writes.
                    "/v1/runs" => {
                        let light = json!({"id": e, "function": e, "status": "failed", "attempt": 1,
                            "trigger": e, "output": e, "error": {"reason": e, "message": e}});
                        let mut runs = vec![run("failed")];
                        runs.extend(std::iter::repeat_n(light, 2000));
                        (200, json!(runs))
                    }
                    "/v1/runs/r" => (200, run("failed")),
                    "/v1/runs/w" => {
                        let n = polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        (200, run(if n < 3 { "waiting" } else { "failed" }))
                    }
                    "/v1/runs/r/logs" => (
                        200,
                        json!([{"at": 0, "attempt": e, "level": e, "source": e, "message": huge}]),
                    ),
                    "/v1/events" => (
                        202,
                        json!({"id": e, "accepted": true, "started": [], "resumed": []}),
                    ),
                    "/v1/functions/f/schedule/run-now" => (200, json!({"id": e})),
                    _ => (400, json!({"error": {"code": "bad", "message": huge}})),
                };
                let body = body.to_string();
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_server_cannot_drive_or_flood_the_terminal() {
    let server = hostile_server().await;
    let cli = || {
        let mut c = wasq();
        c.args(["--server", &server]).env("WASQ_KEY", "k");
        c
    };
    let verbs: &[&[&str]] = &[
        &["tenants", "list"],
        &["keys", "list", "--tenant", "t"],
        &["audit"],
        &["cron", "list"],
        &["cron", "run-now", "f"],
        &["functions", "list"],
        &["functions", "show", "f"],
        &["runs", "list"],
        &["runs", "show", "r"],
        &["runs", "logs", "r"],
        &["events", "send", "x"],
        &["run", "f", "--wait"],
        &["runs", "show", "missing"],
        &["runs", "list", "--output", "json"],
    ];
    for args in verbs {
        let what = args.join(" ");
        let (code, out, err) = run_cli(cli().args(*args));
        assert!(code == 0 || code == 1, "{what}: exit {code}, {err}");
        assert_clean(&what, &out);
        assert_clean(&what, &err);
        if what.contains("json") {
            continue; // machine output: all of it, as JSON
        }
        assert!(
            out.contains(r"\u{1b}[31mRED") || err.contains(r"\u{1b}[31mRED"),
            "{what} shows the text escaped: {out} {err}"
        );
        // A 20 MB event name, log line or error message is cut, with a marker.
        let longest = out
            .lines()
            .chain(err.lines())
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert!(
            longest < 40 << 10,
            "{what} printed a line of {longest} bytes"
        );
        if matches!(args[0], "run" | "runs") && args.get(1) != Some(&"list") {
            assert!(
                out.contains(" bytes]") || err.contains(" bytes]"),
                "{what}: a truncation marker: {err}"
            );
        }
    }
}

/// `wasq ... | head -3`: the reader goes away; wasq stops quietly (exit 0), no panic
/// ("failed printing to stdout: Broken pipe").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_the_cli_quietly() {
    let d = Daemon::start().await;
    d.api.deploy("hostile", guest("hostile"), "").await;
    let id = d
        .api
        .start_run("hostile", r#"{"attack": "log-lines"}"#)
        .await;
    d.api.wait_run(&id, WAIT).await;
    let server = hostile_server().await;
    let cases = [
        (
            d.api
                .cli()
                .args(["runs", "logs", &id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn(),
            "runs logs",
        ),
        (
            wasq()
                .args(["--server", &server, "runs", "show", "r"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn(),
            "runs show",
        ),
        (
            wasq()
                .args(["--server", &server, "runs", "list", "--output", "json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn(),
            "runs list",
        ),
    ];
    for (child, what) in cases {
        let mut child = child.unwrap();
        // Read three lines' worth, then close the pipe while wasq still has lots to write
        // (the output is far larger than a pipe's buffer).
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 256];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let status = child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(status.code(), Some(0), "{what}: {status}, stderr: {err}");
        assert!(err.is_empty(), "{what} printed to stderr: {err}");
    }
    // As typed in a shell: `| head -1`, wasq's own exit code (pipefail).
    let bin = wasq_tests::e2e_binary();
    for verb in [
        "runs show r",
        "runs list",
        "runs list --output json",
        "runs logs r",
    ] {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -o pipefail; {} --server {server} {verb} | head -1",
                bin.display()
            ))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "`wasq {verb} | head -1`: {err}");
        assert!(
            err.is_empty(),
            "`wasq {verb} | head -1` printed to stderr: {err}"
        );
    }
    d.stop().await;
}

/// `runs list` says why a run failed and what started it, not only the failure's kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_shows_the_failure_message_and_the_trigger() {
    let d = Daemon::start().await;
    d.api.deploy("fail", guest("fail"), "max_attempts=1").await;
    let input = json!({"kind": "fatal", "message": "invalid email \"nope\""}).to_string();
    let id = d.api.start_run("fail", &input).await;
    d.api.wait_run(&id, WAIT).await;
    let out = cli_ok("runs list", d.api.cli().args(["runs", "list"]));
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("TRIGGER") && header.contains("RESULT"),
        "{out}"
    );
    let row = out.lines().find(|l| l.contains(&id)).unwrap_or_default();
    assert!(row.contains(" api "), "{out}");
    assert!(row.contains(r#"fatal: invalid email "nope""#), "{out}");
    d.stop().await;
}

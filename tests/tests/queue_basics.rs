//! Queue basics users reach for on their first day (issue 15): delayed runs (`?delay=`,
//! `?at=`, `wasq run --delay/--at`) on SQLite and on Redis, and burst workers (`wasq
//! worker --burst`) on both stores. Each Redis test starts its own `redis-server`.

use std::time::{Duration, Instant};

use serde_json::Value;
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, DaemonProcess, DevProcess, free_port, guest, run_cli, spawn_worker};

fn ms(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `wasq run echo --delay 2s` is queued with its due time 2 s ahead and starts 2.0-2.1 s
/// after it was created; a delayed run cancelled before its time never starts.
async fn delayed_run_starts_on_time(api: &Api) {
    api.deploy("echo", guest("echo"), "").await;
    let (code, out, err) = run_cli(api.cli().args(["run", "echo", "--delay", "2s"]));
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_owned();
    // The id alone on stdout (for scripts); when it starts on stderr, for people.
    assert!(
        err.contains(&format!("run {id} queued, due ")) && err.trim_end().ends_with("(in 2s)"),
        "{err}"
    );
    let run = api.run_detail(&id).await;
    assert_eq!(run["status"], "queued", "{run}");
    // The delay counts from when the API read the clock, a moment before the store
    // wrote the run (its created_at).
    let ahead = ms(&run["due_at"]) - ms(&run["created_at"]);
    assert!(
        (1_950..=2_000).contains(&ahead),
        "due {ahead} ms after creation: {run}"
    );
    let (code, out, err) = run_cli(api.cli().args(["runs", "show", &id]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("due")),
        "{out}"
    );

    let (status, body) = api.post("/v1/functions/echo/runs?delay=1s", "{}").await;
    assert_eq!(status, 201, "{body}");
    let cancelled = body["id"].as_str().unwrap().to_owned();
    let (status, body) = api.post(&format!("/v1/runs/{cancelled}/cancel"), "").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")));

    let done = api.wait_run(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let started = ms(&done["attempts"][0]["started_at"]);
    let (late, after) = (
        started - ms(&done["due_at"]),
        started - ms(&done["created_at"]),
    );
    eprintln!(
        "a run delayed 2 s started {after} ms after it was created, {late} ms after its due time"
    );
    assert!(
        (0..=100).contains(&late),
        "started {late} ms after its due time"
    );
    assert!(
        (1_950..=2_100).contains(&after),
        "started {after} ms after creation"
    );
    // Its time (1 s) passed a second before the other run started.
    let c = api.run_detail(&cancelled).await;
    assert_eq!(c["status"], "cancelled", "{c}");
    assert_eq!(c["attempts"], serde_json::json!([]), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_run_starts_on_time_on_sqlite() {
    let daemon = Daemon::start().await;
    delayed_run_starts_on_time(&daemon.api).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_run_starts_on_time_on_redis() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let daemon = Daemon::start_with(|c| c.store = StoreBackend::Redis(url)).await;
    delayed_run_starts_on_time(&daemon.api).await;
    daemon.stop().await;
}

/// RFC 3339 of unix milliseconds `at`, written in the +02:00 zone.
fn rfc3339_plus_two_hours(at: i64) -> String {
    let local = std::time::UNIX_EPOCH + Duration::from_millis((at + 2 * 3_600_000) as u64);
    let utc = humantime::format_rfc3339_seconds(local).to_string();
    format!("{}+02:00", utc.trim_end_matches('Z'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_are_checked_and_a_past_time_means_now() {
    let daemon = Daemon::start_with(|c| c.concurrency = 0).await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    for (query, says) in [
        ("delay=367days", "at most 366 days ahead"),
        ("delay=soon", "delay must be a duration"),
        ("at=tomorrow", "at must be an RFC 3339 time"),
        ("delay=1s&at=2026-01-01T00:00:00Z", "not both"),
    ] {
        let (status, body) = api
            .post(&format!("/v1/functions/echo/runs?{query}"), "{}")
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "bad_query", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{query}: {message}");
    }
    let (_, runs) = api.get("/v1/runs").await;
    assert_eq!(
        runs.as_array().map(Vec::len),
        Some(0),
        "a refused run is not created"
    );

    // A time already past means now; a time with an offset is that instant.
    let (status, past) = api
        .post("/v1/functions/echo/runs?at=2001-02-03T04:05:06Z", "{}")
        .await;
    assert_eq!(status, 201, "{past}");
    assert_eq!(ms(&past["due_at"]), ms(&past["created_at"]), "{past}");
    let target = ms(&past["created_at"]) / 1000 * 1000 + 3_600_000;
    let at = rfc3339_plus_two_hours(target);
    let (code, out, err) = run_cli(api.cli().args(["run", "echo", "--at", &at]));
    assert_eq!(code, 0, "{err}");
    let run = api.run_detail(out.trim()).await;
    assert_eq!(ms(&run["due_at"]), target, "{at}: {run}");
    assert_eq!(run["status"], "queued");

    // The CLI says what is wrong in one line.
    let (code, _, err) = run_cli(api.cli().args(["run", "echo", "--delay", "400days"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("at most 366 days ahead"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (code, _, err) = run_cli(
        api.cli()
            .args(["run", "echo", "--delay", "2s", "--at", &at]),
    );
    assert_eq!(code, 2, "clap refuses both: {err}");
    daemon.stop().await;
}

async fn create_runs(api: &Api, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for start in (0..n).step_by(50) {
        let created = (start..n.min(start + 50)).map(|i| {
            let api = api.clone();
            async move { api.start_run("echo", &format!(r#"{{"n": {i}}}"#)).await }
        });
        for id in all_of(created).await {
            ids.push(id);
        }
    }
    ids
}

/// Runs the futures as tasks of the runtime, at once; their outputs in order.
async fn all_of<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// Waits for a burst worker to exit on its own; its exit code.
async fn exit_of(worker: &mut DaemonProcess, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = worker.exited() {
            return status.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < deadline,
            "the burst worker did not exit within {within:?}:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn statuses(api: &Api, ids: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(
            api.run_detail(id).await["status"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    out
}

/// A backlog of 500 runs on Redis: `wasq worker --burst` exits 0 once all 500 ended, and
/// leaves a run due in an hour queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_worker_drains_500_runs_on_redis_and_exits_0() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let daemon = Daemon::api_on_redis(&url, |_| {}).await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    let ids = create_runs(api, 500).await;
    let (status, later) = api.post("/v1/functions/echo/runs?delay=1h", "{}").await;
    assert_eq!(status, 201, "{later}");

    let dir = tempfile::tempdir().unwrap();
    let mut worker = spawn_worker(
        &url,
        dir.path(),
        "worker",
        &["--burst", "--concurrency", "16"],
    );
    let code = exit_of(&mut worker, Duration::from_secs(180)).await;
    assert_eq!(code, 0, "{}", worker.log());
    let ended = statuses(api, &ids).await;
    let succeeded = ended.iter().filter(|s| *s == "succeeded").count();
    assert_eq!(succeeded, 500, "{ended:?}");
    let later = api.run_detail(later["id"].as_str().unwrap()).await;
    assert_eq!(
        later["status"], "queued",
        "a run due later is left: {later}"
    );
    daemon.stop().await;
}

/// The embedded store: runs created by `wasq dev` (executing nothing), drained by `wasq
/// worker --burst --data` once it stopped; `wasq dev` finds them all succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_worker_drains_the_embedded_store_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut dev = DevProcess::spawn(&data, free_port(), &["--concurrency", "0"]).await;
    dev.api.deploy("echo", guest("echo"), "").await;
    let ids = create_runs(&dev.api, 200).await;

    // While `wasq dev` holds the folder, a worker cannot open it: one clear line.
    let (code, _, err) =
        run_cli(wasq_tests::wasq().args(["worker", "--burst", "--data", data.to_str().unwrap()]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("in use"), "{err}");

    dev.kill9();
    let mut worker = DaemonProcess::spawn_logged(
        &["worker", "--burst", "--data", data.to_str().unwrap()],
        &dir.path().join("worker.log"),
    );
    let code = exit_of(&mut worker, Duration::from_secs(120)).await;
    assert_eq!(code, 0, "{}", worker.log());

    let dev = DevProcess::spawn(&data, free_port(), &["--concurrency", "0"]).await;
    let ended = statuses(&dev.api, &ids).await;
    assert!(ended.iter().all(|s| s == "succeeded"), "{ended:?}");
}

/// A batch of 1,000 inputs in one request: all 1,000 runs complete. Over `max_queued` the
/// whole batch answers 429 and nothing is created. Bad batches get a 400 naming the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_1000_runs_completes_and_one_over_max_queued_creates_nothing() {
    let daemon = Daemon::start_with(|c| c.concurrency = 16).await;
    let (status, body) = daemon
        .admin
        .post(
            "/v1/tenants",
            r#"{"name": "bulk", "quotas": {"max_queued": 1500}}"#,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = daemon
        .admin
        .post("/v1/tenants/bulk/keys", r#"{"label": "test"}"#)
        .await;
    assert_eq!(status, 201, "{body}");
    let api = daemon
        .api
        .as_key(Some(body["key"].as_str().unwrap().to_owned()));
    api.deploy("echo", guest("echo"), "").await;

    let runs: Vec<Value> = (0..1000)
        .map(|i| serde_json::json!({ "input": { "n": i } }))
        .collect();
    let body = serde_json::json!({ "runs": runs }).to_string();
    let (status, answer) = api.post("/v1/functions/echo/runs:batch", &body).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["created"], 1000);
    let ids: Vec<String> = answer["runs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            assert_eq!(r["input"]["n"], i, "in order: {r}");
            r["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1000);

    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let ended = statuses(&api, &ids).await;
        if ended.iter().all(|s| s == "succeeded") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all 1,000 runs succeeded: {} left",
            ended.iter().filter(|s| *s != "succeeded").count()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 1,000 runs due in an hour stay queued; 501 more would pass max_queued (1,500):
    // 429 for the whole batch, and none of its runs exists.
    let batch = |tag: &str, n: usize| {
        let runs: Vec<Value> = (0..n)
            .map(|i| serde_json::json!({ "input": { tag: i }, "delay": "1h" }))
            .collect();
        serde_json::json!({ "runs": runs }).to_string()
    };
    let (status, answer) = api
        .post("/v1/functions/echo/runs:batch", &batch("later", 1000))
        .await;
    assert_eq!((status, &answer["created"]), (201, &Value::from(1000)));
    let (status, refused) = api
        .post("/v1/functions/echo/runs:batch", &batch("over", 501))
        .await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused}");
    let (_, queued) = api.get("/v1/runs?status=queued&limit=1000").await;
    let queued = queued.as_array().unwrap();
    assert_eq!(queued.len(), 1000);
    assert!(
        queued.iter().all(|r| r["input"]["over"].is_null()),
        "a refused batch creates nothing"
    );

    for (body, code, says) in [
        (r#"{"runs": []}"#.to_owned(), "bad_batch", "1 to 1000 runs"),
        (
            serde_json::json!({ "runs": vec![serde_json::json!({}); 1001] }).to_string(),
            "bad_batch",
            "1 to 1000 runs",
        ),
        (
            r#"{"runs": [{}, {"delay": "367days"}]}"#.to_owned(),
            "bad_query",
            "runs[1]: a run may start at most 366 days ahead",
        ),
        (
            r#"{"runs": [{"inptu": 1}]}"#.to_owned(),
            "bad_input",
            "unknown field",
        ),
        ("[1, 2]".to_owned(), "bad_input", "the body must be"),
    ] {
        let (status, answer) = api.post("/v1/functions/echo/runs:batch", &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    daemon.stop().await;
}

/// A batch's body is read up to 8 MiB and no further: a declared length over it is
/// answered 413 `too_large` before any of the body is sent (a raw connection that sends
/// only the head: a client still writing 9 MiB may see the connection closed before it
/// reads the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_8_mib_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let daemon = Daemon::start_with(|c| c.concurrency = 0).await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    let addr = api.base.strip_prefix("http://").unwrap();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/functions/echo/runs:batch HTTP/1.1\r\nhost: {addr}\r\n\
         authorization: Bearer {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        api.key.as_deref().unwrap(),
        9 << 20
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // The answer's head, then as many bytes of body as it declares.
    let read = async {
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&answer).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let len: usize = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if answer.len() >= end + 4 + len {
                    return text;
                }
            }
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "the connection closed without a whole answer: {text}"
            );
            answer.extend_from_slice(&chunk[..n]);
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server answers a declared length over the limit before reading");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let json = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let body: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let (_, runs) = api.get("/v1/runs").await;
    assert_eq!(runs, serde_json::json!([]));
    daemon.stop().await;
}

/// `wasq run NAME --inputs FILE.jsonl`: one run per line, the ids in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wasq_run_inputs_starts_a_run_per_line() {
    let daemon = Daemon::start().await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inputs.jsonl");
    let lines: String = (0..1500).map(|i| format!("{{\"n\": {i}}}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let (code, out, err) =
        run_cli(
            api.cli()
                .args(["run", "echo", "--inputs", file.to_str().unwrap()]),
        );
    assert_eq!(code, 0, "{err}");
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 1500, "two requests, every id printed");
    for i in [0, 999, 1000, 1499] {
        let run = api.run_detail(ids[i]).await;
        assert_eq!(run["input"]["n"], i, "line {} is run {}", i + 1, ids[i]);
    }
    std::fs::write(&file, "{\"n\": 1}\nnot json\n").unwrap();
    let (code, _, err) =
        run_cli(
            api.cli()
                .args(["run", "echo", "--inputs", file.to_str().unwrap()]),
        );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("line 2 of") && err.contains("is not valid JSON"),
        "{err}"
    );
    daemon.stop().await;
}

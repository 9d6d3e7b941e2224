//! Queue basics users reach for on their first day (issue 15): delayed runs (`?delay=`,
//! `?at=`, `wasq run --delay/--at`) on SQLite and on Redis, and burst workers (`wasq
//! worker --burst`) on both stores. Each Redis test starts its own `redis-server`.

use std::time::{Duration, Instant};

use serde_json::Value;
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, DaemonProcess, DevProcess, free_port, guest, run_cli};

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
    assert_eq!(ms(&run["due_at"]) - ms(&run["created_at"]), 2_000, "{run}");
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
    let late = ms(&done["attempts"][0]["started_at"]) - ms(&done["created_at"]);
    eprintln!("a run delayed 2 s started {late} ms after it was created");
    assert!(
        (2_000..=2_100).contains(&late),
        "started {late} ms after creation, asked for 2000"
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
    let daemon = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url.clone());
        c.concurrency = 0;
    })
    .await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    let ids = create_runs(api, 500).await;
    let (status, later) = api.post("/v1/functions/echo/runs?delay=1h", "{}").await;
    assert_eq!(status, 201, "{later}");

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("worker");
    let mut worker = DaemonProcess::spawn_logged(
        &[
            "worker",
            "--redis",
            &url,
            "--burst",
            "--concurrency",
            "16",
            "--data",
            data.to_str().unwrap(),
        ],
        &dir.path().join("worker.log"),
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

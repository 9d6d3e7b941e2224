//! A tenant's storage usage against the bytes really stored (issue 18, done-means 3). One
//! tenant runs a mixed workload through the real daemon, on SQLite and on Redis, and the
//! usage the store counted (`usage.stored_bytes` of `GET /v1/tenants/default`) is compared
//! with what the store really keeps for it: pages in use by its tables and indexes
//! (SQLite's `dbstat`), or `MEMORY USAGE` of its keys and components (Redis); see
//! `wasq_tests::storage` for what counts.
//!
//! Checked, within 10%: the functions alone; after a workload of many small records (tiny
//! runs, short log lines, small steps, failures with retries, events, waits, sleeps); after
//! big records were added (64 KiB inputs, 200 KB steps, 8 KiB errors, 4 KiB events) — the
//! total, and the part without the functions' components, which are counted at their
//! exact size and would hide errors in the rest. Then a daemon restarted with zero
//! retention purges every run: the usage is back to the functions plus the event ids still
//! in their 24 h dedup window, the bytes really stored drop by what the usage did. The
//! figures are printed (`--nocapture`). The constants themselves are measured per kind of
//! record by `cargo bench -p wasq-bench --bench storage_cost`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::storage::{Probe, Reading, read, settle};
use wasq_tests::{Api, Daemon, guest};

const SETTLE: Duration = Duration::from_secs(180);
/// The margin of done-means 3.
const TOLERANCE: f64 = 0.10;

fn off(counted: u64, actual: u64) -> f64 {
    (counted as f64 - actual as f64) / actual.max(1) as f64
}

fn print(backend: &str, label: &str, r: &Reading, base: Option<&Reading>) {
    let mut line = format!(
        "[{backend}] {label}: counted {} B, actual {} B ({:+.1}%)",
        r.counted,
        r.actual.total,
        100.0 * off(r.counted, r.actual.total)
    );
    if let Some(b) = base {
        let (c, a) = (r.counted - b.counted, r.actual.total - b.actual.total);
        line += &format!(
            "; without the functions: counted {c} B, actual {a} B ({:+.1}%)",
            100.0 * off(c, a)
        );
    }
    println!("{line}");
    println!("[{backend}]   actual by part: {:?}", r.actual.parts);
    println!(
        "[{backend}]   not charged (per tenant): {:?}",
        r.actual.fixed
    );
}

/// Asserts `counted` is within the tolerance of `actual`.
fn assert_close(backend: &str, what: &str, counted: u64, actual: u64) {
    let off = off(counted, actual);
    assert!(
        off.abs() <= TOLERANCE,
        "[{backend}] {what}: counted {counted} B, actually stored {actual} B: {:+.1}%, \
         over the {:.0}% allowed",
        100.0 * off,
        100.0 * TOLERANCE
    );
}

async fn start_run(api: &Api, function: &str, input: Value) -> String {
    api.start_run(function, &input.to_string()).await
}

async fn send_event(api: &Api, body: Value) {
    let (status, sent) = api.post("/v1/events", &body.to_string()).await;
    assert_eq!(status, 202, "{sent}");
}

/// Retries that do not make the test wait.
const FAST_RETRY: &str = "initial_backoff_ms=10&max_backoff_ms=20&jitter=false";

/// Deploys the workload's functions (each its own component); returns their digests.
async fn deploy(api: &Api) -> Vec<String> {
    let mut digests = vec![];
    for (name, component, settings) in [
        ("echo", "echo", String::new()),
        // A subscriber: every `user.signup` starts a run of three steps.
        ("steps", "three_steps", "events=user.signup".to_owned()),
        ("hostile", "hostile", format!("{FAST_RETRY}&max_attempts=2")),
        ("fail", "fail", format!("{FAST_RETRY}&max_attempts=3")),
        ("flaky", "flaky", format!("{FAST_RETRY}&max_attempts=3")),
        ("waiter", "waiter", String::new()),
        ("sleeper", "sleeper", String::new()),
    ] {
        let f = api.deploy(name, guest(component), &settings).await;
        digests.push(f["digest"].as_str().unwrap().to_owned());
    }
    digests
}

/// Many small records: tiny runs (some with idempotency keys), small steps, many short
/// log lines, failures with retries, events with and without subscribers, waits
/// resumed by events, durable sleeps.
async fn small_records(api: &Api) {
    for i in 0..600 {
        start_run(api, "echo", json!({ "n": i })).await;
    }
    for i in 0..100 {
        let resp = api
            .http
            .post(format!("{}/v1/functions/echo/runs", api.base))
            .header("idempotency-key", format!("order-{i}"))
            .body(json!({ "order": i }).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    }
    for _ in 0..40 {
        start_run(api, "steps", json!({})).await;
    }
    for _ in 0..4 {
        start_run(
            api,
            "hostile",
            json!({ "attack": "big-steps", "count": 50, "size": 20 }),
        )
        .await;
    }
    // 3 runs x 2 attempts x 400 short lines, each attempt failing.
    for _ in 0..3 {
        start_run(
            api,
            "hostile",
            json!({ "attack": "log-and-fail", "count": 400 }),
        )
        .await;
    }
    for i in 0..20 {
        start_run(
            api,
            "fail",
            json!({ "kind": "retryable", "message": format!("upstream timed out ({i})") }),
        )
        .await;
        start_run(
            api,
            "fail",
            json!({ "kind": "fatal", "message": format!("invalid order {i}") }),
        )
        .await;
        start_run(api, "flaky", json!({ "succeed_on": 2 })).await;
    }
    for i in 0..10 {
        start_run(
            api,
            "waiter",
            json!({ "event": "order.paid", "filter": { "order": i }, "timeout_ms": 0 }),
        )
        .await;
    }
    for _ in 0..5 {
        start_run(api, "sleeper", json!({ "sleep_ms": 1100 })).await;
    }
    for i in 0..150 {
        send_event(api, json!({ "name": "page.viewed", "data": { "page": i } })).await;
    }
    for i in 0..30 {
        send_event(
            api,
            json!({ "name": "user.signup", "data": { "user": i }, "id": format!("signup-{i}") }),
        )
        .await;
    }
    // The waiters wait, then each is resumed by its event.
    let deadline = Instant::now() + SETTLE;
    loop {
        let (_, w) = api
            .get("/v1/runs?function=waiter&status=waiting&limit=100")
            .await;
        if w.as_array().unwrap().len() == 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiters never all waited: {w}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..10 {
        send_event(
            api,
            json!({ "name": "order.paid", "data": { "order": i, "amount": 10 * i } }),
        )
        .await;
    }
    settle(api, SETTLE).await;
}

/// Big records on top: large inputs and outputs, large steps, large events, long errors.
async fn big_records(api: &Api) {
    for i in 0..30 {
        start_run(api, "echo", json!({ "n": i, "blob": "b".repeat(64 << 10) })).await;
    }
    for _ in 0..3 {
        start_run(
            api,
            "hostile",
            json!({ "attack": "big-steps", "count": 5, "size": 200_000 }),
        )
        .await;
    }
    for i in 0..5 {
        start_run(
            api,
            "fail",
            json!({ "kind": "retryable", "message": format!("{i}: {}", "e".repeat(8 << 10)) }),
        )
        .await;
    }
    for i in 0..20 {
        send_event(
            api,
            json!({ "name": "report.ready", "data": { "n": i, "csv": "c".repeat(4 << 10) } }),
        )
        .await;
    }
    settle(api, SETTLE).await;
}

/// The daemon under test, on a data folder the test keeps across restarts.
fn daemon_config(c: &mut wasq_server::Config, data: &Path, store: &StoreBackend, purge: bool) {
    c.data_dir = data.to_path_buf();
    c.sandbox.cache_dir = Some(data.join("cache"));
    c.store = store.clone();
    if purge {
        c.result_ttl = Some(Duration::ZERO);
        c.failure_ttl = Some(Duration::ZERO);
        c.purge_interval = Duration::from_millis(100);
    } else {
        c.result_ttl = None;
        c.failure_ttl = None;
    }
}

async fn usage_matches_what_is_stored(
    backend: &str,
    store: StoreBackend,
    probe: Probe,
    data: &Path,
) {
    let d = Daemon::start_with(|c| daemon_config(c, data, &store, false)).await;
    let api = d.api.clone();

    let empty = read(&api, &probe, &[]).await;
    print(backend, "empty tenant", &empty, None);
    let digests = deploy(&api).await;
    let functions = read(&api, &probe, &digests).await;
    print(backend, "functions deployed", &functions, None);
    assert_close(
        backend,
        "functions",
        functions.counted,
        functions.actual.total,
    );

    small_records(&api).await;
    let small = read(&api, &probe, &digests).await;
    print(backend, "small records", &small, Some(&functions));
    assert_close(backend, "small records", small.counted, small.actual.total);
    assert_close(
        backend,
        "small records without the functions",
        small.counted - functions.counted,
        small.actual.total - functions.actual.total,
    );

    big_records(&api).await;
    let full = read(&api, &probe, &digests).await;
    print(backend, "small and big records", &full, Some(&functions));
    assert_close(backend, "all records", full.counted, full.actual.total);
    assert_close(
        backend,
        "all records without the functions",
        full.counted - functions.counted,
        full.actual.total - functions.actual.total,
    );
    d.stop().await;

    // A daemon keeping nothing that ended purges every run.
    let d = Daemon::start_with(|c| daemon_config(c, data, &store, true)).await;
    let api = d.api.clone();
    let deadline = Instant::now() + SETTLE;
    loop {
        let (_, runs) = api.get("/v1/runs?limit=5").await;
        if runs.as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "runs were not purged: {runs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let purged = read(&api, &probe, &digests).await;
    print(backend, "after the purge", &purged, Some(&functions));
    d.stop().await;

    // What is left: the functions and the event ids of the last 24 h (their dedup window).
    let left = purged.counted - functions.counted;
    let peak = full.counted - functions.counted;
    assert!(
        (left as f64) < 0.05 * peak as f64,
        "[{backend}] {left} B of the {peak} B of runs and events still counted after the purge"
    );
    let left_actual = purged.actual.total.saturating_sub(functions.actual.total);
    let peak_actual = full.actual.total - functions.actual.total;
    assert!(
        (left_actual as f64) < 0.05 * peak_actual as f64,
        "[{backend}] {left_actual} B of the {peak_actual} B of runs and events still stored \
         after the purge"
    );
    assert_close(
        backend,
        "what the purge gave back",
        full.counted - purged.counted,
        full.actual.total - purged.actual.total,
    );
    assert_close(
        backend,
        "after the purge",
        purged.counted,
        purged.actual.total,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_usage_matches_the_bytes_stored() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let probe = Probe::Sqlite(data.join("wasq.db"));
    usage_matches_what_is_stored("sqlite", StoreBackend::Sqlite, probe, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_usage_matches_the_bytes_stored() {
    let redis = RedisServer::start(RedisOptions::default());
    let home = tempfile::tempdir().unwrap();
    let probe = Probe::redis(&redis.url(), "default").await;
    let store = StoreBackend::Redis(redis.url());
    usage_matches_what_is_stored("redis", store, probe, &home.path().join("data")).await;
}

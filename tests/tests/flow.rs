//! Flow control and tenant quotas end to end (issue 6, issue 5): the real daemon in this
//! process, real guests, real time. Concurrency keys, throttle, rate limit, debounce and
//! priority are deploy settings; `max_queued` answers 429; a tenant's backlog of 20,000
//! runs does not hold back another tenant's run, on SQLite and on Redis.
//!
//! Every timing comes from the runs' own attempts (`started_at`, `finished_at`, stamped by
//! the store), so the assertions hold however slowly this machine runs the test.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_core::{EnqueueRequest, RunQuery, RunStatus, Store, SystemClock};
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, guest, run_cli};

const WAIT: Duration = Duration::from_secs(60);

/// (started_at of the first attempt, finished_at of the last) of an ended run.
fn span(run: &Value) -> (i64, i64) {
    let attempts = run["attempts"].as_array().expect("attempts");
    let start = attempts[0]["started_at"].as_i64().expect("started");
    let end = attempts
        .last()
        .and_then(|a| a["finished_at"].as_i64())
        .expect("finished");
    (start, end)
}

fn started_at(run: &Value) -> i64 {
    run["attempts"][0]["started_at"]
        .as_i64()
        .expect("an attempt started")
}

async fn start(api: &Api, function: &str, query: &str, input: Value) -> Value {
    let (status, body) = api
        .post(
            &format!("/v1/functions/{function}/runs{query}"),
            &input.to_string(),
        )
        .await;
    assert_eq!(status, 201, "start {function}: {body}");
    body
}

async fn list(api: &Api, query: &str) -> Vec<Value> {
    let (status, body) = api.get(&format!("/v1/runs?limit=1000&{query}")).await;
    assert_eq!(status, 200, "{body}");
    body.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_serializes_each_customer_and_customers_run_in_parallel() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "per-customer",
            guest("sleeper"),
            "concurrency_limit=1&concurrency_key=input.customer",
        )
        .await;
    let t = Instant::now();
    let mut ids = vec![];
    for i in 0..20 {
        let customer = if i % 2 == 0 { "a" } else { "b" };
        let input = json!({ "sleep_ms": 150, "customer": customer });
        let run = start(&d.api, "per-customer", "", input).await;
        assert_eq!(run["keys"]["concurrency"], customer);
        ids.push((customer, run["id"].as_str().unwrap().to_owned()));
    }
    let mut spans: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    for (customer, id) in &ids {
        let run = d.api.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "succeeded", "{run:#}");
        spans.entry(customer).or_default().push(span(&run));
    }
    for (customer, spans) in &mut spans {
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[1].0 >= w[0].1,
                "two runs of customer {customer} ran at once: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    let overlaps = spans["a"]
        .iter()
        .flat_map(|a| spans["b"].iter().map(move |b| (a, b)))
        .filter(|(a, b)| a.0 < b.1 && b.0 < a.1)
        .count();
    assert!(
        overlaps >= 5,
        "customers a and b ran in parallel only {overlaps} times"
    );
    let busy = |s: &[(i64, i64)]| s.last().unwrap().1 - s[0].0;
    eprintln!(
        "20 runs of 150 ms, limit 1 per customer: a busy {} ms, b busy {} ms, {overlaps} a/b overlaps, all done in {:?}",
        busy(&spans["a"]),
        busy(&spans["b"]),
        t.elapsed()
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_spreads_starts_and_drops_nothing() {
    let d = Daemon::start().await;
    d.api
        .deploy("throttled", guest("echo"), "throttle=5/1s")
        .await;
    let t = Instant::now();
    let mut ids = vec![];
    for i in 0..20 {
        ids.push(
            d.api
                .start_run("throttled", &json!({ "n": i }).to_string())
                .await,
        );
    }
    let mut starts = vec![];
    for id in &ids {
        let run = d.api.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "succeeded", "none is dropped: {run:#}");
        starts.push(started_at(&run));
    }
    let took = t.elapsed();
    starts.sort();
    for w in starts.windows(6) {
        assert!(
            w[5] - w[0] >= 1000,
            "6 starts within a second: {:?}",
            w.iter().map(|s| s - starts[0]).collect::<Vec<_>>()
        );
    }
    let spread = starts[19] - starts[0];
    assert!(spread >= 3000, "20 starts over {spread} ms");
    assert!(took >= Duration::from_secs(3), "{took:?}");
    eprintln!("throttle 5/1s: 20 runs started over {spread} ms, all done in {took:?}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_records_the_excess_as_skipped() {
    let d = Daemon::start().await;
    d.api
        .deploy("limited", guest("echo"), "rate_limit=5/1s")
        .await;
    let t = Instant::now();
    let posts = (0..20).map(|i| {
        let api = d.api.clone();
        async move { start(&api, "limited", "", json!({ "n": i })).await }
    });
    let runs = futures_join_all(posts).await;
    let posted_in = t.elapsed();
    assert!(
        posted_in < Duration::from_millis(900),
        "posting took {posted_in:?}"
    );
    let skipped: Vec<&Value> = runs.iter().filter(|r| r["status"] == "skipped").collect();
    assert_eq!(skipped.len(), 15, "201 with status skipped for the excess");
    for r in &skipped {
        assert_eq!(r["error"]["reason"], "rate_limited", "{r:#}");
    }
    for r in runs.iter().filter(|r| r["status"] != "skipped") {
        let run = d.api.wait_run(r["id"].as_str().unwrap(), WAIT).await;
        assert_eq!(run["status"], "succeeded");
    }
    assert_eq!(
        list(&d.api, "function=limited&status=skipped").await.len(),
        15
    );
    assert_eq!(
        list(&d.api, "function=limited&status=succeeded")
            .await
            .len(),
        5
    );
    let (code, out, err) = run_cli(d.api.cli().args([
        "runs",
        "list",
        "--function",
        "limited",
        "--status",
        "skipped",
        "--output",
        "json",
    ]));
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 15);
    let (code, out, _) = run_cli(d.api.cli().args([
        "runs",
        "list",
        "--function",
        "limited",
        "--status",
        "skipped",
    ]));
    assert_eq!(code, 0);
    assert!(out.contains("rate_limited"), "{out}");
    d.stop().await;
}

/// `futures::future::join_all` without the dependency: spawn each and await in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_burst_starts_one_run_with_the_last_input() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "debounced",
            guest("echo"),
            "debounce=1s&debounce_key=input.k",
        )
        .await;
    let mut runs = vec![];
    for n in 0..10 {
        runs.push(start(&d.api, "debounced", "", json!({ "k": "x", "n": n })).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids: Vec<&str> = runs.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let last = d.api.wait_run(ids[9], WAIT).await;
    assert_eq!(last["status"], "succeeded", "{last:#}");
    assert_eq!(
        last["output"],
        json!({ "k": "x", "n": 9 }),
        "the last input"
    );
    let created = last["created_at"].as_i64().unwrap();
    assert!(
        started_at(&last) >= created + 1000,
        "started {} ms after the last enqueue",
        started_at(&last) - created
    );
    for (i, id) in ids[..9].iter().enumerate() {
        let run = d.api.run(id).await;
        assert_eq!(run["status"], "skipped", "{run:#}");
        assert_eq!(run["error"]["reason"], "debounced");
        let by = run["error"]["message"].as_str().unwrap();
        assert!(by.contains(ids[i + 1]), "names its successor: {by}");
        assert!(run["attempts"].as_array().unwrap().is_empty(), "never ran");
    }
    assert_eq!(
        list(&d.api, "function=debounced&status=succeeded")
            .await
            .len(),
        1,
        "exactly one run started"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_high_priority_run_goes_first_and_aging_lets_low_priority_through() {
    let d = Daemon::start().await;
    // One slot (concurrency 1); priority 10 unless a run says otherwise; a level is worth
    // 20 ms of waiting, so aging shows within a second.
    d.api
        .deploy(
            "one-slot",
            guest("sleeper"),
            "concurrency_limit=1&priority=10&priority_aging=20ms",
        )
        .await;
    let blocker = start(&d.api, "one-slot", "", json!({ "sleep_ms": 400 })).await;
    let blocker = blocker["id"].as_str().unwrap().to_owned();
    d.api
        .wait_until(&blocker, WAIT, |r| r["status"] == "running")
        .await;
    let mut low = vec![];
    for _ in 0..3 {
        let r = start(&d.api, "one-slot", "", json!({ "sleep_ms": 10 })).await;
        assert_eq!(r["priority"], 10);
        low.push(r["id"].as_str().unwrap().to_owned());
    }
    let high = start(&d.api, "one-slot", "?priority=1", json!({ "sleep_ms": 10 })).await;
    assert_eq!(high["priority"], 1);
    let high = d.api.wait_run(high["id"].as_str().unwrap(), WAIT).await;
    for id in &low {
        let run = d.api.wait_run(id, WAIT).await;
        assert!(
            started_at(&high) < started_at(&run),
            "the priority-1 run started after an earlier priority-10 run"
        );
    }

    // Aging: X (priority 10) under a steady stream of priority-1 runs, one every 20 ms or
    // so, each 20 ms long (plus overhead): the backlog grows, yet X starts once the
    // stream's runs rank after it (created 9 levels x 20 ms = 180 ms after X), long
    // before the stream ends.
    let blocker = start(&d.api, "one-slot", "", json!({ "sleep_ms": 300 })).await;
    d.api
        .wait_until(blocker["id"].as_str().unwrap(), WAIT, |r| {
            r["status"] == "running"
        })
        .await;
    let x = start(&d.api, "one-slot", "", json!({ "sleep_ms": 10 })).await;
    let x_id = x["id"].as_str().unwrap().to_owned();
    let x_created = x["created_at"].as_i64().unwrap();
    let mut stream = vec![];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let r = start(&d.api, "one-slot", "?priority=1", json!({ "sleep_ms": 20 })).await;
        stream.push((
            r["id"].as_str().unwrap().to_owned(),
            r["created_at"].as_i64().unwrap(),
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let x = d.api.wait_run(&x_id, WAIT).await;
    let x_start = started_at(&x);
    let last_created = stream.last().unwrap().1;
    assert!(
        x_start < last_created,
        "X started {} ms after the stream's last run was created",
        x_start - last_created
    );
    let mut overtook = 0;
    for (id, created) in &stream {
        let run = d.api.wait_run(id, WAIT).await;
        if started_at(&run) < x_start {
            overtook += 1;
            assert!(
                *created < x_created + 180,
                "a run created {} ms after X started before it",
                created - x_created
            );
        }
    }
    assert!(overtook > 0, "later priority-1 runs went first");
    eprintln!(
        "aging: X started {} ms after it was created, after {overtook} newer priority-1 runs; {} stream runs in all",
        x_start - x_created,
        stream.len()
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_queued_answers_429_and_spares_what_was_accepted() {
    let d = Daemon::start().await;
    let small = d.admin.new_tenant("small").await;
    // Nothing starts (max_running 0), so accepted runs stay queued.
    let set = |max_running: u32| {
        let admin = d.admin.clone();
        async move {
            let quotas = json!({ "max_queued": 5, "max_running": max_running });
            let (status, body) = admin
                .put("/v1/tenants/small/quotas", quotas.to_string().into_bytes())
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    set(0).await;
    small.deploy("echo", guest("echo"), "").await;
    let mut ids = vec![];
    for n in 0..5 {
        ids.push(
            small
                .start_run("echo", &json!({ "n": n }).to_string())
                .await,
        );
    }
    let resp = small
        .http
        .post(format!("{}/v1/functions/echo/runs", small.base))
        .body(r#"{"n": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1"),
        "Retry-After in whole seconds"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert_eq!(
        list(&small, "function=echo").await.len(),
        5,
        "nothing created"
    );
    // The CLI says so in one line.
    let (code, _, err) = run_cli(small.cli().args(["run", "echo", "--input", "{}"]));
    assert_ne!(code, 0);
    assert!(err.contains("429"), "{err}");
    // Other tenants are not affected.
    d.api.deploy("echo", guest("echo"), "").await;
    let other = d.api.start_run("echo", "{}").await;
    assert_eq!(d.api.wait_run(&other, WAIT).await["status"], "succeeded");
    // Let them run: every accepted run completes.
    set(4).await;
    for id in &ids {
        assert_eq!(small.wait_run(id, WAIT).await["status"], "succeeded");
    }
    small.start_run("echo", "{}").await;
    d.stop().await;
}

/// Tenant "default" enqueues 20,000 runs of 50 ms straight into the store (they keep
/// every worker slot busy); tenant "quiet" then starts one over the API. Its run must
/// start within a few seconds, while most of the backlog still waits.
async fn noisy_neighbour(d: &Daemon, store: Arc<dyn Store>, backend: &str) {
    const BACKLOG: usize = 20_000;
    d.api.deploy("noise", guest("sleeper"), "").await;
    let quiet = d.admin.new_tenant("quiet").await;
    quiet.deploy("echo", guest("echo"), "").await;
    let t = Instant::now();
    let mut enqueued = 0;
    while enqueued < BACKLOG {
        let batch = (0..64.min(BACKLOG - enqueued)).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .enqueue(EnqueueRequest {
                        tenant: "default".into(),
                        function: "noise".into(),
                        input: json!({ "sleep_ms": 50, "n": enqueued + i })
                            .to_string()
                            .into_bytes(),
                        trigger: "api".into(),
                        ..EnqueueRequest::default()
                    })
                    .await
                    .expect("enqueue")
            })
        });
        for h in batch.collect::<Vec<_>>() {
            h.await.unwrap();
        }
        enqueued += 64.min(BACKLOG - enqueued);
    }
    let enqueue_took = t.elapsed();
    let id = quiet.start_run("echo", r#"{"quiet": true}"#).await;
    let run = quiet
        .wait_until(&id, Duration::from_secs(30), |r| {
            r["attempts"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    let waited = started_at(&run) - run["created_at"].as_i64().unwrap();
    let done = store
        .runs(RunQuery {
            tenant: "default".into(),
            status: Some(RunStatus::Succeeded),
            limit: BACKLOG,
            ..RunQuery::default()
        })
        .await
        .unwrap()
        .len();
    eprintln!(
        "{backend}: {BACKLOG} runs enqueued in {enqueue_took:?}; the quiet tenant's run started {waited} ms after it was created, when {done} of the backlog had run"
    );
    assert!(waited < 3000, "{backend}: waited {waited} ms");
    assert!(
        done < BACKLOG / 2,
        "{backend}: the backlog was mostly done ({done}) before the quiet run started"
    );
    assert_eq!(
        quiet.wait_run(&id, WAIT).await["status"],
        "succeeded",
        "{backend}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_20000_runs_does_not_hold_back_another_tenant_on_sqlite() {
    let mut data = None;
    let d = Daemon::start_with(|c| data = Some(c.data_dir.clone())).await;
    // A second handle on the daemon's database file, as another process would open it.
    let store =
        wasq_store_sqlite::SqliteStore::open(&data.unwrap().join("wasq.db"), Arc::new(SystemClock))
            .unwrap();
    noisy_neighbour(&d, Arc::new(store), "sqlite").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_20000_runs_does_not_hold_back_another_tenant_on_redis() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let d = Daemon::start_with(|c| c.store = StoreBackend::Redis(url.clone())).await;
    let store = wasq_store_redis::RedisStore::connect(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    noisy_neighbour(&d, Arc::new(store), "redis").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_settings_are_checked_at_deploy_and_shown_by_the_cli() {
    let d = Daemon::start().await;
    let (status, body) = d
        .api
        .put(
            "/v1/functions/bad?concurrency_limit=1&concurrency_key=customer.id",
            guest("echo"),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_settings");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("must start with `input`"), "{message}");
    let (status, body) = d
        .api
        .put("/v1/functions/bad?throttle=5", guest("echo"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("N/DURATION")
    );
    let (status, _) = d.api.get("/v1/functions/bad").await;
    assert_eq!(status, 404, "nothing stored");

    let file = wasq_tests::repo_root().join("tests/guests/target/wasm32-wasip2/release/echo.wasm");
    let (code, out, err) = run_cli(d.api.cli().args([
        "deploy",
        file.to_str().unwrap(),
        "--name",
        "shaped",
        "--concurrency-limit",
        "2",
        "--concurrency-key",
        "input.customer.id",
        "--throttle",
        "5/1s",
        "--rate-limit",
        "100/1m",
        "--rate-limit-key",
        "input.items[0].sku",
        "--debounce",
        "250ms",
        "--priority",
        "-5",
        "--priority-aging",
        "10s",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run_cli(d.api.cli().args(["functions", "show", "shaped"]));
    assert_eq!(code, 0, "{err}");
    for line in [
        "concurrency: at most 2 running per input.customer.id",
        "throttle: 5 starts per 1s (the rest wait)",
        "rate limit: 100 runs per 1m per input.items[0].sku (the rest are skipped)",
        "debounce: 250ms (only the last run of a burst starts)",
        "priority: -5 (lower first; one level = 10s of waiting)",
    ] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
    let (code, out, err) = run_cli(d.api.cli().args([
        "run",
        "shaped",
        "--priority",
        "7",
        "--input",
        r#"{"customer": {"id": 42}}"#,
        "--output",
        "json",
    ]));
    assert_eq!(code, 0, "{err}");
    let run: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(run["priority"], 7);
    assert_eq!(run["keys"]["concurrency"], "42");
    assert_eq!(
        run["keys"]["rate_limit"], "null",
        "a missing path is the key null"
    );
    d.stop().await;
}

//! What each kind of record really costs in each store, against what it is charged: the
//! measurement behind the `CostModel` constants of `wasq-store-sqlite` (`storage.rs`) and
//! `wasq-store-redis` (`lib.rs`, and `mem` in `scripts.rs`).
//!
//! The real daemon (in this process) on SQLite, then on a fresh `redis-server`, stores
//! batches of N records of one kind and known payload — tiny runs, runs with 1/10/100 KB
//! inputs and outputs, steps small and big, log lines, failed attempts with short and long
//! errors, events, events starting runs — and after each batch the growth of what the
//! tenant really keeps (`wasq_tests::storage`: `dbstat` pages in use, `MEMORY USAGE` of its
//! keys) and of its counted usage are divided by N. A warm-up first takes the tenant past
//! the sizes where Redis packs small collections (128 entries), as a tenant whose storage
//! matters is. Redis figures of a single batch jump when one of its hash tables doubles;
//! over a workload they average out.
//!
//! `cargo bench -p wasq-bench --bench storage_cost`. A figure, never a pass or fail: the
//! end-to-end check is `tests/tests/storage_usage.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::storage::{Probe, Reading, read, settle};
use wasq_tests::{Api, Daemon, guest};

const SETTLE: Duration = Duration::from_secs(300);

struct Bench<'a> {
    api: &'a Api,
    probe: &'a Probe,
    digests: Vec<String>,
    last: Reading,
}

impl Bench<'_> {
    /// Waits for the batch of `n` records to settle and prints what one cost.
    async fn batch(&mut self, what: &str, n: u64) {
        settle(self.api, SETTLE).await;
        let now = read(self.api, self.probe, &self.digests).await;
        let per = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
        let counted = per(now.counted, self.last.counted);
        let actual = per(now.actual.total, self.last.actual.total);
        let mut parts = BTreeMap::new();
        for (k, v) in &now.actual.parts {
            let d = per(*v, *self.last.actual.parts.get(k).unwrap_or(&0));
            if d != 0.0 {
                parts.insert(k.clone(), (d * 10.0).round() / 10.0);
            }
        }
        println!(
            "  {what:<28} counted {counted:>9.1}  actual {actual:>9.1}  ({:+.1}%)  {parts:?}",
            100.0 * (counted - actual) / actual
        );
        self.last = now;
    }
}

async fn start(api: &Api, function: &str, input: Value) {
    api.start_run(function, &input.to_string()).await;
}

async fn event(api: &Api, body: Value) {
    let (status, sent) = api.post("/v1/events", &body.to_string()).await;
    assert_eq!(status, 202, "{sent}");
}

async fn measure(backend: &str, store: StoreBackend, probe: Probe, data: &Path) {
    println!("{backend}: bytes per record");
    let d = Daemon::start_with(|c| {
        // Compile in this process, not in a helper binary `cargo bench` may not have built.
        c.sandbox.compiler = wasq_server::Compiler::InProcess;
        c.data_dir = data.to_path_buf();
        c.sandbox.cache_dir = Some(data.join("cache"));
        c.store = store.clone();
        c.result_ttl = None;
        c.failure_ttl = None;
    })
    .await;
    let api = d.api.clone();
    let mut digests = vec![];
    for (name, component, settings) in [
        ("echo", "echo", ""),
        ("steps", "three_steps", "events=user.signup"),
        ("hostile", "hostile", "max_attempts=1"),
        (
            "fail",
            "fail",
            "max_attempts=3&initial_backoff_ms=10&max_backoff_ms=20&jitter=false",
        ),
    ] {
        let f = api.deploy(name, guest(component), settings).await;
        digests.push(f["digest"].as_str().unwrap().to_owned());
    }
    let last = read(&api, &probe, &digests).await;
    let mut b = Bench {
        api: &api,
        probe: &probe,
        digests,
        last,
    };
    // A small tenant's first runs, while Redis still packs its indexes; then the warm-up.
    for i in 0..100 {
        start(&api, "echo", json!({ "n": i })).await;
    }
    b.batch("tiny run, a tenant's first", 100).await;
    for i in 0..200 {
        start(&api, "echo", json!({ "n": i })).await;
    }
    for i in 0..200 {
        let body = json!({ "name": "page.viewed", "data": { "page": i } });
        event(&api, body).await;
    }
    settle(&api, SETTLE).await;
    b.last = read(&api, &probe, &b.digests).await;

    for i in 0..500 {
        start(&api, "echo", json!({ "n": i })).await;
    }
    b.batch("tiny run", 500).await;
    for (size, n) in [(1_000, 100), (10_000, 50), (100_000, 20)] {
        for i in 0..n {
            start(&api, "echo", json!({ "n": i, "blob": "b".repeat(size) })).await;
        }
        b.batch(&format!("run, {size} B in and out"), n).await;
    }
    let steps =
        |count: u64, size: u64| json!({ "attack": "big-steps", "count": count, "size": size });
    for (count, size, runs) in [(100, 20, 20), (3, 20, 50), (10, 5_000, 10)] {
        for _ in 0..runs {
            start(&api, "hostile", steps(count, size)).await;
        }
        b.batch(&format!("{count} steps of {size} B + run"), count * runs)
            .await;
    }
    for _ in 0..20 {
        start(
            &api,
            "hostile",
            json!({ "attack": "log-and-fail", "count": 500 }),
        )
        .await;
    }
    b.batch("log line (+ failed run)", 10_000).await;
    for (kind, size, n) in [
        ("fatal", 100, 100),
        ("retryable", 100, 100),
        ("fatal", 8_000, 20),
    ] {
        for _ in 0..n {
            start(
                &api,
                "fail",
                json!({ "kind": kind, "message": "m".repeat(size) }),
            )
            .await;
        }
        let attempts = if kind == "fatal" { 1 } else { 3 };
        b.batch(&format!("failed run, {attempts}x {size} B error"), n)
            .await;
    }
    for i in 0..500 {
        event(
            &api,
            json!({ "name": "page.viewed", "data": { "page": i } }),
        )
        .await;
    }
    b.batch("event", 500).await;
    for i in 0..50 {
        let data = json!({ "page": i, "x": "x".repeat(4000) });
        event(&api, json!({ "name": "page.viewed", "data": data })).await;
    }
    b.batch("event, 4 KB data", 50).await;
    for i in 0..100 {
        event(
            &api,
            json!({ "name": "user.signup", "data": { "user": i } }),
        )
        .await;
    }
    b.batch("event + its 3-step run", 100).await;
    d.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("sqlite");
    let probe = Probe::Sqlite(data.join("wasq.db"));
    measure("sqlite", StoreBackend::Sqlite, probe, &data).await;

    let redis = RedisServer::start(RedisOptions::default());
    let probe = Probe::redis(&redis.url(), "default").await;
    let store = StoreBackend::Redis(redis.url());
    measure("redis", store, probe, &home.path().join("redis")).await;
}

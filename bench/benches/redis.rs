//! No-op runs through Redis, wasq beside BullMQ on the same `redis-server` in the same run.
//!
//! Both sides first enqueue N jobs (wasq then creates N/2 more over its HTTP API, 64
//! requests in flight), then one worker at concurrency 50 drains them; the figure is
//! drain throughput (jobs/s), and the enqueue and create rates are printed too. wasq then
//! does a second round, without the HTTP phase, with the `one_step` guest (one durable
//! step per run, its output stored). wasq's worker is the real daemon (`wasq worker` code
//! path: no API, Redis store, sandbox per run); each run instantiates its component in a
//! fresh wasmtime store. BullMQ's is
//! `bench/bullmq/drain.mjs` (bullmq from npm, installed with `npm ci` on first use).
//!
//! Redis's own cost is printed per phase from `INFO` before and after it: CPU µs per run
//! (user + sys of the server process; the figure that bounds what one shard carries
//! however many workers are added), memory per run (after the enqueue: what a queued run
//! takes) and the commands each run cost. BullMQ runs after wasq on the same server,
//! emptied first.
//!
//! `cargo bench -p wasq-bench --bench redis` (N defaults to 20000; `WASQ_BENCH_N` sets it).

mod queue;

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use queue::{RedisStats, npm_peer, redis_api, redis_worker, until_idle};
use tokio_util::sync::CancellationToken;
use wasq_core::SystemClock;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{RedisOptions, RedisServer};

const CONCURRENCY: usize = 50;
/// HTTP create requests in flight at once.
const HTTP_IN_FLIGHT: usize = 64;

/// One wasq round on a fresh API server and worker: `guest` deployed as `function`, N runs
/// enqueued (and, with `http`, N/2 created over HTTP), then drained. Returns the enqueue
/// and drain rates.
async fn wasq(url: &str, port: u16, n: usize, guest: &str, http: bool) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();

    // The API process deploys the function; it executes nothing.
    let (server, api) = redis_api(dir.path().join("server"), url, guest, shutdown.clone()).await;

    let store = Arc::new(
        RedisStore::connect(url, Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    let before = RedisStats::read(port);
    let start = Instant::now();
    queue::enqueue_n(store.clone(), guest, n, CONCURRENCY, |i| {
        format!(r#"{{"i":{i}}}"#).into_bytes()
    })
    .await;
    let enqueue = start.elapsed();
    let enqueued = RedisStats::read(port);

    // Creation through the real HTTP API, HTTP_IN_FLIGHT requests at a time: these runs
    // join the backlog the worker drains.
    let http_n = if http { n / 2 } else { 0 };
    let path = format!("/v1/functions/{guest}/runs");
    let start = Instant::now();
    queue::create_over_http(api.clone(), &path, http_n, HTTP_IN_FLIGHT, |_| {
        r#"{"i":0}"#.to_owned()
    })
    .await;
    let created = start.elapsed();
    let http_created = RedisStats::read(port);

    let mut config = redis_worker(dir.path().join("worker"), url, CONCURRENCY);
    config.scheduler = false;
    let start = Instant::now();
    let worker = wasq_server::start(config, shutdown.clone()).await.unwrap();
    until_idle(&*store).await;
    let drain = start.elapsed();
    let drained = RedisStats::read(port);
    shutdown.cancel();
    let _ = worker.wait().await;
    let _ = server.wait().await;
    let total = n + http_n;
    let per_sec = total as f64 / drain.as_secs_f64();
    before.report(
        &enqueued,
        &format!("wasq {guest} enqueue (store API)"),
        n,
        true,
    );
    if http {
        let what = format!("wasq {guest} create over HTTP");
        enqueued.report(&http_created, &what, http_n, true);
        println!(
            "  {what}: {:.0}/s ({HTTP_IN_FLIGHT} in flight, client in this process)",
            http_n as f64 / created.as_secs_f64()
        );
    }
    http_created.report(&drained, &format!("wasq {guest} drain"), total, true);
    println!(
        "{{\"system\":\"wasq\",\"guest\":\"{guest}\",\"n\":{total},\"concurrency\":{CONCURRENCY},\"enqueue_ms\":{:.1},\"drain_ms\":{:.1},\"per_sec\":{per_sec:.0}}}",
        enqueue.as_secs_f64() * 1e3,
        drain.as_secs_f64() * 1e3
    );
    (n as f64 / enqueue.as_secs_f64(), per_sec)
}

fn bullmq(port: u16, n: usize) -> (f64, f64) {
    let dir = npm_peer("bullmq");
    let before = RedisStats::read(port);
    let out = Command::new("node")
        .arg("drain.mjs")
        .args([port.to_string(), n.to_string(), CONCURRENCY.to_string()])
        .current_dir(&dir)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    before.report(
        &RedisStats::read(port),
        "BullMQ add + process (node)",
        n,
        false,
    );
    let line = String::from_utf8_lossy(&out.stdout);
    println!("{}", line.trim());
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let enqueue_per_sec = n as f64 * 1e3 / v["enqueue_ms"].as_f64().unwrap();
    (enqueue_per_sec, v["per_sec"].as_f64().unwrap())
}

fn main() {
    let n: usize = std::env::var("WASQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    // Same server, same settings for both: no AOF, so neither side waits on the disk.
    let redis = RedisServer::start(RedisOptions::default());
    let rt = queue::daemon_runtime();
    let (wq_enqueue, wq_drain) = rt.block_on(wasq(&redis.url(), redis.port(), n, "echo", true));
    let (_, wq_step_drain) = rt.block_on(wasq(&redis.url(), redis.port(), n, "one_step", false));
    // BullMQ starts from an empty Redis: neither wasq's runs nor the Lua state its
    // scripts left behind weigh on its figures.
    redis.cli(&["FLUSHALL"]);
    redis.cli(&["SCRIPT", "FLUSH"]);
    let (bm_enqueue, bm_drain) = bullmq(redis.port(), n);
    println!(
        "no-op runs through one Redis, one worker at concurrency {CONCURRENCY}, {n} jobs, {} cores:",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "  drain:   wasq {wq_drain:.0}/s, BullMQ {bm_drain:.0}/s, ratio {:.2}",
        wq_drain / bm_drain
    );
    println!(
        "  drain, wasq with one durable step per run: {wq_step_drain:.0}/s, ratio to BullMQ's no-op {:.2}",
        wq_step_drain / bm_drain
    );
    println!(
        "  enqueue: wasq {wq_enqueue:.0}/s (one enqueue per call, 50 in flight), BullMQ {bm_enqueue:.0}/s (addBulk of 1000), ratio {:.2}",
        wq_enqueue / bm_enqueue
    );
}

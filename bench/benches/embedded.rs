//! `wasq dev`'s embedded store (SQLite, WAL) beside RQ in the same run.
//!
//! wasq: the real daemon with `wasq dev`'s configuration (SQLite in a temporary data
//! folder, the API on a loopback port, the worker at `wasq dev`'s default concurrency,
//! a fresh sandbox per run). First the daemon runs with no worker while N runs of the
//! `one_step` guest (one durable step per run, stored in SQLite) are created over HTTP,
//! 64 in flight: the create rate. Then it restarts on the same data folder with its
//! worker, which drains the backlog: the drain rate, timed until the API lists no queued
//! or running run.
//!
//! RQ (`bench/rq`, from PyPI into a virtualenv on first use): `drain.py` enqueues N no-op
//! jobs (`enqueue_many` in pipelines of 1000, results dropped) on a redis-server of its
//! own and a `SimpleWorker` (jobs in its own process, no fork per job) drains them in burst
//! mode. RQ stores no steps: wasq does more per run.
//!
//! `cargo bench -p wasq-bench --bench embedded` (N defaults to 20000; `WASQ_BENCH_N`;
//! RQ drains at most 10000, its rate does not depend on N).

mod queue;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use wasq_store_redis::testing::{RedisOptions, RedisServer};

use queue::{peer_json, process_cpu, rq_peer};

const HTTP_IN_FLIGHT: usize = 64;
const RQ_MAX: usize = 10_000;

struct Figures {
    concurrency: usize,
    create_per_sec: f64,
    create_cpu_us: f64,
    drain_per_sec: f64,
    drain_cpu_us: f64,
}

async fn wasq(n: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // The backlog, created over HTTP with no worker running.
    let shutdown = CancellationToken::new();
    let server = wasq_server::start(queue::dev_config(&data, 0), shutdown.clone())
        .await
        .unwrap();
    let api = Arc::new(wasq_tests::Api::with_key(
        server.addr.unwrap(),
        server.dev_key.clone(),
    ));
    api.deploy("one_step", wasq_tests::guest("one_step"), "")
        .await;
    let (cpu, start) = (process_cpu(), Instant::now());
    queue::create_over_http(api, "/v1/functions/one_step/runs", n, HTTP_IN_FLIGHT, |i| {
        format!(r#"{{"i":{i},"pad":"{}"}}"#, "x".repeat(80))
    })
    .await;
    let create = start.elapsed();
    let create_cpu = process_cpu() - cpu;
    shutdown.cancel();
    server.wait().await.unwrap();

    // The same data folder with `wasq dev`'s worker.
    let concurrency = wasq_server::Config::dev(data.clone()).concurrency;
    let shutdown = CancellationToken::new();
    let (cpu, start) = (process_cpu(), Instant::now());
    let server = wasq_server::start(queue::dev_config(&data, concurrency), shutdown.clone())
        .await
        .unwrap();
    let api = wasq_tests::Api::with_key(server.addr.unwrap(), server.dev_key.clone());
    queue::until_idle_over_http(&api).await;
    let drain = start.elapsed();
    let drain_cpu = process_cpu() - cpu;
    let (code, body) = api.get("/v1/runs?status=succeeded&limit=1").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body[0]["status"], "succeeded", "the runs ran: {body}");
    shutdown.cancel();
    server.wait().await.unwrap();
    let per_run = |cpu: f64| cpu * 1e6 / n as f64;
    Figures {
        concurrency,
        create_per_sec: n as f64 / create.as_secs_f64(),
        create_cpu_us: per_run(create_cpu),
        drain_per_sec: n as f64 / drain.as_secs_f64(),
        drain_cpu_us: per_run(drain_cpu),
    }
}

fn main() {
    let n: usize = std::env::var("WASQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let wq = rt.block_on(wasq(n));

    // RQ on a redis-server of its own (RQ has no embedded store: Redis is its only one).
    let redis = RedisServer::start(RedisOptions::default());
    let rq_n = n.min(RQ_MAX);
    let rq = peer_json(
        &rq_peer(),
        ".venv/bin/python",
        &[
            "drain.py".into(),
            redis.port().to_string(),
            rq_n.to_string(),
        ],
    );
    let rq_drain = rq["per_sec"].as_f64().unwrap();
    let rq_enqueue = rq_n as f64 * 1e3 / rq["enqueue_ms"].as_f64().unwrap();

    println!(
        "wasq dev (SQLite) beside RQ, {n} runs ({rq_n} for RQ), {} cores:",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "  drain: wasq dev {:.0}/s (one durable step per run, concurrency {}; bench process {:.0} µs CPU/run), RQ SimpleWorker {rq_drain:.0}/s (no-op), ratio {:.1}",
        wq.drain_per_sec,
        wq.concurrency,
        wq.drain_cpu_us,
        wq.drain_per_sec / rq_drain
    );
    println!(
        "  create: wasq dev {:.0}/s over HTTP ({HTTP_IN_FLIGHT} in flight, client in this process; {:.0} µs CPU/run), RQ {rq_enqueue:.0}/s (enqueue_many of 1000)",
        wq.create_per_sec, wq.create_cpu_us
    );
    queue::write_json(
        "embedded",
        &serde_json::json!([
            {
                "system": "wasq-dev", "guest": "one_step", "n": n,
                "concurrency": wq.concurrency,
                "create_per_sec": wq.create_per_sec.round(),
                "drain_per_sec": wq.drain_per_sec.round(),
                "create_cpu_us_per_run": wq.create_cpu_us.round(),
                "drain_cpu_us_per_run": wq.drain_cpu_us.round(),
            },
            {
                "system": "rq", "worker": "SimpleWorker", "n": rq_n,
                "enqueue_per_sec": rq_enqueue.round(),
                "drain_per_sec": rq_drain.round(),
            },
            { "ratio": "drain wasq-dev / rq", "value": wq.drain_per_sec / rq_drain },
        ]),
    );
}

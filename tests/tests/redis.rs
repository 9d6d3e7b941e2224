//! The daemon on Redis: Redis itself killed -9 and kept down for 10 s while runs are
//! created and executed (issue 4, done-means 3 and 5), cron on two servers and through a
//! partition, `wasq dev --redis`. Killed and paused workers are in `chaos.rs`. Each test
//! starts its own `redis-server` on a free loopback port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Daemon, free_port, guest, now_ms};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_and_down_for_10s_loses_no_accepted_run() {
    let mut redis = RedisServer::start(RedisOptions {
        appendfsync: Some("always".into()),
        ..Default::default()
    });
    let url = redis.url();
    let daemon = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url);
        c.lease = Duration::from_secs(3);
        c.concurrency = 8;
    })
    .await;
    let api = daemon.api.clone();
    api.deploy("echo", guest("echo"), "").await;

    // Four clients create runs without pause until told to stop; each records what the API
    // answered. Answers other than 201 must be 503 (never a 2xx for a run not stored).
    let stop = Arc::new(AtomicBool::new(false));
    let outage = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (stop, outage) = (stop.clone(), outage.clone());
        let http = api.http.clone();
        let url = format!("{}/v1/functions/echo/runs", api.base);
        clients.spawn(async move {
            let (mut accepted, mut refused, mut refused_in_outage) = (vec![], 0, 0);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let resp = http
                    .post(&url)
                    .body(format!(r#"{{"client": {c}, "n": {n}}}"#))
                    .send()
                    .await
                    .expect("the API stays up while Redis is down");
                match resp.status().as_u16() {
                    201 => {
                        let body: Value = resp.json().await.unwrap();
                        accepted.push(body["id"].as_str().unwrap().to_owned());
                    }
                    503 => {
                        refused += 1;
                        if outage.load(Ordering::SeqCst) {
                            refused_in_outage += 1;
                        }
                        let body: Value = resp.json().await.unwrap();
                        assert_eq!(body["error"]["code"], "unavailable", "{body}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("creation answered {other}: {}", resp.text().await.unwrap()),
                }
            }
            (accepted, refused, refused_in_outage)
        });
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.kill();
    outage.store(true, Ordering::SeqCst);
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    outage.store(false, Ordering::SeqCst);
    redis.restart();
    eprintln!("Redis was down for {:?}", down.elapsed());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::SeqCst);

    let mut accepted = vec![];
    let (mut refused, mut refused_in_outage) = (0, 0);
    for (a, r, o) in clients.join_all().await {
        accepted.extend(a);
        refused += r;
        refused_in_outage += o;
    }
    assert!(
        refused_in_outage > 0,
        "no creation was refused while Redis was down"
    );
    eprintln!(
        "{} runs accepted, {refused} creations answered 503 ({refused_in_outage} during the outage)",
        accepted.len()
    );

    // Every accepted run is there and completes, including those created before the kill,
    // without restarting the daemon.
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in &accepted {
        let left = deadline.saturating_duration_since(Instant::now());
        let run = api.wait_run(id, left).await;
        assert_eq!(run["status"], "succeeded", "{run:#}");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_redis_fire_each_cron_tick_once() {
    let redis = RedisServer::start(RedisOptions::default());
    let mut daemons = vec![];
    for _ in 0..2 {
        let url = redis.url();
        daemons.push(
            Daemon::start_with(|c| {
                c.store = StoreBackend::Redis(url);
                c.concurrency = 2;
            })
            .await,
        );
    }
    let api = &daemons[0].api;
    api.deploy("ticker", guest("echo"), "cron=*/1%20*%20*%20*%20*%20*")
        .await;
    // The first tick comes within 2 s of the deploy (a new schedule fires from the next
    // whole second after a scheduler first sees it).
    tokio::time::sleep(Duration::from_millis(12_000)).await;

    let ticks = api.cron_ticks("ticker").await.expect("the API answers");
    assert_every_tick_once("ticker", &ticks, 10);
    for d in daemons {
        d.stop().await;
    }
}

/// Asserts that `function` (a schedule ticking every second) fired every tick (Unix ms,
/// oldest first) from its first to its last once, and at least `min` of them.
fn assert_every_tick_once(function: &str, ticks: &[i64], min: usize) {
    let mut once = ticks.to_vec();
    once.dedup();
    assert_eq!(once, ticks, "{function}: a tick fired twice");
    assert!(ticks.len() >= min, "{function}: {ticks:?}");
    assert_eq!(
        (ticks.last().unwrap() - ticks.first().unwrap()) / 1000 + 1,
        ticks.len() as i64,
        "{function}: a tick was skipped: {ticks:?}"
    );
}

/// Ticks of many schedules due while the server cannot reach Redis stay pending (the
/// scheduler enqueues a second's ticks together, and stops trying at the first refusal),
/// then each fires once when it can: no tick lost, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_ticks_due_during_a_partition_fire_once_after_it() {
    let redis = RedisServer::start(RedisOptions::default());
    let proxy =
        wasq_tests::Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let url = format!("redis://{}", proxy.addr);
    let d = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url);
        c.concurrency = 4;
    })
    .await;
    let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    for name in &names {
        d.api
            .deploy(name, guest("echo"), "cron=*/1%20*%20*%20*%20*%20*")
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut_at = now_ms();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.restore();
    let restored_at = now_ms();
    // Each schedule's ticks from before the cut to after the partition healed (however
    // long the server takes to reconnect), every one once.
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in &names {
        loop {
            // Err while the server has not reconnected yet.
            let ticks = d.api.cron_ticks(name).await.unwrap_or_default();
            // By whole seconds, as ticks fall.
            if ticks.last().is_some_and(|&t| t / 1000 > restored_at / 1000) {
                assert!(
                    ticks[0] / 1000 < cut_at / 1000,
                    "{name}: no tick before the cut: {ticks:?}"
                );
                assert_every_tick_once(name, &ticks, 1);
                break;
            }
            assert!(Instant::now() < deadline, "{name}: {ticks:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasq_dev_on_redis_runs_the_tour() {
    let redis = RedisServer::start(RedisOptions::default());
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join(".wasq");
    let dev = wasq_tests::DevProcess::spawn(&data, free_port(), &["--redis", &redis.url()]).await;
    dev.api.deploy("echo", guest("echo"), "").await;
    let (status, run) = dev
        .api
        .post("/v1/functions/echo/runs?wait=30s", r#"{"hello": "redis"}"#)
        .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["output"]["hello"], "redis", "{run:#}");
    // The run lives in Redis, under the tenant's hash tag.
    let keys = redis.cli(&["KEYS", "wasq:{default}:run:*"]);
    assert!(
        keys.contains(run["id"].as_str().unwrap()),
        "run not found in Redis: {keys}"
    );
}

/// Every command Redis executed so far (`INFO commandstats`, commands scripts call
/// included).
fn redis_commands(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// An attack on the cron scheduler: a tenant deploys hundreds of functions without a
/// schedule. The scheduler reads each tenant's scheduled functions every second, from an
/// index of them alone, so those functions cost Redis nothing per second (it read every
/// function of every tenant each second: 300 functions, 300 hash reads a second, for as
/// long as they stay deployed). The one schedule still fires every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_without_a_schedule_cost_the_cron_scheduler_nothing() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    // No worker: what Redis executes is the API's and the scheduler's.
    let d = Daemon::api_on_redis(&url, |_| {}).await;
    d.api
        .deploy("ticker", guest("echo"), "cron=*/1%20*%20*%20*%20*%20*")
        .await;
    const UNSCHEDULED: u64 = 300;
    for i in 0..UNSCHEDULED {
        d.api.deploy(&format!("plain-{i}"), guest("echo"), "").await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before, t0) = (redis_commands(&redis), Instant::now());
    let ticks_before = d.api.cron_ticks("ticker").await.expect("listed").len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ticks = d.api.cron_ticks("ticker").await.expect("listed");
    let per_second = (redis_commands(&redis) - before) as f64 / t0.elapsed().as_secs_f64();
    assert!(
        ticks.len() >= ticks_before + 4,
        "the schedule fires every second: {ticks:?}"
    );
    assert_every_tick_once("ticker", &ticks, 4);
    // A tick's enqueue and the two listings above cost some dozens of commands a second.
    assert!(
        per_second < (UNSCHEDULED / 3) as f64,
        "{per_second:.0} Redis commands a second with {UNSCHEDULED} functions without a schedule"
    );
    d.stop().await;
}

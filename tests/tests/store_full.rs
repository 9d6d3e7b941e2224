//! Issue 18: one tenant must not fill the store every tenant shares.
//! - On a Redis with `maxmemory`, a tenant that fills its storage quota is refused (507
//!   `storage_quota`, its running attempt fails `storage_quota`) while another tenant goes
//!   on with runs, steps and a deploy, and Redis never reaches its limit.
//! - Above the store guard's watermark new work is refused (503 `store_full`) and runs
//!   already accepted still complete; Redis's own OOM answer is `store_full` too, not
//!   "unavailable".
//! - On the embedded store, a disk below the minimum free space (an injected free-space
//!   source) refuses new work while accepted runs finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

fn redis_info(redis: &RedisServer, field: &str) -> u64 {
    redis
        .cli(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO memory"))
}

/// A `redis-server` with `maxmemory` and no eviction, DEBUG allowed (to fill it).
fn small_redis(maxmemory: &str) -> RedisServer {
    RedisServer::start(RedisOptions {
        extra_args: [
            "--maxmemory",
            maxmemory,
            "--maxmemory-policy",
            "noeviction",
            "--enable-debug-command",
            "local",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    })
}

async fn create(api: &Api, function: &str, input: &str) -> (u16, Value) {
    api.post(&format!("/v1/functions/{function}/runs"), input)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_filling_its_quota_leaves_redis_to_the_others() {
    let redis = small_redis("300mb");
    let url = redis.url();
    let d = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url);
        c.concurrency = 6;
    })
    .await;
    let (status, body) = d
        .admin
        .post(
            "/v1/tenants",
            &json!({"name": "hog", "quotas": {"max_stored_bytes": 100u64 << 20}}).to_string(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = d
        .admin
        .post("/v1/tenants/hog/keys", r#"{"label": "hog"}"#)
        .await;
    assert_eq!(status, 201, "{body}");
    let hog = d.api.as_key(Some(body["key"].as_str().unwrap().to_owned()));
    let good = d.admin.new_tenant("good").await;

    hog.deploy(
        "hostile",
        guest("hostile"),
        "max_attempts=1&timeout_ms=60000",
    )
    .await;
    good.deploy("three", guest("three_steps"), "").await;
    // The hog piles up 4 MB steps, three runs at once; the good tenant works meanwhile.
    let mut hog_runs = vec![];
    for _ in 0..3 {
        hog_runs.push(
            hog.start_run("hostile", r#"{"attack": "big-steps", "count": 40}"#)
                .await,
        );
    }
    let mut good_runs = vec![];
    for i in 0..30 {
        good_runs.push(
            good.start_run("three", &format!(r#"{{"pause_ms": 5, "n": {i}}}"#))
                .await,
        );
    }
    let mut reasons = vec![];
    for id in &hog_runs {
        let run = hog.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "failed", "{run:#}");
        assert_eq!(run["error"]["reason"], "storage_quota", "{run:#}");
        reasons.push(run["error"]["message"].as_str().unwrap().to_owned());
    }
    assert!(
        reasons
            .iter()
            .any(|m| m.contains("max_stored_bytes quota of 104857600")),
        "the tenant's quota stopped it: {reasons:#?}"
    );
    // At its quota, the hog's new work is refused with a clear reason: runs of 100 KB
    // fill what room is left, then 507.
    let pad = json!({ "attack": "big-steps", "count": 0, "pad": "p".repeat(100_000) }).to_string();
    let mut accepted = 0;
    let body = loop {
        let (status, body) = create(&hog, "hostile", &pad).await;
        if status != 201 {
            assert_eq!(status, 507, "{body}");
            break body;
        }
        accepted += 1;
        assert!(accepted < 100, "the quota never refused a run");
    };
    assert_eq!(body["error"]["code"], "storage_quota", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_stored_bytes"),
        "{body}"
    );
    // A component bigger than the room left (under 100 KB) is refused too.
    let (status, body) = hog.put("/v1/functions/other", guest("probe")).await;
    assert_eq!(status, 507, "a deploy over the quota: {body}");
    let (_, tenant) = hog.get("/v1/tenants/hog").await;
    let stored = tenant["usage"]["stored_bytes"].as_u64().unwrap();
    assert!(
        stored <= (100 << 20) + (1 << 20),
        "usage {stored} stays at the quota"
    );

    // The other tenant saw no error: its runs, more runs with steps, a deploy.
    for id in &good_runs {
        let run = good.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "succeeded", "{run:#}");
    }
    good.deploy("echo", guest("echo"), "").await;
    let id = good.start_run("three", r#"{"pause_ms": 1}"#).await;
    assert_eq!(good.wait_run(&id, WAIT).await["status"], "succeeded");
    // Usage against the quota: in the API, the CLI and the metrics.
    let (_, metrics) = d.admin.get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics.contains("wasq_tenant_stored_bytes{tenant=\"hog\"}")
            && metrics.contains("wasq_tenant_max_stored_bytes{tenant=\"hog\"} 104857600"),
        "{metrics}"
    );
    let admin_key = d.admin.key.clone().unwrap();
    let (code, out, err) = wasq_tests::run_cli(
        d.admin
            .cli()
            .env("WASQ_ADMIN_KEY", admin_key)
            .args(["tenants", "show", "hog"]),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("STORED / MAX") && out.contains("/ 100.0 MiB"),
        "{out}"
    );
    let used = redis_info(&redis, "used_memory");
    eprintln!(
        "hog stopped at {} MiB stored ({:?}); Redis used {} MiB of 300",
        stored >> 20,
        reasons
            .iter()
            .map(|r| r.chars().take(60).collect::<String>())
            .collect::<Vec<_>>(),
        used >> 20
    );
    assert!(used < 300 << 20, "Redis reached its maxmemory");
    d.stop().await;
}

/// Fills Redis with filler keys (`filler:*`) until `used_memory` reaches `fill` of
/// `maxmemory`.
fn fill_redis(redis: &RedisServer, fill: f64) {
    let max = redis_info(redis, "maxmemory") as f64;
    let mut round = 0;
    while (redis_info(redis, "used_memory") as f64) < fill * max {
        round += 1;
        redis.cli(&[
            "DEBUG",
            "POPULATE",
            "2000",
            &format!("filler:{round}"),
            "1000",
        ]);
        assert!(round < 10_000, "could not fill Redis");
    }
}

fn empty_filler(redis: &RedisServer) {
    redis.cli(&[
        "EVAL",
        "local n = 0 for _, k in ipairs(redis.call('KEYS', 'filler:*')) do redis.call('DEL', k) n = n + 1 end return n",
        "0",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn above_the_watermark_new_work_waits_and_accepted_runs_finish() {
    let redis = small_redis("48mb");
    let url = redis.url();
    let d = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url);
        c.concurrency = 8;
        c.guard.interval = Duration::from_millis(100);
    })
    .await;
    let api = &d.api;
    api.deploy("sleeper", guest("sleeper"), "").await;
    api.deploy("echo", guest("echo"), "").await;
    // Accepted before Redis fills up: they are asleep when the guard starts refusing.
    let mut accepted = vec![];
    for _ in 0..10 {
        accepted.push(api.start_run("sleeper", r#"{"sleep_ms": 2500}"#).await);
    }
    fill_redis(&redis, 0.93);
    let refused = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = create(api, "echo", "{}").await;
            if got.0 != 201 {
                break got;
            }
            assert!(
                Instant::now() < deadline,
                "the guard never refused new work"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "store_full", "{}", refused.1);
    let reason = refused.1["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        reason.contains("maxmemory") && reason.contains("watermark"),
        "{reason}"
    );
    let (status, body) = api
        .post("/v1/events", r#"{"name": "anything", "data": {}}"#)
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("store_full")),
        "{body}"
    );
    let (status, body) = api.put("/v1/functions/echo2", guest("echo")).await;
    assert_eq!(status, 503, "{body}");
    for id in &accepted {
        let run = api.wait_run(id, WAIT).await;
        assert_eq!(
            run["status"], "succeeded",
            "an accepted run finishes: {run:#}"
        );
    }
    eprintln!("refused while full: {reason}");

    // Room again: new work is accepted.
    empty_filler(&redis);
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let (status, body) = create(api, "echo", r#"{"again": true}"#).await;
        if status == 201 {
            break body["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "still refused: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(api.wait_run(&id, WAIT).await["status"], "succeeded");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_out_of_memory_is_store_full_not_unavailable() {
    let redis = small_redis("32mb");
    let url = redis.url();
    // No guard (a watermark over 100%): Redis itself refuses.
    let d = Daemon::start_with(|c| {
        c.store = StoreBackend::Redis(url);
        c.guard.memory_watermark = 2.0;
    })
    .await;
    d.api.deploy("echo", guest("echo"), "").await;
    fill_redis(&redis, 1.0);
    let (status, body) = create(
        &d.api,
        "echo",
        &json!({"pad": "x".repeat(50_000)}).to_string(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_full", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of memory"),
        "{body}"
    );
    empty_filler(&redis);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_refuses_new_work_and_accepted_runs_finish() {
    let free = Arc::new(AtomicU64::new(10 << 30));
    let source = free.clone();
    let d = Daemon::start_with(move |c| {
        c.guard.interval = Duration::from_millis(50);
        c.guard.free_space = Some(Arc::new(move || Ok(source.load(Ordering::SeqCst))));
    })
    .await;
    let api = &d.api;
    api.deploy("sleeper", guest("sleeper"), "").await;
    api.deploy("echo", guest("echo"), "").await;
    let mut accepted = vec![];
    for _ in 0..8 {
        accepted.push(api.start_run("sleeper", r#"{"sleep_ms": 1500}"#).await);
    }
    // The disk fills up: 100 MiB left, under the 512 MiB minimum.
    free.store(100 << 20, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let got = create(api, "echo", "{}").await;
        if got.0 != 201 {
            break got;
        }
        assert!(Instant::now() < deadline, "new work was never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_full", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("100 MiB free") && message.contains("minimum of 512 MiB"),
        "{message}"
    );
    for id in &accepted {
        let run = api.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "succeeded", "{run:#}");
    }
    free.store(10 << 30, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let id = api.start_run("echo", "{}").await;
    assert_eq!(api.wait_run(&id, WAIT).await["status"], "succeeded");
    d.stop().await;
}

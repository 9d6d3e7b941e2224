//! Flow control under contention: several workers (each its own store and connections)
//! claim from one Redis or one Cluster at once. Concurrency keys and the tenant's
//! `max_running` are checked inside the claim script, so however the claims interleave no
//! key ever has more runs executing than its limit, the tenant never more than its quota,
//! and every run still completes exactly once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasq_core::flow::{ConcurrencyLimit, KeyExpr};
use wasq_core::*;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{self, RedisCluster, RedisOptions, RedisServer};

const RUNS: usize = 240;
const WORKERS: usize = 4;
const KEYS: usize = 4;
const PER_KEY: usize = 2;
const MAX_RUNNING: u32 = 5;

async fn connect(url: &str) -> RedisStore {
    testing::connect(url, "flow").await
}

#[derive(Default)]
struct Seen {
    /// Runs executing now, per key and in all.
    running: HashMap<String, usize>,
    total: usize,
    /// The most seen at once.
    max_per_key: usize,
    max_total: usize,
    done: HashMap<RunId, usize>,
}

async fn limits_hold(url: &str) {
    let producer = connect(url).await;
    producer
        .create_tenant(Tenant {
            name: "acme".into(),
            created_at: SystemClock.now_ms(),
            quotas: Quotas {
                max_running: MAX_RUNNING,
                ..Quotas::default()
            },
        })
        .await
        .unwrap();
    producer
        .deploy(DeployRequest {
            tenant: "acme".into(),
            name: "f".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: FunctionSettings {
                flow: FlowControl {
                    concurrency: Some(ConcurrencyLimit {
                        limit: PER_KEY as u32,
                        key: Some(KeyExpr::parse("input.customer").unwrap()),
                    }),
                    ..FlowControl::default()
                },
                ..FunctionSettings::default()
            },
            events: vec![],
            schedule: None,
        })
        .await
        .unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let store = connect(url).await;
        let (seen, stop) = (seen.clone(), stop.clone());
        workers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let claimed = store
                    .claim(ClaimRequest {
                        worker: format!("w{w}"),
                        limit: 3,
                        lease_ms: 10_000,
                        queues: Vec::new(),
                    })
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    store
                        .wait_for_work(Duration::from_millis(200), &[])
                        .await
                        .expect("wait");
                    continue;
                }
                let mut running = tokio::task::JoinSet::new();
                for c in claimed {
                    let key = c.run.keys.concurrency.clone().expect("keyed run");
                    {
                        let mut s = seen.lock().unwrap();
                        let n = s.running.entry(key.clone()).or_default();
                        *n += 1;
                        let n = *n;
                        s.total += 1;
                        s.max_per_key = s.max_per_key.max(n);
                        s.max_total = s.max_total.max(s.total);
                    }
                    let (store, seen) = (store.clone(), seen.clone());
                    running.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        // Counted as ended before the store frees the slot.
                        {
                            let mut s = seen.lock().unwrap();
                            *s.running.get_mut(&key).unwrap() -= 1;
                            s.total -= 1;
                        }
                        let done = Outcome::Succeeded {
                            output: b"1".to_vec(),
                            fuel_used: None,
                        };
                        store.finish(&c.lease, done).await.expect("finish");
                        *seen.lock().unwrap().done.entry(c.run.id).or_default() += 1;
                    });
                }
                while running.join_next().await.is_some() {}
            }
        });
    }
    let t = Instant::now();
    let mut ids = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let input = serde_json::json!({ "customer": format!("c{}", i % KEYS) });
        let run = producer
            .enqueue(EnqueueRequest {
                tenant: "acme".into(),
                function: "f".into(),
                input: input.to_string().into_bytes(),
                trigger: "api".into(),
                ..EnqueueRequest::default()
            })
            .await
            .unwrap()
            .run;
        ids.push(run.id);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().done.len() < RUNS {
        assert!(
            Instant::now() < deadline,
            "only {} of {RUNS} runs done",
            seen.lock().unwrap().done.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = workers.join_next().await {
        r.expect("worker");
    }
    let s = seen.lock().unwrap();
    for id in &ids {
        assert_eq!(s.done.get(id), Some(&1), "run {id} ran exactly once");
    }
    assert!(
        s.max_per_key <= PER_KEY,
        "{} runs of one key at once",
        s.max_per_key
    );
    assert!(
        s.max_total <= MAX_RUNNING as usize,
        "{} runs of the tenant at once",
        s.max_total
    );
    assert!(s.max_total >= 2, "keys ran in parallel ({})", s.max_total);
    eprintln!(
        "{RUNS} runs, {WORKERS} workers: done in {:?}; at most {} per key (limit {PER_KEY}), {} in all (max_running {MAX_RUNNING})",
        t.elapsed(),
        s.max_per_key,
        s.max_total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_keys_and_max_running_hold_across_workers_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    limits_hold(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_keys_and_max_running_hold_across_workers_cluster() {
    let cluster = RedisCluster::start(3);
    limits_hold(&cluster.url()).await;
}

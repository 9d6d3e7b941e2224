//! Several worker processes (each its own store and connections) against one Redis or one
//! Cluster, while a producer enqueues runs for several tenants, some delayed: every run
//! succeeds exactly once and none waits for a periodic sweep (the schedule never loses a
//! tenant).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasq_core::*;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{self, RedisCluster, RedisOptions, RedisServer};

const TENANTS: [&str; 4] = ["north", "south", "east", "west"];
const RUNS: usize = 400;
const WORKERS: usize = 3;

async fn connect(url: &str) -> RedisStore {
    testing::connect(url, "workers").await
}

async fn many_workers(url: &str) {
    let producer = connect(url).await;
    for tenant in TENANTS {
        producer
            .deploy(DeployRequest {
                tenant: tenant.into(),
                name: "f".into(),
                digest: "d".into(),
                component: b"c".to_vec(),
                settings: FunctionSettings::default(),
                events: vec![],
                schedule: None,
            })
            .await
            .unwrap();
    }
    let successes: Arc<Mutex<HashMap<RunId, usize>>> = Arc::default();
    let lost = Arc::new(AtomicUsize::new(0));
    let claims = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let store = connect(url).await;
        let (successes, lost, stop, claims) = (
            successes.clone(),
            lost.clone(),
            stop.clone(),
            claims.clone(),
        );
        workers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                claims.fetch_add(1, Ordering::Relaxed);
                let claimed = store
                    .claim(ClaimRequest {
                        worker: format!("w{w}"),
                        limit: 8,
                        lease_ms: 10_000,
                        queues: Vec::new(),
                    })
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    store
                        .wait_for_work(Duration::from_millis(500), &[])
                        .await
                        .expect("wait");
                    continue;
                }
                for c in claimed {
                    let done = Outcome::Succeeded {
                        output: b"1".to_vec(),
                        fuel_used: None,
                    };
                    match store.finish(&c.lease, done).await {
                        Ok(_) => *successes.lock().unwrap().entry(c.run.id).or_default() += 1,
                        Err(StoreError::LeaseLost(_)) => {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("finish: {e}"),
                    }
                }
            }
        });
    }
    let t = Instant::now();
    let mut ids = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let due_at = (i % 5 == 0).then(|| SystemClock.now_ms() + (i % 7) as i64 * 60);
        let run = producer
            .enqueue(EnqueueRequest {
                tenant: TENANTS[i % TENANTS.len()].into(),
                function: "f".into(),
                input: b"{}".to_vec(),
                trigger: "api".into(),
                due_at,
                idempotency_key: None,
                retry: None,
                parent: None,
                priority: None,
                trace: None,
            })
            .await
            .unwrap()
            .run;
        ids.push(run.id);
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let enqueued_in = t.elapsed();
    let deadline = Instant::now() + Duration::from_secs(20);
    while successes.lock().unwrap().len() < RUNS {
        assert!(
            Instant::now() < deadline,
            "only {} of {RUNS} runs done",
            successes.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = t.elapsed();
    // Idle workers block: a second without work costs a few claims, not a busy loop
    // (left-over wake tokens, at most 64, may each cost one).
    let before = claims.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_claims = claims.load(Ordering::Relaxed) - before;
    assert!(
        idle_claims < 64 + 4 * WORKERS,
        "{idle_claims} claims in an idle second"
    );
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = workers.join_next().await {
        r.expect("worker");
    }
    let successes = successes.lock().unwrap();
    for id in &ids {
        assert_eq!(
            successes.get(id),
            Some(&1),
            "run {id} succeeded exactly once"
        );
    }
    assert_eq!(lost.load(Ordering::Relaxed), 0, "no lease was lost");
    eprintln!(
        "{RUNS} runs, {} tenants, {WORKERS} workers: enqueued in {enqueued_in:?}, all done after {took:?}; {idle_claims} claims in an idle second",
        TENANTS.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_workers_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    many_workers(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_workers_cluster() {
    let cluster = RedisCluster::start(3);
    many_workers(&cluster.url()).await;
}

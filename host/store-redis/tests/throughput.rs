//! A rough throughput figure (ignored by default: timing on a shared 2-core machine is
//! noise). `cargo test -p wasq-store-redis --test throughput -- --ignored --nocapture`

use std::sync::Arc;
use std::time::Instant;

use wasq_core::*;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{RedisCluster, RedisOptions, RedisServer};

const N: usize = 20_000;
const IN_FLIGHT: usize = 50;

async fn measure(url: &str, label: &str) {
    let store = Arc::new(
        RedisStore::connect(url, Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    store
        .deploy(DeployRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "f".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: FunctionSettings::default(),
            events: vec![],
            schedule: None,
        })
        .await
        .unwrap();
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..IN_FLIGHT {
        let store = store.clone();
        tasks.spawn(async move {
            for i in (k..N).step_by(IN_FLIGHT) {
                store
                    .enqueue(EnqueueRequest {
                        tenant: DEFAULT_TENANT.into(),
                        function: "f".into(),
                        input: format!(r#"{{"i":{i}}}"#).into_bytes(),
                        trigger: "bench".into(),
                        ..EnqueueRequest::default()
                    })
                    .await
                    .unwrap();
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let enqueue = t.elapsed();
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..IN_FLIGHT / 10 {
        let store = store.clone();
        tasks.spawn(async move {
            let mut done = 0;
            loop {
                let batch = store
                    .claim(ClaimRequest {
                        worker: format!("w{k}"),
                        limit: 10,
                        lease_ms: 30_000,
                        queues: Vec::new(),
                    })
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return done;
                }
                let finishes = batch.iter().map(|c| {
                    store.finish(
                        &c.lease,
                        Outcome::Succeeded {
                            output: b"1".to_vec(),
                            fuel_used: None,
                        },
                    )
                });
                for r in futures_util::future::join_all(finishes).await {
                    r.unwrap();
                }
                done += batch.len();
            }
        });
    }
    let mut done = 0;
    while let Some(r) = tasks.join_next().await {
        done += r.unwrap();
    }
    assert_eq!(done, N);
    let drain = t.elapsed();
    eprintln!(
        "{label}: enqueue {:.0}/s ({IN_FLIGHT} in flight), claim+finish {:.0}/s",
        N as f64 / enqueue.as_secs_f64(),
        N as f64 / drain.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    measure(&server.url(), "single node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_cluster() {
    let cluster = RedisCluster::start(3);
    measure(&cluster.url(), "cluster").await;
}

//! The shared conformance suite against a real redis-server and a real 3-master Cluster,
//! each scenario in a fresh namespace (an empty keyspace, no FLUSHALL).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use wasq_store_redis::testing::{RedisCluster, RedisOptions, RedisServer};
use wasq_store_redis::{RedisStore, StoreOptions};

static NEXT: AtomicUsize = AtomicUsize::new(0);

async fn run_suite(url: String) {
    wasq_core::conformance::run_all(|clock| {
        let url = url.clone();
        async move {
            let ns = format!("conformance{}", NEXT.fetch_add(1, Ordering::Relaxed));
            RedisStore::connect_with(
                &url,
                Arc::new(clock),
                StoreOptions::default().with_namespace(ns),
            )
            .await
            .expect("connect")
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    let t = Instant::now();
    run_suite(server.url()).await;
    eprintln!("single node: conformance suite took {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_cluster() {
    let t = Instant::now();
    let cluster = RedisCluster::start(3);
    eprintln!("cluster: started 3 masters in {:?}", t.elapsed());
    let t = Instant::now();
    run_suite(cluster.url()).await;
    eprintln!("cluster: conformance suite took {:?}", t.elapsed());
}

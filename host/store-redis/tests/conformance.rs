//! The shared conformance suite against a real redis-server and a real 3-master Cluster,
//! one test per scenario and topology (and on a single node once more with every end
//! reading its run whole), each scenario in a fresh namespace (an empty
//! keyspace, no FLUSHALL): a server of its own on a single node, one cluster shared by the
//! test process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use wasq_core::ManualClock;
use wasq_store_redis::testing::{RedisCluster, RedisOptions, RedisServer};
use wasq_store_redis::{RedisStore, StoreOptions};

static NEXT: AtomicUsize = AtomicUsize::new(0);

async fn connect(url: &str, clock: ManualClock) -> RedisStore {
    let ns = format!("conformance{}", NEXT.fetch_add(1, Ordering::Relaxed));
    RedisStore::connect_with(
        url,
        Arc::new(clock),
        StoreOptions::default().with_namespace(ns),
    )
    .await
    .expect("connect")
}

mod single_node {
    use super::*;

    async fn fresh(clock: ManualClock) -> (RedisStore, RedisServer) {
        let server = RedisServer::start(RedisOptions::default());
        (connect(&server.url(), clock).await, server)
    }

    wasq_core::conformance_tests!(fresh);
}

/// Every end reads its run whole, as one of a lease another process claimed does (see
/// `StoreOptions::lease_memos`).
mod single_node_without_memos {
    use super::*;

    async fn fresh(clock: ManualClock) -> (RedisStore, RedisServer) {
        let server = RedisServer::start(RedisOptions::default());
        let ns = format!("conformance{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let opts = StoreOptions {
            lease_memos: false,
            ..StoreOptions::default().with_namespace(ns)
        };
        let store = RedisStore::connect_with(&server.url(), Arc::new(clock), opts)
            .await
            .expect("connect");
        (store, server)
    }

    wasq_core::conformance_tests!(fresh);
}

mod cluster {
    use super::*;

    async fn fresh(clock: ManualClock) -> (RedisStore, ()) {
        let store = connect(&RedisCluster::shared().url(), clock).await;
        assert!(store.is_cluster());
        (store, ())
    }

    wasq_core::conformance_tests!(fresh);
}

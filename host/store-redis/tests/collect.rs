//! Redis forgets components nothing uses any more (issue 10, finding 11): a component
//! stays while a function or a run of any tenant uses it, or while it was used lately, and
//! goes once neither holds.

use std::sync::Arc;
use std::time::Duration;

use wasq_core::*;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_store_redis::{RedisStore, StoreOptions};

fn deploy(tenant: &str, name: &str, digest: &str) -> DeployRequest {
    DeployRequest {
        tenant: tenant.into(),
        name: name.into(),
        digest: digest.into(),
        component: format!("bytes of {digest}").into_bytes(),
        settings: FunctionSettings::default(),
        events: vec![],
        schedule: None,
    }
}

#[tokio::test]
async fn unreferenced_components_are_collected() {
    let redis = RedisServer::start(RedisOptions::default());
    let clock = ManualClock::new(1_700_000_000_000);
    let store = RedisStore::connect_with(
        &redis.url(),
        Arc::new(clock.clone()),
        StoreOptions::default().with_namespace("gc"),
    )
    .await
    .unwrap();
    store.deploy(deploy("a", "f", "old")).await.unwrap();
    store.deploy(deploy("b", "g", "shared")).await.unwrap();
    store.deploy(deploy("a", "h", "shared")).await.unwrap();
    let run = store
        .enqueue(EnqueueRequest {
            tenant: "a".into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        })
        .await
        .unwrap()
        .run;
    // f moves on; its queued run still pins `old`.
    store.deploy(deploy("a", "f", "new")).await.unwrap();
    let none = Duration::ZERO;
    assert_eq!(store.collect_components(none).await.unwrap(), 0);
    assert!(store.component("old").await.unwrap().is_some());

    store
        .cancel(RunAction::cancel("a", &run.id, "key:test"))
        .await
        .unwrap();
    clock.advance(1_000);
    let purge = PurgeRequest {
        succeeded_before: clock.now_ms(),
        failed_before: clock.now_ms(),
        limit: 100,
    };
    assert_eq!(store.purge(purge).await.unwrap(), 1);
    // Used a moment ago: kept for now.
    assert_eq!(
        store
            .collect_components(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.collect_components(none).await.unwrap(), 1);
    assert!(
        store.component("old").await.unwrap().is_none(),
        "nothing uses it"
    );
    for kept in ["new", "shared"] {
        assert!(store.component(kept).await.unwrap().is_some(), "{kept}");
    }
    // Tenant b's function keeps `shared` even when a's goes elsewhere.
    store.deploy(deploy("a", "h", "new")).await.unwrap();
    assert_eq!(store.collect_components(none).await.unwrap(), 0);
    assert!(store.component("shared").await.unwrap().is_some());
}

/// Which components runs pin is counted as each run is created (`rdig`). Only runs from
/// before that count existed make the first collection walk every run of their tenant,
/// one script call that blocks Redis for as long as the walk takes: a tenant deployed
/// before it had any runs is never walked, and one with older runs still is, once,
/// without losing a pin.
#[tokio::test]
async fn only_runs_older_than_the_pin_counts_are_walked_to_count_them() {
    let redis = RedisServer::start(RedisOptions::default());
    let store = RedisStore::connect_with(
        &redis.url(),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        StoreOptions::default().with_namespace("gc"),
    )
    .await
    .unwrap();
    let enqueue = |tenant: &str| EnqueueRequest {
        tenant: tenant.into(),
        function: "f".into(),
        input: b"{}".to_vec(),
        trigger: "api".into(),
        ..EnqueueRequest::default()
    };
    let built = |tenant: &str| {
        let meta = format!("{}meta", store.tenant_prefix(tenant));
        redis.cli(&["HGET", &meta, "rdig"]).trim().to_owned()
    };

    // A new tenant: complete from its first deploy, so the walk never runs.
    store.deploy(deploy("new", "f", "fresh")).await.unwrap();
    assert_eq!(built("new"), "1");
    store.enqueue(enqueue("new")).await.unwrap();

    // A tenant whose run predates the counts (as data written before them looks: no
    // counts, no flag). Deploying again does not mark it complete: it has runs.
    store.deploy(deploy("old", "f", "pinned")).await.unwrap();
    store.enqueue(enqueue("old")).await.unwrap();
    let p = store.tenant_prefix("old");
    redis.cli(&["DEL", &format!("{p}rdig")]);
    redis.cli(&["HDEL", &format!("{p}meta"), "rdig"]);
    store.deploy(deploy("old", "f", "next")).await.unwrap();
    assert_eq!(built("old"), "");

    // The collection walks it once: its queued run still pins `pinned`.
    assert_eq!(store.collect_components(Duration::ZERO).await.unwrap(), 0);
    assert_eq!(built("old"), "1");
    for kept in ["fresh", "pinned", "next"] {
        assert!(store.component(kept).await.unwrap().is_some(), "{kept}");
    }
}

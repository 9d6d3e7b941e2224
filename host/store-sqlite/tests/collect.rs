//! The embedded store forgets what nothing refers to any more (issue 10, finding 11): a
//! component stays while a function or a run uses it and goes with the purge after; event
//! ids go after their dedup window.

use std::sync::Arc;

use wasq_core::*;
use wasq_store_sqlite::SqliteStore;

const T0: i64 = 1_700_000_000_000;

fn deploy(name: &str, digest: &str) -> DeployRequest {
    DeployRequest {
        tenant: DEFAULT_TENANT.into(),
        name: name.into(),
        digest: digest.into(),
        component: format!("bytes of {digest}").into_bytes(),
        settings: FunctionSettings::default(),
        events: vec![],
        schedule: None,
    }
}

#[tokio::test]
async fn unreferenced_components_and_old_event_ids_are_collected() {
    let clock = ManualClock::new(T0);
    let store = SqliteStore::open_in_memory(Arc::new(clock.clone())).unwrap();
    store.deploy(deploy("f", "old")).await.unwrap();
    let run = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        })
        .await
        .unwrap()
        .run;
    // The function moves on to a new component; its run still pins the old one.
    store.deploy(deploy("f", "new")).await.unwrap();
    store
        .send_event(EventRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "nobody.listens".into(),
            data: serde_json::json!({}),
            id: Some("e1".into()),
            trace: None,
        })
        .await
        .unwrap();
    let purge = |at: i64| PurgeRequest {
        succeeded_before: at,
        failed_before: at,
        limit: 100,
    };
    store.purge(purge(clock.now_ms())).await.unwrap();
    assert!(
        store.component("old").await.unwrap().is_some(),
        "a queued run still needs it"
    );

    store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &run.id, "key:test"))
        .await
        .unwrap();
    clock.advance(IDEMPOTENCY_WINDOW_MS + 1);
    let before = store.usage(DEFAULT_TENANT).await.unwrap().stored_bytes;
    assert_eq!(store.purge(purge(clock.now_ms())).await.unwrap(), 1);
    assert!(
        store.component("old").await.unwrap().is_none(),
        "nothing refers to it any more"
    );
    assert!(
        store.component("new").await.unwrap().is_some(),
        "the function's"
    );
    let after = store.usage(DEFAULT_TENANT).await.unwrap().stored_bytes;
    assert!(after < before, "the run and the event id were given back");
    // The event id is forgotten: the same id is accepted again.
    let again = store
        .send_event(EventRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "nobody.listens".into(),
            data: serde_json::json!({}),
            id: Some("e1".into()),
            trace: None,
        })
        .await
        .unwrap();
    assert!(again.accepted);
}

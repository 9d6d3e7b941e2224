//! Scenarios of [`Queue::enqueue_batch`]: a batch creates its runs as single enqueues
//! would, in order, and is refused as a whole.

use serde_json::json;

use super::*;

fn req(tenant: &str, function: &str, input: serde_json::Value) -> EnqueueRequest {
    EnqueueRequest {
        tenant: tenant.into(),
        function: function.into(),
        input: input.to_string().into_bytes(),
        trigger: "api".into(),
        ..EnqueueRequest::default()
    }
}

async fn count(store: &impl Store, tenant: &str) -> usize {
    let q = RunQuery {
        tenant: tenant.into(),
        limit: 100,
        ..RunQuery::default()
    };
    store.runs(q).await.unwrap().len()
}

pub(super) async fn enqueue_batch(store: impl Store + Directory, clock: ManualClock) {
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_queued: 5,
                max_run_bytes: 4096,
                ..Quotas::default()
            },
            ..tenant("b")
        })
        .await
        .unwrap();
    deploy_flow(&store, "b", "f", FlowControl::default()).await;

    // Each request's own key, delay and priority; answers in order.
    let batch = vec![
        EnqueueRequest {
            idempotency_key: Some("k".into()),
            ..req("b", "f", json!({"n": 1}))
        },
        EnqueueRequest {
            due_at: Some(T0 + 1_000),
            ..req("b", "f", json!({"n": 2}))
        },
        EnqueueRequest {
            priority: Some(-5),
            ..req("b", "f", json!({"n": 3}))
        },
    ];
    let made = store.enqueue_batch(batch).await.unwrap();
    assert_eq!(made.len(), 3);
    assert!(
        made.iter()
            .all(|e| e.created && e.run.status == RunStatus::Queued)
    );
    let inputs: Vec<_> = made.iter().map(|e| e.run.input.clone()).collect();
    assert_eq!(
        inputs,
        [
            br#"{"n":1}"#.to_vec(),
            br#"{"n":2}"#.to_vec(),
            br#"{"n":3}"#.to_vec()
        ]
    );
    assert_eq!(made[1].run.due_at, T0 + 1_000);
    assert_eq!(made[2].run.priority, -5);
    for e in &made {
        assert_eq!(
            status_of(&store, "b", &e.run.id).await,
            e.run,
            "the answer is the stored run"
        );
    }

    // Over max_queued (3 queued + 3 > 5): refused whole, nothing created.
    let over = (0..3).map(|n| req("b", "f", json!({"over": n}))).collect();
    match store.enqueue_batch(over).await {
        Err(StoreError::QuotaExceeded { .. }) => {}
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert_eq!(
        count(&store, "b").await,
        3,
        "a refused batch creates nothing"
    );

    // Every run of a batch counts, a repeated key too (3 + 2 = 5): the repeat answers the
    // first run, not created.
    clock.advance(10);
    let again = vec![
        EnqueueRequest {
            idempotency_key: Some("k".into()),
            ..req("b", "f", json!({"n": 1}))
        },
        req("b", "f", json!({"n": 4})),
    ];
    let made2 = store.enqueue_batch(again).await.unwrap();
    assert_eq!(
        (made2[0].created, &made2[0].run.id),
        (false, &made[0].run.id)
    );
    assert!(made2[1].created);
    assert_eq!(count(&store, "b").await, 4);

    // A run over max_run_bytes refuses the batch (4 + 1 fit max_queued); so does an
    // unknown function.
    let big = vec![req("b", "f", json!({"pad": "x".repeat(5000)}))];
    match store.enqueue_batch(big).await {
        Err(StoreError::StorageQuota(_)) => {}
        other => panic!("expected StorageQuota, got {other:?}"),
    }
    match store.enqueue_batch(vec![req("b", "nope", json!({}))]).await {
        Err(StoreError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_eq!(count(&store, "b").await, 4);
    assert!(store.enqueue_batch(Vec::new()).await.unwrap().is_empty());

    // Debounce inside one batch: each run replaces the one before it, as one by one.
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "d",
        FlowControl {
            debounce: Some(Debounce {
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let burst = (1..=3)
        .map(|n| req(DEFAULT_TENANT, "d", json!({"k": "x", "n": n})))
        .collect();
    let made = store.enqueue_batch(burst).await.unwrap();
    let now: Vec<_> = statuses(&store, &made).await;
    assert_eq!(
        now,
        [RunStatus::Skipped, RunStatus::Skipped, RunStatus::Queued]
    );
}

async fn statuses(store: &impl Store, made: &[Enqueued]) -> Vec<RunStatus> {
    let mut out = Vec::new();
    for e in made {
        out.push(status_of(store, &e.run.tenant, &e.run.id).await.status);
    }
    out
}

//! Scenarios of [`Queue::enqueue_batch`]: a batch creates its runs as single enqueues
//! would, in order, and is refused as a whole; and of enqueues made at once, which a
//! backend may send together but must answer each as if alone.

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
    deploy_flow(&store, DEFAULT_TENANT, "d", debounced_by_k()).await;
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

/// Enqueues made at once (a backend may send them in one call: Redis does) are each
/// answered as alone: created, an earlier run of the same key, or refused for what that
/// run alone meets (an unknown function, `max_queued`, a storage quota), whatever the
/// others met; of runs debounced by one key, one stays queued.
pub(super) async fn concurrent_enqueues(store: impl Store + Directory, _clock: ManualClock) {
    use futures_util::future::join_all;
    for (name, max_queued) in [("c", 5), ("c2", Quotas::default().max_queued)] {
        store
            .create_tenant(Tenant {
                quotas: Quotas {
                    max_queued,
                    max_run_bytes: 4096,
                    ..Quotas::default()
                },
                ..tenant(name)
            })
            .await
            .unwrap();
        deploy_flow(&store, name, "f", FlowControl::default()).await;
    }
    deploy_flow(&store, "c2", "d", debounced_by_k()).await;

    // Tenant c: 8 runs and 2 of one idempotency key against max_queued 5. Tenant c2: an
    // unknown function, a run over max_run_bytes, 3 runs, and 3 debounced by one key.
    let keyed = || EnqueueRequest {
        idempotency_key: Some("k".into()),
        ..req("c", "f", json!({"keyed": true}))
    };
    let mut reqs: Vec<EnqueueRequest> = (0..8).map(|n| req("c", "f", json!({"n": n}))).collect();
    reqs.insert(3, keyed());
    reqs.insert(7, keyed());
    reqs.push(req("c2", "nope", json!({})));
    reqs.push(req("c2", "f", json!({"pad": "x".repeat(5000)})));
    reqs.extend((0..3).map(|n| req("c2", "f", json!({"n": n}))));
    reqs.extend((0..3).map(|n| req("c2", "d", json!({"k": "x", "n": n}))));
    let answers = join_all(reqs.iter().cloned().map(|r| store.enqueue(r))).await;

    let (mut created, mut refused) = (Vec::new(), 0);
    for (r, a) in reqs.iter().zip(&answers) {
        if r.tenant != "c" {
            continue;
        }
        match a {
            Ok(e) if e.created => created.push(e.run.id.clone()),
            Ok(e) => assert_eq!(r.idempotency_key.as_deref(), Some("k"), "{e:?}"),
            Err(StoreError::QuotaExceeded { .. }) => refused += 1,
            Err(e) => panic!("an enqueue of tenant c: {e:?}"),
        }
    }
    created.sort();
    created.dedup();
    assert_eq!(
        created.len(),
        5,
        "max_queued holds across runs sent at once"
    );
    assert_eq!(count(&store, "c").await, 5);
    // The keyed pair: both answer one run (one created it), or both were refused.
    match (&answers[3], &answers[7]) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.run.id, b.run.id);
            assert!(a.created != b.created, "one of the pair created the run");
            assert_eq!(refused, 4, "10 asked, 5 created, 1 answered the keyed run");
        }
        (Err(_), Err(_)) => assert_eq!(refused, 5, "10 asked, 5 created"),
        other => panic!("one key, two fates: {other:?}"),
    }
    // (A debounced run's answer is as created: a later one of its key replaced it.)
    for (_, a) in reqs.iter().zip(&answers).filter(|(r, _)| r.function != "d") {
        let Ok(a) = a else { continue };
        assert_eq!(
            status_of(&store, &a.run.tenant, &a.run.id).await,
            a.run,
            "an answer is the stored run"
        );
    }

    let c2 = &answers[10..];
    assert!(matches!(c2[0], Err(StoreError::NotFound(_))), "{:?}", c2[0]);
    assert!(
        matches!(c2[1], Err(StoreError::StorageQuota(_))),
        "{:?}",
        c2[1]
    );
    for a in &c2[2..5] {
        let a = a.as_ref().expect("a run beside refused ones is created");
        assert!(a.created && a.run.status == RunStatus::Queued);
    }
    let debounced: Vec<Enqueued> = c2[5..]
        .iter()
        .map(|a| a.clone().expect("a debounced run is admitted"))
        .collect();
    let mut now = statuses(&store, &debounced).await;
    now.sort_by_key(|s| s.as_str());
    assert_eq!(
        now,
        [RunStatus::Queued, RunStatus::Skipped, RunStatus::Skipped],
        "each debounced run replaces the one before it"
    );
    assert_eq!(count(&store, "c2").await, 6);
}

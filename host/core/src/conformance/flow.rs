//! Scenarios of flow control and quotas: concurrency keys, throttles, rate limits,
//! debounce, priority, max_queued, max_running and fairness between tenants.

use super::*;

pub(super) async fn concurrency_keys(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            concurrency: Some(ConcurrencyLimit {
                limit: 1,
                key: key("input.c"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    // (A key is the tenant's text: any character, `|` too.)
    let a1 = enq(&store, "f", json!({"c": "a|1|"})).await;
    let a2 = enq(&store, "f", json!({"c": "a|1|"})).await;
    let b1 = enq(&store, "f", json!({"c": "b"})).await;
    assert_eq!(a1.keys.concurrency.as_deref(), Some("a|1|"));
    let got = claim(&store, "w", 10).await;
    assert_eq!(
        ids(&got),
        [a1.id.clone(), b1.id.clone()],
        "one per key, keys in parallel"
    );
    assert!(claim(&store, "w", 10).await.is_empty(), "a's slot is taken");
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &a2.id).await.status,
        RunStatus::Queued,
        "held back, not dropped"
    );
    clock.advance(5);
    store.finish(&got[0].lease, ok()).await.unwrap();
    let next = claim(&store, "w", 10).await;
    assert_eq!(ids(&next), [a2.id.as_str()], "the freed slot goes to a2");

    // Without a key the limit is the function's; a sleeping run frees its slot, and its
    // wake-up waits for one like any other run.
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "g",
        FlowControl {
            concurrency: Some(ConcurrencyLimit {
                limit: 2,
                key: None,
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let g: Vec<Run> = vec![
        enq(&store, "g", json!({})).await,
        enq(&store, "g", json!({})).await,
        enq(&store, "g", json!({})).await,
    ];
    let first = claim(&store, "w", 10).await;
    assert_eq!(ids(&first), [g[0].id.clone(), g[1].id.clone()]);
    let now = clock.now_ms();
    store
        .finish(
            &first[0].lease,
            Outcome::Suspended {
                until: now + 100,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let third = claim(&store, "w", 10).await;
    assert_eq!(ids(&third), [g[2].id.clone()], "the sleeper's slot is free");
    clock.advance(100);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "the woken sleeper waits for a slot"
    );
    store
        .finish(&first[1].lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let woke = claim(&store, "w", 10).await;
    assert_eq!(ids(&woke), [g[0].id.clone()]);
    assert_eq!(woke[0].run.attempt, 1, "a resume, not a new attempt");
}

pub(super) async fn throttle(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            throttle: Some(RateLimit {
                limit: 2,
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let mut a = vec![];
    for _ in 0..5 {
        a.push(enq(&store, "f", json!({"k": "a"})).await);
    }
    let b = enq(&store, "f", json!({"k": "b"})).await;
    let first = claim(&store, "w", 10).await;
    assert_eq!(
        ids(&first),
        [a[0].id.clone(), a[1].id.clone(), b.id.clone()]
    );
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "a's window is full"
    );
    // Retries are not throttled: only first starts count.
    store
        .finish(&first[0].lease, failed(ErrorReason::Retryable, Some(0)))
        .await
        .unwrap();
    let retried = claim(&store, "w", 10).await;
    assert_eq!(ids(&retried), [a[0].id.clone()]);
    assert_eq!(retried[0].run.attempt, 2);
    clock.advance(999);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "not before the window moves"
    );
    clock.advance(1);
    let second = claim(&store, "w", 10).await;
    assert_eq!(ids(&second), [a[2].id.clone(), a[3].id.clone()]);
    clock.advance(500);
    assert!(claim(&store, "w", 10).await.is_empty());
    clock.advance(500);
    assert_eq!(ids(&claim(&store, "w", 10).await), [a[4].id.clone()]);
    let skipped = store
        .runs(query(None, Some(RunStatus::Skipped)))
        .await
        .unwrap();
    assert!(skipped.is_empty(), "a throttle drops nothing");
}

pub(super) async fn rate_limit(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            rate_limit: Some(RateLimit {
                limit: 2,
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let a1 = enq(&store, "f", json!({"k": "a"})).await;
    let a2 = enq(&store, "f", json!({"k": "a"})).await;
    let over = try_enqueue(&store, DEFAULT_TENANT, "f", json!({"k": "a"}), None, None)
        .await
        .unwrap();
    assert!(over.created, "a skipped run is still recorded");
    assert_eq!(over.run.status, RunStatus::Skipped);
    assert_eq!(over.run.finished_at, Some(T0));
    let err = over.run.error.clone().expect("a skipped run says why");
    assert_eq!(err.reason, ErrorReason::RateLimited);
    assert!(err.message.contains("\"a\""), "{}", err.message);
    let b1 = enq(&store, "f", json!({"k": "b"})).await;
    assert_eq!(
        (a1.status, a2.status, b1.status),
        (RunStatus::Queued, RunStatus::Queued, RunStatus::Queued)
    );
    let skipped: Vec<String> = store
        .runs(query(None, Some(RunStatus::Skipped)))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(skipped, [over.run.id.as_str()]);
    clock.advance(999);
    let late = enq(&store, "f", json!({"k": "a"})).await;
    assert_eq!(
        late.status,
        RunStatus::Skipped,
        "the window has not moved yet"
    );
    clock.advance(1);
    let a3 = enq(&store, "f", json!({"k": "a"})).await;
    assert_eq!(a3.status, RunStatus::Queued);
    let got = claim(&store, "w", 10).await;
    let mut got = ids(&got);
    got.sort();
    let mut want = vec![a1.id, a2.id, b1.id, a3.id];
    want.sort();
    assert_eq!(got, want, "skipped runs are never claimed");
}

pub(super) async fn debounce(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            debounce: Some(Debounce {
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let r1 = enq(&store, "f", json!({"k": "x", "n": 1})).await;
    clock.advance(100);
    let r2 = enq(&store, "f", json!({"k": "x", "n": 2})).await;
    clock.advance(100);
    let r3 = enq(&store, "f", json!({"k": "x", "n": 3})).await;
    let y = enq(&store, "f", json!({"k": "y"})).await;
    assert_eq!((r3.status, r3.due_at), (RunStatus::Queued, T0 + 1200));
    for (old, by) in [(&r1, &r2), (&r2, &r3)] {
        let old = status_of(&store, DEFAULT_TENANT, &old.id).await;
        assert_eq!(old.status, RunStatus::Skipped);
        let err = old.error.expect("a replaced run says by whom");
        assert_eq!(err.reason, ErrorReason::Debounced);
        assert!(err.message.contains(&by.id), "{}", err.message);
    }
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &y.id).await.status,
        RunStatus::Queued,
        "keys debounce separately"
    );
    clock.set(T0 + 1199);
    assert!(claim(&store, "w", 10).await.is_empty());
    clock.set(T0 + 1200);
    let got = claim(&store, "w", 10).await;
    assert_eq!(ids(&got), [r3.id.clone(), y.id.clone()]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[0].run.input).unwrap(),
        json!({"k": "x", "n": 3}),
        "the last input"
    );
    // A run that started is no longer replaced.
    let r4 = enq(&store, "f", json!({"k": "x", "n": 4})).await;
    assert_eq!(r4.due_at, T0 + 2200);
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &r3.id).await.status,
        RunStatus::Running
    );
}

pub(super) async fn priority(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            priority: 10,
            priority_aging_ms: 100,
            ..FlowControl::default()
        },
    )
    .await;
    let low1 = enq(&store, "f", json!({})).await;
    let low2 = enq(&store, "f", json!({})).await;
    let high = try_enqueue(&store, DEFAULT_TENANT, "f", json!({}), Some(1), None)
        .await
        .unwrap()
        .run;
    assert_eq!((low1.priority, high.priority), (10, 1));
    let order: Vec<String> = [
        claim(&store, "w", 1).await,
        claim(&store, "w", 1).await,
        claim(&store, "w", 1).await,
    ]
    .iter()
    .flat_map(|c| ids(c))
    .collect();
    assert_eq!(
        order,
        [high.id, low1.id, low2.id],
        "lower first, FIFO within"
    );

    // Aging: a priority-10 run ranks as if due 9 × 100 ms after a priority-1 run of the
    // same time, so a steady stream of priority-1 runs overtakes it for 900 ms only.
    let starving = enq(&store, "f", json!({})).await;
    let start = clock.now_ms();
    let mut started_after = None;
    for i in 1..=20 {
        clock.advance(100);
        try_enqueue(&store, DEFAULT_TENANT, "f", json!({}), Some(1), None)
            .await
            .unwrap();
        if claim(&store, "w", 1).await[0].run.id == starving.id {
            started_after = Some(i);
            break;
        }
    }
    assert_eq!(
        started_after,
        Some(9),
        "starts once newer runs rank after it ({} ms of priority-1 runs first)",
        clock.now_ms() - start
    );
}

pub(super) async fn max_queued(store: impl Store + Directory, _clock: ManualClock) {
    use serde_json::json;
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_queued: 2,
                ..Quotas::default()
            },
            ..tenant("q")
        })
        .await
        .unwrap();
    deploy_flow(&store, "q", "f", FlowControl::default()).await;
    let first = try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .unwrap();
    let refused = try_enqueue(&store, "q", "f", json!({}), None, None).await;
    match refused {
        Err(StoreError::QuotaExceeded { retry_after_ms, .. }) => assert!(retry_after_ms > 0),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    let count = |runs: Vec<Run>| runs.len();
    let q = || RunQuery {
        tenant: "q".into(),
        limit: 100,
        ..RunQuery::default()
    };
    assert_eq!(count(store.runs(q()).await.unwrap()), 2, "nothing created");
    // Events are refused as a whole; children of admitted runs are not refused.
    let event = store
        .send_event(EventRequest {
            tenant: "q".into(),
            name: "f.go".into(),
            data: json!({}),
            id: Some("e1".into()),
            trace: None,
        })
        .await;
    assert!(
        matches!(event, Err(StoreError::QuotaExceeded { .. })),
        "{event:?}"
    );
    // Children of admitted runs go on past max_queued, up to twice it: no further.
    for _ in 0..2 {
        let child = try_enqueue(&store, "q", "f", json!({}), None, Some(&first.id))
            .await
            .expect("a child may go past max_queued");
        assert_eq!(child.run.status, RunStatus::Queued);
    }
    let third = try_enqueue(&store, "q", "f", json!({}), None, Some(&first.id)).await;
    assert!(
        matches!(third, Err(StoreError::QuotaExceeded { .. })),
        "children cannot grow the queue past twice max_queued: {third:?}"
    );
    assert_eq!(count(store.runs(q()).await.unwrap()), 4);
    // Starting runs makes room, for new runs only below max_queued.
    let started = claim(&store, "w", 2).await;
    assert_eq!(started.len(), 2);
    assert!(
        try_enqueue(&store, "q", "f", json!({}), None, None)
            .await
            .is_err(),
        "2 queued: still full"
    );
    let more = claim(&store, "w", 2).await;
    assert_eq!(more.len(), 2);
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .expect("room again");
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .expect("room again");
    assert!(
        try_enqueue(&store, "q", "f", json!({}), None, None)
            .await
            .is_err()
    );
    let sent = store
        .send_event(EventRequest {
            tenant: "q".into(),
            name: "f.go".into(),
            data: json!({}),
            id: Some("e1".into()),
            trace: None,
        })
        .await;
    assert!(sent.is_err(), "still full");
    // A manual retry queues a run again: refused while the queue is full.
    let dead = store
        .finish(&started[0].lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let retried = store
        .retry(RunAction::retry("q", &dead.id, "key:test"))
        .await;
    assert!(
        matches!(retried, Err(StoreError::QuotaExceeded { .. })),
        "{retried:?}"
    );
    assert_eq!(claim(&store, "w", 1).await.len(), 1);
    let retried = store
        .retry(RunAction::retry("q", &dead.id, "key:test"))
        .await
        .expect("room for it now");
    assert_eq!(retried.status, RunStatus::Queued);
    // A tenant without a record has no quotas.
    deploy_flow(&store, "free", "f", FlowControl::default()).await;
    for _ in 0..5 {
        try_enqueue(&store, "free", "f", json!({}), None, None)
            .await
            .expect("unlimited");
    }
}

pub(super) async fn max_running(store: impl Store + Directory, clock: ManualClock) {
    use serde_json::json;
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_running: 2,
                ..Quotas::default()
            },
            ..tenant("r")
        })
        .await
        .unwrap();
    deploy_flow(&store, "r", "f", FlowControl::default()).await;
    for _ in 0..4 {
        try_enqueue(&store, "r", "f", json!({}), None, None)
            .await
            .unwrap();
    }
    let first = claim(&store, "w", 10).await;
    assert_eq!(first.len(), 2, "at most max_running at once");
    assert!(claim(&store, "w", 10).await.is_empty());
    store.finish(&first[0].lease, ok()).await.unwrap();
    let next = claim(&store, "w", 10).await;
    assert_eq!(next.len(), 1);
    let now = clock.now_ms();
    store
        .finish(
            &next[0].lease,
            Outcome::Suspended {
                until: now + 50,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        claim(&store, "w", 10).await.len(),
        1,
        "a sleeper frees its slot"
    );
    clock.advance(50);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "the woken sleeper waits too"
    );
    // Raising the quota applies to the next claim.
    store
        .set_quotas(
            "r",
            Quotas {
                max_running: 3,
                ..Quotas::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(claim(&store, "w", 10).await.len(), 1);
}

pub(super) async fn fairness(store: impl Store, _clock: ManualClock) {
    use serde_json::json;
    deploy_flow(&store, "noisy", "f", FlowControl::default()).await;
    deploy_flow(&store, "quiet", "f", FlowControl::default()).await;
    for _ in 0..300 {
        try_enqueue(&store, "noisy", "f", json!({}), None, None)
            .await
            .unwrap();
    }
    let quiet = try_enqueue(&store, "quiet", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let got = claim(&store, "w", 2).await;
    assert!(
        got.iter().any(|c| c.run.id == quiet.id),
        "the quiet tenant's run goes in the first claim of two"
    );
    let tenants: Vec<&str> = got.iter().map(|c| c.lease.tenant.as_str()).collect();
    assert!(tenants.contains(&"noisy"), "{tenants:?}");
}

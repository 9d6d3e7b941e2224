//! Scenarios of named queues ([`crate::queues`]): a claim naming queues takes runs of
//! those queues only, in the order named; a claim naming none takes every queue; a run
//! keeps the queue it was created in; depths are counted per queue.

use serde_json::json;

use super::*;

async fn deploy_on(store: &impl Store, tenant: &str, name: &str, queue: &str) {
    let settings = FunctionSettings {
        queue: queue.into(),
        ..settings(3)
    };
    deploy_with(store, tenant, name, settings, vec![]).await;
}

async fn claim_from(store: &impl Store, queues: &[&str], limit: usize) -> Vec<Claimed> {
    store
        .claim(ClaimRequest {
            worker: format!("w-{}", queues.join("-")),
            limit,
            lease_ms: LEASE,
            queues: queues.iter().map(|q| q.to_string()).collect(),
        })
        .await
        .expect("claim")
}

fn functions(claimed: &[Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.run.function.clone()).collect()
}

/// Asserts the tenant's queue depths: (queue, queued, running) for each queue.
async fn assert_depths(store: &impl Store, tenant: &str, want: &[(&str, u64, u64)]) {
    let got: Vec<(String, u64, u64)> = store
        .queue_depths(tenant)
        .await
        .expect("queue depths")
        .into_iter()
        .map(|d| (d.queue, d.queued, d.running))
        .collect();
    let want: Vec<(String, u64, u64)> = want
        .iter()
        .map(|&(q, queued, running)| (q.to_owned(), queued, running))
        .collect();
    assert_eq!(got, want, "queue depths of {tenant}");
}

/// Ends `lease` with `outcome`, then asserts the default tenant's queue depths.
async fn end_then_depths(
    store: &impl Store,
    lease: &Lease,
    outcome: Outcome,
    want: &[(&str, u64, u64)],
) {
    store.finish(lease, outcome).await.unwrap();
    assert_depths(store, DEFAULT_TENANT, want).await;
}

pub(super) async fn named_queues(store: impl Store, clock: ManualClock) {
    deploy_on(&store, DEFAULT_TENANT, "email", "critical").await;
    deploy_on(
        &store,
        DEFAULT_TENANT,
        "report",
        crate::queues::DEFAULT_QUEUE,
    )
    .await;
    deploy_on(&store, DEFAULT_TENANT, "bulk", "low").await;
    deploy_on(&store, "other", "email", "critical").await;
    for i in 0..3 {
        enq(&store, "report", json!(i)).await;
    }
    for i in 0..2 {
        enq(&store, "email", json!(i)).await;
        enq(&store, "bulk", json!(i)).await;
    }
    let theirs = try_enqueue(&store, "other", "email", json!(0), None, None)
        .await
        .unwrap()
        .run;
    assert_eq!(theirs.settings.queue, "critical", "the run pins its queue");
    assert_depths(
        &store,
        DEFAULT_TENANT,
        &[("critical", 2, 0), ("default", 3, 0), ("low", 2, 0)],
    )
    .await;

    // A claim naming one queue takes only its runs, of every tenant.
    let critical = claim_from(&store, &["critical"], 10).await;
    assert_eq!(functions(&critical), ["email"; 3], "only the critical runs");
    let tenants: Vec<&str> = critical.iter().map(|c| c.lease.tenant.as_str()).collect();
    assert!(tenants.contains(&"other"), "{tenants:?}");
    assert!(claim_from(&store, &["critical"], 10).await.is_empty());

    // Queues in the order named: every startable run of the first before the second.
    let got = claim_from(&store, &["low", "default"], 3).await;
    assert_eq!(functions(&got), ["bulk", "bulk", "report"]);
    assert_depths(
        &store,
        DEFAULT_TENANT,
        &[("critical", 0, 2), ("default", 2, 1), ("low", 0, 2)],
    )
    .await;

    // A run retried after a failure waits in its queue again: the end moves it from the
    // queue's running runs to its queued ones.
    let retried = critical
        .iter()
        .find(|c| c.lease.tenant == DEFAULT_TENANT)
        .expect("a critical run of the default tenant");
    let failed = Outcome::Failed {
        error: RunError::new(ErrorReason::Trap, "boom"),
        retry_in_ms: Some(0),
        fuel_used: None,
    };
    let after = [("critical", 1, 1), ("default", 2, 1), ("low", 0, 2)];
    end_then_depths(&store, &retried.lease, failed, &after).await;
    assert_eq!(claim_from(&store, &["default", "low"], 10).await.len(), 2);
    let again = claim_from(&store, &["critical"], 10).await;
    assert_eq!(ids(&again), std::slice::from_ref(&retried.run.id));
    // An end that succeeds leaves the queue's running runs.
    let done = Outcome::Succeeded {
        output: b"1".to_vec(),
        fuel_used: None,
    };
    let after = [("critical", 0, 1), ("default", 0, 3), ("low", 0, 2)];
    end_then_depths(&store, &again[0].lease, done, &after).await;

    // A delayed run becomes due while only other queues are claimed: it waits for its own.
    let later = clock.now_ms() + 5_000;
    let delayed = enqueue_at(&store, "email", "late", later).await;
    clock.advance(6_000);
    assert!(claim_from(&store, &["default", "low"], 10).await.is_empty());
    assert_eq!(
        ids(&claim_from(&store, &["critical"], 10).await),
        std::slice::from_ref(&delayed.id)
    );

    // Redeploying moves new runs only; a claim naming no queue takes every queue.
    deploy_on(&store, DEFAULT_TENANT, "email", "low").await;
    let moved = enq(&store, "email", json!("moved")).await;
    assert_eq!(moved.settings.queue, "low");
    enq(&store, "report", json!("r")).await;
    assert!(claim_from(&store, &["critical"], 10).await.is_empty());
    let all = claim_from(&store, &[], 10).await;
    let mut fs = functions(&all);
    fs.sort();
    assert_eq!(fs, ["email", "report"]);
    assert_depths(&store, "other", &[("critical", 0, 1)]).await;
}

/// Without queues named, every queue is one: rank alone orders, across queues.
pub(super) async fn all_queues_rank_together(store: impl Store, clock: ManualClock) {
    deploy_on(&store, DEFAULT_TENANT, "a", "one").await;
    deploy_on(&store, DEFAULT_TENANT, "b", "two").await;
    let mut order = Vec::new();
    for i in 0..6 {
        let f = if i % 2 == 0 { "a" } else { "b" };
        order.push(enq(&store, f, json!(i)).await.id);
        clock.advance(1);
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(ids(&claim_from(&store, &[], 2).await));
    }
    assert_eq!(got, order, "oldest first, whatever the queue");
}

/// `load` counts the runs that have not ended per function and status, and knows the
/// oldest queued one.
pub(super) async fn load(store: impl Store, clock: ManualClock) {
    deploy_on(&store, DEFAULT_TENANT, "a", "default").await;
    deploy_on(&store, DEFAULT_TENANT, "b", "other").await;
    let first = enq(&store, "a", json!(1)).await;
    clock.advance(10);
    for i in 0..2 {
        enq(&store, "b", json!(i)).await;
    }
    enq(&store, "a", json!(2)).await;
    let c = claim_from(&store, &["other"], 1).await;
    assert_eq!(c.len(), 1);
    let load = store.load(DEFAULT_TENANT).await.unwrap();
    assert_eq!(
        load.counts,
        vec![
            ("a".into(), RunStatus::Queued, 2),
            ("b".into(), RunStatus::Queued, 1),
            ("b".into(), RunStatus::Running, 1),
        ]
    );
    assert_eq!(load.oldest_queued_at, Some(first.created_at));
    store.finish(&c[0].lease, ok()).await.unwrap();
    let load = store.load(DEFAULT_TENANT).await.unwrap();
    assert_eq!(load.counts.len(), 2, "ended runs are not counted: {load:?}");
    assert_eq!(store.load("nobody").await.unwrap(), RunLoad::default());
}

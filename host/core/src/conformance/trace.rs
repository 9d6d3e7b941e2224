//! Trace context: the W3C `traceparent` of what created a run is kept with it and comes
//! back with every read of it — the run, a listing, a claim (where a worker in any
//! process continues the trace) — from every way of creating runs.

use super::*;
use crate::TraceParent;

fn trace(n: u8) -> TraceParent {
    TraceParent::new(
        0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4700 + u128::from(n),
        0xf067,
        true,
    )
    .expect("ids are not zero")
}

fn traced(function: &str, input: &str, t: Option<TraceParent>) -> EnqueueRequest {
    EnqueueRequest {
        tenant: DEFAULT_TENANT.into(),
        function: function.into(),
        input: input.as_bytes().to_vec(),
        trigger: "api".into(),
        trace: t,
        ..EnqueueRequest::default()
    }
}

pub(super) async fn trace_context(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d1", 3).await;
    deploy_with(
        &store,
        DEFAULT_TENANT,
        "on_event",
        settings(3),
        vec!["traced.go".into()],
    )
    .await;

    // Kept by a single create, answered at once and by every read.
    let run = store
        .enqueue(traced("f", r#"{"n":1}"#, Some(trace(1))))
        .await
        .expect("enqueue")
        .run;
    assert_eq!(run.trace, Some(trace(1)), "the created run");
    assert_eq!(detail(&store, &run.id).await.run.trace, Some(trace(1)));
    let plain = enqueue(&store, "f", r#"{"n":2}"#).await;
    assert_eq!(plain.trace, None, "a run created without one has none");
    assert_eq!(detail(&store, &plain.id).await.run.trace, None);
    let listed = store.runs(query(Some("f"), None)).await.expect("list");
    let of = |id: &str| {
        listed
            .iter()
            .find(|r| r.id == id)
            .expect("listed")
            .trace
            .clone()
    };
    assert_eq!(of(&run.id), Some(trace(1)), "listed");
    assert_eq!(of(&plain.id), None);

    // A repeated idempotency key answers the first run, with the first run's trace.
    let keyed = |t| EnqueueRequest {
        idempotency_key: Some("k".into()),
        ..traced("f", "{}", Some(t))
    };
    let first = store.enqueue(keyed(trace(2))).await.expect("enqueue").run;
    let again = store.enqueue(keyed(trace(3))).await.expect("enqueue");
    assert!(!again.created);
    assert_eq!(again.run.trace, Some(trace(2)), "{first:?}");

    // A batch keeps each run's own.
    let made = store
        .enqueue_batch(vec![
            traced("f", r#"{"b":1}"#, Some(trace(4))),
            traced("f", r#"{"b":2}"#, None),
        ])
        .await
        .expect("batch");
    assert_eq!(made[0].run.trace, Some(trace(4)));
    assert_eq!(made[1].run.trace, None);
    assert_eq!(
        detail(&store, &made[0].run.id).await.run.trace,
        Some(trace(4))
    );

    // An event's runs carry the event's.
    let sent = store
        .send_event(EventRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "traced.go".into(),
            data: serde_json::json!({}),
            id: None,
            trace: Some(trace(5)),
        })
        .await
        .expect("send event");
    assert_eq!(sent.started.len(), 1);
    assert_eq!(
        detail(&store, &sent.started[0]).await.run.trace,
        Some(trace(5))
    );

    // A claim hands it to the worker, and the run keeps it to its end and after.
    let claimed = claim(&store, "w", 100).await;
    assert_eq!(claimed.len(), 6, "every run above");
    for c in &claimed {
        let stored = detail(&store, &c.run.id).await.run.trace;
        assert_eq!(c.run.trace, stored, "claimed as stored");
    }
    let c = claimed
        .iter()
        .find(|c| c.run.id == run.id)
        .expect("claimed");
    let ended = store.finish(&c.lease, ok()).await.expect("finish");
    assert_eq!(ended.status, RunStatus::Succeeded);
    assert_eq!(ended.trace, Some(trace(1)));
    assert_eq!(detail(&store, &run.id).await.run.trace, Some(trace(1)));
}

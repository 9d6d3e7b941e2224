//! Storage scenarios: exact accounting, the per-run and per-tenant quotas, the per-run log
//! budget, and big step outputs read by reference.

use serde_json::json;

use super::*;
use crate::storage::INLINE_REPLAY_BYTES;

async fn stored(store: &(impl Store + Directory), tenant: &str) -> u64 {
    store.usage(tenant).await.unwrap().stored_bytes
}

fn line(attempt: u32, message: String) -> LogLine {
    LogLine {
        attempt,
        at: T0,
        level: LogLevel::Info,
        source: LogSource::Guest,
        message,
    }
}

fn step(name: &str, occurrence: u32, output: Vec<u8>) -> Record {
    Record::Step {
        name: name.into(),
        occurrence,
        output,
        logs: vec![],
    }
}

async fn quota_tenant(store: &(impl Store + Directory), name: &str, quotas: Quotas) {
    store
        .create_tenant(Tenant {
            quotas,
            ..tenant(name)
        })
        .await
        .unwrap();
    deploy_flow(store, name, "f", FlowControl::default()).await;
}

async fn claim_one(store: &impl Store) -> Claimed {
    let mut c = claim(store, "w", 1).await;
    assert_eq!(c.len(), 1, "one run to claim");
    c.remove(0)
}

/// A tenant's usage is the exact sum of what its runs, events and functions were
/// charged, and a purge gives every byte of a run back.
pub(super) async fn usage_is_exact(store: impl Store + Directory, clock: ManualClock) {
    quota_tenant(&store, "s", Quotas::default()).await;
    let functions_only = stored(&store, "s").await;
    assert!(functions_only > 0, "a function's component is counted");

    let mut ids = vec![];
    for i in 0..3 {
        let input = json!({ "i": i, "pad": "x".repeat(500 * i) });
        let r = try_enqueue(&store, "s", "f", input, None, None)
            .await
            .unwrap()
            .run;
        assert!(r.stored_bytes > r.input.len() as u64, "{r:?}");
        ids.push(r.id);
    }
    let c = claim_one(&store).await;
    let lines = (0..5).map(|i| line(1, format!("line {i}"))).collect();
    store.record(&c.lease, Record::Logs(lines)).await.unwrap();
    store
        .record(&c.lease, step("a", 0, vec![b'1'; 3000]))
        .await
        .unwrap();
    // A step stored twice (a replayed record) is charged once.
    store
        .record(&c.lease, step("a", 0, vec![b'1'; 3000]))
        .await
        .unwrap();
    let output = vec![b'2'; 2000];
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let c = claim_one(&store).await;
    store
        .finish(&c.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();

    let mut runs_total = 0;
    for id in &ids {
        let r = status_of(&store, "s", id).await;
        runs_total += r.stored_bytes + r.log_bytes;
    }
    let first = status_of(&store, "s", &ids[0]).await;
    assert!(
        first.stored_bytes > 5000 && first.log_bytes > 0,
        "{first:?}"
    );
    assert_eq!(stored(&store, "s").await, functions_only + runs_total);

    let before_event = stored(&store, "s").await;
    store
        .send_event(EventRequest {
            tenant: "s".into(),
            name: "nothing.listens".into(),
            data: json!({ "big": "y".repeat(1000) }),
            id: Some("e1".into()),
            trace: None,
        })
        .await
        .unwrap();
    assert!(
        stored(&store, "s").await > before_event,
        "an event's record is counted"
    );

    // Everything ended is purged after its retention, the event id after its window:
    // what is left is the function and the queued run.
    clock.advance(IDEMPOTENCY_WINDOW_MS + 1);
    let left = status_of(&store, "s", &ids[2]).await;
    let purged = store
        .purge(PurgeRequest {
            succeeded_before: clock.now_ms(),
            failed_before: clock.now_ms(),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(
        stored(&store, "s").await,
        functions_only + left.stored_bytes + left.log_bytes,
        "a purge gives back everything the runs and the event were charged"
    );
}

/// A step or an output over `max_run_bytes` is refused (`StorageQuota`), nothing of it is
/// stored, and the run can still fail cleanly.
pub(super) async fn run_quota(store: impl Store + Directory, _clock: ManualClock) {
    let max = 20_000;
    quota_tenant(
        &store,
        "r",
        Quotas {
            max_run_bytes: max,
            ..Quotas::default()
        },
    )
    .await;
    let run = try_enqueue(&store, "r", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let c = claim_one(&store).await;
    let mut accepted = 0;
    let refusal = loop {
        match store
            .record(&c.lease, step("s", accepted, vec![b'x'; 4000]))
            .await
        {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 10, "max_run_bytes never refused a step");
    };
    assert!(
        matches!(&refusal, StoreError::StorageQuota(m) if m.contains("max_run_bytes")),
        "{refusal:?}"
    );
    assert!(!refusal.is_retryable());
    let d = store.run("r", &run.id).await.unwrap().unwrap();
    assert_eq!(
        d.steps_total,
        u64::from(accepted),
        "the refused step is not stored"
    );
    assert!(d.run.stored_bytes <= max, "{:?}", d.run);
    let big = store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: vec![b'o'; 10_000],
                fuel_used: None,
            },
        )
        .await;
    assert!(matches!(big, Err(StoreError::StorageQuota(_))), "{big:?}");
    let error = RunError::new(ErrorReason::StorageQuota, "over max_run_bytes");
    let ended = store
        .finish(
            &c.lease,
            Outcome::Failed {
                error,
                retry_in_ms: None,
                fuel_used: None,
            },
        )
        .await
        .expect("a run over its quota can still fail");
    assert_eq!(ended.status, RunStatus::Failed);
}

/// Over `max_stored_bytes`, new runs, events and bigger deploys are refused and nothing is
/// created; running attempts cannot add steps, their logs are cut; other tenants go on.
pub(super) async fn tenant_quota(store: impl Store + Directory, _clock: ManualClock) {
    quota_tenant(&store, "big", Quotas::default()).await;
    store.create_tenant(tenant("small")).await.unwrap();
    deploy_flow(&store, "small", "f", FlowControl::default()).await;
    let base = stored(&store, "small").await;
    let quotas = Quotas {
        max_stored_bytes: base + 6000,
        ..Quotas::default()
    };
    store.set_quotas("small", quotas).await.unwrap();
    let first = try_enqueue(
        &store,
        "small",
        "f",
        json!({ "pad": "p".repeat(100) }),
        None,
        None,
    )
    .await
    .unwrap()
    .run;
    let c = claim_one(&store).await;
    assert_eq!(c.run.id, first.id);
    let mut created = 1;
    let refusal = loop {
        match try_enqueue(
            &store,
            "small",
            "f",
            json!({ "pad": "p".repeat(500) }),
            None,
            None,
        )
        .await
        {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created < 20, "max_stored_bytes never refused a run");
    };
    assert!(
        matches!(&refusal, StoreError::StorageQuota(m) if m.contains("max_stored_bytes")),
        "{refusal:?}"
    );
    let listed = store
        .runs(RunQuery {
            tenant: "small".into(),
            limit: 100,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), created, "a refused run is not created");
    assert!(stored(&store, "small").await <= quotas.max_stored_bytes + 200);

    let event = store
        .send_event(EventRequest {
            tenant: "small".into(),
            // It would start a run of f, with the event's data as its input.
            name: "f.go".into(),
            data: json!({ "pad": "e".repeat(2000) }),
            id: None,
            trace: None,
        })
        .await;
    assert!(
        matches!(event, Err(StoreError::StorageQuota(_))),
        "{event:?}"
    );
    let deploy = store
        .deploy(DeployRequest {
            tenant: "small".into(),
            name: "g".into(),
            digest: "d2".into(),
            component: vec![0; 10_000],
            settings: settings(1),
            events: vec![],
            schedule: None,
        })
        .await;
    assert!(
        matches!(deploy, Err(StoreError::StorageQuota(_))),
        "{deploy:?}"
    );
    assert!(store.function("small", "g").await.unwrap().is_none());

    // The running attempt: a step is refused, log lines are cut with one marker.
    let s = store.record(&c.lease, step("a", 0, vec![b'x'; 8000])).await;
    assert!(matches!(s, Err(StoreError::StorageQuota(_))), "{s:?}");
    let lines = (0..50).map(|i| line(1, format!("{i:0>200}"))).collect();
    store.record(&c.lease, Record::Logs(lines)).await.unwrap();
    let logs = store.logs("small", &first.id, 0, 1000).await.unwrap();
    assert!(logs.len() < 50, "{} lines kept", logs.len());
    let last = logs.last().expect("the marker line");
    assert!(
        last.message.contains("max_stored_bytes") && last.source == LogSource::Host,
        "{last:?}"
    );

    // Another tenant is not affected.
    try_enqueue(
        &store,
        "big",
        "f",
        json!({ "pad": "p".repeat(5000) }),
        None,
        None,
    )
    .await
    .expect("another tenant creates runs");
}

/// A run keeps at most `max_run_log_bytes` of log lines over all its attempts: later lines
/// are dropped, with one marker line at the cut.
pub(super) async fn log_budget(store: impl Store + Directory, clock: ManualClock) {
    quota_tenant(
        &store,
        "l",
        Quotas {
            max_run_log_bytes: 3000,
            ..Quotas::default()
        },
    )
    .await;
    let run = try_enqueue(&store, "l", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let c = claim_one(&store).await;
    let batch = |attempt, from: usize| -> Vec<LogLine> {
        (from..from + 10)
            .map(|i| line(attempt, format!("{i:0>100}")))
            .collect()
    };
    store
        .record(&c.lease, Record::Logs(batch(1, 0)))
        .await
        .unwrap();
    store
        .finish(&c.lease, failed(ErrorReason::Retryable, Some(1)))
        .await
        .unwrap();
    clock.advance(2);
    // A new attempt gets no fresh budget.
    let c = claim_one(&store).await;
    for from in [10, 20, 30] {
        store
            .record(&c.lease, Record::Logs(batch(2, from)))
            .await
            .unwrap();
    }
    let logs = store.logs("l", &run.id, 0, usize::MAX).await.unwrap();
    let markers: Vec<_> = logs
        .iter()
        .filter(|l| l.message.contains("max_run_log_bytes"))
        .collect();
    assert_eq!(markers.len(), 1, "{logs:#?}");
    assert_eq!(logs.last().unwrap().message, markers[0].message);
    assert!(logs.len() > 10 && logs.len() < 40, "{} lines", logs.len());
    let r = status_of(&store, "l", &run.id).await;
    assert!(r.log_bytes < 3000 + 300, "{r:?}");
    // Paged reads.
    let page = store.logs("l", &run.id, 5, 3).await.unwrap();
    assert_eq!(page.len(), 3);
    assert_eq!(page[0].message, logs[5].message);
}

/// A claim carries small step outputs; a big one comes by reference and is read on its
/// own. A run's detail lists steps without outputs; steps page.
pub(super) async fn big_steps_by_reference(store: impl Store + Directory, clock: ManualClock) {
    quota_tenant(&store, "b", Quotas::default()).await;
    let run = try_enqueue(&store, "b", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let c = claim_one(&store).await;
    let big = vec![b'B'; INLINE_REPLAY_BYTES + 1];
    store
        .record(&c.lease, step("small", 0, b"1".to_vec()))
        .await
        .unwrap();
    store
        .record(&c.lease, step("big", 0, big.clone()))
        .await
        .unwrap();
    for i in 1..=5 {
        store
            .record(&c.lease, step("small", i, b"2".to_vec()))
            .await
            .unwrap();
    }
    clock.advance(LEASE as i64 + 1);
    let again = claim_one(&store).await;
    assert_eq!(again.run.id, run.id);
    assert_eq!(again.steps.len(), 7);
    for s in &again.steps {
        match s.name.as_str() {
            "big" => assert!(s.output.is_none(), "a big output comes by reference"),
            _ => assert!(s.output.is_some(), "{s:?}"),
        }
    }
    let read = store.step("b", &run.id, "big", 0).await.unwrap().unwrap();
    assert_eq!(read.output, big);
    assert!(store.step("b", &run.id, "big", 1).await.unwrap().is_none());
    assert!(
        store
            .step("someone-else", &run.id, "big", 0)
            .await
            .unwrap()
            .is_none(),
        "another tenant reads nothing"
    );
    let d = store.run("b", &run.id).await.unwrap().unwrap();
    assert_eq!(d.steps_total, 7);
    assert_eq!(d.steps[1].name, "big");
    assert_eq!(d.steps[1].output_bytes, big.len() as u64);
    let page = store.steps("b", &run.id, 2, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|s| s.occurrence).collect::<Vec<_>>(),
        [1, 2],
        "{page:?}"
    );
    assert_eq!(d.attempts_total, 2);
}

pub(super) async fn purge(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let ok = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .record(
            &c.lease,
            Record::Step {
                name: "s".into(),
                occurrence: 0,
                output: b"1".to_vec(),
                logs: vec![],
            },
        )
        .await
        .unwrap();
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let bad = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let queued = enqueue(&store, "f", "{}").await;
    let child = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "child".into(),
            due_at: Some(T0 + 1_000_000),
            idempotency_key: None,
            retry: None,
            parent: Some(queued.id.clone()),
            priority: None,
            trace: None,
        })
        .await
        .unwrap()
        .run;
    let kids = store
        .runs(RunQuery {
            parent: Some(queued.id.clone()),
            ..query(None, None)
        })
        .await
        .unwrap();
    assert_eq!(kids.len(), 1, "children listed by parent");
    assert_eq!(kids[0].id, child.id);

    clock.advance(100);
    let req = |succeeded_before, failed_before| PurgeRequest {
        succeeded_before,
        failed_before,
        limit: 100,
    };
    assert_eq!(
        store.purge(req(T0, T0)).await.unwrap(),
        0,
        "nothing ended before T0"
    );
    assert_eq!(
        store.purge(req(T0 + 50, T0)).await.unwrap(),
        1,
        "the succeeded run"
    );
    assert!(store.run(DEFAULT_TENANT, &ok.id).await.unwrap().is_none());
    assert!(
        store
            .logs(DEFAULT_TENANT, &ok.id, 0, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store.run(DEFAULT_TENANT, &bad.id).await.unwrap().is_some(),
        "failures are kept longer"
    );
    assert_eq!(
        store.purge(req(T0 + 50, T0 + 50)).await.unwrap(),
        1,
        "the failed run"
    );
    assert!(store.run(DEFAULT_TENANT, &bad.id).await.unwrap().is_none());
    assert_eq!(
        store.purge(req(i64::MAX, i64::MAX)).await.unwrap(),
        0,
        "unfinished runs are never purged"
    );
    assert!(
        store
            .run(DEFAULT_TENANT, &queued.id)
            .await
            .unwrap()
            .is_some()
    );
}

/// Runs created before a purge's cutoff that ended inside the retention (they ran or
/// waited long) are kept, and however many come first, a purge of one run at a time gets
/// past them to a run that finished before the cutoff, within a few calls.
pub(super) async fn purge_past_long_runs(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let mut long = Vec::new();
    for _ in 0..10 {
        long.push(enqueue(&store, "f", "{}").await.id);
        clock.advance(1);
    }
    let running = claim(&store, "w", 10).await;
    assert_eq!(running.len(), 10);
    let short = enqueue(&store, "f", "{}").await;
    let c = claim_one(&store).await;
    store.finish(&c.lease, ok()).await.unwrap();
    clock.advance(1_000);
    for c in running {
        store.finish(&c.lease, ok()).await.unwrap();
    }

    let req = |before, limit| PurgeRequest {
        succeeded_before: before,
        failed_before: before,
        limit,
    };
    let mut purged = 0;
    for _ in 0..20 {
        purged += store.purge(req(T0 + 500, 1)).await.unwrap();
    }
    assert_eq!(purged, 1, "only the run that finished before the cutoff");
    assert!(
        store
            .run(DEFAULT_TENANT, &short.id)
            .await
            .unwrap()
            .is_none()
    );
    for id in &long {
        assert!(
            store.run(DEFAULT_TENANT, id).await.unwrap().is_some(),
            "a run that ended inside the retention is kept"
        );
    }
    // Once they too are past it, they go.
    assert_eq!(store.purge(req(T0 + 2_000, 100)).await.unwrap(), 10);
}

//! Ends of attempts carrying their last records ([`Queue::end_attempts`]): each end is
//! one transition, stored whole or not at all, and independent of the others in a batch.

use serde_json::json;

use super::*;

fn line(attempt: u32, message: &str) -> LogLine {
    LogLine {
        attempt,
        at: T0,
        level: LogLevel::Info,
        source: LogSource::Guest,
        message: message.into(),
    }
}

fn step(name: &str, output: &[u8], logs: Vec<LogLine>) -> Record {
    Record::Step {
        name: name.into(),
        occurrence: 0,
        output: output.to_vec(),
        logs,
    }
}

fn end(c: &Claimed, records: Vec<Record>, outcome: Outcome) -> AttemptEnd {
    AttemptEnd {
        lease: c.lease.clone(),
        records,
        outcome,
    }
}

async fn messages(store: &impl Store, tenant: &str, id: &str) -> Vec<String> {
    let logs = store.logs(tenant, id, 0, 100).await.unwrap();
    logs.into_iter().map(|l| l.message).collect()
}

/// A batch of ends: each stores its records in order, then its outcome; a stale lease
/// or a missing run is answered for its own end only.
pub(super) async fn end_attempts(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let (a, b, stale) = (
        enqueue(&store, "f", "{}").await,
        enqueue(&store, "f", "{}").await,
        enqueue(&store, "f", "{}").await,
    );
    let claimed = claim(&store, "w", 3).await;
    let by_id = |id: &str| claimed.iter().find(|c| c.run.id == id).unwrap();
    let (ca, cb, cs) = (by_id(&a.id), by_id(&b.id), by_id(&stale.id));
    // The stale one ended already: its lease is spent.
    store.end_attempt(&cs.lease, ok()).await.unwrap();
    let records = vec![
        Record::Logs(vec![line(1, "first")]),
        step("s", b"\"out\"", vec![line(1, "in the step")]),
        Record::Logs(vec![line(1, "after the step")]),
        Record::Progress(Progress {
            percent: 90,
            message: Some("nearly".into()),
        }),
    ];
    let succeeded = Outcome::Succeeded {
        output: b"\"out\"".to_vec(),
        fuel_used: Some(5),
    };
    let mut missing = end(ca, vec![], ok());
    missing.lease.run_id = "no-such-run".into();
    let answers = store
        .end_attempts(vec![
            end(ca, records, succeeded),
            end(cs, vec![Record::Logs(vec![line(1, "late")])], ok()),
            end(cb, vec![], failed(ErrorReason::Retryable, Some(0))),
            missing,
        ])
        .await;
    assert_eq!(answers.len(), 4, "one answer per end, in order");
    assert_eq!(answers[0].as_ref().unwrap(), &RunStatus::Succeeded);
    assert!(
        matches!(answers[1], Err(StoreError::LeaseLost(_))),
        "{:?}",
        answers[1]
    );
    assert_eq!(answers[2].as_ref().unwrap(), &RunStatus::Queued);
    assert!(
        matches!(
            answers[3],
            Err(StoreError::LeaseLost(_) | StoreError::NotFound(_))
        ),
        "{:?}",
        answers[3]
    );

    let d = detail(&store, &a.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.run.output.as_deref(), Some(&b"\"out\""[..]));
    assert_eq!(d.run.progress.as_ref().map(|p| p.percent), Some(90));
    assert_eq!(d.steps_total, 1);
    let s = store.step(DEFAULT_TENANT, &a.id, "s", 0).await.unwrap();
    assert_eq!(s.expect("the step is stored").output, b"\"out\"");
    assert_eq!(
        messages(&store, DEFAULT_TENANT, &a.id).await,
        ["first", "in the step", "after the step"],
        "records are stored in order"
    );
    assert!(
        messages(&store, DEFAULT_TENANT, &stale.id).await.is_empty(),
        "an end with a lost lease stores none of its records"
    );
    assert_eq!(
        detail(&store, &stale.id).await.run.status,
        RunStatus::Succeeded
    );
    // The run that failed retryably is claimed again (what it replays: end_steps_replay).
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, b.id);
    assert!(store.end_attempts(vec![]).await.is_empty());
}

/// Steps stored with ends that retry are replayed to the next attempt, in the order they
/// completed, as steps recorded on their own are: an end that stores a run's first step
/// must leave the run marked as having steps, or the next claim would not look for them.
pub(super) async fn end_steps_replay(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let retry = || failed(ErrorReason::Retryable, Some(0));
    let mut seen = vec![];
    for name in ["first", "second"] {
        let c = claim(&store, "w", 1).await.remove(0);
        assert_eq!(c.run.id, run.id);
        let replayed: Vec<_> = c.steps.iter().map(|s| s.name.clone()).collect();
        assert_eq!(
            replayed, seen,
            "attempt {} replays the steps before it",
            c.run.attempt
        );
        let output = format!("\"{name}\"").into_bytes();
        let answers = store
            .end_attempts(vec![end(&c, vec![step(name, &output, vec![])], retry())])
            .await;
        assert_eq!(answers[0].as_ref().unwrap(), &RunStatus::Queued);
        seen.push(name.to_owned());
    }
    let c = claim(&store, "w", 1).await.remove(0);
    let replayed: Vec<_> = c.steps.iter().map(|s| s.name.clone()).collect();
    assert_eq!(replayed, ["first", "second"]);
    assert_eq!(
        c.steps[0].output.as_deref(),
        Some(&b"\"first\""[..]),
        "the output comes along"
    );
    assert_eq!(detail(&store, &run.id).await.steps_total, 2);
}

/// A claim hands a run over whole, whatever its values hold: an input of 100,000 bytes of
/// every value (longer than a 16-bit length counts, as a store that packs its replies must
/// frame it) and a step's output with bytes a line-based protocol would trip on.
pub(super) async fn claimed_whole(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let run = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: input.clone(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        })
        .await
        .unwrap()
        .run;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!((&c.run.id, c.run.input == input), (&run.id, true));
    let odd = b"\r\n$3\r\n*1\r\n\x00\xc2\xc0\xdb\xff".to_vec();
    let retry = failed(ErrorReason::Retryable, Some(0));
    let answers = store
        .end_attempts(vec![end(&c, vec![step("odd", &odd, vec![])], retry)])
        .await;
    assert_eq!(answers[0].as_ref().unwrap(), &RunStatus::Queued);
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!((&c.run.id, c.run.attempt), (&run.id, 2));
    assert!(c.run.input == input, "the input, byte for byte, again");
    assert_eq!(c.steps.len(), 1);
    assert_eq!(c.steps[0].output.as_deref(), Some(&odd[..]));
}

/// An end over a storage quota (its steps and output together) stores nothing, and the
/// attempt still holds its lease: it can end failed, with its log lines.
pub(super) async fn end_attempts_quota(store: impl Store + Directory, _clock: ManualClock) {
    let max = 20_000;
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_run_bytes: max,
                ..Quotas::default()
            },
            ..tenant("q")
        })
        .await
        .unwrap();
    deploy_flow(&store, "q", "f", FlowControl::default()).await;
    let run = try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let c = claim(&store, "w", 1).await.remove(0);
    let before = store.run("q", &run.id).await.unwrap().unwrap().run;
    // Each fits alone; together they do not.
    let records = vec![
        Record::Logs(vec![line(1, "before")]),
        step("a", &[b'a'; 8_000], vec![]),
        step("b", &[b'b'; 8_000], vec![]),
    ];
    let big = Outcome::Succeeded {
        output: vec![b'o'; 8_000],
        fuel_used: None,
    };
    let answers = store
        .end_attempts(vec![end(&c, records.clone(), big)])
        .await;
    assert!(
        matches!(&answers[0], Err(StoreError::StorageQuota(m)) if m.contains("max_run_bytes")),
        "{answers:?}"
    );
    let d = store.run("q", &run.id).await.unwrap().unwrap();
    assert_eq!(
        d.run.status,
        RunStatus::Running,
        "nothing of the end is stored"
    );
    assert_eq!(d.steps_total, 0);
    assert_eq!(d.run.stored_bytes, before.stored_bytes);
    assert!(messages(&store, "q", &run.id).await.is_empty());

    // The steps alone fit: stored with a failure, in one transition.
    let fail = Outcome::Failed {
        error: RunError::new(ErrorReason::StorageQuota, "over max_run_bytes"),
        retry_in_ms: None,
        fuel_used: None,
    };
    let answers = store.end_attempts(vec![end(&c, records, fail)]).await;
    assert_eq!(answers[0].as_ref().unwrap(), &RunStatus::Failed);
    let d = store.run("q", &run.id).await.unwrap().unwrap();
    assert_eq!(d.steps_total, 2);
    assert_eq!(messages(&store, "q", &run.id).await, ["before"]);
}

/// What an end stores costs exactly what the same records and outcome cost as separate
/// calls.
pub(super) async fn end_attempts_usage(store: impl Store + Directory, _clock: ManualClock) {
    let mut usage = vec![];
    for (name, together) in [("t-a", false), ("t-b", true)] {
        let tenant = name;
        store.create_tenant(super::tenant(name)).await.unwrap();
        deploy_flow(&store, tenant, "f", FlowControl::default()).await;
        let run = try_enqueue(&store, tenant, "f", json!({"x": 1}), None, None)
            .await
            .unwrap()
            .run;
        let c = claim(&store, "w", 1).await.remove(0);
        assert_eq!(c.run.id, run.id);
        let records = vec![
            Record::Logs(vec![line(1, "one"), line(1, "two")]),
            step("s", &[b's'; 300], vec![line(1, "three")]),
            step("t", b"7", vec![]),
            Record::Progress(Progress {
                percent: 50,
                message: None,
            }),
        ];
        let outcome = Outcome::Succeeded {
            output: vec![b'o'; 200],
            fuel_used: Some(9),
        };
        if together {
            let answers = store.end_attempts(vec![end(&c, records, outcome)]).await;
            assert_eq!(answers[0].as_ref().unwrap(), &RunStatus::Succeeded);
        } else {
            for r in records {
                store.record(&c.lease, r).await.unwrap();
            }
            store.end_attempt(&c.lease, outcome).await.unwrap();
        }
        let r = store.run(tenant, &run.id).await.unwrap().unwrap().run;
        let u = store.usage(tenant).await.unwrap();
        usage.push((
            r.stored_bytes,
            r.log_bytes,
            u.stored_bytes,
            u.fuel,
            u.attempts,
        ));
    }
    assert_eq!(
        usage[0], usage[1],
        "(run bytes, log bytes, tenant bytes, fuel, attempts)"
    );
}

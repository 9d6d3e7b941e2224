//! Scenarios of a run's core life: deploys, claims and their order, leases and fencing,
//! success, failure and retries, replayed steps, lost workers.

use super::*;

pub(super) async fn deploy(store: impl Store, clock: ManualClock) {
    let f = deploy_fn(&store, "hello", "d1", 3).await;
    assert_eq!(
        (f.name.as_str(), f.digest.as_str(), f.created_at),
        ("hello", "d1", T0)
    );
    clock.advance(5);
    let f2 = deploy_fn(&store, "hello", "d2", 5).await;
    assert_eq!(f2.digest, "d2");
    assert_eq!(f2.created_at, T0, "a redeploy keeps the creation time");
    assert_eq!(f2.updated_at, T0 + 5);
    let got = store
        .function(DEFAULT_TENANT, "hello")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, f2);
    assert_eq!(
        store.component("d1").await.unwrap(),
        Some(b"bytes of d1".to_vec())
    );
    assert_eq!(
        store.component("d2").await.unwrap(),
        Some(b"bytes of d2".to_vec())
    );
    assert_eq!(store.component("nope").await.unwrap(), None);
    assert!(
        store
            .function(DEFAULT_TENANT, "other")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .function("another-tenant", "hello")
            .await
            .unwrap()
            .is_none()
    );
    deploy_fn(&store, "alpha", "d1", 1).await;
    let names: Vec<_> = store
        .functions(DEFAULT_TENANT)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["alpha", "hello"]);
}

/// `schedules` lists the functions that have a schedule (paused ones too), by name, as
/// their latest deploy left them; a redeploy without a schedule takes one off the list.
pub(super) async fn schedules(store: impl Store, _clock: ManualClock) {
    let every = |expr: &str, paused| Schedule {
        crons: vec![expr.into()],
        tz: "Europe/Paris".into(),
        missed: Missed::Latest,
        paused,
        resumed_at: None,
    };
    let deploy = |tenant: &str, name: &str, schedule: Option<Schedule>| {
        store.deploy(DeployRequest {
            tenant: tenant.into(),
            name: name.into(),
            digest: "d1".into(),
            component: b"bytes of d1".to_vec(),
            settings: settings(1),
            events: vec![],
            schedule,
        })
    };
    assert_eq!(store.schedules(DEFAULT_TENANT).await.unwrap(), []);
    deploy(DEFAULT_TENANT, "plain", None).await.unwrap();
    deploy(DEFAULT_TENANT, "b", Some(every("0 * * * *", false)))
        .await
        .unwrap();
    deploy(DEFAULT_TENANT, "a", Some(every("*/5 * * * * *", true)))
        .await
        .unwrap();
    deploy("other", "c", Some(every("0 0 * * *", false)))
        .await
        .unwrap();
    let listed = |name: &str, schedule| Scheduled {
        function: name.into(),
        schedule,
    };
    assert_eq!(
        store.schedules(DEFAULT_TENANT).await.unwrap(),
        [
            listed("a", every("*/5 * * * * *", true)),
            listed("b", every("0 * * * *", false))
        ]
    );
    // Resumed (a redeploy with the schedule changed), and one schedule dropped.
    let mut resumed = every("*/5 * * * * *", false);
    resumed.resumed_at = Some(T0 + 1);
    deploy(DEFAULT_TENANT, "a", Some(resumed.clone()))
        .await
        .unwrap();
    deploy(DEFAULT_TENANT, "b", None).await.unwrap();
    assert_eq!(
        store.schedules(DEFAULT_TENANT).await.unwrap(),
        [listed("a", resumed)]
    );
    assert_eq!(
        store.schedules("other").await.unwrap(),
        [listed("c", every("0 0 * * *", false))]
    );
    assert_eq!(store.schedules("nobody").await.unwrap(), []);
}

pub(super) async fn enqueue_unknown(store: impl Store, _clock: ManualClock) {
    let err = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "missing".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        })
        .await
        .expect_err("no such function");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert!(
        store.runs(query(None, None)).await.unwrap().is_empty(),
        "nothing stored"
    );
}

pub(super) async fn claim_once(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", r#"{"n":1}"#).await;
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!((run.attempt, run.due_at, run.created_at), (0, T0, T0));
    let got = claim(&store, "w1", 10).await;
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!(c.run.id, run.id);
    assert_eq!(c.run.status, RunStatus::Running);
    assert_eq!(c.run.attempt, 1);
    assert_eq!(c.run.input, br#"{"n":1}"#.to_vec());
    assert_eq!(c.lease.expires_at, T0 + LEASE as i64);
    assert!(c.steps.is_empty());
    assert!(
        claim(&store, "w2", 10).await.is_empty(),
        "a leased run is not handed out twice"
    );
    clock.advance(LEASE as i64 - 1);
    assert!(
        claim(&store, "w2", 10).await.is_empty(),
        "not before the lease expires"
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 1);
    assert_eq!(d.attempts[0].worker, "w1");
    assert_eq!(d.attempts[0].started_at, T0);
}

pub(super) async fn claim_order(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let a = enqueue(&store, "f", "1").await;
    clock.advance(1);
    let later = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"later".to_vec(),
            trigger: "api".into(),
            due_at: Some(T0 + 60_000),
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
            trace: None,
        })
        .await
        .unwrap()
        .run;
    let b = enqueue(&store, "f", "2").await;
    let c = enqueue(&store, "f", "3").await;
    let first = claim(&store, "w", 2).await;
    let ids: Vec<_> = first.iter().map(|c| c.run.id.clone()).collect();
    assert_eq!(
        ids,
        [a.id.clone(), b.id.clone()],
        "oldest due first, at most `limit`"
    );
    let second = claim(&store, "w", 10).await;
    let ids: Vec<_> = second.iter().map(|c| c.run.id.clone()).collect();
    assert_eq!(
        ids,
        std::slice::from_ref(&c.id),
        "a run due later is not claimed early"
    );
    for c in first.into_iter().chain(second) {
        let done = Outcome::Succeeded {
            output: b"1".to_vec(),
            fuel_used: None,
        };
        store.finish(&c.lease, done).await.unwrap();
    }
    clock.set(T0 + 60_000);
    let third: Vec<_> = claim(&store, "w", 10)
        .await
        .into_iter()
        .map(|c| c.run.id)
        .collect();
    assert_eq!(third, [later.id]);
}

pub(super) async fn succeed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    clock.advance(40);
    let done = store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: br#"{"ok":true}"#.to_vec(),
                fuel_used: Some(9),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded);
    assert_eq!(done.output.as_deref(), Some(&br#"{"ok":true}"#[..]));
    assert_eq!(done.finished_at, Some(T0 + 40));
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.attempts[0].finished_at, Some(T0 + 40));
    assert_eq!(d.attempts[0].fuel_used, Some(9));
    let again = store
        .finish(&c.lease, failed(ErrorReason::Trap, None))
        .await;
    assert!(matches!(again, Err(StoreError::LeaseLost(_))), "{again:?}");
    assert_eq!(
        detail(&store, &run.id).await.run.status,
        RunStatus::Succeeded
    );
    clock.advance(LEASE as i64 * 2);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "finished runs are never claimed"
    );
}

pub(super) async fn fencing(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let old = claim(&store, "w1", 1).await.remove(0);
    clock.advance(LEASE as i64);
    let new = claim(&store, "w2", 1).await.remove(0);
    assert_eq!(new.run.id, run.id, "an expired lease is handed out again");
    assert!(new.lease.token > old.lease.token, "the fencing token grows");
    assert_eq!(new.run.attempt, 2);
    let step = Record::Step {
        name: "s".into(),
        occurrence: 0,
        output: b"1".to_vec(),
        logs: vec![],
    };
    let r = store.record(&old.lease, step.clone()).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "stale step record: {r:?}"
    );
    let r = store
        .finish(
            &old.lease,
            Outcome::Succeeded {
                output: b"old".to_vec(),
                fuel_used: None,
            },
        )
        .await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "stale finish: {r:?}"
    );
    store.record(&new.lease, step).await.unwrap();
    let done = store
        .finish(
            &new.lease,
            Outcome::Succeeded {
                output: b"\"new\"".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(done.output.as_deref(), Some(&b"\"new\""[..]));
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(
        d.attempts[0].error.as_ref().map(|e| e.reason),
        Some(ErrorReason::LeaseExpired)
    );
    let lost = &d.attempts[0].error.as_ref().unwrap().message;
    assert!(
        lost.contains("worker w1"),
        "the lost attempt names its worker: {lost}"
    );
    assert_eq!(d.steps.len(), 1);
    assert_eq!(d.steps[0].attempt, 2);
}

pub(super) async fn late_completion(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let old = claim(&store, "w1", 1).await.remove(0);
    clock.advance(LEASE as i64);
    let new = claim(&store, "w2", 1).await.remove(0);
    assert_eq!(new.run.id, run.id);
    store
        .finish(
            &new.lease,
            Outcome::Succeeded {
                output: b"\"new\"".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    // The first worker wakes up after the run was taken over and finished.
    clock.advance(5);
    for outcome in [
        Outcome::Succeeded {
            output: b"\"old\"".to_vec(),
            fuel_used: None,
        },
        failed(ErrorReason::Trap, Some(1_000)),
        Outcome::Released,
    ] {
        let r = store.finish(&old.lease, outcome).await;
        assert!(
            matches!(r, Err(StoreError::LeaseLost(_))),
            "late finish: {r:?}"
        );
    }
    let r = store.record(&old.lease, Record::Logs(vec![])).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "late record: {r:?}"
    );
    let renewal = store
        .renew(std::slice::from_ref(&old.lease), LEASE)
        .await
        .unwrap();
    assert_eq!(
        renewal,
        Renewal {
            lost: vec![run.id.clone()],
            cancelling: vec![]
        },
        "late renewal"
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.run.output.as_deref(), Some(&b"\"new\""[..]));
    assert_eq!(d.run.finished_at, Some(T0 + LEASE as i64));
    assert_eq!(d.run.attempt, 2);
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(d.attempts[1].worker, "w2");
    assert_eq!(d.attempts[1].error, None);
    clock.advance(LEASE as i64 * 2);
    assert!(claim(&store, "w3", 10).await.is_empty(), "nothing to redo");
}

pub(super) async fn steps_replay(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w1", 1).await.remove(0);
    for (name, occurrence, out) in [("a", 0, "1"), ("a", 1, "2"), ("b", 0, "3")] {
        clock.advance(1);
        let rec = Record::Step {
            name: name.into(),
            occurrence,
            output: out.as_bytes().to_vec(),
            logs: vec![],
        };
        store.record(&c.lease, rec).await.unwrap();
    }
    let line = LogLine {
        attempt: 1,
        at: T0,
        level: LogLevel::Info,
        source: LogSource::Guest,
        message: "body ran".into(),
    };
    let rec = Record::Step {
        name: "c".into(),
        occurrence: 0,
        output: b"4".to_vec(),
        logs: vec![line],
    };
    store.record(&c.lease, rec).await.unwrap();
    let logged: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(
        logged,
        ["body ran"],
        "a step's log lines are stored with it"
    );
    clock.advance(LEASE as i64);
    let again = claim(&store, "w2", 1).await.remove(0);
    let steps: Vec<_> = again
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.occurrence, s.output.as_deref()))
        .collect();
    assert_eq!(
        steps,
        [
            ("a", 0, Some(&b"1"[..])),
            ("a", 1, Some(&b"2"[..])),
            ("b", 0, Some(&b"3"[..])),
            ("c", 0, Some(&b"4"[..]))
        ],
        "replayed in completion order"
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.steps.len(), 4);
    let names = |steps: &[StepInfo]| -> Vec<(String, u32)> {
        steps
            .iter()
            .map(|s| (s.name.clone(), s.occurrence))
            .collect()
    };
    let all = [("a", 0), ("a", 1), ("b", 0), ("c", 0)].map(|(n, o)| (n.to_owned(), o));
    assert_eq!(names(&d.steps), all);
    // Pages of the order, from its start and from within it.
    for (from, n) in [(0, 1), (0, 0), (1, 2), (3, 5), (4, 1)] {
        let page = store.steps(DEFAULT_TENANT, &run.id, from, n).await.unwrap();
        let want = &all[from.min(4)..(from + n).min(4)];
        assert_eq!(names(&page), want, "from {from}, {n} steps");
    }
    assert_eq!(d.steps_total, 4);
    assert!(
        d.steps
            .iter()
            .all(|s| s.attempt == 1 && s.output_bytes == 1)
    );
    assert_eq!(
        d.steps[0].completed_at,
        T0 + 1,
        "steps listed in completion order"
    );
}

pub(super) async fn retry(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .finish(&c.lease, failed(ErrorReason::Trap, Some(1_000)))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Queued);
    assert_eq!(r.due_at, T0 + 1_000);
    assert_eq!(
        r.error.as_ref().map(|e| e.reason),
        Some(ErrorReason::Trap),
        "last error shown"
    );
    clock.advance(999);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "not before the backoff"
    );
    clock.advance(1);
    let c2 = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c2.run.attempt, 2);
    store
        .finish(
            &c2.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.run.error, None, "a success clears the last error");
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(
        d.attempts[0].error.as_ref().map(|e| e.message.as_str()),
        Some("boom")
    );
    assert_eq!(d.attempts[1].error, None);
}

pub(super) async fn dead(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    clock.advance(3);
    let r = store
        .finish(&c.lease, failed(ErrorReason::OutOfFuel, None))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.finished_at, Some(T0 + 3));
    assert_eq!(r.error, Some(RunError::new(ErrorReason::OutOfFuel, "boom")));
    clock.advance(LEASE as i64 * 2);
    assert!(claim(&store, "w", 1).await.is_empty());
    let failed_runs = store
        .runs(query(None, Some(RunStatus::Failed)))
        .await
        .unwrap();
    assert_eq!(failed_runs.len(), 1);
    assert_eq!(failed_runs[0].id, run.id);
}

pub(super) async fn release(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store.finish(&c.lease, Outcome::Released).await.unwrap();
    assert_eq!((r.status, r.attempt), (RunStatus::Queued, 0));
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(
        (again.run.id.as_str(), again.run.attempt),
        (run.id.as_str(), 1)
    );
    assert!(again.lease.token > c.lease.token);
    let d = detail(&store, &run.id).await;
    assert_eq!(
        (d.attempts.len(), d.attempts_total),
        (1, 1),
        "a released attempt is not history: only the new one is"
    );
    assert_eq!(d.attempts[0].finished_at, None);
}

pub(super) async fn end_attempt(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let done = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let succeeded = Outcome::Succeeded {
        output: b"1".to_vec(),
        fuel_used: None,
    };
    let status = store.end_attempt(&c.lease, succeeded.clone()).await;
    assert_eq!(status.unwrap(), RunStatus::Succeeded);
    let r = detail(&store, &done.id).await.run;
    assert_eq!(
        (r.status, r.output.as_deref()),
        (RunStatus::Succeeded, Some(&b"1"[..]))
    );
    // The lease is spent, as after finish.
    let again = store.end_attempt(&c.lease, succeeded).await.unwrap_err();
    assert!(matches!(again, StoreError::LeaseLost(_)), "{again:?}");

    // A retry queues the run again.
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let status = store
        .end_attempt(&c.lease, failed(ErrorReason::Retryable, Some(0)))
        .await;
    assert_eq!(status.unwrap(), RunStatus::Queued);

    // A wait for a run that already ended resolves at once: the waiter is due again.
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, run.id);
    let wait = Outcome::Waiting {
        wait: Wait {
            step: "call".into(),
            occurrence: 0,
            on: WaitOn::Run {
                id: done.id.clone(),
            },
            until: None,
        },
        fuel_used: None,
    };
    let status = store.end_attempt(&c.lease, wait).await;
    assert_eq!(status.unwrap(), RunStatus::Sleeping);
    assert_eq!(
        detail(&store, &run.id).await.run.status,
        RunStatus::Sleeping
    );
}

pub(super) async fn renew(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    enqueue(&store, "f", "1").await;
    enqueue(&store, "f", "2").await;
    let got = claim(&store, "w", 2).await;
    let (a, b) = (&got[0], &got[1]);
    clock.advance(LEASE as i64 - 10);
    let renewal = store
        .renew(std::slice::from_ref(&a.lease), LEASE)
        .await
        .unwrap();
    assert!(renewal.all_held(), "{renewal:?}");
    clock.advance(20);
    // b expired and was taken over; a was renewed and is still held
    let taken = claim(&store, "w2", 10).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].run.id, b.run.id);
    let renewal = store
        .renew(&[a.lease.clone(), b.lease.clone()], LEASE)
        .await
        .unwrap();
    assert_eq!(renewal.lost, std::slice::from_ref(&b.run.id));
    assert!(renewal.cancelling.is_empty(), "{renewal:?}");
    store
        .finish(
            &a.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .expect("the renewed lease still commits");
}

pub(super) async fn lease_loss_cap(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let mut claims = 0;
    loop {
        let got = claim(&store, "w", 1).await;
        if got.is_empty() {
            break;
        }
        claims += 1;
        assert!(claims < 20, "lease losses must stop at some point");
        clock.advance(LEASE as i64);
    }
    assert_eq!(claims, 1 + crate::MAX_LOST_LEASE_EXTRA_ATTEMPTS);
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Failed);
    assert_eq!(
        d.run.error.as_ref().map(|e| e.reason),
        Some(ErrorReason::LeaseExpired)
    );
    assert!(d.run.finished_at.is_some());
}

pub(super) async fn pinned_digest(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d1", 2).await;
    let run = enqueue(&store, "f", "{}").await;
    deploy_fn(&store, "f", "d2", 7).await;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, run.id);
    assert_eq!(c.run.digest, "d1");
    assert_eq!(c.run.settings.retry.max_attempts, 2);
    assert_eq!(enqueue(&store, "f", "{}").await.digest, "d2");
}

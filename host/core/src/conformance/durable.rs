//! Scenarios of durable execution: sleeps, events and waits (with timeouts), runs waiting
//! on runs.

use super::*;

pub(super) async fn suspend(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let rec = Record::Step {
        name: "nap".into(),
        occurrence: 0,
        output: b"{}".to_vec(),
        logs: vec![],
    };
    store.record(&c.lease, rec).await.unwrap();
    clock.advance(10);
    let r = store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 60_000,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.due_at, r.attempt),
        (RunStatus::Sleeping, T0 + 60_000, 1)
    );
    assert!(r.finished_at.is_none());
    clock.advance(LEASE as i64);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "a sleeping run is not claimed early"
    );
    clock.set(T0 + 60_000);
    let woke = claim(&store, "w", 1).await.remove(0);
    assert_eq!(woke.run.id, run.id);
    assert_eq!(woke.run.attempt, 1, "waking is not a new attempt");
    assert_eq!(woke.steps.len(), 1, "steps are replayed");
    assert!(woke.lease.token > c.lease.token);
    let done = store
        .finish(
            &woke.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded);
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 2, "two executions of attempt 1");
    assert_eq!(d.attempts[0].number, 1);
    assert_eq!(d.attempts[0].suspended_until, Some(T0 + 60_000));
    assert_eq!(d.attempts[1].number, 1);
    assert_eq!(d.attempts[1].suspended_until, None);
}

pub(super) async fn release_resumed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 100,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    clock.advance(100);
    let woke = claim(&store, "w", 1).await.remove(0);
    let r = store.finish(&woke.lease, Outcome::Released).await.unwrap();
    assert_eq!(
        r.attempt, 1,
        "the attempt begun before the sleep still counts"
    );
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(
        (again.run.id.as_str(), again.run.attempt),
        (run.id.as_str(), 1)
    );
}

pub(super) async fn wait_event(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .finish(
            &c.lease,
            waiting_for_event(Some(r#"{"order": 7}"#), Some(T0 + 60_000)),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Waiting);
    assert!(r.wait.is_some());
    let other = send(&store, "order.paid", serde_json::json!({"order": 8}), None).await;
    assert!(
        other.resumed.is_empty(),
        "a non-matching event does not resume it"
    );
    let other_name = send(
        &store,
        "order.shipped",
        serde_json::json!({"order": 7}),
        None,
    )
    .await;
    assert!(other_name.resumed.is_empty());
    clock.advance(10);
    assert!(claim(&store, "w", 1).await.is_empty(), "still waiting");
    let hit = send(
        &store,
        "order.paid",
        serde_json::json!({"order": 7, "amount": 12}),
        None,
    )
    .await;
    assert_eq!(hit.resumed, std::slice::from_ref(&run.id));
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(again.run.id, run.id);
    assert_eq!(again.run.attempt, 1, "resuming is not a retry");
    assert_eq!(
        step_output(&again.steps, "paid"),
        Resolution::Event {
            data: serde_json::json!({"order": 7, "amount": 12})
        }
    );
    let second = send(&store, "order.paid", serde_json::json!({"order": 7}), None).await;
    assert!(second.resumed.is_empty(), "a wait resolves once");
}

/// More waiters than any backend reads in one page: all the matching ones resume, and only
/// those, from one event.
pub(super) async fn many_waiters(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    const N: usize = 1_200;
    for i in 0..N {
        enqueue(&store, "f", &i.to_string()).await;
    }
    let mut odd = Vec::new();
    for _ in 0..N / 100 {
        for c in claim(&store, "w", 100).await {
            let n: usize = String::from_utf8_lossy(&c.run.input).parse().unwrap();
            let filter = if n % 2 == 1 {
                odd.push(c.run.id.clone());
                r#"{"odd": true}"#
            } else {
                r#"{"odd": false}"#
            };
            store
                .finish(&c.lease, waiting_for_event(Some(filter), None))
                .await
                .unwrap();
        }
    }
    clock.advance(1);
    let sent = send(&store, "order.paid", serde_json::json!({"odd": true}), None).await;
    let mut resumed = sent.resumed;
    resumed.sort();
    odd.sort();
    assert_eq!(resumed.len(), N / 2);
    assert_eq!(resumed, odd, "exactly the matching waiters resume");
}

pub(super) async fn wait_timeout(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, waiting_for_event(None, Some(T0 + 5_000)))
        .await
        .unwrap();
    clock.set(T0 + 4_999);
    assert!(claim(&store, "w", 1).await.is_empty());
    clock.set(T0 + 5_000);
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(again.run.id, run.id);
    assert_eq!(step_output(&again.steps, "paid"), Resolution::TimedOut);
    let late = send(&store, "order.paid", serde_json::json!({}), None).await;
    assert!(
        late.resumed.is_empty(),
        "a timed-out wait ignores later events"
    );

    // Waiting with no time limit, then cancelled.
    let forever = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1)
        .await
        .into_iter()
        .find(|c| c.run.id == forever.id)
        .unwrap();
    store
        .finish(&c.lease, waiting_for_event(None, None))
        .await
        .unwrap();
    clock.advance(365 * 24 * 3600 * 1000);
    assert!(
        claim(&store, "w", 10)
            .await
            .iter()
            .all(|c| c.run.id != forever.id)
    );
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &forever.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
}

pub(super) async fn event_subscribers(store: impl Store, _clock: ManualClock) {
    store
        .deploy(DeployRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "welcome".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: settings(1),
            events: vec!["user.signup".into()],
            schedule: Some(Schedule {
                crons: vec!["0 9 * * MON-FRI".into()],
                tz: "Europe/Berlin".into(),
                missed: Missed::Latest,
                paused: false,
                resumed_at: None,
            }),
        })
        .await
        .unwrap();
    deploy_fn(&store, "unrelated", "d", 1).await;
    let f = store
        .function(DEFAULT_TENANT, "welcome")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(f.events, ["user.signup"]);
    assert_eq!(
        f.schedule.as_ref().map(|s| (s.tz.as_str(), s.missed)),
        Some(("Europe/Berlin", Missed::Latest))
    );
    let sent = send(
        &store,
        "user.signup",
        serde_json::json!({"user": 1}),
        Some("evt-1"),
    )
    .await;
    assert!(sent.accepted);
    assert_eq!(sent.id, "evt-1");
    assert_eq!(sent.started.len(), 1);
    let run = detail(&store, &sent.started[0]).await.run;
    assert_eq!(
        (run.function.as_str(), run.trigger.as_str()),
        ("welcome", "event:user.signup")
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&run.input).unwrap(),
        serde_json::json!({"user": 1})
    );
    let dup = send(
        &store,
        "user.signup",
        serde_json::json!({"user": 1}),
        Some("evt-1"),
    )
    .await;
    assert!(!dup.accepted, "an event id is a dedup key");
    assert!(dup.started.is_empty());
    assert_eq!(
        store
            .runs(query(Some("welcome"), None))
            .await
            .unwrap()
            .len(),
        1
    );
    let other = send(&store, "user.signup", serde_json::json!({"user": 2}), None).await;
    assert!(
        other.accepted && other.started.len() == 1,
        "no id: always a new event"
    );
}

pub(super) async fn wait_run(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let parent = enqueue(&store, "f", "{}").await;
    let p = claim(&store, "w", 1).await.remove(0);
    let child = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: format!("child:{}", parent.id),
            due_at: None,
            idempotency_key: Some(format!("child:{}:call:0", parent.id)),
            retry: None,
            parent: Some(parent.id.clone()),
            priority: None,
            trace: None,
        })
        .await
        .unwrap()
        .run;
    assert_eq!(child.parent.as_deref(), Some(parent.id.as_str()));
    let wait = |id: &str| Outcome::Waiting {
        wait: Wait {
            step: "call".into(),
            occurrence: 0,
            on: WaitOn::Run { id: id.into() },
            until: None,
        },
        fuel_used: None,
    };
    let r = store.finish(&p.lease, wait(&child.id)).await.unwrap();
    assert_eq!(r.status, RunStatus::Waiting);
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, child.id, "the parent waits; the child runs");
    clock.advance(5);
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: br#"{"sum":3}"#.to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let p = claim(&store, "w", 1).await.remove(0);
    assert_eq!(p.run.id, parent.id, "the child's end resumes the parent");
    assert_eq!(
        step_output(&p.steps, "call"),
        Resolution::Output {
            output: serde_json::json!({"sum": 3})
        }
    );

    // Waiting on a run that already ended resolves at once; a failed one is an error.
    let failing = enqueue(&store, "f", "{}").await;
    let f = claim(&store, "w", 1)
        .await
        .into_iter()
        .find(|c| c.run.id == failing.id)
        .unwrap();
    store
        .finish(&f.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let r = store
        .finish(
            &p.lease,
            Outcome::Waiting {
                wait: Wait {
                    step: "join".into(),
                    occurrence: 0,
                    on: WaitOn::Run {
                        id: failing.id.clone(),
                    },
                    until: None,
                },
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Sleeping, "resolved at once, due now");
    let p = claim(&store, "w", 1).await.remove(0);
    assert!(
        matches!(step_output(&p.steps, "join"), Resolution::Error { message } if message.contains("boom"))
    );
}

/// A run's detail holds its latest executions, the one running now last and open, after
/// more executions than the detail shows.
pub(super) async fn running_detail(store: impl Store, clock: ManualClock) {
    use crate::storage::DETAIL_ATTEMPTS;
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    for _ in 0..DETAIL_ATTEMPTS {
        let c = claim(&store, "w", 1).await.remove(0);
        clock.advance(1);
        let until = clock.now_ms() + 1;
        let outcome = Outcome::Suspended {
            until,
            fuel_used: None,
        };
        store.finish(&c.lease, outcome).await.unwrap();
        clock.set(until);
    }
    let start = clock.now_ms();
    let c = claim(&store, "w-last", 1).await.remove(0);
    assert_eq!(c.run.attempt, 1);
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts_total, DETAIL_ATTEMPTS as u64 + 1);
    assert_eq!(d.attempts.len(), DETAIL_ATTEMPTS);
    let (open, ended) = d.attempts.split_last().unwrap();
    assert_eq!(
        (open.number, open.worker.as_str(), open.started_at),
        (1, "w-last", start)
    );
    assert_eq!((open.finished_at, open.fuel_used), (None, None));
    assert!(
        ended
            .iter()
            .all(|a| a.worker == "w" && a.suspended_until == Some(a.started_at + 2)),
        "{ended:?}"
    );
    // The oldest execution is the one left out.
    assert_eq!(ended[0].started_at, T0 + 2);
    clock.advance(5);
    let done = Outcome::Succeeded {
        output: b"1".to_vec(),
        fuel_used: Some(4),
    };
    store.finish(&c.lease, done).await.unwrap();
    let d = detail(&store, &run.id).await;
    let last = d.attempts.last().unwrap();
    assert_eq!(
        (
            last.worker.as_str(),
            last.started_at,
            last.finished_at,
            last.fuel_used
        ),
        ("w-last", start, Some(start + 5), Some(4))
    );
}

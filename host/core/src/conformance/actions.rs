//! Scenarios of what users do to runs by hand: cancels and retries leave their reason and
//! a log line, and a run can be named by a unique prefix of its id.

use super::*;
use crate::ids::{self, IdRef};

async fn host_lines(store: &impl Store, id: &str) -> Vec<LogLine> {
    let logs = store.logs(DEFAULT_TENANT, id, 0, usize::MAX).await.unwrap();
    logs.into_iter()
        .filter(|l| l.source == LogSource::Host)
        .collect()
}

pub(super) async fn cancel_and_retry_say_who(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let queued = enqueue(&store, "f", "1").await;
    let action = RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:k1");
    let r = store.cancel(action.clone()).await.unwrap();
    assert_eq!(r.error, Some(action.cancel_error()));
    assert_eq!(r.error.unwrap().to_string(), "cancelled: by key:k1");
    assert_eq!(
        host_lines(&store, &queued.id).await,
        vec![action.log_line(0, T0)]
    );

    clock.advance(1);
    let retry = RunAction::retry(DEFAULT_TENANT, &queued.id, "admin");
    store.retry(retry.clone()).await.unwrap();
    let lines = host_lines(&store, &queued.id).await;
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1], retry.log_line(0, T0 + 1));
    assert!(
        lines[1].message.starts_with("retried by admin"),
        "{lines:?}"
    );

    // A running run: the reason is set when the cancel is asked for and stays when its
    // attempt ends (the attempt's own error is the attempt's).
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, queued.id);
    let action = RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:k2, with its parent run p");
    let r = store.cancel(action.clone()).await.unwrap();
    assert_eq!(
        (r.status, r.error.clone()),
        (RunStatus::Running, Some(action.cancel_error()))
    );
    let r = store
        .finish(&c.lease, failed(ErrorReason::Host, Some(1)))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.error),
        (RunStatus::Cancelled, Some(action.cancel_error()))
    );
    let lines = host_lines(&store, &queued.id).await;
    assert_eq!(lines.last(), Some(&action.log_line(1, T0 + 1)), "{lines:?}");

    // What is refused leaves no line.
    let before = host_lines(&store, &queued.id).await.len();
    let refused = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:k3"))
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(host_lines(&store, &queued.id).await.len(), before);

    // Text that would reach a terminal is escaped on the way in.
    let queued = enqueue(&store, "f", "2").await;
    let sneaky = RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:k1\n\x1b[2Jfake line");
    let r = store.cancel(sneaky).await.unwrap();
    let message = r.error.unwrap().message;
    assert!(
        !message.contains('\n') && !message.contains('\x1b'),
        "{message:?}"
    );
    // And bounded: MAX_ACTION_BY_BYTES of it, then a marker of what was left out.
    let queued = enqueue(&store, "f", "3").await;
    let long = RunAction::cancel(DEFAULT_TENANT, &queued.id, &"k".repeat(10_000));
    let message = store.cancel(long).await.unwrap().error.unwrap().message;
    assert!(
        message.starts_with(&format!("by {}", "k".repeat(MAX_ACTION_BY_BYTES)))
            && message.ends_with(&format!("…[+{} bytes]", 10_000 - MAX_ACTION_BY_BYTES)),
        "{message}"
    );
}

pub(super) async fn run_id_prefixes(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let a = enqueue(&store, "f", "1").await;
    let b = enqueue(&store, "f", "2").await;
    clock.advance(3_600_000);
    let c = enqueue(&store, "f", "3").await;
    // One of a and b runs, the others wait: runs are found whatever their state.
    let claimed = claim(&store, "w", 1).await.remove(0).run.id;
    assert!(claimed == a.id || claimed == b.id, "{claimed}");
    for run in [&a, &b, &c] {
        let (lo, hi) = ids::prefix_window(&run.id[..13]);
        assert_eq!(
            (lo, hi),
            (run.created_at, run.created_at),
            "{} is minted from the store's clock",
            run.id
        );
    }
    let find = |prefix: String| {
        let store = &store;
        async move {
            let IdRef::Prefix(p) = ids::parse_id_ref(&prefix) else {
                panic!("{prefix}")
            };
            store
                .run_ids(DEFAULT_TENANT, &p, ids::PREFIX_CANDIDATES)
                .await
                .unwrap()
        }
    };
    for run in [&a, &b, &c] {
        assert_eq!(find(run.id[..35].to_string()).await, vec![run.id.clone()]);
        assert_eq!(
            find(run.id[..35].to_uppercase()).await,
            vec![run.id.clone()],
            "any case"
        );
    }
    // c was made an hour after a and b: its time digits alone name it.
    assert_eq!(find(c.id[..11].to_string()).await, vec![c.id.clone()]);
    let mut ab = vec![a.id.clone(), b.id.clone()];
    ab.sort();
    assert_eq!(
        find(a.id[..13].to_string()).await,
        ab,
        "same millisecond: both, in id order"
    );
    let mut all = vec![a.id.clone(), b.id.clone(), c.id.clone()];
    all.sort();
    assert_eq!(find(a.id[..1].to_string()).await, all);
    assert!(
        store
            .run_ids("someone-else", &a.id[..8], 5)
            .await
            .unwrap()
            .is_empty(),
        "another tenant's runs are not found"
    );
    assert_eq!(
        store
            .run_ids(DEFAULT_TENANT, &a.id[..1], 2)
            .await
            .unwrap()
            .len(),
        2,
        "at most limit"
    );
    assert!(find("ffffffff-fff".to_string()).await.is_empty());
}

pub(super) async fn cancel(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let queued = enqueue(&store, "f", "1").await;
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:test"))
        .await
        .unwrap();
    assert_eq!((r.status, r.finished_at), (RunStatus::Cancelled, Some(T0)));
    let again = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:test"))
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let missing = store
        .cancel(RunAction::cancel("someone-else", &queued.id, "key:test"))
        .await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );

    let sleeper = enqueue(&store, "f", "2").await;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, sleeper.id, "the cancelled run is never claimed");
    store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 60_000,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &sleeper.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    clock.advance(60_000);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "a cancelled sleeper never wakes"
    );

    let running = enqueue(&store, "f", "3").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &running.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(
        r.status,
        RunStatus::Running,
        "a running run ends when its attempt stops"
    );
    let renewal = store
        .renew(std::slice::from_ref(&c.lease), LEASE)
        .await
        .unwrap();
    assert_eq!(
        renewal,
        Renewal {
            lost: vec![],
            cancelling: vec![running.id.clone()]
        },
        "renewal tells the worker to stop, and that the lease is still held"
    );
    let error = RunError::new(ErrorReason::Host, "attempt cancelled");
    let r = store
        .finish(
            &c.lease,
            Outcome::Failed {
                error,
                retry_in_ms: Some(60_001),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled, "not retried");
    assert!(r.finished_at.is_some());

    // A run that succeeds before it stops succeeds: the cancel's reason, stored with the
    // request, goes.
    let finishing = enqueue(&store, "f", "4").await;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, finishing.id);
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &finishing.id, "key:test"))
        .await
        .unwrap();
    assert!(r.error.is_some(), "the request is stored with its reason");
    let r = store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: b"4".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.error), (RunStatus::Succeeded, None));
    assert_eq!(r.output.as_deref(), Some(&b"4"[..]));
}

pub(super) async fn manual_retry(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 2).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let r = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.due_at, r.finished_at),
        (RunStatus::Queued, T0, None)
    );
    assert_eq!(
        r.settings.retry.max_attempts, 3,
        "one used + a fresh budget of 2"
    );
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.attempt, 2);
    let conflict = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await;
    assert!(
        matches!(conflict, Err(StoreError::Conflict(_))),
        "running: {conflict:?}"
    );
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
    let conflict = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await;
    assert!(
        matches!(conflict, Err(StoreError::Conflict(_))),
        "succeeded: {conflict:?}"
    );
    clock.advance(1);
    let cancelled = enqueue(&store, "f", "{}").await;
    store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &cancelled.id, "key:test"))
        .await
        .unwrap();
    let r = store
        .retry(RunAction::retry(DEFAULT_TENANT, &cancelled.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Queued);
}

/// A run asked to start later (`?delay=`, `?at=`) is queued with that due time, starts
/// not a millisecond early, and never once cancelled; a time already past means now.
pub(super) async fn delayed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let first = enqueue(&store, "f", "1").await;
    clock.advance(10);
    // A past time would otherwise rank the run ahead of the one already waiting.
    let past = enqueue_at(&store, "f", "2", T0 - 60_000).await;
    assert_eq!((past.status, past.due_at), (RunStatus::Queued, T0 + 10));
    let later = enqueue_at(&store, "f", "3", T0 + 2_000).await;
    let cancelled = enqueue_at(&store, "f", "4", T0 + 2_000).await;
    assert_eq!(
        (later.status, later.due_at),
        (RunStatus::Queued, T0 + 2_000)
    );
    assert_eq!(detail(&store, &later.id).await.run.due_at, T0 + 2_000);
    let mut started = claim(&store, "w", 10).await;
    assert_eq!(ids(&started), [first.id.clone(), past.id.clone()]);
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &cancelled.id, "key:k1"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    clock.set(T0 + 1_999);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "not a millisecond early"
    );
    clock.set(T0 + 2_000);
    let on_time = claim(&store, "w", 10).await;
    assert_eq!(ids(&on_time), std::slice::from_ref(&later.id));
    started.extend(on_time);
    for c in started {
        store.finish(&c.lease, ok()).await.unwrap();
    }
    clock.advance(60_000);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "a cancelled delayed run never starts"
    );
    let d = detail(&store, &cancelled.id).await;
    assert_eq!(d.run.status, RunStatus::Cancelled);
    assert!(d.attempts.is_empty(), "{:?}", d.attempts);
}

//! Scenarios of what a run keeps: listings, logs, idempotency keys, retry overrides.

use super::*;

pub(super) async fn listing(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    deploy_fn(&store, "g", "d", 1).await;
    let mut ids = vec![];
    for i in 0..5 {
        clock.advance(1);
        ids.push(
            enqueue(&store, if i % 2 == 0 { "f" } else { "g" }, "{}")
                .await
                .id,
        );
    }
    let all: Vec<_> = store
        .runs(query(None, None))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    let newest_first: Vec<_> = ids.iter().rev().cloned().collect();
    assert_eq!(all, newest_first);
    let f: Vec<_> = store
        .runs(query(Some("f"), None))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(f, [ids[4].clone(), ids[2].clone(), ids[0].clone()]);
    let mut q = query(None, None);
    q.limit = 2;
    assert_eq!(store.runs(q).await.unwrap().len(), 2);
    // Pages and time ranges: `before` a page's last id, `since` a creation time, with
    // and without a filter that picks another index.
    let listed = |q: RunQuery| {
        let store = &store;
        async move {
            let runs = store.runs(q).await.unwrap();
            runs.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    let created = |i: usize| {
        let store = &store;
        let id = ids[i].clone();
        async move {
            store
                .run(DEFAULT_TENANT, &id)
                .await
                .unwrap()
                .unwrap()
                .run
                .created_at
        }
    };
    let page = |function: Option<&str>, before: Option<String>, since, limit| RunQuery {
        before,
        since,
        limit,
        ..query(function, None)
    };
    assert_eq!(
        listed(page(None, Some(ids[3].clone()), None, 100)).await,
        [ids[2].clone(), ids[1].clone(), ids[0].clone()],
        "before a page's last id"
    );
    assert_eq!(
        listed(page(None, Some(ids[3].clone()), None, 2)).await,
        [ids[2].clone(), ids[1].clone()]
    );
    assert_eq!(
        listed(page(Some("f"), Some(ids[4].clone()), None, 100)).await,
        [ids[2].clone(), ids[0].clone()],
        "before, with a function"
    );
    let since = created(1).await;
    assert_eq!(
        listed(page(None, None, Some(since), 100)).await,
        [
            ids[4].clone(),
            ids[3].clone(),
            ids[2].clone(),
            ids[1].clone()
        ],
        "since a creation time"
    );
    let until = crate::ids::time_floor(created(3).await);
    assert_eq!(
        listed(page(Some("g"), Some(until.clone()), Some(since), 100)).await,
        [ids[1].clone()],
        "a time range, with a function"
    );
    assert_eq!(
        listed(page(None, Some(until), Some(since), 100)).await,
        [ids[2].clone(), ids[1].clone()],
        "a time range"
    );
    assert!(
        listed(page(None, Some(ids[0].clone()), None, 100))
            .await
            .is_empty(),
        "nothing before the first"
    );
    let c = claim(&store, "w", 1).await.remove(0);
    let running = store
        .runs(query(None, Some(RunStatus::Running)))
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, c.run.id);
    assert_eq!(c.run.id, ids[0], "the oldest is claimed first");
    assert_eq!(
        listed(query(None, None)).await,
        newest_first,
        "runs in different states list together, newest first"
    );
    assert_eq!(
        listed(page(None, Some(ids[1].clone()), None, 5)).await,
        [ids[0].clone()],
        "pages run across states"
    );
    let other = RunQuery {
        tenant: "someone-else".into(),
        ..query(None, None)
    };
    assert!(
        store.runs(other).await.unwrap().is_empty(),
        "runs are scoped to their tenant"
    );
    assert!(store.run("someone-else", &ids[0]).await.unwrap().is_none());
}

pub(super) async fn logs(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let line = |m: &str| LogLine {
        attempt: 1,
        at: clock.now_ms(),
        level: LogLevel::Info,
        source: LogSource::Guest,
        message: m.into(),
    };
    store
        .record(&c.lease, Record::Logs(vec![line("one"), line("two")]))
        .await
        .unwrap();
    store
        .record(&c.lease, Record::Logs(vec![line("three")]))
        .await
        .unwrap();
    let p = Progress {
        percent: 40,
        message: Some("almost".into()),
    };
    store
        .record(&c.lease, Record::Progress(p.clone()))
        .await
        .unwrap();
    let all: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(all, ["one", "two", "three"]);
    let tail: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 2, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(tail, ["three"]);
    assert_eq!(detail(&store, &run.id).await.run.progress, Some(p));
    assert!(
        store
            .logs("someone-else", &run.id, 0, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
}

pub(super) async fn idempotency(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    deploy_fn(&store, "g", "d", 1).await;
    let req = |function: &str, key: &str| EnqueueRequest {
        tenant: DEFAULT_TENANT.into(),
        function: function.into(),
        input: b"{}".to_vec(),
        trigger: "api".into(),
        due_at: None,
        idempotency_key: Some(key.into()),
        retry: None,
        parent: None,
        priority: None,
        trace: None,
    };
    let first = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(first.created);
    assert_eq!(first.run.idempotency_key.as_deref(), Some("k1"));
    clock.advance(IDEMPOTENCY_WINDOW_MS - 1);
    let second = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.run.id, first.run.id);
    let other_fn = store.enqueue(req("g", "k1")).await.unwrap();
    assert!(other_fn.created, "keys are per function");
    clock.advance(1);
    let later = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(later.created, "the window has passed");
    assert_ne!(later.run.id, first.run.id);
    assert_eq!(store.runs(query(Some("f"), None)).await.unwrap().len(), 2);
}

pub(super) async fn retry_override(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let policy = RetryPolicy {
        max_attempts: 7,
        ..RetryPolicy::default()
    };
    let run = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            due_at: None,
            idempotency_key: None,
            retry: Some(policy),
            parent: None,
            priority: None,
            trace: None,
        })
        .await
        .unwrap()
        .run;
    assert_eq!(run.settings.retry, policy);
    assert_eq!(
        run.settings.limits,
        Limits::default(),
        "limits still come from the function"
    );
}

//! Scenarios of the tenant feed ([`crate::feed`]): recorded only while listened to, every
//! status change in the order made, read in pages from a cursor, per tenant.

use crate::feed::*;

use super::*;

async fn read(store: &impl Store, tenant: &str, after: &str, limit: usize) -> FeedPage {
    store
        .feed(tenant, Some(after), limit)
        .await
        .expect("read the feed")
}

fn changes(page: &FeedPage) -> Vec<(String, RunStatus)> {
    page.entries
        .iter()
        .map(|e| (e.run_id.clone(), e.status))
        .collect()
}

pub(super) async fn feed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d1", 2).await;
    let start = store.feed(DEFAULT_TENANT, None, 10).await.unwrap();
    assert!(start.entries.is_empty());
    let early = enqueue(&store, "f", "early").await;
    assert!(
        read(&store, DEFAULT_TENANT, &start.next, 10)
            .await
            .entries
            .is_empty(),
        "nothing is recorded while no one listens"
    );

    store
        .listen_feed(DEFAULT_TENANT, clock.now_ms() + FEED_LISTEN_MS)
        .await
        .unwrap();
    let here = store.feed(DEFAULT_TENANT, None, 10).await.unwrap().next;
    let late = enqueue(&store, "f", "late").await;
    let claimed = claim(&store, "w", 2).await;
    assert_eq!(claimed.len(), 2);
    let of = |id: &str| {
        claimed
            .iter()
            .find(|c| c.run.id == id)
            .unwrap()
            .lease
            .clone()
    };
    store.finish(&of(&late.id), ok()).await.unwrap();
    store
        .finish(
            &of(&early.id),
            Outcome::Failed {
                error: RunError::new(ErrorReason::Retryable, "again"),
                retry_in_ms: Some(0),
                fuel_used: None,
            },
        )
        .await
        .unwrap();

    let all = read(&store, DEFAULT_TENANT, &here, 100).await;
    let got = changes(&all);
    assert_eq!(got.len(), 5, "{got:?}");
    assert_eq!(got[0], (late.id.clone(), RunStatus::Queued));
    // The claim started both, in an order of its own.
    let mut started: Vec<String> = got[1..3]
        .iter()
        .map(|(id, status)| {
            assert_eq!(*status, RunStatus::Running);
            id.clone()
        })
        .collect();
    started.sort();
    let mut want = vec![early.id.clone(), late.id.clone()];
    want.sort();
    assert_eq!(started, want);
    assert_eq!(got[3], (late.id.clone(), RunStatus::Succeeded));
    assert_eq!(got[4], (early.id.clone(), RunStatus::Queued));
    let e = &all.entries[3];
    assert_eq!((e.function.as_str(), e.attempt), ("f", 1));
    assert_eq!(all.next, all.entries[4].cursor);

    // In pages: a read resumes after its cursor, nothing missed or repeated.
    let first = read(&store, DEFAULT_TENANT, &here, 2).await;
    let rest = read(&store, DEFAULT_TENANT, &first.next, 100).await;
    let mut paged = changes(&first);
    paged.extend(changes(&rest));
    assert_eq!(paged, got);
    assert!(
        read(&store, DEFAULT_TENANT, &all.next, 100)
            .await
            .entries
            .is_empty()
    );
    let other = store.feed("other", None, 10).await.unwrap();
    assert!(
        read(&store, "other", &other.next, 10)
            .await
            .entries
            .is_empty()
    );

    // Once no listener renews it, recording stops.
    clock.advance(FEED_LISTEN_MS + 1);
    enqueue(&store, "f", "unheard").await;
    assert!(
        read(&store, DEFAULT_TENANT, &all.next, 100)
            .await
            .entries
            .is_empty()
    );
}

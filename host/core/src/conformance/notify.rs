//! Scenarios of webhook deliveries ([`crate::notify`]): added once per id, claimed with a
//! lease, retried on core's schedule, recorded only under the latest claim, gone with
//! their run.

use crate::notify::*;

use super::*;

async fn deploy_notifying(store: &impl Store, urls: &[&str]) {
    let settings = FunctionSettings {
        notify: NotifySettings {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            attempts: true,
        },
        ..settings(3)
    };
    deploy_with(store, DEFAULT_TENANT, "n", settings, vec![]).await;
}

/// A run of `n` that ended succeeded.
async fn ended_run(store: &impl Store) -> Run {
    let run = enq(store, "n", serde_json::json!({"x": 1})).await;
    let c = claim(store, "w", 1).await;
    assert_eq!(c.len(), 1);
    store.finish(&c[0].lease, ok()).await.unwrap();
    status_of(store, DEFAULT_TENANT, &run.id).await
}

async fn claim_all(store: &impl Store) -> Vec<Delivery> {
    store
        .claim_deliveries(10, 60_000)
        .await
        .expect("claim deliveries")
}

fn tried(d: &Delivery, token: u64, error: Option<&str>) -> DeliveryTry {
    DeliveryTry {
        tenant: d.tenant.clone(),
        id: d.id.clone(),
        token,
        error: error.map(Into::into),
    }
}

pub(super) async fn deliveries(store: impl Store, clock: ManualClock) {
    deploy_notifying(&store, &["http://a.test/1", "http://b.test/2"]).await;
    let run = ended_run(&store).await;
    let made = crate::notify::deliveries(&run, Notice::Ended, clock.now_ms());
    assert_eq!(made.len(), 2);
    store.add_deliveries(made.clone()).await.unwrap();
    store.add_deliveries(made.clone()).await.unwrap();
    let kept = store.deliveries(DEFAULT_TENANT, &run.id).await.unwrap();
    let ids: Vec<&str> = kept.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [made[0].id.as_str(), made[1].id.as_str()],
        "added once, in order"
    );
    assert!(
        kept.iter()
            .all(|d| d.status == DeliveryStatus::Pending && d.tries == 0)
    );
    assert_eq!(kept[0].event, "run.succeeded");
    assert!(
        store.deliveries("other", &run.id).await.unwrap().is_empty(),
        "another tenant sees none"
    );

    // Claimed with a lease: a second claim meanwhile gets nothing.
    let got = claim_all(&store).await;
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].payload, made[0].payload,
        "the payload is kept as made"
    );
    assert!(claim_all(&store).await.is_empty());
    let (a, b) = (&got[0], &got[1]);
    store.record_try(tried(a, a.token, None)).await.unwrap();
    store
        .record_try(tried(b, b.token, Some("HTTP 500")))
        .await
        .unwrap();
    // A try under an older claim changes nothing.
    store.record_try(tried(b, b.token - 1, None)).await.unwrap();
    let kept = store.deliveries(DEFAULT_TENANT, &run.id).await.unwrap();
    assert_eq!(kept[0].status, DeliveryStatus::Delivered);
    assert_eq!(kept[0].tries, 1);
    assert_eq!(kept[1].status, DeliveryStatus::Pending);
    assert_eq!(kept[1].last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(kept[1].next_at, clock.now_ms() + RETRY_DELAYS_MS[0] as i64);

    // Due again after the first delay; a sender that dies leaves it to the next claim.
    assert!(claim_all(&store).await.is_empty(), "not due yet");
    clock.advance(RETRY_DELAYS_MS[0] as i64);
    let again = claim_all(&store).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].tries, 1);
    clock.advance(60_001);
    let taken_over = claim_all(&store).await;
    assert_eq!(ids_of(&taken_over), ids_of(&again), "the lease ran out");
    assert!(taken_over[0].token > again[0].token);
    store
        .record_try(tried(&again[0], again[0].token, None))
        .await
        .unwrap();
    store
        .record_try(tried(&taken_over[0], taken_over[0].token, None))
        .await
        .unwrap();
    let kept = store.deliveries(DEFAULT_TENANT, &run.id).await.unwrap();
    assert_eq!(kept[1].status, DeliveryStatus::Delivered);
    assert_eq!(kept[1].tries, 2, "the stale claim's try was not counted");

    // One that always fails is given up after its last try.
    deploy_notifying(&store, &["http://c.test/"]).await;
    let doomed = ended_run(&store).await;
    store
        .add_deliveries(crate::notify::deliveries(
            &doomed,
            Notice::Ended,
            clock.now_ms(),
        ))
        .await
        .unwrap();
    for _ in 0..=RETRY_DELAYS_MS.len() {
        let d = claim_all(&store).await;
        assert_eq!(d.len(), 1);
        store
            .record_try(tried(&d[0], d[0].token, Some("refused")))
            .await
            .unwrap();
        clock.advance(RETRY_DELAYS_MS.iter().max().copied().unwrap() as i64);
    }
    assert!(claim_all(&store).await.is_empty());
    let gone = store.deliveries(DEFAULT_TENANT, &doomed.id).await.unwrap();
    assert_eq!(gone[0].status, DeliveryStatus::Failed);
    assert_eq!(gone[0].tries, RETRY_DELAYS_MS.len() as u32 + 1);

    // Purged with their run.
    let n = store
        .purge(PurgeRequest {
            succeeded_before: clock.now_ms() + 1,
            failed_before: clock.now_ms() + 1,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert!(
        store
            .deliveries(DEFAULT_TENANT, &run.id)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .deliveries(DEFAULT_TENANT, &doomed.id)
            .await
            .unwrap()
            .is_empty()
    );
}

fn ids_of(d: &[Delivery]) -> Vec<String> {
    d.iter().map(|d| d.id.clone()).collect()
}

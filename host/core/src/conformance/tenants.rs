//! Scenarios of the tenant directory: tenants, keys, usage and the audit trail.

use super::*;

pub(super) async fn tenants(store: impl Store + Directory, _clock: ManualClock) {
    store.create_tenant(tenant("zeta")).await.expect("create");
    store.create_tenant(tenant("acme")).await.expect("create");
    let again = store.create_tenant(tenant("acme")).await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let names: Vec<String> = store
        .tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["acme", "zeta"]);
    let quotas = Quotas {
        max_queued: 5,
        max_running: 2,
        ..Quotas::default()
    };
    let t = store.set_quotas("acme", quotas).await.expect("set quotas");
    assert_eq!(t.quotas, quotas);
    assert_eq!(store.tenant("acme").await.unwrap().unwrap().quotas, quotas);
    assert_eq!(
        store.tenant("zeta").await.unwrap().unwrap().quotas,
        Quotas::default()
    );
    assert!(store.tenant("nobody").await.unwrap().is_none());
    let missing = store.set_quotas("nobody", quotas).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
}

pub(super) async fn keys(store: impl Store + Directory, _clock: ManualClock) {
    let orphan = store.create_key(api_key("k0", "nobody", T0)).await;
    assert!(matches!(orphan, Err(StoreError::NotFound(_))), "{orphan:?}");
    store.create_tenant(tenant("acme")).await.unwrap();
    store.create_tenant(tenant("other")).await.unwrap();
    store
        .create_key(api_key("k2", "acme", T0 + 2))
        .await
        .unwrap();
    store
        .create_key(api_key("k1", "acme", T0 + 1))
        .await
        .unwrap();
    store
        .create_key(api_key("k3", "other", T0 + 3))
        .await
        .unwrap();
    let dup = store.create_key(api_key("k1", "other", T0 + 4)).await;
    assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");

    assert_eq!(
        store.key("k1").await.unwrap(),
        Some(api_key("k1", "acme", T0 + 1))
    );
    assert_eq!(store.key("nope").await.unwrap(), None);
    let ids: Vec<String> = store
        .keys("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(ids, ["k1", "k2"], "oldest first, only the tenant's");

    // Another tenant cannot revoke it; revoking twice keeps the first time.
    let wrong = store.revoke_key("other", "k1", T0 + 10).await;
    assert!(matches!(wrong, Err(StoreError::NotFound(_))), "{wrong:?}");
    assert_eq!(store.key("k1").await.unwrap().unwrap().revoked_at, None);
    let revoked = store.revoke_key("acme", "k1", T0 + 10).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(T0 + 10));
    let again = store.revoke_key("acme", "k1", T0 + 20).await.unwrap();
    assert_eq!(again.revoked_at, Some(T0 + 10));
    assert_eq!(
        store.key("k1").await.unwrap().unwrap().revoked_at,
        Some(T0 + 10)
    );
    assert_eq!(
        store.keys("acme").await.unwrap().len(),
        2,
        "revoked keys stay listed"
    );
}

pub(super) async fn usage(store: impl Store + Directory, clock: ManualClock) {
    assert_eq!(store.usage(DEFAULT_TENANT).await.unwrap(), Usage::default());
    deploy_fn(&store, "f", "d1", 3).await;
    for _ in 0..4 {
        enqueue(&store, "f", "{}").await;
    }
    let c = claim(&store, "w", 4).await;
    assert_eq!(c.len(), 4);
    let ok = Outcome::Succeeded {
        output: b"{}".to_vec(),
        fuel_used: Some(1_000),
    };
    store.finish(&c[0].lease, ok).await.unwrap();
    store
        .finish(&c[1].lease, failed(ErrorReason::Trap, None))
        .await
        .unwrap();
    // Given back at shutdown: not an ended execution, nothing to bill.
    store.finish(&c[2].lease, Outcome::Released).await.unwrap();
    // An execution that ends by sleeping or waiting burned fuel too.
    let sleep = Outcome::Suspended {
        until: T0 + 60_000,
        fuel_used: Some(20),
    };
    store.finish(&c[3].lease, sleep).await.unwrap();
    clock.advance(1);
    let c = claim(&store, "w", 1).await;
    assert_eq!(c.len(), 1, "the released run is back");
    let mut wait = waiting_for_event(None, None);
    if let Outcome::Waiting { fuel_used, .. } = &mut wait {
        *fuel_used = Some(300);
    }
    store.finish(&c[0].lease, wait).await.unwrap();
    let u = store.usage(DEFAULT_TENANT).await.unwrap();
    assert_eq!((u.fuel, u.attempts), (1_327, 4), "{u:?}");
    assert!(u.stored_bytes > 0, "what the runs keep is counted: {u:?}");
    assert_eq!(store.usage("someone-else").await.unwrap(), Usage::default());
}

pub(super) async fn audit(store: impl Store + Directory, _clock: ManualClock) {
    let entry = |n: i64, tenant: &str| AuditEntry {
        at: T0 + n,
        tenant: tenant.into(),
        actor: "admin".into(),
        action: "deploy".into(),
        target: format!("f{n}"),
    };
    for (n, t) in [(1, "a"), (2, "b"), (3, "a")] {
        store.audit(entry(n, t)).await.unwrap();
    }
    assert_eq!(
        store.audit_log(None, 10).await.unwrap(),
        [entry(3, "a"), entry(2, "b"), entry(1, "a")]
    );
    assert_eq!(
        store.audit_log(Some("a"), 10).await.unwrap(),
        [entry(3, "a"), entry(1, "a")]
    );
    assert_eq!(store.audit_log(None, 1).await.unwrap(), [entry(3, "a")]);
    assert!(store.audit_log(Some("c"), 10).await.unwrap().is_empty());
}

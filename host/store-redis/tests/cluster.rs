//! Several tenants on a real 3-master Redis Cluster: runs of every tenant complete, and the
//! tenants' keys (one hash-tag slot each) are spread over the masters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use wasq_core::*;
use wasq_store_redis::testing::RedisCluster;
use wasq_store_redis::{RedisStore, StoreOptions};

const TENANTS: [&str; 8] = [
    "acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell",
];
const RUNS_PER_TENANT: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_spread_over_masters_and_all_runs_complete() {
    let cluster = RedisCluster::start(3);
    let store = RedisStore::connect_with(
        &cluster.url(),
        Arc::new(SystemClock),
        StoreOptions::default().with_namespace("multi"),
    )
    .await
    .expect("connect");
    assert!(store.is_cluster());
    let t = Instant::now();
    let mut expected = BTreeMap::new();
    for tenant in TENANTS {
        store
            .deploy(DeployRequest {
                tenant: tenant.into(),
                name: "job".into(),
                digest: "digest-1".into(),
                component: b"component bytes".to_vec(),
                settings: FunctionSettings::default(),
                events: vec![],
                schedule: None,
            })
            .await
            .expect("deploy");
        for i in 0..RUNS_PER_TENANT {
            let run = store
                .enqueue(EnqueueRequest {
                    tenant: tenant.into(),
                    function: "job".into(),
                    input: format!("{{\"n\":{i}}}").into_bytes(),
                    trigger: "api".into(),
                    ..EnqueueRequest::default()
                })
                .await
                .expect("enqueue")
                .run;
            expected.insert(run.id, tenant);
        }
    }
    let mut done = 0;
    let mut claims = 0;
    while done < expected.len() {
        claims += 1;
        assert!(
            claims < 100,
            "runs were left unclaimed: {done} of {}",
            expected.len()
        );
        let batch = store
            .claim(ClaimRequest {
                worker: "w".into(),
                limit: 7,
                lease_ms: 30_000,
                queues: Vec::new(),
            })
            .await
            .expect("claim");
        let tenants: BTreeSet<_> = batch.iter().map(|c| c.run.tenant.clone()).collect();
        assert!(
            batch.len() < 2 || tenants.len() > 1,
            "a batch is shared among the tenants with work: {tenants:?}"
        );
        // One renewal call for leases of several tenants (one script call per tenant);
        // a cancelled run is reported back.
        if let Some(first) = batch.first() {
            let leases: Vec<Lease> = batch.iter().map(|c| c.lease.clone()).collect();
            assert!(store.renew(&leases, 30_000).await.unwrap().all_held());
            if claims == 1 {
                store
                    .cancel(RunAction::cancel(
                        &first.run.tenant,
                        &first.run.id,
                        "key:test",
                    ))
                    .await
                    .unwrap();
                let renewal = store.renew(&leases, 30_000).await.unwrap();
                assert_eq!(renewal.cancelling, std::slice::from_ref(&first.run.id));
                assert!(renewal.lost.is_empty(), "{renewal:?}");
            }
        }
        for c in batch {
            assert_eq!(expected[&c.run.id], c.run.tenant);
            assert_eq!(c.lease.tenant, c.run.tenant);
            let output = format!("{{\"done\":\"{}\"}}", c.run.id).into_bytes();
            let run = store
                .finish(
                    &c.lease,
                    Outcome::Succeeded {
                        output,
                        fuel_used: None,
                    },
                )
                .await
                .expect("finish");
            // A success beats a cancellation requested while it ran.
            assert_eq!(run.status, RunStatus::Succeeded);
            done += 1;
        }
    }
    for tenant in TENANTS {
        let ok = store
            .runs(RunQuery {
                tenant: tenant.into(),
                function: Some("job".into()),
                status: Some(RunStatus::Succeeded),
                limit: 100,
                ..RunQuery::default()
            })
            .await
            .expect("runs");
        assert_eq!(ok.len(), RUNS_PER_TENANT, "tenant {tenant}");
    }
    eprintln!(
        "{} runs of {} tenants completed in {claims} claims, {:?}",
        expected.len(),
        TENANTS.len(),
        t.elapsed()
    );

    // Where the keys live: each tenant's keys on one master, the tenants on all of them.
    let mut by_master: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for tenant in TENANTS {
        let prefix = store.tenant_prefix(tenant);
        let meta = format!("{prefix}meta");
        let succeeded = format!("{prefix}st:succeeded");
        let port = cluster.node_of(&meta);
        assert_eq!(cluster.node_of(&succeeded), port, "one slot per tenant");
        let node = cluster
            .nodes()
            .iter()
            .find(|n| n.port() == port)
            .expect("node");
        assert_eq!(node.cli(&["EXISTS", &succeeded]).trim(), "1");
        let slot = node.cli(&["CLUSTER", "KEYSLOT", &meta]);
        eprintln!(
            "tenant {tenant:9} slot {:5} -> master 127.0.0.1:{port}",
            slot.trim()
        );
        by_master.entry(port).or_default().push(tenant);
    }
    assert_eq!(
        by_master.len(),
        3,
        "tenants are spread over all three masters: {by_master:?}"
    );
}

//! Enqueues made at once go to Redis together (`coalesce.rs`), against a real
//! redis-server: 100 enqueues of two tenants started at once cost a few script calls, not
//! 100, and each is answered with its own run; one made alone goes out at once, alone.

use wasq_core::*;
use wasq_store_redis::testing::{self, RedisOptions, RedisServer};

/// Run `n` of `tenant`: plain, or with an idempotency key, or with a priority — the three
/// ways an enqueue sends a run to the script (`run_args` in admission.rs), each answered
/// with the run as stored.
fn req(tenant: &str, n: usize) -> EnqueueRequest {
    EnqueueRequest {
        tenant: tenant.into(),
        function: "f".into(),
        input: format!(r#"{{"n":{n}}}"#).into_bytes(),
        trigger: "api".into(),
        idempotency_key: (n % 3 == 1).then(|| format!("k{n}")),
        priority: (n % 3 == 2).then_some(2),
        ..EnqueueRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_made_at_once_go_out_together_each_answered_with_its_run() {
    let redis = RedisServer::start(RedisOptions::default());
    let store = testing::connect(&redis.url(), "coalesce").await;
    for tenant in ["a", "b"] {
        testing::deploy(&store, tenant, "f").await;
    }
    // Alone: one call.
    for tenant in ["a", "b"] {
        let before = redis.calls("fcall");
        let alone = store.enqueue(req(tenant, 1000)).await.expect("enqueue");
        assert!(alone.created);
        assert_eq!(redis.calls("fcall") - before, 1);
    }

    let reqs: Vec<EnqueueRequest> = (0..100)
        .map(|n| req(if n % 2 == 0 { "a" } else { "b" }, n))
        .collect();
    let before = redis.calls("fcall");
    // Whatever goes out first is held at Redis (a pause holds every script that writes)
    // until the others have surely arrived: how many came before it went out depends on
    // the scheduler, and without the pause a fast call let them trickle out in up to 18.
    redis.cli(&["CLIENT", "PAUSE", "300", "WRITE"]);
    let answers =
        futures_util::future::join_all(reqs.iter().cloned().map(|r| store.enqueue(r))).await;
    let calls = redis.calls("fcall") - before;
    // The first round goes out at once; the rest arrive while it is on its way and go
    // together, by tenant, 32 to a call at most: at most 2 + 2 calls for each tenant's
    // 50 runs across the two rounds, where alone they were 100.
    assert!(calls <= 6, "{calls} script calls for 100 enqueues");
    let mut ids = std::collections::HashSet::new();
    for (r, a) in reqs.iter().zip(answers) {
        let e = a.expect("enqueue");
        assert!(e.created);
        assert_eq!((&e.run.tenant, &e.run.input), (&r.tenant, &r.input));
        assert!(ids.insert(e.run.id.clone()), "one run per enqueue");
        let stored = store.run(&r.tenant, &e.run.id).await.unwrap().unwrap();
        assert_eq!(stored.run, e.run, "the answer is the stored run");
    }
}

/// A clock that moves a millisecond every time it is read: whatever reads it twice on
/// the way to one run sees two times.
#[derive(Debug, Default)]
struct Ticking(std::sync::atomic::AtomicI64);

impl Clock for Ticking {
    fn now_ms(&self) -> i64 {
        1_800_000_000_000 + self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_id_carries_its_creation_time_and_finds_it() {
    let redis = RedisServer::start(RedisOptions::default());
    let store = wasq_store_redis::RedisStore::connect_with(
        &redis.url(),
        std::sync::Arc::new(Ticking::default()),
        wasq_store_redis::StoreOptions::default().with_namespace("ticking"),
    )
    .await
    .expect("connect");
    testing::deploy(&store, "a", "f").await;
    let reqs: Vec<EnqueueRequest> = (0..20).map(|n| req("a", n)).collect();
    let mut runs = vec![store.enqueue(req("a", 100)).await.expect("enqueue").run];
    for e in futures_util::future::join_all(reqs.into_iter().map(|r| store.enqueue(r))).await {
        runs.push(e.expect("enqueue").run);
    }
    for run in runs {
        // An id's first 48 bits are its creation time (wasq_core::ids), which a lookup by
        // prefix reads the indexes by.
        let stored = store.run("a", &run.id).await.unwrap().expect("stored").run;
        assert_eq!(
            wasq_core::ids::prefix_window(&run.id).0,
            stored.created_at,
            "{}",
            run.id
        );
        assert_eq!(
            store.run_ids("a", &run.id, 5).await.unwrap(),
            vec![run.id.clone()]
        );
    }
}

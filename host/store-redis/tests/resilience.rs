//! Failure and wake-up behaviour against real redis-server processes: a dead or frozen
//! Redis gives `Unavailable` quickly and the same store recovers; idle workers wake on new
//! work and at due times; the tenant's due time is published, never later than the truth; a big
//! tenant does not starve a small one; startup warnings; a Redis that lost the scripts'
//! function library gets it back from the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasq_core::*;
use wasq_store_redis::testing::{RedisCluster, RedisOptions, RedisServer};
use wasq_store_redis::{RedisStore, StoreOptions};

async fn deploy(store: &RedisStore, tenant: &str) {
    store
        .deploy(DeployRequest {
            tenant: tenant.into(),
            name: "f".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: FunctionSettings::default(),
            events: vec![],
            schedule: None,
        })
        .await
        .expect("deploy");
}

/// A store on `url` in its own namespace, with function "f" deployed for tenant "t".
async fn deployed(url: &str, namespace: &str) -> RedisStore {
    let store = RedisStore::connect_with(
        url,
        Arc::new(SystemClock),
        StoreOptions::default().with_namespace(namespace),
    )
    .await
    .unwrap();
    deploy(&store, "t").await;
    store
}

fn request(tenant: &str, due_at: Option<i64>) -> EnqueueRequest {
    EnqueueRequest {
        tenant: tenant.into(),
        function: "f".into(),
        input: b"{}".to_vec(),
        trigger: "api".into(),
        due_at,
        idempotency_key: None,
        retry: None,
        parent: None,
        priority: None,
        trace: None,
    }
}

fn claim_req(limit: usize) -> ClaimRequest {
    ClaimRequest {
        worker: "w".into(),
        limit,
        lease_ms: 30_000,
        queues: Vec::new(),
    }
}

/// The ids of the runs one claim of up to `limit` gets, in the order it got them.
async fn claimed_ids(store: &RedisStore, limit: usize) -> Vec<String> {
    let claimed = store.claim(claim_req(limit)).await.unwrap();
    claimed.into_iter().map(|c| c.run.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_is_unavailable_quickly_and_the_store_recovers() {
    let mut server = RedisServer::start(RedisOptions {
        appendfsync: Some("always".into()),
        ..RedisOptions::default()
    });
    let store = RedisStore::connect(&server.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    deploy(&store, "t").await;
    let before = store.enqueue(request("t", None)).await.unwrap().run;

    server.kill();
    for _ in 0..3 {
        let t = Instant::now();
        let err = store.enqueue(request("t", None)).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(err.is_retryable());
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
        );
        eprintln!("killed: enqueue failed in {:?}: {err}", t.elapsed());
        let t = Instant::now();
        let err = store.claim(claim_req(1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        let err = store
            .wait_for_work(Duration::from_secs(5), &[])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "took {:?}",
            t.elapsed()
        );
    }

    server.restart();
    let t = Instant::now();
    let after = loop {
        match store.enqueue(request("t", None)).await {
            Ok(e) => break e.run,
            Err(e) if e.is_retryable() && t.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("store did not recover: {e}"),
        }
    };
    eprintln!(
        "restarted: the same store enqueued again after {:?}",
        t.elapsed()
    );
    let got = claimed_ids(&store, 10).await;
    assert_eq!(
        got,
        [before.id, after.id],
        "AOF (always) kept the run from before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_times_out_and_the_store_goes_on() {
    let server = RedisServer::start(RedisOptions::default());
    let store = RedisStore::connect(&server.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    deploy(&store, "t").await;
    server.stop_for(Duration::from_secs(3));
    let t = Instant::now();
    let err = store.enqueue(request("t", None)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "took {:?}",
        t.elapsed()
    );
    eprintln!("frozen: enqueue failed in {:?}: {err}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    loop {
        match store.enqueue(request("t", None)).await {
            Ok(_) => break,
            Err(e) if e.is_retryable() && t.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("store did not recover: {e}"),
        }
    }
    eprintln!("thawed: enqueue worked again after {:?}", t.elapsed());
}

/// An idle worker wakes when a run is enqueued, at a delayed run's due time by its own
/// timer, and when a run is due sooner than the time that timer is set for.
async fn wake_ups(url: &str) {
    let store = deployed(url, "wake").await;

    // Nothing to do: waits the full time.
    let t = Instant::now();
    store
        .wait_for_work(Duration::from_millis(300), &[])
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(280),
        "{:?}",
        t.elapsed()
    );

    // A new run wakes the waiter.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            store
                .wait_for_work(Duration::from_secs(10), &[])
                .await
                .unwrap();
            t.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let run = store.enqueue(request("t", None)).await.unwrap().run;
    let waited = waiter.await.unwrap();
    eprintln!("woken by enqueue after {waited:?} (enqueued at ~200ms)");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    let c = store.claim(claim_req(1)).await.unwrap().remove(0);
    assert_eq!(c.run.id, run.id);
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

    // A delayed run: a worker loop (wait, claim) gets it at its due time. Wake-ups may
    // come early (a token for the earlier run, or for the new due time); a claim then
    // finds nothing and the next wait sleeps until the due time.
    let due = SystemClock.now_ms() + 400;
    store.enqueue(request("t", Some(due))).await.unwrap();
    let mut waits = 0;
    loop {
        waits += 1;
        assert!(waits <= 4, "too many wake-ups");
        store
            .wait_for_work(Duration::from_secs(10), &[])
            .await
            .unwrap();
        if !store.claim(claim_req(1)).await.unwrap().is_empty() {
            break;
        }
    }
    let late = SystemClock.now_ms() - due;
    eprintln!("delayed run: claimed {late} ms after its due time, after {waits} waits");
    assert!((0..150).contains(&late), "claimed {late} ms after due");

    // A run due before the tenant's published due time (a later run's) wakes the waiters,
    // whose timers are set for the later one.
    store
        .enqueue(request("t", Some(SystemClock.now_ms() + 5_000)))
        .await
        .unwrap();
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            for _ in 0..4 {
                store
                    .wait_for_work(Duration::from_secs(10), &[])
                    .await
                    .unwrap();
                if let Some(c) = store.claim(claim_req(1)).await.unwrap().pop() {
                    return Some((SystemClock.now_ms(), c.run.id));
                }
            }
            None
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let due = SystemClock.now_ms() + 300;
    let sooner = store.enqueue(request("t", Some(due))).await.unwrap().run;
    let (at, id) = waiter.await.unwrap().expect("claimed within four waits");
    assert_eq!(id, sooner.id);
    let late = at - due;
    eprintln!("a sooner run: claimed {late} ms after its due time");
    assert!((0..1_000).contains(&late), "claimed {late} ms after due");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    wake_ups(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_cluster() {
    let cluster = RedisCluster::start(3);
    wake_ups(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_backlog_does_not_starve_another_tenant() {
    let server = RedisServer::start(RedisOptions::default());
    let clock = ManualClock::new(1_700_000_000_000);
    let store = RedisStore::connect(&server.url(), Arc::new(clock.clone()))
        .await
        .unwrap();
    deploy(&store, "big").await;
    deploy(&store, "small").await;
    for _ in 0..500 {
        store.enqueue(request("big", None)).await.unwrap();
    }
    clock.advance(1);
    let small = store.enqueue(request("small", None)).await.unwrap().run;
    for limit in [1, 10] {
        // Whatever tenant the rotation starts with, the small tenant's run is in the first
        // two claims of size 1, or the first claim of size 10.
        let mut got = vec![];
        for _ in 0..(if limit == 1 { 2 } else { 1 }) {
            got.extend(store.claim(claim_req(limit)).await.unwrap());
        }
        let ids: Vec<_> = got.iter().map(|c| c.run.id.clone()).collect();
        assert!(ids.contains(&small.id), "limit {limit}: {ids:?}");
        for c in got.iter().filter(|c| c.run.id == small.id) {
            store.finish(&c.lease, Outcome::Released).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_warnings_name_risky_settings() {
    let risky = RedisServer::start(RedisOptions {
        appendfsync: None,
        extra_args: vec!["--maxmemory-policy".into(), "allkeys-lru".into()],
    });
    let store = RedisStore::connect(&risky.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    let warnings = store.startup_warnings().await;
    eprintln!("{warnings:#?}");
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("maxmemory-policy is allkeys-lru"));
    assert!(warnings[1].contains("appendonly is no"));

    let safe = RedisServer::start(RedisOptions {
        appendfsync: Some("everysec".into()),
        ..RedisOptions::default()
    });
    let store = RedisStore::connect(&safe.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    assert!(store.startup_warnings().await.is_empty());

    let locked = RedisServer::start(RedisOptions {
        appendfsync: Some("everysec".into()),
        extra_args: vec!["--rename-command".into(), "CONFIG".into(), String::new()],
    });
    let store = RedisStore::connect(&locked.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    let warnings = store.startup_warnings().await;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().all(|w| w.starts_with("could not read")));

    let cluster = RedisCluster::start(3);
    let store = RedisStore::connect(&cluster.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    let warnings = store.startup_warnings().await;
    assert_eq!(
        warnings.len(),
        1,
        "one per setting, not per node: {warnings:?}"
    );
    assert!(warnings[0].contains("appendonly is no"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_share_one_connection_and_lose_no_token() {
    let server = RedisServer::start(RedisOptions::default());
    let store = RedisStore::connect(&server.url(), Arc::new(SystemClock))
        .await
        .unwrap();
    // Like a worker whose in-process wake-up wins the race against the store's wait.
    for _ in 0..50 {
        let wait = store.wait_for_work(Duration::from_secs(5), &[]);
        assert!(
            tokio::time::timeout(Duration::from_millis(5), wait)
                .await
                .is_err()
        );
    }
    let clients = server.cli(&["INFO", "clients"]);
    let connected: usize = clients
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients");
    // The store's shared connection, its one blocking connection, and this redis-cli.
    assert!(
        connected <= 3,
        "{connected} clients after 50 abandoned waits"
    );
    // A token arriving while nobody in this process waits is handed back, not swallowed.
    server.cli(&["LPUSH", "wasq:g:{wasq}:wake", "1"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.cli(&["LLEN", "wasq:g:{wasq}:wake"]).trim(), "1");
    // And the next wait takes it at once.
    let t = Instant::now();
    store
        .wait_for_work(Duration::from_secs(5), &[])
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

/// A Redis that lost the scripts' library (restarted without persistence, a replica
/// promoted before the library reached it: here `FUNCTION FLUSH` on every node) gets it
/// loaded again by the next call, which then runs once: nothing is lost or doubled.
async fn lost_library(url: &str, nodes: &[&RedisServer]) {
    let store = deployed(url, "lib").await;
    let before = store.enqueue(request("t", None)).await.unwrap().run;
    for node in nodes {
        assert_eq!(node.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
        assert_eq!(node.cli(&["FUNCTION", "LIST"]).trim(), "");
    }
    let after = store.enqueue(request("t", None)).await.unwrap().run;
    let mut got = claimed_ids(&store, 10).await;
    got.sort();
    assert_eq!(got, [before.id, after.id], "each run exactly once");
    // Loaded on every node that had lost it (a cluster's tenants live on all of them).
    let loaded = nodes
        .iter()
        .filter(|n| n.cli(&["FUNCTION", "LIST"]).contains("wasq_"))
        .count();
    assert!(loaded >= 1, "the library is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_script_library_is_loaded_again_single_node() {
    let server = RedisServer::start(RedisOptions::default());
    lost_library(&server.url(), &[&server]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_script_library_is_loaded_again_cluster() {
    let cluster = RedisCluster::start(3);
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    lost_library(&cluster.url(), &nodes).await;
    // FUNCTION LOAD went to every master, not only the one that answered.
    for node in &nodes {
        assert!(
            node.cli(&["FUNCTION", "LIST"]).contains("wasq_"),
            "{}",
            node.port()
        );
    }
}

/// While no worker waits, enqueues keep the wake list at its bound (64 tokens) and leave a
/// full one alone; once workers have taken tokens, the next run's token is pushed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wake_list_stays_bounded_while_nobody_waits() {
    let server = RedisServer::start(RedisOptions::default());
    let store = deployed(&server.url(), "wasq").await;
    let wake = "wasq:g:{wasq}:wake";
    for _ in 0..100 {
        store.enqueue(request("t", None)).await.unwrap();
    }
    assert_eq!(server.cli(&["LLEN", wake]).trim(), "64");
    // Workers took all but ten.
    server.cli(&["LTRIM", wake, "0", "9"]);
    store.enqueue(request("t", None)).await.unwrap();
    assert_eq!(server.cli(&["LLEN", wake]).trim(), "11");
}

/// A store on `server` in namespace `ns`, on a manual clock at 1,000,000 ms.
async fn on_manual_clock(server: &RedisServer, ns: &str) -> (RedisStore, ManualClock) {
    let clock = ManualClock::new(1_000_000);
    let store = RedisStore::connect_with(
        &server.url(),
        Arc::new(clock.clone()),
        StoreOptions::default().with_namespace(ns),
    )
    .await
    .unwrap();
    (store, clock)
}

/// Tenant "t"'s due time in the global schedule of namespace `ns` (what idle workers
/// sleep until).
fn published_due(server: &RedisServer, ns: &str) -> Option<i64> {
    let v = server.cli(&["ZSCORE", &format!("{ns}:g:{{{ns}}}:due"), "t"]);
    v.trim().parse().ok()
}

/// Ends the attempt under `lease` as succeeded.
async fn succeed(store: &RedisStore, lease: &Lease) {
    let ends = store
        .end_attempts(vec![AttemptEnd {
            lease: lease.clone(),
            records: vec![],
            outcome: Outcome::Succeeded {
                output: b"{}".to_vec(),
                fuel_used: None,
            },
        }])
        .await;
    assert!(ends[0].is_ok(), "{ends:?}");
}

/// The tenant's published due time (`G due`) after each transition of one run at a time,
/// beside a run delayed by 100 s: the claim's lease expiry while the run runs (a worker
/// that dies leaves it to be taken back then), the delayed run's time once it ended. It
/// may be earlier than the truth (a renewal or an end leaves a future one as it was, and
/// the visit at that time publishes the truth), never later: a transition that adds
/// anything due before it publishes at once.
#[tokio::test]
async fn the_published_due_time_is_never_later_than_the_tenants_next() {
    let server = RedisServer::start(RedisOptions::default());
    let (store, clock) = on_manual_clock(&server, "pub").await;
    deploy(&store, "t").await;
    let published = || published_due(&server, "pub");
    store.enqueue(request("t", Some(1_100_000))).await.unwrap();
    assert_eq!(published(), Some(1_100_000), "the delayed run");
    store.enqueue(request("t", None)).await.unwrap();
    assert_eq!(published(), Some(0), "a run due now");
    clock.advance(10);
    let claimed = store.claim(claim_req(10)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(published(), Some(1_000_010 + 30_000), "its lease's expiry");
    // Renewed: the lease expires later, and the due time published stays as it was:
    // early, which costs a visit, never a run left waiting.
    clock.advance(10);
    let renewal = store
        .renew(&[claimed[0].lease.clone()], 30_000)
        .await
        .unwrap();
    assert!(renewal.lost.is_empty());
    assert_eq!(
        published(),
        Some(1_000_010 + 30_000),
        "not republished later"
    );
    // The visit at that time finds nothing to do and publishes the renewed expiry.
    clock.set(1_000_010 + 30_000);
    assert!(store.claim(claim_req(10)).await.unwrap().is_empty());
    assert_eq!(published(), Some(1_000_020 + 30_000), "the renewed expiry");
    // Its worker died: past its lease, a claim takes the run back and leases it again.
    clock.set(1_000_020 + 30_000);
    let again = store.claim(claim_req(10)).await.unwrap();
    assert_eq!(again.len(), 1, "the run whose lease expired");
    assert_eq!(published(), Some(1_030_020 + 30_000));
    succeed(&store, &again[0].lease).await;
    assert_eq!(
        published(),
        Some(1_030_020 + 30_000),
        "an end makes the due time later: it stays"
    );
    clock.set(1_030_020 + 30_000);
    assert!(store.claim(claim_req(10)).await.unwrap().is_empty());
    assert_eq!(published(), Some(1_100_000), "the delayed run again");
    // A run ending with a retry due before the published time is published at once.
    clock.set(1_100_000);
    let delayed = store.claim(claim_req(10)).await.unwrap();
    assert_eq!(delayed.len(), 1);
    assert_eq!(published(), Some(1_100_000 + 30_000));
    let retry = store
        .end_attempts(vec![AttemptEnd {
            lease: delayed[0].lease.clone(),
            records: vec![],
            outcome: Outcome::Failed {
                error: RunError::new(ErrorReason::Retryable, "boom"),
                retry_in_ms: Some(500),
                fuel_used: None,
            },
        }])
        .await;
    assert_eq!(
        retry[0].as_ref().ok(),
        Some(&RunStatus::Queued),
        "{retry:?}"
    );
    assert_eq!(published(), Some(1_100_500), "the retry's due time");
    // Nothing left: the visit that finds nothing takes the tenant out of the schedule
    // (the pin that keeps `leases` a skiplist, at +inf, is no due time).
    clock.set(1_100_500);
    let last = store.claim(claim_req(10)).await.unwrap();
    assert_eq!(last.len(), 1);
    succeed(&store, &last[0].lease).await;
    clock.set(1_100_500 + 30_000);
    assert!(store.claim(claim_req(10)).await.unwrap().is_empty());
    let due = server.cli(&["ZSCORE", "pub:g:{pub}:due", "t"]);
    assert_eq!(due.trim(), "", "nothing is due");
}

/// A run waiting for a free slot (the tenant's max_running) becomes claimable when a run
/// ends, which adds nothing to any schedule: the end must publish the tenant due now.
#[tokio::test]
async fn an_end_that_frees_a_slot_publishes_the_waiting_run_due_now() {
    let server = RedisServer::start(RedisOptions::default());
    let (store, clock) = on_manual_clock(&server, "slot").await;
    store
        .create_tenant(Tenant {
            name: "t".into(),
            created_at: 1_000_000,
            quotas: Quotas {
                max_running: 1,
                ..Quotas::default()
            },
        })
        .await
        .unwrap();
    deploy(&store, "t").await;
    let published = || published_due(&server, "slot");
    store.enqueue(request("t", None)).await.unwrap();
    store.enqueue(request("t", None)).await.unwrap();
    let first = store.claim(claim_req(10)).await.unwrap();
    assert_eq!(first.len(), 1, "max_running 1");
    assert_eq!(
        published(),
        Some(1_000_000 + 30_000),
        "no room until the lease ends"
    );
    clock.advance(5);
    succeed(&store, &first[0].lease).await;
    assert_eq!(published(), Some(0), "the waiting run is due now");
    assert_eq!(store.claim(claim_req(10)).await.unwrap().len(), 1);
}

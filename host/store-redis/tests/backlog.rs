//! How a backlog is indexed, against a real redis-server: a queued run is in its
//! function's `qfn:` index alone (besides its lane) and counted in `nq`; it enters
//! `byfn:` and `st:<status>` when it leaves the status and leaves them when it is queued
//! again; and runs queued before `qfn:` existed (in `st:queued` and `byfn:`) are still
//! listed, counted, held to `max_queued` and claimed. Also how a claim under a backlog
//! visits the tenant the previous claim left first in line ahead of its read of the
//! schedule, and what that may cost the other tenants (one claim's wait, no more); and how
//! the claim after a wake-up visits the tenant its token names the same way.

use wasq_core::*;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{self, RedisOptions, RedisServer};

async fn store(url: &str) -> RedisStore {
    testing::connect(url, "backlog").await
}

async fn deploy(store: &RedisStore, tenant: &str, name: &str) {
    let mut settings = FunctionSettings::default();
    settings.retry.max_attempts = 3;
    store
        .deploy(DeployRequest {
            tenant: tenant.into(),
            name: name.into(),
            digest: format!("digest-{name}"),
            component: name.as_bytes().to_vec(),
            settings,
            events: vec![],
            schedule: None,
        })
        .await
        .expect("deploy");
}

async fn enqueue(store: &RedisStore, tenant: &str, function: &str) -> Result<Run, StoreError> {
    let req = EnqueueRequest {
        tenant: tenant.into(),
        function: function.into(),
        input: b"{}".to_vec(),
        trigger: "api".into(),
        ..EnqueueRequest::default()
    };
    store.enqueue(req).await.map(|e| e.run)
}

async fn list(
    store: &RedisStore,
    function: Option<&str>,
    status: Option<RunStatus>,
) -> Vec<String> {
    let runs = store
        .runs(RunQuery {
            tenant: "t".into(),
            function: function.map(str::to_owned),
            status,
            limit: 100,
            ..RunQuery::default()
        })
        .await
        .expect("list");
    let ids: Vec<String> = runs.into_iter().map(|r| r.id).collect();
    let mut newest_first = ids.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(ids, newest_first, "listed newest first");
    ids
}

/// The ids of `runs`, newest first.
fn newest_first<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Vec<String> {
    let mut ids: Vec<String> = runs.into_iter().map(|r| r.id.clone()).collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

struct Keys<'a> {
    server: &'a RedisServer,
    p: String,
}

impl Keys<'_> {
    fn members(&self, key: &str) -> Vec<String> {
        let out = self
            .server
            .cli(&["ZRANGE", &format!("{}{key}", self.p), "0", "-1"]);
        let mut ids: Vec<String> = out
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect();
        ids.sort();
        ids
    }
    fn has(&self, key: &str, id: &str) -> bool {
        let out = self
            .server
            .cli(&["ZSCORE", &format!("{}{key}", self.p), id]);
        !out.trim().is_empty()
    }
    /// The count of queued runs the scripts keep (`nq` holds it plus one); `None`: none.
    fn nq(&self) -> Option<i64> {
        let v = self.server.cli(&["GET", &format!("{}nq", self.p)]);
        v.trim().parse::<i64>().ok().map(|n| n - 1)
    }
}

fn sorted(runs: &[&Run]) -> Vec<String> {
    let mut ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_is_indexed_once_and_older_queued_runs_still_count() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    store
        .create_tenant(Tenant {
            name: "t".into(),
            created_at: 0,
            quotas: Quotas {
                max_queued: 7,
                ..Quotas::default()
            },
        })
        .await
        .unwrap();
    deploy(&store, "t", "f").await;
    deploy(&store, "t", "g").await;
    let keys = Keys {
        server: &server,
        p: store.tenant_prefix("t"),
    };

    // Two runs of `f` as an older wasq queued them: in `st:queued` and `byfn:f`, and no
    // count of queued runs.
    let mut old = Vec::new();
    for _ in 0..2 {
        let run = enqueue(&store, "t", "f").await.unwrap();
        let p = &keys.p;
        let created = run.created_at.to_string();
        assert_eq!(
            server.cli(&["ZREM", &format!("{p}qfn:f"), &run.id]).trim(),
            "1"
        );
        server.cli(&["ZADD", &format!("{p}st:queued"), &created, &run.id]);
        server.cli(&["ZADD", &format!("{p}byfn:f"), &created, &run.id]);
        old.push(run);
    }
    server.cli(&["DEL", &format!("{}nq", keys.p)]);
    let depths = store.queue_depths("t").await.unwrap();
    assert_eq!(
        (depths.len(), depths[0].queued),
        (1, 2),
        "counted from the index"
    );
    let mut f = Vec::new();
    for _ in 0..3 {
        f.push(enqueue(&store, "t", "f").await.unwrap());
    }
    let g = vec![
        enqueue(&store, "t", "g").await.unwrap(),
        enqueue(&store, "t", "g").await.unwrap(),
    ];

    // New queued runs: in `qfn:<function>` alone, counted.
    assert_eq!(keys.members("qfn:f"), sorted(&f.iter().collect::<Vec<_>>()));
    assert_eq!(keys.members("qfn:g"), sorted(&g.iter().collect::<Vec<_>>()));
    assert_eq!(
        keys.members("byfn:f"),
        sorted(&old.iter().collect::<Vec<_>>())
    );
    assert_eq!(keys.members("byfn:g"), Vec::<String>::new());
    assert_eq!(
        keys.members("st:queued"),
        sorted(&old.iter().collect::<Vec<_>>())
    );
    assert_eq!(
        keys.nq(),
        Some(7),
        "counted once, the older runs with the new"
    );

    // Every reader sees all seven.
    let all: Vec<&Run> = old.iter().chain(&f).chain(&g).collect();
    let of_f: Vec<&Run> = old.iter().chain(&f).collect();
    assert_eq!(list(&store, None, None).await, newest_first(all.clone()));
    assert_eq!(
        list(&store, None, Some(RunStatus::Queued)).await,
        newest_first(all.clone())
    );
    assert_eq!(
        list(&store, Some("f"), None).await,
        newest_first(of_f.clone())
    );
    assert_eq!(
        list(&store, Some("f"), Some(RunStatus::Queued)).await,
        newest_first(of_f.clone())
    );
    assert_eq!(
        list(&store, Some("g"), Some(RunStatus::Queued)).await,
        newest_first(&g)
    );
    assert!(
        list(&store, Some("g"), Some(RunStatus::Running))
            .await
            .is_empty()
    );
    let first = store
        .runs(RunQuery {
            tenant: "t".into(),
            status: Some(RunStatus::Queued),
            limit: 1,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(first[0].id, g[1].id, "a page of one is the newest");
    for run in [&old[0], &f[0], &g[0]] {
        assert_eq!(
            store.run_ids("t", &run.id, 5).await.unwrap(),
            vec![run.id.clone()]
        );
    }
    let load = store.load("t").await.unwrap();
    assert_eq!(
        load.counts,
        vec![
            ("f".to_owned(), RunStatus::Queued, 5),
            ("g".to_owned(), RunStatus::Queued, 2)
        ]
    );
    assert_eq!(load.oldest_queued_at, Some(old[0].created_at));
    let depths = store.queue_depths("t").await.unwrap();
    assert_eq!(
        (depths.len(), depths[0].queued, depths[0].running),
        (1, 7, 0)
    );
    // Uncounted again (as if the count had never been kept): the quota counts the indexes.
    server.cli(&["DEL", &format!("{}nq", keys.p)]);
    match enqueue(&store, "t", "g").await {
        Err(StoreError::QuotaExceeded { message, .. }) => {
            assert!(message.contains("has 7 runs queued"), "{message}")
        }
        other => panic!("an eighth run past max_queued 7: {other:?}"),
    }

    // An index an older wasq kept of running runs, with a run of another status in it:
    // read by nothing now, dropped by the tenant's first purge.
    server.cli(&["ZADD", &format!("{}st:running", keys.p), "1", &old[0].id]);

    // Claimed, each leaves its queued index (`qfn:`, or `st:queued` for the older ones,
    // already in `byfn:`) for `byfn:` and its lease (a running run's only status index),
    // and the count drops to none.
    let claimed = testing::claim(&store, 10).await;
    assert_eq!(claimed.len(), 7);
    assert_eq!(keys.nq(), Some(0));
    assert_eq!(keys.members("st:queued"), Vec::<String>::new());
    assert_eq!(keys.members("qfn:f"), Vec::<String>::new());
    assert_eq!(keys.members("byfn:f"), sorted(&of_f));
    assert_eq!(
        keys.members("byfn:g"),
        sorted(&g.iter().collect::<Vec<_>>())
    );
    // Besides its pin, which keeps the zset a skiplist (inserts into a packed zset scan it
    // whole).
    let mut leased = keys.members("leases");
    let pin = leased.pop().expect("the pin");
    assert_eq!(leased, sorted(&all));
    assert!(pin.len() > 64, "{pin:?}");
    assert_eq!(
        server
            .cli(&["OBJECT", "ENCODING", &format!("{}leases", keys.p)])
            .trim(),
        "skiplist"
    );
    assert_eq!(keys.members("st:running"), vec![old[0].id.clone()]);
    assert_eq!(
        list(&store, None, Some(RunStatus::Running)).await,
        newest_first(all.clone())
    );
    assert_eq!(list(&store, None, None).await, newest_first(all.clone()));
    assert_eq!(
        list(&store, Some("f"), Some(RunStatus::Running)).await,
        newest_first(of_f.clone())
    );
    // Listed by creation time (their ids'), not by lease expiry: a renewal that puts the
    // oldest run's lease last changes no order; `since` bounds by creation time.
    server.cli(&[
        "ZADD",
        &format!("{}leases", keys.p),
        "9999999999999",
        &old[0].id,
    ]);
    assert_eq!(
        list(&store, None, Some(RunStatus::Running)).await,
        newest_first(all.clone())
    );
    let since = store
        .runs(RunQuery {
            tenant: "t".into(),
            status: Some(RunStatus::Running),
            since: Some(g[0].created_at),
            limit: 100,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    let later: Vec<&Run> = all
        .iter()
        .copied()
        .filter(|r| r.created_at >= g[0].created_at)
        .collect();
    assert_eq!(
        since.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        newest_first(later)
    );
    // A prefix finds a running run; the whole id, only it.
    for run in &all {
        assert_eq!(
            store.run_ids("t", &run.id, 5).await.unwrap(),
            vec![run.id.clone()]
        );
    }
    let depths = store.queue_depths("t").await.unwrap();
    assert_eq!((depths[0].queued, depths[0].running), (0, 7));
    assert!(list(&store, None, Some(RunStatus::Queued)).await.is_empty());
    let load = store.load("t").await.unwrap();
    assert_eq!(load.oldest_queued_at, None);
    assert_eq!(
        load.counts,
        vec![
            ("f".to_owned(), RunStatus::Running, 5),
            ("g".to_owned(), RunStatus::Running, 2)
        ]
    );

    // A failure that retries queues the run again: back in `qfn:` alone.
    let back = claimed.iter().find(|c| c.run.id == g[0].id).unwrap();
    let failed = Outcome::Failed {
        error: RunError::new(ErrorReason::Retryable, "again"),
        retry_in_ms: Some(60_000),
        fuel_used: None,
    };
    store.end_attempt(&back.lease, failed).await.expect("fail");
    let id = &g[0].id;
    assert!(keys.has("qfn:g", id) && !keys.has("byfn:g", id) && !keys.has("leases", id));
    // A lease entry left behind (as the claim that meets it would drop) lists nothing
    // twice and nothing that is not running.
    server.cli(&["ZADD", &format!("{}leases", keys.p), "1", id]);
    assert_eq!(
        list(&store, None, Some(RunStatus::Running)).await.len(),
        6,
        "the requeued run is not listed as running"
    );
    assert_eq!(list(&store, None, None).await, newest_first(all.clone()));
    assert_eq!(store.run_ids("t", id, 5).await.unwrap(), vec![id.clone()]);
    server.cli(&["ZREM", &format!("{}leases", keys.p), id]);
    assert_eq!(keys.nq(), Some(1));
    assert_eq!(list(&store, Some("g"), None).await, newest_first(&g));
    assert_eq!(
        list(&store, None, Some(RunStatus::Queued)).await,
        vec![id.clone()]
    );

    // Cancelled while queued: out of `qfn:`, into `byfn:` and `st:cancelled`.
    store
        .cancel(RunAction {
            tenant: "t".into(),
            id: id.clone(),
            kind: RunActionKind::Cancel,
            by: "admin".into(),
        })
        .await
        .expect("cancel");
    assert!(!keys.has("qfn:g", id) && keys.has("byfn:g", id) && keys.has("st:cancelled", id));
    assert_eq!(keys.nq(), Some(0));
    assert_eq!(
        list(&store, Some("g"), Some(RunStatus::Cancelled)).await,
        vec![id.clone()]
    );

    // The first purge drops the older wasq's index of running runs.
    store
        .purge(PurgeRequest {
            succeeded_before: 0,
            failed_before: 0,
            limit: 10,
        })
        .await
        .expect("purge");
    assert_eq!(
        server
            .cli(&["EXISTS", &format!("{}st:running", keys.p)])
            .trim(),
        "0"
    );
    assert_eq!(list(&store, None, Some(RunStatus::Running)).await.len(), 6);
}

/// `n` runs of the function `f` of `tenant`, their ids.
async fn enqueue_n(store: &RedisStore, tenant: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(enqueue(store, tenant, "f").await.expect("enqueue").id);
    }
    ids
}

async fn cancel_all(store: &RedisStore, tenant: &str, ids: &[String]) {
    for id in ids {
        store
            .cancel(RunAction {
                tenant: tenant.into(),
                id: id.clone(),
                kind: RunActionKind::Cancel,
                by: "admin".into(),
            })
            .await
            .expect("cancel");
    }
}

/// A store on `redis` in namespace `ns` whose clock stands still until advanced.
async fn manual_store(redis: &RedisServer, ns: &str) -> (RedisStore, ManualClock) {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = RedisStore::connect_with(
        &redis.url(),
        std::sync::Arc::new(clock.clone()),
        wasq_store_redis::StoreOptions::default().with_namespace(ns),
    )
    .await
    .expect("connect");
    (store, clock)
}

/// The tenants of a claim of `limit` runs, sorted, and how many script calls it made.
async fn claim_tenants(
    store: &RedisStore,
    redis: &RedisServer,
    limit: usize,
) -> (Vec<String>, u64) {
    let fcalls = || redis.calls("fcall");
    let before = fcalls();
    let claimed = testing::claim(store, limit).await;
    let mut tenants: Vec<String> = claimed.into_iter().map(|c| c.lease.tenant).collect();
    tenants.sort();
    (tenants, fcalls() - before)
}

/// A claim that filled its limit leaves a tenant first in line; the next claim, if it
/// comes within 20 ms by the store's clock, visits that tenant together with its read of
/// the schedule (one round trip). A tenant the read finds is then visited by that claim
/// if the limit leaves room, else first by the next one; a visit ahead that finds
/// nothing (the tenant drained or cancelled meanwhile) leaves the whole limit to the
/// others; past the window no tenant is visited ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_under_a_backlog_visits_the_tenant_left_first_in_line_ahead() {
    let redis = RedisServer::start(RedisOptions::default());
    let (store, clock) = manual_store(&redis, "ahead").await;
    for t in ["a", "b", "c"] {
        deploy(&store, t, "f").await;
    }
    let claim = |limit| claim_tenants(&store, &redis, limit);
    let tenants = |s: &[&str]| s.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    enqueue_n(&store, "a", 20).await;
    assert_eq!(claim(2).await, (tenants(&["a", "a"]), 1), "a alone is due");

    // b becomes due. The next claim visits a ahead with the whole limit (a was the only
    // tenant left in line) and finds b in its read: b is first in line after it.
    let b = enqueue_n(&store, "b", 5).await;
    assert_eq!(claim(2).await, (tenants(&["a", "a"]), 1));
    assert_eq!(
        claim(2).await,
        (tenants(&["a", "b"]), 2),
        "b visited ahead with its share, then a"
    );

    // b's runs are cancelled before the next claim: the visit ahead finds nothing, and
    // the claim takes its whole limit from a, in the same call.
    cancel_all(&store, "b", &b[1..]).await;
    assert_eq!(claim(2).await, (tenants(&["a", "a"]), 2));

    // c becomes due with one run, and is visited ahead with half of a limit of 4 (two
    // tenants were left in line). It does not fill it, and the claim's read found it
    // due: it is not visited a second time (a script call that would find nothing).
    enqueue_n(&store, "c", 1).await;
    assert_eq!(
        claim(2).await,
        (tenants(&["a", "a"]), 1),
        "a ahead, c after it"
    );
    assert_eq!(claim(4).await, (tenants(&["a", "a", "a", "c"]), 2));

    // Past the window, a claim visits no tenant ahead: b, left first in line and then
    // cancelled, costs it no script call.
    let b = enqueue_n(&store, "b", 2).await;
    assert_eq!(
        claim(2).await,
        (tenants(&["a", "a"]), 1),
        "a ahead, b after it"
    );
    cancel_all(&store, "b", &b).await;
    clock.advance(21);
    assert_eq!(claim(2).await, (tenants(&["a", "a"]), 1));
}

/// Waits until the store's wake-up listener blocks on its lists.
async fn listening(redis: &RedisServer) {
    for _ in 0..500 {
        if redis.cli(&["CLIENT", "LIST"]).contains("cmd=blpop") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the wake-up listener never blocked");
}

/// A wake-up token names the tenant whose runs became due, and the claim after the wait
/// it ends visits that tenant together with its read of the schedule (one round trip).
/// Shown by taking the tenant out of the schedule between the wake-up and the claim: a
/// claim that went by its read alone would find nothing. A token that names no tenant
/// (older versions pushed '1') still ends the wait and leads to no visit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_names_its_tenant_and_the_claim_after_it_visits_it_ahead() {
    let redis = RedisServer::start(RedisOptions::default());
    let (store, _clock) = manual_store(&redis, "woken").await;
    deploy(&store, "a", "f").await;
    let (due, wake) = ("woken:g:{woken}:due", "woken:g:{woken}:wake");
    let wait = |store: RedisStore| {
        tokio::spawn(async move {
            store
                .wait_for_work(std::time::Duration::from_secs(30), &[])
                .await
        })
    };

    let waiting = wait(store.clone());
    listening(&redis).await;
    enqueue(&store, "a", "f").await.expect("enqueue");
    tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the token ends the wait")
        .unwrap()
        .expect("wait");
    assert_eq!(redis.cli(&["ZREM", due, "a"]).trim(), "1");
    assert_eq!(
        claim_tenants(&store, &redis, 2).await,
        (vec!["a".to_string()], 1),
        "a, named by the token, visited although the schedule no longer lists it"
    );

    enqueue(&store, "a", "f").await.expect("enqueue");
    redis.cli(&["ZREM", due, "a"]);
    redis.cli(&["DEL", wake]);
    let waiting = wait(store.clone());
    listening(&redis).await;
    redis.cli(&["LPUSH", wake, "1"]);
    tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("a token without a tenant ends the wait too")
        .unwrap()
        .expect("wait");
    assert_eq!(
        claim_tenants(&store, &redis, 2).await,
        (vec![], 0),
        "no tenant named: the claim goes by the schedule alone"
    );
}

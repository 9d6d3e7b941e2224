//! A call that moves many runs writes each index once, with all of them (the scripts'
//! deferred zset writes, `zdefer` in prelude.lua), against a real redis-server: a batch of
//! 20 enqueues, a claim of those 20 and a call that ends them all each cost a few `ZADD`
//! and `ZREM` commands, not a few per run, and leave every run in the indexes its status
//! puts it in (and out of the others).

use wasq_core::*;
use wasq_store_redis::testing::{self, RedisOptions, RedisServer};

const N: usize = 20;

struct Counts {
    zadd: u64,
    zrem: u64,
    smembers: u64,
}

fn counts(redis: &RedisServer) -> Counts {
    Counts {
        zadd: redis.calls("zadd"),
        zrem: redis.calls("zrem"),
        smembers: redis.calls("smembers"),
    }
}

/// (ZADD, ZREM, SMEMBERS) calls since `before`.
fn since(redis: &RedisServer, before: &Counts) -> (u64, u64, u64) {
    let now = counts(redis);
    (
        now.zadd - before.zadd,
        now.zrem - before.zrem,
        now.smembers - before.smembers,
    )
}

/// The members of the tenant's zset `key`, sorted.
fn members(redis: &RedisServer, p: &str, key: &str) -> Vec<String> {
    let mut ids: Vec<String> = redis
        .cli(&["ZRANGE", &format!("{p}{key}"), "0", "-1"])
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('~'))
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids
}

/// Enqueues `n` runs of `t`'s function `f` in one batch; their ids, sorted.
async fn enqueue_sorted(store: &wasq_store_redis::RedisStore, n: usize) -> Vec<String> {
    let reqs = (0..n)
        .map(|n| EnqueueRequest {
            tenant: "t".into(),
            function: "f".into(),
            input: format!(r#"{{"n":{n}}}"#).into_bytes(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        })
        .collect();
    let runs = store.enqueue_batch(reqs).await.expect("enqueue_batch");
    let mut ids: Vec<String> = runs.into_iter().map(|e| e.run.id).collect();
    ids.sort();
    ids
}

/// Ends every claimed run as succeeded, in one call.
async fn succeed_all(store: &wasq_store_redis::RedisStore, claimed: &[Claimed]) {
    let ends = claimed
        .iter()
        .map(|c| AttemptEnd {
            lease: c.lease.clone(),
            records: vec![],
            outcome: Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        })
        .collect();
    for answer in store.end_attempts(ends).await {
        assert_eq!(answer.expect("end"), RunStatus::Succeeded);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_moves_many_runs_writes_each_index_once() {
    let redis = RedisServer::start(RedisOptions::default());
    let store = testing::connect(&redis.url(), "indexes").await;
    testing::deploy(&store, "t", "f").await;
    let p = store.tenant_prefix("t");

    let before = counts(&redis);
    let ids = enqueue_sorted(&store, N).await;
    // ZADD: `qfn:f`, the lane, and the global schedule (the tenant's first work); the one
    // SMEMBERS counts the tenant's queued runs, once (it has no count yet). One run at a
    // time this was 41 ZADD.
    assert_eq!(since(&redis, &before), (3, 0, 1), "enqueue of {N}");
    assert_eq!(members(&redis, &p, "qfn:f"), ids);
    assert_eq!(members(&redis, &p, "q"), ids);

    // The last three as an older wasq queued them: in `st:queued` and `byfn:f`, not
    // `qfn:f`. Claimed after the first two, they leave `st:queued` with the others' ZREM
    // (which does not find them in `qfn:f`).
    for id in &ids[N - 3..] {
        let score = redis.cli(&["ZSCORE", &format!("{p}qfn:f"), id]);
        redis.cli(&["ZREM", &format!("{p}qfn:f"), id]);
        redis.cli(&["ZADD", &format!("{p}st:queued"), score.trim(), id]);
        redis.cli(&["ZADD", &format!("{p}byfn:f"), score.trim(), id]);
    }
    let before = counts(&redis);
    let claimed = store
        .claim(ClaimRequest {
            worker: "w".into(),
            limit: N,
            lease_ms: 60_000,
            queues: vec![],
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), N);
    // The first two runs' writes go at once (a claim that finds one or two runs pays
    // nothing for batching): `leases` (its pin in the first one's ZADD), `byfn:f`; `qfn:f`
    // and the lane. Then
    // the other 18's together: one ZADD to `byfn:f` and `leases`, one ZREM from `qfn:f`
    // and the lane. And the global schedule (the tenant is due next when the leases
    // expire); one ZREM from `st:queued` for the older three. Was 42 and 40.
    assert_eq!(
        since(&redis, &before),
        (4 + 2 + 1, 4 + 2 + 1, 0),
        "claim of {N}"
    );
    assert_eq!(members(&redis, &p, "qfn:f"), Vec::<String>::new());
    assert_eq!(members(&redis, &p, "st:queued"), Vec::<String>::new());
    assert_eq!(members(&redis, &p, "q"), Vec::<String>::new());
    assert_eq!(members(&redis, &p, "byfn:f"), ids);
    let mut leased = members(&redis, &p, "leases");
    leased.retain(|m| ids.contains(m));
    assert_eq!(leased, ids, "every claimed run holds a lease");

    let before = counts(&redis);
    succeed_all(&store, &claimed).await;
    // ZADD: `st:succeeded` (ended runs are not indexed by finish time too: the purge
    // walks the status indexes); ZREM: `leases`; and no SMEMBERS per run for its waiters.
    // Was 40, 20 and 20.
    assert_eq!(since(&redis, &before), (1, 1, 0), "ends of {N}");
    assert_eq!(members(&redis, &p, "st:succeeded"), ids);
    assert_eq!(members(&redis, &p, "ended:ok"), Vec::<String>::new());
    let mut leased = members(&redis, &p, "leases");
    leased.retain(|m| ids.contains(m));
    assert_eq!(leased, Vec::<String>::new(), "no lease left");
    for id in &ids {
        let run = store.run("t", id).await.unwrap().expect("run").run;
        assert_eq!(run.status, RunStatus::Succeeded);
    }
}

/// Ended runs an older wasq also indexed by finish time (`ended:ok`, `ended:bad`): the
/// tenant's first purge since drops those indexes, and finds the runs through their
/// status index all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_drops_the_older_ended_indexes_and_purges_their_runs() {
    let redis = RedisServer::start(RedisOptions::default());
    let store = testing::connect(&redis.url(), "indexes").await;
    testing::deploy(&store, "t", "f").await;
    let p = store.tenant_prefix("t");
    let ids = enqueue_sorted(&store, 3).await;
    let claimed = store
        .claim(ClaimRequest {
            worker: "w".into(),
            limit: 3,
            lease_ms: 60_000,
            queues: vec![],
        })
        .await
        .expect("claim");
    succeed_all(&store, &claimed).await;
    // As an older wasq left them: in `ended:ok` too, by finish time.
    for id in &ids {
        let run = store.run("t", id).await.unwrap().expect("run").run;
        let fin = run.finished_at.expect("finished").to_string();
        redis.cli(&["ZADD", &format!("{p}ended:ok"), &fin, id]);
    }
    redis.cli(&["ZADD", &format!("{p}ended:bad"), "1", "gone"]);

    let purged = store
        .purge(PurgeRequest {
            succeeded_before: i64::MAX,
            failed_before: i64::MAX,
            limit: 100,
        })
        .await
        .expect("purge");
    assert_eq!(purged, 3);
    for key in ["ended:ok", "ended:bad", "st:succeeded"] {
        assert_eq!(
            redis.cli(&["EXISTS", &format!("{p}{key}")]).trim(),
            "0",
            "{key} is gone"
        );
    }
    assert_eq!(
        redis.cli(&["HGET", &format!("{p}meta"), "noended"]).trim(),
        "1"
    );
    for id in &ids {
        assert!(store.run("t", id).await.unwrap().is_none());
    }
}

//! How a run is laid out in Redis, against a real redis-server: a run pins its function's
//! settings by version instead of copying them, its hash stays packed (a listpack) while
//! its values are short, a long input is kept beside it, and runs and functions an older
//! wasq wrote (settings copied into every run, no versions; no index of schedules) are
//! still read and run.

use wasq_core::*;
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{self, RedisOptions, RedisServer};

fn settings() -> FunctionSettings {
    let mut s = FunctionSettings::default();
    s.limits.timeout_ms = 1_234;
    s.retry.max_attempts = 7;
    s
}

async fn store(url: &str) -> RedisStore {
    testing::connect(url, "layout").await
}

/// Deploys function "f" of tenant "t" with `settings`.
async fn deploy_with(store: &RedisStore, settings: FunctionSettings) {
    deploy_to(store, "t", settings).await;
}

/// Deploys function "f" of `tenant` with `settings`.
async fn deploy_to(store: &RedisStore, tenant: &str, settings: FunctionSettings) {
    store
        .deploy(DeployRequest {
            tenant: tenant.into(),
            name: "f".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings,
            events: vec![],
            schedule: None,
        })
        .await
        .expect("deploy");
}

async fn deploy(store: &RedisStore) {
    deploy_with(store, settings()).await;
}

/// A run of function "f" of `tenant`.
fn request(tenant: &str, input: &[u8]) -> EnqueueRequest {
    EnqueueRequest {
        tenant: tenant.into(),
        function: "f".into(),
        input: input.to_vec(),
        trigger: "api".into(),
        ..EnqueueRequest::default()
    }
}

async fn enqueue(store: &RedisStore, input: &[u8]) -> Run {
    store
        .enqueue(request("t", input))
        .await
        .expect("enqueue")
        .run
}

/// Claims what is due, in id order.
async fn claim(store: &RedisStore) -> Vec<Claimed> {
    let mut claimed = testing::claim(store, 10).await;
    claimed.sort_by(|a, b| a.run.id.cmp(&b.run.id));
    claimed
}

fn ids(claimed: &[Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.run.id.clone()).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

async fn succeed(store: &RedisStore, claimed: &[Claimed]) {
    for c in claimed {
        let done = Outcome::Succeeded {
            output: b"1".to_vec(),
            fuel_used: None,
        };
        store.end_attempt(&c.lease, done).await.expect("finish");
    }
}

async fn purge_all(store: &RedisStore) -> usize {
    store
        .purge(PurgeRequest {
            succeeded_before: i64::MAX,
            failed_before: i64::MAX,
            limit: 10,
        })
        .await
        .expect("purge")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_pins_its_settings_by_version_and_its_hash_stays_packed() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    deploy(&store).await;
    let p = store.tenant_prefix("t");
    let short = enqueue(&store, br#"{"i":1}"#).await;
    let long_input = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1_000)).into_bytes();
    let long = enqueue(&store, &long_input).await;
    // 5 pieces of at most 64 bytes, each byte different from its neighbours' place.
    let medium_input: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
    let medium = enqueue(&store, &medium_input).await;

    let sv = server.cli(&["HGET", &format!("{p}fn:f"), "sv"]);
    let sv = sv.trim();
    assert_eq!(sv.len(), 16, "a settings version: {sv:?}");
    for run in [&short, &long, &medium] {
        let key = format!("{p}run:{}", run.id);
        assert_eq!(server.cli(&["HGET", &key, "sv"]).trim(), sv);
        assert_eq!(server.cli(&["HEXISTS", &key, "settings"]).trim(), "0");
        // Known without a field of its own: the component (the version names it), the
        // default trigger, and updated_at until the first transition.
        for known in ["digest", "trigger", "updated_at"] {
            assert_eq!(server.cli(&["HEXISTS", &key, known]).trim(), "0", "{known}");
        }
        assert_eq!(run.digest, "d");
        assert_eq!(run.trigger, "api");
        assert_eq!(run.updated_at, run.created_at);
        assert_eq!(
            server.cli(&["OBJECT", "ENCODING", &key]).trim(),
            "listpack",
            "the hash of run {} is packed",
            run.id
        );
        assert_eq!(run.settings, settings());
    }
    // The long input lives beside the hash, and comes back whole.
    let in_key = format!("{p}in:{}", long.id);
    assert_eq!(server.cli(&["EXISTS", &in_key]).trim(), "1");
    assert_eq!(
        server
            .cli(&["EXISTS", &format!("{p}in:{}", short.id)])
            .trim(),
        "0"
    );
    let detail = store.run("t", &long.id).await.unwrap().expect("the run");
    assert_eq!(detail.run.input, long_input);
    // A medium one is kept in the hash, in pieces that keep it packed.
    let medium_key = format!("{p}run:{}", medium.id);
    assert_eq!(
        server
            .cli(&["EXISTS", &format!("{p}in:{}", medium.id)])
            .trim(),
        "0"
    );
    assert_eq!(server.cli(&["HEXISTS", &medium_key, "input"]).trim(), "0");
    assert_eq!(server.cli(&["HSTRLEN", &medium_key, "in1"]).trim(), "64");
    assert_eq!(server.cli(&["HSTRLEN", &medium_key, "in5"]).trim(), "44");
    assert_eq!(server.cli(&["HEXISTS", &medium_key, "in6"]).trim(), "0");
    let detail = store.run("t", &medium.id).await.unwrap().expect("the run");
    assert_eq!(detail.run.input, medium_input);
    let listed = store
        .runs(RunQuery {
            tenant: "t".into(),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    let listed = listed.iter().find(|r| r.id == medium.id).expect("listed");
    assert_eq!(listed.input, medium_input);

    // A fresh store (nothing cached) reads the settings by version.
    let fresh = self::store(&server.url()).await;
    let claimed = claim(&fresh).await;
    assert_eq!(
        ids(&claimed),
        sorted(vec![short.id.clone(), long.id.clone(), medium.id.clone()])
    );
    for c in &claimed {
        assert_eq!(c.run.settings, settings());
        assert_eq!(
            (c.run.digest.as_str(), c.run.trigger.as_str()),
            ("d", "api")
        );
        let key = format!("{p}run:{}", c.run.id);
        assert_eq!(
            server.cli(&["HGET", &key, "updated_at"]).trim(),
            c.run.updated_at.to_string(),
            "written by the claim"
        );
        let input = if c.run.id == long.id {
            &long_input[..]
        } else if c.run.id == medium.id {
            &medium_input[..]
        } else {
            br#"{"i":1}"#
        };
        assert_eq!(c.run.input, input);
    }

    // Ended and purged, a run takes its input key with it.
    succeed(&fresh, &claimed).await;
    let purged = purge_all(&fresh).await;
    assert_eq!(purged, 3);
    assert_eq!(server.cli(&["EXISTS", &in_key]).trim(), "0");
    assert_eq!(
        server
            .cli(&["EXISTS", &format!("{p}run:{}", long.id)])
            .trim(),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_functions_from_before_settings_versions_still_run() {
    let server = RedisServer::start(RedisOptions::default());
    let old = store(&server.url()).await;
    deploy(&old).await;
    let p = old.tenant_prefix("t");
    let fk = format!("{p}fn:f");
    let sv = server.cli(&["HGET", &fk, "sv"]).trim().to_owned();
    let blob = server.cli(&["HGET", &fk, "settings"]).trim_end().to_owned();
    assert!(blob.starts_with('{'), "{blob}");
    // A version names the component too: the run carries no digest of its own.
    assert_eq!(
        server.cli(&["HGET", &format!("{p}sets"), &sv]).trim_end(),
        format!("d\n{blob}")
    );
    let unversioned = enqueue(&old, br#"{"i":1}"#).await;
    let versioned = enqueue(&old, br#"{"i":2}"#).await;
    assert_eq!(
        server
            .cli(&["HEXISTS", &format!("{p}run:{}", versioned.id), "digest"])
            .trim(),
        "0"
    );

    // Rewrite them as older wasqs left them: one run with the blob and the digest in its
    // hash (no versions at all), one with the digest and a version of the settings alone,
    // which the function pins too.
    let older = "0123456789abcdef";
    let rk = format!("{p}run:{}", unversioned.id);
    assert_eq!(server.cli(&["HDEL", &rk, "sv"]).trim(), "1");
    assert_eq!(
        server
            .cli(&["HSET", &rk, "settings", &blob, "digest", "d"])
            .trim(),
        "2"
    );
    let rk = format!("{p}run:{}", versioned.id);
    assert_eq!(
        server
            .cli(&["HSET", &rk, "sv", older, "digest", "d"])
            .trim(),
        "1"
    );
    assert_eq!(server.cli(&["HSET", &fk, "sv", older]).trim(), "0");
    assert_eq!(server.cli(&["HDEL", &fk, "svd"]).trim(), "1");
    let sets = format!("{p}sets");
    assert_eq!(server.cli(&["DEL", &sets]).trim(), "1");
    assert_eq!(server.cli(&["HSET", &sets, older, &blob]).trim(), "1");
    let rdig = format!("{p}rdig");
    assert_eq!(server.cli(&["DEL", &rdig]).trim(), "1");
    server.cli(&["HSET", &rdig, "d", "1", &format!("d|{older}"), "1"]);

    // A new process reads the old runs, and creates runs of the old function: the first
    // script that meets the function gives it a version that names its component.
    let new = store(&server.url()).await;
    for run in [&unversioned, &versioned] {
        let read = new.run("t", &run.id).await.unwrap().expect("the old run");
        assert_eq!(read.run.settings, settings());
        assert_eq!(read.run.digest, "d");
    }
    let after = enqueue(&new, br#"{"i":3}"#).await;
    assert_eq!(after.settings, settings());
    assert_eq!(after.digest, "d");
    assert_eq!(server.cli(&["HGET", &fk, "sv"]).trim(), sv);
    assert_eq!(server.cli(&["HGET", &fk, "svd"]).trim(), "1");
    assert_eq!(
        server.cli(&["HGET", &sets, &sv]).trim_end(),
        format!("d\n{blob}")
    );
    let claimed = claim(&self::store(&server.url()).await).await;
    assert_eq!(
        ids(&claimed),
        sorted(vec![
            unversioned.id.clone(),
            versioned.id.clone(),
            after.id.clone()
        ])
    );
    assert!(claimed.iter().all(|c| c.run.settings == settings()));
    assert!(claimed.iter().all(|c| c.run.digest == "d"));

    // Each pin is counted the way its run holds it, so the component stays.
    assert_eq!(server.cli(&["HGET", &rdig, "d"]).trim(), "1");
    assert_eq!(
        server.cli(&["HGET", &rdig, &format!("d|{older}")]).trim(),
        "1"
    );
    assert_eq!(server.cli(&["HGET", &rdig, &format!("|{sv}")]).trim(), "1");

    // Redeployed with another component, the function no longer holds "d": with only the
    // newest run's pin left, the component stays because its version names it.
    new.deploy(DeployRequest {
        tenant: "t".into(),
        name: "f".into(),
        digest: "e".into(),
        component: b"e".to_vec(),
        settings: settings(),
        events: vec![],
        schedule: None,
    })
    .await
    .expect("redeploy");
    server.cli(&["HDEL", &rdig, "d", &format!("d|{older}")]);
    new.collect_components(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "layout:component:d"]).trim(),
        "1",
        "the component a version names stays"
    );
    assert_eq!(
        server.cli(&["HLEN", &sets]).trim(),
        "2",
        "the newest run's version and the function's stay"
    );

    // Ended and purged, the runs give their pins back, and what only they held goes.
    succeed(&new, &claimed).await;
    assert_eq!(purge_all(&new).await, 3);
    assert_eq!(server.cli(&["HLEN", &rdig]).trim(), "0");
    new.collect_components(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(server.cli(&["EXISTS", "layout:component:d"]).trim(), "0");
    let current = server.cli(&["HGET", &fk, "sv"]);
    assert_eq!(server.cli(&["HKEYS", &sets]).trim(), current.trim());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_version_no_run_or_function_uses_is_collected() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    deploy(&store).await;
    let p = store.tenant_prefix("t");
    let sets = format!("{p}sets");
    let first = server
        .cli(&["HGET", &format!("{p}fn:f"), "sv"])
        .trim()
        .to_owned();
    let run = enqueue(&store, b"{}").await;
    // Redeployed with other settings: the queued run keeps the first version.
    let mut other = settings();
    other.limits.timeout_ms = 4_321;
    deploy_with(&store, other).await;
    let second = server
        .cli(&["HGET", &format!("{p}fn:f"), "sv"])
        .trim()
        .to_owned();
    assert_ne!(first, second);
    store
        .collect_components(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["HLEN", &sets]).trim(),
        "2",
        "the run pins the first"
    );
    let claimed = claim(&store).await;
    assert_eq!(ids(&claimed), [run.id]);
    assert_eq!(
        claimed[0].run.settings,
        settings(),
        "the run runs with what it pinned"
    );

    // Once the run is gone, so is the version only it used.
    succeed(&store, &claimed).await;
    assert_eq!(purge_all(&store).await, 1);
    store
        .collect_components(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(server.cli(&["HKEYS", &sets]).trim(), second);
}

/// A new queued run is not read back: the store builds what the enqueue returns from the
/// request and the script's few answers. It must be the run as stored, field for field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_an_enqueue_returns_is_the_run_stored() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    let mut flowing = settings();
    flowing.flow.concurrency = Some(wasq_core::flow::ConcurrencyLimit {
        limit: 2,
        key: Some(wasq_core::flow::KeyExpr::parse("input.customer").unwrap()),
    });
    flowing.flow.priority = 3;
    deploy_with(&store, flowing).await;
    let parent = enqueue(&store, b"{}").await;
    let long = format!(r#"{{"customer":"c1","pad":"{}"}}"#, "p".repeat(200));
    let requests = [
        EnqueueRequest {
            tenant: "t".into(),
            function: "f".into(),
            input: br#"{"customer":"c1"}"#.to_vec(),
            trigger: "api".into(),
            due_at: None,
            idempotency_key: Some("k-1".into()),
            retry: Some(RetryPolicy {
                max_attempts: 9,
                ..RetryPolicy::default()
            }),
            parent: Some(parent.id.clone()),
            priority: Some(-2),
            trace: TraceParent::new(0x4bf92f3577b34da6a3ce929d0e0e4736, 0xf067aa0ba902b7, true),
        },
        EnqueueRequest {
            tenant: "t".into(),
            function: "f".into(),
            input: long.into_bytes(),
            trigger: "cron".into(),
            due_at: Some(i64::MAX / 4),
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
            trace: None,
        },
    ];
    for req in requests {
        let made = store.enqueue(req).await.unwrap();
        assert!(made.created);
        let stored = store.run("t", &made.run.id).await.unwrap().unwrap().run;
        assert_eq!(made.run, stored);
    }
}

/// Runs are indexed by status, function and lane only: no index of every run. A tenant an
/// older wasq wrote still has its `all` index; its first purge drops it, and listings and
/// id prefixes find the runs through the status indexes meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_index_of_all_runs_and_an_old_one_goes_at_the_first_purge() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    deploy(&store).await;
    let p = store.tenant_prefix("t");
    let all = format!("{p}all");
    let done = enqueue(&store, b"1").await;
    let running = enqueue(&store, b"2").await;
    assert_eq!(
        server.cli(&["EXISTS", &all]).trim(),
        "0",
        "nothing writes it"
    );
    let claimed = claim(&store).await;
    succeed(&store, &claimed[..1]).await;
    assert_eq!(claimed[0].run.id, done.id);

    // What an older wasq left behind.
    for run in [&done, &running] {
        server.cli(&["ZADD", &all, &run.created_at.to_string(), &run.id]);
    }
    let listed: Vec<String> = store
        .runs(RunQuery {
            tenant: "t".into(),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, [running.id.clone(), done.id.clone()]);
    assert_eq!(
        store.run_ids("t", &done.id[..30], 5).await.unwrap(),
        vec![done.id.clone()]
    );
    assert_eq!(purge_all(&store).await, 1);
    assert_eq!(server.cli(&["EXISTS", &all]).trim(), "0", "dropped");
    assert!(store.run("t", &running.id).await.unwrap().is_some());
}

/// The cron scheduler reads `crons`, the scheduled functions alone; a tenant whose
/// functions were deployed before `crons` existed gets it built once from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_read_from_their_own_index_built_once_for_older_tenants() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    let schedule = Schedule {
        crons: vec!["*/5 * * * * *".into()],
        tz: "UTC".into(),
        missed: Missed::Skip,
        paused: false,
        resumed_at: None,
    };
    for (name, schedule) in [("plain", None), ("ticking", Some(schedule.clone()))] {
        store
            .deploy(DeployRequest {
                tenant: "t".into(),
                name: name.into(),
                digest: "d".into(),
                component: b"c".to_vec(),
                settings: settings(),
                events: vec![],
                schedule,
            })
            .await
            .expect("deploy");
    }
    let p = store.tenant_prefix("t");
    let crons = format!("{p}crons");
    assert_eq!(server.cli(&["SMEMBERS", &crons]).trim(), "ticking");
    let want = vec![Scheduled {
        function: "ticking".into(),
        schedule,
    }];
    assert_eq!(store.schedules("t").await.unwrap(), want);

    // As an older wasq left the tenant: schedules only in the functions' hashes.
    assert_eq!(server.cli(&["DEL", &crons]).trim(), "1");
    assert_eq!(
        server.cli(&["HDEL", &format!("{p}meta"), "crons"]).trim(),
        "1"
    );
    assert_eq!(store.schedules("t").await.unwrap(), want, "built from fn:");
    assert_eq!(server.cli(&["SMEMBERS", &crons]).trim(), "ticking");
    assert_eq!(
        server.cli(&["HGET", &format!("{p}meta"), "crons"]).trim(),
        "1"
    );
}

/// A tenant's quotas are kept in its `meta`, read with the rest of it; quotas an older
/// wasq kept in a hash of their own still hold, and move into the `meta` at the first
/// call that needs them; a tenant without quotas is unlimited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_live_in_the_tenants_meta_and_older_ones_move_there() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    let tenant = Tenant {
        name: "t".into(),
        created_at: 0,
        quotas: Quotas {
            max_queued: 2,
            ..Quotas::default()
        },
    };
    store.create_tenant(tenant).await.unwrap();
    deploy(&store).await;
    let p = store.tenant_prefix("t");
    let (meta, old) = (format!("{p}meta"), format!("{p}quotas"));
    assert_eq!(server.cli(&["HGET", &meta, "max_queued"]).trim(), "2");
    assert_eq!(server.cli(&["EXISTS", &old]).trim(), "0");

    // As an older wasq left it: the quotas in `quotas`, none in the meta.
    let fields = [
        "max_running",
        "max_queued",
        "max_stored_bytes",
        "max_run_bytes",
    ];
    let mut hset = vec!["HSET", &old];
    let values: Vec<String> = fields
        .iter()
        .map(|f| server.cli(&["HGET", &meta, f]).trim().to_owned())
        .collect();
    for (f, v) in fields.iter().zip(&values) {
        hset.extend([*f, v.as_str()]);
    }
    server.cli(&hset);
    let mut hdel = vec!["HDEL", &meta, "qm", "max_run_log_bytes"];
    hdel.extend(fields);
    assert_eq!(server.cli(&hdel).trim(), "6");

    enqueue(&store, b"1").await;
    assert_eq!(server.cli(&["EXISTS", &old]).trim(), "0", "moved");
    assert_eq!(server.cli(&["HGET", &meta, "qm"]).trim(), "1");
    assert_eq!(server.cli(&["HGET", &meta, "max_queued"]).trim(), "2");
    enqueue(&store, b"2").await;
    match store.enqueue(request("t", b"3")).await {
        Err(StoreError::QuotaExceeded { message, .. }) => {
            assert!(message.contains("has 2 runs queued"), "{message}")
        }
        other => panic!("a third run past max_queued 2: {other:?}"),
    }

    // A tenant nobody gave quotas (none in either place) is unlimited, and says so.
    let other = store.tenant_prefix("u");
    deploy_to(&store, "u", settings()).await;
    for i in 0..3 {
        store
            .enqueue(request("u", &[b'0' + i]))
            .await
            .expect("no quota");
    }
    let meta = format!("{other}meta");
    assert_eq!(server.cli(&["HGET", &meta, "qm"]).trim(), "1");
    assert_eq!(server.cli(&["HEXISTS", &meta, "max_queued"]).trim(), "0");
}

fn step(name: &str, occurrence: u32) -> Record {
    Record::Step {
        name: name.into(),
        occurrence,
        output: name.as_bytes().to_vec(),
        logs: vec![],
    }
}

/// Ends the attempt as suspended until now: the run is claimable again at once.
async fn suspend(store: &RedisStore, lease: &Lease) {
    let until_now = Outcome::Suspended {
        until: 0,
        fuel_used: None,
    };
    store.end_attempt(lease, until_now).await.unwrap();
}

/// Each step's name and occurrence, as the run's detail lists them and as a claim that
/// resumes the run replays them.
async fn step_names(store: &RedisStore, id: &str) -> (Vec<(String, u32)>, Vec<(String, u32)>) {
    let d = store.run("t", id).await.unwrap().expect("the run");
    assert_eq!(d.steps_total, d.steps.len() as u64);
    let listed = d
        .steps
        .iter()
        .map(|s| (s.name.clone(), s.occurrence))
        .collect();
    let claimed = claim(store).await;
    let replayed = claimed[0]
        .steps
        .iter()
        .map(|s| (s.name.clone(), s.occurrence))
        .collect();
    (listed, replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_first_step_is_ordered_in_its_step_hash_and_older_runs_in_their_list() {
    let server = RedisServer::start(RedisOptions::default());
    let store = store(&server.url()).await;
    deploy(&store).await;
    let p = store.tenant_prefix("t");
    let fresh = enqueue(&store, b"1").await;
    let c = claim(&store).await.remove(0);
    store.record(&c.lease, step("a", 0)).await.unwrap();
    // One step: one key of the run's own for it, its order entry in the step hash.
    assert_eq!(
        server
            .cli(&["EXISTS", &format!("{p}stepseq:{}", fresh.id)])
            .trim(),
        "0"
    );
    assert_eq!(
        server
            .cli(&["OBJECT", "ENCODING", &format!("{p}steps:{}", fresh.id)])
            .trim(),
        "listpack"
    );
    store.record(&c.lease, step("b", 0)).await.unwrap();
    store.record(&c.lease, step("a", 1)).await.unwrap();
    assert_eq!(
        server
            .cli(&["LLEN", &format!("{p}stepseq:{}", fresh.id)])
            .trim(),
        "2",
        "later steps are ordered in the list"
    );
    suspend(&store, &c.lease).await;
    let order = vec![("a".into(), 0), ("b".into(), 0), ("a".into(), 1)];
    assert_eq!(step_names(&store, &fresh.id).await, (order.clone(), order));

    // A run whose first step an older wasq stored: its order entries all in the list.
    let older = enqueue(&store, b"2").await;
    let c = claim(&store).await.remove(0);
    store.record(&c.lease, step("x", 0)).await.unwrap();
    let (steps, seq) = (
        format!("{p}steps:{}", older.id),
        format!("{p}stepseq:{}", older.id),
    );
    let first = server.cli(&["HGET", &steps, "#"]);
    server.cli(&["HDEL", &steps, "#"]);
    server.cli(&["RPUSH", &seq, first.trim()]);
    store.record(&c.lease, step("y", 0)).await.unwrap();
    suspend(&store, &c.lease).await;
    let order = vec![("x".into(), 0), ("y".into(), 0)];
    assert_eq!(step_names(&store, &older.id).await, (order.clone(), order));
    assert_eq!(
        store.steps("t", &older.id, 1, 5).await.unwrap()[0].name,
        "y"
    );
}

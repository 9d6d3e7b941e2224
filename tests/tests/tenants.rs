//! Tenants walled off from each other (issue 5, done-means 1 and 6): every API route,
//! called by tenant B with tenant A's names and ids, answers 404 (or shows nothing) and
//! leaves A's data as it was; missing, malformed and revoked keys get 401; the operator
//! key manages tenants but runs nothing; and neither store holds a key in plaintext.

use std::time::Duration;

use serde_json::Value;
use wasq_server::StoreBackend;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, guest};

const WAIT: Duration = Duration::from_secs(30);

/// What tenant A owns, as A sees it; must be the same before and after B's attempts.
async fn snapshot(a: &Api, ids: &[&str]) -> Value {
    let mut runs = vec![];
    for id in ids {
        let mut run = a.run(id).await;
        // Progress of a waiting run does not change; drop volatile nothing else.
        run.as_object_mut().unwrap().remove("logs");
        runs.push(run);
    }
    let (_, functions) = a.get("/v1/functions").await;
    let (_, schedules) = a.get("/v1/schedules").await;
    serde_json::json!({ "runs": runs, "functions": functions, "schedules": schedules })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_cannot_see_or_touch_anything_of_tenant_a() {
    let d = Daemon::start().await;
    let a = d.admin.new_tenant("acme").await;
    let b = d.admin.new_tenant("bravo").await;

    // A: a finished run, a failed run, a run waiting for an event, a subscriber, a schedule.
    a.deploy("echo", guest("echo"), "").await;
    a.deploy("fail", guest("fail"), "max_attempts=1").await;
    a.deploy("waiter", guest("waiter"), "").await;
    a.deploy("on-ping", guest("echo"), "events=ping").await;
    a.deploy(
        "nightly",
        guest("echo"),
        "cron=0%203%20*%20*%20*&tz=Europe/Paris",
    )
    .await;
    let done = a.start_run("echo", r#"{"secret": "a-only"}"#).await;
    let failed = a.start_run("fail", "{}").await;
    let waiting = a.start_run("waiter", r#"{"event": "ping"}"#).await;
    a.wait_run(&done, WAIT).await;
    a.wait_run(&failed, WAIT).await;
    a.wait_until(&waiting, WAIT, |r| r["status"] == "waiting")
        .await;
    let (_, a_keys) = a.get("/v1/tenants/acme/keys").await;
    let a_key_id = a_keys[0]["id"].as_str().unwrap().to_owned();
    let before = snapshot(&a, &[&done, &failed, &waiting]).await;

    // B, by name and by id: 404 on every route that names something of A's.
    let not_found = [
        ("GET", "/v1/functions/echo".to_string(), ""),
        ("POST", "/v1/functions/echo/runs".into(), "{}"),
        ("POST", "/v1/functions/echo/runs?wait=1s".into(), "{}"),
        ("GET", format!("/v1/runs/{done}"), ""),
        ("GET", format!("/v1/runs/{done}/logs"), ""),
        ("POST", format!("/v1/runs/{waiting}/cancel"), ""),
        (
            "POST",
            format!("/v1/runs/{waiting}/cancel?cascade=true"),
            "",
        ),
        ("POST", format!("/v1/runs/{failed}/retry"), ""),
        ("POST", "/v1/functions/nightly/schedule/pause".into(), ""),
        ("POST", "/v1/functions/nightly/schedule/run-now".into(), ""),
        ("GET", "/v1/tenants/acme".into(), ""),
        ("GET", "/v1/tenants/acme/keys".into(), ""),
        ("POST", "/v1/tenants/acme/keys".into(), "{}"),
        (
            "POST",
            format!("/v1/tenants/acme/keys/{a_key_id}/revoke"),
            "",
        ),
        ("GET", "/v1/audit?tenant=acme".into(), ""),
    ];
    for (method, path, body) in &not_found {
        let (status, answer) = match *method {
            "GET" => b.get(path).await,
            _ => b.post(path, body).await,
        };
        assert_eq!(status, 404, "B {method} {path}: {answer}");
    }

    // Listings and events: B sees and reaches nothing of A's.
    let (_, fns) = b.get("/v1/functions").await;
    assert_eq!(fns, serde_json::json!([]));
    let (_, runs) = b.get("/v1/runs?limit=1000").await;
    assert_eq!(runs, serde_json::json!([]));
    let (_, runs) = b.get(&format!("/v1/runs?parent={done}")).await;
    assert_eq!(runs, serde_json::json!([]));
    let (_, schedules) = b.get("/v1/schedules").await;
    assert_eq!(schedules, serde_json::json!([]));
    let (_, audit) = b.get("/v1/audit").await;
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["tenant"] == "bravo"),
        "{audit:#}"
    );
    let (status, sent) = b
        .post("/v1/events", r#"{"name": "ping", "data": {}}"#)
        .await;
    assert_eq!(status, 202);
    assert_eq!(sent["started"], serde_json::json!([]), "{sent}");
    assert_eq!(sent["resumed"], serde_json::json!([]), "{sent}");
    // B's own function of the same name is B's; A's stays as it was.
    b.deploy("echo", guest("two_steps"), "").await;

    // Tenant keys cannot manage tenants.
    let (status, _) = b.post("/v1/tenants", r#"{"name": "mallory"}"#).await;
    assert_eq!(status, 403);
    let (status, _) = b.get("/v1/tenants").await;
    assert_eq!(status, 403);

    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = snapshot(&a, &[&done, &failed, &waiting]).await;
    assert_eq!(before, after, "B changed A's data");
    let (_, a_runs) = a.get("/v1/runs?function=on-ping").await;
    assert_eq!(a_runs, serde_json::json!([]), "B's event started A's run");

    // A itself still works: its event resumes its waiter.
    a.post("/v1/events", r#"{"name": "ping", "data": {"n": 1}}"#)
        .await;
    let resumed = a.wait_run(&waiting, WAIT).await;
    assert_eq!(resumed["output"]["got"]["n"], 1, "{resumed:#}");

    // Usage is A's alone: the fuel of A's attempts, summed by the store, in the API and
    // in the metrics (operator only).
    let (_, usage) = a.get("/v1/tenants/acme").await;
    let fuel = usage["usage"]["fuel"].as_u64().unwrap();
    assert!(
        fuel > 0 && usage["usage"]["attempts"].as_u64().unwrap() >= 3,
        "{usage:#}"
    );
    let (status, _) = a.get("/metrics").await;
    assert_eq!(status, 403);
    let (status, metrics) = d.admin.get("/metrics").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(&format!(
            "wasq_tenant_fuel_consumed_total{{tenant=\"acme\"}} {fuel}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("wasq_attempts_total{tenant=\"acme\",outcome=\"succeeded\"}"),
        "{metrics}"
    );
    // Every attempt of A's records its guest's peak memory: the histogram counts them
    // all, and the echo guest's attempts fit the 4 MiB bucket.
    let value = |line: &str| -> f64 {
        let rest = metrics
            .split(line)
            .nth(1)
            .unwrap_or_else(|| panic!("{line}: {metrics}"));
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let attempts: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("wasq_attempts_total{tenant=\"acme\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(attempts >= 3.0, "{metrics}");
    let bucket = |le: &str| {
        value(&format!(
            "wasq_attempt_peak_memory_bytes_bucket{{tenant=\"acme\",le=\"{le}\"}} "
        ))
    };
    assert_eq!(bucket("+Inf"), attempts, "{metrics}");
    assert!(bucket("4194304") >= 1.0, "{metrics}");
    let sum = value("wasq_attempt_peak_memory_bytes_sum{tenant=\"acme\"} ");
    assert!(
        sum >= 65536.0 * attempts,
        "one 64 KiB page at least per attempt: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bad_and_revoked_keys_get_401() {
    let d = Daemon::start().await;
    let a = d.admin.new_tenant("acme").await;
    a.deploy("echo", guest("echo"), "").await;
    let anonymous = a.as_key(None);
    let routes = [
        "/v1/functions",
        "/v1/functions/echo",
        "/v1/runs",
        "/v1/schedules",
        "/v1/tenants",
        "/v1/tenants/acme",
        "/v1/audit",
    ];
    let garbage = a.as_key(Some(
        "wasq_000000000000_00000000000000000000000000000000".into(),
    ));
    let malformed = a.as_key(Some("hunter2".into()));
    for path in routes {
        for client in [&anonymous, &garbage, &malformed] {
            let (status, body) = client.get(path).await;
            assert_eq!(status, 401, "{path} with key {:?}: {body}", client.key);
        }
    }
    let (status, _) = anonymous.post("/v1/functions/echo/runs", "{}").await;
    assert_eq!(status, 401);
    let (status, _) = anonymous.put("/v1/functions/x", guest("echo")).await;
    assert_eq!(status, 401);
    // Its body was never read: the answer says the connection closes, so that the client
    // does not send its next request on it (that request would be cut).
    let refused = reqwest::Client::new()
        .put(format!("{}/v1/functions/x", a.base))
        .body(guest("echo"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["connection"], "close");
    let (status, _) = anonymous.get("/healthz").await;
    assert_eq!(status, 200, "health needs no key");

    // Revoking a key: it stops working at once; another key of the tenant goes on.
    let (_, created) = d
        .admin
        .post("/v1/tenants/acme/keys", r#"{"label": "ci"}"#)
        .await;
    let second = a.as_key(Some(created["key"].as_str().unwrap().into()));
    let (status, _) = second.get("/v1/functions").await;
    assert_eq!(status, 200);
    let id = created["id"].as_str().unwrap();
    let (status, revoked) = a
        .post(&format!("/v1/tenants/acme/keys/{id}/revoke"), "")
        .await;
    assert_eq!(status, 200, "{revoked}");
    let (status, body) = second.get("/v1/functions").await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("revoked")
    );
    let (status, _) = a.get("/v1/functions").await;
    assert_eq!(status, 200);

    // The operator key manages tenants and keys but does not run jobs.
    let (status, body) = d.admin.get("/v1/functions").await;
    assert_eq!(status, 403, "{body}");
    let (_, audit) = d.admin.get("/v1/audit?tenant=acme").await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "key.revoke",
            "key.create",
            "deploy",
            "key.create",
            "tenant.create"
        ],
        "{audit:#}"
    );
    assert_eq!(
        audit[0]["actor"],
        format!("key:{}", a.key.as_ref().unwrap()[5..17].to_owned())
    );
}

/// Every key the test created, in full; none may appear in the stored bytes.
/// Servers sharing a Redis each keep the keys they used for a second (no store round trip
/// per request): a key revoked through one is refused by the other within that second,
/// though it had just used the key, and by the one that revoked it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_on_another_server_is_refused_within_a_second() {
    let redis = RedisServer::start(RedisOptions::default());
    let shared = |c: &mut wasq_server::Config| {
        c.store = StoreBackend::Redis(redis.url());
        c.auth.secret = Some(b"a secret both servers share".to_vec());
        c.auth.admin_key = Some("wasq_admin_of_both".into());
    };
    let one = Daemon::start_with(shared).await;
    let two = Daemon::start_with(shared).await;
    one.admin.new_tenant("acme").await;
    let (_, created) = one
        .admin
        .post("/v1/tenants/acme/keys", r#"{"label": "both"}"#)
        .await;
    let key = created["key"].as_str().unwrap().to_owned();
    let on_one = one.api.as_key(Some(key.clone()));
    let on_two = two.api.as_key(Some(key));
    assert_eq!(
        on_two.get("/v1/functions").await.0,
        200,
        "server two knows the key"
    );
    assert_eq!(on_one.get("/v1/functions").await.0, 200);

    let id = created["id"].as_str().unwrap();
    let (status, _) = one
        .admin
        .post(&format!("/v1/tenants/acme/keys/{id}/revoke"), "")
        .await;
    assert_eq!(status, 200);
    let revoked = std::time::Instant::now();
    assert_eq!(
        on_one.get("/v1/functions").await.0,
        401,
        "at once where it was revoked"
    );
    loop {
        let (status, body) = on_two.get("/v1/functions").await;
        if status == 401 {
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            revoked.elapsed() < Duration::from_millis(1500),
            "server two still takes the revoked key after {:?}",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    one.stop().await;
    two.stop().await;
}

async fn make_keys(d: &Daemon) -> Vec<String> {
    let mut keys = vec![d.api.key.clone().unwrap()];
    let t = d.admin.new_tenant("acme").await;
    keys.push(t.key.clone().unwrap());
    let (_, k) = t.post("/v1/tenants/acme/keys", "{}").await;
    keys.push(k["key"].as_str().unwrap().to_owned());
    // Used once each, so any cache or log of a key would have had its chance.
    for key in &keys {
        let (status, _) = t.as_key(Some(key.clone())).get("/v1/runs").await;
        assert_eq!(status, 200);
    }
    keys
}

fn contains(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn assert_no_key_in(bytes: &[u8], keys: &[String], what: &str) {
    for key in keys {
        let secret = &key[key.len() - 32..];
        for needle in [key.as_str(), secret] {
            assert!(
                !contains(bytes, needle),
                "{what} holds the plaintext key {needle}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_holds_a_plaintext_key() {
    // SQLite: the database file and its write-ahead log.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_with(|c| c.data_dir = data.clone()).await;
    let keys = make_keys(&d).await;
    d.stop().await;
    let mut all = vec![];
    // The log first: the store may still be closing (checkpointing the log into the
    // database, then deleting it), and read in this order a row is in one or the other.
    for name in ["wasq.db-wal", "wasq.db"] {
        if let Ok(bytes) = std::fs::read(data.join(name)) {
            assert_no_key_in(&bytes, &keys, name);
            all.extend(bytes);
        }
    }
    // The scan sees the key records: their public ids are there.
    for key in &keys {
        assert!(contains(&all, &key[5..17]), "key id of {key} not found");
    }

    // Redis: every key and value, through an uncompressed snapshot and the AOF.
    let redis = RedisServer::start(RedisOptions {
        appendfsync: Some("always".into()),
        extra_args: vec!["--rdbcompression".into(), "no".into()],
    });
    let url = redis.url();
    let d = Daemon::start_with(|c| c.store = StoreBackend::Redis(url)).await;
    let keys = make_keys(&d).await;
    d.stop().await;
    redis.cli(&["SAVE"]);
    let mut files = vec![redis.dir().join("dump.rdb")];
    for entry in walk(redis.dir()) {
        if entry.to_string_lossy().contains("appendonly") {
            files.push(entry);
        }
    }
    let mut all = vec![];
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        assert_no_key_in(&bytes, &keys, &f.display().to_string());
        all.extend(bytes);
    }
    for key in &keys {
        assert!(contains(&all, &key[5..17]), "key id of {key} not found");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

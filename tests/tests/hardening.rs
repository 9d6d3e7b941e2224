//! Issue 10's attacks by a hostile tenant, each performed against the real daemon and shown
//! contained, on the embedded store and on Redis:
//! - a run piling up 4 MB steps (the daemon's memory, the run's storage, API answers);
//! - a fork storm of child runs and retries past `max_queued`;
//! - 10,000-line attempts failing over and over (the run's log budget);
//! - guest-supplied names the API would refuse (a 20 MB event name, escapes).
//!
//! The daemon runs as real processes — `wasq dev` on the embedded store, a `wasq server`
//! and a `wasq worker` on the test's `redis-server` — so their peak memory can be read
//! from /proc.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, DaemonProcess, DevProcess, free_port, guest, wait_healthy};

const WAIT: Duration = Duration::from_secs(120);

/// The processes under attack.
enum Processes {
    Dev(DevProcess),
    ServerAndWorker(DaemonProcess, DaemonProcess),
}

/// The daemon under attack, with a tenant's client and the operator's.
struct Dev {
    api: Api,
    admin: Api,
    tenant: &'static str,
    procs: Processes,
    redis: Option<RedisServer>,
    _home: tempfile::TempDir,
}

async fn start(redis: bool) -> Dev {
    let home = tempfile::tempdir().unwrap();
    if !redis {
        let data = home.path().join(".wasq");
        let dev = DevProcess::spawn(&data, free_port(), &[]).await;
        let admin_key = std::fs::read_to_string(data.join("admin.key")).unwrap();
        return Dev {
            api: dev.api.clone(),
            admin: dev.api.as_key(Some(admin_key.trim().to_owned())),
            tenant: "default",
            procs: Processes::Dev(dev),
            redis: None,
            _home: home,
        };
    }
    let r = RedisServer::start(RedisOptions::default());
    let url = r.url();
    let addr = format!("127.0.0.1:{}", free_port());
    let dir = |name: &str| home.path().join(name).to_string_lossy().into_owned();
    let server = DaemonProcess::spawn(&[
        "server",
        "--redis",
        &url,
        "--listen",
        &addr,
        "--data",
        &dir("server"),
    ]);
    let worker = DaemonProcess::spawn(&[
        "worker",
        "--redis",
        &url,
        "--concurrency",
        "8",
        "--data",
        &dir("worker"),
    ]);
    let operator = Api::new(addr.parse().unwrap());
    wait_healthy(&operator, Duration::from_secs(30)).await;
    let admin_key = std::fs::read_to_string(home.path().join("server/admin.key")).unwrap();
    let admin = operator.as_key(Some(admin_key.trim().to_owned()));
    let api = admin.new_tenant("acme").await;
    Dev {
        api,
        admin,
        tenant: "acme",
        procs: Processes::ServerAndWorker(server, worker),
        redis: Some(r),
        _home: home,
    }
}

/// Peak resident memory of a process so far (VmHWM), bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

impl Dev {
    fn backend(&self) -> &'static str {
        if self.redis.is_some() {
            "redis (server + worker)"
        } else {
            "sqlite (dev)"
        }
    }

    async fn quotas(&self, quotas: Value) {
        let resp = self
            .admin
            .http
            .put(format!(
                "{}/v1/tenants/{}/quotas",
                self.admin.base, self.tenant
            ))
            .body(quotas.to_string())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        assert_eq!(status, 200, "{:?}", resp.text().await);
    }

    /// Peak resident memory of each daemon process so far: (name, bytes).
    fn peak_rss(&self) -> Vec<(&'static str, u64)> {
        match &self.procs {
            Processes::Dev(d) => vec![("dev", peak_rss(d.pid()))],
            Processes::ServerAndWorker(s, w) => vec![
                ("server", peak_rss(s.child.id())),
                ("worker", peak_rss(w.child.id())),
            ],
        }
    }
}

/// Body size of a GET, and its status.
async fn answer_size(api: &Api, path: &str) -> (u16, usize) {
    let resp = api
        .http
        .get(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().len())
}

async fn piled_up_steps_fail_at_the_run_quota(redis: bool) {
    let d = start(redis).await;
    let api = &d.api;
    api.deploy(
        "hostile",
        guest("hostile"),
        "max_attempts=1&timeout_ms=120000",
    )
    .await;
    let before = d.peak_rss();
    // Three runs at once, each trying to store 100 steps of 4 MB (400 MB).
    let mut ids = vec![];
    for _ in 0..3 {
        ids.push(api.start_run("hostile", r#"{"attack": "big-steps"}"#).await);
    }
    let mut kept_steps = 0;
    for id in &ids {
        let run = api.wait_run(id, WAIT).await;
        assert_eq!(run["status"], "failed", "{run:#}");
        assert_eq!(run["error"]["reason"], "storage_quota", "{run:#}");
        let message = run["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("max_run_bytes quota of 67108864"),
            "{message}"
        );
        let steps = run["steps_total"].as_u64().unwrap();
        assert!((10..=16).contains(&steps), "{steps} steps kept");
        assert!(run["stored_bytes"].as_u64().unwrap() <= 64 << 20, "{run:#}");
        kept_steps += steps;

        // Every answer about it stays small, however much it stored.
        for path in [
            format!("/v1/runs/{id}"),
            format!("/v1/runs/{id}/steps"),
            format!("/v1/runs/{id}/logs"),
            "/v1/runs?limit=1000".to_owned(),
        ] {
            let (status, size) = answer_size(api, &path).await;
            assert_eq!(status, 200, "{path}");
            assert!(size < 1 << 20, "{path} answered {size} bytes");
        }
        let (status, size) = answer_size(api, &format!("/v1/runs/{id}/steps/big-0/0")).await;
        assert_eq!(status, 200);
        assert!(
            (4_000_000..4_200_000).contains(&size),
            "one step's output: {size} bytes"
        );
    }
    let peak = d.peak_rss();
    let mib = |v: &[(&str, u64)]| {
        v.iter()
            .map(|(n, b)| format!("{n} {} MiB", b >> 20))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "{}: 3 runs of 100 x 4 MB steps failed at max_run_bytes after {kept_steps} steps in \
         all; peak RSS {} (before: {})",
        d.backend(),
        mib(&peak),
        mib(&before)
    );
    for (name, bytes) in peak {
        assert!(bytes < 1 << 30, "{name}: peak RSS {} MiB", bytes >> 20);
    }
    if let Some(r) = &d.redis {
        eprintln!(
            "redis: {}",
            r.cli(&["INFO", "memory"])
                .lines()
                .find(|l| l.starts_with("used_memory_human"))
                .unwrap_or("")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piled_up_steps_fail_at_the_run_quota_on_sqlite() {
    piled_up_steps_fail_at_the_run_quota(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piled_up_steps_fail_at_the_run_quota_on_redis() {
    piled_up_steps_fail_at_the_run_quota(true).await;
}

/// Queued runs of the tenant now.
async fn queued(api: &Api) -> usize {
    let (status, runs) = api.get("/v1/runs?status=queued&limit=1000").await;
    assert_eq!(status, 200, "{runs}");
    runs.as_array().unwrap().len()
}

async fn a_fork_storm_stays_under_twice_max_queued(redis: bool) {
    let d = start(redis).await;
    let api = &d.api;
    d.quotas(json!({ "max_queued": 5, "max_running": 2 })).await;
    api.deploy(
        "hostile",
        guest("hostile"),
        "initial_backoff_ms=200&max_backoff_ms=200",
    )
    .await;
    let root = api
        .start_run("hostile", r#"{"attack": "fork", "count": 50}"#)
        .await;
    // Sample the queue while the storm goes on.
    let mut most = 0;
    let mut refused_api = false;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let n = queued(api).await;
        most = most.max(n);
        // Children stop at twice max_queued; a run already admitted that fails goes back
        // to the queue for its retry whatever the count (at most max_running of them).
        assert!(
            n <= 2 * 5 + 2,
            "{n} runs queued: children went past twice max_queued"
        );
        if n >= 5 && !refused_api {
            let (status, body) = api
                .post(
                    "/v1/functions/hostile/runs",
                    r#"{"attack": "fork", "count": 0}"#,
                )
                .await;
            if status == 429 {
                assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
                refused_api = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        most >= 6,
        "children never went past max_queued ({most}): no storm"
    );
    assert!(
        refused_api,
        "the API never refused a run while the queue was full"
    );
    // A fork refused by the quota fails its run (and says why).
    let (_, failed) = api.get("/v1/runs?status=failed&limit=1000").await;
    let (_, queued_now) = api.get("/v1/runs?limit=1000").await;
    let saw_refusal = failed
        .as_array()
        .unwrap()
        .iter()
        .chain(queued_now.as_array().unwrap())
        .any(|r| {
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_queued"))
        });
    assert!(saw_refusal, "no fork was refused by max_queued");
    let (status, _) = api
        .post(&format!("/v1/runs/{root}/cancel?cascade=true"), "")
        .await;
    assert!(status == 200 || status == 409);
    eprintln!(
        "{}: fork storm: at most {most} runs queued (max_queued 5, children up to 10)",
        d.backend()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_storm_stays_under_twice_max_queued_on_sqlite() {
    a_fork_storm_stays_under_twice_max_queued(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_storm_stays_under_twice_max_queued_on_redis() {
    a_fork_storm_stays_under_twice_max_queued(true).await;
}

async fn failing_chatty_attempts_share_one_log_budget(redis: bool) {
    let d = start(redis).await;
    let api = &d.api;
    d.quotas(json!({ "max_run_log_bytes": 1 << 20 })).await;
    api.deploy(
        "hostile",
        guest("hostile"),
        "max_attempts=10&initial_backoff_ms=1&max_backoff_ms=1&jitter=false",
    )
    .await;
    let id = api
        .start_run("hostile", r#"{"attack": "log-and-fail"}"#)
        .await;
    let run = api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert_eq!(run["attempt"], 10, "{run:#}");
    let logs = run["logs"].as_array().unwrap();
    let bytes: usize = logs
        .iter()
        .map(|l| l["message"].as_str().unwrap().len())
        .sum();
    let markers = logs
        .iter()
        .filter(|l| l["message"].as_str().unwrap().contains("max_run_log_bytes"))
        .count();
    let last_attempt = logs.iter().filter_map(|l| l["attempt"].as_u64()).max();
    eprintln!(
        "{}: 10 attempts of 10,000 lines kept {} lines ({bytes} bytes), the last from attempt {last_attempt:?}",
        d.backend(),
        logs.len()
    );
    assert_eq!(markers, 1, "one cut marker");
    assert!(bytes <= 1 << 20, "{bytes} bytes of log kept");
    assert!(last_attempt <= Some(3), "later attempts got a fresh budget");
    assert!(
        run["log_bytes"].as_u64().unwrap() <= (1 << 20) + 500,
        "{run:#}"
    );
    // Reading them is paged.
    let (status, page) = api
        .get(&format!("/v1/runs/{id}/logs?skip=100&limit=10"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(page.as_array().unwrap().len(), 10);
    assert_eq!(page[0]["message"], logs[100]["message"]);
    let (status, body) = api.get(&format!("/v1/runs/{id}/logs?limit=100000")).await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_chatty_attempts_share_one_log_budget_on_sqlite() {
    failing_chatty_attempts_share_one_log_budget(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_chatty_attempts_share_one_log_budget_on_redis() {
    failing_chatty_attempts_share_one_log_budget(true).await;
}

async fn guest_names_follow_the_api_rules(redis: bool) {
    let d = start(redis).await;
    let api = &d.api;
    api.deploy("hostile", guest("hostile"), "max_attempts=1")
        .await;
    for attack in ["huge-event-name", "bad-event-name"] {
        let id = api
            .start_run("hostile", &json!({ "attack": attack }).to_string())
            .await;
        let run = api.wait_run(&id, WAIT).await;
        assert_eq!(run["status"], "failed", "{attack}: {run:#}");
        let message = run["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("invalid event name"),
            "{attack}: {message}"
        );
        assert!(
            !message.contains('\u{1b}') && message.len() < 1000,
            "{attack}: the refusal is short and escaped: {message:?}"
        );
        assert!(run["wait"].is_null(), "nothing of the name was stored");
        let (_, size) = answer_size(api, &format!("/v1/runs/{id}")).await;
        assert!(size < 20_000, "{attack}: the run answers {size} bytes");
    }
    let (_, size) = answer_size(api, "/v1/runs?limit=50").await;
    assert!(size < 100_000, "listing answers {size} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_names_follow_the_api_rules_on_sqlite() {
    guest_names_follow_the_api_rules(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_names_follow_the_api_rules_on_redis() {
    guest_names_follow_the_api_rules(true).await;
}

/// Twenty clients upload 60 MB at once (the attack took a daemon from 1.3 to 2.8 GB): the
/// bodies in flight are bounded (128 MiB), the rest wait their turn, and every upload gets
/// its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_big_uploads_are_received_a_few_at_a_time() {
    let d = start(false).await;
    let before = d.peak_rss()[0].1;
    let mut body = b"\0asm\x0d\x00\x01\x00".to_vec();
    body.resize(60 << 20, 0);
    let body = bytes::Bytes::from(body);
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (api, body) = (d.api.clone(), body.clone());
        set.spawn(async move {
            let resp = api
                .http
                .put(format!("{}/v1/functions/big-{i}", api.base))
                .body(body)
                .send()
                .await
                .expect("the upload gets an answer");
            let status = resp.status().as_u16();
            let answer: Value = resp.json().await.unwrap();
            (
                status,
                answer["error"]["code"].as_str().unwrap_or("").to_owned(),
            )
        });
    }
    let answers = set.join_all().await;
    let peak = d.peak_rss()[0].1;
    eprintln!(
        "20 parallel uploads of 60 MB answered in {:?}: {:?}; peak RSS {} MiB (before {} MiB)",
        started.elapsed(),
        answers,
        peak >> 20,
        before >> 20
    );
    for (status, code) in &answers {
        assert!(
            (*status == 400 && code == "bad_component") || (*status == 503 && code == "busy"),
            "{status} {code}"
        );
    }
    assert!(
        peak - before < 700 << 20,
        "the uploads raised the peak RSS by {} MiB",
        (peak - before) >> 20
    );
}

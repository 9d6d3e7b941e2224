//! Chaos on real processes (issue 17): one `wasq server` and two `wasq worker`s on the
//! test's own `redis-server`, running the `three_steps` guest, whose step bodies call a
//! counting HTTP server in the test — a side effect seen from outside the store. A worker
//! is paused past its lease (SIGSTOP, then SIGCONT), cut off from Redis, killed -9 in a
//! loop, or Redis itself is killed -9; every accepted run must succeed and no completed
//! step's body may run again.
//! Also: no false "lease lost" in a run without faults, and daemons started before Redis
//! has loaded its dataset wait for it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Counter, DaemonProcess, Hit, Proxy, free_port, guest, now_ms, wait_healthy};

/// A server and `workers` worker processes on `redis`, a tenant `acme` with the
/// three-step guest deployed as `three` (loopback egress allowed, to reach the counter).
struct Setup {
    api: Api,
    counter: Counter,
    workers: Vec<DaemonProcess>,
    _server: DaemonProcess,
    _dir: tempfile::TempDir,
}

async fn setup(redis: &RedisServer, workers: usize, lease: &str) -> Setup {
    setup_with(&redis.url(), &vec![redis.url(); workers], lease).await
}

/// Like [`setup`], each worker with its own Redis URL (one may go through a [`Proxy`]).
async fn setup_with(url: &str, worker_urls: &[String], lease: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let addr = format!("127.0.0.1:{}", free_port());
    let data = |name: &str| path(name).to_string_lossy().into_owned();
    let server = DaemonProcess::spawn_logged(
        &[
            "server",
            "--redis",
            url,
            "--listen",
            &addr,
            "--data",
            &data("server"),
        ],
        &path("server.log"),
    );
    let workers = worker_urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let name = format!("w{}", i + 1);
            DaemonProcess::spawn_logged(
                &[
                    "worker",
                    "--redis",
                    url,
                    "--concurrency",
                    "16",
                    "--lease",
                    lease,
                    "--allow-loopback-egress",
                    "--data",
                    &data(&name),
                ],
                &path(&format!("{name}.log")),
            )
        })
        .collect();
    let operator = Api::new(addr.parse().unwrap());
    wait_healthy(&operator, Duration::from_secs(30)).await;
    let admin_key = std::fs::read_to_string(path("server/admin.key")).unwrap();
    let api = operator
        .as_key(Some(admin_key.trim().to_owned()))
        .new_tenant("acme")
        .await;
    // Lease losses count as attempts: leave room for several per run.
    api.deploy(
        "three",
        guest("three_steps"),
        "max_attempts=8&allow_hosts=127.0.0.1",
    )
    .await;
    Setup {
        api,
        counter: Counter::start().await,
        workers,
        _server: server,
        _dir: dir,
    }
}

/// Creates `n` runs of `three` that pause `pause_ms` between steps; returns their ids.
async fn create(s: &Setup, n: usize, pause_ms: u64) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
        let mut set = tokio::task::JoinSet::new();
        for &i in chunk {
            let api = s.api.clone();
            let input = format!(
                r#"{{"pause_ms": {pause_ms}, "count_url": "{}", "n": {i}}}"#,
                s.counter.url()
            );
            set.spawn(async move {
                // 503: the store is unreachable and nothing was created; try again.
                for _ in 0..100 {
                    let (code, body) = api.post("/v1/functions/three/runs", &input).await;
                    match code {
                        201 => return body["id"].as_str().unwrap().to_owned(),
                        503 => tokio::time::sleep(Duration::from_millis(100)).await,
                        _ => panic!("create: {code} {body}"),
                    }
                }
                panic!("the store stayed unavailable")
            });
        }
        ids.extend(set.join_all().await);
    }
    ids
}

/// Waits until every run ended; returns them, each asserted to have succeeded.
async fn all_succeed(api: &Api, ids: &[String], within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut runs = Vec::with_capacity(ids.len());
    for id in ids {
        let left = deadline.saturating_duration_since(Instant::now());
        let run = api.wait_run(id, left).await;
        assert_eq!(run["status"], "succeeded", "{run:#}");
        runs.push(run);
    }
    runs
}

/// What the counter saw, checked against what the store recorded.
struct Effects {
    /// Hits by (run, step).
    by_step: HashMap<(String, String), Vec<Hit>>,
    /// Bodies that ran again because the attempt running them died or stopped before it
    /// could record them: allowed (at least once), counted for the report.
    interrupted: usize,
}

/// Every completed step's body ran exactly once in the attempt that recorded it, and no
/// body ran after its step was recorded. Any other run of a body came from an attempt
/// that never recorded it, before it was recorded (the body was interrupted).
fn check_effects(runs: &[Value], hits: &[Hit]) -> Effects {
    let mut by_step: HashMap<(String, String), Vec<Hit>> = HashMap::new();
    for h in hits {
        by_step
            .entry((h.query["run"].clone(), h.query["step"].clone()))
            .or_default()
            .push(h.clone());
    }
    let mut interrupted = 0;
    for run in runs {
        let id = run["id"].as_str().unwrap();
        let steps = run["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 3, "{run:#}");
        for step in steps {
            let name = step["name"].as_str().unwrap();
            let recorded_by = step["attempt"].as_u64().unwrap().to_string();
            let completed_at = step["completed_at"].as_i64().unwrap();
            let hits = by_step
                .get(&(id.to_owned(), name.to_owned()))
                .unwrap_or_else(|| panic!("step {name} of {id} has no side effect"));
            let own = hits
                .iter()
                .filter(|h| h.query["attempt"] == recorded_by)
                .count();
            assert_eq!(
                own, 1,
                "the body of step {name} of {id} ran {own} times in attempt {recorded_by}: {hits:?}"
            );
            for h in hits.iter().filter(|h| h.query["attempt"] != recorded_by) {
                assert!(
                    h.at <= completed_at,
                    "the body of step {name} of {id} ran again {} ms after the step was \
                     recorded (attempt {}; recorded by attempt {recorded_by}): {run:#}",
                    h.at - completed_at,
                    h.query["attempt"]
                );
                interrupted += 1;
            }
        }
    }
    Effects {
        by_step,
        interrupted,
    }
}

/// The worker that ran attempt `number` of `run` ("host-pid").
fn worker_of(run: &Value, number: &str) -> String {
    run["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| {
            a["number"]
                .as_u64()
                .is_some_and(|n| n.to_string() == number)
        })
        .map(|a| a["worker"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no attempt {number}: {run:#}"))
}

fn worker_id(p: &DaemonProcess) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    format!("{}-{}", host.trim(), p.pid())
}

/// Runs of `three` that worker `id` runs now.
async fn held_by(api: &Api, id: &str) -> usize {
    held_by_with_steps(api, id, 0).await
}

/// Runs of `three` that worker `id` runs now, with at least `steps` steps completed.
async fn held_by_with_steps(api: &Api, id: &str, steps: usize) -> usize {
    let (code, runs) = api
        .get("/v1/runs?function=three&status=running&limit=1000")
        .await;
    assert_eq!(code, 200, "{runs}");
    let mut n = 0;
    for r in runs.as_array().unwrap() {
        let detail = api.run_detail(r["id"].as_str().unwrap()).await;
        let last = detail["attempts"].as_array().unwrap().last().cloned();
        if last.is_some_and(|a| a["worker"] == id && a["finished_at"].is_null())
            && detail["steps"].as_array().unwrap().len() >= steps
        {
            n += 1;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_paused_past_its_lease_starts_nothing_after_sigcont() {
    let redis = RedisServer::start(RedisOptions {
        appendfsync: Some("always".into()),
        ..Default::default()
    });
    let s = setup(&redis, 2, "2s").await;
    let w1 = worker_id(&s.workers[0]);
    // 1 s outside steps between steps: a paused worker wakes up between two steps.
    let ids = create(&s, 48, 1000).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while held_by(&s.api, &w1).await < 4 {
        assert!(Instant::now() < deadline, "worker 1 never held runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Three times the lease: worker 2 takes the runs over meanwhile.
    let stopped_at = now_ms();
    s.workers[0].signal("STOP");
    tokio::time::sleep(Duration::from_secs(6)).await;
    // It wakes up while Redis is slow to answer (frozen for a moment), so its lease
    // renewal cannot tell it the runs are gone: only its own clock can.
    redis.stop_for(Duration::from_millis(1500));
    let resumed_at = now_ms();
    s.workers[0].signal("CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let runs = all_succeed(&s.api, &ids, Duration::from_secs(120)).await;
    let hits = s.counter.hits();
    let effects = check_effects(&runs, &hits);
    // After SIGCONT, the paused worker starts no step body: none of its attempts that
    // were under way at the pause sends a request after it.
    let mut taken_over = 0;
    for run in &runs {
        let id = run["id"].as_str().unwrap();
        let paused_attempts: Vec<&Value> = run["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| {
                a["worker"] == w1.as_str()
                    && a["started_at"].as_i64().unwrap() < stopped_at
                    && a["error"]["reason"] == "lease_expired"
            })
            .collect();
        taken_over += paused_attempts.len();
        for a in paused_attempts {
            let number = a["number"].to_string();
            for step in ["a", "b", "c"] {
                let key = (id.to_owned(), step.to_owned());
                for h in effects.by_step.get(&key).into_iter().flatten() {
                    if h.query["attempt"] == number {
                        assert_eq!(worker_of(run, &number), w1);
                        assert!(
                            h.at < resumed_at,
                            "after SIGCONT the paused worker ran the body of step {step} \
                             of {id} ({} ms after resuming): {run:#}",
                            h.at - resumed_at
                        );
                    }
                }
            }
        }
    }
    assert!(
        taken_over >= 4,
        "only {taken_over} runs of the paused worker were taken over: the test proved nothing"
    );
    let log = s.workers[0].log();
    let abandoned = log.matches("attempt abandoned").count();
    assert!(
        abandoned > 0,
        "the paused worker abandoned no attempt:\n{log}"
    );
    assert!(
        !log.contains("retrying in"),
        "the paused worker planned retries of attempts it no longer owned:\n{log}"
    );
    eprintln!(
        "{} runs succeeded; {taken_over} attempts of the paused worker taken over, \
         {abandoned} abandoned after SIGCONT, {} step bodies interrupted by the pause ran again",
        runs.len(),
        effects.interrupted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_cut_off_from_redis_starts_nothing_once_its_lease_ran_out() {
    let redis = RedisServer::start(RedisOptions::default());
    let proxy = Proxy::start(([127, 0, 0, 1], redis.port()).into()).await;
    let through_proxy = format!("redis://{}", proxy.addr);
    let s = setup_with(&redis.url(), &[through_proxy, redis.url()], "2s").await;
    let w1 = worker_id(&s.workers[0]);
    // 3 s between steps, longer than the lease: a cut-off worker reaches its next step
    // after another worker may have taken the run over, without needing Redis to get there.
    let ids = create(&s, 48, 3000).await;
    // Cut it off just after a step: its next step starts past its lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    while held_by_with_steps(&s.api, &w1, 1).await < 4 {
        assert!(Instant::now() < deadline, "worker 1 never held runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let cut_at = now_ms();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(8)).await;
    proxy.restore();

    let runs = all_succeed(&s.api, &ids, Duration::from_secs(180)).await;
    let effects = check_effects(&runs, &s.counter.hits());
    // Its leases were last extended before the cut: from cut + lease on, the runs may be
    // another worker's, and worker 1 must not start a step body of them.
    let mut taken_over = 0;
    for run in &runs {
        let id = run["id"].as_str().unwrap();
        for a in run["attempts"].as_array().unwrap() {
            if a["worker"] != w1.as_str() || a["started_at"].as_i64().unwrap() > cut_at {
                continue;
            }
            if a["error"]["reason"] == "lease_expired" {
                taken_over += 1;
            }
            let number = a["number"].to_string();
            for step in ["a", "b", "c"] {
                let key = (id.to_owned(), step.to_owned());
                for h in effects.by_step.get(&key).into_iter().flatten() {
                    assert!(
                        h.query["attempt"] != number || h.at < cut_at + 2000,
                        "worker 1, cut off from Redis, ran the body of step {step} of {id} \
                         {} ms after the cut, past its lease: {run:#}",
                        h.at - cut_at
                    );
                }
            }
        }
    }
    assert!(
        taken_over >= 4,
        "only {taken_over} runs of the cut-off worker were taken over: the test proved nothing"
    );
    let log = s.workers[0].log();
    assert!(
        log.contains("lease on the run ran out"),
        "worker 1 never stopped an attempt by its own clock:\n{log}"
    );
    eprintln!(
        "{} runs succeeded; {taken_over} attempts of the cut-off worker taken over, {} \
         interrupted step bodies ran again",
        runs.len(),
        effects.interrupted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_killed_9_in_a_loop_lose_no_run_and_repeat_no_completed_step() {
    let redis = RedisServer::start(RedisOptions::default());
    let mut s = setup(&redis, 2, "2s").await;
    let mut w1 = s.workers.remove(0);
    let api = s.api.clone();
    // Each kill lands while worker 1 holds runs between two steps (however loaded the
    // machine is), so some runs must resume mid-run on another attempt.
    let killer = tokio::spawn(async move {
        for _ in 0..3 {
            let deadline = Instant::now() + Duration::from_secs(60);
            while held_by_with_steps(&api, &worker_id(&w1), 1).await < 2 {
                assert!(
                    Instant::now() < deadline,
                    "worker 1 never held runs mid-way"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            w1.kill9();
            tokio::time::sleep(Duration::from_millis(300)).await;
            w1.respawn();
        }
        w1
    });
    let started = Instant::now();
    let ids = create(&s, 1500, 50).await;
    let created_in = started.elapsed();
    let _w1 = killer.await.unwrap();
    let runs = all_succeed(&s.api, &ids, Duration::from_secs(180)).await;
    let effects = check_effects(&runs, &s.counter.hits());

    let mut lost_attempts = 0;
    let mut resumed_mid_run = 0;
    for run in &runs {
        for step in ["a", "b", "c"] {
            let line = format!("step {step} body ran");
            let times = run["logs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["message"] == line.as_str())
                .count();
            assert_eq!(times, 1, "step {step} logged {times} times: {run:#}");
        }
        lost_attempts += run["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["error"]["reason"] == "lease_expired")
            .count();
        if run["output"]["a"] != run["output"]["c"] {
            resumed_mid_run += 1;
        }
    }
    eprintln!(
        "{} runs created in {created_in:?}, all succeeded after {:?}; {lost_attempts} attempts \
         lost to kill -9, {resumed_mid_run} runs resumed mid-run, {} interrupted step bodies ran again",
        runs.len(),
        started.elapsed(),
        effects.interrupted
    );
    assert!(
        lost_attempts > 0 && resumed_mid_run > 0,
        "the kills hit no run between its steps, so the test proved nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_9_while_runs_execute_loses_no_run_and_repeats_no_completed_step() {
    let mut redis = RedisServer::start(RedisOptions {
        appendfsync: Some("always".into()),
        ..Default::default()
    });
    let s = setup(&redis, 2, "2s").await;
    let mut ids = create(&s, 200, 100).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (code, running) = s.api.get("/v1/runs?status=running&limit=1000").await;
    assert_eq!(code, 200, "{running}");
    let running = running.as_array().unwrap().len();
    redis.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart();
    // The API answers again without a restart; more work comes in.
    ids.extend(create(&s, 100, 100).await);

    let runs = all_succeed(&s.api, &ids, Duration::from_secs(180)).await;
    let effects = check_effects(&runs, &s.counter.hits());
    eprintln!(
        "{} runs succeeded; {running} were running when Redis was killed; {} step bodies \
         interrupted by the outage ran again",
        runs.len(),
        effects.interrupted
    );
    assert!(
        running > 0,
        "nothing ran when Redis died: the test proved nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_without_faults_logs_no_lease_loss() {
    let redis = RedisServer::start(RedisOptions::default());
    // A short lease renews often, so renewals race the ends of attempts often.
    let s = setup(&redis, 2, "1s").await;
    let ids = create(&s, 600, 5).await;
    let runs = all_succeed(&s.api, &ids, Duration::from_secs(120)).await;
    let effects = check_effects(&runs, &s.counter.hits());
    assert_eq!(
        effects.interrupted, 0,
        "no fault, yet a step body ran twice"
    );
    for (i, w) in s.workers.iter().enumerate() {
        let log = w.log();
        let succeeded = log.matches("attempt succeeded").count();
        assert!(succeeded > 0, "worker {} ran nothing:\n{log}", i + 1);
        for bad in ["lease lost", "abandoned", "lease renewal failed"] {
            assert!(
                !log.contains(bad),
                "worker {} logged {bad:?} without any fault:\n{log}",
                i + 1
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemons_started_before_redis_has_loaded_wait_for_it() {
    let mut redis = RedisServer::start(RedisOptions {
        extra_args: vec!["--enable-debug-command".into(), "local".into()],
        ..Default::default()
    });
    // A dataset that takes seconds to load.
    redis.cli(&["DEBUG", "POPULATE", "20000", "filler", "10"]);
    redis.cli(&["SAVE"]);
    redis.kill();

    // Redis is down: the daemons start anyway, and wait.
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let data = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let url = redis.url();
    let mut server = DaemonProcess::spawn_logged(
        &[
            "server",
            "--redis",
            &url,
            "--listen",
            &addr,
            "--data",
            &data("server"),
        ],
        &dir.path().join("server.log"),
    );
    let mut worker = DaemonProcess::spawn_logged(
        &["worker", "--redis", &url, "--data", &data("worker")],
        &dir.path().join("worker.log"),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(server.exited().is_none(), "{}", server.log());
    assert!(worker.exited().is_none(), "{}", worker.log());

    // Now it starts, and spends seconds loading.
    redis.restart_in_background(&[
        "--key-load-delay",
        "150",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis.is_loading() {
        assert!(Instant::now() < deadline, "Redis never reported loading");
        std::thread::sleep(Duration::from_millis(10));
    }
    let loading_seen = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        redis.is_loading(),
        "the dataset loaded too fast to test anything"
    );
    assert!(server.exited().is_none(), "{}", server.log());
    assert!(worker.exited().is_none(), "{}", worker.log());

    redis.wait_ready(Duration::from_secs(60));
    eprintln!("Redis loaded for {:?}", loading_seen.elapsed());
    let operator = Api::new(addr.parse().unwrap());
    wait_healthy(&operator, Duration::from_secs(30)).await;
    for (name, log) in [("server", server.log()), ("worker", worker.log())] {
        assert!(
            log.contains("is not ready") && log.contains("loading"),
            "the {name} did not say it waited for Redis to load:\n{log}"
        );
    }
    // And then they serve: a run goes through the server and the worker.
    let admin_key = std::fs::read_to_string(dir.path().join("server/admin.key")).unwrap();
    let api = operator
        .as_key(Some(admin_key.trim().to_owned()))
        .new_tenant("acme")
        .await;
    api.deploy("echo", guest("echo"), "").await;
    let id = api.start_run("echo", r#"{"after": "loading"}"#).await;
    let run = api.wait_run(&id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"]["after"], "loading", "{run:#}");
}

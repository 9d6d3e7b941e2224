//! Named queues and worker pools (issue 15): a function's settings name its queue, `wasq
//! worker --queues` takes only the queues it names, the API and the CLI show each queue's
//! depth. On Redis with real worker processes, and on the embedded store with `wasq dev
//! --queues`.

use std::time::Duration;

use serde_json::Value;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::*;

/// Starts `n` runs of `function`, 25 at a time; their ids.
async fn start_runs(api: &Api, function: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    let all: Vec<usize> = (0..n).collect();
    for chunk in all.chunks(25) {
        let starts = chunk.iter().map(|&i| {
            let api = api.clone();
            let function = function.to_owned();
            tokio::spawn(async move { api.start_run(&function, &format!("{{\"n\": {i}}}")).await })
        });
        for h in starts.collect::<Vec<_>>() {
            ids.push(h.await.unwrap());
        }
    }
    ids
}

/// The workers that executed the run's attempts.
async fn workers_of(api: &Api, id: &str) -> Vec<String> {
    let detail = api.run_detail(id).await;
    detail["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("attempts of {detail}"))
        .iter()
        .map(|a| a["worker"].as_str().unwrap().to_owned())
        .collect()
}

fn depth(queues: &Value, name: &str) -> (u64, u64) {
    let q = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == name)
        .unwrap_or_else(|| panic!("queue {name} in {queues}"));
    (
        q["queued"].as_u64().unwrap(),
        q["running"].as_u64().unwrap(),
    )
}

/// Two worker processes on one Redis, one `--queues critical`, one `--queues default`:
/// every run of the function on queue `critical` is executed by the first, every other
/// run by the second; with the first stopped, critical runs wait (the second never takes
/// them) and `GET /v1/queues` and `wasq queues` show them waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_critical_run_is_never_executed_by_a_default_worker_on_redis() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let daemon = Daemon::api_on_redis(&url, |_| {}).await;
    let api = &daemon.api;
    let email = api.deploy("email", guest("echo"), "queue=critical").await;
    assert_eq!(email["settings"]["queue"], "critical", "{email}");
    let report = api.deploy("report", guest("echo"), "").await;
    assert_eq!(report["settings"]["queue"], "default", "{report}");

    let dir = tempfile::tempdir().unwrap();
    let spawn = |queues: &str, name: &str| {
        spawn_worker(
            &url,
            dir.path(),
            name,
            &["--queues", queues, "--concurrency", "4"],
        )
    };
    let mut critical = spawn("critical", "critical");
    let default = spawn("default", "default");
    // Both idle before any run exists: each is woken for its own queue's runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let emails = start_runs(api, "email", 40).await;
    let reports = start_runs(api, "report", 40).await;
    for id in emails.iter().chain(&reports) {
        let run = api.wait_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "succeeded", "{run}");
    }
    let by_critical = format!("-{}", critical.pid());
    let by_default = format!("-{}", default.pid());
    for id in &emails {
        let w = workers_of(api, id).await;
        assert!(
            w.iter().all(|w| w.ends_with(&by_critical)),
            "a critical run executed by {w:?}, not the critical worker ({by_critical})"
        );
    }
    for id in &reports {
        let w = workers_of(api, id).await;
        assert!(w.iter().all(|w| w.ends_with(&by_default)), "{w:?}");
    }

    // The registry: both workers, their queues and slots (the API server executes nothing).
    let (status, workers) = api.get("/v1/workers").await;
    assert_eq!(status, 200, "{workers}");
    let listed = |workers: &serde_json::Value| -> Vec<(String, serde_json::Value, u64)> {
        workers
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let id = w["id"].as_str().unwrap().to_owned();
                (id, w["queues"].clone(), w["slots"].as_u64().unwrap())
            })
            .collect()
    };
    let both = listed(&workers);
    assert_eq!(both.len(), 2, "{workers}");
    for (ending, queue) in [(&by_critical, "critical"), (&by_default, "default")] {
        assert!(
            both.iter()
                .any(|(id, q, slots)| id.ends_with(ending.as_str())
                    && *q == serde_json::json!([queue])
                    && *slots == 4),
            "{workers}"
        );
    }

    // The critical pool stops: its runs wait, whatever the default pool has room for.
    critical.signal("TERM");
    for _ in 0..200 {
        if critical.exited().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(critical.exited().is_some(), "{}", critical.log());
    let (_, workers) = api.get("/v1/workers").await;
    let left = listed(&workers);
    assert_eq!(
        left.len(),
        1,
        "a worker that stopped left the registry: {workers}"
    );
    assert!(left[0].0.ends_with(&by_default), "{workers}");
    let waiting = start_runs(api, "email", 3).await;
    let done = start_runs(api, "report", 1).await;
    api.wait_run(&done[0], Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &waiting {
        assert_eq!(api.run(id).await["status"], "queued");
    }
    let (status, queues) = api.get("/v1/queues").await;
    assert_eq!(status, 200, "{queues}");
    assert_eq!(depth(&queues, "critical"), (3, 0), "{queues}");
    assert_eq!(depth(&queues, "default"), (0, 0), "{queues}");
    let (code, out, err) = run_cli(api.cli().args(["queues"]));
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.contains("critical"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.split_whitespace().any(|c| c == "3"), "{out}");
    daemon.stop().await;
}

/// The embedded store: `wasq dev --queues critical` executes the critical runs and leaves
/// the default queue's waiting; bad queue names are refused with one clear line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wasq_dev_with_queues_executes_only_those_queues() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let dev = DevProcess::spawn(&data, free_port(), &["--queues", "critical"]).await;
    let api = &dev.api;
    let echo = dir.path().join("echo.wasm");
    std::fs::write(&echo, guest("echo")).unwrap();
    let (code, _, err) = run_cli(api.cli().args([
        "deploy",
        echo.to_str().unwrap(),
        "--name",
        "email",
        "--queue",
        "critical",
    ]));
    assert_eq!(code, 0, "{err}");
    api.deploy("report", guest("echo"), "").await;
    let report = api.start_run("report", "{}").await;
    let email = api.start_run("email", "{}").await;
    let run = api.wait_run(&email, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.run(&report).await["status"], "queued");
    let (_, queues) = api.get("/v1/queues").await;
    assert_eq!(depth(&queues, "default"), (1, 0), "{queues}");
    assert_eq!(depth(&queues, "critical"), (0, 0), "{queues}");
    let (code, out, err) = run_cli(api.cli().args(["status"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(": ok") && out.contains("tenant default: 1 queued"),
        "{out}"
    );
    assert!(
        out.contains("workers heard from in the last 30 s: 1,") && out.contains("critical"),
        "wasq dev's own worker: {out}"
    );
    let (code, out, _) = run_cli(api.cli().args(["status", "--output", "json"]));
    assert_eq!(code, 0);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["health"]["status"], "ok");
    assert_eq!(depth(&status["queues"], "default"), (1, 0));
    let (code, out, _) = run_cli(api.cli().args(["functions", "list"]));
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains("email") && l.contains("critical")),
        "{out}"
    );

    let (status, body) = api
        .put("/v1/functions/x?queue=no%20spaces", guest("echo"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("queue: invalid queue name"),
        "{body}"
    );
    let (code, _, err) = run_cli(wasq().args(["worker", "--queues", "a,,b"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid queue name"), "{err}");
}

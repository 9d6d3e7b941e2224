//! Cron triggers against the real daemon: a seconds schedule fires once per tick, the
//! trigger shows the tick, pause/resume/run-now work, bad schedules are refused.

use std::time::Duration;

use serde_json::Value;
use wasq_tests::{Daemon, guest, run_cli};

async fn cron_runs(d: &Daemon) -> Vec<Value> {
    let (_, runs) = d.api.get("/v1/runs?function=ticker&limit=1000").await;
    runs.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seconds_schedule_fires_once_per_tick() {
    let d = Daemon::start().await;
    let cron = "cron=*/1%20*%20*%20*%20*%20*";
    d.api.deploy("ticker", guest("echo"), cron).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let runs = cron_runs(&d).await;
    assert!(
        (2..=5).contains(&runs.len()),
        "{} runs in 3.5 s of a per-second schedule",
        runs.len()
    );
    let mut ticks: Vec<&str> = runs
        .iter()
        .map(|r| r["trigger"].as_str().unwrap())
        .collect();
    assert!(
        ticks.iter().all(|t| t.starts_with("cron:*/1 * * * * *@")),
        "{ticks:?}"
    );
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), runs.len(), "each tick fired once");
    let done = d
        .api
        .wait_run(runs[0]["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(
        done["output"]["cron"], "*/1 * * * * *",
        "the run's input names its tick: {done:#}"
    );

    // `wasq cron list` shows the next ticks.
    let (code, out, err) = run_cli(d.api.cli().args(["cron", "list"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ticker") && out.contains("active") && out.contains("UTC"),
        "{out}"
    );

    let (code, _, err) = run_cli(d.api.cli().args(["cron", "pause", "ticker"]));
    assert_eq!(code, 0, "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused_at = cron_runs(&d).await.len();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        cron_runs(&d).await.len(),
        paused_at,
        "a paused schedule does not fire"
    );

    let (code, out, _) = run_cli(d.api.cli().args(["cron", "run-now", "ticker"]));
    assert_eq!(code, 0);
    let run = d.api.wait_run(out.trim(), Duration::from_secs(30)).await;
    assert_eq!(
        (run["status"].as_str(), run["trigger"].as_str()),
        (Some("succeeded"), Some("cron:run-now"))
    );

    let (code, _, _) = run_cli(d.api.cli().args(["cron", "resume", "ticker"]));
    assert_eq!(code, 0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(cron_runs(&d).await.len() >= paused_at + 2, "resumed");

    for (query, reason) in [
        ("cron=61%20*%20*%20*%20*", "invalid cron expression"),
        ("cron=*%20*%20*%20*%20*&tz=Mars/Base", "unknown time zone"),
    ] {
        let (status, body) = d
            .api
            .put(&format!("/v1/functions/bad?{query}"), guest("echo"))
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(reason),
            "{body}"
        );
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_ticks_are_skipped_or_the_latest_is_caught_up() {
    // Stay clear of a minute boundary, where a regular tick would blur the result.
    let unix_s = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    if unix_s() % 60 > 50 {
        tokio::time::sleep(Duration::from_secs(61 - unix_s() % 60)).await;
    }
    let now_s = unix_s();
    let d = Daemon::start().await;
    d.api
        .deploy(
            "catch-up",
            guest("echo"),
            "cron=*%20*%20*%20*%20*&missed=latest",
        )
        .await;
    d.api
        .deploy(
            "skipper",
            guest("echo"),
            "cron=*%20*%20*%20*%20*&missed=skip",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, caught) = d.api.get("/v1/runs?function=catch-up").await;
    let caught = caught.as_array().unwrap();
    assert_eq!(
        caught.len(),
        1,
        "the latest missed tick fired once: {caught:#?}"
    );
    let minute = now_s / 60 * 60;
    let tick = format!("cron:* * * * *@{}", humantime_minute(minute));
    assert_eq!(caught[0]["trigger"], tick.as_str());
    let (_, skipped) = d.api.get("/v1/runs?function=skipper").await;
    assert_eq!(
        skipped,
        serde_json::json!([]),
        "skip waits for the next tick"
    );
    d.stop().await;
}

/// RFC 3339 with milliseconds, as triggers show ticks.
fn humantime_minute(unix_s: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(unix_s);
    humantime::format_rfc3339_millis(t).to_string()
}

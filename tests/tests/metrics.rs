//! `/metrics` after a known workload (issue 16): counters, gauges of queue depth and
//! backlog age, histograms' bucket counts — on an injected clock, so the durations the
//! store measures are exact. The Grafana dashboard and alert rules in `deploy/` only name
//! metrics the scrape has.

use std::sync::Arc;
use std::time::Duration;

use wasq_tests::*;

/// The value of the series `name` whose labels include every one of `labels`.
fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let (series, v) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        all.then(|| v.parse().ok()).flatten()
    })
}

fn must(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(scrape, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{scrape}"))
}

async fn scrape(d: &Daemon) -> String {
    let (status, body) = d.admin.get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    body.as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_a_known_workload() {
    let t0 = 1_767_225_600_000;
    let clock = wasq_core::ManualClock::new(t0);
    let c = clock.clone();
    let d = Daemon::start_with(move |config| config.clock = Arc::new(c)).await;
    let api = &d.api;
    api.deploy("echo", guest("echo"), "").await;
    api.deploy("later", guest("echo"), "").await;
    api.deploy(
        "flaky",
        guest("fail"),
        "max_attempts=2&initial_backoff_ms=1000&jitter=false",
    )
    .await;
    api.deploy("fetch", guest("fetch"), "").await;

    let later: Vec<String> = {
        let mut ids = vec![];
        for _ in 0..2 {
            let (status, run) = api.post("/v1/functions/later/runs?delay=1h", "{}").await;
            assert_eq!(status, 201, "{run}");
            ids.push(run["id"].as_str().unwrap().to_owned());
        }
        ids
    };
    let mut ids = vec![];
    for i in 0..3 {
        ids.push(api.start_run("echo", &format!("{{\"n\": {i}}}")).await);
    }
    let flaky = api
        .start_run("flaky", r#"{"kind": "retryable", "message": "down"}"#)
        .await;
    let fetch = api
        .start_run(
            "fetch",
            r#"{"requests": [{"url": "http://10.0.0.1/"}, {"url": "http://169.254.169.254/"}]}"#,
        )
        .await;
    for id in ids.iter().chain([&fetch]) {
        let run = api.wait_run(id, Duration::from_secs(30)).await;
        assert_eq!(run["status"], "succeeded", "{run}");
    }
    api.wait_until(&flaky, Duration::from_secs(30), |r| {
        r["status"] == "queued" && r["attempt"] == 1
    })
    .await;
    clock.advance(1_000);
    let run = api.wait_run(&flaky, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "failed", "{run}");
    clock.advance(59_000);

    let m = scrape(&d).await;
    let t = ("tenant", "default");
    // Gauges read from the store: what waits, and for how long.
    assert_eq!(
        must(
            &m,
            "wasq_runs",
            &[t, ("function", "later"), ("status", "queued")]
        ),
        2.0
    );
    assert_eq!(value(&m, "wasq_runs", &[t, ("function", "echo")]), None);
    assert_eq!(must(&m, "wasq_oldest_queued_run_age_seconds", &[t]), 60.0);
    assert_eq!(must(&m, "wasq_tenant_max_running", &[t]), 64.0);
    // Counters of this process.
    assert_eq!(
        must(&m, "wasq_attempts_total", &[t, ("outcome", "succeeded")]),
        4.0
    );
    assert_eq!(
        must(
            &m,
            "wasq_attempt_errors_total",
            &[t, ("reason", "retryable")]
        ),
        2.0
    );
    assert_eq!(must(&m, "wasq_retries_total", &[t]), 1.0);
    assert_eq!(must(&m, "wasq_egress_refused_total", &[t]), 2.0);
    // Histograms: every run ended at once by the store's clock (the first bucket), but
    // the retried one, a second after it was created.
    let ok = [t, ("status", "succeeded")];
    assert_eq!(must(&m, "wasq_run_duration_seconds_count", &ok), 4.0);
    assert_eq!(
        must(
            &m,
            "wasq_run_duration_seconds_bucket",
            &[t, ("status", "succeeded"), ("le", "0.001")]
        ),
        4.0
    );
    let failed = [t, ("status", "failed")];
    assert_eq!(must(&m, "wasq_run_duration_seconds_count", &failed), 1.0);
    assert_eq!(
        must(
            &m,
            "wasq_run_duration_seconds_bucket",
            &[t, ("status", "failed"), ("le", "0.5")]
        ),
        0.0
    );
    assert_eq!(
        must(
            &m,
            "wasq_run_duration_seconds_bucket",
            &[t, ("status", "failed"), ("le", "2.5")]
        ),
        1.0
    );
    assert_eq!(must(&m, "wasq_queue_wait_seconds_count", &[t]), 6.0);
    assert!(must(&m, "wasq_store_call_seconds_count", &[("call", "claim")]) >= 1.0);
    assert_eq!(must(&m, "wasq_worker_slots", &[]), 4.0);
    assert_eq!(must(&m, "wasq_worker_slots_in_use", &[]), 0.0);

    // A gauge whose runs are gone goes to 0, not stale.
    for id in &later {
        let (status, _) = api.post(&format!("/v1/runs/{id}/cancel"), "").await;
        assert_eq!(status, 200);
    }
    let m = scrape(&d).await;
    assert_eq!(
        must(
            &m,
            "wasq_runs",
            &[t, ("function", "later"), ("status", "queued")]
        ),
        0.0
    );
    assert_eq!(must(&m, "wasq_oldest_queued_run_age_seconds", &[t]), 0.0);

    // Cron ticks count; then every metric the dashboard and the alerts name is scraped.
    api.deploy("tick", guest("echo"), "cron=*%20*%20*%20*%20*%20*")
        .await;
    for _ in 0..3 {
        clock.advance(1_000);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&d).await;
        if value(&m, "wasq_cron_fires_total", &[t]).is_some_and(|n| n >= 1.0) {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no cron tick counted:\n{m}"
        );
        clock.advance(1_000);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let root = repo_root();
    for file in ["deploy/grafana/wasq.json", "deploy/prometheus/alerts.yml"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        if file.ends_with(".json") {
            let dash: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert!(dash["panels"].as_array().is_some_and(|p| p.len() >= 10));
        }
        let mut named = 0;
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let Some(name) = word.strip_prefix("wasq_") else {
                continue;
            };
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            let series = format!("wasq_{base}");
            assert!(
                m.lines().any(|l| l.starts_with(&format!("{series}{{"))
                    || l.starts_with(&format!("{series} "))
                    || l.starts_with(&format!("{series}_"))),
                "{file} names {series}, which /metrics does not have"
            );
            named += 1;
        }
        assert!(named >= 10, "{file}: {named} metrics");
    }
    d.stop().await;
}

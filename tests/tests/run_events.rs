//! Live run events (issue 15): `GET /v1/runs/{id}/events` read while the run executes in
//! another process on Redis, resumed with `Last-Event-ID`, and `wasq runs watch`.

use std::time::Duration;

use serde_json::Value;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::{Api, Daemon, DaemonProcess, guest, run_cli};

/// One event: (id, kind, data).
type Sse = (String, String, Value);

/// Reads the run's event stream (after `last_id`) until its `end`, or until the first
/// event of kind `stop` (then the connection is dropped).
async fn events(api: &Api, id: &str, last_id: Option<&str>, stop: Option<&str>) -> Vec<Sse> {
    let mut req = api.http.get(format!("{}/v1/runs/{id}/events", api.base));
    if let Some(last) = last_id {
        req = req.header("last-event-id", last);
    }
    let mut resp = req.send().await.expect("the stream opens");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let (mut out, mut buf) = (Vec::new(), String::new());
    let read = async {
        while let Some(chunk) = resp.chunk().await.expect("the stream reads") {
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(&format!("{name}:")))
                        .map(|v| v.trim_start().to_owned())
                };
                let Some(kind) = field("event") else { continue };
                let data = serde_json::from_str(&field("data").unwrap()).unwrap();
                let done = kind == "end" || stop == Some(kind.as_str());
                out.push((field("id").unwrap(), kind, data));
                if done {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the run ends within a minute");
    out
}

fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|(_, k, _)| k.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_of_a_run_on_another_process_arrive_in_order_and_resume() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    // The API server executes nothing: a `wasq worker` process does.
    let daemon = Daemon::api_on_redis(&url, |_| {}).await;
    let api = &daemon.api;
    api.deploy("watched", guest("watched"), "timeout_ms=10000")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let _worker = DaemonProcess::spawn(&[
        "worker",
        "--redis",
        &url,
        "--data",
        dir.path().join("w").to_str().unwrap(),
    ]);

    let id = api.start_run("watched", r#"{"pause_ms": 400}"#).await;
    let all = events(api, &id, None, None).await;
    // Queued, started, each step, the progress, the end; attempt_end and log lines between.
    let main: Vec<&str> = kinds(&all)
        .into_iter()
        .filter(|k| !matches!(*k, "log" | "attempt_end"))
        .collect();
    assert_eq!(
        main,
        ["status", "attempt", "step", "step", "progress", "end"],
        "{all:#?}"
    );
    assert_eq!(all[0].2["status"], "queued");
    let steps: Vec<&Value> = all
        .iter()
        .filter(|(_, k, _)| k == "step")
        .map(|(_, _, d)| &d["name"])
        .collect();
    assert_eq!(steps, ["one", "two"]);
    let progress = all.iter().find(|(_, k, _)| k == "progress").unwrap();
    assert_eq!(
        (
            progress.2["percent"].as_u64(),
            progress.2["message"].as_str()
        ),
        (Some(100), Some("done"))
    );
    let end = &all.last().unwrap().2;
    assert_eq!(end["status"], "succeeded", "{end}");
    // The soft deadline: what the attempt had left of its 10 s.
    let left = end["output"]["left"].as_u64().unwrap();
    assert!((1..=10_000).contains(&left), "time left {left} ms of 10 s");
    let logs: Vec<&str> = all
        .iter()
        .filter(|(_, k, _)| k == "log")
        .map(|(_, _, d)| d["message"].as_str().unwrap())
        .collect();
    assert_eq!(logs, ["step one ran", "step two ran"]);

    // Resuming: read a second run's stream up to its first step, drop it, reconnect with
    // that event's id: the rest comes, nothing missed, nothing twice.
    let id = api.start_run("watched", r#"{"pause_ms": 400}"#).await;
    let first = events(api, &id, None, Some("step")).await;
    assert_eq!(first.last().unwrap().2["name"], "one", "{first:#?}");
    let rest = events(api, &id, Some(&first.last().unwrap().0), None).await;
    let both: Vec<&Sse> = first.iter().chain(&rest).collect();
    let named = |kind: &str, field: &str| -> Vec<String> {
        both.iter()
            .filter(|(_, k, _)| k == kind)
            .map(|(_, _, d)| d[field].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        named("step", "name"),
        ["one", "two"],
        "{first:#?} {rest:#?}"
    );
    assert_eq!(named("log", "message"), ["step one ran", "step two ran"]);
    assert_eq!(named("attempt", "worker").len(), 1);
    assert_eq!(named("attempt_end", "worker").len(), 1);
    // Ids only grow.
    let ids: Vec<Vec<u64>> = both
        .iter()
        .map(|(id, _, _)| id.split('.').map(|n| n.parse().unwrap()).collect())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
    assert_eq!(rest.last().unwrap().2["status"], "succeeded");

    // A bad Last-Event-ID is refused; an unknown run is 404.
    let resp = api
        .http
        .get(format!("{}/v1/runs/{id}/events", api.base))
        .header("last-event-id", "nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let (status, _) = api.get("/v1/runs/0000/events").await;
    assert_eq!(status, 404);

    // `wasq runs watch` prints the same events and exits 0 with the output.
    let id = api.start_run("watched", r#"{"pause_ms": 100}"#).await;
    let (code, out, err) = run_cli(api.cli().args(["runs", "watch", &id]));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "queued (attempt 0)", "{out}");
    assert!(
        lines.iter().any(|l| l.starts_with("attempt 1 started on ")),
        "{out}"
    );
    assert!(
        lines.contains(&"step one done") && lines.contains(&"step two done"),
        "{out}"
    );
    assert!(lines.contains(&"progress 100%: done"), "{out}");
    assert!(lines.contains(&"[info] step one ran"), "{out}");
    assert!(out.contains("\"left\""), "the output last: {out}");
    daemon.stop().await;
}

/// A tenant may hold `max_event_streams_per_tenant` streams open on a server: the next is
/// refused with 429 and another tenant is not; a closed stream gives its room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_s_event_streams_are_capped() {
    let daemon = Daemon::start_with(|c| {
        c.concurrency = 0;
        c.http.max_event_streams_per_tenant = 2;
    })
    .await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    // Due in an hour: its stream stays open.
    let (_, run) = api.post("/v1/functions/echo/runs?delay=1h", "{}").await;
    let id = run["id"].as_str().unwrap().to_owned();
    let open = |api: &Api| {
        api.http
            .get(format!("{}/v1/runs/{id}/events", api.base))
            .send()
    };
    let first = open(api).await.unwrap();
    let second = open(api).await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = open(api).await.unwrap();
    assert_eq!(third.status(), 429);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");

    // Another tenant has room of its own (its run is not ours: 404 after the room check
    // would be wrong, so it watches a run of its own).
    let other = daemon.admin.new_tenant("other").await;
    other.deploy("echo", guest("echo"), "").await;
    let (_, theirs) = other.post("/v1/functions/echo/runs?delay=1h", "{}").await;
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    let resp = other
        .http
        .get(format!("{}/v1/runs/{theirs}/events", other.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // A client that goes away gives its room back.
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = open(api).await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the closed stream's room never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopping the server ends the streams still open (their clients reconnect, to
    // another server, with their Last-Event-ID).
    tokio::time::timeout(Duration::from_secs(20), daemon.stop())
        .await
        .expect("the daemon stops while streams are open");
    drop((second, resp));
}

//! The tenant-wide event stream (issue 15): `GET /v1/runs:events` with filters, fed by
//! runs a worker process executes on Redis, resumed with `Last-Event-ID` without gaps or
//! repeats; `wasq runs follow`.

use std::time::Duration;

use serde_json::Value;
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::*;

/// An open stream, read a `run` event at a time: (id, data).
struct Stream {
    resp: reqwest::Response,
    buf: String,
}

impl Stream {
    async fn open(api: &Api, query: &str, last_id: Option<&str>) -> Stream {
        let mut req = api.http.get(format!("{}/v1/runs:events{query}", api.base));
        if let Some(last) = last_id {
            req = req.header("last-event-id", last);
        }
        let resp = req.send().await.expect("the stream opens");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Stream {
            resp,
            buf: String::new(),
        }
    }

    /// The next `n` run events, within `within`.
    async fn take(&mut self, n: usize, within: Duration) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        let read = async {
            while out.len() < n {
                while let Some(end) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..end + 2).collect();
                    let (mut id, mut kind, mut data) = (None, None, String::new());
                    for line in block.lines() {
                        let (f, v) = line.split_once(": ").unwrap_or((line, ""));
                        match f {
                            "id" => id = Some(v.to_owned()),
                            "event" => kind = Some(v.to_owned()),
                            "data" => data.push_str(v),
                            _ => {}
                        }
                    }
                    if kind.as_deref() == Some("run") {
                        out.push((id.unwrap(), serde_json::from_str(&data).unwrap()));
                        if out.len() == n {
                            return;
                        }
                    }
                }
                match self.resp.chunk().await.expect("the stream reads") {
                    Some(chunk) => self.buf.push_str(std::str::from_utf8(&chunk).unwrap()),
                    None => return,
                }
            }
        };
        let _ = tokio::time::timeout(within, read).await;
        assert_eq!(out.len(), n, "{n} events within {within:?}: {out:?}");
        out
    }
}

fn changes(events: &[(String, Value)]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|(_, d)| {
            (
                d["id"].as_str().unwrap().to_owned(),
                d["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Each run's changes, in order.
fn per_run(events: &[(String, Value)], id: &str) -> Vec<String> {
    changes(events)
        .into_iter()
        .filter(|(r, _)| r == id)
        .map(|(_, s)| s)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_stream_sees_every_change_of_a_worker_s_runs_and_resumes() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let daemon = Daemon::api_on_redis(&url, |_| {}).await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), "").await;
    api.deploy("other", guest("echo"), "").await;
    let dir = tempfile::tempdir().unwrap();
    let _worker = spawn_worker(&url, dir.path(), "worker", &[]);
    let mut all = Stream::open(api, "?function=echo", None).await;
    let mut ended = Stream::open(api, "?status=succeeded", None).await;
    let a = api.start_run("echo", r#"{"n": 1}"#).await;
    let b = api.start_run("echo", r#"{"n": 2}"#).await;
    let o = api.start_run("other", "{}").await;
    let seen = all.take(6, Duration::from_secs(30)).await;
    for id in [&a, &b] {
        assert_eq!(
            per_run(&seen, id),
            ["queued", "running", "succeeded"],
            "{seen:?}"
        );
    }
    assert!(per_run(&seen, &o).is_empty(), "filtered by function");
    let done = ended.take(3, Duration::from_secs(30)).await;
    assert!(done.iter().all(|(_, d)| d["status"] == "succeeded"));
    let mut ids: Vec<String> = changes(&done).into_iter().map(|(r, _)| r).collect();
    ids.sort();
    let mut want = vec![a.clone(), b.clone(), o.clone()];
    want.sort();
    assert_eq!(ids, want);

    // Disconnected, then resumed from the last event seen: the changes made meanwhile
    // arrive, none twice.
    let last = seen.last().unwrap().0.clone();
    drop(all);
    let c = api.start_run("echo", r#"{"n": 3}"#).await;
    api.wait_run(&c, Duration::from_secs(30)).await;
    let mut again = Stream::open(api, "?function=echo", Some(&last)).await;
    let resumed = again.take(3, Duration::from_secs(30)).await;
    assert_eq!(changes(&resumed).iter().filter(|(r, _)| *r == c).count(), 3);
    assert_eq!(per_run(&resumed, &c), ["queued", "running", "succeeded"]);

    // Bad filters and cursors are refused with a reason.
    for (q, code) in [
        ("?status=done", "bad_query"),
        ("?function=a%20b", "bad_name"),
        ("?x=1", "bad_query"),
    ] {
        let (status, body) = api.get(&format!("/v1/runs:events{q}")).await;
        assert_eq!(status, 400, "{q}: {body}");
        assert_eq!(body["error"]["code"], code, "{q}: {body}");
    }
    let resp = api
        .http
        .get(format!("{}/v1/runs:events", api.base))
        .header("last-event-id", "../x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    // The CLI follows the same stream.
    let mut follow = api
        .cli()
        .args(["runs", "follow", "--function", "echo", "--output", "json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let d = api.start_run("echo", r#"{"n": 4}"#).await;
    api.wait_run(&d, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    follow.kill().unwrap();
    let out = follow.wait_with_output().unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let statuses: Vec<&str> = lines
        .iter()
        .filter(|l| l["id"] == d.as_str())
        .map(|l| l["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["queued", "running", "succeeded"], "{lines:?}");
    daemon.stop().await;
}

//! Signed webhooks (issue 15): a function's `notify` URLs get one POST per ended run,
//! signed per Standard Webhooks with the tenant's secret (verified here as a receiver
//! would), retried on core's schedule until the receiver answers 2xx, recorded in the
//! run; added by the process that saw the end (a worker process on Redis) and sent by a
//! server, through the egress guard (loopback only with the test switch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::*;

/// One POST a [`Receiver`] got.
#[derive(Debug, Clone)]
struct Post {
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Post {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers))
    }

    /// Verifies the signature as the Standard Webhooks libraries do.
    fn verify(&self, secret: &str) {
        let key = B64
            .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
            .unwrap();
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).unwrap();
        mac.update(
            format!(
                "{}.{}.",
                self.header("webhook-id"),
                self.header("webhook-timestamp")
            )
            .as_bytes(),
        );
        mac.update(&self.body);
        let expected = format!("v1,{}", B64.encode(mac.finalize().into_bytes()));
        let given = self.header("webhook-signature");
        assert!(
            given.split(' ').any(|s| s == expected),
            "bad signature {given} (expected {expected})"
        );
    }
}

/// A receiver on loopback: `/ok` answers 200; `/flaky` answers 500 to the first two
/// tries of each webhook id, then 200. Records every request.
#[derive(Clone)]
struct Receiver {
    addr: std::net::SocketAddr,
    posts: Arc<Mutex<Vec<Post>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Receiver {
            addr: listener.local_addr().unwrap(),
            posts: Default::default(),
        };
        let posts = r.posts.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let posts = posts.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut lines = head.lines();
                    let path = lines
                        .next()
                        .and_then(|l| l.split(' ').nth(1))
                        .unwrap_or("")
                        .to_owned();
                    let headers: HashMap<String, String> = lines
                        .filter_map(|l| l.split_once(':'))
                        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                        .collect();
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let post = Post {
                        path: path.clone(),
                        headers,
                        body: buf[head_end..head_end + len].to_vec(),
                    };
                    let status = {
                        let mut all = posts.lock().unwrap();
                        let id = post.headers.get("webhook-id").cloned();
                        let before = all
                            .iter()
                            .filter(|p| {
                                p.path == path && p.headers.get("webhook-id") == id.as_ref()
                            })
                            .count();
                        all.push(post);
                        if path == "/flaky" && before < 2 {
                            500
                        } else {
                            200
                        }
                    };
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn posts(&self, path: &str) -> Vec<Post> {
        let all = self.posts.lock().unwrap();
        all.iter().filter(|p| p.path == path).cloned().collect()
    }

    async fn wait_for(&self, path: &str, n: usize, within: Duration) -> Vec<Post> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let got = self.posts(path);
            if got.len() >= n {
                return got;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path}: {} of {n} posts within {within:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn secret(api: &Api) -> String {
    let (status, body) = api.get("/v1/webhooks/secret").await;
    assert_eq!(status, 200, "{body}");
    body["secret"].as_str().unwrap().to_owned()
}

fn notify_query(urls: &[String]) -> String {
    let list: Vec<String> = urls
        .iter()
        .map(|u| u.replace(':', "%3A").replace('/', "%2F"))
        .collect();
    format!("notify={}", list.join(","))
}

/// On the embedded store with the clock in the test's hands: every ended run gets exactly
/// one signed POST per URL; a receiver that fails twice gets it on the third try, 5 s and
/// 30 s later; the run's record says how each went; a failed attempt and a cancel are
/// announced when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_ended_run_is_announced_once_signed_and_retried_until_delivered() {
    let receiver = Receiver::start().await;
    let clock = wasq_core::ManualClock::new(1_767_225_600_000);
    let c = clock.clone();
    let daemon = Daemon::start_with(move |config| {
        config.clock = Arc::new(c);
        config.sandbox.allow_loopback_egress = true;
    })
    .await;
    let api = &daemon.api;
    let secret = secret(api).await;
    let urls = [receiver.url("/ok"), receiver.url("/flaky")];
    let f = api
        .deploy("echo", guest("echo"), &notify_query(&urls))
        .await;
    assert_eq!(
        f["settings"]["notify"]["urls"],
        serde_json::json!(urls),
        "{f}"
    );

    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(api.start_run("echo", &format!("{{\"n\": {i}}}")).await);
    }
    for id in &ids {
        let run = api.wait_run(id, Duration::from_secs(30)).await;
        assert_eq!(run["status"], "succeeded", "{run}");
    }
    let ok = receiver.wait_for("/ok", 3, Duration::from_secs(20)).await;
    let mut announced: Vec<String> = ok
        .iter()
        .map(|p| {
            p.verify(&secret);
            let body = p.json();
            assert_eq!(body["type"], "run.succeeded", "{body}");
            assert_eq!(body["data"]["status"], "succeeded");
            assert_eq!(p.header("content-type"), "application/json");
            body["data"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    announced.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(announced, want, "one POST per ended run");
    let first_tries = receiver
        .wait_for("/flaky", 3, Duration::from_secs(20))
        .await;

    // The flaky receiver: 500, then again after 5 s, then 200 after 30 s more.
    clock.advance(5_000);
    receiver
        .wait_for("/flaky", 6, Duration::from_secs(20))
        .await;
    clock.advance(30_000);
    let flaky = receiver
        .wait_for("/flaky", 9, Duration::from_secs(20))
        .await;
    for p in &flaky {
        p.verify(&secret);
    }
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for p in &flaky {
        *per_id.entry(p.header("webhook-id").to_owned()).or_default() += 1;
    }
    assert_eq!(per_id.len(), 3, "{per_id:?}");
    assert!(
        per_id.values().all(|n| *n == 3),
        "three tries each: {per_id:?}"
    );
    assert_eq!(
        first_tries[0].body, flaky[0].body,
        "every try sends the same message"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.posts("/ok").len(), 3, "nothing delivered twice");
    assert_eq!(receiver.posts("/flaky").len(), 9);
    let detail = api.run_detail(&ids[0]).await;
    let d = detail["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("{detail}"));
    assert_eq!(d.len(), 2, "{detail}");
    assert_eq!(d[0]["status"], "delivered");
    assert_eq!(d[0]["tries"], 1);
    assert_eq!(d[1]["status"], "delivered");
    assert_eq!(d[1]["tries"], 3);
    assert_eq!(d[1]["last_error"], Value::Null);
    let (code, out, err) = run_cli(api.cli().args(["runs", "show", &ids[0]]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("WEBHOOK") && out.contains("delivered"),
        "{out}"
    );

    // A failing function asks for attempt failures too: one per failed attempt that is
    // retried, then its end; a cancelled run is announced.
    let q = format!(
        "{}&notify_attempts=true&max_attempts=2&initial_backoff_ms=1000&jitter=false",
        notify_query(&[receiver.url("/ok")])
    );
    api.deploy("fail", guest("fail"), &q).await;
    let failed = api
        .start_run(
            "fail",
            r#"{"kind": "retryable", "message": "card declined"}"#,
        )
        .await;
    receiver.wait_for("/ok", 4, Duration::from_secs(20)).await;
    clock.advance(2_000);
    let run = api.wait_run(&failed, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "failed", "{run}");
    let all = receiver.wait_for("/ok", 5, Duration::from_secs(20)).await;
    let types: Vec<String> = all[3..]
        .iter()
        .map(|p| p.json()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["run.attempt_failed", "run.failed"]);
    assert_eq!(all[3].json()["data"]["error"]["message"], "card declined");
    assert_eq!(all[3].json()["data"]["attempt"], 1);
    assert_eq!(all[4].json()["data"]["error"]["message"], "card declined");
    let (status, later) = api.post("/v1/functions/fail/runs?delay=1h", "{}").await;
    assert_eq!(status, 201, "{later}");
    let id = later["id"].as_str().unwrap();
    let (status, _) = api.post(&format!("/v1/runs/{id}/cancel"), "").await;
    assert_eq!(status, 200);
    let all = receiver.wait_for("/ok", 6, Duration::from_secs(20)).await;
    assert_eq!(all[5].json()["type"], "run.cancelled");
    daemon.stop().await;
}

/// On Redis, runs executed by a `wasq worker` process: the worker that saw each end adds
/// its delivery, the API server sends it, signed: exactly one POST per run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_process_on_redis_announces_each_run_once() {
    let receiver = Receiver::start().await;
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let daemon = Daemon::api_on_redis(&url, |c| c.sandbox.allow_loopback_egress = true).await;
    let api = &daemon.api;
    let secret = secret(api).await;
    api.deploy("echo", guest("echo"), &notify_query(&[receiver.url("/ok")]))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let _worker = spawn_worker(&url, dir.path(), "worker", &[]);
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(api.start_run("echo", &format!("{{\"n\": {i}}}")).await);
    }
    for id in &ids {
        api.wait_run(id, Duration::from_secs(60)).await;
    }
    let posts = receiver.wait_for("/ok", 10, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.posts("/ok").len(), 10, "exactly one per run");
    let mut seen: Vec<String> = posts
        .iter()
        .map(|p| {
            p.verify(&secret);
            p.json()["data"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);
    let d = api.run_detail(&ids[0]).await;
    assert_eq!(d["deliveries"][0]["status"], "delivered", "{d}");
    daemon.stop().await;
}

/// The egress guard applies: without the loopback switch a notify URL on loopback is
/// refused, and the refusal is on the run's record; bad URLs are refused at deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhooks_go_through_the_egress_guard() {
    let receiver = Receiver::start().await;
    let daemon = Daemon::start().await;
    let api = &daemon.api;
    api.deploy("echo", guest("echo"), &notify_query(&[receiver.url("/ok")]))
        .await;
    let id = api.start_run("echo", "{}").await;
    api.wait_run(&id, Duration::from_secs(30)).await;
    let d = api
        .wait_until(&id, Duration::from_secs(20), |d| {
            d["deliveries"][0]["tries"].as_u64().unwrap_or(0) >= 1
        })
        .await;
    let delivery = &d["deliveries"][0];
    assert_eq!(delivery["status"], "pending", "retried later: {d}");
    let error = delivery["last_error"].as_str().unwrap();
    assert!(error.contains("loopback"), "{error}");
    assert!(receiver.posts("/ok").is_empty());

    for (bad, why) in [
        ("ftp%3A%2F%2Fexample.com%2F", "https:// or http://"),
        ("https%3A%2F%2Fuser%3Apw%40example.com%2F", "user name"),
        ("https%3A%2F%2F0x7f.1%2F", "not a valid host name"),
        (
            "https%3A%2F%2Fa.com%2F,https%3A%2F%2Fb.com%2F,https%3A%2F%2Fc.com%2F,https%3A%2F%2Fd.com%2F,https%3A%2F%2Fe.com%2F",
            "at most 4",
        ),
    ] {
        let (status, body) = api
            .put(&format!("/v1/functions/x?notify={bad}"), guest("echo"))
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
        let m = body["error"]["message"].as_str().unwrap();
        assert!(m.starts_with("notify: ") && m.contains(why), "{bad}: {m}");
    }
    daemon.stop().await;
}

//! Outbound HTTP through the egress guard, end to end: the `fetch` guest sends requests
//! through wasi:http in the real daemon, to real servers on loopback. With the default
//! configuration every internal destination is refused before any connection is made;
//! with loopback allowed (as `wasq dev --allow-loopback-egress` does) allow-listed
//! requests work, and redirects, request floods, slow and huge responses stay bounded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wasq_tests::{Daemon, guest, repo_root, run_cli};

const WAIT: Duration = Duration::from_secs(60);

/// A small HTTP/1.1 server on loopback that records every connection and request path.
///
/// Paths: `/ok` (200 "hello"), `/redirect` (302 to `/secret`), `/secret` (must never be
/// requested), `/drip` (headers, then one byte every 2 s), `/silent` (never answers),
/// `/huge` (64 MiB), `/slow` (200 after 100 ms; tracks concurrency).
#[derive(Clone)]
struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    paths: Arc<Mutex<HashMap<String, usize>>>,
    open_slow: Arc<AtomicUsize>,
    max_slow: Arc<AtomicUsize>,
}

impl Server {
    async fn start(bind: &str) -> Option<Server> {
        let listener = TcpListener::bind(bind).await.ok()?;
        let server = Server {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
            paths: Arc::default(),
            open_slow: Arc::default(),
            max_slow: Arc::default(),
        };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(s.clone().serve(stream));
            }
        });
        Some(server)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self, path: &str) -> usize {
        self.paths.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let path = head.split(' ').nth(1).unwrap_or("").to_owned();
        *self.paths.lock().unwrap().entry(path.clone()).or_default() += 1;
        let simple = |status: &str, extra: &str, body: &str| {
            format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
                body.len()
            )
        };
        match path.as_str() {
            "/ok" => {
                let _ = stream
                    .write_all(simple("200 OK", "", "hello").as_bytes())
                    .await;
            }
            "/redirect" => {
                let location = format!("location: {}\r\n", self.url("/secret"));
                let _ = stream
                    .write_all(simple("302 Found", &location, "").as_bytes())
                    .await;
            }
            "/drip" => {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
                    .await;
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    if stream.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            }
            "/silent" => {
                tokio::time::sleep(Duration::from_secs(120)).await;
            }
            "/huge" => {
                let size = 64usize << 20;
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n");
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let block = vec![b'x'; 64 << 10];
                for _ in 0..size / block.len() {
                    if stream.write_all(&block).await.is_err() {
                        return;
                    }
                }
            }
            "/slow" => {
                let now = self.open_slow.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_slow.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.open_slow.fetch_sub(1, Ordering::SeqCst);
                let _ = stream
                    .write_all(simple("200 OK", "", "slow").as_bytes())
                    .await;
            }
            _ => {
                let _ = stream
                    .write_all(simple("404 Not Found", "", "").as_bytes())
                    .await;
            }
        }
        let _ = stream.shutdown().await;
    }
}

fn get(url: &str) -> Value {
    json!({ "url": url })
}

/// Runs `fetch` on `requests` and returns (the run, its results, how long it took).
async fn fetch(
    d: &Daemon,
    function: &str,
    requests: Vec<Value>,
    parallel: usize,
) -> (Value, Vec<Value>, Duration) {
    let started = Instant::now();
    let input = json!({ "requests": requests, "parallel": parallel });
    let id = d.api.start_run(function, &input.to_string()).await;
    let run = d.api.wait_run(&id, WAIT).await;
    let took = started.elapsed();
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let results = run["output"]["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), requests.len(), "{run:#}");
    (run, results, took)
}

async fn log_lines(d: &Daemon, run: &Value) -> Vec<String> {
    let logs = d.api.logs(run["id"].as_str().unwrap()).await;
    logs.iter()
        .map(|l| {
            format!(
                "{} {}",
                l["level"].as_str().unwrap_or(""),
                l["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn error(result: &Value) -> &str {
    result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error, got {result}"))
}

async fn neighbour_is_served(d: &Daemon) {
    let id = d.api.start_run("echo", r#"{"after":"egress"}"#).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(
        run["status"], "succeeded",
        "echo after the egress attacks: {run:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_config_refuses_every_internal_destination_before_connecting() {
    let v4 = Server::start("127.0.0.1:0").await.unwrap();
    let v6 = Server::start("[::1]:0").await;
    let port = v4.addr.port();
    let v6_port = v6.as_ref().map_or(port, |s| s.addr.port());

    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    // Every destination is allow-listed: the address check alone must refuse them.
    let allow = "127.0.0.1,[::1],169.254.169.254,10.0.0.1,[::ffff:127.0.0.1],0.0.0.0,localhost,\
                 [fd00:ec2::254],100.64.0.1";
    d.api
        .deploy(
            "fetch",
            guest("fetch"),
            &format!("max_attempts=1&allow_hosts={allow}"),
        )
        .await;
    d.api
        .deploy("fetch-none", guest("fetch"), "max_attempts=1")
        .await;

    let cases: Vec<(String, &str)> = vec![
        (
            format!("http://127.0.0.1:{port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            format!("http://[::1]:{v6_port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "DestinationIpProhibited",
        ),
        (
            "http://[fd00:ec2::254]/latest/meta-data/".into(),
            "DestinationIpProhibited",
        ),
        ("http://10.0.0.1/".into(), "DestinationIpProhibited"),
        ("http://100.64.0.1/".into(), "DestinationIpProhibited"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            format!("http://0.0.0.0:{port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            format!("http://localhost:{port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            format!("https://localhost:{port}/ok"),
            "DestinationIpProhibited",
        ),
        (
            format!("http://2130706433:{port}/ok"),
            "HttpRequestUriInvalid",
        ),
        (
            format!("http://0177.0.0.1:{port}/ok"),
            "HttpRequestUriInvalid",
        ),
        (format!("http://0x7f.1:{port}/ok"), "HttpRequestUriInvalid"),
        (format!("http://127.1:{port}/ok"), "HttpRequestUriInvalid"),
        (
            format!("http://user:pw@127.0.0.1:{port}/ok"),
            "HttpRequestUriInvalid",
        ),
        (
            format!("http://evil.example.com:{port}/ok"),
            "HttpRequestDenied",
        ),
        ("file:///etc/passwd".into(), "HttpProtocolError"),
        (format!("ftp://127.0.0.1:{port}/"), "HttpProtocolError"),
    ];
    let mut requests: Vec<Value> = cases.iter().map(|(u, _)| get(u)).collect();
    // Forbidden headers never leave the guest: the host refuses to build such fields.
    for (name, value) in [
        ("host", "metadata.google.internal"),
        ("x-forwarded-for", "10.0.0.1"),
        ("proxy-authorization", "Basic eA=="),
        ("transfer-encoding", "chunked"),
        ("connection", "upgrade"),
    ] {
        requests.push(json!({
            "url": format!("http://127.0.0.1:{port}/ok"),
            "headers": [[name, value]],
        }));
    }
    let (run, results, took) = fetch(&d, "fetch", requests, 1).await;
    for (i, (url, want)) in cases.iter().enumerate() {
        let got = error(&results[i]);
        assert!(got.contains(want), "{url}: want {want}, got {got}");
    }
    for r in &results[cases.len()..] {
        let got = error(r);
        assert!(got.contains("Forbidden"), "forbidden header: {got}");
        assert_eq!(r["kind"], "Invalid", "{r}");
    }
    assert!(took < Duration::from_secs(20), "{took:?}");

    // Users can see why: warn lines in the run's log.
    let logs = log_lines(&d, &run).await;
    for needle in [
        "refused: 127.0.0.1 is a loopback address",
        "refused: localhost resolves to 127.0.0.1, a loopback address",
        "169.254.169.254 is a link-local address",
        "10.0.0.1 is a private address",
        "100.64.0.1 is a carrier-grade NAT address",
        "a unique local address",
        "::ffff:127.0.0.1 is a loopback address",
        "\"this network\" address",
        "\"2130706433\" is not a valid host name",
        "evil.example.com is not in the function's allow_hosts",
        "only http and https URLs are allowed",
    ] {
        assert!(
            logs.iter()
                .any(|l| l.starts_with("warn") && l.contains(needle)),
            "no warn line with {needle:?} in {logs:#?}"
        );
    }

    // No allow-list: no outbound HTTP at all, even to a public-looking name.
    let (run, results, _) = fetch(
        &d,
        "fetch-none",
        vec![get("https://example.com/"), get(&v4.url("/ok"))],
        1,
    )
    .await;
    for r in &results {
        assert!(error(r).contains("HttpRequestDenied"), "{r}");
        assert_eq!(r["kind"], "Refused", "{r}");
    }
    let logs = log_lines(&d, &run).await;
    assert!(
        logs.iter()
            .any(|l| l.contains("may not make outbound HTTP requests")),
        "{logs:#?}"
    );

    // Nothing ever reached the listeners.
    assert_eq!(v4.connections.load(Ordering::SeqCst), 0, "{:?}", v4.paths);
    if let Some(v6) = &v6 {
        assert_eq!(v6.connections.load(Ordering::SeqCst), 0);
    }

    // Patterns that are not hosts are refused at deploy, and nothing is stored.
    for bad in [
        "2130706433",
        "0177.0.0.1",
        "*",
        "http://example.com",
        "example.com:8080",
        "a.*.com",
        "exa%20mple.com",
    ] {
        let (status, body) = d
            .api
            .put(
                &format!("/v1/functions/bad?allow_hosts={bad}"),
                guest("fetch"),
            )
            .await;
        assert_eq!(status, 400, "allow_hosts={bad}: {body}");
        assert!(body.to_string().contains("allow_hosts"), "{body}");
    }
    let (status, _) = d.api.get("/v1/functions/bad").await;
    assert_eq!(status, 404);

    // The deploy stores the normalised list.
    let f = d
        .api
        .deploy(
            "fetch2",
            guest("fetch"),
            "allow_hosts=API.Example.com.,*.Example.org,::1",
        )
        .await;
    assert_eq!(
        f["settings"]["allow_hosts"],
        json!(["api.example.com", "*.example.org", "[::1]"])
    );

    neighbour_is_served(&d).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_egress_works_and_stays_bounded() {
    let server = Server::start("127.0.0.1:0").await.unwrap();
    let d = Daemon::start_with(|c| {
        c.sandbox.allow_loopback_egress = true;
        c.sandbox.egress.max_connect_timeout = Duration::from_secs(1);
        c.sandbox.egress.max_first_byte_timeout = Duration::from_secs(1);
        c.sandbox.egress.max_between_bytes_timeout = Duration::from_millis(500);
        c.sandbox.egress.max_response_body_bytes = 1 << 20;
        c.sandbox.egress.max_requests_per_attempt = 64;
        c.sandbox.egress.max_in_flight_per_attempt = 8;
    })
    .await;
    d.api.deploy("echo", guest("echo"), "").await;
    d.api
        .deploy(
            "fetch",
            guest("fetch"),
            "max_attempts=1&timeout_ms=30000&allow_hosts=127.0.0.1,localhost",
        )
        .await;

    // The positive path, by IP and by a name that resolves to loopback.
    let port = server.addr.port();
    let (_, results, _) = fetch(
        &d,
        "fetch",
        vec![
            get(&server.url("/ok")),
            get(&format!("http://localhost:{port}/ok")),
        ],
        1,
    )
    .await;
    for r in &results {
        assert_eq!(r["status"], 200, "{r}");
        assert_eq!(r["body"], "hello", "{r}");
    }
    assert_eq!(server.hits("/ok"), 2);

    // Loopback allowed changes nothing else: metadata, private, unspecified, and hosts
    // outside the allow-list stay refused.
    let (_, results, _) = fetch(
        &d,
        "fetch",
        vec![
            get("http://169.254.169.254/latest/meta-data/"),
            get("http://10.0.0.1/"),
            get(&format!("http://0.0.0.0:{port}/ok")),
            get(&format!("http://[::1]:{port}/ok")),
        ],
        1,
    )
    .await;
    for r in &results {
        let e = error(r);
        assert!(
            e.contains("HttpRequestDenied") || e.contains("DestinationIpProhibited"),
            "{r}"
        );
    }

    // A redirect comes back as it is; its target is never requested.
    let (_, results, _) = fetch(&d, "fetch", vec![get(&server.url("/redirect"))], 1).await;
    assert_eq!(results[0]["status"], 302, "{}", results[0]);
    assert_eq!(results[0]["location"], server.url("/secret"));
    assert_eq!(server.hits("/redirect"), 1);
    assert_eq!(server.hits("/secret"), 0, "the redirect was followed");

    // Slow drip (a byte every 2 s against a 500 ms between-bytes clamp, though the guest
    // asks for a minute) and a server that never answers (1 s first-byte clamp).
    let (run, results, took) = fetch(
        &d,
        "fetch",
        vec![
            json!({ "url": server.url("/drip"), "timeout_ms": 60_000 }),
            json!({ "url": server.url("/silent"), "timeout_ms": 60_000 }),
        ],
        2,
    )
    .await;
    assert!(
        error(&results[0]).contains("read timeout"),
        "{}",
        results[0]
    );
    assert!(
        error(&results[1]).contains("ConnectionReadTimeout"),
        "{}",
        results[1]
    );
    assert!(
        took < Duration::from_secs(8),
        "the clamped timeouts fire promptly: {took:?}"
    );
    let logs = log_lines(&d, &run).await;
    assert!(
        logs.iter()
            .any(|l| l.contains("the response body stalled for 500ms")),
        "{logs:#?}"
    );
    assert!(
        logs.iter().any(|l| l.contains("no response within 1s")),
        "{logs:#?}"
    );

    // A 64 MiB response hits the 1 MiB body cap.
    let (run, results, took) = fetch(&d, "fetch", vec![get(&server.url("/huge"))], 1).await;
    assert!(error(&results[0]).contains("body size"), "{}", results[0]);
    assert!(took < Duration::from_secs(10), "{took:?}");
    let logs = log_lines(&d, &run).await;
    assert!(
        logs.iter()
            .any(|l| l.contains("the response body is over the limit of 1048576 bytes")),
        "{logs:#?}"
    );

    // 1,000 requests at once: 64 are let through (8 waiting for a response at a time), the rest
    // refused; the run and the daemon stay healthy, the log stays short.
    let requests: Vec<Value> = (0..1000).map(|_| get(&server.url("/slow"))).collect();
    let (run, results, took) = fetch(&d, "fetch", requests, 1000).await;
    let ok = results.iter().filter(|r| r["status"] == 200).count();
    let capped = results
        .iter()
        .filter(|r| {
            r["error"]
                .as_str()
                .is_some_and(|e| e.contains("ConnectionLimitReached"))
        })
        .count();
    assert_eq!((ok, capped), (64, 936), "{:?}", &results[..3]);
    assert_eq!(server.hits("/slow"), 64);
    let max = server.max_slow.load(Ordering::SeqCst);
    assert!(
        (1..=8).contains(&max),
        "at most 8 connections at once, saw {max}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    let logs = log_lines(&d, &run).await;
    assert!(logs.len() < 50, "{} log lines for 936 refusals", logs.len());
    assert!(
        logs.iter()
            .any(|l| l.contains("more than 64 outbound requests in one attempt")),
        "{logs:#?}"
    );

    // Afterwards, well-behaved runs on the same daemon still succeed.
    let before = server.hits("/ok");
    let (_, results, _) = fetch(&d, "fetch", vec![get(&server.url("/ok"))], 1).await;
    assert_eq!(results[0]["status"], 200);
    assert_eq!(server.hits("/ok"), before + 1);
    neighbour_is_served(&d).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_deploys_and_shows_the_allow_list() {
    let d = Daemon::start().await;
    guest("fetch");
    let file = repo_root().join("tests/guests/target/wasm32-wasip2/release/fetch.wasm");
    let file = file.to_str().unwrap();
    let (code, out, err) = run_cli(d.api.cli().args([
        "deploy",
        file,
        "--name",
        "fetch",
        "--allow-host",
        "API.example.com",
        "--allow-host",
        "*.example.org",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run_cli(d.api.cli().args(["functions", "show", "fetch"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("outbound HTTP to: api.example.com, *.example.org"),
        "{out}"
    );
    let (code, out, err) = run_cli(d.api.cli().args([
        "deploy",
        file,
        "--name",
        "sneaky",
        "--allow-host",
        "2130706433",
    ]));
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("allow_hosts"), "{err}");
    d.stop().await;
}

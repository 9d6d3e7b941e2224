//! Issue 10, finding 1: slow and idle connections must not exhaust the server. Each test
//! performs the attack on real sockets against the real daemon and shows it contained:
//! unfinished headers and idle keep-alive connections are cut at the header timeout, a
//! stalled body at the body timeout (while slow uploads and long-polls carry on), and a
//! flood of connections is refused at once over the per-address and total caps.
//!
//! Every test connection comes from loopback. Linux routes all of 127.0.0.0/8 to `lo`,
//! so the attackers bind 127.0.0.2, 127.0.0.3, ... and the health checks come from
//! 127.0.0.1: each cap is shown on its own. The figures are printed (`--nocapture`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use wasq_tests::{Daemon, guest};

/// A request line and half a header: the server can never finish parsing it.
const UNFINISHED: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nx-slow: ";

/// Room for the scheduler of a loaded 2-core machine around a timeout.
const SLACK: Duration = Duration::from_millis(1500);

/// The daemon's open-file limit is raised by the daemon itself; the attackers share this
/// process, so raise ours too (soft to hard) in case this test runs first.
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        )
        .expect("raise RLIMIT_NOFILE to its hard limit");
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|n| n >= 5000),
        "the tests need 5000 open files, the hard limit is {now:?}"
    );
}

fn addr(d: &Daemon) -> SocketAddr {
    d.api.base.trim_start_matches("http://").parse().unwrap()
}

/// 127.0.0.`n`.
fn lo(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A connection from `from` (bound before connecting).
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::V4(SocketAddrV4::new(from, 0)))
        .unwrap();
    socket.connect(to).await.expect("connect")
}

/// A connection from `from` that has sent half a request.
async fn unfinished_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let mut s = connect_from(from, to).await;
    s.write_all(UNFINISHED).await.unwrap();
    s
}

/// Reads until the server closes; what it sent before (a reset counts as a close).
async fn until_closed(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open for {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One HTTP/1.1 response read off `s`: (status, head, body).
async fn read_response(s: &mut TcpStream, within: Duration) -> (u16, String, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = got[head_end..].to_vec();
    while body.len() < length {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("the body in time")
            .expect("read");
        assert!(n > 0, "closed within the body");
        body.extend_from_slice(&buf[..n]);
    }
    (status, head, body)
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(body)))
}

/// `GET /healthz` on a new connection from `from`: (status, time to the whole response).
async fn healthz_from(from: Ipv4Addr, to: SocketAddr) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = connect_from(from, to).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let (status, _, _) = read_response(&mut s, Duration::from_secs(5)).await;
    (status, started.elapsed())
}

/// A connection from `from` that the server refuses: asserts the 503 and the close;
/// returns the time from connect to close.
async fn refused_from(from: Ipv4Addr, to: SocketAddr, code: &str) -> Duration {
    let started = Instant::now();
    let mut s = connect_from(from, to).await;
    let got = until_closed(&mut s, Duration::from_secs(5)).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(json(body.as_bytes())["error"]["code"], code, "{text}");
    took
}

/// Spawns a reader per connection that reports when the server closed it, counted from
/// when it was opened.
fn watch_closes(conns: Vec<(TcpStream, Instant)>) -> Vec<tokio::task::JoinHandle<Duration>> {
    conns
        .into_iter()
        .map(|(mut s, opened)| {
            tokio::spawn(async move {
                until_closed(&mut s, Duration::from_secs(60)).await;
                opened.elapsed()
            })
        })
        .collect()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_unfinished_requests_neither_block_the_api_nor_stay_open() {
    raise_open_file_limit();
    let header_timeout = Duration::from_secs(3);
    let d = Daemon::start_with(|c| c.http.header_timeout = header_timeout).await;
    let to = addr(&d);

    // 2,000 slowloris connections from ten addresses, 200 each: under the per-address cap,
    // so every one is accepted and held by the server.
    let started = Instant::now();
    let mut conns = Vec::new();
    for i in 0..2000 {
        // Taken before connecting: the server's timer cannot have started earlier.
        let opened = Instant::now();
        let s = unfinished_from(lo(2 + (i % 10) as u8), to).await;
        conns.push((s, opened));
    }
    let opening = started.elapsed();
    println!("opened 2000 unfinished connections in {}", ms(opening));
    let closes = watch_closes(conns);

    let mut latencies = Vec::new();
    for _ in 0..20 {
        let (status, took) = healthz_from(lo(1), to).await;
        assert_eq!(status, 200);
        latencies.push(took);
    }
    let held_for = started.elapsed();
    assert!(
        held_for < header_timeout,
        "the health checks ran after the first connections could time out ({held_for:?}): the test proves nothing"
    );
    assert!(
        closes.iter().all(|c| !c.is_finished()),
        "a connection closed before the header timeout"
    );
    latencies.sort();
    let worst = *latencies.last().unwrap();
    println!(
        "/healthz with 2000 unfinished connections held: median {}, worst {} (20 requests, each on a new connection)",
        ms(latencies[latencies.len() / 2]),
        ms(worst)
    );
    assert!(
        worst < Duration::from_millis(100),
        "/healthz took {worst:?}"
    );

    let mut closed_after = Vec::new();
    for c in closes {
        closed_after.push(c.await.unwrap());
    }
    closed_after.sort();
    let (first, last) = (closed_after[0], *closed_after.last().unwrap());
    println!(
        "the server closed all 2000 after {} to {} (header timeout {header_timeout:?})",
        ms(first),
        ms(last)
    );
    assert!(
        first >= header_timeout,
        "closed before the header timeout: {first:?}"
    );
    assert!(
        last <= header_timeout + SLACK,
        "still open {last:?} after being opened"
    );
    let (status, _) = healthz_from(lo(2), to).await;
    assert_eq!(status, 200, "the attackers' addresses are served again");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_over_its_cap_is_refused_at_once_while_others_are_served() {
    raise_open_file_limit();
    let header_timeout = Duration::from_secs(3);
    let d = Daemon::start_with(|c| {
        c.http.max_connections_per_ip = 50;
        c.http.header_timeout = header_timeout;
    })
    .await;
    let to = addr(&d);

    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(unfinished_from(lo(2), to).await);
    }
    let mut refusals = Vec::new();
    for _ in 0..20 {
        refusals.push(refused_from(lo(2), to, "too_many_connections").await);
    }
    refusals.sort();
    let worst = *refusals.last().unwrap();
    println!(
        "per-address cap 50: connection 51+ from 127.0.0.2 answered 503 and closed in median {}, worst {} (from connect)",
        us(refusals[refusals.len() / 2]),
        us(worst)
    );
    assert!(worst < Duration::from_millis(100), "refusal took {worst:?}");

    let (status, took) = healthz_from(lo(3), to).await;
    assert_eq!(status, 200, "another address is served");
    println!("meanwhile 127.0.0.3 is served in {}", ms(took));

    // A closed connection gives its place back.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect_from(lo(2), to).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = until_closed(&mut s, Duration::from_secs(5)).await;
        if got.starts_with(b"HTTP/1.1 200 ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed connection's place was not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Shutdown waits for requests in flight, not for connections that never finish one:
    // those still go at the header timeout.
    let stopping = Instant::now();
    d.stop().await;
    let took = stopping.elapsed();
    println!(
        "shutdown with {} unfinished connections held took {}",
        held.len(),
        ms(took)
    );
    assert!(took <= header_timeout + SLACK, "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_total_cap_are_refused_at_once() {
    raise_open_file_limit();
    let d = Daemon::start_with(|c| c.http.max_connections = 100).await;
    let to = addr(&d);

    // 100 from four addresses, 25 each: well under the per-address cap.
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(unfinished_from(lo(2 + (i % 4) as u8), to).await);
    }
    let mut refusals = Vec::new();
    for i in 0..20 {
        // Fresh addresses: only the total cap can refuse them.
        refusals.push(refused_from(lo(10 + i), to, "too_many_connections").await);
    }
    refusals.sort();
    let worst = *refusals.last().unwrap();
    println!(
        "total cap 100: connection 101+ answered 503 and closed in median {}, worst {} (from connect)",
        us(refusals[refusals.len() / 2]),
        us(worst)
    );
    assert!(worst < Duration::from_millis(100), "refusal took {worst:?}");

    held.truncate(90);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect_from(lo(1), to).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        if until_closed(&mut s, Duration::from_secs(5))
            .await
            .starts_with(b"HTTP/1.1 200 ")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "closed places were not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.stop().await;
}

/// Sends `head` then `body` in `chunks` pieces `pause` apart; returns the response.
async fn send_slowly(
    to: SocketAddr,
    head: String,
    body: &[u8],
    chunks: usize,
    pause: Duration,
) -> (u16, Value) {
    let mut s = connect_from(lo(1), to).await;
    s.write_all(head.as_bytes()).await.unwrap();
    for piece in body.chunks(body.len().div_ceil(chunks)) {
        tokio::time::sleep(pause).await;
        s.write_all(piece).await.unwrap();
    }
    let (status, _, body) = read_response(&mut s, Duration::from_secs(60)).await;
    (status, json(&body))
}

/// `component` with a custom section of `size` bytes appended (ignored by the compiler).
fn with_custom_section(mut component: Vec<u8>, size: usize) -> Vec<u8> {
    let name = b"padding";
    let mut content = vec![name.len() as u8];
    content.extend_from_slice(name);
    content.resize(content.len() + size, 0);
    component.push(0); // custom section id
    let mut len = content.len();
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            component.push(byte);
            break;
        }
        component.push(byte | 0x80);
    }
    component.extend_from_slice(&content);
    component
}

/// A request whose body stops after a few bytes: answered 408 and closed at the body
/// timeout, counted from the last byte.
async fn stalled(to: SocketAddr, method: &str, path: &str, key: &str) -> Duration {
    let mut s = connect_from(lo(1), to).await;
    // Taken before sending: the server's timer cannot have started earlier.
    let last_byte = Instant::now();
    s.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nhost: wasq\r\nauthorization: Bearer {key}\r\n\
             content-length: 100000\r\n\r\n0123456789"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (status, head, body) = read_response(&mut s, Duration::from_secs(30)).await;
    let took = last_byte.elapsed();
    assert_eq!(
        status,
        408,
        "{method} {path}: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(json(&body)["error"]["code"], "body_timeout");
    assert!(head.contains("connection: close"), "{head}");
    until_closed(&mut s, Duration::from_secs(5)).await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_times_out_but_slow_uploads_and_long_polls_do_not() {
    raise_open_file_limit();
    let body_timeout = Duration::from_secs(2);
    let d = Daemon::start_with(|c| c.http.body_timeout = body_timeout).await;
    let to = addr(&d);
    let key = d.api.key.clone().unwrap();

    let (upload, run) = tokio::join!(
        stalled(to, "PUT", "/v1/functions/stalled", &key),
        stalled(to, "POST", "/v1/functions/stalled/runs", &key),
    );
    println!(
        "stalled bodies answered 408 and closed {} (upload) and {} (run input) after their last byte (body timeout {body_timeout:?})",
        ms(upload),
        ms(run)
    );
    for took in [upload, run] {
        assert!(
            took >= body_timeout && took <= body_timeout + SLACK,
            "{took:?}"
        );
    }
    let (status, _) = d.api.get("/v1/functions/stalled").await;
    assert_eq!(status, 404, "nothing of the stalled upload is stored");

    // A real component in ten pieces, 600 ms apart: 6 s in all, three body timeouts.
    let component = guest("echo");
    let started = Instant::now();
    let (status, body) = send_slowly(
        to,
        format!(
            "PUT /v1/functions/slow-echo HTTP/1.1\r\nhost: wasq\r\nauthorization: Bearer {key}\r\n\
             content-length: {}\r\n\r\n",
            component.len()
        ),
        &component,
        10,
        Duration::from_millis(600),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 201, "{body}");
    println!(
        "a {}-byte component sent in 10 pieces 600 ms apart deployed after {}",
        component.len(),
        ms(took)
    );
    assert!(took > body_timeout * 2);
    let (status, run) = d
        .api
        .post("/v1/functions/slow-echo/runs?wait=30s", r#"{"slow":true}"#)
        .await;
    assert_eq!(
        (status, &run["output"]),
        (200, &serde_json::json!({"slow": true})),
        "{run}"
    );

    // A component near the 64 MiB limit (echo with a 60 MiB custom section) at full speed.
    let big = with_custom_section(guest("echo"), 60 << 20);
    let started = Instant::now();
    let (status, body) = d.api.put("/v1/functions/big-echo", big.clone()).await;
    assert_eq!(status, 201, "{body}");
    println!(
        "a {} MiB component uploaded and deployed in {}",
        big.len() >> 20,
        ms(started.elapsed())
    );

    // A long-poll sends no bytes while it waits: longer than the body timeout is fine.
    d.api.deploy("sleeper", guest("sleeper"), "").await;
    let started = Instant::now();
    let (status, run) = d
        .api
        .post(
            "/v1/functions/sleeper/runs?wait=30s",
            r#"{"sleep_ms":3500}"#,
        )
        .await;
    let took = started.elapsed();
    assert_eq!(
        (status, run["status"].as_str()),
        (200, Some("succeeded")),
        "{run}"
    );
    assert!(took > body_timeout, "{took:?}");
    println!(
        "a ?wait= long-poll answered after {} with the output",
        ms(took)
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_the_header_timeout() {
    raise_open_file_limit();
    let header_timeout = Duration::from_secs(2);
    let d = Daemon::start_with(|c| c.http.header_timeout = header_timeout).await;
    let to = addr(&d);

    let mut s = connect_from(lo(1), to).await;
    let request = b"GET /healthz HTTP/1.1\r\nhost: wasq\r\n\r\n";
    s.write_all(request).await.unwrap();
    let (status, _, _) = read_response(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status, 200);
    // Kept alive: a second request after a pause shorter than the timeout is served.
    tokio::time::sleep(header_timeout / 2).await;
    // Taken before the request: the server goes idle after answering it.
    let idle_from = Instant::now();
    s.write_all(request).await.unwrap();
    let (status, _, _) = read_response(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status, 200);
    until_closed(&mut s, header_timeout * 5).await;
    let idle = idle_from.elapsed();
    println!(
        "an idle keep-alive connection was closed {} after its last request (header timeout {header_timeout:?})",
        ms(idle)
    );
    assert!(
        idle >= header_timeout && idle <= header_timeout + SLACK,
        "{idle:?}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_over_64_kib_are_refused() {
    let d = Daemon::start().await;
    let to = addr(&d);

    let mut s = connect_from(lo(1), to).await;
    let mut request = b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nx-big: ".to_vec();
    request.resize(request.len() + 100 * 1024, b'a');
    s.write_all(&request).await.unwrap();
    let (status, _, _) = read_response(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status, 431, "headers past 64 KiB");
    until_closed(&mut s, Duration::from_secs(5)).await;

    // Just under the limit is fine.
    let mut s = connect_from(lo(1), to).await;
    let mut request = b"GET /healthz HTTP/1.1\r\nhost: wasq\r\nx-big: ".to_vec();
    request.resize(request.len() + 60 * 1024, b'a');
    request.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    s.write_all(&request).await.unwrap();
    let (status, _, _) = read_response(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status, 200);
    d.stop().await;
}

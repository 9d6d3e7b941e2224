//! Unit tests of the egress guard: every rule attacked, with a loopback server standing
//! in for the internet (over 600 lines: one scenario per rule, each reading on its own).

use std::sync::Mutex;

use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasq_core::{LogLine, Progress};

use super::*;
use crate::{Journal, JournalError};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn class(s: &str) -> Class {
    classify(ip(s))
}

fn forbidden(s: &str) -> bool {
    matches!(class(s), Class::Forbidden(_))
}

#[test]
fn ipv4_ranges() {
    for a in ["127.0.0.1", "127.255.255.254", "127.1.2.3"] {
        assert_eq!(class(a), Class::Loopback, "{a}");
    }
    for a in [
        "0.0.0.0",
        "0.255.255.255",
        "10.0.0.1",
        "10.255.255.255",
        "100.64.0.1",
        "100.127.255.255",
        "169.254.169.254",
        "169.254.0.1",
        "172.16.0.1",
        "172.31.255.255",
        "192.0.0.1",
        "192.0.0.170",
        "192.0.2.1",
        "192.88.99.1",
        "192.168.0.1",
        "192.168.255.255",
        "198.18.0.1",
        "198.19.255.255",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
    ] {
        assert!(forbidden(a), "{a} must be forbidden: {:?}", class(a));
    }
    for a in [
        "1.1.1.1",
        "8.8.8.8",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "169.253.255.255",
        "169.255.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.1",
        "192.167.255.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
    ] {
        assert_eq!(class(a), Class::Global, "{a}");
    }
}

#[test]
fn ipv6_ranges() {
    assert_eq!(class("::1"), Class::Loopback);
    for a in [
        "::",
        "::2",
        "::127.0.0.1",
        "::8.8.8.8",
        "fc00::1",
        "fd00:ec2::254",
        "fdff:ffff::1",
        "fe80::1",
        "febf::1",
        "fec0::1",
        "ff02::1",
        "ff0e::1",
        "2001:db8::1",
        "2001::1",
        "2001:2::1",
        "100::1",
        "3fff::1",
        "5f00::1",
        "64:ff9b:1::1",
        "4000::1",
        "1::1",
        "e000::1",
    ] {
        assert!(forbidden(a), "{a} must be forbidden: {:?}", class(a));
    }
    for a in [
        "2606:4700:4700::1111",
        "2a00:1450:4001:81b::200e",
        "2400::1",
    ] {
        assert_eq!(class(a), Class::Global, "{a}");
    }
}

#[test]
fn ipv6_forms_that_embed_ipv4_are_judged_by_the_ipv4_address() {
    // IPv4-mapped: the address itself to a dual-stack socket.
    assert_eq!(class("::ffff:127.0.0.1"), Class::Loopback);
    assert_eq!(class("::ffff:7f00:1"), Class::Loopback);
    for a in [
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "::ffff:0.0.0.0",
        "::ffff:192.168.1.1",
        "::ffff:100.64.0.1",
    ] {
        assert!(forbidden(a), "{a}: {:?}", class(a));
    }
    assert_eq!(class("::ffff:8.8.8.8"), Class::Global);
    // NAT64: loopback behind a translator is not this host's loopback: forbidden always.
    for a in [
        "64:ff9b::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::10.1.2.3",
        "64:ff9b::0.0.0.0",
    ] {
        assert!(forbidden(a), "{a}: {:?}", class(a));
    }
    assert_eq!(class("64:ff9b::8.8.8.8"), Class::Global);
    // 6to4: the IPv4 address in bits 16..48.
    assert!(forbidden("2002:7f00:1::1"));
    assert!(forbidden("2002:a9fe:a9fe::1"));
    assert!(forbidden("2002:c0a8:101::1"));
    assert_eq!(class("2002:808:808::1"), Class::Global);
    // IPv4-compatible (deprecated): refused whatever it embeds.
    assert!(forbidden("::169.254.169.254"));
    assert!(forbidden("::1.1.1.1"));
}

#[test]
fn loopback_passes_only_when_allowed() {
    assert_eq!(check_address(ip("127.0.0.1"), true), Ok(()));
    assert_eq!(check_address(ip("::1"), true), Ok(()));
    assert_eq!(check_address(ip("::ffff:127.0.0.1"), true), Ok(()));
    assert!(check_address(ip("127.0.0.1"), false).is_err());
    assert!(check_address(ip("::1"), false).is_err());
    for a in [
        "169.254.169.254",
        "10.0.0.1",
        "0.0.0.0",
        "::",
        "64:ff9b::127.0.0.1",
    ] {
        assert!(check_address(ip(a), true).is_err(), "{a}");
    }
}

#[test]
fn every_resolved_address_must_pass() {
    let name = Host::Name("mixed.example.com".into());
    let sa = |s: &str| SocketAddr::new(ip(s), 443);
    assert_eq!(
        check_addresses(&name, &[sa("8.8.8.8"), sa("1.1.1.1")], false),
        Ok(())
    );
    let err = check_addresses(&name, &[sa("8.8.8.8"), sa("fd00::1")], false).unwrap_err();
    assert_eq!(
        err,
        "mixed.example.com resolves to fd00::1, a unique local address (fc00::/7)"
    );
    assert!(check_addresses(&name, &[sa("10.0.0.1"), sa("8.8.8.8")], true).is_err());
    assert!(check_addresses(&name, &[sa("127.0.0.1"), sa("8.8.8.8")], false).is_err());
    assert_eq!(
        check_addresses(&name, &[sa("127.0.0.1"), sa("::1")], true),
        Ok(())
    );
}

#[test]
fn hosts_parse_strictly() {
    assert_eq!(
        parse_host("Example.COM."),
        Ok(Host::Name("example.com".into()))
    );
    assert_eq!(
        parse_host("api-1.example.com"),
        Ok(Host::Name("api-1.example.com".into()))
    );
    assert_eq!(parse_host("localhost"), Ok(Host::Name("localhost".into())));
    assert_eq!(parse_host("127.0.0.1"), Ok(Host::Ip(ip("127.0.0.1"))));
    assert_eq!(parse_host("[::1]"), Ok(Host::Ip(ip("::1"))));
    assert_eq!(
        parse_host("[::ffff:127.0.0.1]"),
        Ok(Host::Ip(ip("::ffff:127.0.0.1")))
    );
    for weird in [
        "2130706433",
        "0177.0.0.1",
        "0x7f.1",
        "0x7f000001",
        "127.1",
        "127.0.1",
        "017700000001",
        "1.2.3.4.5",
        "0x7f.0x0.0x0.0x1",
        "127.0.0.01",
        "example.0x10",
        "",
        ".",
        "a..b",
        "-a.com",
        "a-.com",
        "exa mple.com",
        "exämple.com",
        "a%2ecom",
        "[::1",
        "[fe80::1%25eth0]",
        "[127.0.0.1]",
        "::1",
        &"a".repeat(64),
    ] {
        assert!(parse_host(weird).is_err(), "{weird:?} must be refused");
    }
}

#[test]
fn allow_list_patterns() {
    let norm = |s: &str| normalize_allow_host(s);
    assert_eq!(norm(" API.Example.com. ").unwrap(), "api.example.com");
    assert_eq!(norm("*.Example.com").unwrap(), "*.example.com");
    assert_eq!(norm("10.1.2.3").unwrap(), "10.1.2.3");
    assert_eq!(norm("::1").unwrap(), "[::1]");
    assert_eq!(norm("[0:0::1]").unwrap(), "[::1]");
    for bad in [
        "",
        "*",
        "*.",
        "*.*.com",
        "a.*.com",
        "*example.com",
        "*.10.0.0.1",
        "https://example.com",
        "example.com/path",
        "example.com:443",
        "2130706433",
        "0177.0.0.1",
        "user@example.com",
    ] {
        assert!(norm(bad).is_err(), "{bad:?} must be refused");
    }

    let p = |s: &str| Pattern::parse(s).unwrap();
    let h = |s: &str| parse_host(s).unwrap();
    assert!(p("example.com").matches(&h("example.com")));
    assert!(p("example.com").matches(&h("EXAMPLE.com.")));
    assert!(!p("example.com").matches(&h("api.example.com")));
    assert!(p("*.example.com").matches(&h("api.example.com")));
    assert!(p("*.example.com").matches(&h("a.b.example.com")));
    assert!(
        !p("*.example.com").matches(&h("example.com")),
        "not the apex"
    );
    assert!(!p("*.example.com").matches(&h("badexample.com")));
    assert!(!p("*.example.com").matches(&h("example.com.evil.net")));
    assert!(p("10.1.2.3").matches(&h("10.1.2.3")));
    assert!(!p("*.example.com").matches(&h("10.1.2.3")));
    assert!(p("[::1]").matches(&h("[::1]")));
    assert!(!p("127.0.0.1").matches(&h("[::ffff:127.0.0.1]")));
}

#[test]
fn forbidden_headers() {
    for n in [
        "host",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "proxy-foo",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-real-ip",
        "via",
        "http2-settings",
    ] {
        assert!(is_forbidden_header(&HeaderName::from_static(n)), "{n}");
    }
    for n in [
        "authorization",
        "content-type",
        "accept",
        "user-agent",
        "x-api-key",
    ] {
        assert!(!is_forbidden_header(&HeaderName::from_static(n)), "{n}");
    }
}

// ---------------------------------------------------------------------------------------
// The hook against real sockets on loopback
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl Journal for Lines {
    async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    async fn send_event(&self, _: &str, _: serde_json::Value, _: &str) -> Result<(), JournalError> {
        Ok(())
    }
    async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, JournalError> {
        Err(JournalError::Failed("no".into()))
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, JournalError> {
        Err(JournalError::Failed("no stored steps here".into()))
    }
    fn log(&self, line: LogLine) {
        self.0.lock().unwrap().push(line.message);
    }
    fn progress(&self, _: Progress) {}
}

fn guard(allow: &[&str], loopback: bool, config: EgressConfig) -> (Guard, Arc<Lines>) {
    let lines = Arc::new(Lines::default());
    let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
    let g = Guard::new(GuardParams {
        allow_hosts: &allow,
        config: &config,
        allow_loopback: loopback,
        traceparent: None,
        deadline: Instant::now() + Duration::from_secs(30),
        logs: Arc::new(LogSink::new(
            lines.clone(),
            1,
            1 << 20,
            10_000,
            Arc::new(wasq_core::SystemClock),
        )),
        ownership: crate::host::Ownership::new(lines.clone()),
    });
    (g, lines)
}

fn request(url: &str) -> http::Request<WasiBody> {
    let uri: http::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().as_str().to_owned();
    http::Request::builder()
        .uri(uri)
        .header(header::HOST, authority)
        .body(Empty::<Bytes>::new().map_err(|e| match e {}).boxed_unsync())
        .unwrap()
}

async fn send_via(
    g: &mut Guard,
    req: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<(u16, Result<Bytes, Error>), Error> {
    let fut = g.send_request(req, options, Box::new(async { Ok(()) }));
    let (resp, io) = Pin::from(fut).await?;
    let io = tokio::spawn(Pin::from(io));
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map(|c| c.to_bytes());
    io.abort();
    Ok((status, body))
}

/// A one-connection-at-a-time HTTP/1.1 server that answers every request with `reply`;
/// counts connections.
async fn server(
    reply: impl Fn() -> Vec<Vec<u8>> + Send + Sync + 'static,
    pause: Duration,
) -> (u16, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            h.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                for chunk in reply() {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(pause).await;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    (port, hits)
}

fn ok_reply(body: &'static str) -> impl Fn() -> Vec<Vec<u8>> + Send + Sync {
    move || {
        vec![
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        ]
    }
}

#[tokio::test]
async fn an_allowed_loopback_request_goes_through_and_refusals_never_connect() {
    let (port, hits) = server(ok_reply("hello"), Duration::ZERO).await;
    let (mut g, lines) = guard(&["127.0.0.1", "localhost"], true, EgressConfig::default());
    let (status, body) = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/x")), None)
        .await
        .unwrap();
    assert_eq!((status, body.unwrap()), (200, Bytes::from_static(b"hello")));
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // Without the loopback exemption the same request never reaches the socket.
    let (mut g, _) = guard(&["127.0.0.1", "localhost"], false, EgressConfig::default());
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://localhost:{port}/"),
    ] {
        let err = send_via(&mut g, request(&url), None).await.unwrap_err();
        assert!(
            matches!(err, Error::DestinationIpProhibited),
            "{url}: {err:?}"
        );
    }
    // Not allow-listed, a weird spelling, and https to a forbidden address.
    let (mut g, _) = guard(&["example.com"], true, EgressConfig::default());
    let err = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/")), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::HttpRequestDenied), "{err:?}");
    let err = send_via(&mut g, request(&format!("http://2130706433:{port}/")), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::HttpRequestUriInvalid), "{err:?}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "refused requests never connect"
    );
    let log = lines.0.lock().unwrap().clone();
    assert!(
        log.is_empty(),
        "the successful guard logged nothing: {log:?}"
    );
}

#[tokio::test]
async fn redirects_are_returned_not_followed() {
    let (port, hits) = server(
        || {
            vec![
                b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest\r\ncontent-length: 0\r\n\r\n"
                    .to_vec(),
            ]
        },
        Duration::ZERO,
    )
    .await;
    let (mut g, _) = guard(&["127.0.0.1"], true, EgressConfig::default());
    let (status, _) = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/")), None)
        .await
        .unwrap();
    assert_eq!(status, 302);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_request_count_is_capped() {
    let (port, hits) = server(ok_reply("ok"), Duration::ZERO).await;
    let config = EgressConfig {
        max_requests_per_attempt: 3,
        ..EgressConfig::default()
    };
    let (mut g, lines) = guard(&["127.0.0.1"], true, config);
    for i in 0..5 {
        let r = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/")), None).await;
        if i < 3 {
            assert_eq!(r.unwrap().0, 200);
        } else {
            assert!(matches!(r, Err(Error::ConnectionLimitReached)), "{i}");
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let log = lines.0.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|l| l.contains("more than 3 outbound requests")),
        "{log:?}"
    );
}

#[tokio::test]
async fn the_response_body_is_capped() {
    let (port, _) = server(
        || {
            let mut out = vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n".to_vec()];
            out.extend((0..10).map(|_| vec![b'x'; 100_000]));
            out
        },
        Duration::ZERO,
    )
    .await;
    let config = EgressConfig {
        max_response_body_bytes: 250_000,
        ..EgressConfig::default()
    };
    let (mut g, lines) = guard(&["127.0.0.1"], true, config);
    let (status, body) = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/")), None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        matches!(body, Err(Error::HttpResponseBodySize(Some(250_000)))),
        "{body:?}"
    );
    assert!(
        lines
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("over the limit of 250000 bytes")),
        "logged"
    );
}

#[tokio::test]
async fn timeouts_are_clamped() {
    // Headers, then one byte every 2 s.
    let (port, _) = server(
        || {
            let mut out = vec![b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n".to_vec()];
            out.extend((0..100).map(|_| b"x".to_vec()));
            out
        },
        Duration::from_secs(2),
    )
    .await;
    let config = EgressConfig {
        max_between_bytes_timeout: Duration::from_millis(300),
        ..EgressConfig::default()
    };
    let (mut g, _) = guard(&["127.0.0.1"], true, config);
    let started = Instant::now();
    // The guest asks for an hour; it gets 300 ms.
    let options = RequestOptions {
        between_bytes_timeout: Some(Duration::from_secs(3600)),
        ..RequestOptions::default()
    };
    let (_, body) = send_via(
        &mut g,
        request(&format!("http://127.0.0.1:{port}/")),
        Some(options),
    )
    .await
    .unwrap();
    assert!(
        matches!(body, Err(Error::ConnectionReadTimeout)),
        "{body:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // A server that accepts and never answers: the first-byte timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let config = EgressConfig {
        max_first_byte_timeout: Duration::from_millis(300),
        ..EgressConfig::default()
    };
    let (mut g, _) = guard(&["127.0.0.1"], true, config);
    let started = Instant::now();
    let err = send_via(&mut g, request(&format!("http://127.0.0.1:{port}/")), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionReadTimeout), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn forbidden_headers_and_schemes_are_refused() {
    let (port, hits) = server(ok_reply("ok"), Duration::ZERO).await;
    let (mut g, _) = guard(&["127.0.0.1"], true, EgressConfig::default());
    let mut req = request(&format!("http://127.0.0.1:{port}/"));
    req.headers_mut()
        .insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
    assert!(matches!(
        send_via(&mut g, req, None).await,
        Err(Error::HttpRequestDenied)
    ));
    let mut req = request(&format!("http://127.0.0.1:{port}/"));
    req.headers_mut()
        .insert(header::HOST, "metadata.google.internal".parse().unwrap());
    assert!(matches!(
        send_via(&mut g, req, None).await,
        Err(Error::HttpRequestDenied)
    ));
    assert!(!g.is_supported_scheme(&"file".parse::<Scheme>().unwrap()));
    assert!(!g.is_supported_scheme(&"ftp".parse::<Scheme>().unwrap()));
    assert!(g.is_supported_scheme(&Scheme::HTTPS));
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn https_speaks_tls_to_the_checked_address() {
    // A plain-HTTP server answering a TLS ClientHello: the handshake must fail, which
    // shows https really is TLS (a verified one needs a certificate from webpki's roots,
    // which no loopback server has).
    let (port, hits) = server(ok_reply("not tls"), Duration::ZERO).await;
    let (mut g, lines) = guard(&["127.0.0.1", "localhost"], true, EgressConfig::default());
    for url in [
        format!("https://127.0.0.1:{port}/"),
        format!("https://localhost:{port}/"),
    ] {
        let err = send_via(&mut g, request(&url), None).await.unwrap_err();
        assert!(matches!(err, Error::Tls(_)), "{url}: {err:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert!(
        lines
            .0
            .lock()
            .unwrap()
            .iter()
            .all(|l| l.contains("failed: TLS")),
        "{:?}",
        lines.0.lock().unwrap()
    );
}

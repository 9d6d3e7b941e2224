//! The egress guard: every outbound HTTP request a guest makes through
//! `wasi:http/outgoing-handler` passes through [`Guard`], wasi-http's `send_request` hook.
//! wasmtime's own client is not compiled in: it connects wherever the guest says.
//!
//! What a request must pass, in order (the first failure refuses it, the guest gets a
//! wasi:http `error-code`, and the run's log gets a warn line naming the reason):
//! 1. the attempt's request count (`max_requests_per_attempt`) → `connection-limit-reached`;
//! 2. scheme `http` or `https` (other schemes do not even get here: `is_supported_scheme`
//!    refuses them and wasi-http answers `HTTP-protocol-error`);
//! 3. an authority without credentials whose host is a valid DNS name or a canonical IP
//!    literal: `2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1` and the like are refused, as
//!    is anything whose last label is numeric → `HTTP-request-URI-invalid`;
//! 4. the function's allow-list (exact names, `*.domain` for subdomains, IP literals only
//!    if listed literally) → `HTTP-request-denied`;
//! 5. headers: none of [`is_forbidden_header`] (also refused when the guest builds the
//!    header fields), a `host` equal to the authority, no `CONNECT` → `HTTP-request-denied`;
//! 6. a slot (`max_in_flight_per_attempt`, held until the response head arrives);
//! 7. DNS resolved here, and *every* address checked by [`classify`] (loopback — unless
//!    [`crate::SandboxConfig::allow_loopback_egress`] —, private, link-local, CGNAT,
//!    documentation, multicast, reserved; IPv4 embedded in mapped / NAT64 / 6to4 forms)
//!    → `destination-IP-prohibited`;
//! 8. a TCP connection to exactly a checked address (no second lookup, so DNS rebinding
//!    cannot redirect it), TLS with SNI = the host name for https (webpki roots).
//!
//! Timeouts: connect (DNS + TCP + TLS + handshake), first byte and between bytes are each
//! the guest's `request-options` value clamped to this host's maximum, and never run past
//! the attempt's deadline. The response body is capped. Redirects are never followed: the
//! guest sees the 3xx.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::uri::Scheme;
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error, ForbiddenHeaderFilter, RequestOptions, WasiBody, WasiHttpHooks};
use wasq_core::LogLevel;

use crate::host::{LogSink, Ownership};

/// Limits of outbound HTTP, per attempt. Part of [`crate::SandboxConfig`].
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Ceiling of the connect timeout (DNS, TCP, TLS and the HTTP handshake together).
    pub max_connect_timeout: Duration,
    /// Ceiling of the time from sending the request to the response head.
    pub max_first_byte_timeout: Duration,
    /// Ceiling of the time between two chunks of the response body.
    pub max_between_bytes_timeout: Duration,
    /// Largest response body a guest may read, per response.
    pub max_response_body_bytes: u64,
    /// Requests one attempt may make (refused ones included); the excess is refused.
    pub max_requests_per_attempt: u32,
    /// Requests of one attempt that may be connecting or waiting for their response head
    /// at once; further requests wait for a slot.
    pub max_in_flight_per_attempt: usize,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            max_connect_timeout: Duration::from_secs(10),
            max_first_byte_timeout: Duration::from_secs(30),
            max_between_bytes_timeout: Duration::from_secs(30),
            max_response_body_bytes: 16 << 20,
            max_requests_per_attempt: 64,
            max_in_flight_per_attempt: 8,
        }
    }
}

/// Most allow-list entries one function may have.
pub const MAX_ALLOW_HOSTS: usize = 256;

/// Refusal lines one attempt may add to its run's log (they are not charged to the
/// guest's log budget, so a guest looping over refused requests must not flood it).
const MAX_LOGGED: u32 = 32;

/// Checks an allow-list entry and returns its normalised form: a host name (lowercase,
/// no trailing dot), `*.` and a domain (any subdomain of it, at any depth, not the domain
/// itself), an IPv4 address, or an IPv6 address in brackets.
pub fn normalize_allow_host(pattern: &str) -> Result<String, String> {
    Pattern::parse(pattern).map(|p| p.to_string())
}

// ---------------------------------------------------------------------------------------
// Hosts and the allow-list
// ---------------------------------------------------------------------------------------

/// A request's host, as it will be connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// A valid DNS name, lowercase, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Parses the host of a URL authority the strict way: a bracketed IPv6 literal (no zone),
/// a canonical dotted-quad IPv4 literal, or a DNS name whose last label is not numeric.
/// Everything a resolver might read as a number in another spelling (`2130706433`,
/// `0177.0.0.1`, `0x7f.1`, `127.1`) is refused rather than interpreted.
pub(crate) fn parse_host(raw: &str) -> Result<Host, String> {
    if let Some(inner) = raw.strip_prefix('[') {
        return inner
            .strip_suffix(']')
            .and_then(|ip| ip.parse::<Ipv6Addr>().ok())
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .ok_or_else(|| format!("{raw:?} is not a valid IPv6 address"));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    // std's parser takes exactly four decimal parts without leading zeros.
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    check_dns_name(name).map_err(|why| format!("{raw:?} is not a valid host name: {why}"))?;
    Ok(Host::Name(name.to_owned()))
}

fn check_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("a name has 1 to 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated label has 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' (IDNs in punycode)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label does not start or end with '-'");
        }
    }
    // URL parsers (WHATWG) read a host whose last label is numeric as an IPv4 address in
    // some spelling; so do resolvers. Only the canonical dotted quad is an IP here.
    let last = labels[labels.len() - 1];
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if last.bytes().all(|b| b.is_ascii_digit()) || hex {
        return Err("it ends in a number, like a non-canonical IPv4 address");
    }
    Ok(())
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    Exact(Host),
    /// `*.domain`: strict subdomains of `domain`.
    Subdomains(String),
}

impl Pattern {
    pub(crate) fn parse(raw: &str) -> Result<Pattern, String> {
        let s = raw.trim();
        let bad = |why: &str| Err(format!("invalid allow_hosts entry {raw:?}: {why}"));
        if s.is_empty() {
            return bad("it is empty");
        }
        if s.contains("://") || s.contains('/') {
            return bad("give a host name, not a URL");
        }
        if let Some(domain) = s.strip_prefix("*.") {
            if domain.contains('*') {
                return bad("'*' only as the whole first label, as in *.example.com");
            }
            return match parse_host(domain) {
                Ok(Host::Name(d)) => Ok(Pattern::Subdomains(d)),
                Ok(Host::Ip(_)) => bad("a wildcard needs a domain name, not an IP address"),
                Err(e) => bad(&e),
            };
        }
        if s.contains('*') {
            return bad("'*' only as the whole first label, as in *.example.com");
        }
        // A bare IPv6 address is accepted too: there is no port to confuse it with.
        if let Ok(ip) = s.parse::<Ipv6Addr>() {
            return Ok(Pattern::Exact(Host::Ip(IpAddr::V6(ip))));
        }
        if !s.starts_with('[') && s.contains(':') {
            return bad("no ports: the allow-list names hosts, any port is allowed");
        }
        parse_host(s).map(Pattern::Exact).or_else(|e| bad(&e))
    }

    fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (Pattern::Exact(h), host) => h == host,
            (Pattern::Subdomains(domain), Host::Name(name)) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Pattern::Subdomains(_), Host::Ip(_)) => false,
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Exact(h) => write!(f, "{h}"),
            Pattern::Subdomains(d) => write!(f, "*.{d}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The address classifier
// ---------------------------------------------------------------------------------------

/// What an address is, for egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Publicly routable: may be connected to.
    Global,
    /// 127.0.0.0/8, ::1, or an IPv4-mapped loopback: only with `allow_loopback_egress`.
    Loopback,
    /// Never connected to; the reason names the range.
    Forbidden(&'static str),
}

/// IPv4 ranges that are not globally reachable (IANA special-purpose registry), besides
/// loopback.
const V4_FORBIDDEN: &[([u8; 4], u32, &str)] = &[
    ([0, 0, 0, 0], 8, "a \"this network\" address (0.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "a private address (10.0.0.0/8)"),
    (
        [100, 64, 0, 0],
        10,
        "a carrier-grade NAT address (100.64.0.0/10)",
    ),
    (
        [169, 254, 0, 0],
        16,
        "a link-local address (169.254.0.0/16, cloud metadata)",
    ),
    ([172, 16, 0, 0], 12, "a private address (172.16.0.0/12)"),
    (
        [192, 0, 0, 0],
        24,
        "an IETF protocol address (192.0.0.0/24)",
    ),
    ([192, 0, 2, 0], 24, "a documentation address (192.0.2.0/24)"),
    (
        [192, 88, 99, 0],
        24,
        "a 6to4 relay address (192.88.99.0/24)",
    ),
    ([192, 168, 0, 0], 16, "a private address (192.168.0.0/16)"),
    (
        [198, 18, 0, 0],
        15,
        "a benchmarking address (198.18.0.0/15)",
    ),
    (
        [198, 51, 100, 0],
        24,
        "a documentation address (198.51.100.0/24)",
    ),
    (
        [203, 0, 113, 0],
        24,
        "a documentation address (203.0.113.0/24)",
    ),
    ([224, 0, 0, 0], 4, "a multicast address (224.0.0.0/4)"),
    (
        [240, 0, 0, 0],
        4,
        "a reserved or broadcast address (240.0.0.0/4)",
    ),
];

/// IPv6 ranges refused outright, checked after the forms that embed IPv4.
const V6_FORBIDDEN: &[([u16; 2], u32, &str)] = &[
    (
        [0x0064, 0xff9b],
        48,
        "a local-use NAT64 address (64:ff9b:1::/48)",
    ),
    ([0x0100, 0], 64, "a discard-only address (100::/64)"),
    (
        [0x2001, 0],
        23,
        "an IETF protocol address (2001::/23, incl. Teredo)",
    ),
    (
        [0x2001, 0x0db8],
        32,
        "a documentation address (2001:db8::/32)",
    ),
    ([0x3fff, 0], 20, "a documentation address (3fff::/20)"),
    ([0x5f00, 0], 16, "a segment-routing address (5f00::/16)"),
    ([0xfc00, 0], 7, "a unique local address (fc00::/7)"),
    ([0xfe80, 0], 10, "a link-local address (fe80::/10)"),
    ([0xfec0, 0], 10, "a site-local address (fec0::/10)"),
    ([0xff00, 0], 8, "a multicast address (ff00::/8)"),
];

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from_be_bytes(net) & mask
}

fn in_v6(ip: Ipv6Addr, net: [u16; 2], len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    let net = (u128::from(net[0]) << 112) | (u128::from(net[1]) << 96);
    u128::from(ip) & mask == net & mask
}

pub(crate) fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    if ip.octets()[0] == 127 {
        return Class::Loopback;
    }
    match V4_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
    {
        Some((_, _, why)) => Class::Forbidden(why),
        None => Class::Global,
    }
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let bits = u128::from(ip);
    // ::ffff:a.b.c.d is the IPv4 address itself to a dual-stack socket.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return match classify_v4(v4) {
            Class::Forbidden(_) => Class::Forbidden("an IPv4-mapped form of a forbidden address"),
            other => other,
        };
    }
    if ip == Ipv6Addr::LOCALHOST {
        return Class::Loopback;
    }
    if ip.is_unspecified() {
        return Class::Forbidden("the unspecified address (::)");
    }
    if bits >> 32 == 0 {
        return Class::Forbidden("an IPv4-compatible address (::/96, deprecated)");
    }
    // NAT64 (64:ff9b::/96): reaches the embedded IPv4 address through a translator.
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        let v4 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
        return match classify_v4(v4) {
            Class::Global => Class::Global,
            _ => Class::Forbidden("a NAT64 form of a forbidden IPv4 address (64:ff9b::/96)"),
        };
    }
    // 6to4 (2002::/16): reaches the IPv4 address in bits 16..48 through a relay.
    if bits >> 112 == 0x2002 {
        let v4 = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
        if classify_v4(v4) != Class::Global {
            return Class::Forbidden("a 6to4 form of a forbidden IPv4 address (2002::/16)");
        }
        return Class::Global;
    }
    if let Some((_, _, why)) = V6_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v6(ip, *net, *len))
    {
        return Class::Forbidden(why);
    }
    // Only 2000::/3 is allocated for global unicast; the rest is reserved.
    if bits >> 125 != 0b001 {
        return Class::Forbidden("a reserved address (outside 2000::/3)");
    }
    Class::Global
}

/// Every address a host resolved to must pass: one public A record next to a private
/// AAAA record is refused, not connected to the "good" one.
pub(crate) fn check_addresses(
    host: &Host,
    addrs: &[SocketAddr],
    allow_loopback: bool,
) -> Result<(), String> {
    for a in addrs {
        if let Err(why) = check_address(a.ip(), allow_loopback) {
            return Err(match host {
                Host::Name(name) => format!("{name} resolves to {}, {why}", a.ip()),
                Host::Ip(ip) => format!("{ip} is {why}"),
            });
        }
    }
    Ok(())
}

/// `Err(reason)` when egress to `ip` is refused.
pub(crate) fn check_address(ip: IpAddr, allow_loopback: bool) -> Result<(), &'static str> {
    match classify(ip) {
        Class::Global => Ok(()),
        Class::Loopback if allow_loopback => Ok(()),
        Class::Loopback => Err("a loopback address"),
        Class::Forbidden(why) => Err(why),
    }
}

// ---------------------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------------------

/// Request headers a guest may not set. wasi-http's defaults (hop-by-hop headers, `host`,
/// `proxy-authorization`, ...) plus every `proxy-*` header, `te` and `trailer`
/// (hop-by-hop), `expect`, and the headers proxies use to tell a server who the client is
/// (`forwarded`, `x-forwarded-*`, `x-real-ip`, `via`), which a server behind a proxy may
/// trust. Setting one fails at `fields.set`/`append`/`from-list` with
/// `header-error.forbidden`; a request that carries one anyway is refused.
pub(crate) fn is_forbidden_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(name)
        || n.starts_with("proxy-")
        || n.starts_with("x-forwarded-")
        || matches!(
            n,
            "te" | "trailer" | "expect" | "forwarded" | "x-real-ip" | "via"
        )
}

// ---------------------------------------------------------------------------------------
// The hook
// ---------------------------------------------------------------------------------------

/// The per-attempt egress guard; wasi-http's hooks for one store.
pub(crate) struct Guard {
    shared: Arc<Shared>,
    requests: u32,
}

struct Shared {
    allow: Vec<Pattern>,
    config: EgressConfig,
    allow_loopback: bool,
    deadline: Instant,
    in_flight: Arc<Semaphore>,
    logs: Arc<LogSink>,
    logged: AtomicU32,
    ownership: Arc<Ownership>,
}

pub(crate) struct GuardParams<'a> {
    pub allow_hosts: &'a [String],
    pub config: &'a EgressConfig,
    pub allow_loopback: bool,
    pub deadline: Instant,
    pub logs: Arc<LogSink>,
    /// Asked before each request is let through.
    pub ownership: Arc<Ownership>,
}

impl Guard {
    pub(crate) fn new(p: GuardParams<'_>) -> Guard {
        let mut allow = Vec::with_capacity(p.allow_hosts.len());
        for raw in p.allow_hosts {
            match Pattern::parse(raw) {
                Ok(pattern) => allow.push(pattern),
                // Deploys validate entries; one that does not parse here allows nothing.
                Err(e) => p.logs.host(LogLevel::Warn, format!("{e}; ignored")),
            }
        }
        Guard {
            shared: Arc::new(Shared {
                allow,
                config: p.config.clone(),
                allow_loopback: p.allow_loopback,
                deadline: p.deadline,
                in_flight: Arc::new(Semaphore::new(p.config.max_in_flight_per_attempt.max(1))),
                logs: p.logs,
                logged: AtomicU32::new(0),
                ownership: p.ownership,
            }),
            requests: 0,
        }
    }
}

impl Shared {
    /// Logs why a request to `target` was refused (to the run's log, bounded) and returns
    /// the error the guest gets.
    fn refuse(&self, target: &str, reason: impl std::fmt::Display, error: Error) -> Error {
        self.note(target, "refused", reason);
        error
    }

    /// Like [`Shared::refuse`], for a request stopped after it was let through: a limit
    /// or timeout of this host, or the destination failing.
    fn fail(&self, target: &str, reason: impl std::fmt::Display, error: Error) -> Error {
        self.note(target, "failed", reason);
        error
    }

    fn note(&self, target: &str, what: &str, reason: impl std::fmt::Display) {
        let n = self.logged.fetch_add(1, Ordering::Relaxed);
        if n < MAX_LOGGED {
            let target = wasq_core::text::truncate_utf8(target.to_owned(), 300);
            self.logs.host(
                LogLevel::Warn,
                format!("outbound HTTP to {target} {what}: {reason}"),
            );
        } else if n == MAX_LOGGED {
            self.logs.host(
                LogLevel::Warn,
                format!(
                    "more than {MAX_LOGGED} outbound HTTP requests refused or failed: \
                     no more are logged in this attempt"
                ),
            );
        }
    }

    fn allowed(&self, host: &Host) -> bool {
        self.allow.iter().any(|p| p.matches(host))
    }

    /// `min(asked, ceiling, time left in the attempt)`.
    fn clamp(&self, asked: Option<Duration>, ceiling: Duration) -> Duration {
        let left = self.deadline.saturating_duration_since(Instant::now());
        asked.unwrap_or(ceiling).min(ceiling).min(left)
    }
}

/// Where a request that passed the synchronous checks goes.
struct Target {
    host: Host,
    /// As the guest gave it (and as the host header says).
    authority: String,
    port: u16,
    tls: bool,
    /// `scheme://authority`, for log lines.
    label: String,
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send>;

impl WasiHttpHooks for Guard {
    fn is_forbidden_header(&mut self, name: &HeaderName) -> bool {
        is_forbidden_header(name)
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        Arc::new(is_forbidden_header)
    }

    fn is_supported_scheme(&mut self, scheme: &Scheme) -> bool {
        let ok = *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS;
        if !ok {
            self.shared.refuse(
                &format!("{scheme}:"),
                "only http and https URLs are allowed",
                Error::HttpRequestDenied,
            );
        }
        ok
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        self.requests = self.requests.saturating_add(1);
        let shared = self.shared.clone();
        // The synchronous checks run now, in the guest's call, so that the count and the
        // policy do not depend on when the spawned future first runs.
        let checked = check_request(&shared, &request, self.requests);
        Box::new(async move {
            let target = checked?;
            send(shared, target, request, options).await
        })
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        if err.is_timeout() {
            ErrorCode::HttpResponseTimeout
        } else if err.is_incomplete_message() || err.is_canceled() {
            ErrorCode::HttpResponseIncomplete
        } else {
            ErrorCode::HttpProtocolError
        }
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::TimedOut => ErrorCode::ConnectionTimeout,
            K::HostUnreachable | K::NetworkUnreachable => ErrorCode::DestinationUnavailable,
            K::ConnectionReset | K::ConnectionAborted => ErrorCode::ConnectionTerminated,
            _ => ErrorCode::ConnectionRefused,
        }
    }

    fn p2_error_from_tls(&mut self, err: &std::io::Error) -> ErrorCode {
        let cert = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)));
        if cert {
            ErrorCode::TlsCertificateError
        } else {
            ErrorCode::TlsProtocolError
        }
    }
}

fn check_request(
    shared: &Shared,
    request: &http::Request<WasiBody>,
    number: u32,
) -> Result<Target, Error> {
    let uri = request.uri();
    // Scheme, host and port only: never credentials, paths or queries in the log.
    let label = match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => match a.port() {
            Some(p) => format!("{s}://{}:{p}", a.host()),
            None => format!("{s}://{}", a.host()),
        },
        _ => "a URL without a host".to_owned(),
    };
    let refuse = |reason: String, error: Error| Err(shared.refuse(&label, reason, error));
    // Never send a request for a run this attempt may no longer own: the refusal also
    // marks the attempt abandoned, so the guest stops at the next epoch tick.
    if let Err(why) = shared.ownership.check() {
        return refuse(
            format!("the attempt no longer owns its run: {why}"),
            Error::HttpRequestDenied,
        );
    }
    let max = shared.config.max_requests_per_attempt;
    if number > max {
        return refuse(
            format!("more than {max} outbound requests in one attempt"),
            Error::ConnectionLimitReached,
        );
    }
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => {
            return refuse(
                format!(
                    "scheme {:?} is not allowed: only http and https",
                    other.unwrap_or("")
                ),
                Error::HttpRequestDenied,
            );
        }
    };
    let Some(authority) = uri.authority() else {
        return refuse("the URL has no host".into(), Error::HttpRequestUriInvalid);
    };
    if authority.as_str().contains('@') {
        return refuse(
            "credentials in the URL are not allowed (send an authorization header)".into(),
            Error::HttpRequestUriInvalid,
        );
    }
    let host = match parse_host(authority.host()) {
        Ok(h) => h,
        Err(e) => return refuse(e, Error::HttpRequestUriInvalid),
    };
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    if port == 0 {
        return refuse("port 0".into(), Error::HttpRequestUriInvalid);
    }
    if shared.allow.is_empty() {
        return refuse(
            "this function may not make outbound HTTP requests (deploy it with allow_hosts)".into(),
            Error::HttpRequestDenied,
        );
    }
    if !shared.allowed(&host) {
        return refuse(
            format!("{host} is not in the function's allow_hosts"),
            Error::HttpRequestDenied,
        );
    }
    if request.method() == http::Method::CONNECT {
        return refuse(
            "method CONNECT is not allowed".into(),
            Error::HttpRequestDenied,
        );
    }
    for name in request.headers().keys() {
        if name != header::HOST && is_forbidden_header(name) {
            return refuse(
                format!("header {name:?} is not allowed"),
                Error::HttpRequestDenied,
            );
        }
    }
    let hosts = request.headers().get_all(header::HOST);
    if hosts.iter().count() > 1
        || hosts.iter().any(|h| {
            !h.as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes())
        })
    {
        return refuse(
            "a host header that differs from the URL's host".into(),
            Error::HttpRequestDenied,
        );
    }
    Ok(Target {
        host,
        authority: authority.as_str().to_owned(),
        port,
        tls,
        label,
    })
}

/// The TLS client: webpki's roots, ring, TLS 1.2 and 1.3. Built once.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.into(),
            };
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

async fn send(
    shared: Arc<Shared>,
    target: Target,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let label = target.label.as_str();
    let config = &shared.config;
    let refuse = |reason: String, error: Error| shared.refuse(label, reason, error);
    let fail = |reason: String, error: Error| shared.fail(label, reason, error);

    // A slot first: a guest that starts many requests at once gets a queue, and at most
    // that many lookups and connections run for it at once.
    let permit = tokio::time::timeout_at(
        shared.deadline.into(),
        shared.in_flight.clone().acquire_owned(),
    )
    .await
    .map_err(|_| {
        fail(
            format!(
                "no free connection slot (at most {} at once) before the attempt's time limit",
                config.max_in_flight_per_attempt
            ),
            Error::ConnectionTimeout,
        )
    })?
    .map_err(|_| Error::InternalError(Some("connection slots closed".into())))?;

    // The connect timeout covers the lookup, TCP, TLS and the HTTP handshake.
    let connect_timeout = shared.clamp(
        options.and_then(|o| o.connect_timeout),
        config.max_connect_timeout,
    );
    let connect_deadline = tokio::time::Instant::now() + connect_timeout;

    // Resolve once, check every address, connect to a checked one: a name that resolves
    // differently a moment later (DNS rebinding) changes nothing.
    let addrs: Vec<SocketAddr> = match &target.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        Host::Name(name) => {
            let lookup = tokio::net::lookup_host((name.as_str(), target.port));
            match tokio::time::timeout_at(connect_deadline, lookup).await {
                Err(_) => {
                    return Err(fail(
                        format!("looking up {name} took longer than {connect_timeout:?}"),
                        Error::DnsTimeout,
                    ));
                }
                Ok(Err(e)) => {
                    return Err(fail(
                        format!("looking up {name} failed: {e}"),
                        Error::DnsError {
                            rcode: Some("name not resolved".into()),
                            info_code: None,
                        },
                    ));
                }
                Ok(Ok(found)) => {
                    let mut all: Vec<SocketAddr> = Vec::new();
                    for a in found {
                        if !all.contains(&a) {
                            all.push(a);
                        }
                    }
                    all
                }
            }
        }
    };
    if addrs.is_empty() {
        return Err(fail(
            format!("{} has no addresses", target.host),
            Error::DestinationNotFound,
        ));
    }
    if let Err(what) = check_addresses(&target.host, &addrs, shared.allow_loopback) {
        return Err(refuse(what, Error::DestinationIpProhibited));
    }

    let timed_out = || {
        fail(
            format!("no connection within {connect_timeout:?}"),
            Error::ConnectionTimeout,
        )
    };
    let mut last_error = None;
    let mut tcp = None;
    for addr in &addrs {
        match tokio::time::timeout_at(connect_deadline, TcpStream::connect(*addr)).await {
            Err(_) => return Err(timed_out()),
            Ok(Ok(s)) => {
                tcp = Some(s);
                break;
            }
            Ok(Err(e)) => last_error = Some(e),
        }
    }
    let Some(tcp) = tcp else {
        let e = last_error.expect("at least one address was tried");
        return Err(fail(format!("could not connect: {e}"), Error::Connect(e)));
    };
    let _ = tcp.set_nodelay(true);

    let stream: Box<dyn Stream> = if target.tls {
        let name = match &target.host {
            Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone()).map_err(|_| {
                fail(
                    format!("{n} is not a valid TLS server name"),
                    Error::TlsProtocolError,
                )
            })?,
            Host::Ip(ip) => rustls::pki_types::ServerName::from(*ip),
        };
        let connector = tokio_rustls::TlsConnector::from(tls_config());
        match tokio::time::timeout_at(connect_deadline, connector.connect(name, tcp)).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) => return Err(fail(format!("TLS: {e}"), Error::Tls(e))),
            Ok(Ok(s)) => Box::new(s),
        }
    } else {
        Box::new(tcp)
    };

    let handshake = hyper::client::conn::http1::Builder::new()
        .handshake::<_, WasiBody>(wasmtime_wasi_http::io::TokioIo::new(stream));
    let (mut sender, conn) = match tokio::time::timeout_at(connect_deadline, handshake).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(e)) => return Err(fail(format!("HTTP handshake: {e}"), Error::Hyper(e))),
        Ok(Ok(pair)) => pair,
    };

    // The request line carries the path only (origin form); the host header, which
    // wasi-http set to the checked authority, names the host.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    if !request.headers().contains_key(header::HOST) {
        let host = http::HeaderValue::from_str(&target.authority)
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        request.headers_mut().insert(header::HOST, host);
    }

    let first_byte = shared.clamp(
        options.and_then(|o| o.first_byte_timeout),
        config.max_first_byte_timeout,
    );
    let between_bytes = options
        .and_then(|o| o.between_bytes_timeout)
        .unwrap_or(config.max_between_bytes_timeout)
        .min(config.max_between_bytes_timeout);

    let head = async {
        match tokio::time::timeout(first_byte, sender.send_request(request)).await {
            Err(_) => Err(fail(
                format!("no response within {first_byte:?}"),
                Error::ConnectionReadTimeout,
            )),
            Ok(Err(e)) => Err(fail(format!("{e}"), Error::Hyper(e))),
            Ok(Ok(r)) => Ok(r),
        }
    };
    // Drive the connection while waiting for the response head, as hyper requires.
    let mut head = pin!(head);
    let mut conn = Some(conn);
    let response = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = head.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        let Some(c) = conn.as_mut() else {
            return Poll::Pending;
        };
        let ended = ready!(Pin::new(c).poll(cx));
        conn = None;
        match ended {
            Ok(()) => head.as_mut().poll(cx),
            Err(e) => Poll::Ready(Err(fail(format!("{e}"), Error::Hyper(e)))),
        }
    })
    .await?;
    // The slot bounds connections being set up and waiting for their response; it is
    // given back once the head is here. Holding it until the body is read could deadlock
    // a guest that reads its responses in another order than the slots were granted
    // (the request count bounds how many bodies can be open).
    drop(permit);

    let body = GuardedBody {
        started: false,
        read: 0,
        cap: config.max_response_body_bytes,
        between_bytes,
        idle: Box::pin(tokio::time::sleep(between_bytes)),
        deadline: Box::pin(tokio::time::sleep_until(shared.deadline.into())),
        shared: shared.clone(),
        label: target.label.clone(),
        done: false,
    };
    let response =
        response.map(|incoming| http_body_util::BodyExt::boxed_unsync(body.wrap(incoming)));
    // The connection lives until the body is read or dropped.
    let io: IoFuture = Box::new(async move {
        match conn {
            None => Ok(()),
            Some(conn) => conn.await.map_err(|e| {
                if e.is_timeout() {
                    Error::HttpResponseTimeout
                } else {
                    Error::Hyper(e)
                }
            }),
        }
    });
    Ok((response, io))
}

/// What guards a response body: the between-bytes timeout, the attempt deadline and the
/// size cap.
struct GuardedBody {
    /// Whether the guest has asked for data yet: the between-bytes clock starts then.
    started: bool,
    read: u64,
    cap: u64,
    between_bytes: Duration,
    idle: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
    shared: Arc<Shared>,
    label: String,
    done: bool,
}

/// A response body and its guard.
struct Guarded {
    incoming: hyper::body::Incoming,
    guard: GuardedBody,
}

type Polled = Poll<Option<Result<Frame<Bytes>, Error>>>;

impl GuardedBody {
    fn wrap(self, incoming: hyper::body::Incoming) -> Guarded {
        Guarded {
            incoming,
            guard: self,
        }
    }

    fn fail(&mut self, reason: String, error: Error) -> Polled {
        self.done = true;
        Poll::Ready(Some(Err(self.shared.fail(&self.label, reason, error))))
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let Guarded { incoming, guard } = &mut *self;
        if guard.done {
            return Poll::Ready(None);
        }
        if !guard.started {
            guard.started = true;
            let first = tokio::time::Instant::now() + guard.between_bytes;
            guard.idle.as_mut().reset(first);
        }
        match Pin::new(incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                guard.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                guard.done = true;
                let error = if e.is_timeout() {
                    Error::HttpResponseTimeout
                } else {
                    Error::Hyper(e)
                };
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    guard.read = guard.read.saturating_add(data.len() as u64);
                    if guard.read > guard.cap {
                        let cap = guard.cap;
                        return guard.fail(
                            format!("the response body is over the limit of {cap} bytes"),
                            Error::HttpResponseBodySize(Some(cap)),
                        );
                    }
                }
                let next = tokio::time::Instant::now() + guard.between_bytes;
                guard.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                if guard.idle.as_mut().poll(cx).is_ready() {
                    let t = guard.between_bytes;
                    return guard.fail(
                        format!("the response body stalled for {t:?}"),
                        Error::ConnectionReadTimeout,
                    );
                }
                if guard.deadline.as_mut().poll(cx).is_ready() {
                    return guard.fail(
                        "the response body was still arriving at the attempt's time limit".into(),
                        Error::ConnectionReadTimeout,
                    );
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.done || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests;

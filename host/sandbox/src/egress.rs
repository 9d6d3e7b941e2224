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

mod client;
mod rules;
mod webhook;

pub(crate) use client::*;
pub(crate) use rules::*;
pub use webhook::{check_webhook_url, post_webhook};

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

/// The W3C trace context header an attempt's requests carry.
const TRACEPARENT: &str = "traceparent";

/// Checks an allow-list entry and returns its normalised form: a host name (lowercase,
/// no trailing dot), `*.` and a domain (any subdomain of it, at any depth, not the domain
/// itself), an IPv4 address, or an IPv6 address in brackets.
pub fn normalize_allow_host(pattern: &str) -> Result<String, String> {
    Pattern::parse(pattern).map(|p| p.to_string())
}

// ---------------------------------------------------------------------------------------
// The hook
// ---------------------------------------------------------------------------------------

/// The per-attempt egress guard; wasi-http's hooks for one store.
pub(crate) struct Guard {
    shared: Arc<Shared>,
    requests: u32,
}

pub(crate) struct Shared {
    allow: Vec<Pattern>,
    config: EgressConfig,
    allow_loopback: bool,
    deadline: Instant,
    in_flight: Arc<Semaphore>,
    logs: Arc<LogSink>,
    logged: AtomicU32,
    /// Requests refused so far.
    refused: AtomicU32,
    ownership: Arc<Ownership>,
    /// The attempt's `traceparent`, added to requests that carry none.
    traceparent: Option<http::HeaderValue>,
}

pub(crate) struct GuardParams<'a> {
    pub allow_hosts: &'a [String],
    pub config: &'a EgressConfig,
    pub allow_loopback: bool,
    /// The attempt's trace context (see [`crate::AttemptSpec::traceparent`]).
    pub traceparent: Option<&'a wasq_core::TraceParent>,
    pub deadline: Instant,
    pub logs: Arc<LogSink>,
    /// Asked before each request is let through.
    pub ownership: Arc<Ownership>,
}

impl Guard {
    /// Requests of the attempt the guard refused.
    pub(crate) fn refused(&self) -> u32 {
        self.shared.refused.load(Ordering::Relaxed)
    }

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
                refused: AtomicU32::new(0),
                ownership: p.ownership,
                // Lowercase hex and dashes: always a valid header value.
                traceparent: p
                    .traceparent
                    .and_then(|t| http::HeaderValue::from_str(t.as_str()).ok()),
            }),
            requests: 0,
        }
    }
}

impl Shared {
    /// Logs why a request to `target` was refused (to the run's log, bounded) and returns
    /// the error the guest gets.
    fn refuse(&self, target: &str, reason: impl std::fmt::Display, error: Error) -> Error {
        self.refused.fetch_add(1, Ordering::Relaxed);
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
pub(crate) struct Target {
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
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        // The attempt's trace goes on to the service it calls, unless the guest continues
        // a trace of its own.
        if let Some(tp) = &self.shared.traceparent
            && !request.headers().contains_key(TRACEPARENT)
        {
            request.headers_mut().insert(TRACEPARENT, tp.clone());
        }
        self.requests = self.requests.saturating_add(1);
        let shared = self.shared.clone();
        // The synchronous checks run now, in the guest's call, so that the count and the
        // policy do not depend on when the spawned future first runs.
        let checked = check_request(&shared, &request, self.requests);
        Box::new(async move {
            let target = checked?;
            // A step the guest completed before this request is stored first: the request
            // must not go out ahead of it.
            if let Err(why) = shared.ownership.settle().await {
                let reason = format!("the step before it could not be stored: {why}");
                return Err(shared.refuse(&target.label, reason, Error::HttpRequestDenied));
            }
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

#[cfg(test)]
mod tests;

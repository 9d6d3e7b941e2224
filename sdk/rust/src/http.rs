//! Outbound HTTP, through `wasi:http/outgoing-handler` and the host's egress guard.
//!
//! A function may only reach the hosts its deploy allows (`wasq deploy --allow-host
//! api.example.com --allow-host '*.example.org'`); everything else is refused by the host,
//! as are loopback, private, link-local and cloud-metadata addresses whatever the name
//! resolves to. Timeouts are clamped and response bodies capped by the host; redirects are
//! not followed (you get the 3xx and its `location`). Refusals are also written to the run's
//! log, so `wasq runs logs` says why.
//!
//! ```no_run
//! use wasq_guest::{http, step, Error};
//!
//! fn handler(_: serde_json::Value) -> Result<serde_json::Value, Error> {
//!     // Side effects belong in steps: a retried run does not fetch again.
//!     let user: serde_json::Value = step::run("fetch-user", || {
//!         let resp = http::get("https://api.example.com/users/42")?;
//!         if resp.status != 200 {
//!             return Err(Error::retryable(format!("status {}", resp.status)));
//!         }
//!         Ok(resp.json()?)
//!     })?;
//!     Ok(user)
//! }
//! # wasq_guest::task!(handler);
//! ```
//!
//! Requests are blocking; to run several at once, [`Request::start`] each, then
//! [`Pending::wait`] for each: the host works on all of them meanwhile (up to its
//! per-attempt limits).

use core::fmt;
use std::time::Duration;

use crate::Error;
use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    self as wit, ErrorCode, Fields, FutureIncomingResponse, Method, OutgoingBody, OutgoingRequest,
    RequestOptions, Scheme,
};
use crate::bindings::wasi::io::streams::StreamError;

/// Why a request did not produce a complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    kind: HttpErrorKind,
    message: String,
}

/// What kind of [`HttpError`] it is; decides how it converts into [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpErrorKind {
    /// The URL, a header or the method is not valid (or a header is one the host forbids):
    /// the same request fails the same way every time.
    Invalid,
    /// The host's egress guard refused the request: host not allowed, forbidden address,
    /// scheme, or too many requests in this attempt.
    Refused,
    /// The request was sent (or tried) and failed: DNS, connection, timeout, a response
    /// over the size cap, a broken response.
    Failed,
}

impl HttpError {
    fn new(kind: HttpErrorKind, message: impl Into<String>) -> Self {
        HttpError {
            kind,
            message: message.into(),
        }
    }

    fn code(code: ErrorCode) -> Self {
        let kind = match code {
            ErrorCode::HttpRequestDenied
            | ErrorCode::DestinationIpProhibited
            | ErrorCode::ConnectionLimitReached => HttpErrorKind::Refused,
            ErrorCode::HttpRequestUriInvalid | ErrorCode::HttpRequestMethodInvalid => {
                HttpErrorKind::Invalid
            }
            _ => HttpErrorKind::Failed,
        };
        HttpError::new(kind, format!("{code:?}"))
    }

    /// See [`HttpErrorKind`].
    pub fn kind(&self) -> HttpErrorKind {
        self.kind
    }

    /// For failures the host reports as a wasi:http `error-code`, its name, e.g.
    /// `ErrorCode::HttpRequestDenied`, `ErrorCode::DestinationIpProhibited`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HttpError {}

/// `?` on an [`HttpError`]: refused and invalid requests are **fatal** (the host would
/// refuse them on every attempt), failed ones **retryable**.
impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        let message = format!("HTTP request: {}", e.message);
        match e.kind {
            HttpErrorKind::Invalid | HttpErrorKind::Refused => Error::fatal(message),
            HttpErrorKind::Failed => Error::retryable(message),
        }
    }
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200 or 302 (redirects are not followed).
    pub status: u16,
    /// The header fields in order; names are lowercase.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// An HTTP request to build and send.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
    connect_timeout: Option<Duration>,
    first_byte_timeout: Option<Duration>,
    between_bytes_timeout: Option<Duration>,
}

impl Request {
    /// A request with any method (`GET`, `POST`, ...) to an absolute `http://` or
    /// `https://` URL.
    pub fn new(method: &str, url: &str) -> Self {
        Request {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: vec![],
            body: None,
            connect_timeout: None,
            first_byte_timeout: None,
            between_bytes_timeout: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: &str) -> Self {
        Self::new("GET", url)
    }

    /// A `POST` request with a body.
    pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::new("POST", url).body(body)
    }

    /// Adds a header field. `host`, `connection`, `transfer-encoding`, `proxy-*`,
    /// `x-forwarded-*` and other hop-by-hop or proxy headers are forbidden by the host.
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    /// Inside a step's body, adds an `idempotency-key` header with
    /// [`step::idempotency_key`](crate::step::idempotency_key): the same on every run of
    /// this step's body, so a server that honours the header performs the request once
    /// even if the body runs again after its worker died. Outside a step, adds nothing.
    pub fn idempotent(self) -> Self {
        match crate::step::idempotency_key() {
            Some(key) => self.header("idempotency-key", key),
            None => self,
        }
    }

    /// Sets the body (a `content-length` header is added).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Sets the connect, first-byte and between-bytes timeouts (the host clamps each to
    /// its own maximum).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self.first_byte_timeout = Some(timeout);
        self.between_bytes_timeout = Some(timeout);
        self
    }

    /// Sends the request and reads the whole response.
    pub fn send(self) -> Result<Response, HttpError> {
        self.start()?.wait()
    }

    /// Sends the request without waiting for the response.
    pub fn start(self) -> Result<Pending, HttpError> {
        let invalid = |m: String| HttpError::new(HttpErrorKind::Invalid, m);
        let (scheme, authority, path) = split_url(&self.url).map_err(invalid)?;
        // wasi-http answers a scheme other than http(s) with `HTTP-protocol-error`.
        let unsupported = matches!(scheme, Scheme::Other(_));
        let mut entries = self.headers;
        if let Some(body) = &self.body {
            entries.push(("content-length".into(), body.len().to_string().into_bytes()));
        }
        let fields = Fields::from_list(&entries).map_err(|e| {
            let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
            invalid(format!("header {e:?} (headers: {})", names.join(", ")))
        })?;
        let request = OutgoingRequest::new(fields);
        request
            .set_method(&method(&self.method))
            .map_err(|()| invalid(format!("invalid method {:?}", self.method)))?;
        request
            .set_scheme(Some(&scheme))
            .map_err(|()| invalid(format!("invalid scheme in {:?}", self.url)))?;
        // An empty authority (as in `file:///x`) is left unset; the host then refuses the
        // request for its scheme or for having no host.
        if !authority.is_empty() {
            request
                .set_authority(Some(authority))
                .map_err(|()| invalid(format!("invalid host in {:?}", self.url)))?;
        }
        request
            .set_path_with_query(Some(&path))
            .map_err(|()| invalid(format!("invalid path in {:?}", self.url)))?;
        let body = match &self.body {
            Some(_) => Some(
                request
                    .body()
                    .map_err(|()| invalid("request body already taken".into()))?,
            ),
            None => None,
        };
        let options = RequestOptions::new();
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = options.set_connect_timeout(self.connect_timeout.map(ns));
        let _ = options.set_first_byte_timeout(self.first_byte_timeout.map(ns));
        let _ = options.set_between_bytes_timeout(self.between_bytes_timeout.map(ns));
        let future = outgoing_handler::handle(request, Some(options)).map_err(|code| {
            let mut e = HttpError::code(code);
            if unsupported {
                e.kind = HttpErrorKind::Invalid;
            }
            e
        })?;
        if let (Some(body), Some(bytes)) = (body, self.body) {
            write_body(body, &bytes)?;
        }
        Ok(Pending { future })
    }
}

/// A request in flight; [`Pending::wait`] for its response.
#[derive(Debug)]
pub struct Pending {
    future: FutureIncomingResponse,
}

impl Pending {
    /// Waits for the response and reads its whole body.
    pub fn wait(self) -> Result<Response, HttpError> {
        self.future.subscribe().block();
        let response = match self.future.get() {
            Some(Ok(Ok(r))) => r,
            Some(Ok(Err(code))) => return Err(HttpError::code(code)),
            Some(Err(())) | None => {
                return Err(HttpError::new(
                    HttpErrorKind::Failed,
                    "the response was not available",
                ));
            }
        };
        let status = response.status();
        let headers = response.headers().entries();
        let failed = |m: String| HttpError::new(HttpErrorKind::Failed, m);
        let body = response
            .consume()
            .map_err(|()| failed("response body already taken".into()))?;
        let mut bytes = Vec::new();
        {
            let stream = body
                .stream()
                .map_err(|()| failed("response body stream already taken".into()))?;
            loop {
                match stream.blocking_read(64 << 10) {
                    Ok(chunk) => bytes.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        return Err(match wit::http_error_code(&e) {
                            Some(code) => HttpError::code(code),
                            None => failed(format!("reading the body: {}", e.to_debug_string())),
                        });
                    }
                }
            }
        }
        drop(body);
        Ok(Response {
            status,
            headers,
            body: bytes,
        })
    }
}

/// Sends a `GET` request and reads the whole response.
pub fn get(url: &str) -> Result<Response, HttpError> {
    Request::get(url).send()
}

fn method(m: &str) -> Method {
    match m.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        _ => Method::Other(m.to_owned()),
    }
}

/// `scheme://authority/path?query` into its parts; the fragment is dropped.
fn split_url(url: &str) -> Result<(Scheme, &str, String), String> {
    let (scheme, rest) = url
        .split_once(':')
        .ok_or_else(|| format!("{url:?} is not an absolute URL"))?;
    let rest = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("{url:?} is not an absolute URL (scheme://host/path)"))?;
    let rest = rest.split('#').next().unwrap_or_default();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => Scheme::Other(scheme.to_owned()),
    };
    Ok((scheme, authority, path))
}

fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    let failed = |m: String| HttpError::new(HttpErrorKind::Failed, m);
    {
        let out = body
            .write()
            .map_err(|()| failed("request body stream already taken".into()))?;
        // blocking-write-and-flush takes at most 4096 bytes per call.
        for chunk in bytes.chunks(4096) {
            out.blocking_write_and_flush(chunk)
                .map_err(|e| failed(format!("writing the request body: {e:?}")))?;
        }
    }
    OutgoingBody::finish(body, None).map_err(HttpError::code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        let (s, a, p) = split_url("https://api.example.com:8443/v1/x?y=1#frag").unwrap();
        assert!(matches!(s, Scheme::Https));
        assert_eq!((a, p.as_str()), ("api.example.com:8443", "/v1/x?y=1"));
        let (s, a, p) = split_url("http://[::1]:8080").unwrap();
        assert!(matches!(s, Scheme::Http));
        assert_eq!((a, p.as_str()), ("[::1]:8080", "/"));
        let (s, a, p) = split_url("http://h?q").unwrap();
        assert!(matches!(s, Scheme::Http));
        assert_eq!((a, p.as_str()), ("h", "/?q"));
        let (s, a, p) = split_url("file:///etc/passwd").unwrap();
        assert!(matches!(s, Scheme::Other(ref o) if o == "file"));
        assert_eq!((a, p.as_str()), ("", "/etc/passwd"));
        assert!(split_url("example.com/x").is_err());
        assert!(split_url("mailto:a@b.c").is_err());
    }

    #[test]
    fn refusals_are_fatal_and_failures_retryable() {
        let e: Error = HttpError::code(ErrorCode::HttpRequestDenied).into();
        assert_eq!(e.kind(), crate::ErrorKind::Fatal);
        assert_eq!(e.message(), "HTTP request: ErrorCode::HttpRequestDenied");
        let e: Error = HttpError::code(ErrorCode::ConnectionTimeout).into();
        assert_eq!(e.kind(), crate::ErrorKind::Retryable);
    }
}

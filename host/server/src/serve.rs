//! The HTTP server: hyper's HTTP/1 connections under the limits `axum::serve` lacks, so
//! that clients who never finish a request cannot hold the server's tasks and files.
//!
//! - Header timeout (hyper's `header_read_timeout`): a request's headers must be complete
//!   within it. hyper 1.x restarts that timer when a keep-alive connection goes idle after
//!   a response, so it also bounds a connection waiting for its next request; no separate
//!   idle timer is needed (`tests/tests/connections.rs` holds it to that).
//! - Body timeout ([`StallBody`]): a body that sends nothing for that long while the
//!   handler reads it ends the request with 408 and the connection with it. Only pauses
//!   count, so a large upload at any steady speed, and a long-poll whose body is complete,
//!   go on as long as they need.
//! - Connection caps ([`Table`]): in all (lowered to fit `RLIMIT_NOFILE`) and per client
//!   address. A connection over a cap is answered a fixed 503 with one non-blocking write
//!   and closed in the accept loop: no task, no parsing, a few microseconds. Refusals are
//!   logged once, then summed up at most every [`LOG_EVERY`].
//! - Request line and headers: at most [`MAX_HEAD_BYTES`] (431 past it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::config::HttpLimits;
use crate::error::ApiError;

/// Refusals and accept errors are logged at most this often (the first one at once).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A connection's read buffer, so the most a request's line and headers may take (431
/// past it). hyper's default of ~400 KiB would let every held connection pin that much.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// After an accept error other than a dropped handshake (out of files or memory), wait
/// this long before accepting again: the pending connection would fail the same way.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` fires, then stops accepting, lets the
/// requests in flight finish and returns when every connection has closed. Nothing here
/// ends the server early: accept errors are logged and retried.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    shutdown: CancellationToken,
) {
    let max_total = fit_open_file_limit(limits.max_connections);
    let table = Arc::new(Table::new(max_total, limits.max_connections_per_ip));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let mut log = RefusalLog::default();
    tracing::debug!(
        max_connections = max_total,
        max_connections_per_ip = limits.max_connections_per_ip,
        header_timeout = ?limits.header_timeout,
        body_timeout = ?limits.body_timeout,
        "HTTP limits"
    );

    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep_until(log.quiet_until), if log.pending() => {
                log.summarise();
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // The client gave up between its handshake and our accept.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                log.accept_error(&e);
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let slot = match Table::take(&table, peer.ip()) {
            Ok(slot) => slot,
            Err(cap) => {
                refuse(stream, cap);
                log.refused(cap, peer);
                continue;
            }
        };
        // Responses are written whole: waiting to coalesce them only adds latency.
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(
            TokioIo::new(stream),
            service(router.clone(), limits.body_timeout),
        );
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = shutdown.cancelled() => {
                    // Finishes the request in flight, then closes; an idle connection
                    // closes at once.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "HTTP connection ended");
            }
        });
    }
    // New connections are refused by the kernel from here on.
    drop(listener);
    log.summarise();
    table.closed().await;
}

/// Errors of one connection that was dropped before we accepted it (as `axum::serve`).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Raises the soft open-file limit to the hard one (as Go's runtime does at start: the
/// soft default of 1024 is a relic of `select`) and returns the connection cap that fits
/// in it with a reserve for the store, the component cache, Redis and the guests' HTTP.
fn fit_open_file_limit(wanted: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let Some(mut soft) = limit.current else {
        return wanted;
    };
    if let Some(hard) = limit.maximum
        && hard > soft
        && setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        )
        .is_ok()
    {
        soft = hard;
    }
    let reserve = (soft / 4).min(256);
    let fits = usize::try_from(soft - reserve).unwrap_or(usize::MAX);
    if fits < wanted {
        tracing::warn!(
            max_connections = fits,
            asked = wanted,
            open_file_limit = soft,
            "the open-file limit (ulimit -n) lowers the HTTP connection cap"
        );
    }
    wanted.min(fits)
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    Total,
    PerAddress,
}

/// Open connections, in all and per client address.
struct Table {
    max_total: usize,
    max_per_address: usize,
    counts: Mutex<Counts>,
    /// Told when the last connection closes.
    none_open: Notify,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One open connection's place in the [`Table`], given back when dropped.
struct Slot {
    table: Arc<Table>,
    address: IpAddr,
}

impl Table {
    fn new(max_total: usize, max_per_address: usize) -> Table {
        Table {
            max_total,
            max_per_address,
            counts: Mutex::new(Counts::default()),
            none_open: Notify::new(),
        }
    }

    /// Returns once no connection is open.
    async fn closed(&self) {
        loop {
            // Made before the check, so a close in between still wakes it.
            let notified = self.none_open.notified();
            if self.counts.lock().unwrap_or_else(|e| e.into_inner()).total == 0 {
                return;
            }
            notified.await;
        }
    }

    fn take(table: &Arc<Table>, ip: IpAddr) -> Result<Slot, Cap> {
        let address = client_address(ip);
        let mut counts = table.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.total >= table.max_total {
            return Err(Cap::Total);
        }
        let mine = counts.per_address.entry(address).or_insert(0);
        if *mine >= table.max_per_address {
            return Err(Cap::PerAddress);
        }
        *mine += 1;
        counts.total += 1;
        Ok(Slot {
            table: table.clone(),
            address,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.table.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.total -= 1;
        if counts.total == 0 {
            self.table.none_open.notify_waiters();
        }
        if let Some(n) = counts.per_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                counts.per_address.remove(&self.address);
            }
        }
    }
}

/// The address a client is counted under: an IPv6 client holds a whole /64 (one host
/// usually does), so it is counted per /64 rather than per address.
fn client_address(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Answers a connection over a cap and closes it: one write that never waits (a fresh
/// socket's send buffer is empty), nothing read.
fn refuse(stream: TcpStream, cap: Cap) {
    if let Ok(mut socket) = stream.into_std() {
        let _ = socket.write(refusal_response(cap));
    }
}

fn refusal_response(cap: Cap) -> &'static [u8] {
    fn response(message: &str) -> Vec<u8> {
        let body = serde_json::json!({
            "error": { "code": "too_many_connections", "message": message }
        })
        .to_string();
        format!(
            "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
             content-type: application/json\r\nretry-after: 1\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
    static TOTAL: LazyLock<Vec<u8>> =
        LazyLock::new(|| response("the server has too many open connections; try again later"));
    static PER_ADDRESS: LazyLock<Vec<u8>> = LazyLock::new(|| {
        response("too many open connections from your address; close some or try again later")
    });
    match cap {
        Cap::Total => &TOTAL,
        Cap::PerAddress => &PER_ADDRESS,
    }
}

/// Rate-limited logging of refused connections and accept errors.
struct RefusalLog {
    /// Nothing is logged before this; what happens meanwhile is summed up then.
    quiet_until: Instant,
    total: u64,
    per_address: u64,
    accept_errors: u64,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog {
            quiet_until: Instant::now(),
            total: 0,
            per_address: 0,
            accept_errors: 0,
        }
    }
}

impl RefusalLog {
    fn pending(&self) -> bool {
        self.total + self.per_address + self.accept_errors > 0
    }

    /// Logs now if the last line is old enough, else counts it for the summary.
    fn quiet(&mut self) -> bool {
        let now = Instant::now();
        if now < self.quiet_until {
            return true;
        }
        self.quiet_until = now + LOG_EVERY;
        false
    }

    fn refused(&mut self, cap: Cap, peer: SocketAddr) {
        if !self.quiet() {
            tracing::warn!(%peer, cap = ?cap, "refused a connection over the cap (further refusals are summed up every 10s)");
            return;
        }
        match cap {
            Cap::Total => self.total += 1,
            Cap::PerAddress => self.per_address += 1,
        }
    }

    fn accept_error(&mut self, e: &io::Error) {
        if !self.quiet() {
            tracing::error!(error = %e, "cannot accept connections");
            return;
        }
        self.accept_errors += 1;
    }

    fn summarise(&mut self) {
        if !self.pending() {
            return;
        }
        tracing::warn!(
            over_total_cap = self.total,
            over_per_address_cap = self.per_address,
            accept_errors = self.accept_errors,
            "connections refused in the last 10s"
        );
        self.total = 0;
        self.per_address = 0;
        self.accept_errors = 0;
        self.quiet_until = Instant::now() + LOG_EVERY;
    }
}

/// The router behind the body timeout: a request whose body stalled is answered 408
/// whatever the handler made of the error, and its connection closed (the rest of the
/// body may never come, so the next request could not be found).
fn service(
    router: Router,
    body_timeout: Duration,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send + 'static,
> + Clone {
    let service = move |req: Request<Incoming>| {
        let stalled = Arc::new(AtomicBool::new(false));
        let req = req.map(|body| {
            axum::body::Body::new(StallBody {
                inner: body,
                timeout: body_timeout,
                timer: None,
                armed: false,
                stalled: stalled.clone(),
            })
        });
        let mut router = router.clone();
        async move {
            let response = router.call(req).await;
            if stalled.load(Ordering::Relaxed) {
                return Ok(body_timeout_response(body_timeout));
            }
            response
        }
    };
    hyper::service::service_fn(service)
}

fn body_timeout_response(timeout: Duration) -> Response {
    let mut response = ApiError {
        status: StatusCode::REQUEST_TIMEOUT,
        code: "body_timeout",
        message: format!(
            "the request body sent nothing for {}; send it without pauses that long",
            humantime::format_duration(timeout)
        ),
        retry_after_ms: None,
    }
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body that fails once it has sent nothing for `timeout` while being read.
struct StallBody {
    inner: Incoming,
    timeout: Duration,
    /// Made on the first wait: most bodies arrive with their headers and never wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// The timer runs for the current wait (since the last frame).
    armed: bool,
    stalled: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?}")]
struct BodyStalled(Duration);

impl Body for StallBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if !this.armed {
            let deadline = Instant::now() + this.timeout;
            match &mut this.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            this.armed = true;
        }
        let timer = this.timer.as_mut().expect("armed above");
        if timer.as_mut().poll(cx).is_ready() {
            this.stalled.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(BodyStalled(this.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal on real sockets: every client over its cap gets the 503 and the close,
    /// without a request read and without the table changing. What it costs (a few µs:
    /// accept, the 503 write and the close) is printed, not asserted: a timing is a
    /// benchmark's figure, and a loaded machine made this one fail as a test.
    #[tokio::test]
    async fn refusals_answer_503_and_leave_the_table_alone() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        let table = Arc::new(Table::new(1, 1));
        let _held = Table::take(&table, to.ip()).unwrap();
        // Under the listen backlog (128): every handshake is done before the clock starts.
        let mut clients = Vec::new();
        for _ in 0..100 {
            clients.push(TcpStream::connect(to).await.unwrap());
        }
        let started = std::time::Instant::now();
        for _ in 0..100 {
            let (stream, peer) = listener.accept().await.unwrap();
            let cap = Table::take(&table, peer.ip()).err().unwrap();
            refuse(stream, cap);
        }
        println!(
            "a refused connection cost the server {:?}",
            started.elapsed() / 100
        );
        for mut client in clients {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut got)
                .await
                .unwrap();
            assert!(got.starts_with(b"HTTP/1.1 503 "), "{got:?}");
        }
        assert_eq!(table.counts.lock().unwrap().total, 1);
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_address(a), client_address(b));
        assert_ne!(client_address(a), client_address(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(
            client_address(mapped),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
    }
}

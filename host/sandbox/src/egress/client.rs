//! The client: a TCP (and TLS) connection to exactly one checked address, the request
//! sent with clamped timeouts, and the response body capped as it streams.

use super::*;

/// The TLS client: webpki's roots, ring, TLS 1.2 and 1.3. Built once.
pub(crate) fn tls_config() -> Arc<rustls::ClientConfig> {
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

pub(crate) trait Stream:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

pub(crate) async fn send(
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
pub(crate) struct GuardedBody {
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
pub(crate) struct Guarded {
    incoming: hyper::body::Incoming,
    guard: GuardedBody,
}

pub(crate) type Polled = Poll<Option<Result<Frame<Bytes>, Error>>>;

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

//! Webhook POSTs (`wasq_core::notify`) from the host, through the guard's rules: an
//! `http` or `https` URL whose host is a canonical name or IP literal, DNS resolved here
//! with every address checked (loopback only with `allow_loopback`), a connection to
//! exactly a checked address, TLS with webpki's roots, no redirects followed, one timeout
//! for the whole exchange, the answer's body not read.

use http_body_util::Full;

use super::*;

/// Where a webhook goes: the parts of its URL the connection needs.
#[derive(Debug, Clone)]
struct Endpoint {
    tls: bool,
    host: Host,
    port: u16,
    authority: String,
    path: String,
}

fn endpoint(url: &str) -> Result<Endpoint, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("{url:?}: only http and https URLs are allowed")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?} has no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("{url:?}: no user name or password in the URL"));
    }
    let host = parse_host(authority.host())?;
    Ok(Endpoint {
        tls,
        host,
        port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        authority: authority.as_str().to_owned(),
        path: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}

/// A notify URL as the guard will take it: `Err` says why not (checked at deploy, so a
/// function cannot name a URL that could never be sent to).
pub fn check_webhook_url(url: &str) -> Result<(), String> {
    endpoint(url).map(drop)
}

/// One POST of `body` with `headers` to `url`, within `timeout`: `Ok(status)` for any
/// answer (the caller decides what counts as delivered), `Err` for a refused destination
/// or a failed exchange, with the reason.
pub async fn post_webhook(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
    timeout: Duration,
    allow_loopback: bool,
) -> Result<u16, String> {
    let target = endpoint(url)?;
    let exchange = async {
        let addrs: Vec<SocketAddr> = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Name(name) => tokio::net::lookup_host((name.as_str(), target.port))
                .await
                .map_err(|e| format!("looking up {name} failed: {e}"))?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(format!("{} has no addresses", target.host));
        }
        check_addresses(&target.host, &addrs, allow_loopback)
            .map_err(|why| format!("refused: {why}"))?;
        let mut last = None;
        let mut tcp = None;
        for a in &addrs {
            match TcpStream::connect(*a).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = tcp.ok_or_else(|| {
            format!(
                "could not connect: {}",
                last.map_or_else(|| "no address".to_owned(), |e| e.to_string())
            )
        })?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Stream> = if target.tls {
            let name = match &target.host {
                Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone())
                    .map_err(|_| format!("{n} is not a valid TLS server name"))?,
                Host::Ip(ip) => rustls::pki_types::ServerName::from(*ip),
            };
            let tls = tokio_rustls::TlsConnector::from(tls_config())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake::<_, Full<Bytes>>(wasmtime_wasi_http::io::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let driven = tokio::spawn(conn);
        let mut request = http::Request::post(target.path.as_str())
            .header(header::HOST, target.authority.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, "wasq-webhooks");
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("bad request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{e}"));
        driven.abort();
        Ok(response?.status().as_u16())
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

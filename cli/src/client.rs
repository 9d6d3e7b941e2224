//! A thin HTTP client for the wasq API that turns every failure into one readable error.

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

pub(crate) struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client sending `key` (if any) as `Authorization: Bearer` on every request.
    pub(crate) fn new(base: &str, key: Option<&str>) -> Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(anyhow!(
                "--server / WASQ_SERVER must be an http:// URL, got {base:?}"
            ));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = key {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| anyhow!("the API key contains characters a header cannot carry"))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client { base, http })
    }

    pub(crate) async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        self.send(self.http.get(self.url(path)).query(query)).await
    }

    pub(crate) async fn post_json(&self, path: &str, body: String) -> Result<Value> {
        let req = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        self.send(req).await
    }

    pub(crate) async fn post_run(
        &self,
        path: &str,
        body: String,
        idempotency_key: Option<&str>,
    ) -> Result<Value> {
        let mut req = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = idempotency_key {
            req = req.header("idempotency-key", key);
        }
        self.send(req).await
    }

    pub(crate) async fn put_bytes(
        &self,
        path: &str,
        query: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Value> {
        let req = self
            .http
            .put(self.url(path))
            .query(query)
            .header("content-type", "application/wasm")
            .body(body);
        self.send(req).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value> {
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() {
                anyhow!("cannot reach wasq at {}: is `wasq dev` running? (or set --server / WASQ_SERVER)", self.base)
            } else {
                anyhow!("request to {} failed: {e}", self.base)
            }
        })?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .with_context(|| format!("reading the answer from {}", self.base))?;
        let json: Option<Value> = serde_json::from_slice(&body).ok();
        if status.is_success() {
            return json.ok_or_else(|| {
                anyhow!("the server answered {status} with a body that is not JSON")
            });
        }
        // The message may quote what a tenant sent: escaped and bounded like all output.
        let message = match json.as_ref().and_then(|j| j["error"]["message"].as_str()) {
            Some(m) => crate::out::line(m, crate::out::LONG),
            None => crate::out::line(
                String::from_utf8_lossy(&body[..body.len().min(crate::out::LONG)]).trim(),
                crate::out::LONG,
            ),
        };
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
            " (pass --key or set WASQ_KEY; `wasq dev` writes its key to .wasq/dev.key)"
        } else {
            ""
        };
        Err(anyhow!(
            "{} {}: {message}{hint}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        ))
    }
}

/// Percent-encodes one URL path segment (names and ids are plain, but never trust input).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

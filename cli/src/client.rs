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

    /// The server's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
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

    /// Opens a Server-Sent Events stream (`last_id`: resume after that event); the
    /// response, to read with `chunk()`, once the server accepted it.
    pub(crate) async fn events(
        &self,
        path: &str,
        last_id: Option<&str>,
    ) -> Result<reqwest::Response> {
        let mut req = self
            .http
            .get(self.url(path))
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.refusal(resp).await)
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        if e.is_connect() {
            anyhow!(
                "cannot reach wasq at {}: is `wasq dev` running? (or set --server / WASQ_SERVER)",
                self.base
            )
        } else {
            anyhow!("request to {} failed: {e}", self.base)
        }
    }

    async fn refusal(&self, resp: reqwest::Response) -> anyhow::Error {
        let status = resp.status();
        match resp.bytes().await {
            Ok(body) => self.error(status, &body),
            Err(e) => anyhow!("reading the answer from {}: {e}", self.base),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .with_context(|| format!("reading the answer from {}", self.base))?;
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map_err(|_| anyhow!("the server answered {status} with a body that is not JSON"));
        }
        Err(self.error(status, &body))
    }

    /// The error of a refused request: its status and the server's message.
    fn error(&self, status: reqwest::StatusCode, body: &[u8]) -> anyhow::Error {
        let json: Option<Value> = serde_json::from_slice(body).ok();
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
        anyhow!(
            "{} {}: {message}{hint}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        )
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

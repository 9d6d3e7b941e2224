//! Sends the HTTP requests it is given through wasi:http (the host's egress guard) and
//! reports what each one got: used by the egress tests, legitimate and hostile alike.
//!
//! Input: `{"requests": [{"url": "...", "method": "GET", "headers": [["name", "value"]],
//! "body": "...", "timeout_ms": 1000}], "parallel": N}`. Up to `parallel` requests
//! (default 1) are started before the first is waited for.
//! Output: `{"results": [...]}`, per request `{"status", "body_len", "body"}` (the first 200
//! bytes of the body as text) or `{"error": "..."}`.

use std::time::Duration;

use wasq_guest::http::{HttpError, Pending, Request};
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, info};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    requests: Vec<Req>,
    #[serde(default)]
    parallel: Option<usize>,
}

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Req {
    url: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

fn start(r: &Req) -> Result<Pending, HttpError> {
    let mut req = Request::new(r.method.as_deref().unwrap_or("GET"), &r.url);
    for (k, v) in &r.headers {
        req = req.header(k, v.as_bytes());
    }
    if let Some(b) = &r.body {
        req = req.body(b.as_bytes());
    }
    if let Some(ms) = r.timeout_ms {
        req = req.timeout(Duration::from_millis(ms));
    }
    req.start()
}

fn fetch(input: Input) -> Result<Value, Error> {
    let parallel = input.parallel.unwrap_or(1).max(1);
    let mut results = Vec::with_capacity(input.requests.len());
    for batch in input.requests.chunks(parallel) {
        let started: Vec<Result<Pending, HttpError>> = batch.iter().map(start).collect();
        for s in started {
            let outcome = s.and_then(Pending::wait);
            results.push(match outcome {
                Ok(resp) => {
                    let prefix = &resp.body[..resp.body.len().min(200)];
                    json!({
                        "status": resp.status,
                        "body_len": resp.body.len(),
                        "body": String::from_utf8_lossy(prefix),
                        "location": resp.header("location").map(String::from_utf8_lossy),
                    })
                }
                Err(e) => json!({ "error": e.message(), "kind": format!("{:?}", e.kind()) }),
            });
        }
    }
    info!("fetched {} URLs", results.len());
    Ok(json!({ "results": results }))
}

wasq_guest::task!(fetch);

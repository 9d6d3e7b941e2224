//! Traces (issue 16): a run created by a `wasq server` process and executed by a `wasq
//! worker` process on Redis is one trace — the request's span, the worker's attempt, its
//! steps and its finish share the trace id, whether the client sent a `traceparent` or not
//! — and the guest's outbound HTTP carries the attempt's `traceparent`.
//!
//! The OTLP receiver is a stand-in: a small HTTP server on loopback that takes
//! `POST /v1/traces` and decodes the protobuf `ExportTraceServiceRequest` the daemons'
//! exporters send (OTLP/HTTP with protobuf, their only encoding) with the
//! `opentelemetry-proto` types. The daemons export every 100 ms
//! (`OTEL_BSP_SCHEDULE_DELAY`), and the test polls what arrived until a deadline.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasq_store_redis::testing::{RedisOptions, RedisServer};
use wasq_tests::*;

const WAIT: Duration = Duration::from_secs(60);

/// One request a [`Recorder`] received.
#[derive(Debug, Clone)]
struct Received {
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// An HTTP/1.1 server on loopback that answers every request 200 (empty body, keep-alive)
/// and records it: the OTLP receiver, and the service the guest calls.
#[derive(Clone)]
struct Recorder {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let recorder = Recorder {
            addr: listener.local_addr().unwrap(),
            received: Arc::default(),
        };
        let received = recorder.received.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, received.clone()));
            }
        });
        recorder
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn serve(mut stream: tokio::net::TcpStream, received: Arc<Mutex<Vec<Received>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let target = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("")
            .to_owned();
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = buf[head_end..head_end + len].to_vec();
        buf.drain(..head_end + len);
        received.lock().unwrap().push(Received {
            target,
            headers,
            body,
        });
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent: String,
    attributes: HashMap<String, String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| {
            let v = match kv.value.as_ref()?.value.as_ref()? {
                Any::StringValue(s) => s.clone(),
                Any::IntValue(i) => i.to_string(),
                Any::BoolValue(b) => b.to_string(),
                other => format!("{other:?}"),
            };
            Some((kv.key.clone(), v))
        })
        .collect()
}

/// Every span the receiver got so far.
fn spans(receiver: &Recorder) -> Vec<Span> {
    let mut out = Vec::new();
    for r in receiver.received() {
        assert_eq!(r.target, "/v1/traces", "only traces are exported");
        assert_eq!(
            r.headers.get("content-type").map(String::as_str),
            Some("application/x-protobuf")
        );
        let export = ExportTraceServiceRequest::decode(&r.body[..]).expect("an OTLP export");
        for rs in export.resource_spans {
            let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Span {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        attributes: text(&s.attributes),
                    });
                }
            }
        }
    }
    out
}

/// The spans of trace `trace_id` once `done` holds of them, polled until [`WAIT`].
async fn trace_when(
    receiver: &Recorder,
    trace_id: &str,
    done: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    let deadline = Instant::now() + WAIT;
    loop {
        let of_trace: Vec<Span> = spans(receiver)
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        if done(&of_trace) {
            return of_trace;
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace_id} incomplete after {WAIT:?}: {of_trace:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn named<'a>(spans: &'a [Span], service: &str, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect()
}

/// The one span of `service` named `name`.
fn one<'a>(spans: &'a [Span], service: &str, name: &str) -> &'a Span {
    let found = named(spans, service, name);
    assert_eq!(found.len(), 1, "one {service} span {name:?} in {spans:#?}");
    found[0]
}

/// The spans a run's execution makes, once all of them arrived: the worker's attempt,
/// its three steps and its finish.
fn executed(spans: &[Span]) -> bool {
    named(spans, "wasq-worker", "attempt").len() == 1
        && named(spans, "wasq-worker", "step").len() == 3
        && named(spans, "wasq-worker", "finish").len() == 1
}

/// Checks the worker's spans of one execution hang off `parent` (the request's span):
/// attempt → steps a, b, c and finish. Returns the attempt span.
fn check_execution<'a>(spans: &'a [Span], parent: &str) -> &'a Span {
    let attempt = one(spans, "wasq-worker", "attempt");
    assert_eq!(attempt.parent, parent, "the attempt continues the request");
    let mut steps: Vec<&str> = named(spans, "wasq-worker", "step")
        .into_iter()
        .map(|s| {
            assert_eq!(s.parent, attempt.span_id, "a step is the attempt's: {s:?}");
            s.attributes["step.name"].as_str()
        })
        .collect();
    steps.sort();
    assert_eq!(steps, ["a", "b", "c"]);
    let finish = one(spans, "wasq-worker", "finish");
    assert_eq!(
        finish.parent, attempt.span_id,
        "the finish is the attempt's"
    );
    assert_eq!(finish.attributes["status"], "succeeded", "{finish:?}");
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_run_is_one_trace_across_the_api_server_and_a_worker_on_redis() {
    let redis = RedisServer::start(RedisOptions::default());
    let url = redis.url();
    let receiver = Recorder::start().await;
    let service = Recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let data = |name: &str| path(name).to_string_lossy().into_owned();
    let addr = format!("127.0.0.1:{}", free_port());
    let fast_export = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    // The server is given the flag, the worker the standard environment variable.
    let _server = DaemonProcess::spawn_with_env(
        &[
            "server",
            "--redis",
            &url,
            "--listen",
            &addr,
            "--data",
            &data("server"),
            "--otlp-endpoint",
            &receiver.url(),
        ],
        Some(path("server.log")),
        &fast_export,
    );
    let _worker = DaemonProcess::spawn_with_env(
        &[
            "worker",
            "--redis",
            &url,
            "--allow-loopback-egress",
            "--data",
            &data("worker"),
        ],
        Some(path("worker.log")),
        &[
            fast_export[0],
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url()),
        ],
    );
    let operator = Api::new(addr.parse().unwrap());
    wait_healthy(&operator, Duration::from_secs(30)).await;
    let admin_key = std::fs::read_to_string(path("server/admin.key")).unwrap();
    let api = operator
        .as_key(Some(admin_key.trim().to_owned()))
        .new_tenant("acme")
        .await;
    // Three steps, each calling the service (`count_url`).
    api.deploy("three", guest("three_steps"), "allow_hosts=127.0.0.1")
        .await;
    let input = serde_json::json!({ "count_url": format!("{}/hit", service.url()) }).to_string();
    let create = |traceparent: Option<&str>| {
        let mut req = api
            .http
            .post(format!("{}/v1/functions/three/runs", api.base))
            .body(input.clone());
        if let Some(t) = traceparent {
            req = req.header("traceparent", t);
        }
        async move {
            let resp = req.send().await.expect("the server answers");
            assert_eq!(resp.status(), 201);
            resp.json::<Value>().await.unwrap()
        }
    };

    // A client continuing its own trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let run = create(Some(&format!("00-{trace_id}-{client_span}-01"))).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let ended = api.wait_run(&id, WAIT).await;
    assert_eq!(ended["status"], "succeeded", "{ended:#}");
    let spans = trace_when(&receiver, trace_id, |s| {
        executed(s) && !named(s, "wasq-server", "POST /v1/functions/{name}/runs").is_empty()
    })
    .await;
    let request = one(&spans, "wasq-server", "POST /v1/functions/{name}/runs");
    assert_eq!(
        request.parent, client_span,
        "the request continues the client's span"
    );
    assert_eq!(
        request.attributes["http.route"],
        "/v1/functions/{name}/runs"
    );
    assert_eq!(request.attributes["http.response.status_code"], "201");
    // The run keeps the request span's context, which the worker continued.
    assert_eq!(
        run["trace"],
        format!("00-{trace_id}-{}-01", request.span_id),
        "{run:#}"
    );
    let attempt = check_execution(&spans, &request.span_id);
    assert_eq!(attempt.attributes["run"], id);
    // Each outbound request of the guest carried the attempt's context.
    let calls: Vec<Received> = service
        .received()
        .into_iter()
        .filter(|r| r.target.contains(&format!("run={id}")))
        .collect();
    assert_eq!(calls.len(), 3, "one per step: {calls:?}");
    for call in &calls {
        assert_eq!(
            call.headers.get("traceparent"),
            Some(&format!("00-{trace_id}-{}-01", attempt.span_id)),
            "{call:?}"
        );
    }

    // A client that sends none: the request starts a trace, which the run keeps and the
    // worker continues.
    let run = create(None).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let traceparent = run["trace"].as_str().expect("the run keeps its trace");
    let (fresh, request_span) = (&traceparent[3..35], &traceparent[36..52]);
    assert_ne!(fresh, trace_id, "a new trace");
    let ended = api.wait_run(&id, WAIT).await;
    assert_eq!(ended["status"], "succeeded", "{ended:#}");
    let spans = trace_when(&receiver, fresh, |s| {
        executed(s) && !named(s, "wasq-server", "POST /v1/functions/{name}/runs").is_empty()
    })
    .await;
    let request = one(&spans, "wasq-server", "POST /v1/functions/{name}/runs");
    assert_eq!(request.span_id, request_span);
    assert_eq!(request.parent, "", "a root span");
    check_execution(&spans, request_span);
    // Reading the run is a trace of its own, not this one.
    assert!(named(&spans, "wasq-server", "GET /v1/runs/{id}").is_empty());
    let services: std::collections::BTreeSet<&str> =
        spans.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services.into_iter().collect::<Vec<_>>(),
        ["wasq-server", "wasq-worker"]
    );
}

/// Without an exporter (the in-process daemon installs none) wasq makes no trace context of
/// its own, and costs nothing for runs without one: a client's `traceparent` is kept as
/// sent — by a single create, a batch, an event — and the guest's outbound HTTP carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_exporter_a_client_s_traceparent_is_passed_through() {
    let daemon = Daemon::start_with(|c| c.sandbox.allow_loopback_egress = true).await;
    let api = &daemon.api;
    let service = Recorder::start().await;
    api.deploy(
        "three",
        guest("three_steps"),
        "allow_hosts=127.0.0.1&events=traced.go",
    )
    .await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let input = serde_json::json!({ "count_url": format!("{}/hit", service.url()) });
    let post = |path: &str, body: String, traced: bool| {
        let mut req = api.http.post(format!("{}{path}", api.base)).body(body);
        if traced {
            req = req.header("traceparent", traceparent);
        }
        async move {
            let resp = req.send().await.expect("the daemon answers");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };

    let (status, run) = post("/v1/functions/three/runs", input.to_string(), true).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["trace"], traceparent, "kept as sent");
    let id = run["id"].as_str().unwrap().to_owned();
    let ended = api.wait_run(&id, WAIT).await;
    assert_eq!(ended["status"], "succeeded", "{ended:#}");
    assert_eq!(ended["trace"], traceparent);
    let calls: Vec<Received> = service
        .received()
        .into_iter()
        .filter(|r| r.target.contains(&format!("run={id}")))
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    for call in &calls {
        assert_eq!(
            call.headers.get("traceparent").map(String::as_str),
            Some(traceparent)
        );
    }

    // Without one, and with one that is not a traceparent: none is kept.
    let (_, plain) = post("/v1/functions/three/runs", "{}".into(), false).await;
    assert!(plain.get("trace").is_none(), "{plain}");
    let resp = api
        .http
        .post(format!("{}/v1/functions/three/runs", api.base))
        .header(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        )
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "ignored, not refused");
    assert!(resp.json::<Value>().await.unwrap().get("trace").is_none());

    // A batch's runs and an event's runs keep the request's.
    let batch = serde_json::json!({ "runs": [{ "input": {} }, { "input": {} }] }).to_string();
    let (status, made) = post("/v1/functions/three/runs:batch", batch, true).await;
    assert_eq!(status, 201, "{made}");
    for run in made["runs"].as_array().unwrap() {
        assert_eq!(run["trace"], traceparent);
    }
    let event = serde_json::json!({ "name": "traced.go", "data": {} }).to_string();
    let (status, sent) = post("/v1/events", event, true).await;
    assert_eq!(status, 202, "{sent}");
    let started = sent["started"][0].as_str().unwrap();
    assert_eq!(api.run_detail(started).await["trace"], traceparent);
}

//! Untrusted uploads (security review items 23-26): refused early and clearly when too
//! big, when they use WebAssembly features or imports wasq does not provide, or when they
//! are precompiled code; compiled in a child process bounded in time and memory, while
//! the API and the runs of other functions carry on.

use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_tests::{Api, Daemon, guest, wasq, wat_task};

const WAIT: Duration = Duration::from_secs(60);

fn message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A component of one core module with `body` in it, instantiated.
fn core_component(body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        "(component (core module $m {body}) (core instance (instantiate $m)))"
    ))
    .unwrap()
}

/// A deployable component that takes Cranelift a while: `run` echoes its input, and
/// `funcs` more functions of `ops` arithmetic statements each come along (about 0.2-0.35 s
/// per MB of wasm on the 2-core dev VM).
fn slow_component(funcs: usize, ops: usize) -> Vec<u8> {
    let mut w = String::from(
        r#"
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 1024))
    (func (export "cabi_realloc") (param i32 i32 i32) (param $size i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (global.set $heap (i32.add (local.get $p) (local.get $size)))
      (block $ok
        (loop $grow
          (br_if $ok (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
          (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
          (br $grow)))
      (local.get $p))
    (func (export "run") (param $ptr i32) (param $len i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.store (i32.const 8) (local.get $ptr))
      (i32.store (i32.const 12) (local.get $len))
      (i32.const 0))
"#,
    );
    for f in 0..funcs {
        w.push_str(&format!(
            "(func $f{f} (export \"f{f}\") (param i32) (result i32) \
             (local i32 i32 i32 i32 i32 i32 i32 i32)\n"
        ));
        for i in 0..ops {
            let a = i % 8 + 1;
            let b = (i * 7 + 3) % 8 + 1;
            w.push_str(&format!(
                "(local.set {a} (i32.add (local.get {b}) (i32.mul (local.get {a}) \
                 (i32.load offset={} (local.get 0)))))\n",
                (i * 4) % 60000
            ));
        }
        w.push_str("(local.get 1))\n");
    }
    wat_task(&w)
}

async fn refused(api: &Api, name: &str, bytes: Vec<u8>) -> String {
    let (status, body) = api.put(&format!("/v1/functions/{name}"), bytes).await;
    assert_eq!(status, 400, "{name}: {body}");
    assert_eq!(body["error"]["code"], "bad_component", "{name}: {body}");
    let (status, _) = api.get(&format!("/v1/functions/{name}")).await;
    assert_eq!(status, 404, "{name} must not be stored");
    message(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_imports_and_precompiled_code_are_refused_by_name() {
    let d = Daemon::start().await;

    let cases = [
        ("threads", "(memory 1 1 shared)", "threads"),
        ("memory64", "(memory i64 1)", "memory64"),
        (
            "gc",
            "(type (struct (field i32)))",
            "garbage collection (GC)",
        ),
        (
            "exceptions",
            "(tag $e) (func (throw $e))",
            "exception handling",
        ),
        ("multi-memory", "(memory 1) (memory 1)", "multi-memory"),
    ];
    for (name, body, feature) in cases {
        let msg = refused(&d.api, name, core_component(body)).await;
        assert!(
            msg.starts_with(&format!("the component uses {feature}"))
                && msg.contains("a WebAssembly feature wasq does not support"),
            "{name}: {msg}"
        );
    }

    let import = wat::parse_str(
        r#"(component (import "foo:bar/baz@1.0.0" (instance (export "f" (func)))))"#,
    )
    .unwrap();
    let msg = refused(&d.api, "imports", import).await;
    assert_eq!(
        msg,
        "the component imports `foo:bar/baz@1.0.0`, which this wasq host does not provide"
    );

    // A real precompiled artifact of a good component, made by wasq's own compile child
    // (the same engine configuration): still refused, never loaded.
    let mut child = wasq()
        .args([wasq_server::CHILD_ARG, "1073741824", "60"])
        .env_clear()
        .envs(wasq_server::CHILD_ENV.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let echo = guest("echo");
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &echo).unwrap());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "compile child: {:?}", out.status);
    assert_eq!(&out.stdout[..4], b"\x7fELF", "a .cwasm is an ELF file");
    let msg = refused(&d.api, "precompiled", out.stdout).await;
    assert!(msg.contains("precompiled artifact (.cwasm)"), "{msg}");

    let (_, fns) = d.api.get("/v1/functions").await;
    assert_eq!(fns, json!([]), "nothing stored");
    d.stop().await;
}

/// An endless-looking body produced lazily, 1 MiB at a time, counting what the server
/// pulled out of it.
struct Lazy {
    left: u64,
    declared: bool,
    sent: Arc<AtomicU64>,
}

impl http_body::Body for Lazy {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        static CHUNK: [u8; 1 << 20] = [0x61; 1 << 20];
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(CHUNK.len() as u64);
        self.left -= n;
        self.sent.fetch_add(n, Ordering::Relaxed);
        let chunk = bytes::Bytes::from_static(&CHUNK[..n as usize]);
        Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.declared {
            http_body::SizeHint::with_exact(self.left)
        } else {
            http_body::SizeHint::default()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gib_upload_is_refused_while_streaming() {
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    let limit = 64u64 << 20; // the default max_component_bytes
    for declared in [false, true] {
        let sent = Arc::new(AtomicU64::new(0));
        let body = Lazy {
            left: 1 << 30,
            declared,
            sent: sent.clone(),
        };
        let started = Instant::now();
        let resp = d
            .api
            .http
            .put(format!("{}/v1/functions/huge", d.api.base))
            .body(reqwest::Body::wrap(body))
            .send()
            .await;
        let took = started.elapsed();
        let sent = sent.load(Ordering::Relaxed);
        let how = if declared {
            "with Content-Length"
        } else {
            "chunked"
        };
        match resp {
            Ok(resp) => {
                assert_eq!(resp.status(), 413, "{how}");
                let body: Value = resp.json().await.unwrap();
                assert_eq!(body["error"]["code"], "too_large", "{body}");
                assert_eq!(
                    message(&body),
                    format!(
                        "the upload is over this server's limit of {limit} bytes per component"
                    )
                );
                println!("1 GiB {how}: 413 after {took:?}, {} MiB sent", sent >> 20);
            }
            // The server may close the connection while the client still sends.
            Err(e) => println!(
                "1 GiB {how}: connection closed after {took:?}, {} MiB sent: {e}",
                sent >> 20
            ),
        }
        // Chunked: read up to the limit and no further. With a Content-Length: refused
        // before the body is read. Plus what socket buffers and the client's own pipeline
        // hold either way.
        let bound = if declared {
            32 << 20
        } else {
            limit + (32 << 20)
        };
        assert!(
            sent < bound,
            "{how}: the client got to send {} MiB",
            sent >> 20
        );
        assert!(took < Duration::from_secs(20), "{how}: took {took:?}");
    }
    let (status, _) = d.api.get("/healthz").await;
    assert_eq!(status, 200);
    let id = d.api.start_run("echo", r#"{"after":"1 GiB"}"#).await;
    assert_eq!(d.api.wait_run(&id, WAIT).await["status"], "succeeded");
    let (status, _) = d.api.get("/v1/functions/huge").await;
    assert_eq!(status, 404);
    d.stop().await;
}

/// Hits /healthz and GET /v1/runs until `stop`, returning the slowest answer of each.
async fn poll_api(api: Api, stop: Arc<AtomicBool>) -> (Duration, Duration, usize) {
    let (mut health, mut runs, mut n) = (Duration::ZERO, Duration::ZERO, 0);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let (status, _) = api.get("/healthz").await;
        assert_eq!(status, 200);
        health = health.max(t.elapsed());
        let t = Instant::now();
        let (status, body) = api.get("/v1/runs").await;
        assert_eq!(status, 200, "{body}");
        runs = runs.max(t.elapsed());
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (health, runs, n)
}

/// Deploys `bytes` while the API is polled and an echo run goes through; returns the
/// deploy's answer and how long it took.
async fn deploy_under_watch(d: &Daemon, name: &str, bytes: Vec<u8>) -> ((u16, Value), Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll_api(d.api.clone(), stop.clone()));
    let api = d.api.clone();
    let path = format!("/v1/functions/{name}");
    let started = Instant::now();
    let deploy = tokio::spawn(async move { api.put(&path, bytes).await });
    // Let the compile get going, then run a neighbour.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let id = d.api.start_run("echo", r#"{"during":"compile"}"#).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let echo_took = t.elapsed();
    let answer = deploy.await.unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (health, runs, polls) = poller.await.unwrap();
    println!(
        "{name}: deploy {} after {took:?}; meanwhile echo run {echo_took:?}, slowest /healthz \
         {health:?}, slowest GET /v1/runs {runs:?} ({polls} polls)",
        answer.0
    );
    assert!(
        echo_took < Duration::from_secs(2),
        "echo took {echo_took:?}"
    );
    assert!(health < Duration::from_secs(2), "/healthz took {health:?}");
    assert!(runs < Duration::from_secs(2), "GET /v1/runs took {runs:?}");
    (answer, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_compile_does_not_stall_the_api_and_is_killed_at_its_bound() {
    // ~14 MB of wasm, ~2.5 s of Cranelift on the dev VM.
    let slow = slow_component(2000, 500);

    let d = Daemon::start_with(|c| c.sandbox.compile_timeout = Duration::from_secs(1)).await;
    d.api.deploy("echo", guest("echo"), "").await;
    let ((status, body), took) = deploy_under_watch(&d, "slow", slow.clone()).await;
    if status == 400 {
        assert_eq!(
            message(&body),
            "compiling the component took longer than the limit of 1s"
        );
        assert!(took < Duration::from_secs(3), "killed after {took:?}");
    } else {
        // A machine fast enough to compile it within the bound.
        assert_eq!(status, 201, "{body}");
    }
    d.stop().await;

    // Within a generous bound, the same component compiles, and the API stays just as
    // responsive meanwhile.
    let d = Daemon::start().await;
    d.api.deploy("echo", guest("echo"), "").await;
    let ((status, body), _) = deploy_under_watch(&d, "slow", slow).await;
    assert_eq!(status, 201, "{body}");
    let id = d.api.start_run("slow", r#"{"it":"runs"}"#).await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["output"], json!({"it": "runs"}), "{run:#}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_over_its_memory_bound_is_refused() {
    let d = Daemon::start_with(|c| c.sandbox.compile_memory_bytes = 300 << 20).await;
    // Ordinary components fit well within the bound.
    d.api.deploy("echo", guest("echo"), "").await;
    d.api.deploy("hostile", guest("hostile"), "").await;
    // One huge function: Cranelift needs ~360 MB resident for it (measured).
    let msg = refused(&d.api, "hungry", slow_component(1, 300_000)).await;
    assert_eq!(
        msg,
        "compiling the component needed more memory than the limit of 300 MiB"
    );
    let id = d.api.start_run("echo", r#"{"after":"hungry"}"#).await;
    assert_eq!(d.api.wait_run(&id, WAIT).await["status"], "succeeded");
    d.stop().await;
}

//! wasq-tests: the end-to-end harness — real guest components built from source, the real
//! daemon in-process or as a child process, and an HTTP client that fails loudly.
//!
//! Key decision: nothing is mocked. Guests are compiled with `cargo build --target
//! wasm32-wasip2` on first use (once per test binary), daemons use a fresh data folder and a
//! free loopback port each. This crate holds no product code.

pub mod storage;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Now by the system clock, in Unix ms, for the tests on it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The tick (Unix ms) a run's trigger names, `cron:EXPR@TIME`; `None` for a run started
/// otherwise.
pub fn cron_tick(trigger: &str) -> Option<i64> {
    let at = trigger.strip_prefix("cron:")?.rsplit_once('@')?.1;
    let t = humantime::parse_rfc3339(at).unwrap_or_else(|e| panic!("{trigger}: {e}"));
    Some(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64)
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cargo_build_wasm(manifest: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(manifest)
        // The outer cargo's flags are for the host target; guests use their own profile.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("cannot run cargo to build guest components");
    assert!(
        status.success(),
        "building guests in {} failed",
        manifest.display()
    );
}

/// A test guest from tests/guests (e.g. "spin", "two_steps"), built on first use.
pub fn guest(name: &str) -> Vec<u8> {
    static BUILT: OnceLock<()> = OnceLock::new();
    let dir = repo_root().join("tests/guests");
    BUILT.get_or_init(|| cargo_build_wasm(&dir.join("Cargo.toml")));
    let path = dir.join(format!("target/wasm32-wasip2/release/{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Path of an example from guest-examples/rust (e.g. "hello"), built on first use.
pub fn example_path(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let dir = repo_root().join("guest-examples/rust");
    BUILT.get_or_init(|| cargo_build_wasm(&dir.join("Cargo.toml")));
    dir.join(format!("target/wasm32-wasip2/release/{name}.wasm"))
}

/// A component with the `task` world's `run` export, from WAT `fields` of its one core
/// module: they must export `memory`, `cabi_realloc` and `run` (`(param i32 i32) (result
/// i32)`, returning a pointer to the `result<list<u8>, run-error>`: tag at +0, list at +8).
/// For attacks no guest language can write.
pub fn wat_task(fields: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(component
  (core module $m {fields})
  (core instance $i (instantiate $m))
  (type $run-error' (variant
    (case "retryable" string)
    (case "fatal" string)
    (case "retry-after" (tuple u64 string))))
  (export $run-error "run-error" (type $run-error'))
  (func (export "run") (param "input" (list u8)) (result (result (list u8) (error $run-error)))
    (canon lift (core func $i "run") (memory (core memory $i "memory"))
      (realloc (core func $i "cabi_realloc")))))"#
    ))
    .unwrap()
}

/// Daemon config for tests: loopback port 0, a fresh folder, short leases and grace.
pub fn test_config(data_dir: PathBuf) -> wasq_server::Config {
    let mut c = wasq_server::Config::dev(data_dir);
    c.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    c.concurrency = 4;
    c.sandbox.max_instances = 16;
    // Uploads compile in a child process, as in the shipped binary: this test binary's
    // main is libtest's, so the child is the `wasq-e2e` binary (the real CLI). Only where
    // it was not built (a bench) do they compile in process.
    let helper = e2e_binary();
    if helper.exists() {
        c.sandbox.compiler = wasq_server::Compiler::Program(helper);
    }
    c.shutdown_grace = Duration::from_secs(5);
    // A JS or Python component (10-30 MB) compiled by a debug build on 2 cores, beside the
    // other languages' tests doing the same, can take more than the 60 s default (seen:
    // languages.rs failing on a loaded machine). The limit itself is tested in uploads.rs.
    c.sandbox.compile_timeout = Duration::from_secs(300);
    c
}

/// target/<profile>/wasq-e2e: integration tests run from target/<profile>/deps, and
/// cargo builds the package's binaries next to that folder before running them.
pub fn e2e_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("wasq-e2e")
}

/// The real daemon, in this process.
pub struct Daemon {
    /// The `default` tenant's client.
    pub api: Api,
    /// The operator's client.
    pub admin: Api,
    shutdown: CancellationToken,
    running: Option<wasq_server::Running>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub async fn start() -> Daemon {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut wasq_server::Config)) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path().join("data"));
        tweak(&mut config);
        let shutdown = CancellationToken::new();
        let running = wasq_server::start(config, shutdown.clone())
            .await
            .expect("daemon starts");
        Daemon {
            admin: Api::with_key(
                running.addr.expect("the daemon serves the API"),
                Some(running.admin_key.clone()),
            ),
            api: Api::with_key(
                running.addr.expect("the daemon serves the API"),
                running.dev_key.clone(),
            ),
            shutdown,
            running: Some(running),
            _dir: dir,
        }
    }

    /// An API server on the Redis at `url` that executes nothing: `wasq worker` processes
    /// ([`spawn_worker`]) do.
    pub async fn api_on_redis(url: &str, tweak: impl FnOnce(&mut wasq_server::Config)) -> Daemon {
        Self::start_with(|c| {
            c.store = wasq_server::StoreBackend::Redis(url.to_owned());
            c.concurrency = 0;
            tweak(c);
        })
        .await
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        self.running
            .take()
            .unwrap()
            .wait()
            .await
            .expect("daemon stops cleanly");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A client for the HTTP API that returns (status, JSON body), sending its key (if any)
/// as `Authorization: Bearer`.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub key: Option<String>,
    /// Sends the key on every request.
    pub http: reqwest::Client,
}

impl Api {
    /// A client without a key (every `/v1` route answers it 401).
    pub fn new(addr: SocketAddr) -> Api {
        Api::with_key(addr, None)
    }

    pub fn with_key(addr: SocketAddr, key: Option<String>) -> Api {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(k) = &key {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {k}").parse().unwrap(),
            );
        }
        Api {
            base: format!("http://{addr}"),
            key,
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
        }
    }

    /// The same server with another key.
    pub fn as_key(&self, key: Option<String>) -> Api {
        let addr = self.base.trim_start_matches("http://").parse().unwrap();
        Api::with_key(addr, key)
    }

    /// The CLI pointed at this server with this client's key.
    pub fn cli(&self) -> Command {
        let mut c = wasq();
        c.args(["--server", &self.base]);
        match &self.key {
            Some(k) => c.env("WASQ_KEY", k),
            None => c.env_remove("WASQ_KEY"),
        };
        c
    }

    /// Creates a tenant and a key of it (this client must hold the operator key); returns
    /// a client of that tenant.
    pub async fn new_tenant(&self, name: &str) -> Api {
        let (status, body) = self
            .post("/v1/tenants", &format!(r#"{{"name": "{name}"}}"#))
            .await;
        assert_eq!(status, 201, "create tenant {name}: {body}");
        let (status, body) = self
            .post(&format!("/v1/tenants/{name}/keys"), r#"{"label": "test"}"#)
            .await;
        assert_eq!(status, 201, "create key of {name}: {body}");
        self.as_key(Some(body["key"].as_str().unwrap().to_owned()))
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.expect("request reaches the daemon");
        let status = resp.status().as_u16();
        let body = resp.bytes().await.unwrap();
        let json = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        (status, json)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn put(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.send(self.http.put(format!("{}{path}", self.base)).body(body))
            .await
    }

    pub async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .body(body.to_owned()),
        )
        .await
    }

    /// Deploys and asserts success; `settings` is a query string such as "timeout_ms=500".
    pub async fn deploy(&self, name: &str, component: Vec<u8>, settings: &str) -> Value {
        let (status, body) = self
            .put(&format!("/v1/functions/{name}?{settings}"), component)
            .await;
        assert!(
            status == 201 || status == 200,
            "deploy {name}: {status} {body}"
        );
        body
    }

    /// Starts a run and returns its id.
    pub async fn start_run(&self, function: &str, input: &str) -> String {
        let (status, body) = self
            .post(&format!("/v1/functions/{function}/runs"), input)
            .await;
        assert_eq!(status, 201, "start {function}: {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// The run (`GET /v1/runs/{id}`) with, for the tests' convenience, all its log lines
    /// under `logs` (read page by page from `/v1/runs/{id}/logs`).
    pub async fn run(&self, id: &str) -> Value {
        let mut run = self.run_detail(id).await;
        run["logs"] = Value::Array(self.logs(id).await);
        run
    }

    /// The ticks (Unix ms, oldest first) that started runs of `function` (from their
    /// triggers, `cron:EXPR@TIME`; runs started otherwise are left out), or the status and
    /// body of a listing that failed.
    pub async fn cron_ticks(&self, function: &str) -> Result<Vec<i64>, (u16, Value)> {
        let (status, runs) = self
            .get(&format!("/v1/runs?function={function}&limit=1000"))
            .await;
        if status != 200 {
            return Err((status, runs));
        }
        let mut ticks: Vec<i64> = runs
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| cron_tick(r["trigger"].as_str().unwrap()))
            .collect();
        ticks.sort();
        Ok(ticks)
    }

    /// The run as `GET /v1/runs/{id}` answers it.
    pub async fn run_detail(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(status, 200, "get run {id}: {body}");
        body
    }

    /// Every log line of a run, page by page.
    pub async fn logs(&self, id: &str) -> Vec<Value> {
        let mut lines = Vec::new();
        loop {
            let (status, page) = self
                .get(&format!(
                    "/v1/runs/{id}/logs?skip={}&limit=10000",
                    lines.len()
                ))
                .await;
            assert_eq!(status, 200, "logs of {id}: {page}");
            let page = page.as_array().cloned().unwrap_or_default();
            if page.is_empty() {
                return lines;
            }
            lines.extend(page);
        }
    }

    /// Polls until the run is succeeded, failed, cancelled or skipped.
    pub async fn wait_run(&self, id: &str, within: Duration) -> Value {
        self.wait_until(id, within, |r| {
            matches!(
                r["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "skipped")
            )
        })
        .await
    }

    pub async fn wait_until(
        &self,
        id: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let run = self.run_detail(id).await;
            if done(&run) {
                return self.run(id).await;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} did not get there within {within:?}: {run:#}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The `wasq` CLI as a child process (the same code as the shipped binary).
pub fn wasq() -> Command {
    let bin = e2e_binary();
    assert!(
        bin.exists(),
        "{} missing: run the tests through cargo",
        bin.display()
    );
    let mut c = Command::new(bin);
    c.env_remove("WASQ_SERVER").env("RUST_LOG", "warn");
    c
}

/// `wasq dev` as a child process that a test can kill.
pub struct DevProcess {
    pub child: Child,
    pub api: Api,
}

impl DevProcess {
    pub async fn spawn(data: &Path, port: u16, extra: &[&str]) -> DevProcess {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = wasq()
            .args(["dev", "--listen", &addr.to_string(), "--data"])
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn wasq dev");
        let mut api = Api::new(addr);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(format!("{}/healthz", api.base)).await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "wasq dev did not come up on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let key = std::fs::read_to_string(data.join("dev.key")).expect("wasq dev writes dev.key");
        api = Api::with_key(addr, Some(key.trim().to_owned()));
        DevProcess { child, api }
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `wasq` daemon verb (`server`, `worker`, `dev`) as a child process that a test can
/// kill -9, pause and start again with the same arguments. Its stderr (the daemon's log)
/// goes to the test's stderr, or is appended to a file ([`DaemonProcess::spawn_logged`]).
pub struct DaemonProcess {
    pub child: Child,
    args: Vec<String>,
    log: Option<PathBuf>,
    /// Environment variables it is started with (besides `RUST_LOG`).
    env: Vec<(String, String)>,
}

impl DaemonProcess {
    pub fn spawn(args: &[&str]) -> DaemonProcess {
        Self::spawn_with_log(args, None)
    }

    /// Like [`DaemonProcess::spawn`], appending the daemon's log to `log` (read it with
    /// [`DaemonProcess::log`]); respawns append to the same file.
    pub fn spawn_logged(args: &[&str], log: &Path) -> DaemonProcess {
        Self::spawn_with_log(args, Some(log.to_path_buf()))
    }

    fn spawn_with_log(args: &[&str], log: Option<PathBuf>) -> DaemonProcess {
        Self::spawn_with_env(args, log, &[])
    }

    /// Like [`DaemonProcess::spawn_logged`] (without a log when `log` is `None`), with
    /// environment variables `env` set.
    pub fn spawn_with_env(
        args: &[&str],
        log: Option<PathBuf>,
        env: &[(&str, &str)],
    ) -> DaemonProcess {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let child = Self::start(&args, log.as_deref(), &env);
        DaemonProcess {
            child,
            args,
            log,
            env,
        }
    }

    fn start(args: &[String], log: Option<&Path>, env: &[(String, String)]) -> Child {
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("open the daemon's log file"),
            ),
            None => Stdio::inherit(),
        };
        // A logged daemon keeps its info lines (attempt outcomes, lease losses): the
        // chaos tests read them.
        let level = if log.is_some() { "info" } else { "warn" };
        wasq()
            .args(args)
            .env("RUST_LOG", level)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn wasq")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log written so far (empty without [`DaemonProcess::spawn_logged`]).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    /// Sends a signal by name ("STOP", "CONT", "TERM").
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Whether the process has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("query the child process")
    }

    /// Starts the process again (after [`Self::kill9`]).
    pub fn respawn(&mut self) {
        self.child = Self::start(&self.args, self.log.as_deref(), &self.env);
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        // A paused process cannot die until it is let go on.
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request a [`Counter`] received: a guest's side effect, seen from outside.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The query parameters, e.g. `run`, `step`, `attempt`.
    pub query: std::collections::HashMap<String, String>,
    /// When it arrived, Unix ms.
    pub at: i64,
}

/// A small HTTP server on loopback that answers every request 200 and records its query
/// string: guests call it from inside step bodies, so a test counts how often a body
/// really ran, independently of what the store says.
#[derive(Clone)]
pub struct Counter {
    pub addr: SocketAddr,
    hits: std::sync::Arc<std::sync::Mutex<Vec<Hit>>>,
}

impl Counter {
    pub async fn start() -> Counter {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let counter = Counter {
            addr: listener.local_addr().unwrap(),
            hits: Default::default(),
        };
        let hits = counter.hits.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let hits = hits.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 2048];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let at = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as i64;
                    let head = String::from_utf8_lossy(&buf);
                    let target = head.split(' ').nth(1).unwrap_or("");
                    let query = target
                        .split_once('?')
                        .map_or("", |(_, q)| q)
                        .split('&')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect();
                    hits.lock().unwrap().push(Hit { query, at });
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        counter
    }

    /// `http://127.0.0.1:PORT/hit`.
    pub fn url(&self) -> String {
        format!("http://{}/hit", self.addr)
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

/// Waits until the API at `api` answers `/healthz`.
pub async fn wait_healthy(api: &Api, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = reqwest::get(format!("{}/healthz", api.base)).await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "{} did not come up", api.base);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A loopback port that was free a moment ago, below the ephemeral range (no connection
/// takes it as its source port before the daemon it is meant for binds it) and handed out
/// once in this process ([`wasq_store_redis::testing::free_loopback_port`]).
pub fn free_port() -> u16 {
    wasq_store_redis::testing::free_loopback_port()
}

/// Runs a CLI command to completion: (exit code, stdout, stderr).
pub fn run_cli(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("run wasq");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A TCP proxy on loopback in front of another address (a Redis), which a test can cut:
/// every connection through it is closed and new ones are refused until it is restored.
/// A network partition of one process, the others unaffected.
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    generation: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl Proxy {
    pub async fn start(to: SocketAddr) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            cut: Default::default(),
            generation: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
        };
        let p = proxy.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if p.cut.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let mut cut = p.generation.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        proxy
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A `wasq worker` process on the Redis at `url` with `extra` flags, its data folder and
/// its log (`<name>.log`) in `dir`.
pub fn spawn_worker(url: &str, dir: &Path, name: &str, extra: &[&str]) -> DaemonProcess {
    let data = dir.join(name);
    let mut args = vec!["worker", "--redis", url, "--data", data.to_str().unwrap()];
    args.extend_from_slice(extra);
    DaemonProcess::spawn_logged(&args, &dir.join(format!("{name}.log")))
}

//! Shared by the queue benchmarks (`redis`, `latency`, `embedded`): what a process and a
//! Redis server spent, whether runs are still active, percentiles, and the peers'
//! set-up. Each benchmark uses a part of it.
#![allow(dead_code)]

/// The `wasq` binary's allocator, so that the daemon these benches run in process
/// allocates as the shipped one does.
#[global_allocator]
static ALLOCATOR: wasq_cli::Allocator = wasq_cli::Allocator;

/// The runtime a `wasq server` or `wasq worker` on a Redis of this machine runs on (its
/// default `--threads`): the daemon these benches run in process, beside their Redis.
pub(crate) fn daemon_runtime() -> tokio::runtime::Runtime {
    let local = wasq_server::StoreBackend::Redis("redis://127.0.0.1".into());
    wasq_server::daemon_runtime(wasq_server::runtime_threads(&local)).unwrap()
}

use std::path::{Path, PathBuf};
use std::process::Command;

use wasq_core::{DEFAULT_TENANT, EnqueueRequest, Queue, RunQuery, RunStatus, Runs};

/// The CPU time this process (the bench: its store, API server and worker) has used, in
/// seconds: user + system from /proc/self/stat, in clock ticks of 10 ms.
pub(crate) fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line: 11 and 12 counting from the state
    // (field 3) as 0.
    (ticks(11) + ticks(12)) / 100.0
}

/// What Redis had spent when read: CPU seconds, memory in use and, per command, calls
/// and µs.
pub(crate) struct RedisStats {
    pub(crate) cpu: f64,
    /// Of `cpu`, the seconds spent in the kernel (its sockets, mostly).
    pub(crate) sys: f64,
    /// Reads of client sockets Redis has made (`total_reads_processed`): one per batch
    /// of requests a client sent together.
    pub(crate) reads: u64,
    /// This process's CPU seconds at the same moment.
    pub(crate) own_cpu: f64,
    pub(crate) memory: f64,
    pub(crate) commands: std::collections::BTreeMap<String, (u64, u64)>,
}

impl RedisStats {
    pub(crate) fn read(port: u16) -> RedisStats {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "info", "all"])
            .output()
            .expect("redis-cli runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let (mut cpu, mut sys, mut reads) = (0.0, 0.0, 0);
        let mut memory = 0.0;
        let mut commands = std::collections::BTreeMap::new();
        for line in text.lines() {
            let Some((key, value)) = line.trim().split_once(':') else {
                continue;
            };
            if key == "used_cpu_sys" || key == "used_cpu_user" {
                let v = value.parse::<f64>().unwrap_or(0.0);
                cpu += v;
                if key == "used_cpu_sys" {
                    sys = v;
                }
            } else if key == "total_reads_processed" {
                reads = value.parse().unwrap_or(0);
            } else if key == "used_memory" {
                memory = value.parse().unwrap_or(0.0);
            } else if let Some(name) = key.strip_prefix("cmdstat_") {
                let field = |f: &str| {
                    value
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(f))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                commands.insert(name.to_string(), (field("calls="), field("usec=")));
            }
        }
        RedisStats {
            cpu,
            sys,
            reads,
            own_cpu: process_cpu(),
            memory,
            commands,
        }
    }

    /// What Redis spent from `self` to `later`, per run: CPU µs, commands (those scripts
    /// call included) and bytes of memory.
    pub(crate) fn per_run(&self, later: &RedisStats, runs: usize) -> (f64, f64, f64) {
        let n = runs as f64;
        let calls: u64 = later
            .commands
            .iter()
            .map(|(name, (c, _))| c - self.commands.get(name).map_or(0, |b| b.0))
            .sum();
        (
            (later.cpu - self.cpu) * 1e6 / n,
            calls as f64 / n,
            (later.memory - self.memory) / n,
        )
    }

    /// Of what `self` .. `later` cost Redis per run: the kernel's CPU µs and the reads of
    /// client sockets.
    pub(crate) fn kernel_per_run(&self, later: &RedisStats, runs: usize) -> (f64, f64) {
        let n = runs as f64;
        (
            (later.sys - self.sys) * 1e6 / n,
            (later.reads - self.reads) as f64 / n,
        )
    }

    /// Prints what `self` .. `later` cost per run: Redis CPU and memory, this process's CPU
    /// (when `own`: the work was done here, not by a child process), and calls and µs of
    /// each command.
    pub(crate) fn report(&self, later: &RedisStats, what: &str, runs: usize, own: bool) {
        let n = runs as f64;
        let (cpu, _, memory) = self.per_run(later, runs);
        let (sys, reads) = self.kernel_per_run(later, runs);
        let mut line = format!(
            "  {what}: redis {cpu:.1} µs CPU/run ({sys:.1} in the kernel, {reads:.2} socket reads), {memory:+.0} B/run;"
        );
        if own {
            let own = (later.own_cpu - self.own_cpu) * 1e6 / n;
            line.push_str(&format!(" bench process {own:.0} µs CPU/run;"));
        }
        let mut rows: Vec<(String, f64, f64)> = later
            .commands
            .iter()
            .filter_map(|(name, &(calls, usec))| {
                let (c0, u0) = self.commands.get(name).copied().unwrap_or((0, 0));
                (calls > c0).then(|| {
                    (
                        name.clone(),
                        (calls - c0) as f64 / n,
                        (usec - u0) as f64 / n,
                    )
                })
            })
            .collect();
        rows.sort_by(|a, b| b.2.total_cmp(&a.2));
        for (name, calls, usec) in rows.iter().take(12) {
            line.push_str(&format!(" {name} {calls:.2}×/{usec:.1}µs"));
        }
        println!("{line}");
    }
}

/// Creates runs 0..n over the HTTP API (`POST path`, body `body(i)`), `in_flight`
/// requests at a time; each must answer 201.
pub(crate) async fn create_over_http(
    api: std::sync::Arc<wasq_tests::Api>,
    path: &str,
    n: usize,
    in_flight: usize,
    body: fn(usize) -> String,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = std::sync::Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (api, next, path) = (api.clone(), next.clone(), path.to_owned());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (status, answer) = api.post(&path, &body(i)).await;
                assert_eq!(status, 201, "{answer}");
            }
        });
    }
    tasks.join_all().await;
}

/// Enqueues runs 0..n of `function` for the default tenant through the store API,
/// `in_flight` at a time; run i's input is `input(i)`.
pub(crate) async fn enqueue_n<Q: Queue + 'static>(
    store: std::sync::Arc<Q>,
    function: &str,
    n: usize,
    in_flight: usize,
    input: fn(usize) -> Vec<u8>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..in_flight {
        let (store, function) = (store.clone(), function.to_owned());
        tasks.spawn(async move {
            for i in (t..n).step_by(in_flight) {
                let req = EnqueueRequest {
                    tenant: DEFAULT_TENANT.into(),
                    function: function.clone(),
                    input: input(i),
                    // What a run created over the API carries (a run's hash leaves the
                    // default out), so the memory per queued run is a user's run's.
                    trigger: "api".into(),
                    ..EnqueueRequest::default()
                };
                store.enqueue(req).await.unwrap();
            }
        });
    }
    tasks.join_all().await;
}

/// Whether the default tenant still has a queued or running run.
async fn active(store: &impl Runs) -> bool {
    for status in [RunStatus::Queued, RunStatus::Running] {
        let q = RunQuery {
            tenant: DEFAULT_TENANT.into(),
            function: None,
            status: Some(status),
            limit: 1,
            ..RunQuery::default()
        };
        if !store.runs(q).await.unwrap().is_empty() {
            return true;
        }
    }
    false
}

/// Returns once the default tenant has no queued or running run, checking every 5 ms.
pub(crate) async fn until_idle(store: &impl Runs) {
    until_idle_every(store, std::time::Duration::from_millis(5)).await;
}

/// [`until_idle`], checking every `every`.
pub(crate) async fn until_idle_every(store: &impl Runs, every: std::time::Duration) {
    while active(store).await {
        tokio::time::sleep(every).await;
    }
}

/// [`until_idle`] through a daemon's HTTP API (as `wasq dev`'s user sees it): returns once
/// listing its queued and its running runs finds none.
pub(crate) async fn until_idle_over_http(api: &wasq_tests::Api) {
    loop {
        let mut active = false;
        for status in ["queued", "running"] {
            let (code, body) = api.get(&format!("/v1/runs?status={status}&limit=1")).await;
            assert_eq!(code, 200, "{body}");
            active |= !body.as_array().unwrap().is_empty();
        }
        if !active {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Now, in microseconds since the Unix epoch: the clock the `stamp` guest reads.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// p50, p99, p99.9 and max of `values` (nearest rank), sorting them.
pub(crate) fn percentiles(values: &mut [i64]) -> [i64; 4] {
    values.sort_unstable();
    let rank = |p: f64| {
        if values.is_empty() {
            return 0;
        }
        let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values[i]
    };
    [rank(0.50), rank(0.99), rank(0.999), rank(1.0)]
}

/// `bench/<peer>`, its npm packages installed (`npm ci`) on first use.
pub(crate) fn npm_peer(peer: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(peer);
    if !dir.join("node_modules/bullmq").exists() {
        set_up(&dir, "npm", &["ci", "--no-audit", "--no-fund"]);
    }
    dir
}

/// `bench/rq`, with its virtualenv (RQ from PyPI, `requirements.txt`) made on first use.
pub(crate) fn rq_peer() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rq");
    if !dir.join(".venv/bin/python").exists() {
        set_up(&dir, "python3", &["-m", "venv", ".venv"]);
        set_up(
            &dir,
            ".venv/bin/pip",
            &["install", "--quiet", "-r", "requirements.txt"],
        );
    }
    dir
}

/// Runs one set-up step of a peer in `dir`, which must succeed.
fn set_up(dir: &Path, program: &str, args: &[&str]) {
    let ok = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap_or_else(|e| panic!("{program} is needed to set up {}: {e}", dir.display()));
    assert!(
        ok.success(),
        "{program} {args:?} failed in {}",
        dir.display()
    );
}

/// Runs `program args` in `dir` and parses the one JSON line it prints.
pub(crate) fn peer_json(dir: &Path, program: &str, args: &[String]) -> serde_json::Value {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("{program} printed {line:?}, not one JSON line: {e}"))
}

/// `target/wasq-bench/<name>.json` (under `CARGO_TARGET_DIR` when set): where a
/// benchmark writes its figures.
pub(crate) fn json_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    target.join("wasq-bench").join(format!("{name}.json"))
}

/// Writes a benchmark's figures to [`json_path`] and says where.
pub(crate) fn write_json(name: &str, value: &serde_json::Value) {
    let path = json_path(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
    println!("  figures written to {}", path.display());
}

/// The bench tenant's `max_running` on Redis: more than any drain holds.
const BENCH_MAX_RUNNING: u32 = 1_000_000;

/// An API server on the Redis at `url` that executes nothing, with `guest` deployed
/// under its own name, and its `default` tenant's client.
pub(crate) async fn redis_api(
    data: PathBuf,
    url: &str,
    guest: &str,
    shutdown: tokio_util::sync::CancellationToken,
) -> (wasq_server::Running, std::sync::Arc<wasq_tests::Api>) {
    let mut config = wasq_tests::test_config(data);
    // The bench deploys one trusted component: compile it here, not in a helper binary
    // that `cargo bench` may not have built (or built from older code).
    config.sandbox.compiler = wasq_server::Compiler::InProcess;
    config.store = wasq_server::StoreBackend::Redis(url.into());
    config.concurrency = 0;
    // The `default` tenant (created by this first start) with its max_running out of the
    // way, as a deployment with one tenant sets it: the peers have no such quota, and the
    // drains measure the queue, not the quota. A run counts against it from its claim
    // until its end is stored, so under a drain a worker at concurrency c holds up to 2c
    // of them (c executing, c ends on their way): past the default 64 at c=50, and at
    // once at c=200. What a drain at the quota costs: docs/performance.md.
    config.default_quotas.max_running = BENCH_MAX_RUNNING;
    let server = wasq_server::start(config, shutdown).await.unwrap();
    let api = std::sync::Arc::new(wasq_tests::Api::with_key(
        server.addr.unwrap(),
        server.dev_key.clone(),
    ));
    api.deploy(guest, wasq_tests::guest(guest), "").await;
    (server, api)
}

/// A worker on the Redis at `url` (no API) at `concurrency`, a fresh sandbox per run.
pub(crate) fn redis_worker(data: PathBuf, url: &str, concurrency: usize) -> wasq_server::Config {
    let mut config = wasq_tests::test_config(data);
    config.store = wasq_server::StoreBackend::Redis(url.into());
    config.listen = None;
    config.concurrency = concurrency;
    config.sandbox.max_instances = concurrency as u32 * 2;
    config
}

/// `wasq dev`'s configuration on `data` (the embedded store), with its worker at
/// `concurrency`.
pub(crate) fn dev_config(data: &std::path::Path, concurrency: usize) -> wasq_server::Config {
    let mut config = wasq_tests::test_config(data.to_path_buf());
    config.sandbox.compiler = wasq_server::Compiler::InProcess;
    let dev = wasq_server::Config::dev(data.to_path_buf());
    config.sandbox.max_instances = dev.sandbox.max_instances;
    config.concurrency = concurrency;
    // The bench's client is one address standing in for many clients, as a reverse
    // proxy is: an open-loop producer faster than the daemon has a connection open per
    // request in flight, past the per-address cap of 256 (each refused with a 503 before
    // its request is sent, which the client reports as an unexpected message).
    config.http.max_connections_per_ip = config.http.max_connections;
    config
}

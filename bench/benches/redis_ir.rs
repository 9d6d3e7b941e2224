//! Redis's instructions per run, counted by valgrind's callgrind: wasq's enqueue and drain
//! (no-op guest, then one durable step per run) beside BullMQ's add + process, on one
//! `redis-server` running under callgrind. Also each transition alone, enqueues made 50
//! at once (which the store sends together), and one run at a time on an idle queue.
//!
//! Redis CPU time per run is the figure that bounds a shard, but on a shared 2-core VM the
//! same binary's µs vary by 2× from one run to the next. Instructions do not: the count
//! is the same for the same scripts and workload whatever else the machine does, so a
//! change to a script shows as a number, not as noise. (Instructions are not time: a
//! cache miss costs more than an add. The `redis` bench reports the time.)
//!
//! It also prints the Redis memory a queued run takes (`used_memory` before and after the
//! enqueue), which does not depend on the machine either, and the Lua heap of Redis's
//! functions engine after wasq's phases (`used_memory_vm_functions`: the scripts' garbage
//! waits there for Lua's collector, whose pace the library sets).
//!
//! `cargo bench -p wasq-bench --bench redis_ir` (N defaults to 2000, `WASQ_BENCH_N` sets
//! it; needs `valgrind`; `WASQ_REDIS_SERVER` names another `redis-server`, e.g. one built
//! with symbols as `bench/redis-profile/README.md` tells, so that the dumps name functions; `WASQ_BENCH_ONLY=serial` runs the one-at-a-time phases alone). Redis runs about 50× slower under callgrind. With
//! `WASQ_BENCH_CALLGRIND_DIR=DIR` the dumps (one per phase, in order) are kept in DIR for
//! `callgrind_annotate`.

mod queue;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use queue::{npm_peer, peer_json, redis_api, redis_worker, until_idle_every, write_json};
use tokio_util::sync::CancellationToken;
use wasq_core::{
    AttemptEnd, ClaimRequest, Claimed, DEFAULT_TENANT, EnqueueRequest, Outcome, Queue, Record,
    SystemClock,
};
use wasq_store_redis::RedisStore;

const CONCURRENCY: usize = 50;

/// A `redis-server` under callgrind, with counters that can be zeroed and read.
struct Counted {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Counted {
    fn start() -> Counted {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = dir.path().join("cg.out");
        let child = Command::new("valgrind")
            .args([
                "--tool=callgrind",
                "--dump-instr=no",
                "--compress-strings=no",
            ])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(wasq_store_redis::testing::redis_server())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--port", &port.to_string(), "--dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("valgrind runs (apt install valgrind)");
        let counted = Counted { child, port, dir };
        for _ in 0..600 {
            if counted.cli(&["PING"]).trim() == "PONG" {
                return counted;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server under callgrind did not answer within 60 s");
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Redis's `used_memory`, bytes.
    fn used_memory(&self) -> i64 {
        self.memory_field("used_memory")
    }

    /// A field of `INFO memory`, bytes.
    fn memory_field(&self, name: &str) -> i64 {
        let info = self.cli(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO memory has {name}"))
    }

    fn control(&self, flag: &str) {
        let ok = Command::new("callgrind_control")
            .arg(flag)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("callgrind_control runs");
        assert!(ok.success(), "callgrind_control {flag} failed");
    }

    /// Starts counting from zero.
    fn zero(&self) {
        self.control("--zero");
    }

    /// The instructions counted since the last `zero`.
    fn read(&self) -> u64 {
        let before = self.dumps();
        self.control("--dump");
        // The dump is written by the server's own thread, a moment later.
        for _ in 0..600 {
            let dumps = self.dumps();
            if let Some(new) = dumps.iter().find(|d| !before.contains(d))
                && let Some(n) = totals(new)
            {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("callgrind wrote no dump");
    }

    fn dumps(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().contains("cg.out."))
            .collect()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // For `callgrind_annotate`: where in Redis the instructions went, phase by phase.
        if let Some(keep) = std::env::var_os("WASQ_BENCH_CALLGRIND_DIR") {
            let _ = std::fs::create_dir_all(&keep);
            for d in self.dumps() {
                let _ = std::fs::copy(&d, PathBuf::from(&keep).join(d.file_name().unwrap()));
            }
        }
    }
}

/// The `totals:` (or `summary:`) line of a complete callgrind dump.
fn totals(path: &PathBuf) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// wasq with `guest`: instructions per run to enqueue N (store API), then to drain them,
/// and the Redis memory a queued run takes (its input is about 10 bytes).
async fn wasq(redis: &Counted, n: usize, guest: &str) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let url = redis.url();
    let (server, _api) = redis_api(dir.path().join("server"), &url, guest, shutdown.clone()).await;
    let store = Arc::new(
        RedisStore::connect(&url, Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    let memory_before = redis.used_memory();
    redis.zero();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..10 {
        let (store, guest) = (store.clone(), guest.to_owned());
        tasks.spawn(async move {
            for i in (t..n).step_by(10) {
                let req = EnqueueRequest {
                    tenant: DEFAULT_TENANT.into(),
                    function: guest.clone(),
                    input: format!(r#"{{"i":{i}}}"#).into_bytes(),
                    trigger: "bench".into(),
                    ..EnqueueRequest::default()
                };
                store.enqueue(req).await.unwrap();
            }
        });
    }
    tasks.join_all().await;
    let enqueue = redis.read() as f64 / n as f64;
    let memory = (redis.used_memory() - memory_before) as f64 / n as f64;

    let mut config = redis_worker(dir.path().join("worker"), &url, CONCURRENCY);
    config.scheduler = false;
    redis.zero();
    let worker = wasq_server::start(config, shutdown.clone()).await.unwrap();
    // Checked rarely: each check costs Redis a listing, which must not weigh on the count.
    until_idle_every(&*store, Duration::from_millis(500)).await;
    let drain = redis.read() as f64 / n as f64;
    shutdown.cancel();
    let _ = worker.wait().await;
    let _ = server.wait().await;
    (enqueue, drain, memory)
}

/// Each transition on its own, through the store API: instructions per run to enqueue N
/// no-op runs, to claim them (50 at a time) and to end them (50 at a time, each with one
/// step when `step`).
async fn transitions(redis: &Counted, n: usize, step: bool) -> [f64; 3] {
    let api = StoreApi::start(redis).await;
    let store = &api.store;
    redis.zero();
    for i in 0..n {
        store.enqueue(echo_run(i)).await.unwrap();
    }
    let enqueue = redis.read() as f64 / n as f64;
    // Rounds of one claim (a worker's 50 free slots) and its ends: the claimed runs hold
    // their leases until then, as in a worker.
    let (mut claim, mut end) = (0u64, 0u64);
    let mut done = 0;
    while done < n {
        redis.zero();
        let claimed = store.claim(claim_request()).await.unwrap();
        claim += redis.read();
        assert!(
            !claimed.is_empty(),
            "nothing to claim after {done} of {n} runs"
        );
        done += claimed.len();
        let ends = claimed.iter().map(|c| success(c, step)).collect();
        redis.zero();
        for r in store.end_attempts(ends).await {
            r.unwrap();
        }
        end += redis.read();
    }
    let (claim, end) = (claim as f64 / n as f64, end as f64 / n as f64);
    [enqueue, claim, end]
}

/// Instructions per run to enqueue N no-op runs `CONCURRENCY` at once (the store sends
/// enqueues that arrive while its previous call is on its way together).
async fn at_once(redis: &Counted, n: usize) -> f64 {
    let api = StoreApi::start(redis).await;
    let store = &api.store;
    redis.zero();
    let reqs: Vec<EnqueueRequest> = (0..n).map(echo_run).collect();
    for chunk in reqs.chunks(CONCURRENCY) {
        let answers =
            futures_util::future::join_all(chunk.iter().cloned().map(|r| store.enqueue(r))).await;
        for a in answers {
            a.unwrap();
        }
    }
    redis.read() as f64 / n as f64
}

/// A store client on the counted Redis, the `echo` function deployed through an API
/// server that is stopped before anything is counted: nothing else (a scheduler's passes,
/// the store guard's `INFO`) runs beside what is measured, whatever the time it takes.
struct StoreApi {
    store: RedisStore,
}

impl StoreApi {
    async fn start(redis: &Counted) -> StoreApi {
        let dir = tempfile::tempdir().unwrap();
        let shutdown = CancellationToken::new();
        let url = redis.url();
        let (server, _api) =
            redis_api(dir.path().join("server"), &url, "echo", shutdown.clone()).await;
        shutdown.cancel();
        let _ = server.wait().await;
        let store = RedisStore::connect(&url, Arc::new(SystemClock))
            .await
            .unwrap();
        StoreApi { store }
    }
}

/// Run `i` of the `echo` function, as the bench enqueues it.
fn echo_run(i: usize) -> EnqueueRequest {
    EnqueueRequest {
        tenant: DEFAULT_TENANT.into(),
        function: "echo".into(),
        input: format!(r#"{{"i":{i}}}"#).into_bytes(),
        trigger: "bench".into(),
        ..EnqueueRequest::default()
    }
}

/// A claim of a worker with CONCURRENCY free slots.
fn claim_request() -> ClaimRequest {
    ClaimRequest {
        worker: "bench".into(),
        limit: CONCURRENCY,
        lease_ms: 30_000,
        queues: Vec::new(),
    }
}

/// A successful end of `c`'s attempt (with one step when `step`).
fn success(c: &Claimed, step: bool) -> AttemptEnd {
    let records = if step {
        vec![Record::Step {
            name: "echo".into(),
            occurrence: 0,
            output: c.run.input.clone(),
            logs: vec![],
        }]
    } else {
        vec![]
    };
    AttemptEnd {
        lease: c.lease.clone(),
        records,
        outcome: Outcome::Succeeded {
            output: c.run.input.clone(),
            fuel_used: Some(1),
        },
    }
}

/// One run at a time, the queue otherwise idle (most queues, most of the time): enqueue a
/// run, claim it (as a worker with 50 free slots), end it with one step; N times. What
/// each script call does besides its run (reaping, publishing the tenant's due time,
/// wake-ups) is then paid by every run, where a backlog shares it among a batch.
async fn serial(redis: &Counted, n: usize) -> f64 {
    let api = StoreApi::start(redis).await;
    let store = &api.store;
    redis.zero();
    for i in 0..n {
        store.enqueue(echo_run(i)).await.unwrap();
        let claimed = store.claim(claim_request()).await.unwrap();
        assert_eq!(claimed.len(), 1, "run {i} is claimed");
        for r in store.end_attempts(vec![success(&claimed[0], true)]).await {
            r.unwrap();
        }
    }
    redis.read() as f64 / n as f64
}

/// BullMQ's instructions per job: `drain.mjs` (N jobs added, then drained) or `serial.mjs`
/// (one job at a time: add, process, then the next), in `bench/bullmq`.
fn bullmq(redis: &Counted, n: usize, script: &str) -> f64 {
    let dir = npm_peer("bullmq");
    redis.zero();
    let args = [
        script.to_owned(),
        redis.port.to_string(),
        n.to_string(),
        CONCURRENCY.to_string(),
    ];
    peer_json(&dir, "node", &args);
    redis.read() as f64 / n as f64
}

fn main() {
    let n: usize = std::env::var("WASQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let redis = Counted::start();
    let rt = queue::daemon_runtime();
    if std::env::var("WASQ_BENCH_ONLY").as_deref() == Ok("serial") {
        let wasq = rt.block_on(serial(&redis, n));
        redis.cli(&["FLUSHALL"]);
        redis.cli(&["FUNCTION", "FLUSH"]);
        let bull = bullmq(&redis, n, "serial.mjs");
        println!(
            "one run at a time, {n} runs: wasq {:.1}k, BullMQ {:.1}k Redis instructions per run, ratio {:.2}",
            wasq / 1000.0,
            bull / 1000.0,
            wasq / bull
        );
        return;
    }
    let [t_enqueue, t_claim, t_end] = rt.block_on(transitions(&redis, n, false));
    let [_, _, t_end_step] = rt.block_on(transitions(&redis, n, true));
    let (enqueue, drain, memory) = rt.block_on(wasq(&redis, n, "echo"));
    let (step_enqueue, step_drain, _) = rt.block_on(wasq(&redis, n, "one_step"));
    redis.cli(&["FLUSHALL"]);
    let t_at_once = rt.block_on(at_once(&redis, n));
    redis.cli(&["FLUSHALL"]);
    let one_at_a_time = rt.block_on(serial(&redis, n));
    // The Lua heap of the functions engine, where the scripts' garbage waits for the
    // collector (the library's pause: `enter` in prelude.lua).
    let lua_memory = redis.memory_field("used_memory_vm_functions");
    redis.cli(&["FLUSHALL"]);
    redis.cli(&["FUNCTION", "FLUSH"]);
    let bull = bullmq(&redis, n, "drain.mjs");
    redis.cli(&["FLUSHALL"]);
    let bull_one_at_a_time = bullmq(&redis, n, "serial.mjs");
    let k = |v: f64| v / 1000.0;
    println!("Redis instructions per run (thousands), {n} runs, counted by callgrind:");
    println!(
        "  wasq no-op:     enqueue {:.1}k, claim + finish {:.1}k, whole life {:.1}k",
        k(enqueue),
        k(drain),
        k(enqueue + drain)
    );
    println!(
        "  wasq one step:  enqueue {:.1}k, claim + step + finish {:.1}k, whole life {:.1}k",
        k(step_enqueue),
        k(step_drain),
        k(step_enqueue + step_drain)
    );
    println!(
        "  each alone (store API, batches of {CONCURRENCY}): enqueue {:.1}k, claim {:.1}k, end {:.1}k, end with a step {:.1}k",
        k(t_enqueue),
        k(t_claim),
        k(t_end),
        k(t_end_step)
    );
    println!("  enqueue, {CONCURRENCY} at once: {:.1}k", k(t_at_once));
    println!("  BullMQ add + process: {:.1}k", k(bull));
    println!(
        "  one run at a time, otherwise idle (wasq: enqueue, claim, end with a step): wasq {:.1}k, BullMQ {:.1}k, ratio {:.2}",
        k(one_at_a_time),
        k(bull_one_at_a_time),
        one_at_a_time / bull_one_at_a_time
    );
    println!("  Redis memory per queued run (a ~10-byte input): {memory:.0} B");
    println!(
        "  the functions' Lua heap after wasq's phases: {} KiB",
        lua_memory / 1024
    );
    println!(
        "  ratio wasq ÷ BullMQ, whole life: no-op {:.2}, one step {:.2}",
        (enqueue + drain) / bull,
        (step_enqueue + step_drain) / bull
    );
    write_json(
        "redis_ir",
        &serde_json::json!({
            "n": n,
            "wasq_noop": { "enqueue": enqueue, "drain": drain },
            "wasq_one_step": { "enqueue": step_enqueue, "drain": step_drain },
            "transitions": { "enqueue": t_enqueue, "enqueue_at_once": t_at_once, "claim": t_claim, "end": t_end, "end_with_step": t_end_step },
            "bullmq": bull,
            "one_at_a_time": { "wasq": one_at_a_time, "bullmq": bull_one_at_a_time },
            "memory_per_queued_run": memory,
            "lua_heap_bytes": lua_memory,
        }),
    );
}

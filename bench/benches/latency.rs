//! Create→start latency and delayed-run lateness on one Redis, wasq beside BullMQ in the
//! same run.
//!
//! The producer is open-loop: run i is meant to be sent at t0 + i/rate, and that intended
//! time travels in the run's input (`{"t": <epoch µs>}`). The latency is the guest's first
//! reading of the wall clock, inside its sandbox, minus that intended time, so a producer
//! held back by a slow system counts against the system (no coordinated omission). wasq's
//! guest is `stamp` (tests/guests), which returns how late it started; BullMQ's processor
//! does the same in `bench/bullmq/latency.mjs`. The producer is a thread of its own that
//! sleeps until each intended time (the OS's high-resolution timers, not tokio's 1 ms
//! wheel) and hands the create to the runtime without waiting for it.
//!
//! Phases, for each system: `max` (creates as fast as 50 in flight allow while the worker
//! runs them: the system's sustained rate), then `now` at 1,000 runs/s and at 10 / 50 / 80%
//! of that maximum, then `delayed` (due times spread uniformly over 0.1–5 s, at 200/s),
//! then `cron`: 25 schedules that tick every second (`* * * * * *`, a job scheduler on
//! BullMQ's side), so each second starts 25 runs at once, for twice the phase's length (10
//! s at least); a run's lateness is when it started minus its tick.
//! wasq creates through the store API (the same Redis round trip BullMQ's `add` makes),
//! one worker at concurrency 50, a fresh sandbox per run. Each phase also reports Redis's
//! CPU per run (`INFO` before and after): what a run costs Redis at that rate, not only in
//! a backlog.
//!
//! Then `wasq dev` (the embedded store, its worker at its default concurrency) takes the
//! same phases, its runs created over its HTTP API as a user's are (there is no store API
//! to share with another process; a delayed run's due time is `at=`): create→start and
//! lateness on SQLite, beside the same phases on Redis.
//!
//! `cargo bench -p wasq-bench --bench latency` (`WASQ_BENCH_SECS` sets each phase's length,
//! 5 s by default; `WASQ_BENCH_N` the `max` phase's runs, 20000; `WASQ_BENCH_ONLY=dev`
//! measures `wasq dev` alone).

mod queue;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use wasq_core::{DEFAULT_TENANT, EnqueueRequest, Queue, Runs, SystemClock};
use wasq_store_redis::RedisStore;
use wasq_store_redis::testing::{RedisOptions, RedisServer};

use queue::{
    RedisStats, now_us, npm_peer, peer_json, percentiles, redis_api, redis_worker, until_idle,
};

const CONCURRENCY: usize = 50;
/// Creates in flight at once in the `max` phase.
const MAX_IN_FLIGHT: usize = 50;

/// How fast a phase creates runs.
#[derive(Clone, Copy)]
enum Rate {
    /// As fast as `MAX_IN_FLIGHT` creates at a time allow.
    Unlimited,
    PerSec(f64),
    /// This share of the system's rate in the `max` phase.
    OfMax(f64),
}

const PHASES: [(Mode, Rate); 6] = [
    (Mode::Max, Rate::Unlimited),
    (Mode::Now, Rate::PerSec(1000.0)),
    (Mode::Now, Rate::OfMax(0.1)),
    (Mode::Now, Rate::OfMax(0.5)),
    (Mode::Now, Rate::OfMax(0.8)),
    (Mode::Delayed, Rate::PerSec(200.0)),
];

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Max,
    Now,
    Delayed,
    Cron,
}

/// Schedules in the `cron` phase, each ticking every second.
const CRON_SCHEDULES: usize = 25;

/// The `cron` phase's length in whole seconds: twice a phase's, 10 at least.
fn cron_secs(secs: f64) -> usize {
    (2.0 * secs).max(10.0).ceil() as usize
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Max => "max",
            Mode::Now => "now",
            Mode::Delayed => "delayed",
            Mode::Cron => "cron",
        }
    }
}

/// What one phase measured: the rate runs were created at, and the percentiles of how
/// late they started (µs: p50, p99, p99.9, max).
struct Measured {
    mode: Mode,
    rate: f64,
    n: usize,
    late: [i64; 4],
    /// Redis CPU per run over the phase. BullMQ's is over its whole child process, whose
    /// unmeasured jobs (see `bullmq`) count as runs: at a set rate its warm-up jobs,
    /// added in a burst, make it lean low.
    redis_us: f64,
}

impl Measured {
    fn json(&self, system: &str) -> serde_json::Value {
        serde_json::json!({
            "system": system,
            "mode": self.mode.name(),
            "rate": self.rate.round(),
            "n": self.n,
            "p50_us": self.late[0],
            "p99_us": self.late[1],
            "p999_us": self.late[2],
            "max_us": self.late[3],
            "redis_cpu_us_per_run": self.redis_us,
        })
    }
}

/// A run's input: when it was meant to start, padded to ~100 bytes as every benchmark's
/// payload.
fn input(t: i64) -> Vec<u8> {
    format!(r#"{{"t":{t},"pad":"{}"}}"#, "x".repeat(70)).into_bytes()
}

fn request(t: i64, due_at: Option<i64>) -> EnqueueRequest {
    EnqueueRequest {
        tenant: DEFAULT_TENANT.into(),
        function: "stamp".into(),
        input: input(t),
        trigger: "bench".into(),
        due_at,
        idempotency_key: None,
        retry: None,
        parent: None,
        priority: None,
        trace: None,
    }
}

/// A delay in 100..5000 ms from `i` (a fixed spread, the same every run).
fn delay_ms(i: usize) -> i64 {
    // A multiplicative hash spreads consecutive runs over the interval.
    100 + ((i as u64).wrapping_mul(2_654_435_761) % 4_900) as i64
}

/// Where a phase creates `stamp` runs and reads how late they started.
#[async_trait::async_trait]
trait Target: Send + Sync + 'static {
    /// Creates a run meant to start at `t` (epoch µs), due at `due_ms` when given; its id.
    async fn create(&self, t: i64, due_ms: Option<i64>) -> String;
    /// How late run `id` started (µs), from its output.
    async fn late_us(&self, id: &str) -> i64;
    /// Returns once no run is queued or running.
    async fn idle(&self);
}

/// wasq on Redis: the store API, the round trip BullMQ's `add` makes.
#[async_trait::async_trait]
impl Target for RedisStore {
    async fn create(&self, t: i64, due_ms: Option<i64>) -> String {
        self.enqueue(request(t, due_ms))
            .await
            .unwrap()
            .run
            .id
            .to_string()
    }

    async fn late_us(&self, id: &str) -> i64 {
        let run = self.run(DEFAULT_TENANT, id).await.unwrap();
        let output = run.expect("a created run exists").run.output;
        late_of(&serde_json::from_slice(output.as_deref().expect("the run succeeded")).unwrap())
    }

    async fn idle(&self) {
        until_idle(self).await;
    }
}

/// `wasq dev`: its HTTP API.
struct Dev(wasq_tests::Api);

#[async_trait::async_trait]
impl Target for Dev {
    async fn create(&self, t: i64, due_ms: Option<i64>) -> String {
        let input = String::from_utf8(input(t)).unwrap();
        let Some(due_ms) = due_ms else {
            return self.0.start_run("stamp", &input).await;
        };
        let at = chrono::DateTime::from_timestamp_millis(due_ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let (status, body) = self
            .0
            .post(&format!("/v1/functions/stamp/runs?at={at}"), &input)
            .await;
        assert_eq!(status, 201, "start a delayed run: {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    async fn late_us(&self, id: &str) -> i64 {
        late_of(&self.0.run_detail(id).await["output"])
    }

    async fn idle(&self) {
        queue::until_idle_over_http(&self.0).await;
    }
}

/// `late_us` of a `stamp` run's output (null if the run did not succeed).
fn late_of(output: &serde_json::Value) -> i64 {
    output["late_us"]
        .as_i64()
        .unwrap_or_else(|| panic!("a succeeded stamp run's output: {output}"))
}

/// Creates `n` runs at `rate` per second from a thread of its own (open loop) and returns
/// their ids and the rate actually achieved.
async fn open_loop(target: Arc<dyn Target>, mode: Mode, rate: f64, n: usize) -> (Vec<String>, f64) {
    let handle = tokio::runtime::Handle::current();
    let producer = std::thread::spawn(move || {
        let start = Instant::now() + Duration::from_millis(20);
        let epoch = now_us() + 20_000;
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let offset = Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = (start + offset).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let intended = epoch + offset.as_micros() as i64;
            let (t, due_ms) = if mode == Mode::Delayed {
                // Due on a whole millisecond (the store's resolution): lateness is measured
                // from the due time itself.
                let due_ms = intended / 1000 + delay_ms(i);
                (due_ms * 1000, Some(due_ms))
            } else {
                (intended, None)
            };
            let target = target.clone();
            tasks.push(handle.spawn(async move { target.create(t, due_ms).await }));
        }
        (tasks, n as f64 / start.elapsed().as_secs_f64())
    });
    let (tasks, achieved) = tokio::task::spawn_blocking(move || producer.join().unwrap())
        .await
        .unwrap();
    let mut ids = Vec::with_capacity(n);
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    (ids, achieved)
}

/// Creates `n` runs as fast as `MAX_IN_FLIGHT` creates at a time allow.
async fn closed_loop(target: Arc<dyn Target>, n: usize) -> Vec<String> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..MAX_IN_FLIGHT {
        let (target, next) = (target.clone(), next.clone());
        tasks.spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                ids.push(target.create(now_us(), None).await);
            }
            ids
        });
    }
    tasks.join_all().await.concat()
}

/// How late each of `ids` started, from its output.
async fn lateness(target: &Arc<dyn Target>, ids: &[String]) -> Vec<i64> {
    let mut late = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(200) {
        let mut reads = tokio::task::JoinSet::new();
        for id in chunk {
            let (target, id) = (target.clone(), id.clone());
            reads.spawn(async move { target.late_us(&id).await });
        }
        late.extend(reads.join_all().await);
    }
    late
}

/// Runs `phases` against `target` after an unmeasured warm-up (as BullMQ's script warms
/// up: the worker's first runs compile nothing, the component is cached, but fill its
/// pools and connections); `redis`: the server whose CPU per run each phase reports.
async fn run_phases(
    target: Arc<dyn Target>,
    phases: &[(Mode, Rate)],
    secs: f64,
    max_n: usize,
    redis: Option<&RedisServer>,
) -> Vec<Measured> {
    closed_loop(target.clone(), 1000).await;
    target.idle().await;
    let cpu = || redis.map(|r| RedisStats::read(r.port()));
    let mut out = Vec::new();
    let mut max = 0.0;
    for &(mode, rate) in phases {
        let before = cpu();
        let start = Instant::now();
        let (ids, rate) = match rate {
            Rate::Unlimited => (closed_loop(target.clone(), max_n).await, 0.0),
            Rate::PerSec(r) => open_loop(target.clone(), mode, r, (r * secs) as usize).await,
            Rate::OfMax(f) => {
                open_loop(target.clone(), mode, max * f, (max * f * secs) as usize).await
            }
        };
        target.idle().await;
        let rate = if mode == Mode::Max {
            max = ids.len() as f64 / start.elapsed().as_secs_f64();
            max
        } else {
            rate
        };
        let mut redis_us = 0.0;
        if let (Some(before), Some(after)) = (before, cpu()) {
            let what = format!("wasq {} at {rate:.0}/s", mode.name());
            before.report(&after, &what, ids.len(), true);
            redis_us = (after.cpu - before.cpu) * 1e6 / ids.len() as f64;
        }
        let mut late = lateness(&target, &ids).await;
        out.push(Measured {
            mode,
            rate,
            n: ids.len(),
            late: percentiles(&mut late),
            redis_us,
        });
    }
    out
}

/// The `cron` phase: `CRON_SCHEDULES` functions running `stamp` on a schedule that ticks
/// every second, for `cron_secs(secs)` seconds of ticks; their schedules are paused after
/// them. A run's lateness is when its guest started (`at_us`) minus its tick
/// (`scheduled_at` in its input): the scheduler's timer, the enqueue, the wake-up, the
/// claim and the instantiation. `redis`: the server whose CPU per run it reports (from
/// the deploys' end to the last run's end, per run of a tick in that time: the
/// scheduler's passes included).
async fn cron(
    target: &Arc<dyn Target>,
    api: &wasq_tests::Api,
    secs: f64,
    redis: Option<&RedisServer>,
) -> Measured {
    let names: Vec<String> = (0..CRON_SCHEDULES).map(|k| format!("cron{k}")).collect();
    let component = wasq_tests::guest("stamp");
    for name in &names {
        api.deploy(name, component.clone(), "cron=*%20*%20*%20*%20*%20*")
            .await;
    }
    // Redis's CPU from here to the last run's end, per run of the ticks in between.
    let (before, counted_from) = (redis.map(|r| RedisStats::read(r.port())), now_us() / 1000);
    // From the tick two seconds on: the scheduler may still be reading the new schedules
    // at the next one.
    let from_ms = (now_us() / 1_000_000 + 2) * 1000;
    let until_ms = from_ms + cron_secs(secs) as i64 * 1000;
    let left = until_ms + 500 - now_us() / 1000;
    tokio::time::sleep(Duration::from_millis(left.max(0) as u64)).await;
    for name in &names {
        let (status, body) = api
            .post(&format!("/v1/functions/{name}/schedule/pause"), "")
            .await;
        assert_eq!(status, 200, "pause {name}: {body}");
    }
    target.idle().await;
    let after = redis.map(|r| RedisStats::read(r.port()));
    let mut late = Vec::new();
    let mut runs = 0;
    for name in &names {
        let (status, list) = api
            .get(&format!("/v1/runs?function={name}&limit=1000"))
            .await;
        assert_eq!(status, 200, "runs of {name}: {list}");
        for run in list.as_array().unwrap() {
            let run = api.run_detail(run["id"].as_str().unwrap()).await;
            let tick = chrono::DateTime::parse_from_rfc3339(
                run["input"]["scheduled_at"].as_str().unwrap(),
            )
            .unwrap()
            .timestamp_millis();
            if tick >= counted_from {
                runs += 1;
            }
            if (from_ms..until_ms).contains(&tick) {
                let at = run["output"]["at_us"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("a succeeded stamp run: {run}"));
                late.push(at - tick * 1000);
            }
        }
    }
    let n = CRON_SCHEDULES * cron_secs(secs);
    assert_eq!(late.len(), n, "one run per schedule and tick");
    let redis_us = match (before, after) {
        (Some(before), Some(after)) => {
            before.report(&after, "wasq cron", runs, true);
            (after.cpu - before.cpu) * 1e6 / runs as f64
        }
        _ => 0.0,
    };
    Measured {
        mode: Mode::Cron,
        rate: CRON_SCHEDULES as f64,
        n,
        late: percentiles(&mut late),
        redis_us,
    }
}

/// Every phase on `wasq dev` (the embedded store), its runs created over its HTTP API.
async fn wasq_dev(secs: f64, max_n: usize) -> Vec<Measured> {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let concurrency = wasq_server::Config::dev(data.clone()).concurrency;
    let shutdown = CancellationToken::new();
    let server = wasq_server::start(queue::dev_config(&data, concurrency), shutdown.clone())
        .await
        .unwrap();
    let api = wasq_tests::Api::with_key(server.addr.unwrap(), server.dev_key.clone());
    api.deploy("stamp", wasq_tests::guest("stamp"), "").await;
    let target: Arc<dyn Target> = Arc::new(Dev(api.clone()));
    let mut out = run_phases(target.clone(), &PHASES, secs, max_n, None).await;
    out.push(cron(&target, &api, secs, None).await);
    shutdown.cancel();
    let _ = server.wait().await;
    out
}

/// Every phase for wasq, on a fresh API server (which deploys `stamp`) and one worker.
async fn wasq(redis: &RedisServer, secs: f64, max_n: usize) -> Vec<Measured> {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let (server, api) = redis_api(
        dir.path().join("server"),
        &redis.url(),
        "stamp",
        shutdown.clone(),
    )
    .await;
    let config = redis_worker(dir.path().join("worker"), &redis.url(), CONCURRENCY);
    let worker = wasq_server::start(config, shutdown.clone()).await.unwrap();
    let store = Arc::new(
        RedisStore::connect(&redis.url(), Arc::new(SystemClock))
            .await
            .unwrap(),
    );

    let target: Arc<dyn Target> = store;
    let mut out = run_phases(target.clone(), &PHASES, secs, max_n, Some(redis)).await;
    out.push(cron(&target, &api, secs, Some(redis)).await);
    shutdown.cancel();
    let _ = worker.wait().await;
    let _ = server.wait().await;
    out
}

/// Every phase for BullMQ (`bench/bullmq/latency.mjs`: its producer and one Worker at the
/// same concurrency, in one Node process).
fn bullmq(port: u16, secs: f64, max_n: usize) -> Vec<Measured> {
    let dir = npm_peer("bullmq");
    let mut out = Vec::new();
    let mut max = 0.0;
    // The cron phase: RATE schedules, N jobs (RATE a second for cron_secs).
    let cron = (
        Mode::Cron,
        Rate::PerSec(CRON_SCHEDULES as f64),
        CRON_SCHEDULES * cron_secs(secs),
    );
    let phases = PHASES.into_iter().map(|(m, r)| (m, r, 0)).chain([cron]);
    for (mode, rate, cron_n) in phases {
        let (rate, n) = match rate {
            _ if mode == Mode::Cron => (CRON_SCHEDULES as f64, cron_n),
            Rate::Unlimited => (0.0, max_n),
            Rate::PerSec(r) => (r, (r * secs) as usize),
            Rate::OfMax(f) => (max * f, (max * f * secs) as usize),
        };
        let args = [
            port.to_string(),
            mode.name().into(),
            format!("{rate:.0}"),
            n.to_string(),
            CONCURRENCY.to_string(),
        ];
        let before = RedisStats::read(port);
        let v = peer_json(
            &dir,
            "node",
            &["latency.mjs".to_string()]
                .into_iter()
                .chain(args)
                .collect::<Vec<_>>(),
        );
        let after = RedisStats::read(port);
        // The child also runs unmeasured jobs (a warm-up burst, and at a set rate a lead-in
        // on the schedule): it says how many it ran in all.
        let jobs = v["jobs_run"]
            .as_f64()
            .expect("latency.mjs reports the jobs it ran");
        let us = |k: &str| v[k].as_f64().unwrap_or(0.0).round() as i64;
        let achieved = v["achieved_rate"].as_f64().unwrap_or(0.0);
        if mode == Mode::Max {
            max = achieved;
        }
        out.push(Measured {
            mode,
            rate: if mode == Mode::Max { achieved } else { rate },
            n,
            late: [us("p50_us"), us("p99_us"), us("p999_us"), us("max_us")],
            redis_us: (after.cpu - before.cpu) * 1e6 / jobs,
        });
    }
    out
}

fn ms(us: i64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// A phase's p50 / p99 / p99.9 / max, in ms.
fn cell(m: &Measured) -> String {
    format!(
        "{} / {} / {} / {}",
        ms(m.late[0]),
        ms(m.late[1]),
        ms(m.late[2]),
        ms(m.late[3])
    )
}

fn main() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("WASQ_BENCH_SECS", 5.0);
    let max_n = env("WASQ_BENCH_N", 20_000.0) as usize;
    let rt = queue::daemon_runtime();
    let (wq, bm) = if std::env::var("WASQ_BENCH_ONLY").as_deref() == Ok("dev") {
        (Vec::new(), Vec::new())
    } else {
        let redis = RedisServer::start(RedisOptions::default());
        let wq = rt.block_on(wasq(&redis, secs, max_n));
        redis.cli(&["FLUSHALL"]);
        redis.cli(&["FUNCTION", "FLUSH"]);
        (wq, bullmq(redis.port(), secs, max_n))
    };
    let dev = rt.block_on(wasq_dev(secs, max_n));

    let mut json = Vec::new();
    println!(
        "create→start latency on one Redis, one worker at concurrency {CONCURRENCY}, ms (p50 / p99 / p99.9 / max):"
    );
    println!(
        "  {:<8} {:>22} {:>30} {:>22} {:>30} {:>10}",
        "phase", "wasq rate", "wasq", "BullMQ rate", "BullMQ", "p99 ratio"
    );
    for (w, b) in wq.iter().zip(&bm) {
        json.push(w.json("wasq"));
        json.push(b.json("bullmq"));
        println!(
            "  {:<8} {:>17.0} /s {:>30} {:>17.0} /s {:>30} {:>10.2}",
            w.mode.name(),
            w.rate,
            cell(w),
            b.rate,
            cell(b),
            w.late[1] as f64 / b.late[1].max(1) as f64
        );
    }
    println!("Redis CPU per run, µs (BullMQ's over its child process, unmeasured jobs included):");
    for (w, b) in wq.iter().zip(&bm) {
        println!(
            "  {:<8} {:>17.0} /s {:>10.1} {:>17.0} /s {:>10.1} {:>10.2}",
            w.mode.name(),
            w.rate,
            w.redis_us,
            b.rate,
            b.redis_us,
            w.redis_us / b.redis_us.max(0.001)
        );
    }
    for (w, b) in wq.iter().zip(&bm).filter(|(w, _)| w.mode == Mode::Max) {
        println!(
            "  sustained create + run: wasq {:.0}/s, BullMQ {:.0}/s, ratio {:.2}",
            w.rate,
            b.rate,
            w.rate / b.rate
        );
    }
    println!(
        "wasq dev (SQLite), created over HTTP, its worker at its default concurrency, ms (p50 / p99 / p99.9 / max):"
    );
    for d in &dev {
        json.push(d.json("wasq dev"));
        println!("  {:<8} {:>17.0} /s {:>30}", d.mode.name(), d.rate, cell(d));
    }
    queue::write_json("latency", &serde_json::Value::Array(json));
}

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use wasq_core::{Clock, Quotas, SystemClock};
use wasq_sandbox::SandboxConfig;

/// Everything a daemon needs; the CLI builds it from flags and environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the HTTP API listens; port 0 picks a free one (see [`crate::Running::addr`]).
    /// `None` serves no API (a `wasq worker`).
    pub listen: Option<SocketAddr>,
    /// Which queue backend holds functions and runs.
    pub store: StoreBackend,
    /// Holds the SQLite database (embedded store) and the compiled-component cache.
    pub data_dir: PathBuf,
    /// Runs the cron scheduler and the retention purge in this process. Several processes
    /// may do so on one shared store: cron ticks are deduplicated by the store.
    pub scheduler: bool,
    /// Attempts run at once by this process; 0 runs no worker (API only).
    pub concurrency: usize,
    /// Burst mode (`wasq worker --burst`): the worker stops once a claim finds nothing due
    /// and every attempt it started has ended, and the daemon stops with it. Runs due
    /// later (delayed, backing off, sleeping) and waiting runs are left for other workers.
    pub burst: bool,
    /// The queues this process's worker takes runs from, in that order (`wasq worker
    /// --queues critical,default`); empty takes every queue. See [`wasq_core::queues`].
    pub queues: Vec<String>,
    /// How long a claimed run stays leased without renewal; renewed every third of it.
    pub lease: Duration,
    /// On shutdown, how long running attempts may take to finish before they are
    /// interrupted and handed back to the queue.
    pub shutdown_grace: Duration,
    /// How often an idle worker looks for due runs when nothing woke it.
    pub poll_interval: Duration,
    pub sandbox: SandboxConfig,
    /// How long succeeded runs are kept after they end; `None` keeps them forever.
    pub result_ttl: Option<Duration>,
    /// How long failed and cancelled runs (the dead-letter set) are kept.
    pub failure_ttl: Option<Duration>,
    /// How often ended runs past their retention are deleted.
    pub purge_interval: Duration,
    pub auth: AuthConfig,
    /// Quotas of tenants created without explicit ones.
    pub default_quotas: Quotas,
    /// When new work is refused because the store is nearly full.
    pub guard: crate::guard::GuardConfig,
    /// Timeouts and connection caps of the HTTP API (see [`HttpLimits`]).
    pub http: HttpLimits,
    /// What the whole daemon reads as now: the store, the API, the worker, the scheduler,
    /// the purge and the sandbox (which gets this one, whatever `sandbox.clock` says).
    /// Tests give a [`wasq_core::ManualClock`]; everything else the system clock.
    pub clock: Arc<dyn Clock>,
}

/// What one client may hold of the HTTP server: slow or idle connections are cut, and a
/// flood of connections is refused before it costs a task or a file beyond the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// A connection must send a request's complete headers within this, counted from the
    /// accept or from the end of the previous response (so it also bounds an idle
    /// keep-alive connection).
    pub header_timeout: Duration,
    /// A request body that sends no bytes for this long (while the handler reads it) ends
    /// the request with 408 and closes the connection. A slow but steady upload is never
    /// cut; a request whose body is complete (a `?wait=` long-poll) is not affected.
    pub body_timeout: Duration,
    /// Open connections in all. Lowered at start to fit the open-file limit
    /// (`RLIMIT_NOFILE`) less a reserve for the store, the cache and the guests.
    pub max_connections: usize,
    /// Open connections from one client address (an IPv6 client: its /64). Behind a
    /// reverse proxy every connection comes from the proxy: raise this to `max_connections`.
    pub max_connections_per_ip: usize,
    /// Bytes of component uploads being received at once, over all clients (an upload
    /// without a Content-Length counts as the largest allowed). More uploads wait for
    /// room, up to `upload_wait`, then get 503: twenty parallel 60 MB uploads cannot pull
    /// 1.2 GB into the server at once.
    pub upload_bytes_in_flight: u64,
    /// How long an upload waits for room before it is refused.
    pub upload_wait: Duration,
    /// Run event streams (`GET /v1/runs/{id}/events`) one tenant may hold open on this
    /// server at once; more answer 429. Each reads the store every 100 ms: one tenant's
    /// watchers cannot load the store for everyone.
    pub max_event_streams_per_tenant: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            max_connections_per_ip: 256,
            upload_bytes_in_flight: 128 << 20,
            upload_wait: Duration::from_secs(30),
            max_event_streams_per_tenant: 64,
        }
    }
}

/// API keys and the operator key.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// The HMAC secret of API keys; servers sharing a store must share it. `None`: read
    /// `secret` from the data folder, creating it on first start (single-node use).
    pub secret: Option<Vec<u8>>,
    /// The operator key, which manages tenants and keys. `None`: read `admin.key` from
    /// the data folder, creating it on first start.
    pub admin_key: Option<String>,
    /// At start, make sure the `default` tenant exists and has a key, written to
    /// `dev.key` in the data folder (`wasq dev`: the tour needs no set-up).
    pub dev_tenant: bool,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("secret", &self.secret.as_ref().map(|_| "…"))
            .field("admin_key", &self.admin_key.as_ref().map(|_| "…"))
            .field("dev_tenant", &self.dev_tenant)
            .finish()
    }
}

impl Config {
    /// Defaults for `wasq dev`: loopback, data in `data_dir`.
    pub fn dev(data_dir: PathBuf) -> Self {
        Config {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))),
            store: StoreBackend::Sqlite,
            scheduler: true,
            sandbox: SandboxConfig {
                cache_dir: Some(data_dir.join("cache")),
                ..SandboxConfig::default()
            },
            data_dir,
            concurrency: std::thread::available_parallelism()
                .map(|n| n.get() * 4)
                .unwrap_or(8),
            burst: false,
            queues: Vec::new(),
            lease: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            poll_interval: Duration::from_millis(200),
            result_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
            failure_ttl: Some(Duration::from_secs(30 * 24 * 3600)),
            purge_interval: Duration::from_secs(60),
            auth: AuthConfig {
                dev_tenant: true,
                ..AuthConfig::default()
            },
            default_quotas: Quotas::default(),
            guard: crate::guard::GuardConfig::default(),
            http: HttpLimits::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// The queue backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// The embedded store: `wasq.db` in the data folder, one process at a time.
    Sqlite,
    /// A Redis shared by any number of processes: `redis://host:port[/db]` or
    /// `redis+cluster://host:port,host:port,...`.
    Redis(String),
    /// In this process's memory (`wasq_store_memory`): nothing survives the process. For
    /// tests of the daemon that need neither a file nor a server; no CLI flag selects it.
    Memory,
}

impl StoreBackend {
    /// Whether the store is a Redis on this machine, sharing its cores: a URL whose hosts
    /// include `localhost`, a loopback address (127.0.0.0/8, `::1`) or a unix socket. A
    /// URL this cannot read counts as remote (the store says what is wrong with it).
    pub fn is_local_redis(&self) -> bool {
        let StoreBackend::Redis(url) = self else {
            return false;
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return false;
        };
        if scheme.contains("unix") {
            return true;
        }
        let hosts = rest.split(['/', '?']).next().unwrap_or("");
        hosts.split(',').any(|h| {
            let h = h.rsplit_once('@').map_or(h, |(_, h)| h);
            let host = match h.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or(""),
                None => h.split(':').next().unwrap_or(""),
            };
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
    }
}

/// The async runtime's threads for a daemon on `store` on a machine of `cores` cores,
/// when `--threads` does not say: one per core, less one when Redis runs on this
/// machine. Redis executes every command on one thread; a runtime with a thread per core
/// beside it preempts it, and hands tasks between threads that each have little to do.
/// On 2 cores with Redis on them, one thread drained 5-9% more runs per second at
/// concurrency 50 than two, spent 12% less CPU per run, and served 15% more creates
/// over HTTP (docs/performance.md, 2026-12-05).
pub(crate) fn default_threads(store: &StoreBackend, cores: usize) -> usize {
    if store.is_local_redis() {
        cores.saturating_sub(1).max(1)
    } else {
        cores.max(1)
    }
}

/// [`default_threads`] on this machine.
pub fn runtime_threads(store: &StoreBackend) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    default_threads(store, cores)
}

/// Tasks a runtime thread polls between two looks at its sockets and timers (tokio's
/// default is 61). A worker's attempts are tasks that each hold the thread for tens of
/// microseconds (a sandbox made, a guest run, dropped): while attempts were ready to run,
/// up to 61 of them ran before the replies Redis had already sent (a claim's runs, a
/// batch of ends answered) were read and the next commands written, and Redis waited.
/// With 8, a drain at concurrency 50 ran 10-15% faster at the same CPU per run, and
/// `wasq dev`'s 8-12% faster (docs/performance.md, twelfth session); 1, 2, 4 and 16
/// measured about the same as 8.
const EVENT_INTERVAL: u32 = 8;

/// The async runtime a daemon runs on, with `threads` worker threads (`--threads`, or
/// [`runtime_threads`]): the `wasq` binary's, and the benches' that run a daemon in
/// process, so that they measure the same one.
pub fn daemon_runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .event_interval(EVENT_INTERVAL)
        .enable_all()
        .build()
}

pub const DEFAULT_PORT: u16 = 7070;

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(url: &str) -> StoreBackend {
        StoreBackend::Redis(url.into())
    }

    #[test]
    fn a_redis_on_this_machine_is_recognised_by_its_url() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://localhost",
            "redis://LocalHost:7000/2",
            "redis://user:pw@127.0.0.2:6379/0",
            "redis://[::1]:6379",
            "rediss://127.0.0.1",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock",
            "redis+cluster://10.0.0.5:7000,127.0.0.1:7001",
        ] {
            assert!(redis(url).is_local_redis(), "{url}");
        }
        for url in [
            "redis://10.0.0.5:6379",
            "redis://redis.internal:6379/0",
            "redis://user:127.0.0.1@10.0.0.5",
            "redis://[2001:db8::1]:6379",
            "redis+cluster://10.0.0.5:7000,10.0.0.6:7001",
            "not a url",
        ] {
            assert!(!redis(url).is_local_redis(), "{url}");
        }
        assert!(!StoreBackend::Sqlite.is_local_redis());
        assert!(!StoreBackend::Memory.is_local_redis());
    }

    #[test]
    fn a_redis_on_this_machine_keeps_a_core_of_its_own() {
        let local = redis("redis://127.0.0.1:6379");
        let remote = redis("redis://10.0.0.5:6379");
        assert_eq!(default_threads(&local, 2), 1);
        assert_eq!(default_threads(&local, 16), 15);
        assert_eq!(default_threads(&local, 1), 1);
        assert_eq!(default_threads(&remote, 2), 2);
        assert_eq!(default_threads(&StoreBackend::Sqlite, 8), 8);
        assert_eq!(default_threads(&StoreBackend::Sqlite, 0), 1);
    }
}

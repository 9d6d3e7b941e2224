//! wasq-server: the daemon — HTTP API, worker loop, cron scheduler, retention and
//! wiring — behind `wasq dev`.
//!
//! [`run`] is the whole daemon: open the store, build the sandbox, serve the API and run
//! the worker, the scheduler and the purge until the shutdown token fires, then stop
//! claiming, let running attempts finish within a grace period and hand the rest back to
//! the queue. Binaries only parse arguments and call it; tests call [`start`] to learn
//! the bound address.
//!
//! The key decision: the worker talks to the queue only through `wasq_core::Store` and to
//! wasmtime only through `wasq_sandbox`, so backends and the sandbox change without
//! touching the loop. This crate is not a client: the CLI's client verbs speak HTTP.

mod admin;
mod api;
mod auth;
mod config;
mod cron;
mod datadir;
mod error;
mod flow_params;
mod guard;
mod metrics;
mod notify;
mod on_failure;
mod openapi;
mod schedule;
mod serve;
mod telemetry;
mod ui;
mod worker;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use wasq_core::{Backend, Clock};
use wasq_sandbox::Sandbox;
use wasq_store_redis::RedisStore;
use wasq_store_sqlite::SqliteStore;

pub use api::DeployParams;
pub use config::{Config, DEFAULT_PORT, HttpLimits, StoreBackend, daemon_runtime, runtime_threads};
pub use error::{ApiError, ServerError};
pub use guard::{FreeSpace, GuardConfig};
/// For binaries: call [`compile_child_main`] first thing in `main` (see
/// `wasq_sandbox::Compiler`).
pub use wasq_sandbox::{CHILD_ARG, CHILD_ENV, Compiler, compile_child_main};

/// The smallest memory limit a function may ask for (see `wasq_core::Limits::validate`).
pub use wasq_core::MAX_MEMORY_FLOOR;

/// What the API handlers and the worker share.
pub(crate) struct App {
    pub config: Config,
    /// The backend: runs, functions, events, and tenants and keys.
    pub store: Arc<dyn Backend>,
    pub keyring: auth::Keyring,
    /// Keys looked up recently (see `auth::KeyCache`).
    pub keys: auth::KeyCache,
    pub sandbox: Sandbox,
    /// Wakes an idle worker when a run is created in this process.
    pub wake: Notify,
    /// Wakes the webhook sender when this process added deliveries.
    pub deliveries: Notify,
    /// Attempts this process is running.
    pub in_flight: worker::InFlight,
    pub quotas: worker::QuotaCache,
    pub metrics: metrics::Metrics,
    /// Whether new work is refused because the store is nearly full.
    pub guard: guard::Guard,
    /// Room for upload bodies in flight, in KiB (see `HttpLimits::upload_bytes_in_flight`).
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// Runs that ended in this process, for requests waiting on them.
    pub finished: tokio::sync::broadcast::Sender<wasq_core::RunId>,
    /// Run event streams open, per tenant (see `HttpLimits::max_event_streams_per_tenant`).
    pub streams: api::Streams,
    /// The daemon's shutdown: streams that would not end by themselves end with it.
    pub shutdown: CancellationToken,
    pub worker_id: String,
    /// Held for the daemon's life: one daemon per data folder (embedded store only).
    _lock: Option<std::fs::File>,
}

impl App {
    /// Now, by the clock the store and the sandbox read too.
    pub(crate) fn now(&self) -> wasq_core::clock::Millis {
        self.config.clock.now_ms()
    }
}

/// A started daemon.
#[derive(Debug)]
pub struct Running {
    /// Where the API listens (the real port when the config asked for port 0); `None`
    /// when the config serves no API.
    pub addr: Option<SocketAddr>,
    /// The `default` tenant's key, when the config asked for it (`wasq dev`).
    pub dev_key: Option<String>,
    /// The operator key in force.
    pub admin_key: String,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl Running {
    /// Waits until the daemon has stopped (after the shutdown token fired).
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task
            .await
            .unwrap_or_else(|e| Err(ServerError::Serve(std::io::Error::other(e))))
    }
}

/// Runs the daemon until `shutdown` is cancelled and everything has stopped.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), ServerError> {
    start(config, shutdown).await?.wait().await
}

/// Opens the store, binds the listener and spawns the API and the worker.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, ServerError> {
    let Assembled {
        app,
        listener,
        addr,
        dev_key,
        admin_key,
    } = assemble(config, &shutdown).await?;
    let task = tokio::spawn(async move {
        let guard = tokio::spawn(guard::watch(app.clone(), shutdown.clone()));
        // Webhooks are signed with the server secret, which only servers must share.
        let sender = app
            .config
            .scheduler
            .then(|| tokio::spawn(notify::run(app.clone(), shutdown.clone())));
        let worker = (app.config.concurrency > 0).then(|| {
            let (app, shutdown) = (app.clone(), shutdown.clone());
            tokio::spawn(async move {
                worker::run(app.clone(), shutdown.clone()).await;
                if app.config.burst {
                    // The burst is over: the rest of the daemon stops with its worker.
                    tracing::info!("burst done: nothing more is due");
                    shutdown.cancel();
                }
            })
        });
        let scheduler = app.config.scheduler.then(|| {
            (
                tokio::spawn(purge_expired(app.clone(), shutdown.clone())),
                tokio::spawn(schedule::run(app.clone(), shutdown.clone())),
            )
        });
        let served = match listener {
            Some(listener) => {
                let router = api::router(app.clone());
                if let Some(addr) = addr {
                    tracing::info!(%addr, "API listening");
                }
                serve::serve(listener, router, &app.config.http, shutdown.clone()).await;
                Ok(())
            }
            None => {
                shutdown.cancelled().await;
                Ok(())
            }
        };
        if let Some(w) = worker {
            let _ = w.await;
        }
        if let Some((janitor, cron)) = scheduler {
            let _ = janitor.await;
            let _ = cron.await;
        }
        let _ = guard.await;
        if let Some(sender) = sender {
            let _ = sender.await;
        }
        tracing::info!("stopped");
        served
    });
    Ok(Running {
        addr,
        dev_key,
        admin_key,
        task,
    })
}

/// A daemon put together but not yet running: the tests of this crate drive its router
/// and worker directly.
pub(crate) struct Assembled {
    pub(crate) app: Arc<App>,
    listener: Option<tokio::net::TcpListener>,
    addr: Option<SocketAddr>,
    dev_key: Option<String>,
    admin_key: String,
}

/// Opens the store, the keys and the sandbox, and binds the listener (if any).
pub(crate) async fn assemble(
    mut config: Config,
    shutdown: &CancellationToken,
) -> Result<Assembled, ServerError> {
    // One clock for everything in the process: the store's, the sandbox's and ours.
    config.sandbox.clock = config.clock.clone();
    datadir::prepare(&config.data_dir, config.sandbox.cache_dir.as_deref())?;
    let (store, lock) = open_store(&config, shutdown).await?;
    let (keyring, admin_key) = keyring(&config)?;
    let sandbox = Sandbox::new(config.sandbox.clone())?;
    let listener = match config.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Listen { addr, source })?,
        ),
        None => None,
    };
    let addr = match &listener {
        Some(l) => Some(l.local_addr().map_err(ServerError::Serve)?),
        None => None,
    };
    let upload_kib =
        (config.http.upload_bytes_in_flight >> 10).clamp(1, u64::from(u32::MAX >> 3)) as usize;
    let app = Arc::new(App {
        worker_id: format!("{}-{}", hostname(), std::process::id()),
        config,
        store,
        keyring,
        keys: auth::KeyCache::default(),
        sandbox,
        wake: Notify::new(),
        deliveries: Notify::new(),
        in_flight: worker::InFlight::default(),
        quotas: worker::QuotaCache::default(),
        metrics: metrics::Metrics::new(),
        guard: guard::Guard::default(),
        uploads: Arc::new(tokio::sync::Semaphore::new(upload_kib)),
        finished: tokio::sync::broadcast::channel(1024).0,
        streams: api::Streams::default(),
        shutdown: shutdown.clone(),
        _lock: lock,
    });

    let dev_key = if app.config.auth.dev_tenant {
        Some(dev_tenant_key(&app).await?)
    } else {
        None
    };

    Ok(Assembled {
        app,
        listener,
        addr,
        dev_key,
        admin_key,
    })
}

/// Opens the configured backend. The embedded store takes the data folder's lock and
/// recovers runs a dead predecessor left leased; Redis is shared, so neither applies there
/// (expired leases are reclaimed by whichever worker claims next).
type Opened = (Arc<dyn Backend>, Option<std::fs::File>);

async fn open_store(config: &Config, shutdown: &CancellationToken) -> Result<Opened, ServerError> {
    match &config.store {
        StoreBackend::Sqlite => {
            let dir = &config.data_dir;
            let lock = lock_data_dir(dir)?;
            let store = SqliteStore::open(&dir.join("wasq.db"), config.clock.clone())?;
            // We hold the folder alone, so any run still leased was leased by a process
            // that died.
            let abandoned = store.expire_all_leases().await?;
            if abandoned > 0 {
                tracing::warn!(
                    runs = abandoned,
                    "recovering runs left running by a previous process"
                );
            }
            let store = Arc::new(store);
            Ok((store, Some(lock)))
        }
        StoreBackend::Memory => {
            let store = Arc::new(wasq_store_memory::MemoryStore::new(config.clock.clone()));
            Ok((store, None))
        }
        StoreBackend::Redis(target) => {
            let store = connect_redis(target, config.clock.clone(), shutdown).await?;
            for warning in store.startup_warnings().await {
                tracing::warn!("{warning}");
            }
            let store = Arc::new(store);
            Ok((store, None))
        }
    }
}

/// Connects to Redis, waiting while it is unreachable or still loading its dataset: a
/// daemon started with its Redis (a reboot, a deployment) must come up once Redis does,
/// not exit. Gives up at shutdown, or at once on an error waiting cannot fix (a bad URL).
async fn connect_redis(
    target: &str,
    clock: Arc<dyn Clock>,
    shutdown: &CancellationToken,
) -> Result<RedisStore, ServerError> {
    const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(5);
    let mut delay = std::time::Duration::from_millis(250);
    loop {
        let error = match RedisStore::connect(target, clock.clone()).await {
            Ok(store) => return Ok(store),
            Err(e) => e,
        };
        let fail = |source| ServerError::Redis {
            target: target.to_owned(),
            source,
        };
        if !error.is_retryable() {
            return Err(fail(error));
        }
        tracing::warn!(
            "Redis at {target} is not ready ({error}); trying again in {} ms",
            delay.as_millis()
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return Err(fail(error)),
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// The HMAC secret and the operator key: from the config, else from files in the data
/// folder, created (mode 0600) on first start.
fn keyring(config: &Config) -> Result<(auth::Keyring, String), ServerError> {
    let secret = match &config.auth.secret {
        Some(s) => s.clone(),
        None => read_or_create(&config.data_dir.join("secret"), || {
            hex::encode(auth::random_bytes::<32>())
        })?
        .into_bytes(),
    };
    let admin = match &config.auth.admin_key {
        Some(k) => k.clone(),
        None => read_or_create(&config.data_dir.join("admin.key"), || {
            format!("wasq_admin_{}", hex::encode(auth::random_bytes::<16>()))
        })?,
    };
    Ok((auth::Keyring::new(&secret, Some(&admin)), admin))
}

fn read_or_create(
    path: &std::path::Path,
    make: impl FnOnce() -> String,
) -> Result<String, ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| ServerError::DataDir {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let value = make();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)?;
    Ok(value)
}

/// Makes sure the `default` tenant exists and `dev.key` in the data folder holds a valid
/// key of it (a new one if the file is missing, or its key unknown or revoked).
async fn dev_tenant_key(app: &App) -> Result<String, ServerError> {
    use wasq_core::{DEFAULT_TENANT, StoreError, Tenant};
    let tenant = DEFAULT_TENANT;
    match app
        .store
        .create_tenant(Tenant {
            name: tenant.into(),
            created_at: app.now(),
            quotas: app.config.default_quotas,
        })
        .await
    {
        Ok(_) | Err(StoreError::Conflict(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let path = app.config.data_dir.join("dev.key");
    if let Ok(key) = std::fs::read_to_string(&path) {
        let key = key.trim();
        if let Some(id) = auth::key_id(key)
            && let Some(stored) = app.store.key(id).await?
            && stored.tenant == tenant
            && stored.revoked_at.is_none()
            && app.keyring.matches(key, &stored.hmac)
        {
            return Ok(key.to_owned());
        }
    }
    let (key, _) = admin::new_key(app, tenant, "wasq dev".into())
        .await
        .map_err(|e| ServerError::Store(wasq_core::StoreError::Internal(e.message)))?;
    let _ = std::fs::remove_file(&path);
    read_or_create(&path, || key.clone())?;
    Ok(key)
}

/// Deletes ended runs past their retention (`result_ttl`, `failure_ttl`), in batches.
async fn purge_expired(app: Arc<App>, shutdown: CancellationToken) {
    const BATCH: usize = 1000;
    if app.config.result_ttl.is_none() && app.config.failure_ttl.is_none() {
        return;
    }
    let before = |ttl: Option<std::time::Duration>, now: i64| {
        ttl.map_or(i64::MIN, |t| now - t.as_millis() as i64)
    };
    let every = app.config.purge_interval;
    loop {
        let next = app.now().saturating_add(every.as_millis() as i64);
        tokio::select! {
            _ = app.config.clock.wait_until(next, every) => {}
            _ = shutdown.cancelled() => return,
        }
        loop {
            let now = app.now();
            let req = wasq_core::PurgeRequest {
                succeeded_before: before(app.config.result_ttl, now),
                failed_before: before(app.config.failure_ttl, now),
                limit: BATCH,
            };
            match app.store.purge(req).await {
                Ok(n) if n == BATCH => continue,
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(runs = n, "purged ended runs past their retention");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purging ended runs failed");
                    break;
                }
            }
        }
    }
}

fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, ServerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| ServerError::DataDir {
            path: path.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(ServerError::DataDirInUse(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(source)) => Err(ServerError::DataDir { path, source }),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

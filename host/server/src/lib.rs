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

mod api;
mod config;
mod error;
mod schedule;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use wasq_core::{Store, SystemClock};
use wasq_sandbox::{Sandbox, SandboxConfig};
use wasq_store_sqlite::SqliteStore;

pub use api::DeployParams;
pub use config::{Config, DEFAULT_PORT};
pub use error::{ApiError, ServerError};

/// The smallest memory limit a function may ask for: below it even a small guest's
/// stack and data do not fit.
pub const MAX_MEMORY_FLOOR: u64 = 1 << 20;

/// What the API handlers and the worker share.
pub(crate) struct App {
    pub config: Config,
    pub store: Arc<dyn Store>,
    pub sandbox: Sandbox,
    pub sandbox_config: SandboxConfig,
    /// Wakes an idle worker when a run is created in this process.
    pub wake: Notify,
    /// Attempts this process is running.
    pub in_flight: worker::InFlight,
    /// Runs that ended in this process, for requests waiting on them.
    pub finished: tokio::sync::broadcast::Sender<wasq_core::RunId>,
    pub worker_id: String,
    /// Held for the daemon's life: one daemon per data folder.
    _lock: std::fs::File,
}

/// A started daemon.
#[derive(Debug)]
pub struct Running {
    /// Where the API listens (the real port when the config asked for port 0).
    pub addr: SocketAddr,
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
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir).map_err(|source| ServerError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let lock = lock_data_dir(dir)?;
    let store = SqliteStore::open(&dir.join("wasq.db"), Arc::new(SystemClock))?;
    // We hold the folder alone, so any run still leased was leased by a process that died.
    let abandoned = store.expire_all_leases().await?;
    if abandoned > 0 {
        tracing::warn!(
            runs = abandoned,
            "recovering runs left running by a previous process"
        );
    }
    let sandbox = Sandbox::new(config.sandbox.clone())?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServerError::Serve)?;
    let app = Arc::new(App {
        sandbox_config: config.sandbox.clone(),
        worker_id: format!("{}-{}", hostname(), std::process::id()),
        config,
        store: Arc::new(store),
        sandbox,
        wake: Notify::new(),
        in_flight: worker::InFlight::default(),
        finished: tokio::sync::broadcast::channel(1024).0,
        _lock: lock,
    });

    let task = tokio::spawn(async move {
        let worker = (app.config.concurrency > 0)
            .then(|| tokio::spawn(worker::run(app.clone(), shutdown.clone())));
        let janitor = tokio::spawn(purge_expired(app.clone(), shutdown.clone()));
        let cron = tokio::spawn(schedule::run(app.clone(), shutdown.clone()));
        let router = api::router(app.clone());
        let api_shutdown = shutdown.clone();
        let serve = axum::serve(listener, router)
            .with_graceful_shutdown(async move { api_shutdown.cancelled().await });
        tracing::info!(%addr, "API listening");
        let served = serve.await.map_err(ServerError::Serve);
        if let Some(w) = worker {
            let _ = w.await;
        }
        let _ = janitor.await;
        let _ = cron.await;
        tracing::info!("stopped");
        served
    });
    Ok(Running { addr, task })
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
    loop {
        tokio::select! {
            _ = tokio::time::sleep(app.config.purge_interval) => {}
            _ = shutdown.cancelled() => return,
        }
        loop {
            let now = wasq_core::Clock::now_ms(&SystemClock);
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
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
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

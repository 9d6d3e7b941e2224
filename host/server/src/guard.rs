//! The store guard: refuses new work while the store is nearly full, before the store
//! itself starts refusing writes, so that work already accepted can always finish.
//!
//! On Redis it watches `used_memory` against `maxmemory` (every master of a Cluster; the
//! fullest decides) and refuses above a high watermark; on the embedded store it watches
//! the free space of the data folder's disk. "New work" is what adds runs or functions:
//! creating a run, sending an event, deploying, retrying a run, `run-now`, cron ticks and
//! child runs. What an attempt under way records (steps, logs, its end) goes on, into the
//! room the watermark leaves. A refusal is 503 `store_full` with the reason.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::StatusCode;
use tokio_util::sync::CancellationToken;

use crate::App;
use crate::config::StoreBackend;
use crate::error::ApiError;

/// Reads the free bytes of the disk the embedded store is on. Tests inject their own.
pub type FreeSpace = Arc<dyn Fn() -> std::io::Result<u64> + Send + Sync>;

/// When the guard refuses new work.
#[derive(Clone)]
pub struct GuardConfig {
    /// How often the store's room is read.
    pub interval: Duration,
    /// Redis: refuse new work once `used_memory` reaches this share of `maxmemory`.
    pub memory_watermark: f64,
    /// The embedded store: refuse new work while its disk has less free space than this.
    pub min_free_disk: u64,
    /// Where free disk space is read from; `None`: `statvfs` of the data folder.
    pub free_space: Option<FreeSpace>,
}

impl std::fmt::Debug for GuardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardConfig")
            .field("interval", &self.interval)
            .field("memory_watermark", &self.memory_watermark)
            .field("min_free_disk", &self.min_free_disk)
            .field("free_space", &self.free_space.as_ref().map(|_| "injected"))
            .finish()
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            interval: Duration::from_secs(1),
            memory_watermark: 0.9,
            min_free_disk: 512 << 20,
            free_space: None,
        }
    }
}

/// Whether new work is refused now, and why.
#[derive(Default)]
pub(crate) struct Guard(RwLock<Option<String>>);

impl Guard {
    pub(crate) fn refusing(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err(503 store_full)` while new work is refused.
    pub(crate) fn admit(&self) -> Result<(), ApiError> {
        match self.refusing() {
            None => Ok(()),
            Some(reason) => Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "store_full",
                message: format!("new work is refused for now: {reason}"),
                retry_after_ms: Some(30_000),
            }),
        }
    }

    fn set(&self, state: Option<String>) {
        let mut cur = self.0.write().unwrap_or_else(|p| p.into_inner());
        match (&*cur, &state) {
            (None, Some(reason)) => {
                tracing::error!("the store is nearly full; refusing new work: {reason}")
            }
            (Some(_), None) => tracing::warn!("the store has room again; accepting new work"),
            _ => {}
        }
        *cur = state;
    }
}

/// Reads the store's room every `interval` until shutdown.
pub(crate) async fn watch(app: Arc<App>, shutdown: CancellationToken) {
    loop {
        match check(&app).await {
            Ok(state) => app.guard.set(state),
            Err(e) => tracing::warn!(error = %e, "cannot read how full the store is"),
        }
        tokio::select! {
            _ = tokio::time::sleep(app.config.guard.interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// `Some(reason)` when new work must be refused now.
async fn check(app: &App) -> Result<Option<String>, String> {
    let g = &app.config.guard;
    match &app.config.store {
        StoreBackend::Sqlite => {
            let free = match &g.free_space {
                Some(f) => f(),
                None => free_disk(&app.config.data_dir),
            }
            .map_err(|e| format!("free disk space of {}: {e}", app.config.data_dir.display()))?;
            Ok((free < g.min_free_disk).then(|| {
                format!(
                    "the disk of {} has {} MiB free, under the minimum of {} MiB",
                    app.config.data_dir.display(),
                    free >> 20,
                    g.min_free_disk >> 20
                )
            }))
        }
        StoreBackend::Memory => Ok(None),
        StoreBackend::Redis(_) => {
            let Some(c) = app.store.capacity().await.map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            let fill = c.used as f64 / c.limit as f64;
            Ok((fill >= g.memory_watermark).then(|| {
                format!(
                    "Redis uses {} MiB of its maxmemory of {} MiB ({:.0}%, over the {:.0}% watermark)",
                    c.used >> 20,
                    c.limit >> 20,
                    fill * 100.0,
                    g.memory_watermark * 100.0
                )
            }))
        }
    }
}

fn free_disk(dir: &std::path::Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

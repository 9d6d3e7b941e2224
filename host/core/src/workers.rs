//! Workers: the processes that execute runs, as their heartbeats tell of them, for
//! `GET /v1/workers`, `wasq status` and the dashboard's queue health.
//!
//! The key decision: a worker is known only by its last heartbeat ([`Workers::beat`],
//! every [`WORKER_BEAT_MS`]); one not heard from within [`WORKER_GONE_MS`] is not listed,
//! and stores may forget it. Nothing depends on the registry: claims, leases and their
//! expiry are what recover a dead worker's runs. A worker that stops cleanly says so
//! ([`Workers::leave`]) and disappears at once.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::StoreError;
use crate::clock::Millis;

/// How often a worker beats.
pub const WORKER_BEAT_MS: Millis = 5_000;
/// A worker not heard from for this long is gone.
pub const WORKER_GONE_MS: Millis = 30_000;
/// Workers one listing answers at most.
pub const MAX_WORKERS_LISTED: usize = 1000;

/// A worker as its last heartbeat described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerBeat {
    /// `<host>-<pid>`: what runs' attempts name as their worker (set by the worker
    /// process, not by a tenant; the kernel bounds a host name to 64 bytes).
    pub id: String,
    /// The queues it takes runs from, in order; empty: every queue.
    pub queues: Vec<String>,
    /// Attempts it runs at once at most.
    pub slots: u32,
    /// Attempts it was running.
    pub busy: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub started_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub seen_at: Millis,
}

/// The worker registry (see [`crate::workers`]).
#[async_trait]
pub trait Workers: Send + Sync + 'static {
    /// Records `beat` as its worker's latest.
    async fn beat(&self, beat: WorkerBeat) -> Result<(), StoreError>;
    /// Forgets worker `id` (it stopped).
    async fn leave(&self, id: &str) -> Result<(), StoreError>;
    /// Workers heard from at or after `since`, by id, at most [`MAX_WORKERS_LISTED`].
    async fn workers(&self, since: Millis) -> Result<Vec<WorkerBeat>, StoreError>;
}

//! The worker's heartbeat into the store's registry (`wasq_core::workers`): who it is,
//! which queues it takes, its slots and how many are busy, every `WORKER_BEAT_MS`; and
//! its leaving when it stops. A failed beat is logged and tried again at the next one:
//! nothing but listings depends on it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wasq_core::WorkerBeat;
use wasq_core::workers::WORKER_BEAT_MS;

use crate::App;

/// Beats until `stop` fires.
pub(super) async fn run(app: Arc<App>, stop: CancellationToken) {
    let started_at = app.now();
    loop {
        let beat = WorkerBeat {
            id: app.worker_id.clone(),
            queues: app.config.queues.clone(),
            slots: u32::try_from(app.config.concurrency).unwrap_or(u32::MAX),
            busy: u32::try_from(app.in_flight.executing()).unwrap_or(u32::MAX),
            started_at,
            seen_at: app.now(),
        };
        if let Err(e) = app.store.beat(beat).await {
            tracing::debug!(error = %e, "worker heartbeat failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(WORKER_BEAT_MS as u64)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Takes the worker out of the registry (it stopped).
pub(super) async fn leave(app: &App) {
    if let Err(e) = app.store.leave(&app.worker_id).await {
        tracing::debug!(error = %e, "leaving the worker registry failed");
    }
}

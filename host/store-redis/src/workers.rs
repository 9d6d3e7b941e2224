//! The worker registry ([`Workers`]): one hash of the deployment, `workers`, with each
//! worker's latest heartbeat (JSON) by id. Workers gone for an hour are deleted by the
//! next listing.

use std::collections::HashMap;

use async_trait::async_trait;
use wasq_core::clock::Millis;
use wasq_core::workers::{MAX_WORKERS_LISTED, WORKER_GONE_MS};
use wasq_core::*;

use crate::RedisStore;

/// Entries of workers gone this long are deleted by the next listing.
const FORGET_MS: Millis = 120 * WORKER_GONE_MS;

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Internal(format!("a worker's heartbeat does not parse: {e}"))
}

#[async_trait]
impl Workers for RedisStore {
    async fn beat(&self, beat: WorkerBeat) -> Result<(), StoreError> {
        let json = serde_json::to_string(&beat).map_err(corrupt)?;
        self.query::<()>(
            redis::cmd("HSET")
                .arg(self.g("workers"))
                .arg(&beat.id)
                .arg(json),
        )
        .await
    }

    async fn leave(&self, id: &str) -> Result<(), StoreError> {
        self.query::<()>(redis::cmd("HDEL").arg(self.g("workers")).arg(id))
            .await
    }

    async fn workers(&self, since: Millis) -> Result<Vec<WorkerBeat>, StoreError> {
        let all: HashMap<String, String> = self
            .query(redis::cmd("HGETALL").arg(self.g("workers")))
            .await?;
        let mut out = Vec::new();
        let mut forget = Vec::new();
        for (id, json) in all {
            let beat: WorkerBeat = serde_json::from_str(&json).map_err(corrupt)?;
            if beat.seen_at >= since {
                out.push(beat);
            } else if beat.seen_at < since - FORGET_MS {
                forget.push(id);
            }
        }
        if !forget.is_empty() {
            self.query::<()>(redis::cmd("HDEL").arg(self.g("workers")).arg(forget))
                .await?;
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.truncate(MAX_WORKERS_LISTED);
        Ok(out)
    }
}

//! The worker registry ([`Workers`]): each worker's latest heartbeat, as JSON.

use async_trait::async_trait;
use rusqlite::params;
use wasq_core::clock::Millis;
use wasq_core::workers::{MAX_WORKERS_LISTED, WORKER_GONE_MS};
use wasq_core::*;

use crate::cached::Cached;
use crate::{SqliteStore, from_json, internal, to_json};

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS workers (
    id      TEXT PRIMARY KEY,
    beat    TEXT NOT NULL,
    seen_at INTEGER NOT NULL
);
"#;

/// Rows of workers gone this long are deleted by the next beat.
const FORGET_MS: Millis = 60 * WORKER_GONE_MS;

#[async_trait]
impl Workers for SqliteStore {
    async fn beat(&self, beat: WorkerBeat) -> Result<(), StoreError> {
        self.tx(move |tx, _| {
            let json = to_json(&beat)?;
            tx.exec(
                "INSERT INTO workers (id, beat, seen_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET beat = excluded.beat, seen_at = excluded.seen_at",
                params![beat.id, json, beat.seen_at],
            )
            .map_err(internal)?;
            tx.exec(
                "DELETE FROM workers WHERE seen_at < ?1",
                params![beat.seen_at - FORGET_MS],
            )
            .map_err(internal)?;
            Ok(())
        })
        .await
    }

    async fn leave(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.tx(move |tx, _| {
            tx.exec("DELETE FROM workers WHERE id = ?1", params![id])
                .map_err(internal)?;
            Ok(())
        })
        .await
    }

    async fn workers(&self, since: Millis) -> Result<Vec<WorkerBeat>, StoreError> {
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached("SELECT beat FROM workers WHERE seen_at >= ?1 ORDER BY id LIMIT ?2")
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![since, MAX_WORKERS_LISTED as i64], |r| {
                    r.get::<_, String>(0)
                })
                .map_err(internal)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(from_json(&row.map_err(internal)?).map_err(internal)?);
            }
            Ok(out)
        })
        .await
    }
}

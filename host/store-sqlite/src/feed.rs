//! The tenant feed ([`Feed`]): triggers append a row for every new run and every status
//! change while the tenant is listened to (`feed_listen`); otherwise they cost one primary
//! key lookup. Cursors are the rows' sequence numbers.

use wasq_core::feed::{FEED_KEEP, FeedEntry, FeedPage};

use super::*;

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS feed_listen (
    tenant TEXT PRIMARY KEY,
    until  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS feed (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant   TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    function TEXT NOT NULL,
    status   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    at       INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS feed_by_tenant ON feed (tenant, seq);
CREATE INDEX IF NOT EXISTS feed_by_time ON feed (at);
CREATE TRIGGER IF NOT EXISTS runs_feed_insert AFTER INSERT ON runs
WHEN EXISTS (SELECT 1 FROM feed_listen WHERE tenant = NEW.tenant AND until >= NEW.updated_at)
BEGIN
    INSERT INTO feed (tenant, run_id, function, status, attempt, at)
    VALUES (NEW.tenant, NEW.id, NEW.function, NEW.status, NEW.attempt, NEW.updated_at);
END;
CREATE TRIGGER IF NOT EXISTS runs_feed_status AFTER UPDATE OF status ON runs
WHEN OLD.status <> NEW.status
    AND EXISTS (SELECT 1 FROM feed_listen WHERE tenant = NEW.tenant AND until >= NEW.updated_at)
BEGIN
    INSERT INTO feed (tenant, run_id, function, status, attempt, at)
    VALUES (NEW.tenant, NEW.id, NEW.function, NEW.status, NEW.attempt, NEW.updated_at);
END;
"#;

/// How long entries are kept whatever the listening (a purge drops older ones).
const KEEP_MS: i64 = 3600 * 1000;

/// Drops entries older than [`KEEP_MS`].
pub(crate) fn forget_old(tx: &Connection, now: i64) -> Result<(), StoreError> {
    tx.exec("DELETE FROM feed WHERE at < ?1", [now - KEEP_MS])
        .map_err(internal)?;
    Ok(())
}

#[async_trait]
impl Feed for SqliteStore {
    async fn listen_feed(&self, tenant: &str, until: i64) -> Result<(), StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            tx.exec(
                "INSERT INTO feed_listen (tenant, until) VALUES (?1, ?2)
                 ON CONFLICT (tenant) DO UPDATE SET until = MAX(until, excluded.until)",
                params![tenant, until],
            )
            .map_err(internal)?;
            // The tenant's feed keeps its last FEED_KEEP entries.
            tx.exec(
                "DELETE FROM feed WHERE tenant = ?1 AND seq <= (
                     SELECT seq FROM feed WHERE tenant = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                params![tenant, FEED_KEEP as i64],
            )
            .map_err(internal)?;
            Ok(())
        })
        .await
    }

    async fn feed(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<FeedPage, StoreError> {
        let tenant = tenant.to_owned();
        let after = match after {
            None => None,
            Some(a) => Some(
                a.parse::<i64>()
                    .map_err(|_| StoreError::NotFound(format!("feed cursor {a:?}")))?,
            ),
        };
        self.tx(move |tx, _| {
            let Some(after) = after else {
                // The feed's end: the last sequence number given out (kept by SQLite even
                // when its rows were deleted).
                let end: i64 = tx
                    .row(
                        "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'feed'), 0)",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(internal)?;
                return Ok(FeedPage {
                    entries: Vec::new(),
                    next: end.to_string(),
                });
            };
            let mut stmt = tx
                .prepare_cached(
                    "SELECT seq, run_id, function, status, attempt, at FROM feed
                     WHERE tenant = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![tenant, after, limit as i64], |r| {
                    let status: String = r.get(3)?;
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        status,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
                .map_err(internal)?;
            let mut entries = Vec::new();
            for row in rows {
                let (seq, run_id, function, status, attempt, at): (
                    i64,
                    String,
                    String,
                    String,
                    u32,
                    i64,
                ) = row.map_err(internal)?;
                entries.push(FeedEntry {
                    cursor: seq.to_string(),
                    run_id,
                    function,
                    status: status.parse().map_err(StoreError::Internal)?,
                    attempt,
                    at,
                });
            }
            let next = entries
                .last()
                .map_or_else(|| after.to_string(), |e| e.cursor.clone());
            Ok(FeedPage { entries, next })
        })
        .await
    }
}

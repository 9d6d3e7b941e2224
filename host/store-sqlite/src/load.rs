//! What is waiting and running, from the index of unended runs (`runs_active`): each
//! queue's depth (`queue_depths`) and each function's runs per status (`load`). Every
//! query repeats the index's condition word for word: SQLite uses a partial index only
//! for a query whose WHERE clause contains it.

use super::*;

pub(crate) const QUEUE_DEPTHS: &str =
    "SELECT queue, SUM(status = 'queued'), SUM(status = 'running') FROM runs
     WHERE tenant = ?1 AND status IN ('queued', 'running', 'sleeping', 'waiting')
     GROUP BY queue HAVING SUM(status IN ('queued', 'running')) > 0 ORDER BY queue";

pub(crate) const COUNTS: &str = "SELECT function, status, COUNT(*) FROM runs
     WHERE tenant = ?1 AND status IN ('queued', 'running', 'sleeping', 'waiting')
     GROUP BY function, status";

pub(crate) const OLDEST_QUEUED: &str = "SELECT MIN(created_at) FROM runs
     WHERE tenant = ?1 AND status IN ('queued', 'running', 'sleeping', 'waiting')
         AND status = 'queued'";

pub(crate) fn queue_depths(tx: &Connection, tenant: &str) -> Result<Vec<QueueDepth>, StoreError> {
    let mut stmt = tx.prepare_cached(QUEUE_DEPTHS).map_err(internal)?;
    let rows = stmt
        .query_map([tenant], |r| {
            Ok(QueueDepth {
                queue: r.get(0)?,
                queued: r.get::<_, i64>(1)? as u64,
                running: r.get::<_, i64>(2)? as u64,
            })
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

pub(crate) fn load(tx: &Connection, tenant: &str) -> Result<RunLoad, StoreError> {
    let mut stmt = tx.prepare_cached(COUNTS).map_err(internal)?;
    let rows = stmt
        .query_map([tenant], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .map_err(internal)?;
    let mut counts = Vec::new();
    for row in rows {
        let (function, status, n) = row.map_err(internal)?;
        let status: RunStatus = status.parse().map_err(StoreError::Internal)?;
        counts.push((function, status, n as u64));
    }
    let rank = |s: &RunStatus| ACTIVE_STATUSES.iter().position(|a| a == s);
    counts.sort_by(|a, b| a.0.cmp(&b.0).then(rank(&a.1).cmp(&rank(&b.1))));
    let oldest_queued_at = tx
        .row(OLDEST_QUEUED, [tenant], |r| r.get(0))
        .map_err(internal)?;
    Ok(RunLoad {
        counts,
        oldest_queued_at,
    })
}

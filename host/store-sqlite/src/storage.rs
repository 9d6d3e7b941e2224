//! Storage accounting on SQLite (see `wasq_core::storage`): the cost of each row, the
//! counters (`runs.stored_bytes`, `runs.log_bytes`, `tenant_usage.stored`) every
//! transition keeps in step with what it writes or deletes, and a recount from the rows
//! themselves for files written before the counters existed.

use rusqlite::{Connection, OptionalExtension, params};
use wasq_core::storage::{self, FittedLogs, RunLog};
use wasq_core::*;

use crate::cached::Cached;
use crate::{internal, tenant_quotas};

/// What each kind of row costs besides its payload: the row's other columns, SQLite's
/// record and b-tree cell overhead, and its entries in the table's indexes, as `dbstat`
/// counts the pages in use (page size less unused bytes). Measured with `cargo bench -p
/// wasq-bench --bench storage_cost`: N rows of each kind of known payload through the real
/// daemon, the growth of the tables and their indexes divided by N (within 1% for each
/// kind; `tests/tests/storage_usage.rs` checks a mixed workload within 10%):
/// - `run`: the row (~25 columns beside the payload, a 36-byte id) and its entries in the
///   primary-key index and the seven indexes over every run (by tenant, function, status, digest,
///   finish time, ...);
/// - `attempt`, `step`, `log_line`: a row keyed by its run's id, and the primary-key index
///   that repeats that id;
/// - `event`: a row and its primary-key index;
/// - `function`: a row with its settings, and its component's row.
pub(crate) const COST: CostModel = CostModel {
    run: 538,
    attempt: 118,
    step: 105,
    log_line: 113,
    event: 45,
    function: 670,
};

/// Bytes the tenant keeps now.
pub(crate) fn tenant_stored(tx: &Connection, tenant: &str) -> Result<u64, StoreError> {
    let n: Option<i64> = tx
        .row(
            "SELECT stored FROM tenant_usage WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    Ok(n.unwrap_or(0).max(0) as u64)
}

/// Adds `bytes` (negative: gives back) to the tenant's usage and, with `run`, to the run's
/// `stored_bytes` (or `log_bytes` with `logs`).
pub(crate) fn charge(
    tx: &Connection,
    tenant: &str,
    run: Option<&str>,
    bytes: i64,
) -> Result<(), StoreError> {
    charge_to(tx, tenant, run, bytes, "stored_bytes")
}

pub(crate) fn charge_logs(
    tx: &Connection,
    tenant: &str,
    run: &str,
    bytes: i64,
) -> Result<(), StoreError> {
    charge_to(tx, tenant, Some(run), bytes, "log_bytes")
}

fn charge_to(
    tx: &Connection,
    tenant: &str,
    run: Option<&str>,
    bytes: i64,
    column: &str,
) -> Result<(), StoreError> {
    if bytes == 0 {
        return Ok(());
    }
    tx.exec(
        "INSERT INTO tenant_usage (tenant, stored) VALUES (?1, MAX(?2, 0))
         ON CONFLICT (tenant) DO UPDATE SET stored = MAX(stored + ?2, 0)",
        params![tenant, bytes],
    )
    .map_err(internal)?;
    if let Some(run) = run {
        tx.exec(
            &format!("UPDATE runs SET {column} = MAX({column} + ?2, 0) WHERE id = ?1"),
            params![run, bytes],
        )
        .map_err(internal)?;
    }
    Ok(())
}

/// Refuses `adding` more bytes to the tenant over its `max_stored_bytes`.
pub(crate) fn check_tenant(tx: &Connection, tenant: &str, adding: u64) -> Result<(), StoreError> {
    let quotas = tenant_quotas(tx, tenant)?;
    storage::check_tenant_bytes(tenant, quotas.as_ref(), tenant_stored(tx, tenant)?, adding)
}

/// Refuses `adding` bytes (a step, an output) to run `id` over its `max_run_bytes`, or to
/// its tenant over `max_stored_bytes`.
pub(crate) fn check_run(
    tx: &Connection,
    tenant: &str,
    id: &str,
    adding: u64,
) -> Result<(), StoreError> {
    let used: i64 = tx
        .row("SELECT stored_bytes FROM runs WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .map_err(internal)?;
    check_run_keeping(tx, tenant, id, used.max(0) as u64, adding)
}

/// [`check_run`] for run `id` keeping `used` bytes (0: a run about to be created), with the
/// tenant's quotas read once.
pub(crate) fn check_run_keeping(
    tx: &Connection,
    tenant: &str,
    id: &str,
    used: u64,
    adding: u64,
) -> Result<(), StoreError> {
    let quotas = tenant_quotas(tx, tenant)?;
    storage::check_run_bytes(id, quotas.as_ref(), used, adding)?;
    storage::check_tenant_bytes(tenant, quotas.as_ref(), tenant_stored(tx, tenant)?, adding)
}

/// The part of `lines` the run's log budget and its tenant's room take, with the marker
/// line when lines are dropped for the first time; marks the run's log cut then.
pub(crate) fn fit_logs(
    tx: &Connection,
    tenant: &str,
    run: &str,
    lines: Vec<LogLine>,
) -> Result<FittedLogs, StoreError> {
    if lines.is_empty() {
        return Ok(FittedLogs::default());
    }
    let (bytes, cut): (i64, bool) = tx
        .row(
            "SELECT log_bytes, logs_cut FROM runs WHERE id = ?1",
            [run],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(internal)?;
    let quotas = tenant_quotas(tx, tenant)?;
    let log = RunLog {
        bytes: bytes.max(0) as u64,
        cut,
    };
    let fitted = storage::fit_logs(
        lines,
        log,
        quotas.as_ref(),
        tenant_stored(tx, tenant)?,
        &COST,
    );
    if fitted.cut_now {
        tx.exec("UPDATE runs SET logs_cut = 1 WHERE id = ?1", [run])
            .map_err(internal)?;
    }
    Ok(fitted)
}

/// Recomputes every run's counters and every tenant's usage from the rows: for a file
/// written before the counters existed (and by tests, to check the counters).
pub(crate) fn recount(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(&format!(
        "UPDATE runs SET
             stored_bytes = {run} + length(input) + length(CAST(trigger AS BLOB))
                 + length(CAST(settings AS BLOB))
                 + 2 * COALESCE(length(CAST(idempotency_key AS BLOB)), 0)
                 + COALESCE(length(CAST(flow_keys AS BLOB)), 0)
                 + COALESCE(length(CAST(trace AS BLOB)), 0)
                 + COALESCE(length(output), 0) + COALESCE(length(CAST(error AS BLOB)), 0)
                 + COALESCE(length(CAST(progress AS BLOB)), 0)
                 + COALESCE(length(CAST(wait AS BLOB)), 0)
                 + (SELECT COUNT(*) * {attempt} + COALESCE(SUM(length(CAST(error AS BLOB))), 0)
                    FROM attempts a WHERE a.run_id = runs.id)
                 + (SELECT COUNT(*) * {step}
                        + COALESCE(SUM(2 * length(CAST(name AS BLOB)) + length(output)), 0)
                    FROM steps s WHERE s.run_id = runs.id),
             log_bytes = (SELECT COUNT(*) * {log} + COALESCE(SUM(length(CAST(message AS BLOB))), 0)
                          FROM logs l WHERE l.run_id = runs.id);
         UPDATE tenant_usage SET stored = 0;
         INSERT INTO tenant_usage (tenant, stored)
             SELECT tenant, SUM(bytes) FROM (
                 SELECT tenant, SUM(stored_bytes + log_bytes) AS bytes FROM runs GROUP BY tenant
                 UNION ALL
                 SELECT tenant, SUM({event} + {event_payload}) FROM events GROUP BY tenant
                 UNION ALL
                 SELECT tenant, SUM({function} + size_bytes) FROM functions GROUP BY tenant)
             GROUP BY tenant
         ON CONFLICT (tenant) DO UPDATE SET stored = excluded.stored;",
        run = COST.run,
        attempt = COST.attempt,
        step = COST.step,
        log = COST.log_line,
        event = COST.event,
        function = COST.function,
        event_payload = EVENT_PAYLOAD,
    ))
    .map_err(internal)
}

/// What an event row keeps whole, in bytes, as `CostModel::event` counts it (the id
/// twice: the row and its primary-key index).
const EVENT_PAYLOAD: &str =
    "2 * length(CAST(id AS BLOB)) + length(CAST(name AS BLOB)) + length(CAST(data AS BLOB))";

/// Forgets events past their dedup window (an id is only remembered that long), giving
/// back what they cost; at most `limit` per call.
pub(crate) fn forget_old_events(
    tx: &Connection,
    before: i64,
    limit: usize,
) -> Result<usize, StoreError> {
    let old: Vec<(String, String, i64)> = {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT tenant, id, {EVENT_PAYLOAD} FROM events WHERE created_at < ?1 LIMIT ?2"
            ))
            .map_err(internal)?;
        let rows = stmt
            .query_map(params![before, limit as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (tenant, id, payload) in &old {
        tx.exec(
            "DELETE FROM events WHERE tenant = ?1 AND id = ?2",
            params![tenant, id],
        )
        .map_err(internal)?;
        charge(tx, tenant, None, -(COST.event as i64 + payload))?;
    }
    Ok(old.len())
}

/// Deletes one event record, giving back what it cost.
pub(crate) fn forget_event(tx: &Connection, tenant: &str, id: &str) -> Result<(), StoreError> {
    let payload: Option<i64> = tx
        .row(
            &format!("DELETE FROM events WHERE tenant = ?1 AND id = ?2 RETURNING {EVENT_PAYLOAD}"),
            params![tenant, id],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    if let Some(payload) = payload {
        charge(tx, tenant, None, -(COST.event as i64 + payload))?;
    }
    Ok(())
}

/// Deletes components no function and no run refers to any more (runs pin the digest
/// they were created with, so a component stays while any of its runs does).
pub(crate) fn collect_components(tx: &Connection) -> Result<usize, StoreError> {
    tx.exec(
        "DELETE FROM components WHERE
             NOT EXISTS (SELECT 1 FROM functions f WHERE f.digest = components.digest)
             AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.digest = components.digest)",
        [],
    )
    .map_err(internal)
}

/// Deletes ended runs past their retention with everything they recorded, giving back
/// what they were charged ([`Store::purge`]).
pub(crate) fn purge(tx: &Connection, now: i64, req: PurgeRequest) -> Result<usize, StoreError> {
    let ids: Vec<String> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT id FROM runs
                 WHERE (status IN ('succeeded', 'skipped') AND finished_at < ?1)
                    OR (status IN ('failed', 'cancelled') AND finished_at < ?2)
                 LIMIT ?3",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(
                params![req.succeeded_before, req.failed_before, req.limit as i64],
                |r| r.get(0),
            )
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for id in &ids {
        let (tenant, bytes): (String, i64) = tx
            .row(
                "SELECT tenant, stored_bytes + log_bytes FROM runs WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(internal)?;
        for table in ["steps", "logs", "attempts", "deliveries"] {
            tx.exec(&format!("DELETE FROM {table} WHERE run_id = ?1"), [id])
                .map_err(internal)?;
        }
        tx.exec("DELETE FROM runs WHERE id = ?1", [id])
            .map_err(internal)?;
        charge(tx, &tenant, None, -bytes)?;
    }
    crate::feed::forget_old(tx, now)?;
    // Event ids are only remembered for their dedup window, and components only
    // while a function or a run refers to them.
    let events = forget_old_events(tx, now - IDEMPOTENCY_WINDOW_MS, req.limit)?;
    if !ids.is_empty() || events > 0 {
        collect_components(tx)?;
    }
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use wasq_core::*;

    use crate::SqliteStore;

    const T: &str = DEFAULT_TENANT;

    fn counters(store: &SqliteStore) -> (Vec<(String, i64, i64)>, i64) {
        let conn = store.conn.lock().unwrap();
        let mut stmt = conn
            .prepare("SELECT id, stored_bytes, log_bytes FROM runs ORDER BY id")
            .unwrap();
        let runs = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let stored = conn
            .query_row(
                "SELECT stored FROM tenant_usage WHERE tenant = ?1",
                [T],
                |r| r.get(0),
            )
            .unwrap();
        (runs, stored)
    }

    async fn claim(store: &SqliteStore) -> Claimed {
        let mut c = store
            .claim(ClaimRequest {
                worker: "wörker".into(),
                limit: 1,
                lease_ms: 30_000,
                queues: Vec::new(),
            })
            .await
            .unwrap();
        assert_eq!(c.len(), 1);
        c.remove(0)
    }

    fn line(message: &str) -> LogLine {
        LogLine {
            attempt: 1,
            at: 1,
            level: LogLevel::Info,
            source: LogSource::Guest,
            message: message.into(),
        }
    }

    /// The counters every transition keeps (including the trigger on a run's changing
    /// columns) equal a recount from the rows, with texts that are not ASCII (bytes, not
    /// characters, are counted).
    #[tokio::test]
    async fn counters_match_a_recount_from_the_rows() {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = SqliteStore::open_in_memory(Arc::new(clock.clone())).unwrap();
        let mut settings = FunctionSettings::default();
        settings.retry.max_attempts = 2;
        store
            .deploy(DeployRequest {
                tenant: T.into(),
                name: "f".into(),
                digest: "d".into(),
                component: vec![7; 1000],
                settings,
                events: vec!["gö".into()],
                schedule: None,
            })
            .await
            .unwrap();
        let enqueue = |input: serde_json::Value, key: Option<&str>| EnqueueRequest {
            tenant: T.into(),
            function: "f".into(),
            input: input.to_string().into_bytes(),
            trigger: "api".into(),
            idempotency_key: key.map(Into::into),
            ..EnqueueRequest::default()
        };
        // Fails once with a long error, then succeeds (the run's error is cleared).
        store
            .enqueue(enqueue(json!({ "ü": "x".repeat(300) }), Some("schlüssel")))
            .await
            .unwrap();
        let c = claim(&store).await;
        store
            .record(
                &c.lease,
                Record::Step {
                    name: "schritt-ä".into(),
                    occurrence: 0,
                    output: b"\"\xc3\xa4\"".to_vec(),
                    logs: vec![line("zeile ä")],
                },
            )
            .await
            .unwrap();
        store
            .record(
                &c.lease,
                Record::Progress(Progress {
                    percent: 50,
                    message: Some("hälfte".into()),
                }),
            )
            .await
            .unwrap();
        let error = RunError::new(ErrorReason::Retryable, "fehlgeschlagen ".repeat(40));
        store
            .finish(
                &c.lease,
                Outcome::Failed {
                    error,
                    retry_in_ms: Some(0),
                    fuel_used: None,
                },
            )
            .await
            .unwrap();
        let c = claim(&store).await;
        store
            .finish(
                &c.lease,
                Outcome::Succeeded {
                    output: b"{\"ok\":\"j\xc3\xa4\"}".to_vec(),
                    fuel_used: None,
                },
            )
            .await
            .unwrap();
        // Fails for good, is retried by hand (its settings change), then waits for an
        // event that resumes it.
        let run = store.enqueue(enqueue(json!({}), None)).await.unwrap().run;
        let c = claim(&store).await;
        let error = RunError::new(ErrorReason::Fatal, "kaputt ö");
        store
            .finish(
                &c.lease,
                Outcome::Failed {
                    error,
                    retry_in_ms: None,
                    fuel_used: None,
                },
            )
            .await
            .unwrap();
        store
            .retry(RunAction::retry(T, &run.id, "key:test"))
            .await
            .unwrap();
        let c = claim(&store).await;
        let wait = Wait {
            step: "warte".into(),
            occurrence: 0,
            on: WaitOn::Event {
                name: "bezahlt".into(),
                filter: None,
            },
            until: None,
        };
        store
            .finish(
                &c.lease,
                Outcome::Waiting {
                    wait,
                    fuel_used: None,
                },
            )
            .await
            .unwrap();
        for (name, id) in [("bezahlt", "ereignis-ä"), ("gö", "zweites-ö")] {
            store
                .send_event(EventRequest {
                    tenant: T.into(),
                    name: name.into(),
                    data: json!({ "größe": 1 }),
                    id: Some(id.into()),
                    trace: None,
                })
                .await
                .unwrap();
        }

        let kept = counters(&store);
        assert!(kept.1 > 0 && kept.0.len() == 3, "{kept:?}");
        super::recount(&store.conn.lock().unwrap()).unwrap();
        assert_eq!(counters(&store), kept, "the counters against a recount");
    }
}

//! Reading rows: runs, functions and steps from their columns, and the error mapping of
//! SQLite's failures.

use super::*;

pub(crate) const RUN_COLUMNS: &str = "id, tenant, function, digest, settings, status, input, output, error, \
     attempt, trigger, progress, created_at, updated_at, due_at, finished_at, idempotency_key, \
     parent, wait, priority, flow_keys, stored_bytes, log_bytes, trace";

/// A page of a tenant's runs, newest first (`?1` tenant, `?2` function, `?3` status, `?4`
/// limit, `?5` parent, `?6` before this id, `?7` created since; each but the tenant and
/// limit NULL for any). A status filter is its own statement, `status = ?3` rather than
/// `?3 IS NULL OR status = ?3`, so that it seeks `runs_by_status` instead of walking every
/// run of the tenant to find the few failed ones.
pub(crate) fn list_runs(by_status: bool) -> String {
    let status = if by_status {
        "status = ?3"
    } else {
        "?3 IS NULL"
    };
    format!(
        "SELECT {RUN_COLUMNS} FROM runs
         WHERE tenant = ?1 AND {status} AND (?2 IS NULL OR function = ?2)
             AND (?5 IS NULL OR parent = ?5)
             AND (?6 IS NULL OR id < ?6) AND (?7 IS NULL OR created_at >= ?7)
         ORDER BY created_at DESC, id DESC LIMIT ?4"
    )
}

pub(crate) fn internal(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(ref f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
            tracing::error!(error = %e, "the disk of the embedded store is full");
            StoreError::Full(format!("the disk of the database is full: {e}"))
        }
        rusqlite::Error::SqliteFailure(ref f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            StoreError::Unavailable(e.to_string())
        }
        e => StoreError::Internal(e.to_string()),
    }
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

pub(crate) fn from_json<T: serde::de::DeserializeOwned>(s: &str) -> rusqlite::Result<T> {
    serde_json::from_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

pub(crate) fn opt_json<T: serde::de::DeserializeOwned>(
    s: Option<String>,
) -> rusqlite::Result<Option<T>> {
    s.as_deref().map(from_json).transpose()
}

pub(crate) fn run_from_row(row: &Row<'_>) -> rusqlite::Result<Run> {
    let status: String = row.get(5)?;
    Ok(Run {
        id: row.get(0)?,
        tenant: row.get(1)?,
        function: row.get(2)?,
        digest: row.get(3)?,
        settings: from_json(&row.get::<_, String>(4)?)?,
        status: status.parse().map_err(|e: String| {
            rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, e.into())
        })?,
        input: row.get(6)?,
        output: row.get(7)?,
        error: opt_json(row.get(8)?)?,
        attempt: row.get(9)?,
        trigger: row.get(10)?,
        progress: opt_json(row.get(11)?)?,
        created_at: row.get(12)?,
        updated_at: row.get(13)?,
        due_at: row.get(14)?,
        finished_at: row.get(15)?,
        idempotency_key: row.get(16)?,
        parent: row.get(17)?,
        wait: opt_json(row.get(18)?)?,
        priority: row.get(19)?,
        keys: opt_json(row.get(20)?)?.unwrap_or_default(),
        stored_bytes: row.get::<_, i64>(21)?.max(0) as u64,
        log_bytes: row.get::<_, i64>(22)?.max(0) as u64,
        // Written only as a parsed TraceParent; anything else reads as none.
        trace: row
            .get::<_, Option<String>>(23)?
            .and_then(|t| TraceParent::parse(&t).ok()),
    })
}

pub(crate) fn function_from_row(row: &Row<'_>) -> rusqlite::Result<Function> {
    Ok(Function {
        tenant: row.get(0)?,
        name: row.get(1)?,
        digest: row.get(2)?,
        size_bytes: row.get(3)?,
        settings: from_json(&row.get::<_, String>(4)?)?,
        created_at: row.get(5)?,
        updated_at: row.get(6)?,
        events: from_json(&row.get::<_, String>(7)?)?,
        schedule: opt_json(row.get(8)?)?,
    })
}

pub(crate) const FUNCTION_COLUMNS: &str =
    "tenant, name, digest, size_bytes, settings, created_at, updated_at, events, schedule";

pub(crate) fn load_function(
    tx: &Connection,
    tenant: &str,
    name: &str,
) -> Result<Option<Function>, StoreError> {
    tx.row(
        &format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE tenant = ?1 AND name = ?2"),
        params![tenant, name],
        function_from_row,
    )
    .optional()
    .map_err(internal)
}

pub(crate) fn load_run(tx: &Connection, id: &str) -> Result<Option<Run>, StoreError> {
    tx.row(
        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
        [id],
        run_from_row,
    )
    .optional()
    .map_err(internal)
}

/// A run's steps for replay: outputs inline while they fit in
/// [`wasq_core::storage::INLINE_REPLAY_BYTES`], the rest by reference (read when the replay
/// reaches them), so a claim never reads a run's big steps at once.
pub(crate) fn replay_steps(tx: &Connection, id: &str) -> Result<Vec<ReplayStep>, StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT name, occurrence, length(output) FROM steps WHERE run_id = ?1 ORDER BY rowid",
        )
        .map_err(internal)?;
    let index: Vec<(String, u32, i64)> = stmt
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(internal)?
        .collect::<Result<_, _>>()
        .map_err(internal)?;
    let mut budget = wasq_core::storage::INLINE_REPLAY_BYTES as i64;
    let mut steps = Vec::with_capacity(index.len());
    for (name, occurrence, size) in index {
        let output = if size <= budget {
            budget -= size;
            Some(step_output(tx, id, &name, occurrence)?.unwrap_or_default())
        } else {
            None
        };
        steps.push(ReplayStep {
            name,
            occurrence,
            output,
        });
    }
    Ok(steps)
}

pub(crate) fn step_output(
    tx: &Connection,
    id: &str,
    name: &str,
    occurrence: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    tx.prepare_cached(
        "SELECT output FROM steps WHERE run_id = ?1 AND name = ?2 AND occurrence = ?3",
    )
    .map_err(internal)?
    .query_row(params![id, name, occurrence], |r| r.get(0))
    .optional()
    .map_err(internal)
}

pub(crate) const STEP_INFO: &str = "SELECT name, occurrence, attempt, completed_at, length(output) FROM steps WHERE run_id = ?1 \
     ORDER BY rowid LIMIT ?2 OFFSET ?3";

pub(crate) fn step_infos(
    tx: &Connection,
    id: &str,
    skip: usize,
    limit: usize,
) -> Result<Vec<StepInfo>, StoreError> {
    let mut stmt = tx.prepare_cached(STEP_INFO).map_err(internal)?;
    let rows = stmt
        .query_map(params![id, limit as i64, skip as i64], |r| {
            Ok(StepInfo {
                name: r.get(0)?,
                occurrence: r.get(1)?,
                attempt: r.get(2)?,
                completed_at: r.get(3)?,
                output_bytes: r.get::<_, i64>(4)?.max(0) as u64,
            })
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// A run of `tenant`, or NotFound: other tenants' runs do not exist for the caller.
pub(crate) fn tenant_run(tx: &Connection, tenant: &str, id: &str) -> Result<Run, StoreError> {
    load_run(tx, id)?
        .filter(|r| r.tenant == tenant)
        .ok_or_else(|| StoreError::NotFound(format!("run {id:?}")))
}

/// A run of `tenant` with its bounded history ([`Store::run`]).
pub(crate) fn run_detail(
    tx: &Connection,
    tenant: &str,
    id: &str,
) -> Result<Option<RunDetail>, StoreError> {
    let Some(run) = load_run(tx, id)?.filter(|r| r.tenant == tenant) else {
        return Ok(None);
    };
    let count = |table: &str| -> Result<u64, StoreError> {
        tx.row(
            &format!("SELECT COUNT(*) FROM {table} WHERE run_id = ?1"),
            [&id],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n.max(0) as u64)
        .map_err(internal)
    };
    let attempts_total = count("attempts")?;
    let mut attempts: Vec<Attempt> = {
        // The latest executions, oldest first.
        let mut stmt = tx
            .prepare_cached(
                "SELECT number, worker, started_at, finished_at, error, fuel_used, suspended_until
                 FROM attempts WHERE run_id = ?1 ORDER BY seq DESC LIMIT ?2",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(params![id, storage_limits::DETAIL_ATTEMPTS as i64], |r| {
                Ok(Attempt {
                    number: r.get(0)?,
                    worker: r.get(1)?,
                    started_at: r.get(2)?,
                    finished_at: r.get(3)?,
                    error: opt_json(r.get(4)?)?,
                    fuel_used: r.get(5)?,
                    suspended_until: r.get(6)?,
                })
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    attempts.reverse();
    let steps = step_infos(tx, id, 0, storage_limits::DETAIL_STEPS)?;
    Ok(Some(RunDetail {
        run,
        attempts,
        attempts_total,
        steps,
        steps_total: count("steps")?,
    }))
}

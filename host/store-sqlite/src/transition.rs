//! Writing what core decided: a lifecycle transition (`apply`), an attempt's history, its
//! log lines and steps, each under the lease that `check_lease` verified.

use super::*;

/// A leased run with the bookkeeping columns that ending its attempt needs.
pub(crate) struct Leased {
    pub(crate) run: Run,
    /// The current execution woke a sleeping or waiting run (see `claim`).
    pub(crate) resumed: bool,
    pub(crate) cancel_requested: bool,
}

/// Checks the fence in one read: the run is running under exactly this lease.
pub(crate) fn check_lease(tx: &Connection, lease: &Lease) -> Result<Leased, StoreError> {
    let (leased, token) = tx
        .row(
            &format!("SELECT {RUN_COLUMNS}, lease_token, resumed, cancel_requested FROM runs WHERE id = ?1"),
            [&lease.run_id],
            |r| {
                let leased = Leased {
                    run: run_from_row(r)?,
                    resumed: r.get("resumed")?,
                    cancel_requested: r.get("cancel_requested")?,
                };
                Ok((leased, r.get::<_, u64>("lease_token")?))
            },
        )
        .optional()
        .map_err(internal)?
        .ok_or_else(|| StoreError::NotFound(format!("run {}", lease.run_id)))?;
    if leased.run.status != RunStatus::Running || token != lease.token {
        return Err(StoreError::LeaseLost(lease.run_id.clone()));
    }
    Ok(leased)
}

/// Writes a lifecycle transition of `run` (as read in this transaction): its history,
/// its tenant's usage and its row; then, if it ended, resumes the runs waiting for it.
/// The transition decided everything; this only stores it.
pub(crate) fn apply(
    tx: &Connection,
    run: &Run,
    t: &Transition,
    now: i64,
) -> Result<(), StoreError> {
    match &t.execution {
        Some(Execution::Close {
            error,
            fuel_used,
            suspended_until,
        }) => close_execution(tx, run, now, error.as_ref(), *fuel_used, *suspended_until)?,
        Some(Execution::Drop) => {
            tx.exec(
                "DELETE FROM attempts
                 WHERE run_id = ?1 AND seq = (SELECT MAX(seq) FROM attempts WHERE run_id = ?1)",
                [&run.id],
            )
            .map_err(internal)?;
            storage::charge(
                tx,
                &run.tenant,
                Some(&run.id),
                -(storage::COST.attempt() as i64),
            )?;
        }
        None => {}
    }
    if t.usage.executions > 0 {
        directory::add_usage(tx, &run.tenant, t.usage.fuel)?;
    }
    let (set_error, error) = match &t.error {
        Change::Keep => (false, None),
        Change::Set(e) => (true, Some(to_json(e)?)),
        Change::Clear => (true, None),
    };
    tx.exec(
        "UPDATE runs SET status = ?2, error = CASE WHEN ?3 THEN ?4 ELSE error END,
             output = COALESCE(?5, output), due_at = COALESCE(?6, due_at), finished_at = ?7,
             attempt = attempt - ?8,
             cancel_requested = CASE WHEN ?9 THEN 0 ELSE cancel_requested END,
             updated_at = ?10, lease_expires_at = NULL, worker = NULL
         WHERE id = ?1",
        params![
            run.id,
            t.status.as_str(),
            set_error,
            error,
            t.output,
            t.due_at,
            t.finished_at,
            i64::from(t.give_back_attempt),
            t.clear_cancel,
            now
        ],
    )
    .map_err(internal)?;
    if let Some(wait) = &t.wait {
        let (event, target) = match &wait.on {
            WaitOn::Event { name, .. } => (Some(name.as_str()), None),
            WaitOn::Run { id } => (None, Some(id.as_str())),
        };
        tx.exec(
            "UPDATE runs SET wait = ?2, wait_event = ?3, wait_run = ?4 WHERE id = ?1",
            params![run.id, to_json(wait)?, event, target],
        )
        .map_err(internal)?;
    }
    if let Some(resolution) = &t.resolution {
        resolve_waiters_of(tx, &run.id, resolution, now)?;
    }
    Ok(())
}

/// Ends the run's latest execution; its error (bounded by whoever made it) is charged to
/// the run without a quota check, so a run over its quota can still fail.
pub(crate) fn close_execution(
    tx: &Connection,
    run: &Run,
    now: i64,
    error: Option<&RunError>,
    fuel_used: Option<u64>,
    suspended_until: Option<i64>,
) -> Result<(), StoreError> {
    let error = error.map(to_json).transpose()?;
    tx.exec(
        "UPDATE attempts SET finished_at = ?2, error = ?3, fuel_used = ?4, suspended_until = ?5
         WHERE run_id = ?1 AND seq = (SELECT MAX(seq) FROM attempts WHERE run_id = ?1)",
        params![run.id, now, error, fuel_used, suspended_until],
    )
    .map_err(internal)?;
    if let Some(e) = &error {
        storage::charge(tx, &run.tenant, Some(&run.id), e.len() as i64)?;
    }
    Ok(())
}

/// Appends log lines after the run's last one, as many as its log budget and its
/// tenant's storage quota take (then one marker line; the rest are dropped).
pub(crate) fn append_logs(
    tx: &Connection,
    tenant: &str,
    run_id: &str,
    lines: Vec<LogLine>,
) -> Result<(), StoreError> {
    let fitted = storage::fit_logs(tx, tenant, run_id, lines)?;
    let lines = fitted.lines;
    if lines.is_empty() {
        return Ok(());
    }
    storage::charge_logs(tx, tenant, run_id, fitted.bytes as i64)?;
    let first: i64 = tx
        .row(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM logs WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )
        .map_err(internal)?;
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO logs (run_id, seq, attempt, at, level, source, message)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(internal)?;
    for (seq, l) in (first..).zip(lines) {
        stmt.execute(params![
            run_id,
            seq,
            l.attempt,
            l.at,
            l.level.as_str(),
            l.source.as_str(),
            l.message
        ])
        .map_err(internal)?;
    }
    Ok(())
}

/// Stores a step output and charges it to the run and its tenant. First write wins: a
/// step's output never changes once stored (nor is it charged twice).
pub(crate) fn write_step(
    tx: &Connection,
    run: &Run,
    name: &str,
    occurrence: u32,
    output: &[u8],
    now: i64,
) -> Result<(), StoreError> {
    let stored = tx
        .exec(
            "INSERT INTO steps (run_id, name, occurrence, output, attempt, completed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            params![run.id, name, occurrence, output, run.attempt, now],
        )
        .map_err(internal)?;
    if stored > 0 {
        let cost = storage::COST.step(name.len(), output.len());
        storage::charge(tx, &run.tenant, Some(&run.id), cost as i64)?;
    }
    Ok(())
}

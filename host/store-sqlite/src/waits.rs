//! Waits: a waiting run resumes when its event arrives, the run it waits on ends
//! (with the resolution core computed) or its time is up.

use super::*;

/// Ends a wait: the resolution becomes the waiting step's output, and the run is due now
/// as a resume of its current attempt (the replay reads the step and goes on).
pub(crate) fn resolve_wait(
    tx: &Connection,
    run: &Run,
    wait: &Wait,
    resolution: &Resolution,
    now: i64,
) -> Result<(), StoreError> {
    // Always stored, even past a quota: the waiting run must be able to go on and end.
    write_step(
        tx,
        run,
        &wait.step,
        wait.occurrence,
        &resolution.to_bytes(),
        now,
    )?;
    tx.exec(
        "UPDATE runs SET status = 'sleeping', due_at = ?2, updated_at = ?2,
             wait = NULL, wait_event = NULL, wait_run = NULL
         WHERE id = ?1",
        params![run.id, now],
    )
    .map_err(internal)?;
    Ok(())
}

pub(crate) fn waiting_runs(
    tx: &Connection,
    condition: &str,
    param: &dyn rusqlite::ToSql,
) -> Result<Vec<Run>, StoreError> {
    let mut stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'waiting' AND {condition}"
        ))
        .map_err(internal)?;
    let rows = stmt.query_map([param], run_from_row).map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Runs waiting for events named `name`, after rowid `after`, a batch at a time (in rowid
/// order, which the index keeps: no sort however many wait).
pub(crate) fn waiting_for_event(
    tx: &Connection,
    tenant: &str,
    name: &str,
    after: i64,
) -> Result<Vec<(i64, Run)>, StoreError> {
    const BATCH: i64 = 500;
    let rowids: Vec<i64> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT rowid FROM runs INDEXED BY runs_waiting_event
                 WHERE status = 'waiting' AND tenant = ?1 AND wait_event = ?2 AND rowid > ?3
                 ORDER BY rowid LIMIT ?4",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(params![tenant, name, after, BATCH], |r| r.get(0))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    let mut stmt = tx
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE rowid = ?1"))
        .map_err(internal)?;
    rowids
        .into_iter()
        .map(|rowid| {
            let run = stmt.query_row([rowid], run_from_row).map_err(internal)?;
            Ok((rowid, run))
        })
        .collect()
}

/// After run `id` ended: the runs waiting for it (`call`, `join`) resume with its
/// resolution.
pub(crate) fn resolve_waiters_of(
    tx: &Connection,
    id: &str,
    resolution: &Resolution,
    now: i64,
) -> Result<(), StoreError> {
    for waiter in waiting_runs(tx, "wait_run = ?1", &id)? {
        if let Some(wait) = &waiter.wait {
            resolve_wait(tx, &waiter, wait, resolution, now)?;
        }
    }
    Ok(())
}

/// Waits whose time is up resolve as timed out.
pub(crate) fn resolve_timeouts(tx: &Connection, now: i64) -> Result<(), StoreError> {
    for run in waiting_runs(tx, "due_at <= ?1", &now)? {
        if let Some(wait) = &run.wait {
            resolve_wait(tx, &run, wait, &Resolution::TimedOut, now)?;
        }
    }
    Ok(())
}

/// [`Store::send_event`] in one transaction: records the event, starts a run of every
/// subscribed function (all counted against `max_queued` at once) and resumes every run
/// waiting for a matching event.
pub(crate) fn send_event(
    tx: &Connection,
    now: i64,
    req: EventRequest,
) -> Result<EventSent, StoreError> {
    let id = req
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let seen: Option<i64> = tx
        .row(
            "SELECT created_at FROM events WHERE tenant = ?1 AND id = ?2",
            params![req.tenant, id],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    if seen.is_some_and(|t| t > now - IDEMPOTENCY_WINDOW_MS) {
        return Ok(EventSent {
            id,
            accepted: false,
            ..EventSent::default()
        });
    }
    let data = req.data.to_string();
    let cost = storage::COST.event(id.len(), req.name.len(), data.len());
    storage::check_tenant(tx, &req.tenant, cost)?;
    if seen.is_some() {
        // Past its window the id is free again: the old record is replaced.
        storage::forget_event(tx, &req.tenant, &id)?;
    }
    tx.exec(
        "INSERT INTO events (tenant, id, name, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![req.tenant, id, req.name, data, now],
    )
    .map_err(internal)?;
    storage::charge(tx, &req.tenant, None, cost as i64)?;
    let mut sent = EventSent {
        id: id.clone(),
        accepted: true,
        ..EventSent::default()
    };
    let subscribers: Vec<String> = {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {FUNCTION_COLUMNS} FROM functions WHERE tenant = ?1 ORDER BY name"
            ))
            .map_err(internal)?;
        let rows = stmt
            .query_map([&req.tenant], function_from_row)
            .map_err(internal)?;
        let functions: Vec<Function> = rows.collect::<Result<_, _>>().map_err(internal)?;
        functions
            .into_iter()
            .filter(|f| f.events.contains(&req.name))
            .map(|f| f.name)
            .collect()
    };
    check_queue_quota(tx, &req.tenant, Admission::Event, subscribers.len() as u64)?;
    for function in subscribers {
        let started = insert_run(
            tx,
            now,
            EnqueueRequest {
                tenant: req.tenant.clone(),
                function,
                input: data.clone().into_bytes(),
                trigger: format!("event:{}", req.name),
                due_at: None,
                // One run per function per event, however often it is delivered.
                idempotency_key: Some(format!("event:{id}")),
                retry: None,
                parent: None,
                priority: None,
                trace: req.trace.clone(),
            },
            None,
        )?;
        sent.started.push(started.run.id);
    }
    // Only the runs waiting for this name (an index seek), a batch at a time, so
    // a tenant with many waiters on other names costs nothing here, and many on
    // this name never sit in memory at once.
    let mut after = 0;
    loop {
        let batch = waiting_for_event(tx, &req.tenant, &req.name, after)?;
        let Some((last, _)) = batch.last() else { break };
        after = *last;
        for (_, waiter) in &batch {
            let Some(wait) = &waiter.wait else { continue };
            let WaitOn::Event { name, filter } = &wait.on else {
                continue;
            };
            if *name == req.name && event_matches(filter.as_deref(), &req.data) {
                resolve_wait(
                    tx,
                    waiter,
                    wait,
                    &Resolution::Event {
                        data: req.data.clone(),
                    },
                    now,
                )?;
                sent.resumed.push(waiter.id.clone());
            }
        }
    }
    Ok(sent)
}

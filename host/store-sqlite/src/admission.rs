//! Admission of new runs: idempotency keys, the function's rate limit and debounce
//! (`wasq_core::flow`), the tenant's `max_queued` (`wasq_core::lifecycle::admit`) and
//! storage quota, then the insert.

use super::*;

/// [`Queue::enqueue_batch`]: the whole batch against `max_queued` first (each run counts,
/// `lifecycle::admit_batch`), then each run as [`insert_run`] creates it. The caller's
/// savepoint makes it all or nothing.
pub(crate) fn insert_batch(
    tx: &Connection,
    now: i64,
    reqs: Vec<EnqueueRequest>,
) -> Result<Vec<Enqueued>, StoreError> {
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    if load_function(tx, &first.tenant, &first.function)?.is_none() {
        return Err(StoreError::NotFound(format!(
            "function {:?}",
            first.function
        )));
    }
    if let Some(quotas) = tenant_quotas(tx, &first.tenant)? {
        lifecycle::admit_batch(
            &first.tenant,
            queued_runs(tx, &first.tenant)?,
            reqs.len(),
            Some(quotas.max_queued),
        )?;
    }
    reqs.into_iter()
        .map(|req| insert_run(tx, now, req, None))
        .collect()
}

/// Creates a run (or finds the one with the same idempotency key) inside a transaction,
/// applying the function's rate limit and debounce and the tenant's `max_queued` (see
/// [`Store::enqueue`]).
///
/// `admission`: the `max_queued` it applies; `None` when the caller checked it for a
/// batch (an event's subscribers).
pub(crate) fn insert_run(
    tx: &Connection,
    now: i64,
    req: EnqueueRequest,
    admission: Option<Admission>,
) -> Result<Enqueued, StoreError> {
    let id = wasq_core::ids::new_run_id(now);
    let function = load_function(tx, &req.tenant, &req.function)?
        .ok_or_else(|| StoreError::NotFound(format!("function {:?}", req.function)))?;
    if let Some(key) = &req.idempotency_key {
        let existing: Option<(String, i64)> = tx
            .row(
                "SELECT id, created_at FROM runs
                 WHERE tenant = ?1 AND function = ?2 AND idempotency_key = ?3",
                params![req.tenant, req.function, key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(internal)?;
        match existing {
            Some((id, created)) if created > now - IDEMPOTENCY_WINDOW_MS => {
                let run = load_run(tx, &id)?
                    .ok_or_else(|| StoreError::Internal("keyed run vanished".into()))?;
                return Ok(Enqueued {
                    run,
                    created: false,
                });
            }
            // Past its window the key is free again; the old run keeps its history.
            Some((id, _)) => {
                tx.exec("UPDATE runs SET idempotency_key = NULL WHERE id = ?1", [id])
                    .map_err(internal)?;
            }
            None => {}
        }
    }
    let plan = function
        .settings
        .flow
        .plan(&req.function, &req.input, req.priority);
    let settings = req.run_settings(&function.settings);
    let new = NewRun {
        id: &id,
        req: &req,
        digest: &function.digest,
        settings: &settings,
        plan: &plan,
    };
    if let Some(g) = &plan.rate_limit
        && window_full(tx, &req.tenant, g, now)?.is_some()
    {
        new.insert(tx, now, now, Some(&lifecycle::rate_limited_error(&plan)))?;
        return created(tx, &id);
    }
    // The pending run of the debounce key, which this one replaces: of the key's queued
    // runs (the index holds those), the one core says a newer run replaces.
    let replaced: Option<String> = match &plan.debounce {
        Some(g) => {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT id, attempt FROM runs WHERE tenant = ?1 AND dgate = ?2
                         AND status = 'queued'",
                )
                .map_err(internal)?;
            let mut rows = stmt
                .query_map(params![req.tenant, g.id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?))
                })
                .map_err(internal)?;
            rows.find_map(|row| match row {
                Ok((id, attempt)) => {
                    lifecycle::debounce_replaces(RunStatus::Queued, attempt).then_some(Ok(id))
                }
                Err(e) => Some(Err(internal(e))),
            })
            .transpose()?
        }
        None => None,
    };
    if let Some(admission) = admission {
        check_queue_quota(tx, &req.tenant, admission, u64::from(replaced.is_none()))?;
    }
    if let Some(old) = replaced {
        let old = load_run(tx, &old)?
            .ok_or_else(|| StoreError::Internal("debounced run vanished".into()))?;
        let t = lifecycle::skip(&old.id, lifecycle::debounced_error(&id), now);
        apply(tx, &old, &t, now)?;
    }
    let mut due = req.start_at(now);
    if let Some(g) = &plan.debounce {
        due = due.max(now + g.period_ms as i64);
    }
    new.insert(tx, now, due, None)?;
    if let Some(g) = &plan.rate_limit {
        log_window(tx, &req.tenant, g, now)?;
    }
    created(tx, &id)
}

pub(crate) fn created(tx: &Connection, id: &str) -> Result<Enqueued, StoreError> {
    let run =
        load_run(tx, id)?.ok_or_else(|| StoreError::Internal("inserted run vanished".into()))?;
    Ok(Enqueued { run, created: true })
}

/// A run about to be inserted.
pub(crate) struct NewRun<'a> {
    id: &'a str,
    req: &'a EnqueueRequest,
    digest: &'a str,
    settings: &'a FunctionSettings,
    plan: &'a FlowPlan,
}

impl NewRun<'_> {
    /// Inserts it queued, due at `due` (in the lane at once when due now), or skipped
    /// with `skipped` as its error.
    fn insert(
        &self,
        tx: &Connection,
        now: i64,
        due: i64,
        skipped: Option<&RunError>,
    ) -> Result<(), StoreError> {
        let (req, plan) = (self.req, self.plan);
        let (status, error, finished) = match skipped {
            Some(e) => (RunStatus::Skipped, Some(to_json(e)?), Some(now)),
            None => (RunStatus::Queued, None, None),
        };
        let keys = (!plan.keys.is_empty())
            .then(|| to_json(&plan.keys))
            .transpose()?;
        let (cgate, climit) = plan
            .concurrency
            .as_ref()
            .map_or((None, None), |g| (Some(&g.id), Some(g.limit)));
        let (tgate, tlimit, tperiod) = plan.throttle.as_ref().map_or((None, None, None), |g| {
            (Some(&g.id), Some(g.limit), Some(g.period_ms as i64))
        });
        let promoted = skipped.is_none() && due <= now;
        let queue = self.settings.queue.as_str();
        let settings = to_json(self.settings)?;
        // Everything the row keeps whole (the idempotency key twice: the row and its
        // unique index); the rest is the per-run overhead.
        let payload = req.input.len()
            + req.trigger.len()
            + settings.len()
            + 2 * req.idempotency_key.as_ref().map_or(0, String::len)
            + keys.as_ref().map_or(0, String::len)
            + error.as_ref().map_or(0, String::len)
            + req.trace.as_ref().map_or(0, |t| t.as_str().len());
        let cost = storage::COST.run(payload);
        storage::check_run_keeping(tx, &req.tenant, self.id, 0, cost)?;
        tx.exec(
            "INSERT INTO runs (id, tenant, function, digest, settings, status, input, trigger,
                 created_at, updated_at, due_at, idempotency_key, parent, error, finished_at,
                 priority, rank_offset, rank, promoted, cgate, climit, tgate, tlimit, tperiod,
                 dgate, flow_keys, stored_bytes, queue, trace)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14,
                 ?15, ?16, ?10 + ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27)",
            params![
                self.id,
                req.tenant,
                req.function,
                self.digest,
                settings,
                status.as_str(),
                req.input,
                req.trigger,
                now,
                due,
                req.idempotency_key,
                req.parent,
                error,
                finished,
                plan.priority,
                plan.rank_offset,
                promoted,
                cgate,
                climit,
                tgate,
                tlimit,
                tperiod,
                plan.debounce.as_ref().map(|g| &g.id),
                keys,
                cost as i64,
                queue,
                req.trace.as_ref().map(|t| t.as_str()),
            ],
        )
        .map_err(internal)?;
        storage::charge(tx, &req.tenant, None, cost as i64)
    }
}

/// Fails with the tenant's `max_queued` error unless `admission` lets it queue `adding`
/// more runs ([`lifecycle::admit`]). A tenant without a record has no quotas.
pub(crate) fn check_queue_quota(
    tx: &Connection,
    tenant: &str,
    admission: Admission,
    adding: u64,
) -> Result<(), StoreError> {
    let Some(quotas) = tenant_quotas(tx, tenant)? else {
        return Ok(());
    };
    lifecycle::admit(
        tenant,
        admission,
        queued_runs(tx, tenant)?,
        adding,
        Some(quotas.max_queued),
    )
}

fn queued_runs(tx: &Connection, tenant: &str) -> Result<u64, StoreError> {
    let queued: i64 = tx
        .row(
            "SELECT queued FROM tenant_load WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?
        .unwrap_or(0);
    Ok(queued.max(0) as u64)
}

pub(crate) fn tenant_quotas(tx: &Connection, tenant: &str) -> Result<Option<Quotas>, StoreError> {
    let quotas: Option<String> = tx
        .row(
            "SELECT quotas FROM tenants WHERE name = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    quotas
        .map(|q| serde_json::from_str(&q).map_err(|e| StoreError::Internal(format!("quotas: {e}"))))
        .transpose()
}

/// The sliding window of a throttle or rate limit: `Some(t)` when `limit` entries fall in
/// the last `period` (the window is full until `t`), `None` when there is room.
pub(crate) fn window_full(
    tx: &Connection,
    tenant: &str,
    gate: &Gate,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    let limit_th: Option<i64> = tx
        .row(
            "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2
             ORDER BY at DESC LIMIT 1 OFFSET ?3",
            params![tenant, gate.id, i64::from(gate.limit) - 1],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    Ok(gate.closed_until(limit_th, now))
}

/// Records an entry in the window (and forgets entries that left it).
pub(crate) fn log_window(
    tx: &Connection,
    tenant: &str,
    gate: &Gate,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        "DELETE FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at <= ?3",
        params![tenant, gate.id, gate.window_start(now)],
    )
    .map_err(internal)?;
    tx.exec(
        "INSERT INTO flow_log (tenant, gate, at) VALUES (?1, ?2, ?3)",
        params![tenant, gate.id, now],
    )
    .map_err(internal)?;
    Ok(())
}

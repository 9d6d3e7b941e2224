//! Claims: expired leases reaped (what becomes of them is
//! `wasq_core::lifecycle::lease_expired`'s to say), throttle windows reopened, due runs
//! promoted into their tenant's lane, then tenants take turns (see the crate's opening
//! comment) and each gets its best run its gates let start.

use super::*;

/// Gate checks one claim may fail (parking those runs) before it gives up for now.
pub(crate) const PARK_BUDGET: usize = 1000;

/// Tenants with due runs one claim considers at most.
pub(crate) const LANE_TENANTS_MAX: usize = 10_000;

/// The next tenant after `?1` with a run in its lane (`?2` NULL: every queue): a skip-scan
/// of the lane index, one seek per tenant.
const NEXT_TENANT: &str = "SELECT tenant FROM runs
     WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL
         AND tenant > ?1 AND ?2 IS NULL
     ORDER BY tenant LIMIT 1";
/// [`NEXT_TENANT`] in the lane of queue `?2`.
const NEXT_TENANT_OF_QUEUE: &str = "SELECT tenant FROM runs
     WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL
         AND tenant > ?1 AND queue = ?2
     ORDER BY tenant LIMIT 1";
/// Tenant `?1`'s best-ranked run in its lane (`?2` NULL: every queue), with what its gates
/// and its lease need.
const LANE_HEAD: &str =
    "SELECT id, status, attempt, cgate, climit, tgate, tlimit, tperiod, lease_token
     FROM runs WHERE tenant = ?1 AND status IN ('queued', 'sleeping') AND promoted = 1
         AND parked IS NULL AND ?2 IS NULL
     ORDER BY rank, id LIMIT 1";
/// [`LANE_HEAD`] in the lane of queue `?2`.
const LANE_HEAD_OF_QUEUE: &str =
    "SELECT id, status, attempt, cgate, climit, tgate, tlimit, tperiod, lease_token
     FROM runs WHERE queue = ?2 AND tenant = ?1 AND status IN ('queued', 'sleeping')
         AND promoted = 1 AND parked IS NULL
     ORDER BY rank, id LIMIT 1";

/// Takes back runs whose worker stopped renewing: queued again, or failed for good.
pub(crate) fn reap_expired(tx: &Connection, now: i64) -> Result<(), StoreError> {
    let expired: Vec<(Run, Option<String>, bool)> = {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS}, worker, cancel_requested FROM runs
                 WHERE status = 'running' AND lease_expires_at <= ?1"
            ))
            .map_err(internal)?;
        let rows = stmt
            .query_map([now], |r| {
                Ok((
                    run_from_row(r)?,
                    r.get("worker")?,
                    r.get("cancel_requested")?,
                ))
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (run, worker, cancel_requested) in expired {
        let t = lifecycle::lease_expired(
            lifecycle::Expired {
                id: &run.id,
                attempt: run.attempt,
                max_attempts: run.settings.retry.max_attempts,
                worker: worker.as_deref(),
                cancel_requested,
            },
            now,
        );
        apply(tx, &run, &t, now)?;
    }
    Ok(())
}

/// Which lane one round robin of a claim takes from, and how many runs at most.
#[derive(Clone, Copy)]
pub(crate) struct Lane<'a> {
    /// `None`: every queue, as one.
    pub(crate) queue: Option<&'a str>,
    pub(crate) limit: usize,
}

/// A tenant taking turns in a claim.
pub(crate) struct Turn {
    tenant: String,
    /// Runs it may still start in this claim (`max_running` minus running).
    room: u64,
}

/// Runs the tenant may start now: `max_running` minus its running runs (no record: no
/// limit).
pub(crate) fn room(tx: &Connection, tenant: &str) -> Result<u64, StoreError> {
    let Some(q) = tenant_quotas(tx, tenant)? else {
        return Ok(u64::MAX);
    };
    let running: i64 = tx
        .row(
            "SELECT running FROM tenant_load WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?
        .unwrap_or(0);
    Ok(u64::from(q.max_running).saturating_sub(running.max(0) as u64))
}

/// The claim proper, after reaping and promotion: the tenants with runs in their lane take
/// turns, one run per turn, until `limit` runs are leased or no tenant has a startable run.
/// The first round walks the tenants in name order from the one after `after` (wrapping
/// around), one index seek each, and stops as soon as `limit` runs are leased; tenants
/// that got a run and may start more go round again. Returns the runs and the tenant
/// served last (where the next claim starts).
pub(crate) fn claim_round_robin(
    tx: &Connection,
    now: i64,
    req: &ClaimRequest,
    lane: Lane<'_>,
    after: &str,
) -> Result<(Vec<Claimed>, Option<String>), StoreError> {
    let Lane { queue, limit } = lane;
    let expires_at = now + req.lease_ms as i64;
    let mut claimed = Vec::new();
    let mut last = None;
    let mut parks = PARK_BUDGET;
    let mut again = std::collections::VecDeque::new();
    let mut take = |tx: &Connection,
                    mut turn: Turn,
                    parks: &mut usize,
                    claimed: &mut Vec<Claimed>|
     -> Result<Option<Turn>, StoreError> {
        let Some(head) = next_startable(tx, &turn.tenant, queue, now, parks)? else {
            return Ok(None);
        };
        claimed.push(lease_run(tx, head, &req.worker, now, expires_at)?);
        last = Some(turn.tenant.clone());
        turn.room -= 1;
        Ok((turn.room > 0).then_some(turn))
    };
    {
        // Skip-scan of the lane index (of the queue's lane index): one seek per tenant.
        let mut next = tx
            .prepare_cached(if queue.is_some() {
                NEXT_TENANT_OF_QUEUE
            } else {
                NEXT_TENANT
            })
            .map_err(internal)?;
        let mut from = after.to_owned();
        let mut wrapped = after.is_empty();
        let mut visited = 0;
        while claimed.len() < limit && visited < LANE_TENANTS_MAX {
            let found = next
                .query_row(params![&from, queue], |r| r.get::<_, String>(0))
                .optional()
                .map_err(internal)?;
            let tenant = match found {
                Some(t) if !(wrapped && !after.is_empty() && t.as_str() > after) => t,
                // Past the end: once more from the start, up to the cursor.
                None if !wrapped => {
                    wrapped = true;
                    from.clear();
                    continue;
                }
                _ => break,
            };
            from.clone_from(&tenant);
            visited += 1;
            let room = room(tx, &tenant)?;
            if room == 0 {
                continue;
            }
            if let Some(turn) = take(tx, Turn { tenant, room }, &mut parks, &mut claimed)? {
                again.push_back(turn);
            }
        }
    }
    while claimed.len() < limit {
        let Some(turn) = again.pop_front() else {
            break;
        };
        if let Some(turn) = take(tx, turn, &mut parks, &mut claimed)? {
            again.push_back(turn);
        }
    }
    Ok((claimed, last))
}

/// A run in its lane that its gates let start, with what the claim needs of it (read
/// by the lane query already).
pub(crate) struct Startable {
    id: String,
    status: RunStatus,
    attempt: u32,
    /// The lease token of its last lease (the claim's is the next).
    lease_token: u64,
}

/// The tenant's best-ranked run in its lane (of `queue`, when given) that its gates let
/// start now. Runs whose
/// concurrency key is full or whose throttle window is full (first starts only) are
/// parked on that gate on the way; `None` when none is left or `parks` ran out.
pub(crate) fn next_startable(
    tx: &Connection,
    tenant: &str,
    queue: Option<&str>,
    now: i64,
    parks: &mut usize,
) -> Result<Option<Startable>, StoreError> {
    loop {
        if *parks == 0 {
            return Ok(None);
        }
        #[allow(clippy::type_complexity)]
        let head: Option<(
            String,
            String,
            u32,
            Option<String>,
            Option<u32>,
            Option<String>,
            Option<u32>,
            Option<i64>,
            u64,
        )> = tx
            .prepare_cached(if queue.is_some() {
                LANE_HEAD_OF_QUEUE
            } else {
                LANE_HEAD
            })
            .map_err(internal)?
            .query_row(params![tenant, queue], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                ))
            })
            .optional()
            .map_err(internal)?;
        let Some((id, status, attempt, cgate, climit, tgate, tlimit, tperiod, lease_token)) = head
        else {
            return Ok(None);
        };
        let status: RunStatus = status.parse().map_err(StoreError::Internal)?;
        if let (Some(gate), Some(limit)) = (cgate, climit) {
            let running: u64 = tx
                .row(
                    "SELECT COUNT(*) FROM runs WHERE tenant = ?1 AND cgate = ?2 AND status = 'running'",
                    params![tenant, gate],
                    |r| r.get(0),
                )
                .map_err(internal)?;
            let gate = Gate {
                id: gate,
                limit,
                period_ms: 0,
            };
            if gate.is_full(running) {
                park(tx, &id, &gate.id)?;
                *parks -= 1;
                continue;
            }
        }
        if let (Some(id_t), Some(limit), Some(period)) = (&tgate, tlimit, tperiod)
            && lifecycle::throttles_start(status, attempt)
        {
            let gate = Gate {
                id: id_t.clone(),
                limit,
                period_ms: period as u64,
            };
            if let Some(open_at) = window_full(tx, tenant, &gate, now)? {
                park(tx, &id, &gate.id)?;
                tx.exec(
                    "INSERT INTO gate_timers (tenant, gate, at, tlimit, tperiod)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (tenant, gate) DO UPDATE SET at = MIN(at, excluded.at)",
                    params![tenant, gate.id, open_at, limit, period],
                )
                .map_err(internal)?;
                *parks -= 1;
                continue;
            }
            log_window(tx, tenant, &gate, now)?;
        }
        return Ok(Some(Startable {
            id,
            status,
            attempt,
            lease_token,
        }));
    }
}

pub(crate) fn park(tx: &Connection, id: &str, gate: &str) -> Result<(), StoreError> {
    tx.exec(
        "UPDATE runs SET parked = ?2 WHERE id = ?1",
        params![id, gate],
    )
    .map_err(internal)?;
    Ok(())
}

/// Leases `run` (in the lane, let through by its gates) to `worker`.
pub(crate) fn lease_run(
    tx: &Connection,
    run: Startable,
    worker: &str,
    now: i64,
    expires_at: i64,
) -> Result<Claimed, StoreError> {
    let id = run.id.as_str();
    let (attempt, resumed) = lifecycle::claimed_attempt(run.status, run.attempt);
    // The token from the row the lane query read in this same transaction, not `RETURNING`:
    // SQLite buffers returned rows in a temporary b-tree of its own, made and dropped (with
    // its page cache's memory) on every call.
    let token = run.lease_token + 1;
    tx.exec(
        "UPDATE runs SET status = 'running', attempt = ?5, resumed = ?6, lease_token = ?7,
             lease_expires_at = ?2, worker = ?3, updated_at = ?4
         WHERE id = ?1",
        params![id, expires_at, worker, now, attempt, resumed, token],
    )
    .map_err(internal)?;
    let run =
        load_run(tx, id)?.ok_or_else(|| StoreError::Internal("claimed run vanished".into()))?;
    tx.exec(
        "INSERT INTO attempts (run_id, seq, number, worker, started_at)
         VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM attempts WHERE run_id = ?1), ?2, ?3, ?4)",
        params![id, run.attempt, worker, now],
    )
    .map_err(internal)?;
    storage::charge(tx, &run.tenant, Some(id), storage::COST.attempt() as i64)?;
    let steps = replay_steps(tx, id)?;
    Ok(Claimed {
        lease: Lease {
            tenant: run.tenant.clone(),
            run_id: id.to_owned(),
            token,
            expires_at,
        },
        run,
        steps,
    })
}

/// Throttle gates whose window opened: lets as many parked runs back into the lane as the
/// window has room for, best rank first. While runs stay parked the gate's timer is set
/// to when the window opens next (counting the let-through runs as started now).
pub(crate) fn open_throttles(tx: &Connection, now: i64) -> Result<(), StoreError> {
    let due: Vec<(String, String, u32, i64)> = {
        let mut stmt = tx
            .prepare_cached("SELECT tenant, gate, tlimit, tperiod FROM gate_timers WHERE at <= ?1")
            .map_err(internal)?;
        let rows = stmt
            .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (tenant, gate, limit, period) in due {
        let g = Gate {
            id: gate.clone(),
            limit,
            period_ms: period as u64,
        };
        let window: Vec<i64> = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at > ?3
                     ORDER BY at DESC LIMIT ?4",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![tenant, gate, g.window_start(now), limit], |r| {
                    r.get(0)
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)?
        };
        let room = (limit as usize).saturating_sub(window.len());
        if room > 0 {
            tx.exec(
                "UPDATE runs SET parked = NULL WHERE id IN (
                     SELECT id FROM runs WHERE tenant = ?1 AND parked = ?2
                     ORDER BY rank, id LIMIT ?3)",
                params![tenant, gate, room as i64],
            )
            .map_err(internal)?;
        }
        let still_parked: bool = tx
            .row(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = ?1 AND parked = ?2)",
                params![tenant, gate],
                |r| r.get(0),
            )
            .map_err(internal)?;
        if still_parked {
            let opens = window.last().copied().unwrap_or(now) + period;
            tx.exec(
                "UPDATE gate_timers SET at = ?3 WHERE tenant = ?1 AND gate = ?2",
                params![tenant, gate, opens.max(now + 1)],
            )
            .map_err(internal)?;
        } else {
            tx.exec(
                "DELETE FROM gate_timers WHERE tenant = ?1 AND gate = ?2",
                params![tenant, gate],
            )
            .map_err(internal)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let n = stmt.parameter_count();
        let params: Vec<rusqlite::types::Value> =
            (0..n).map(|_| rusqlite::types::Value::Integer(0)).collect();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |r| {
                r.get::<_, String>(3)
            })
            .unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap().join("; ")
    }

    /// Claims stay cheap with a large backlog: every query of the claim path seeks an
    /// index instead of scanning the runs.
    #[test]
    fn claim_queries_use_indexes() {
        let store = SqliteStore::open_in_memory(Arc::new(SystemClock)).unwrap();
        let conn = store.conn.lock().unwrap();
        for (sql, index) in [
            (
                "UPDATE runs SET promoted = 1, rank = due_at + rank_offset
                 WHERE status IN ('queued', 'sleeping') AND promoted = 0 AND due_at <= ?1",
                "runs_due",
            ),
            (NEXT_TENANT, "runs_lane"),
            (LANE_HEAD, "runs_lane"),
            (NEXT_TENANT_OF_QUEUE, "runs_queue_lane"),
            (LANE_HEAD_OF_QUEUE, "runs_queue_lane"),
            (
                "SELECT COUNT(*) FROM runs WHERE tenant = ?1 AND cgate = ?2 AND status = 'running'",
                "runs_gate_running",
            ),
            (
                "SELECT id FROM runs WHERE tenant = ?1 AND parked = ?2 ORDER BY rank, id LIMIT 1",
                "runs_parked",
            ),
            (
                "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2
                 ORDER BY at DESC LIMIT 1 OFFSET ?3",
                "flow_log_by_gate",
            ),
            // An event reads only the runs waiting for its name, in index order.
            (
                "SELECT rowid FROM runs INDEXED BY runs_waiting_event
                 WHERE status = 'waiting' AND tenant = ?1 AND wait_event = ?2 AND rowid > ?3
                 ORDER BY rowid LIMIT ?4",
                "runs_waiting_event",
            ),
            // Paged log reads seek the run's lines.
            (
                "SELECT l.attempt, l.at, l.level, l.source, l.message FROM logs l
                 JOIN runs r ON r.id = l.run_id
                 WHERE l.run_id = ?1 AND r.tenant = ?2 AND l.seq >= ?3
                 ORDER BY l.seq LIMIT ?4",
                "sqlite_autoindex_logs_1 (run_id=? AND seq>?)",
            ),
        ] {
            let p = plan(&conn, sql);
            assert!(p.contains(index), "{sql}\n=> {p}");
            assert!(!p.contains("TEMP B-TREE"), "no sort: {sql}\n=> {p}");
        }
        // A listing filtered by status seeks that status's runs, in the order it pages.
        for (by_status, index) in [(true, "runs_by_status"), (false, "runs_by_tenant")] {
            let sql = rows::list_runs(by_status);
            let p = plan(&conn, &sql);
            assert!(p.contains(index), "{sql}\n=> {p}");
            assert!(!p.contains("TEMP B-TREE"), "no sort: {sql}\n=> {p}");
        }
        // What `queue_depths` and `load` read (a scrape, not a claim): the unended runs
        // only, grouped in memory.
        for sql in [load::QUEUE_DEPTHS, load::COUNTS, load::OLDEST_QUEUED] {
            let p = plan(&conn, sql);
            assert!(p.contains("runs_active"), "{sql}\n=> {p}");
        }
    }
}

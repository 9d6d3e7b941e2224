//! Claims: expired leases reaped (what becomes of them is
//! `wasq_core::lifecycle::lease_expired`'s to say), waits timed out, throttle windows
//! reopened, due runs promoted into their tenant's lane, then tenants take turns and each
//! gets its best run its gates let start.
//!
//! Each step reads only what is due from an ordered index, so a claim costs the same
//! whatever the backlog: a run parked on a full concurrency key or throttle window leaves
//! the lane until a slot frees (see `State::update`) or the window opens (its gate timer).

use std::collections::{BTreeSet, VecDeque};
use std::ops::Bound;

use wasq_core::clock::Millis;
use wasq_core::lifecycle;
use wasq_core::storage::INLINE_REPLAY_BYTES;
use wasq_core::*;

use crate::COST;
use crate::admission::{in_window, log_window, window_full};
use crate::state::{RunEntry, State};
use crate::transition::apply;
use crate::waits;

/// Gate checks one claim may fail (parking those runs) before it gives up for now.
pub(crate) const PARK_BUDGET: usize = 1000;

/// Tenants with due runs one claim considers at most.
pub(crate) const LANE_TENANTS_MAX: usize = 10_000;

/// The entries of a timeline index due at `now`: `(tenant, id)`, earliest first.
pub(crate) fn due(set: &BTreeSet<(Millis, String, String)>, now: Millis) -> Vec<(String, String)> {
    let end = (now.saturating_add(1), String::new(), String::new());
    set.range(..end)
        .map(|(_, tenant, id)| (tenant.clone(), id.clone()))
        .collect()
}

/// [`Store::claim`].
pub(crate) fn claim(
    st: &mut State,
    now: Millis,
    req: &ClaimRequest,
) -> Result<Vec<Claimed>, StoreError> {
    reap_expired(st, now)?;
    waits::resolve_timeouts(st, now)?;
    open_throttles(st, now)?;
    // Due runs enter their tenant's lane, ranked.
    for (tenant, id) in due(&st.timeline.pending, now) {
        st.update(&tenant, &id, |e| {
            if matches!(e.run.status, RunStatus::Queued | RunStatus::Sleeping) {
                e.promoted = true;
                e.rank = e.run.due_at.saturating_add(e.rank_offset);
            }
        })?;
    }
    // Queues in the order asked (none named: every queue, as one).
    if req.queues.is_empty() {
        return claim_round_robin(st, now, req, None, req.limit);
    }
    let mut claimed = Vec::new();
    for queue in &req.queues {
        let left = req.limit - claimed.len();
        if left == 0 {
            break;
        }
        claimed.extend(claim_round_robin(st, now, req, Some(queue), left)?);
    }
    Ok(claimed)
}

/// Takes back runs whose worker stopped renewing: queued again, or failed for good.
fn reap_expired(st: &mut State, now: Millis) -> Result<(), StoreError> {
    for (tenant, id) in due(&st.timeline.leases, now) {
        let e = st.get(&tenant, &id)?;
        if e.run.status != RunStatus::Running || e.lease_expires_at.is_some_and(|t| t > now) {
            continue;
        }
        let expired = lifecycle::Expired {
            id: &id,
            attempt: e.run.attempt,
            max_attempts: e.run.settings.retry.max_attempts,
            worker: e.worker.as_deref(),
            cancel_requested: e.cancel_requested,
        };
        let t = lifecycle::lease_expired(expired, now);
        apply(st, &tenant, &id, &t, now)?;
    }
    Ok(())
}

/// Throttle gates whose window opened: lets as many parked runs back into the lane as the
/// window has room for, best rank first. While runs stay parked the gate's timer is set
/// to when the window opens next (counting the let-through runs as started now).
fn open_throttles(st: &mut State, now: Millis) -> Result<(), StoreError> {
    for (tenant, gate) in due(&st.timeline.gate_timers, now) {
        let Some(space) = st.spaces.get(&tenant) else {
            continue;
        };
        let Some(timer) = space.gate_timers.get(&gate) else {
            continue;
        };
        let g = timer.gate.clone();
        let inside = in_window(space, &g, now);
        // The newest `limit` entries, and the oldest of them.
        let taken = inside.len().min(g.limit as usize);
        let oldest = inside[inside.len() - taken..].first().copied();
        let room = (g.limit as usize).saturating_sub(taken);
        let let_through: Vec<RunId> = space
            .parked
            .get(&gate)
            .map(|p| p.iter().take(room).map(|(_, id)| id.clone()).collect())
            .unwrap_or_default();
        for id in let_through {
            st.update(&tenant, &id, |e| e.parked = None)?;
        }
        let still_parked = st.spaces[&tenant].parked.contains_key(&gate);
        if still_parked {
            let opens = oldest.unwrap_or(now) + g.period_ms as i64;
            st.set_timer(&tenant, &g, opens.max(now + 1), false);
        } else {
            st.clear_timer(&tenant, &gate);
        }
    }
    Ok(())
}

/// Runs the tenant may start now: `max_running` minus its running runs (no record: no
/// limit).
fn room(st: &State, tenant: &str) -> u64 {
    let Some(q) = st.quotas(tenant) else {
        return u64::MAX;
    };
    u64::from(q.max_running).saturating_sub(st.count(tenant, RunStatus::Running))
}

/// The claim proper, after reaping and promotion: the tenants with runs in their lane take
/// turns, one run per turn, until `limit` runs are leased or no tenant has a startable run
/// (of `queue`, when one is given).
/// The first round walks the tenants in name order from the one after the cursor
/// (wrapping around) and stops as soon as `limit` runs are leased; tenants that got a run
/// and may start more go round again. The tenant served last is where the next claim
/// starts.
fn claim_round_robin(
    st: &mut State,
    now: Millis,
    req: &ClaimRequest,
    queue: Option<&str>,
    limit: usize,
) -> Result<Vec<Claimed>, StoreError> {
    let expires_at = now.saturating_add(req.lease_ms as i64);
    let after = st.cursor.clone();
    let mut claimed = Vec::new();
    let mut last = None;
    let mut parks = PARK_BUDGET;
    let mut again = VecDeque::new();
    // One run for the tenant with `room`; `Some(room left)` when it may go round again.
    let mut take = |st: &mut State,
                    tenant: String,
                    room: u64,
                    parks: &mut usize,
                    claimed: &mut Vec<Claimed>|
     -> Result<Option<(String, u64)>, StoreError> {
        let Some(id) = next_startable(st, &tenant, queue, now, parks)? else {
            return Ok(None);
        };
        claimed.push(lease_run(st, &tenant, &id, &req.worker, now, expires_at)?);
        last = Some(tenant.clone());
        Ok((room > 1).then_some((tenant, room - 1)))
    };
    let mut from = after.clone();
    let mut wrapped = after.is_empty();
    let mut visited = 0;
    while claimed.len() < limit && visited < LANE_TENANTS_MAX {
        let found = st
            .lanes
            .range::<str, _>((Bound::Excluded(from.as_str()), Bound::Unbounded))
            .next()
            .cloned();
        let tenant = match found {
            Some(t) if !(wrapped && !after.is_empty() && t.as_str() > after.as_str()) => t,
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
        let room = room(st, &tenant);
        if room == 0 {
            continue;
        }
        if let Some(turn) = take(st, tenant, room, &mut parks, &mut claimed)? {
            again.push_back(turn);
        }
    }
    while claimed.len() < limit {
        let Some((tenant, room)) = again.pop_front() else {
            break;
        };
        if let Some(turn) = take(st, tenant, room, &mut parks, &mut claimed)? {
            again.push_back(turn);
        }
    }
    if let Some(last) = last {
        st.cursor = last;
    }
    Ok(claimed)
}

/// The tenant's best-ranked run in its lane (of `queue`, when given: this reference store
/// skips the lane's other runs, where the others keep a lane per queue) that its gates let
/// start now. Runs whose
/// concurrency key is full or whose throttle window is full (first starts only) are
/// parked on that gate on the way; `None` when none is left or `parks` ran out.
fn next_startable(
    st: &mut State,
    tenant: &str,
    queue: Option<&str>,
    now: Millis,
    parks: &mut usize,
) -> Result<Option<RunId>, StoreError> {
    loop {
        if *parks == 0 {
            return Ok(None);
        }
        let Some(space) = st.spaces.get(tenant) else {
            return Ok(None);
        };
        let head = space.lane.iter().find(|(_, id)| {
            queue.is_none_or(|q| {
                space
                    .runs
                    .get(id)
                    .is_some_and(|e| e.run.settings.queue == q)
            })
        });
        let Some((_, id)) = head else {
            return Ok(None);
        };
        let id = id.clone();
        let e = st.get(tenant, &id)?;
        if let Some(g) = &e.cgate {
            let running = space.gate_running.get(&g.id).copied().unwrap_or(0);
            if g.is_full(running as u64) {
                let gate = g.id.clone();
                st.update(tenant, &id, |e| e.parked = Some(gate))?;
                *parks -= 1;
                continue;
            }
        }
        if let Some(g) = &e.tgate
            && lifecycle::throttles_start(e.run.status, e.run.attempt)
        {
            let g = g.clone();
            if let Some(open_at) = window_full(space, &g, now) {
                st.update(tenant, &id, |e| e.parked = Some(g.id.clone()))?;
                st.set_timer(tenant, &g, open_at, true);
                *parks -= 1;
                continue;
            }
            log_window(st.space_mut(tenant), &g, now);
        }
        return Ok(Some(id));
    }
}

/// Leases run `id` (in the lane, let through by its gates) to `worker`.
fn lease_run(
    st: &mut State,
    tenant: &str,
    id: &str,
    worker: &str,
    now: Millis,
    expires_at: Millis,
) -> Result<Claimed, StoreError> {
    let token = st.update(tenant, id, |e| {
        let (attempt, resumed) = lifecycle::claimed_attempt(e.run.status, e.run.attempt);
        e.run.status = RunStatus::Running;
        e.run.attempt = attempt;
        e.run.updated_at = now;
        e.resumed = resumed;
        e.lease_token += 1;
        e.lease_expires_at = Some(expires_at);
        e.worker = Some(worker.to_owned());
        e.attempts.push(Attempt {
            number: attempt,
            worker: worker.to_owned(),
            started_at: now,
            finished_at: None,
            error: None,
            fuel_used: None,
            suspended_until: None,
        });
        e.history_bytes += COST.attempt();
        e.lease_token
    })?;
    let e = st.get(tenant, id)?;
    Ok(Claimed {
        run: e.run.clone(),
        lease: Lease {
            tenant: tenant.to_owned(),
            run_id: id.to_owned(),
            token,
            expires_at,
        },
        steps: replay_steps(e),
    })
}

/// A run's steps for replay: outputs inline while they fit in [`INLINE_REPLAY_BYTES`], the
/// rest by reference (read when the replay reaches them).
fn replay_steps(e: &RunEntry) -> Vec<ReplayStep> {
    let mut budget = INLINE_REPLAY_BYTES;
    e.steps
        .iter()
        .map(|s| {
            let inline = s.output.len() <= budget;
            if inline {
                budget -= s.output.len();
            }
            ReplayStep {
                name: s.name.clone(),
                occurrence: s.occurrence,
                output: inline.then(|| s.output.clone()),
            }
        })
        .collect()
}

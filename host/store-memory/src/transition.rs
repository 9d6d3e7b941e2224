//! Writing what core decided: a lifecycle transition (`apply`), an attempt's history, its
//! log lines and steps, each under the lease that `check_lease` verified; and the calls
//! that end or change a run: renew, finish, cancel, retry.

use wasq_core::clock::Millis;
use wasq_core::lifecycle::{self, Admission, Change, Execution, Transition};
use wasq_core::storage::{self, RunLog};
use wasq_core::*;

use crate::COST;
use crate::admission::check_queue_quota;
use crate::state::{RunEntry, State, attempt_cost, error_bytes};
use crate::waits;

/// What ending a leased run's attempt needs to know of it.
pub(crate) struct Leased {
    /// The current execution woke a sleeping run.
    pub(crate) resumed: bool,
    pub(crate) cancel_requested: bool,
}

/// Checks the fence: the run is running under exactly this lease.
pub(crate) fn check_lease(st: &State, lease: &Lease) -> Result<Leased, StoreError> {
    let e = st
        .entry(&lease.tenant, &lease.run_id)
        .ok_or_else(|| StoreError::NotFound(format!("run {}", lease.run_id)))?;
    if e.run.status != RunStatus::Running || e.lease_token != lease.token {
        return Err(StoreError::LeaseLost(lease.run_id.clone()));
    }
    Ok(Leased {
        resumed: e.resumed,
        cancel_requested: e.cancel_requested,
    })
}

/// Writes a lifecycle transition of run `id`: its history, its tenant's usage and its
/// record; then, if it ended, resumes the runs waiting for it. The transition decided
/// everything; this only stores it.
pub(crate) fn apply(
    st: &mut State,
    tenant: &str,
    id: &str,
    t: &Transition,
    now: Millis,
) -> Result<(), StoreError> {
    st.update(tenant, id, |e| write(e, t, now))?;
    if t.usage.executions > 0 {
        let usage = &mut st.space_mut(tenant).usage;
        usage.attempts = usage.attempts.saturating_add(t.usage.executions);
        usage.fuel = usage.fuel.saturating_add(t.usage.fuel.unwrap_or(0));
    }
    if let Some(resolution) = &t.resolution {
        waits::resolve_waiters_of(st, tenant, id, resolution, now)?;
    }
    Ok(())
}

/// Writes `t` onto the run itself: its fields and its latest execution. The execution's
/// error (bounded by whoever made it) is charged without a quota check, so a run over its
/// quota can still fail.
pub(crate) fn write(e: &mut RunEntry, t: &Transition, now: Millis) {
    match &t.execution {
        Some(Execution::Close {
            error,
            fuel_used,
            suspended_until,
        }) => {
            if let Some(a) = e.attempts.last_mut() {
                let before = error_bytes(a.error.as_ref());
                a.finished_at = Some(now);
                a.error.clone_from(error);
                a.fuel_used = *fuel_used;
                a.suspended_until = *suspended_until;
                e.history_bytes = e.history_bytes - before + error_bytes(error.as_ref());
            }
        }
        Some(Execution::Drop) => {
            if let Some(a) = e.attempts.pop() {
                e.history_bytes = e.history_bytes.saturating_sub(attempt_cost(&a));
            }
        }
        None => {}
    }
    let r = &mut e.run;
    r.status = t.status;
    match &t.error {
        Change::Keep => {}
        Change::Set(error) => r.error = Some(error.clone()),
        Change::Clear => r.error = None,
    }
    if let Some(output) = &t.output {
        r.output = Some(output.clone());
    }
    if let Some(due) = t.due_at {
        r.due_at = due;
    }
    r.finished_at = t.finished_at;
    if t.give_back_attempt {
        r.attempt = r.attempt.saturating_sub(1);
    }
    if let Some(wait) = &t.wait {
        r.wait = Some(wait.clone());
    }
    r.updated_at = now;
    if t.clear_cancel {
        e.cancel_requested = false;
    }
    e.lease_expires_at = None;
    e.worker = None;
}

/// Refuses `adding` bytes (a step, an output) to run `id` over its `max_run_bytes`, or to
/// its tenant over `max_stored_bytes`.
pub(crate) fn check_run(st: &State, tenant: &str, id: &str, adding: u64) -> Result<(), StoreError> {
    let quotas = st.quotas(tenant);
    let used = st.get(tenant, id)?.run.stored_bytes;
    storage::check_run_bytes(id, quotas.as_ref(), used, adding)?;
    storage::check_tenant_bytes(tenant, quotas.as_ref(), st.stored(tenant), adding)
}

/// Appends log lines after the run's last one, as many as its log budget and its
/// tenant's storage quota take (then one marker line; the rest are dropped).
pub(crate) fn append_logs(
    st: &mut State,
    tenant: &str,
    id: &str,
    lines: Vec<LogLine>,
) -> Result<(), StoreError> {
    if lines.is_empty() {
        return Ok(());
    }
    let e = st.get(tenant, id)?;
    let log = RunLog {
        bytes: e.run.log_bytes,
        cut: e.logs_cut,
    };
    let quotas = st.quotas(tenant);
    let fitted = storage::fit_logs(lines, log, quotas.as_ref(), st.stored(tenant), &COST);
    if fitted.lines.is_empty() {
        return Ok(());
    }
    st.update(tenant, id, |e| {
        e.logs_cut |= fitted.cut_now;
        e.run.log_bytes += fitted.bytes;
        e.logs.extend(fitted.lines);
    })
}

/// Stores a step output and charges it to the run and its tenant. First write wins: a
/// step's output never changes once stored (nor is it charged twice).
pub(crate) fn write_step(
    st: &mut State,
    tenant: &str,
    id: &str,
    name: &str,
    occurrence: u32,
    output: &[u8],
    now: Millis,
) -> Result<(), StoreError> {
    st.update(tenant, id, |e| {
        let key = (name.to_owned(), occurrence);
        if e.step_index.contains_key(&key) {
            return;
        }
        e.history_bytes += COST.step(name.len(), output.len());
        e.step_index.insert(key, e.steps.len());
        e.steps.push(StepRecord {
            name: name.to_owned(),
            occurrence,
            output: output.to_vec(),
            attempt: e.run.attempt,
            completed_at: now,
        });
    })
}

/// [`Store::record`]: what a running attempt produced, under its lease.
pub(crate) fn record(
    st: &mut State,
    now: Millis,
    lease: &Lease,
    record: Record,
) -> Result<(), StoreError> {
    check_lease(st, lease)?;
    let (tenant, id) = (lease.tenant.as_str(), lease.run_id.as_str());
    if let Record::Step {
        name,
        occurrence,
        output,
        ..
    } = &record
        && !st
            .get(tenant, id)?
            .step_index
            .contains_key(&(name.clone(), *occurrence))
    {
        check_run(st, tenant, id, COST.step(name.len(), output.len()))?;
    }
    store_record(st, now, tenant, id, record)
}

/// Stores a record of a leased run whose quotas the caller checked.
fn store_record(
    st: &mut State,
    now: Millis,
    tenant: &str,
    id: &str,
    record: Record,
) -> Result<(), StoreError> {
    match record {
        Record::Step {
            name,
            occurrence,
            output,
            logs,
        } => {
            append_logs(st, tenant, id, logs)?;
            write_step(st, tenant, id, &name, occurrence, &output, now)
        }
        Record::Logs(lines) => append_logs(st, tenant, id, lines),
        Record::Progress(p) => st.update(tenant, id, |e| {
            e.run.progress = Some(p);
            e.run.updated_at = now;
        }),
    }
}

/// [`Queue::end_attempts`], one end: its new steps and its output checked against the
/// quotas together, then its records and its outcome stored.
pub(crate) fn end(st: &mut State, now: Millis, end: AttemptEnd) -> Result<RunStatus, StoreError> {
    let leased = check_lease(st, &end.lease)?;
    let (tenant, id) = (end.lease.tenant.as_str(), end.lease.run_id.as_str());
    let t = lifecycle::finish(ending(id, &leased), &end.outcome, now);
    let mut adding = t.output.as_ref().map(|o| o.len() as u64);
    let known = &st.get(tenant, id)?.step_index;
    for (name, occurrence, output) in end.steps() {
        if !known.contains_key(&(name.to_owned(), occurrence)) {
            *adding.get_or_insert(0) += COST.step(name.len(), output.len());
        }
    }
    if let Some(adding) = adding {
        check_run(st, tenant, id, adding)?;
    }
    for r in end.records {
        store_record(st, now, tenant, id, r)?;
    }
    store_finish(st, now, tenant, id, &t).map(|run| run.status)
}

fn ending<'a>(id: &'a str, leased: &Leased) -> lifecycle::Ending<'a> {
    lifecycle::Ending {
        id,
        cancel_requested: leased.cancel_requested,
        resumed: leased.resumed,
    }
}

/// [`Store::renew`]: extends the leases still held by running runs whose cancel was not
/// requested.
pub(crate) fn renew(
    st: &mut State,
    now: Millis,
    leases: &[Lease],
    lease_ms: u64,
) -> Result<Renewal, StoreError> {
    let mut renewal = Renewal::default();
    for lease in leases {
        let held = st
            .entry(&lease.tenant, &lease.run_id)
            .filter(|e| e.run.status == RunStatus::Running && e.lease_token == lease.token);
        match held.map(|e| e.cancel_requested) {
            Some(false) => {
                let expires = now.saturating_add(lease_ms as i64);
                st.update(&lease.tenant, &lease.run_id, |e| {
                    e.lease_expires_at = Some(expires);
                })?;
            }
            Some(true) => renewal.cancelling.push(lease.run_id.clone()),
            None => renewal.lost.push(lease.run_id.clone()),
        }
    }
    Ok(renewal)
}

/// [`Store::finish`]: ends the attempt as [`lifecycle::finish`] says; a wait on a run that
/// already ended (or does not exist) resolves at once.
pub(crate) fn finish(
    st: &mut State,
    now: Millis,
    lease: &Lease,
    outcome: Outcome,
) -> Result<Run, StoreError> {
    let leased = check_lease(st, lease)?;
    let (tenant, id) = (lease.tenant.as_str(), lease.run_id.as_str());
    let t = lifecycle::finish(ending(id, &leased), &outcome, now);
    if let Some(output) = &t.output {
        // Refused over a quota (nothing changes); the worker then fails the run.
        check_run(st, tenant, id, output.len() as u64)?;
    }
    store_finish(st, now, tenant, id, &t)
}

/// Stores the transition that ends an attempt (its quotas checked by the caller), and
/// resolves at once a wait for a run that already ended.
fn store_finish(
    st: &mut State,
    now: Millis,
    tenant: &str,
    id: &str,
    t: &Transition,
) -> Result<Run, StoreError> {
    apply(st, tenant, id, t, now)?;
    if let Some(
        wait @ Wait {
            on: WaitOn::Run { id: target },
            ..
        },
    ) = &t.wait
    {
        let resolution = match st.entry(tenant, target) {
            Some(e) => lifecycle::resolution(&e.run),
            None => Some(lifecycle::missing_run_resolution(target)),
        };
        if let Some(resolution) = resolution {
            waits::resolve_wait(st, tenant, id, wait, &resolution, now)?;
        }
    }
    Ok(st.get(tenant, id)?.run.clone())
}

/// [`Store::cancel`]: at once unless running; a running run is marked and ends cancelled
/// when its attempt ends.
pub(crate) fn cancel(st: &mut State, now: Millis, req: &RunAction) -> Result<Run, StoreError> {
    let (tenant, id) = (req.tenant.as_str(), req.id.as_str());
    let e = st.tenant_run(tenant, id)?;
    let attempt = e.run.attempt;
    match lifecycle::cancel(id, e.run.status, req.cancel_error(), now)? {
        Some(t) => apply(st, tenant, id, &t, now)?,
        None => st.update(tenant, id, |e| {
            e.cancel_requested = true;
            e.run.error = Some(req.cancel_error());
            e.run.updated_at = now;
        })?,
    }
    append_logs(st, tenant, id, vec![req.log_line(attempt, now)])?;
    Ok(st.get(tenant, id)?.run.clone())
}

/// [`Store::retry`]: queued again with a fresh budget of attempts, refused like a new run
/// over `max_queued`.
pub(crate) fn retry(st: &mut State, now: Millis, req: &RunAction) -> Result<Run, StoreError> {
    let (tenant, id) = (req.tenant.as_str(), req.id.as_str());
    let e = st.tenant_run(tenant, id)?;
    let attempt = e.run.attempt;
    let retry = lifecycle::retry(id, e.run.status, attempt, now)?;
    check_queue_quota(st, tenant, Admission::Run, 1)?;
    st.update(tenant, id, |e| {
        let max = &mut e.run.settings.retry.max_attempts;
        *max = max.saturating_add(retry.extra_attempts);
    })?;
    apply(st, tenant, id, &retry.transition, now)?;
    append_logs(st, tenant, id, vec![req.log_line(attempt, now)])?;
    Ok(st.get(tenant, id)?.run.clone())
}

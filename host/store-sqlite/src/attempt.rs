//! What an attempt stores under its lease: records while it runs (`record`), its end
//! (`finish`), and both in one transaction (`end`, for `Queue::end_attempts`).

use super::*;

/// [`Queue::record`].
pub(crate) fn record(
    tx: &Connection,
    now: i64,
    lease: &Lease,
    record: Record,
) -> Result<(), StoreError> {
    let run = check_lease(tx, lease)?.run;
    if let Record::Step {
        name,
        occurrence,
        output,
        ..
    } = &record
        && step_output(tx, &run.id, name, *occurrence)?.is_none()
    {
        let cost = storage::COST.step(name.len(), output.len());
        storage::check_run(tx, &run.tenant, &run.id, cost)?;
    }
    store_record(tx, now, &run, record)
}

/// Stores a record of a leased run whose quotas the caller checked.
fn store_record(tx: &Connection, now: i64, run: &Run, record: Record) -> Result<(), StoreError> {
    match record {
        Record::Step {
            name,
            occurrence,
            output,
            logs,
        } => {
            append_logs(tx, &run.tenant, &run.id, logs)?;
            write_step(tx, run, &name, occurrence, &output, now)
        }
        Record::Logs(lines) => append_logs(tx, &run.tenant, &run.id, lines),
        Record::Progress(p) => {
            tx.exec(
                "UPDATE runs SET progress = ?2, updated_at = ?3 WHERE id = ?1",
                params![run.id, to_json(&p)?, now],
            )
            .map_err(internal)?;
            Ok(())
        }
    }
}

/// The transition that ends the leased run's attempt in `outcome`.
fn ending(leased: &Leased, outcome: &Outcome, now: i64) -> Transition {
    let ending = lifecycle::Ending {
        id: &leased.run.id,
        cancel_requested: leased.cancel_requested,
        resumed: leased.resumed,
    };
    lifecycle::finish(ending, outcome, now)
}

/// [`Queue::finish`].
pub(crate) fn finish(
    tx: &Connection,
    now: i64,
    lease: &Lease,
    outcome: Outcome,
) -> Result<Run, StoreError> {
    let leased = check_lease(tx, lease)?;
    let t = ending(&leased, &outcome, now);
    if let Some(output) = &t.output {
        // Refused over a quota (nothing changes); the worker then fails the run.
        storage::check_run(tx, &leased.run.tenant, &leased.run.id, output.len() as u64)?;
    }
    store_finish(tx, now, &leased.run, &t)?;
    load_run(tx, &leased.run.id)?
        .ok_or_else(|| StoreError::Internal("finished run vanished".into()))
}

/// One end of [`Queue::end_attempts`]: its new steps and its output checked against the
/// quotas together, then its records and its outcome stored.
pub(crate) fn end(tx: &Connection, now: i64, end: AttemptEnd) -> Result<RunStatus, StoreError> {
    let leased = check_lease(tx, &end.lease)?;
    let run = &leased.run;
    let t = ending(&leased, &end.outcome, now);
    let mut adding = t.output.as_ref().map(|o| o.len() as u64);
    for (name, occurrence, output) in end.steps() {
        if step_output(tx, &run.id, name, occurrence)?.is_none() {
            *adding.get_or_insert(0) += storage::COST.step(name.len(), output.len());
        }
    }
    if let Some(adding) = adding {
        storage::check_run(tx, &run.tenant, &run.id, adding)?;
    }
    for r in end.records {
        store_record(tx, now, run, r)?;
    }
    store_finish(tx, now, run, &t)
}

/// Stores the transition that ends an attempt (its quotas checked by the caller); a wait
/// on a run that already ended (or does not exist) resolves at once. Answers the run's
/// status after it.
fn store_finish(
    tx: &Connection,
    now: i64,
    run: &Run,
    t: &Transition,
) -> Result<RunStatus, StoreError> {
    if let Some(output) = &t.output {
        storage::charge(tx, &run.tenant, Some(&run.id), output.len() as i64)?;
    }
    apply(tx, run, t, now)?;
    if let Some(
        wait @ Wait {
            on: WaitOn::Run { id: target },
            ..
        },
    ) = &t.wait
    {
        let resolution = match load_run(tx, target)?.filter(|t| t.tenant == run.tenant) {
            Some(t) => lifecycle::resolution(&t),
            None => Some(lifecycle::missing_run_resolution(target)),
        };
        if let Some(resolution) = resolution {
            resolve_wait(tx, run, wait, &resolution, now)?;
            return Ok(RunStatus::Sleeping);
        }
    }
    Ok(t.status)
}

//! One attempt end to end: load the component, run it in the sandbox with its journal,
//! turn the result into an `Outcome` (a failure's retry delay from the run's policy) and
//! finish it while the lease holds, retrying store outages.

use super::*;

/// Retries a store call while the store says a retry can help.
pub(crate) async fn with_retries<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(50);
    for _ in 0..6 {
        match f().await {
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "store call failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
    f().await
}

/// Records the end of an attempt, retrying through a store outage for as long as the lease
/// could still be ours: a Redis restart shorter than the lease then costs no re-execution.
pub(crate) async fn finish_while_leased(
    app: &App,
    finisher: &Finisher,
    end: &AttemptEnd,
) -> Result<wasq_core::RunStatus, StoreError> {
    // Renewals kept the lease alive until about now; one lease length later it has surely
    // expired and another worker may hold the run, so retrying longer is pointless (the
    // store's fence rejects a stale finish either way).
    let until = app.now() + app.config.lease.as_millis() as i64;
    let mut delay = Duration::from_millis(50);
    loop {
        match finisher.end(end.clone()).await {
            Err(e) if e.is_retryable() && app.now() < until => {
                tracing::warn!(error = %e, "recording the end of the attempt failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

pub(crate) fn host_line(
    at: wasq_core::clock::Millis,
    attempt: u32,
    level: LogLevel,
    message: String,
) -> LogLine {
    LogLine {
        attempt,
        at,
        level,
        source: LogSource::Host,
        message,
    }
}

pub(crate) async fn attempt(
    app: &Arc<App>,
    finisher: &Finisher,
    claimed: Claimed,
    held: Arc<Held>,
    hard_stop: &CancellationToken,
    mut slot: Slot,
) {
    let Claimed { run, lease, steps } = claimed;
    let cancel = held.cancel.clone();
    // The attempt span's context (the child of the run's, worker.rs), or the run's own
    // when spans are not exported: what its child runs, events and outbound HTTP carry.
    let trace = crate::telemetry::current_or(|| run.trace.clone());
    let journal = StoreJournal::new(app.clone(), run.tenant.clone(), held.clone(), trace.clone());

    let result = match ensure_loaded(app, &run.digest).await {
        Ok(()) => {
            let spec = AttemptSpec {
                digest: run.digest.clone(),
                info: RunInfo {
                    run_id: run.id.clone(),
                    function: run.function.clone(),
                    tenant: run.tenant.clone(),
                    attempt: run.attempt,
                    max_attempts: run.settings.retry.max_attempts,
                    trigger: run.trigger.clone(),
                },
                input: run.input.clone(),
                limits: run.settings.limits,
                steps,
                journal: journal.clone(),
                cancel: cancel.clone(),
                allow_hosts: run.settings.allow_hosts.clone(),
                traceparent: trace,
                max_outbound_requests: Some(
                    app.quotas
                        .get(app, &run.tenant)
                        .await
                        .max_outbound_requests_per_run,
                ),
            };
            app.sandbox.run(spec).await
        }
        Err(error) => wasq_sandbox::AttemptResult {
            outcome: AttemptOutcome::Failed(AttemptError {
                error,
                retry_after_ms: None,
            }),
            fuel_used: 0,
            peak_memory_bytes: 0,
            duration: Duration::ZERO,
            egress_refused: 0,
        },
    };
    // What the attempt did not store yet goes with its end; a step the journal stored in
    // the background after the guest went on may have met a refusal the guest never saw.
    let (pending, failed) = journal.close().await;
    // The guest is done: its slot may take the next run while this end is stored.
    slot.executed().await;

    let abandoned = match &result.outcome {
        AttemptOutcome::Abandoned(why) => Some(why.clone()),
        _ if held.is_lost() => Some(LEASE_LOST.to_owned()),
        _ => None,
    };
    if let Some(why) = abandoned {
        // Nothing of it is recorded: not its end (another attempt owns the run, or the
        // store takes it back when the lease expires), nor its last log lines.
        held.lose();
        tracing::warn!("attempt abandoned: {why}");
        app.metrics.attempt(
            &run.tenant,
            "abandoned",
            result.duration,
            result.peak_memory_bytes,
        );
        return;
    }
    let mut records = pending.into_records();
    let host_note = |records: &mut Vec<Record>, message: String| {
        let line = host_line(app.now(), run.attempt, LogLevel::Error, message);
        records.push(Record::Logs(vec![line]));
    };
    let fail = |error: RunError, retry_after_ms: Option<u64>, records: &mut Vec<Record>| {
        failure(
            &run,
            error,
            retry_after_ms,
            records,
            result.fuel_used,
            &host_note,
        )
    };
    let attempt_result = match (failed, result.outcome) {
        (Some(JournalError::StorageQuota(why)), _) => {
            Err(RunError::new(ErrorReason::StorageQuota, why))
        }
        (Some(e), _) => Err(RunError::new(ErrorReason::Host, e.to_string())),
        (None, outcome) => Ok(outcome),
    };
    let outcome = match attempt_result {
        Err(error) => fail(error, None, &mut records),
        // Returned above.
        Ok(AttemptOutcome::Abandoned(_)) => return,
        Ok(AttemptOutcome::Output(output)) => {
            tracing::info!(duration = ?result.duration, fuel = result.fuel_used, "attempt succeeded");
            Outcome::Succeeded {
                output,
                fuel_used: Some(result.fuel_used),
            }
        }
        Ok(AttemptOutcome::Suspended { until }) => {
            tracing::info!(until, "run sleeps");
            Outcome::Suspended {
                until,
                fuel_used: Some(result.fuel_used),
            }
        }
        Ok(AttemptOutcome::Waiting(wait)) => {
            tracing::info!(step = %wait.step, "run waits");
            Outcome::Waiting {
                wait,
                fuel_used: Some(result.fuel_used),
            }
        }
        // Interrupted by shutdown, not by the guest: hand the run back untouched.
        Ok(AttemptOutcome::Failed(_)) if hard_stop.is_cancelled() => Outcome::Released,
        Ok(AttemptOutcome::Failed(AttemptError {
            error,
            retry_after_ms,
        })) => fail(error, retry_after_ms, &mut records),
    };
    let label = match &outcome {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Failed {
            retry_in_ms: Some(_),
            ..
        } => "retrying",
        Outcome::Failed { .. } => "failed",
        Outcome::Suspended { .. } => "sleeping",
        Outcome::Waiting { .. } => "waiting",
        Outcome::Released => "released",
    };
    app.metrics.attempt(
        &run.tenant,
        label,
        result.duration,
        result.peak_memory_bytes,
    );
    app.metrics
        .egress_refused(&run.tenant, result.egress_refused);
    held.ending.store(true, Ordering::SeqCst);
    if let Outcome::Failed { error, .. } = &outcome {
        crate::telemetry::failed(&tracing::Span::current(), error);
    }
    // Storing the end and what follows it (failure handler, webhooks): the attempt's last
    // child span.
    let finish = tracing::debug_span!("finish", outcome = label, status = tracing::field::Empty);
    async {
        let mut end = AttemptEnd {
            lease: lease.clone(),
            records,
            outcome,
        };
        let asked = std::time::Instant::now();
        let mut ended = finish_while_leased(app, finisher, &end).await;
        app.metrics.store_call("end", asked.elapsed());
        if let Err(StoreError::StorageQuota(why)) = &ended {
            // Its steps or its output did not fit: the run fails instead (an error and log
            // lines are always stored; the steps are not).
            let error = RunError::new(ErrorReason::StorageQuota, why.clone());
            let mut records = without_steps(std::mem::take(&mut end.records));
            end.outcome = fail(error, None, &mut records);
            end.records = records;
            ended = finish_while_leased(app, finisher, &end).await;
        }
        match ended {
            Ok(status) => {
                finish.record("status", status.as_str());
                tracing::debug!(%status, "attempt recorded");
                if let Outcome::Failed { error, .. } = &end.outcome {
                    let retried = status == RunStatus::Queued;
                    app.metrics
                        .attempt_error(&run.tenant, error.reason.as_str(), retried);
                }
                if status.is_terminal() {
                    let took = app.now() - run.created_at;
                    app.metrics.run_ended(&run.tenant, status.as_str(), took);
                }
                // It may be due again now (a retry without backoff, a short sleep), and its
                // end may have resumed runs waiting for it (which a store that announces work
                // says itself).
                let resumed = status.is_terminal() && !app.store.announces_work();
                if resumed || matches!(status, RunStatus::Queued | RunStatus::Sleeping) {
                    app.wake.notify_one();
                }
                if status.is_terminal() {
                    let _ = app.finished.send(lease.run_id.clone());
                }
                if run.settings.on_failure.is_some() {
                    crate::on_failure::after_end(app, &run.tenant, &run.id, status).await;
                }
                if !run.settings.notify.urls.is_empty() {
                    if status.is_terminal() {
                        crate::notify::after_end(app, &run, status).await;
                    } else if let Outcome::Failed {
                        error,
                        retry_in_ms: Some(_),
                        ..
                    } = &end.outcome
                    {
                        crate::notify::after_attempt_failed(app, &run, run.attempt, error).await;
                    }
                }
            }
            Err(StoreError::LeaseLost(_)) => {
                tracing::warn!("lease lost before the attempt ended; its result is discarded")
            }
            Err(e) => {
                tracing::error!(error = %e, "could not record the end of the attempt; the lease will expire and the run will be retried")
            }
        }
    }
    .instrument(finish.clone())
    .await;
}

/// The end of an attempt that failed with `error`: queued again after the run's retry
/// policy's delay, or failed for good (always for a storage quota, which a retry would
/// meet again); a host line in the run's log says which.
fn failure(
    run: &wasq_core::Run,
    error: RunError,
    retry_after_ms: Option<u64>,
    records: &mut Vec<Record>,
    fuel_used: u64,
    note: &dyn Fn(&mut Vec<Record>, String),
) -> Outcome {
    let delay =
        run.settings
            .retry
            .retry_delay(run.attempt, error.reason, retry_after_ms, fastrand::f64());
    let what = match delay {
        Some(d) => format!("; retrying in {d} ms (attempt {})", run.attempt + 1),
        None if error.reason == ErrorReason::Fatal => "; fatal, not retried".into(),
        // A storage quota refused one of its effects.
        None if error.reason == ErrorReason::StorageQuota => "; not retried".into(),
        None => "; no retries left".into(),
    };
    if error.reason == ErrorReason::StorageQuota {
        tracing::warn!(error = %error, "attempt failed on a storage quota; not retried");
    } else {
        tracing::info!(error = %error, "attempt failed{what}");
    }
    note(
        records,
        format!("attempt {} failed: {error}{what}", run.attempt),
    );
    Outcome::Failed {
        error,
        retry_in_ms: delay,
        fuel_used: Some(fuel_used),
    }
}

/// `records` with their steps left out (the lines logged before each are kept).
fn without_steps(records: Vec<Record>) -> Vec<Record> {
    records
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { logs, .. } if logs.is_empty() => None,
            Record::Step { logs, .. } => Some(Record::Logs(logs)),
            other => Some(other),
        })
        .collect()
}

/// Loads the component, read from the store once however many attempts want it at once
/// (`Sandbox::load_with`).
pub(crate) async fn ensure_loaded(app: &App, digest: &str) -> Result<(), RunError> {
    let host = |m: String| RunError::new(ErrorReason::Host, m);
    let fetch = || async {
        with_retries(|| app.store.component(digest))
            .await
            .map_err(|e| host(format!("cannot read component {digest}: {e}")))?
            .ok_or_else(|| host(format!("component {digest} is missing from the store")))
    };
    app.sandbox
        .load_with(digest, fetch)
        .await
        .map_err(|e| match e {
            wasq_sandbox::LoadError::Fetch(e) => e,
            wasq_sandbox::LoadError::Load(e) => {
                host(format!("cannot load component {digest}: {e}"))
            }
        })
}

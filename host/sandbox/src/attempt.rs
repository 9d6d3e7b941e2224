//! One attempt: a fresh store and instance from the linked component, the guest's call
//! under its limits (fuel, memory, the epoch-driven deadline and cancellation), and the
//! outcome the caller acts on.

use super::*;

pub(crate) enum Ended {
    Returned(
        Result<
            Result<Vec<u8>, host::bindings::wasq::task::types::RunError>,
            (bool, wasmtime::Error),
        >,
    ),
    Backstop,
    Cancelled,
}

pub(crate) async fn attempt(inner: Arc<Inner>, spec: AttemptSpec, start: Instant) -> AttemptResult {
    let AttemptSpec {
        digest,
        info,
        input,
        limits,
        steps,
        journal,
        cancel,
        allow_hosts,
        traceparent,
        max_outbound_requests,
    } = spec;
    let early = |error| AttemptResult {
        outcome: AttemptOutcome::Failed(error),
        fuel_used: 0,
        peak_memory_bytes: 0,
        duration: start.elapsed(),
        egress_refused: 0,
    };
    let Some(pre) = inner.pre(&digest) else {
        let msg = format!("component {digest} is not loaded on this host");
        return early(failed(ErrorReason::Host, msg));
    };
    // Wait for a pool slot instead of failing to instantiate: a caller that starts more
    // attempts than `max_instances` gets a queue, not spurious Host errors.
    let _slot = tokio::select! {
        biased;
        () = cancel.cancelled() => return early(limits::cancelled()),
        slot = inner.instances.clone().acquire_owned() => slot.ok(),
    };
    // The time limit counts from here: waiting for a slot is not the guest's time.
    let start = Instant::now();
    let finish = |outcome, fuel_used, peak_memory_bytes| AttemptResult {
        outcome,
        fuel_used,
        peak_memory_bytes,
        duration: start.elapsed(),
        egress_refused: 0,
    };

    let memory_limit = limits.memory_bytes.min(inner.config.max_memory_bytes);
    let deadline = start + Duration::from_millis(limits.timeout_ms.min(MAX_TIMEOUT_MS));
    let state = State::new(StateParams {
        info,
        journal,
        steps,
        memory_limit,
        log_bytes: inner.config.log_bytes_per_attempt,
        log_lines: inner.config.log_lines_per_attempt,
        max_output_bytes: inner.config.max_output_bytes,
        inline_sleep_max_ms: inner.config.inline_sleep_max.as_millis() as u64,
        max_durable_ops: inner.config.max_durable_ops,
        deadline,
        cancel: cancel.clone(),
        allow_hosts,
        traceparent,
        egress: {
            let mut egress = inner.config.egress.clone();
            if let Some(n) = max_outbound_requests {
                egress.max_requests_per_attempt = egress.max_requests_per_attempt.min(n);
            }
            egress
        },
        allow_loopback_egress: inner.config.allow_loopback_egress,
        clock: inner.config.clock.clone(),
    });
    let logs = state.logs.clone();
    let ownership = state.ownership.clone();
    let finish = |outcome, fuel_used, peak| finish(abandoned(&ownership, outcome), fuel_used, peak);
    let mut store = Store::new(&inner.engine, state);
    store.limiter(|s| &mut s.limiter);
    if let Err(e) = store.set_fuel(limits.fuel) {
        return finish(
            AttemptOutcome::Failed(failed(ErrorReason::Host, format!("setting fuel: {e}"))),
            0,
            0,
        );
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut cx| {
        let st = cx.data_mut();
        let stop = if let Some(why) = st.ownership.lost() {
            Stop::Abandoned(why)
        } else if st.cancel.is_cancelled() {
            Stop::Cancelled
        } else if Instant::now() >= st.deadline {
            Stop::Timeout
        } else {
            // Yield, not Continue: this is what keeps a spinning guest from holding a
            // runtime thread for longer than one tick. tokio's `yield_now` rather than
            // plain `Yield`: a task that wakes itself is polled again up to the runtime's
            // event interval (61 by default, 8 in a daemon) before it looks at its timers
            // and sockets (measured at 61: a 50 ms timer fired once in 650 ms), while
            // `yield_now` defers the wake-up until it has.
            return Ok(UpdateDeadline::YieldCustom(
                1,
                Box::pin(tokio::task::yield_now()),
            ));
        };
        st.stop = Some(stop.clone());
        Err(wasmtime::Error::new(stop))
    });

    let ended = {
        let call = async {
            let task = pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| (true, e))?;
            task.call_run(&mut store, &input)
                .await
                .map_err(|e| (false, e))
        };
        let backstop = tokio::time::sleep_until((deadline + BACKSTOP_GRACE).into());
        let cancelled = async {
            cancel.cancelled().await;
            tokio::time::sleep(CANCEL_GRACE).await;
        };
        tokio::select! {
            r = call => Ended::Returned(r),
            () = backstop => Ended::Backstop,
            () = cancelled => Ended::Cancelled,
        }
    };
    logs.finish();

    // Exact when the guest returned or ran out of fuel. When an epoch tick stopped it
    // (timeout, cancel) this under-counts: compiled code keeps fuel in a register and
    // writes it back to the store at calls and returns, and wasmtime 48's epoch check
    // does not write it back before its callback. A guest spinning in a call-free loop
    // shows only the fuel burnt before the loop.
    let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
    let st = store.data();
    let peak = st.limiter.peak;
    let refused = st.egress_refused();
    let finish = |outcome, fuel_used, peak| AttemptResult {
        egress_refused: refused,
        ..finish(outcome, fuel_used, peak)
    };
    let result = match ended {
        Ended::Backstop => Err(limits::timeout(limits.timeout_ms)),
        Ended::Cancelled => Err(limits::cancelled()),
        Ended::Returned(Ok(Ok(output))) if output.len() > inner.config.max_output_bytes => {
            Err(failed(
                ErrorReason::Fatal,
                format!(
                    "the run output is {} bytes, over the limit of {} bytes",
                    output.len(),
                    inner.config.max_output_bytes
                ),
            ))
        }
        Ended::Returned(Ok(Ok(output))) => Ok(output),
        Ended::Returned(Ok(Err(guest))) => Err(limits::guest_error(guest)),
        Ended::Returned(Err((_, ref e)))
            if let Some(&Stop::Suspend(until)) = e.downcast_ref::<Stop>() =>
        {
            return finish(AttemptOutcome::Suspended { until }, fuel_used, peak);
        }
        Ended::Returned(Err((_, ref e)))
            if let Some(Stop::Wait(wait)) = e.downcast_ref::<Stop>() =>
        {
            return finish(AttemptOutcome::Waiting(wait.clone()), fuel_used, peak);
        }
        Ended::Returned(Err((instantiating, e))) => Err(limits::classify(
            &e,
            Ending {
                stop: st.stop.as_ref(),
                denied_memory: st.limiter.denied,
                memory_limit,
                fuel_limit: limits.fuel,
                timeout_ms: limits.timeout_ms,
                logs: &logs,
                instantiating,
            },
        )),
    };
    let outcome = match result {
        Ok(output) => AttemptOutcome::Output(output),
        Err(e) => AttemptOutcome::Failed(e),
    };
    finish(outcome, fuel_used, peak)
}

/// An attempt that lost ownership ends as abandoned however the guest stopped (a
/// refused effect traps it; a refused request makes it fail or go on until the next
/// epoch tick): nothing it did after that may be recorded as its end. One whose effect a
/// storage quota refused fails for good with reason `storage_quota`, whatever the guest
/// made of the refusal: it cannot go on, and a retry would meet the same quota.
pub(crate) fn abandoned(ownership: &host::Ownership, outcome: AttemptOutcome) -> AttemptOutcome {
    if let Some(why) = ownership.lost() {
        return AttemptOutcome::Abandoned(why);
    }
    match ownership.storage_refused() {
        Some(why) => AttemptOutcome::Failed(AttemptError {
            error: RunError::new(ErrorReason::StorageQuota, why),
            retry_after_ms: None,
        }),
        None => outcome,
    }
}

//! The durable host functions: steps (stored before the guest goes on, replayed from
//! the claim), sleeps, waits for events and runs, child runs and events. Each checks the
//! attempt still owns its run before the effect.

use tracing::Instrument;
use wasq_core::text::escape_line;

use super::*;

/// Step names are stored with every step and shown in UIs.
pub(crate) const MAX_STEP_NAME_BYTES: usize = 256;

/// What a sleep stores as its step output: the wake-up time, fixed by the first attempt
/// that reached the sleep, so replays neither restart nor shorten it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SleepRecord {
    wake_at: i64,
}

impl State {
    /// The occurrence index of the next step named `name` in this attempt.
    /// Every durable operation (step, sleep, wait, child run, event) goes through here,
    /// which bounds what one attempt can make the store hold: at most
    /// `max_durable_ops` of them, with names of at most [`MAX_STEP_NAME_BYTES`].
    fn next_occurrence(&mut self, name: &str) -> wasmtime::Result<u32> {
        // Before anything else: a worker that lost the run must not start the step body,
        // sleep, wait, child run or event that follows (another worker may be at it).
        self.ownership
            .check()
            .map_err(|why| wasmtime::Error::new(Stop::Abandoned(why)))?;
        if name.len() > MAX_STEP_NAME_BYTES {
            return Err(guest_error(format!(
                "step name of {} bytes is over the limit of {MAX_STEP_NAME_BYTES}",
                name.len()
            )));
        }
        self.durable_ops += 1;
        if self.durable_ops > self.max_durable_ops {
            return Err(guest_error(format!(
                "more than {} durable steps (steps, sleeps, waits, child runs, events) in one run",
                self.max_durable_ops
            )));
        }
        let counter = self.occurrences.entry(name.to_owned()).or_insert(0);
        let occurrence = *counter;
        *counter += 1;
        Ok(occurrence)
    }

    /// The stored output of step (`name`, `occurrence`) if an earlier attempt completed
    /// it: from the claim, or read now when it was too big to come with it. Taken out of
    /// the replay set, so the attempt holds each output once at most.
    async fn stored_output(
        &mut self,
        name: &str,
        occurrence: u32,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        match self.replay.remove(&(name.to_owned(), occurrence)) {
            None => Ok(None),
            Some(Some(output)) => Ok(Some(output)),
            Some(None) => self
                .journal
                .load_step(name, occurrence)
                .await
                .map(Some)
                .map_err(|e| wasmtime::Error::new(Stop::Journal(e))),
        }
    }

    /// A stored step output parsed as `T`; a different shape means the code outside
    /// steps changed what it does at this point between attempts.
    async fn replayed<T: serde::de::DeserializeOwned>(
        &mut self,
        name: &str,
        occurrence: u32,
        what: &str,
    ) -> wasmtime::Result<Option<T>> {
        match self.stored_output(name, occurrence).await? {
            None => Ok(None),
            Some(stored) => serde_json::from_slice(&stored).map(Some).map_err(|_| {
                guest_error(format!(
                    "step {name:?} #{occurrence} was not {what} in an earlier attempt: \
                     the code outside steps is not deterministic"
                ))
            }),
        }
    }

    fn idempotency_key(&self, kind: &str, name: &str, occurrence: u32) -> String {
        format!("{kind}:{}:{name}:{occurrence}", self.info.run_id)
    }

    /// A sleep is a step: its first execution stores the wake-up time; every replay reads
    /// it back. Short remaining waits are slept here; longer ones end the attempt as
    /// suspended, freeing the worker slot until the run is due again.
    async fn durable_sleep(&mut self, name: String, wake_at: i64) -> wasmtime::Result<()> {
        let occurrence = self.next_occurrence(&name)?;
        let wake_at = match self
            .replayed::<SleepRecord>(&name, occurrence, "a sleep")
            .await?
        {
            Some(r) => r.wake_at,
            None => {
                let record = serde_json::to_vec(&SleepRecord { wake_at }).expect("serialises");
                store_step(&self.journal, &name, occurrence, &record).await?;
                wake_at
            }
        };
        let remaining = wake_at.saturating_sub(self.clock.now_ms());
        if remaining <= 0 {
            return Ok(());
        }
        let remaining = Duration::from_millis(remaining as u64);
        let fits = Instant::now() + remaining < self.deadline;
        if remaining.as_millis() as u64 > self.inline_sleep_max_ms || !fits {
            return Err(wasmtime::Error::new(Stop::Suspend(wake_at)));
        }
        tokio::select! {
            () = tokio::time::sleep(remaining) => Ok(()),
            () = self.cancel.cancelled() => Err(wasmtime::Error::new(Stop::Cancelled)),
        }
    }
}

impl step::Host for State {
    async fn begin(&mut self, name: String) -> wasmtime::Result<Option<Vec<u8>>> {
        let occurrence = self.next_occurrence(&name)?;
        match self.stored_output(&name, occurrence).await? {
            Some(output) => Ok(Some(output)),
            None => {
                // From here until its output is stored: the body runs in the guest in
                // between. A child of the attempt's span; at debug level, so a daemon
                // that neither exports spans nor logs at debug makes none.
                let span = tracing::debug_span!(
                    "step",
                    step.name = %escape_line(&name, MAX_STEP_NAME_BYTES),
                    step.occurrence = occurrence,
                );
                self.pending.insert(name, (occurrence, span));
                Ok(None)
            }
        }
    }

    async fn complete(&mut self, name: String, output: Vec<u8>) -> wasmtime::Result<()> {
        let Some((occurrence, span)) = self.pending.remove(&name) else {
            return Err(guest_error(format!(
                "step.complete({name:?}) called without step.begin"
            )));
        };
        if output.len() > self.max_output_bytes {
            return Err(guest_error(format!(
                "step {name:?} output is {} bytes, over the limit of {} bytes",
                output.len(),
                self.max_output_bytes
            )));
        }
        // The guest must not continue past a step whose output is not durable: a crash
        // right after would replay the step's side effects.
        store_step(&self.journal, &name, occurrence, &output)
            .instrument(span)
            .await
    }

    async fn sleep(&mut self, name: String, millis: u64) -> wasmtime::Result<()> {
        let now = self.clock.now_ms();
        let wake_at = now.saturating_add(i64::try_from(millis).unwrap_or(i64::MAX));
        self.durable_sleep(name, wake_at).await
    }

    async fn sleep_until(&mut self, name: String, unix_millis: u64) -> wasmtime::Result<()> {
        let wake_at = i64::try_from(unix_millis).unwrap_or(i64::MAX);
        self.durable_sleep(name, wake_at).await
    }

    async fn wait_for_event(
        &mut self,
        name: String,
        event: String,
        if_: Option<String>,
        timeout_millis: u64,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_event_name(&event).map_err(guest_error)?;
        if let Some(filter) = &if_
            && filter.len() > names::MAX_EVENT_FILTER
        {
            return Err(guest_error(format!(
                "wait-for-event filter of {} bytes is over the limit of {}",
                filter.len(),
                names::MAX_EVENT_FILTER
            )));
        }
        match self
            .replayed::<Resolution>(&name, occurrence, "a wait for an event")
            .await?
        {
            Some(Resolution::Event { data }) => return Ok(Some(data.to_string().into_bytes())),
            Some(Resolution::TimedOut) => return Ok(None),
            Some(_) => {
                return Err(guest_error(format!(
                    "step {name:?} was not a wait for an event"
                )));
            }
            None => {}
        }
        if let Some(filter) = &if_ {
            check_event_filter(filter).map_err(guest_error)?;
        }
        let until = (timeout_millis > 0).then(|| {
            self.clock
                .now_ms()
                .saturating_add(i64::try_from(timeout_millis).unwrap_or(i64::MAX))
        });
        Err(wasmtime::Error::new(Stop::Wait(Wait {
            step: name,
            occurrence,
            on: WaitOn::Event {
                name: event,
                filter: if_,
            },
            until,
        })))
    }

    async fn invoke(
        &mut self,
        name: String,
        function: String,
        input: Vec<u8>,
    ) -> wasmtime::Result<String> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_function_name(&function).map_err(guest_error)?;
        if let Some(r) = self
            .replayed::<ChildRecord>(&name, occurrence, "an invoke")
            .await?
        {
            return Ok(r.run_id);
        }
        let key = self.idempotency_key("child", &name, occurrence);
        let run_id = start_child(&self.journal, &function, &input, &key).await?;
        let record = serde_json::to_vec(&ChildRecord {
            run_id: run_id.clone(),
        })
        .expect("serialises");
        store_step(&self.journal, &name, occurrence, &record).await?;
        Ok(run_id)
    }

    async fn call(
        &mut self,
        name: String,
        function: String,
        input: Vec<u8>,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_function_name(&function).map_err(guest_error)?;
        if let Some(resolution) = self
            .replayed::<Resolution>(&name, occurrence, "a call")
            .await?
        {
            return run_result(&name, resolution);
        }
        let key = self.idempotency_key("child", &name, occurrence);
        let run_id = start_child(&self.journal, &function, &input, &key).await?;
        Err(wait_on_run(name, occurrence, run_id))
    }

    async fn join(
        &mut self,
        name: String,
        run_id: String,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_run_id(&run_id).map_err(guest_error)?;
        if let Some(resolution) = self
            .replayed::<Resolution>(&name, occurrence, "a join")
            .await?
        {
            return run_result(&name, resolution);
        }
        Err(wait_on_run(name, occurrence, run_id))
    }

    async fn send_event(
        &mut self,
        name: String,
        event: String,
        data: Vec<u8>,
    ) -> wasmtime::Result<()> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_event_name(&event).map_err(guest_error)?;
        if self
            .replayed::<serde_json::Value>(&name, occurrence, "a sent event")
            .await?
            .is_some()
        {
            return Ok(());
        }
        let data: serde_json::Value = serde_json::from_slice(&data)
            .map_err(|e| guest_error(format!("send-event {event:?}: the data is not JSON: {e}")))?;
        // The id makes the send exactly-once even if the step record below is lost.
        let id = self.idempotency_key("event", &name, occurrence);
        self.journal
            .send_event(&event, data, &id)
            .await
            .map_err(|e| wasmtime::Error::new(Stop::Journal(e)))?;
        let record =
            serde_json::to_vec(&serde_json::json!({ "event_id": id })).expect("serialises");
        store_step(&self.journal, &name, occurrence, &record).await
    }
}

/// What `invoke` stores: the child's id, returned again on replay.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ChildRecord {
    run_id: String,
}

/// Starts a child run. The key (from the step) makes it exactly-once: a replay before
/// the step is recorded finds the same run.
pub(crate) async fn start_child(
    journal: &Arc<dyn Journal>,
    function: &str,
    input: &[u8],
    key: &str,
) -> wasmtime::Result<String> {
    journal
        .start_run(function, input, key)
        .await
        .map_err(|e| guest_error(e.to_string()))
}

/// Stores a step output before the guest may go on; a failure ends the attempt.
pub(crate) async fn store_step(
    journal: &Arc<dyn Journal>,
    name: &str,
    occurrence: u32,
    output: &[u8],
) -> wasmtime::Result<()> {
    journal
        .complete_step(name, occurrence, output)
        .await
        .map_err(|e| wasmtime::Error::new(Stop::Journal(e)))
}

/// Suspends the run until run `id` ends; its result becomes step (`name`, `occurrence`).
pub(crate) fn wait_on_run(name: String, occurrence: u32, id: String) -> wasmtime::Error {
    wasmtime::Error::new(Stop::Wait(Wait {
        step: name,
        occurrence,
        on: WaitOn::Run { id },
        until: None,
    }))
}

/// A finished `call` / `join`: the run's output, or why it did not succeed.
pub(crate) fn run_result(
    name: &str,
    resolution: Resolution,
) -> wasmtime::Result<Result<Vec<u8>, String>> {
    match resolution {
        Resolution::Output { output } => Ok(Ok(match output {
            // Outputs that were not JSON were stored as strings: give back the text.
            serde_json::Value::String(s) => serde_json::to_vec(&s).expect("serialises"),
            v => v.to_string().into_bytes(),
        })),
        Resolution::Error { message } => Ok(Err(message)),
        _ => Err(guest_error(format!("step {name:?} was not a call or join"))),
    }
}

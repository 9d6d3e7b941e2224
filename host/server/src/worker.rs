//! The worker loop: claim due runs into free slots, run each attempt in the sandbox,
//! stream its logs and steps to the store, and end it with one fenced transition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wasq_core::*;
use wasq_sandbox::{AttemptError, AttemptOutcome, AttemptSpec, Journal, RunInfo};

use crate::App;

/// Attempts in flight in this process, for lease renewal, cancellation and shutdown.
#[derive(Default)]
pub(crate) struct InFlight(Mutex<HashMap<RunId, Arc<Held>>>);

impl InFlight {
    fn held(&self) -> Vec<Arc<Held>> {
        self.0.lock().unwrap().values().cloned().collect()
    }

    fn get(&self, id: &str) -> Option<Arc<Held>> {
        self.0.lock().unwrap().get(id).cloned()
    }

    /// Interrupts the attempt of run `id` if this process runs it: within one epoch tick,
    /// rather than at the next lease renewal.
    pub(crate) fn cancel(&self, id: &str) {
        if let Some(h) = self.get(id) {
            h.cancel.cancel();
        }
    }
}

/// One attempt this process runs: its lease, and what this process knows of it.
///
/// The store fences every write with the lease, but fencing only refuses the *record* of
/// an effect, not the effect: a worker paused (SIGSTOP, a frozen VM, heavy swapping) past
/// its lease would, on waking, start the next step body while another worker runs the
/// same run. So each attempt also keeps a local deadline on this process's monotonic
/// clock, which goes on while the process is stopped: the moment the lease was last
/// granted or extended (taken *before* asking the store, so it is never late) plus the
/// lease, minus a safety margin for clock drift between machines. Past it, the attempt
/// starts nothing more (`Journal::ensure_owned`) and is abandoned.
pub(crate) struct Held {
    lease: Lease,
    cancel: CancellationToken,
    deadline: Mutex<Instant>,
    /// The store said another attempt owns the run now (a renewal, a refused record).
    lost: AtomicBool,
    /// The attempt is recording its end: a renewal racing it finds the run ended, which
    /// is no loss.
    ending: AtomicBool,
}

/// The part of a lease this process counts on: the rest is the margin for clocks of
/// different machines drifting apart and for the time between a check and the effect.
pub(crate) fn trusted_lease(lease: Duration) -> Duration {
    lease - lease / 5
}

impl Held {
    fn new(lease: Lease, cancel: CancellationToken, granted: Instant, lease_len: Duration) -> Held {
        Held {
            lease,
            cancel,
            deadline: Mutex::new(granted + trusted_lease(lease_len)),
            lost: AtomicBool::new(false),
            ending: AtomicBool::new(false),
        }
    }

    /// The store extended the lease at a moment no earlier than `asked`.
    fn extended(&self, asked: Instant, lease_len: Duration) {
        let mut d = self.deadline.lock().unwrap();
        *d = (*d).max(asked + trusted_lease(lease_len));
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.cancel.cancel();
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// `Err(why)` once this process may no longer act for the run.
    fn ensure_owned(&self) -> Result<(), String> {
        if self.is_lost() {
            return Err(LEASE_LOST.into());
        }
        let late = Instant::now().saturating_duration_since(*self.deadline.lock().unwrap());
        if late > Duration::ZERO {
            return Err(format!(
                "this worker's lease on the run ran out {} ms ago by its own clock \
                 (the process was paused or starved): another worker may hold the run now",
                late.as_millis()
            ));
        }
        Ok(())
    }
}

/// How long a worker with a backlog waits for more free slots before claiming.
/// Why an attempt stops once another worker may own its run.
const LEASE_LOST: &str = "the run's lease was lost: another worker took the run over";

const CLAIM_GATHER: Duration = Duration::from_millis(2);

pub async fn run(app: Arc<App>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(app.config.concurrency));
    // Interrupts attempts still running when the grace period after shutdown ends.
    let hard_stop = CancellationToken::new();
    let renewer = tokio::spawn(renew_leases(
        app.clone(),
        shutdown.clone(),
        hard_stop.clone(),
    ));
    let mut attempts = JoinSet::new();
    let mut store_errors = 0u32;
    // The last claim filled every free slot: there is a backlog.
    let mut backlog = false;
    let batch = (app.config.concurrency / 4).max(1) as u32;

    while !shutdown.is_cancelled() {
        let Ok(first) = slots.clone().acquire_owned().await else {
            break;
        };
        // Under a backlog, slots free one by one as attempts end; claiming each alone
        // would cost a claim round trip (and script) per run. Wait a moment for a batch.
        if backlog && batch > 1 && (slots.available_permits() as u32) + 1 < batch {
            let more = slots.clone().acquire_many_owned(batch - 1);
            if let Ok(Ok(more)) = tokio::time::timeout(CLAIM_GATHER, more).await {
                drop(more);
            }
        }
        let free = slots.available_permits() + 1;
        let req = ClaimRequest {
            worker: app.worker_id.clone(),
            limit: free,
            lease_ms: app.config.lease.as_millis() as u64,
        };
        let asked = Instant::now();
        let claimed = match app.store.claim(req).await {
            Ok(c) => {
                store_errors = 0;
                c
            }
            Err(e) => {
                store_errors += 1;
                tracing::warn!(error = %e, "claim failed; backing off");
                drop(first);
                let backoff = Duration::from_millis(100 * 2u64.pow(store_errors.min(6)));
                tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.cancelled() => {} }
                continue;
            }
        };
        backlog = claimed.len() >= free;
        if claimed.is_empty() {
            drop(first);
            tokio::select! {
                _ = app.wake.notified() => {}
                r = app.store.wait_for_work(app.config.poll_interval) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "waiting for work failed");
                        tokio::select! {
                            _ = tokio::time::sleep(app.config.poll_interval) => {}
                            _ = shutdown.cancelled() => {}
                        }
                    }
                }
                _ = shutdown.cancelled() => {}
            }
            continue;
        }
        let mut first = Some(first);
        for c in claimed {
            let permit = match first.take() {
                Some(p) => p,
                // Claimed no more than the free slots, so this never waits for long.
                None => slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("semaphore is never closed"),
            };
            let held = Arc::new(Held::new(
                c.lease.clone(),
                hard_stop.child_token(),
                asked,
                app.config.lease,
            ));
            app.in_flight
                .0
                .lock()
                .unwrap()
                .insert(c.run.id.clone(), held.clone());
            let (app, hard_stop) = (app.clone(), hard_stop.clone());
            let span = tracing::info_span!("attempt", run = %c.run.id, function = %c.run.function, attempt = c.run.attempt);
            attempts.spawn(async move {
                let id = c.run.id.clone();
                attempt(&app, c, held, &hard_stop).instrument(span).await;
                app.in_flight.0.lock().unwrap().remove(&id);
                drop(permit);
            });
        }
        // Reap finished tasks so the set does not grow without bound.
        while attempts.try_join_next().is_some() {}
    }

    // Shutdown: no more claims. Let running attempts finish within the grace period, then
    // interrupt the rest; they give their runs back (Outcome::Released).
    while attempts.try_join_next().is_some() {}
    let n = attempts.len();
    if n > 0 {
        tracing::info!(running = n, grace = ?app.config.shutdown_grace, "waiting for running attempts");
    }
    let grace = tokio::time::sleep(app.config.shutdown_grace);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            next = attempts.join_next() => if next.is_none() { break },
            _ = &mut grace, if !hard_stop.is_cancelled() => {
                tracing::warn!(running = attempts.len(), "grace period over; interrupting and releasing");
                hard_stop.cancel();
            }
        }
    }
    hard_stop.cancel();
    let _ = renewer.await;
}

async fn renew_leases(app: Arc<App>, shutdown: CancellationToken, hard_stop: CancellationToken) {
    let every = app.config.lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = hard_stop.cancelled() => return,
        }
        let held = app.in_flight.held();
        if held.is_empty() {
            if shutdown.is_cancelled() {
                return;
            }
            continue;
        }
        let leases: Vec<Lease> = held.iter().map(|h| h.lease.clone()).collect();
        let asked = Instant::now();
        let renewal = match app
            .store
            .renew(&leases, app.config.lease.as_millis() as u64)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Deadlines stay where they were: attempts stop starting effects once
                // theirs passes, as they should when the lease cannot be kept.
                tracing::warn!(error = %e, "lease renewal failed");
                continue;
            }
        };
        for h in &held {
            let id = &h.lease.run_id;
            if renewal.lost.contains(id) {
                if h.ending.load(Ordering::SeqCst) {
                    // Its end was recorded while the renewal was on its way.
                    continue;
                }
                tracing::warn!(run = %id, "lease lost: another worker took the run over; abandoning the attempt");
                h.lose();
            } else if renewal.cancelling.contains(id) {
                tracing::info!(run = %id, "cancellation requested; interrupting the attempt");
                h.cancel.cancel();
            } else {
                h.extended(asked, app.config.lease);
            }
        }
    }
}

/// Streams an attempt's logs and progress to the store in batches, and stores steps
/// synchronously (a step is durable before the guest moves on), together with the log
/// lines written before it: a crash never keeps a step without the lines its body logged,
/// nor those lines without the step.
struct StoreJournal {
    app: Arc<App>,
    tenant: String,
    held: Arc<Held>,
    /// Why the store refused something for a storage quota, if it did: the attempt then
    /// fails for good with reason `storage_quota`, whatever the guest made of the refusal.
    storage_refused: std::sync::Mutex<Option<String>>,
    pending: std::sync::Mutex<Pending>,
    /// Held while taking and writing pending records, so lines are stored in order.
    writing: tokio::sync::Mutex<()>,
    flush: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Pending {
    logs: Vec<LogLine>,
    progress: Option<Progress>,
}

impl StoreJournal {
    /// Notes a storage-quota refusal (see `storage_refused`).
    fn refused(&self, e: &StoreError) {
        if let StoreError::StorageQuota(msg) = e {
            self.storage_refused
                .lock()
                .unwrap()
                .get_or_insert_with(|| msg.clone());
        }
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap())
    }

    /// Writes what is pending (batched by the caller's timing).
    async fn flush_pending(&self) {
        let _order = self.writing.lock().await;
        let Pending { logs, progress } = self.take();
        let lease = &self.held.lease;
        if self.held.is_lost() {
            // Nothing of an abandoned attempt is recorded.
            return;
        }
        if !logs.is_empty() {
            match with_retries(|| self.app.store.record(lease, Record::Logs(logs.clone()))).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost(_)) => self.held.lose(),
                Err(e) => tracing::warn!(run = %lease.run_id, error = %e, "dropping log lines"),
            }
        }
        if let Some(p) = progress {
            let _ = self.app.store.record(lease, Record::Progress(p)).await;
        }
    }

    /// Ends the flusher after a last flush.
    fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.flush.notify_one();
    }
}

/// Flushes pending lines every 50 ms while there are any, until the journal is closed.
async fn flush_records(journal: Arc<StoreJournal>) {
    loop {
        journal.flush.notified().await;
        let closed = journal.closed.load(std::sync::atomic::Ordering::SeqCst);
        if !closed {
            // Batch what arrives within a short window rather than one write per line.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        journal.flush_pending().await;
        if closed {
            return;
        }
    }
}

#[async_trait::async_trait]
impl Journal for StoreJournal {
    async fn complete_step(
        &self,
        name: &str,
        occurrence: u32,
        output: &[u8],
    ) -> Result<(), String> {
        let _order = self.writing.lock().await;
        let logs = std::mem::take(&mut self.pending.lock().unwrap().logs);
        let rec = Record::Step {
            name: name.into(),
            occurrence,
            output: output.to_vec(),
            logs,
        };
        with_retries(|| self.app.store.record(&self.held.lease, rec.clone()))
            .await
            .map_err(|e| {
                if let StoreError::LeaseLost(_) = e {
                    self.held.lose();
                }
                self.refused(&e);
                format!("could not store step {name:?}: {e}")
            })
    }

    async fn send_event(
        &self,
        event: &str,
        data: serde_json::Value,
        id: &str,
    ) -> Result<(), String> {
        let req = EventRequest {
            tenant: self.tenant.clone(),
            name: event.into(),
            data,
            id: Some(id.into()),
        };
        with_retries(|| self.app.store.send_event(req.clone()))
            .await
            .map_err(|e| {
                self.refused(&e);
                format!("could not send event {event:?}: {e}")
            })?;
        self.app.wake.notify_one();
        Ok(())
    }

    async fn start_run(&self, function: &str, input: &[u8], key: &str) -> Result<String, String> {
        // New work: refused while the store is nearly full (the attempt fails and is
        // retried later; the store guard's reason says why).
        if let Some(reason) = self.app.guard.refusing() {
            return Err(format!("cannot start a run of {function:?} now: {reason}"));
        }
        let req = EnqueueRequest {
            tenant: self.tenant.clone(),
            function: function.into(),
            input: input.to_vec(),
            trigger: format!("child:{}", self.held.lease.run_id),
            due_at: None,
            idempotency_key: Some(key.into()),
            retry: None,
            parent: Some(self.held.lease.run_id.clone()),
            priority: None,
        };
        let enqueued = with_retries(|| self.app.store.enqueue(req.clone()))
            .await
            .map_err(|e| {
                self.refused(&e);
                match e {
                    StoreError::NotFound(_) => {
                        format!("cannot start a run of {function:?}: no such function")
                    }
                    e => format!("cannot start a run of {function:?}: {e}"),
                }
            })?;
        self.app.wake.notify_one();
        Ok(enqueued.run.id)
    }

    async fn load_step(&self, name: &str, occurrence: u32) -> Result<Vec<u8>, String> {
        let id = &self.held.lease.run_id;
        with_retries(|| self.app.store.step(&self.tenant, id, name, occurrence))
            .await
            .map_err(|e| format!("could not read step {name:?} #{occurrence}: {e}"))?
            .map(|s| s.output)
            .ok_or_else(|| format!("step {name:?} #{occurrence} vanished from the store"))
    }

    fn log(&self, line: LogLine) {
        self.pending.lock().unwrap().logs.push(line);
        self.flush.notify_one();
    }

    fn progress(&self, progress: Progress) {
        self.pending.lock().unwrap().progress = Some(progress);
        self.flush.notify_one();
    }

    fn ensure_owned(&self) -> Result<(), String> {
        self.held.ensure_owned()
    }
}

/// Tenants' quotas as the worker applies them, re-read at most every few seconds so an
/// attempt costs no directory lookup.
#[derive(Default)]
pub(crate) struct QuotaCache(Mutex<HashMap<String, (Quotas, std::time::Instant)>>);

impl QuotaCache {
    const FRESH: Duration = Duration::from_secs(5);

    pub(crate) async fn get(&self, app: &App, tenant: &str) -> Quotas {
        if let Some((q, at)) = self.0.lock().unwrap().get(tenant)
            && at.elapsed() < Self::FRESH
        {
            return *q;
        }
        let quotas = match app.directory.tenant(tenant).await {
            Ok(Some(t)) => t.quotas,
            Ok(None) => app.config.default_quotas,
            Err(e) => {
                tracing::warn!(tenant, error = %e, "cannot read the tenant's quotas; using the defaults");
                app.config.default_quotas
            }
        };
        self.0
            .lock()
            .unwrap()
            .insert(tenant.to_owned(), (quotas, std::time::Instant::now()));
        quotas
    }
}

/// Retries a store call while the store says a retry can help.
async fn with_retries<T, F, Fut>(mut f: F) -> Result<T, StoreError>
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
async fn finish_while_leased(
    app: &App,
    lease: &Lease,
    outcome: &Outcome,
) -> Result<wasq_core::Run, StoreError> {
    // Renewals kept the lease alive until about now; one lease length later it has surely
    // expired and another worker may hold the run, so retrying longer is pointless (the
    // store's fence rejects a stale finish either way).
    let until = SystemClock.now_ms() + app.config.lease.as_millis() as i64;
    let mut delay = Duration::from_millis(50);
    loop {
        match app.store.finish(lease, outcome.clone()).await {
            Err(e) if e.is_retryable() && SystemClock.now_ms() < until => {
                tracing::warn!(error = %e, "recording the end of the attempt failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

fn host_line(attempt: u32, level: LogLevel, message: String) -> LogLine {
    LogLine {
        attempt,
        at: SystemClock.now_ms(),
        level,
        source: LogSource::Host,
        message,
    }
}

async fn attempt(app: &Arc<App>, claimed: Claimed, held: Arc<Held>, hard_stop: &CancellationToken) {
    let Claimed { run, lease, steps } = claimed;
    let cancel = held.cancel.clone();
    let journal = Arc::new(StoreJournal {
        app: app.clone(),
        tenant: run.tenant.clone(),
        held: held.clone(),
        storage_refused: Default::default(),
        pending: Default::default(),
        writing: Default::default(),
        flush: Default::default(),
        closed: Default::default(),
    });
    let flusher = tokio::spawn(flush_records(journal.clone()));

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
        },
    };

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
        app.metrics
            .attempt(&run.tenant, "abandoned", result.duration);
        journal.close();
        let _ = flusher.await;
        return;
    }
    let outcome = match result.outcome {
        // Returned above.
        AttemptOutcome::Abandoned(_) => return,
        AttemptOutcome::Output(output) => {
            tracing::info!(duration = ?result.duration, fuel = result.fuel_used, "attempt succeeded");
            Outcome::Succeeded {
                output,
                fuel_used: Some(result.fuel_used),
            }
        }
        AttemptOutcome::Suspended { until } => {
            tracing::info!(until, "run sleeps");
            Outcome::Suspended {
                until,
                fuel_used: Some(result.fuel_used),
            }
        }
        AttemptOutcome::Waiting(wait) => {
            tracing::info!(step = %wait.step, "run waits");
            Outcome::Waiting {
                wait,
                fuel_used: Some(result.fuel_used),
            }
        }
        // Interrupted by shutdown, not by the guest: hand the run back untouched.
        AttemptOutcome::Failed(_) if hard_stop.is_cancelled() => Outcome::Released,
        AttemptOutcome::Failed(AttemptError {
            error,
            retry_after_ms,
        }) => {
            let delay = run.settings.retry.retry_delay(
                run.attempt,
                error.reason,
                retry_after_ms,
                fastrand::f64(),
            );
            let what = match delay {
                Some(d) => format!("; retrying in {d} ms (attempt {})", run.attempt + 1),
                None if error.reason == ErrorReason::Fatal => "; fatal, not retried".into(),
                None => "; no retries left".into(),
            };
            tracing::info!(error = %error, "attempt failed{what}");
            journal.log(host_line(
                run.attempt,
                LogLevel::Error,
                format!("attempt {} failed: {error}{what}", run.attempt),
            ));
            Outcome::Failed {
                error,
                retry_in_ms: delay,
                fuel_used: Some(result.fuel_used),
            }
        }
    };
    // A storage quota refused a step, an event or a child run: the run cannot go on,
    // and retrying would only hit the quota again.
    let storage_refused = journal.storage_refused.lock().unwrap().take();
    let outcome = match storage_refused {
        Some(why) if !matches!(outcome, Outcome::Released) => {
            storage_quota_failure(&journal, &run, why, result.fuel_used)
        }
        _ => outcome,
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
    app.metrics.attempt(&run.tenant, label, result.duration);
    journal.close();
    let _ = flusher.await;
    held.ending.store(true, Ordering::SeqCst);
    let mut ended = finish_while_leased(app, &lease, &outcome).await;
    if let Err(StoreError::StorageQuota(why)) = &ended {
        // The output did not fit: the run fails instead (an error is always stored).
        let failed = storage_quota_failure(&journal, &run, why.clone(), result.fuel_used);
        journal.flush_pending().await;
        ended = finish_while_leased(app, &lease, &failed).await;
    }
    match ended {
        Ok(run) => {
            tracing::debug!(status = %run.status, "attempt recorded");
            // Its end may have resumed a run waiting for it, or it may be due again now.
            app.wake.notify_one();
            if run.status.is_terminal() {
                let _ = app.finished.send(run.id);
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

/// The end of an attempt that hit a storage quota: failed for good, with the reason
/// logged.
fn storage_quota_failure(
    journal: &StoreJournal,
    run: &wasq_core::Run,
    why: String,
    fuel_used: u64,
) -> Outcome {
    let error = RunError::new(ErrorReason::StorageQuota, why);
    tracing::warn!(error = %error, "attempt failed on a storage quota; not retried");
    journal.log(host_line(
        run.attempt,
        LogLevel::Error,
        format!("attempt {} failed: {error}; not retried", run.attempt),
    ));
    Outcome::Failed {
        error,
        retry_in_ms: None,
        fuel_used: Some(fuel_used),
    }
}

async fn ensure_loaded(app: &App, digest: &str) -> Result<(), RunError> {
    if app.sandbox.is_loaded(digest) {
        return Ok(());
    }
    let host = |m: String| RunError::new(ErrorReason::Host, m);
    let bytes = with_retries(|| app.store.component(digest))
        .await
        .map_err(|e| host(format!("cannot read component {digest}: {e}")))?
        .ok_or_else(|| host(format!("component {digest} is missing from the store")))?;
    app.sandbox
        .load(digest, &bytes)
        .await
        .map_err(|e| host(format!("cannot load component {digest}: {e}")))
}

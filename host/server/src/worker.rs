//! The worker loop: claim due runs into free slots, run each attempt in the sandbox,
//! stream its logs and steps to the store, and end it with one fenced transition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wasq_core::*;
use wasq_sandbox::{AttemptError, AttemptOutcome, AttemptSpec, Journal, JournalError, RunInfo};

use crate::App;

mod attempt;
mod beat;
mod finisher;
mod journal;

use attempt::*;
use finisher::Finisher;
use journal::*;

/// Attempts in flight in this process, for lease renewal, cancellation and shutdown.
#[derive(Default)]
pub(crate) struct InFlight {
    attempts: Mutex<HashMap<RunId, Arc<Held>>>,
    /// The attempts whose guest still runs (the others are storing their end): the
    /// execution slots in use, kept by [`Slot`].
    executing: AtomicUsize,
}

impl InFlight {
    /// Attempts in this process whose guest runs: its execution slots in use.
    pub(crate) fn executing(&self) -> usize {
        self.executing.load(Ordering::SeqCst)
    }

    fn held(&self) -> Vec<Arc<Held>> {
        self.attempts.lock().unwrap().values().cloned().collect()
    }

    fn get(&self, id: &str) -> Option<Arc<Held>> {
        self.attempts.lock().unwrap().get(id).cloned()
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

/// A claimed run's place in this worker: one of the `concurrency` execution slots while
/// its guest runs, then one of as many places for an end being stored. A slot frees when
/// the guest is done, not when its end is stored: the next claim and the next guests then
/// overlap the finish script on Redis, where holding the slot made the worker and Redis
/// take turns (a drain ran at about the sum of their per-run costs, not the larger).
/// The places for ends bound what waits for the store to `concurrency` more runs.
pub(crate) struct Slot {
    app: Arc<App>,
    executing: Option<tokio::sync::OwnedSemaphorePermit>,
    ends: Arc<Semaphore>,
    ending: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Slot {
    pub(crate) fn new(
        app: Arc<App>,
        permit: tokio::sync::OwnedSemaphorePermit,
        ends: Arc<Semaphore>,
    ) -> Slot {
        app.in_flight.executing.fetch_add(1, Ordering::SeqCst);
        Slot {
            app,
            executing: Some(permit),
            ends,
            ending: None,
        }
    }

    /// The guest is done: take a place among the ends, then free the execution slot.
    pub(crate) async fn executed(&mut self) {
        if self.ending.is_none()
            && let Ok(p) = self.ends.clone().acquire_owned().await
        {
            self.ending = Some(p);
        }
        self.free();
    }

    fn free(&mut self) {
        if self.executing.take().is_some() {
            self.app.in_flight.executing.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.free();
    }
}

/// Why an attempt stops once another worker may own its run.
const LEASE_LOST: &str = "the run's lease was lost: another worker took the run over";

/// How long a worker with a backlog waits for more free slots before claiming.
const CLAIM_GATHER: Duration = Duration::from_millis(2);

pub(crate) async fn run(app: Arc<App>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(app.config.concurrency));
    let ends = Arc::new(Semaphore::new(app.config.concurrency));
    // Interrupts attempts still running when the grace period after shutdown ends.
    let hard_stop = CancellationToken::new();
    let renewer = tokio::spawn(renew_leases(
        app.clone(),
        shutdown.clone(),
        hard_stop.clone(),
    ));
    let finisher = Finisher::spawn(app.store.clone());
    let beating = CancellationToken::new();
    let beats = tokio::spawn(beat::run(app.clone(), beating.clone()));
    let mut attempts = JoinSet::new();
    let mut store_errors = 0u32;
    // The last claim filled every free slot: there is a backlog.
    let mut backlog = false;
    let batch = (app.config.concurrency / 4).max(1) as u32;

    // Claims made: every few puts a later queue first (wasq_core::queues::claim_order).
    let mut claims: u64 = 0;
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
            queues: wasq_core::queues::claim_order(&app.config.queues, claims),
        };
        claims += 1;
        let asked = Instant::now();
        let claimed = match app.store.claim(req).await {
            Ok(c) => {
                store_errors = 0;
                app.metrics.store_call("claim", asked.elapsed());
                let now = app.now();
                for c in &c {
                    app.metrics.claimed(&c.run.tenant, now - c.run.due_at);
                }
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
            if app.config.burst {
                // Nothing due now: done once the attempts started have ended (one of
                // them may requeue its run, due at once: claim again after each).
                if attempts.is_empty() {
                    break;
                }
                tokio::select! {
                    _ = attempts.join_next() => {}
                    _ = shutdown.cancelled() => {}
                }
                continue;
            }
            wait_for_work(&app, &shutdown).await;
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
                .attempts
                .lock()
                .unwrap()
                .insert(c.run.id.clone(), held.clone());
            let (app, hard_stop, finisher) = (app.clone(), hard_stop.clone(), finisher.clone());
            let slot = Slot::new(app.clone(), permit, ends.clone());
            let span = tracing::info_span!("attempt", run = %c.run.id, function = %c.run.function, attempt = c.run.attempt);
            // Every execution continues the trace of what created the run, in whatever
            // process that was (telemetry.rs).
            if let Some(parent) = &c.run.trace {
                crate::telemetry::continue_from(&span, parent);
            }
            // Boxed: an attempt's future holds the whole sandbox call (kilobytes), and
            // tokio moves a task's future by value into its cell and its stages (a
            // memmove of that size each time: ~4% of a drain's worker CPU in a profile).
            attempts.spawn(Box::pin(async move {
                let id = c.run.id.clone();
                attempt(&app, &finisher, c, held, &hard_stop, slot)
                    .instrument(span)
                    .await;
                app.in_flight.attempts.lock().unwrap().remove(&id);
            }));
        }
        // Reap finished tasks so the set does not grow without bound.
        while attempts.try_join_next().is_some() {}
        if !backlog && !app.config.burst {
            // The store had no more due runs than this: asking again at once would find
            // none. New work wakes the loop (a create here, a wake-up from the store).
            wait_for_work(&app, &shutdown).await;
        }
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
    beating.cancel();
    let _ = beats.await;
    beat::leave(&app).await;
}

/// Returns when work may have become claimable: created in this process, announced by
/// the store, due by the poll interval, or at shutdown.
async fn wait_for_work(app: &App, shutdown: &CancellationToken) {
    tokio::select! {
        _ = app.wake.notified() => {}
        r = app.store.wait_for_work(app.config.poll_interval, &app.config.queues) => {
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
        let quotas = match app.store.tenant(tenant).await {
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

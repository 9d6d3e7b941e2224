//! The rules of a run's life, as pure functions: each takes what a store read of a run
//! (and the clock's now) and returns the [`Transition`] the store must write. A backend
//! applies transitions — in SQL, or as data handed to a Redis script — and decides
//! nothing itself; the conformance suite checks that every backend applies them alike.
//!
//! What lives here: how an attempt ends in each [`Outcome`] (and how a requested cancel
//! overrides it), what a lost lease does (requeue, or fail past its cap), the resolution a
//! run's waiters receive once it ended, which statuses a cancel or a manual retry accepts
//! and the budget a retry grants, the attempt number a claim starts, and admission against
//! `max_queued`, and which starts a throttle counts and which runs a debounce key may
//! replace. What does not: indexes, leases and fences, storage accounting (see
//! [`crate::storage`]) and when a flow-control gate is full (see [`crate::flow::Gate`]),
//! which are mechanics of each backend or have their own module.

mod on_failure;

pub use on_failure::{HANDLER_TRIGGER, failure_handler};

use crate::clock::Millis;
use crate::flow::FlowPlan;
use crate::model::*;
use crate::store::{Outcome, QUOTA_RETRY_AFTER_MS, StoreError};

/// How one field of a run changes in a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<T> {
    Keep,
    Set(T),
    Clear,
}

/// How the run's latest execution (its row in the run's history) ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// Closed now, with what it ended with.
    Close {
        error: Option<RunError>,
        fuel_used: Option<u64>,
        /// Set when the execution ended by sleeping or waiting: until when.
        suspended_until: Option<Millis>,
    },
    /// Removed, as if it never started (a released run: given back uncounted).
    Drop,
}

/// What the tenant's usage (billing) gets from a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Executions ended (0 or 1).
    pub executions: u64,
    pub fuel: Option<u64>,
}

/// One state change of a run, as every backend writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub status: RunStatus,
    pub error: Change<RunError>,
    /// The output of a run that succeeded.
    pub output: Option<Vec<u8>>,
    /// `None`: unchanged.
    pub due_at: Option<Millis>,
    /// Set when the run ends.
    pub finished_at: Option<Millis>,
    /// The attempt is given back (a release of a fresh attempt): the run's `attempt` goes
    /// down by one, so the next claim starts the same number again.
    pub give_back_attempt: bool,
    /// `None`: the run's history is left alone (the run was not running).
    pub execution: Option<Execution>,
    /// Set when the run ends: what the runs waiting for it receive.
    pub resolution: Option<Resolution>,
    pub usage: Usage,
    /// What a run that is now `waiting` waits for.
    pub wait: Option<Wait>,
    /// A pending cancel is forgotten (the run was queued again).
    pub clear_cancel: bool,
}

impl Transition {
    fn to(status: RunStatus, execution: Option<Execution>) -> Self {
        Transition {
            status,
            error: Change::Keep,
            output: None,
            due_at: None,
            finished_at: None,
            give_back_attempt: false,
            execution,
            resolution: None,
            usage: Usage::default(),
            wait: None,
            clear_cancel: false,
        }
    }
}

/// What a store knows of a run whose attempt is ending.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    pub id: &'a str,
    /// Its cancellation was requested while it ran.
    pub cancel_requested: bool,
    /// The execution resumed a sleeping run instead of starting an attempt.
    pub resumed: bool,
}

/// How an attempt ends ([`crate::Store::finish`]). A run whose cancellation was requested
/// ends as cancelled, keeping the cancel's reason as its error, unless it succeeded.
pub fn finish(run: Ending<'_>, outcome: &Outcome, now: Millis) -> Transition {
    let counted = |fuel: &Option<u64>| Usage {
        executions: 1,
        fuel: *fuel,
    };
    if run.cancel_requested && !matches!(outcome, Outcome::Succeeded { .. }) {
        let (error, fuel_used) = match outcome {
            Outcome::Failed {
                error, fuel_used, ..
            } => (Some(error.clone()), *fuel_used),
            _ => (None, None),
        };
        let usage = match outcome {
            Outcome::Succeeded { fuel_used, .. }
            | Outcome::Failed { fuel_used, .. }
            | Outcome::Suspended { fuel_used, .. }
            | Outcome::Waiting { fuel_used, .. } => counted(fuel_used),
            Outcome::Released => Usage::default(),
        };
        let mut t = Transition::to(
            RunStatus::Cancelled,
            Some(Execution::Close {
                error,
                fuel_used,
                suspended_until: None,
            }),
        );
        t.finished_at = Some(now);
        t.resolution = Some(cancelled_resolution(run.id));
        t.usage = usage;
        return t;
    }
    match outcome {
        Outcome::Succeeded { output, fuel_used } => {
            let mut t = Transition::to(
                RunStatus::Succeeded,
                Some(Execution::Close {
                    error: None,
                    fuel_used: *fuel_used,
                    suspended_until: None,
                }),
            );
            t.error = Change::Clear;
            t.output = Some(output.clone());
            t.finished_at = Some(now);
            t.resolution = Some(Resolution::Output {
                output: bytes_as_json::to_value(output),
            });
            t.usage = counted(fuel_used);
            t
        }
        Outcome::Failed {
            error,
            retry_in_ms,
            fuel_used,
        } => {
            let execution = Some(Execution::Close {
                error: Some(error.clone()),
                fuel_used: *fuel_used,
                suspended_until: None,
            });
            let mut t = match retry_in_ms {
                Some(d) => {
                    // Backoff is measured from the recorded end of the attempt.
                    let mut t = Transition::to(RunStatus::Queued, execution);
                    t.due_at = Some(now.saturating_add(*d as i64));
                    t
                }
                None => {
                    let mut t = Transition::to(RunStatus::Failed, execution);
                    t.finished_at = Some(now);
                    t.resolution = Some(failed_resolution(error));
                    t
                }
            };
            t.error = Change::Set(error.clone());
            t.usage = counted(fuel_used);
            t
        }
        Outcome::Suspended { until, fuel_used } => {
            let mut t = Transition::to(
                RunStatus::Sleeping,
                Some(Execution::Close {
                    error: None,
                    fuel_used: None,
                    suspended_until: Some(*until),
                }),
            );
            t.due_at = Some(*until);
            t.usage = counted(fuel_used);
            t
        }
        Outcome::Waiting { wait, fuel_used } => {
            // Due when the wait times out; a wait without a timeout never comes due.
            let due = wait.until.unwrap_or(Millis::MAX);
            let mut t = Transition::to(
                RunStatus::Waiting,
                Some(Execution::Close {
                    error: None,
                    fuel_used: None,
                    suspended_until: Some(due),
                }),
            );
            t.due_at = Some(due);
            t.wait = Some(wait.clone());
            t.usage = counted(fuel_used);
            t
        }
        Outcome::Released => {
            // Put back exactly as it was claimed: a resumed sleeper stays a resume (same
            // attempt), a fresh attempt is given back uncounted. Due now either way.
            let status = if run.resumed {
                RunStatus::Sleeping
            } else {
                RunStatus::Queued
            };
            let mut t = Transition::to(status, Some(Execution::Drop));
            t.due_at = Some(now);
            t.give_back_attempt = !run.resumed;
            t
        }
    }
}

/// A run whose worker vanished is handed out again, even past `max_attempts`, because the
/// loss was usually not the guest's doing; after this many extra attempts it is the guest's.
pub const MAX_LOST_LEASE_EXTRA_ATTEMPTS: u32 = 3;

/// What a store knows of a run whose lease expired.
#[derive(Debug, Clone, Copy)]
pub struct Expired<'a> {
    pub id: &'a str,
    pub attempt: u32,
    /// Its attempts in all, with the grants of manual retries.
    pub max_attempts: u32,
    /// The worker that held the lease, if known.
    pub worker: Option<&'a str>,
    pub cancel_requested: bool,
}

/// A run whose worker stopped renewing its lease: queued again, or (past
/// [`MAX_LOST_LEASE_EXTRA_ATTEMPTS`]) failed for good; a run whose cancel was requested
/// ends cancelled and keeps the cancel's reason. The execution records the lost lease.
pub fn lease_expired(run: Expired<'_>, now: Millis) -> Transition {
    let error = RunError::new(
        ErrorReason::LeaseExpired,
        format!(
            "worker {} stopped renewing its lease during attempt {}",
            run.worker.unwrap_or("?"),
            run.attempt
        ),
    );
    let execution = Some(Execution::Close {
        error: Some(error.clone()),
        fuel_used: None,
        suspended_until: None,
    });
    let mut t = if run.cancel_requested {
        let mut t = Transition::to(RunStatus::Cancelled, execution);
        t.finished_at = Some(now);
        t.resolution = Some(cancelled_resolution(run.id));
        t
    } else if lease_loss_is_final(run.attempt, run.max_attempts) {
        let mut t = Transition::to(RunStatus::Failed, execution);
        t.error = Change::Set(error.clone());
        t.finished_at = Some(now);
        t.resolution = Some(failed_resolution(&error));
        t
    } else {
        let mut t = Transition::to(RunStatus::Queued, execution);
        t.error = Change::Set(error);
        t
    };
    t.due_at = Some(now);
    t
}

/// Whether a lost lease ends the run: its attempts reached `max_attempts` plus the extra
/// attempts lost leases get.
pub fn lease_loss_is_final(attempt: u32, max_attempts: u32) -> bool {
    attempt >= max_attempts.saturating_add(MAX_LOST_LEASE_EXTRA_ATTEMPTS)
}

/// The attempt a claim starts (and whether it resumes one): waking from a sleep continues
/// the attempt; anything else starts the next one.
pub fn claimed_attempt(status: RunStatus, attempt: u32) -> (u32, bool) {
    if status == RunStatus::Sleeping {
        (attempt.max(1), true)
    } else {
        (attempt + 1, false)
    }
}

/// Whether starting a run in `status` at `attempt` counts against its throttle: only
/// first starts do (a run that never started); a retry or a resume after a sleep or a
/// wait is not throttled.
pub fn throttles_start(status: RunStatus, attempt: u32) -> bool {
    never_started(status, attempt)
}

/// Whether a run in `status` at `attempt` is still pending for its debounce key, so that a
/// newer run with the same key replaces it: only while it never started.
pub fn debounce_replaces(status: RunStatus, attempt: u32) -> bool {
    never_started(status, attempt)
}

fn never_started(status: RunStatus, attempt: u32) -> bool {
    status == RunStatus::Queued && attempt == 0
}

/// What the runs waiting on a run that ended receive; `None` while it has not ended.
pub fn resolution(run: &Run) -> Option<Resolution> {
    match run.status {
        RunStatus::Succeeded => Some(Resolution::Output {
            output: bytes_as_json::to_value(run.output.as_deref().unwrap_or_default()),
        }),
        RunStatus::Failed => Some(match &run.error {
            Some(e) => failed_resolution(e),
            None => Resolution::Error {
                message: "failed".to_owned(),
            },
        }),
        RunStatus::Cancelled => Some(cancelled_resolution(&run.id)),
        RunStatus::Skipped => Some(skipped_resolution(
            &run.id,
            run.error
                .as_ref()
                .unwrap_or(&RunError::new(ErrorReason::Host, "skipped")),
        )),
        _ => None,
    }
}

fn failed_resolution(error: &RunError) -> Resolution {
    Resolution::Error {
        message: error.to_string(),
    }
}

/// What the waiters of a cancelled run receive.
pub fn cancelled_resolution(id: &str) -> Resolution {
    Resolution::Error {
        message: format!("run {id} was cancelled"),
    }
}

/// What the waiters of a skipped run (rate limit, debounce) receive.
pub fn skipped_resolution(id: &str, error: &RunError) -> Resolution {
    Resolution::Error {
        message: format!("run {id} was skipped: {error}"),
    }
}

/// What a `call` of a run that does not exist (or is another tenant's) receives.
pub fn missing_run_resolution(id: &str) -> Resolution {
    Resolution::Error {
        message: format!("run {id} not found"),
    }
}

/// A run that ends skipped as it is created (over its rate limit) or before it started
/// (replaced by a later run of its debounce key).
pub fn skip(id: &str, error: RunError, now: Millis) -> Transition {
    let mut t = Transition::to(RunStatus::Skipped, None);
    t.resolution = Some(skipped_resolution(id, &error));
    t.error = Change::Set(error);
    t.finished_at = Some(now);
    t
}

/// The error a run over its rate limit is skipped with.
pub fn rate_limited_error(plan: &FlowPlan) -> RunError {
    let (limit, period) = plan
        .rate_limit
        .as_ref()
        .map_or((0, 0), |g| (g.limit, g.period_ms));
    let key = match &plan.keys.rate_limit {
        Some(k) => format!(" for key {k:?}"),
        None => String::new(),
    };
    RunError::new(
        ErrorReason::RateLimited,
        format!("rate limit of {limit} per {period} ms reached{key}; the run was dropped"),
    )
}

/// The error a debounced run is skipped with when `successor` replaces it.
pub fn debounced_error(successor: &str) -> RunError {
    RunError::new(
        ErrorReason::Debounced,
        format!("replaced by run {successor} with the same debounce key"),
    )
}

/// The statuses a cancel accepts: every status but the terminal ones.
pub const CANCELLABLE: [RunStatus; 4] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::Sleeping,
    RunStatus::Waiting,
];

/// The statuses a manual retry accepts.
pub const RETRYABLE: [RunStatus; 2] = [RunStatus::Failed, RunStatus::Cancelled];

/// A cancel of a run in `status`: `Ok(None)` for a running run (it is marked, and ends
/// cancelled when its attempt ends: see [`finish`]), `Ok(Some(t))` for a run that ends
/// now, an error for a run that already ended.
pub fn cancel(
    id: &str,
    status: RunStatus,
    error: RunError,
    now: Millis,
) -> Result<Option<Transition>, StoreError> {
    if !CANCELLABLE.contains(&status) {
        return Err(not_cancellable(id, status));
    }
    if status == RunStatus::Running {
        return Ok(None);
    }
    let mut t = Transition::to(RunStatus::Cancelled, None);
    t.error = Change::Set(error);
    t.finished_at = Some(now);
    t.resolution = Some(cancelled_resolution(id));
    Ok(Some(t))
}

pub fn not_cancellable(id: &str, status: RunStatus) -> StoreError {
    StoreError::Conflict(format!("run {id} is already {status}"))
}

/// A manual retry of a run in `status` that has started `attempt` attempts: queued again
/// (due now, a pending cancel forgotten) with a fresh budget of attempts — its
/// `max_attempts` grows by `attempt` — or an error when it has not failed or been
/// cancelled. The tenant's `max_queued` applies as to a new run ([`admit`]).
pub fn retry(id: &str, status: RunStatus, attempt: u32, now: Millis) -> Result<Retry, StoreError> {
    if !RETRYABLE.contains(&status) {
        return Err(not_retryable(id, status));
    }
    let mut t = Transition::to(RunStatus::Queued, None);
    t.due_at = Some(now);
    t.clear_cancel = true;
    Ok(Retry {
        transition: t,
        extra_attempts: attempt,
    })
}

/// A manual retry's transition and the attempts it grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The run is queued again; its `finished_at` is cleared.
    pub transition: Transition,
    pub extra_attempts: u32,
}

pub fn not_retryable(id: &str, status: RunStatus) -> StoreError {
    StoreError::Conflict(format!(
        "run {id} is {status}: only failed or cancelled runs can be retried"
    ))
}

/// Who is asking to queue runs, for [`admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A run from the API, a schedule or a manual retry: up to `max_queued`.
    Run,
    /// A child run (`invoke`, `call`): up to [`child_queue_limit`].
    Child,
    /// The runs one event starts: every subscribed function counts, refused as a whole.
    Event,
}

impl Admission {
    /// How many times `max_queued` the queue may hold for this admission.
    pub fn cap_factor(self) -> u64 {
        match self {
            Admission::Run | Admission::Event => 1,
            Admission::Child => 2,
        }
    }
}

/// How many queued runs a child run (`invoke`, `call`) may find and still be created: twice
/// the tenant's `max_queued`. Work already admitted can go on past the quota (an API
/// client is refused at `max_queued`, a child only at this), but a run that forks children
/// that fork children cannot grow the queue without bound.
pub fn child_queue_limit(max_queued: u64) -> u64 {
    max_queued.saturating_mul(Admission::Child.cap_factor())
}

/// Whether a tenant with `queued` runs queued and quota `max_queued` (`None`: no quota)
/// may queue `adding` more.
pub fn admit(
    tenant: &str,
    kind: Admission,
    queued: u64,
    adding: u64,
    max_queued: Option<u64>,
) -> Result<(), StoreError> {
    let Some(max) = max_queued else { return Ok(()) };
    if queued.saturating_add(adding) > max.saturating_mul(kind.cap_factor()) {
        return Err(queue_quota_exceeded(tenant, max));
    }
    Ok(())
}

/// Whether a batch of `runs` new runs ([`crate::Queue::enqueue_batch`]) may be queued by a
/// tenant with `queued` runs queued: every run of the batch counts, whatever it turns out
/// to be (a repeated idempotency key, a run its rate limit skips), so that a batch is
/// refused or admitted as a whole, alike on every backend.
pub fn admit_batch(
    tenant: &str,
    queued: u64,
    runs: usize,
    max_queued: Option<u64>,
) -> Result<(), StoreError> {
    admit(tenant, Admission::Run, queued, runs as u64, max_queued)
}

/// The error of an enqueue refused by `max_queued`.
pub fn queue_quota_exceeded(tenant: &str, max_queued: u64) -> StoreError {
    StoreError::QuotaExceeded {
        message: format!(
            "tenant {tenant:?} has {max_queued} runs queued, its max_queued quota: try again once some have started"
        ),
        retry_after_ms: QUOTA_RETRY_AFTER_MS,
    }
}

/// The furthest ahead a run may be asked to start (`?delay=`, `?at=`, `wasq run --delay`):
/// 366 days. Further is more likely a unit mistake (milliseconds read as seconds) than a
/// plan, and a year-long backlog of runs nobody can see start is storage held for
/// nothing; what recurs is a cron schedule.
pub const MAX_START_DELAY_MS: Millis = 366 * 86_400_000;

/// The due time of a run asked to start at `at`: `at`, or now once `at` has passed (a
/// past time would otherwise rank the run ahead of runs already waiting). Refused, with
/// what to do instead, beyond [`MAX_START_DELAY_MS`] from now.
pub fn requested_start(at: Millis, now: Millis) -> Result<Millis, String> {
    if at.saturating_sub(now) > MAX_START_DELAY_MS {
        return Err(format!(
            "a run may start at most 366 days ahead; this one asks for {} days ahead \
             (a cron schedule starts what recurs)",
            at.saturating_sub(now) / 86_400_000
        ));
    }
    Ok(at.max(now))
}

#[cfg(test)]
mod tests;

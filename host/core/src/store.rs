use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::feed::Feed;
use crate::model::*;
use crate::notify::Deliveries;

/// Functions and their components: what can be run.
#[async_trait]
pub trait Registry: Send + Sync + 'static {
    /// Stores the component under its digest and creates or replaces the function.
    async fn deploy(&self, req: DeployRequest) -> Result<Function, StoreError>;
    async fn function(&self, tenant: &str, name: &str) -> Result<Option<Function>, StoreError>;
    async fn functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError>;
    /// The tenant's functions that have a schedule (paused ones too), by name, and their
    /// schedules: what the cron scheduler reads every second. A backend answers it from an
    /// index of the scheduled functions alone, so that however many other functions a
    /// tenant deploys, the scheduler's reads do not grow with them.
    async fn schedules(&self, tenant: &str) -> Result<Vec<Scheduled>, StoreError>;
    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

/// The run queue: admission, claims under a lease, what an attempt records and how it
/// ends. Each method is one atomic transition; those taken on behalf of an attempt carry
/// its [`Lease`] and fail with [`StoreError::LeaseLost`] once another attempt has taken
/// the run over.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Creates a queued run of an existing function (pinning its digest and settings), or
    /// returns the run created earlier with the same idempotency key. Applies the
    /// function's flow control ([`crate::flow`]): a run over its rate limit is created as
    /// `skipped`; a debounced run replaces (skips) the pending run of its key and is due
    /// one debounce period from now. Fails with [`StoreError::QuotaExceeded`], creating
    /// nothing, when the run would put the tenant above its `max_queued` (child runs,
    /// `parent` set, above [`crate::lifecycle::child_queue_limit`]: work already admitted can go on), and
    /// with [`StoreError::StorageQuota`] over the tenant's storage quotas.
    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError>;
    /// Enqueues runs of one function of one tenant (at most [`MAX_BATCH`]) as
    /// [`Queue::enqueue`] would one after the other, all or nothing: when one is refused
    /// (an unknown function, `max_queued`, a storage quota) none is created. Against
    /// `max_queued` the whole batch counts, every request one run
    /// ([`crate::lifecycle::admit_batch`]). Answers each request's run, in order. A backend
    /// stores the batch in one round trip.
    async fn enqueue_batch(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Enqueued>, StoreError>;
    /// Leases up to `limit` due runs (queued; sleeping and due; waiting past its timeout,
    /// which then resolves as timed out); also takes back runs whose lease expired (their
    /// worker died) and hands them out again.
    ///
    /// Order and limits: tenants take turns (round robin, one run per tenant per turn), so
    /// a tenant's backlog cannot delay another tenant's runs; within a tenant, lowest rank
    /// first (due time + priority × aging step; ties in creation order). A run is skipped
    /// (stays queued) while its concurrency key is at its limit, its throttle window is
    /// full (first starts only) or its tenant has `max_running` runs running.
    async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError>;
    /// Extends leases; reports the runs whose lease is no longer held (abandon those
    /// attempts: another attempt owns the run or it ended) and those whose cancellation was
    /// requested (stop those attempts and finish them; the lease is not extended).
    async fn renew(&self, leases: &[Lease], lease_ms: u64) -> Result<Renewal, StoreError>;
    /// Stores what an attempt produced while running: a step output, log lines, progress.
    async fn record(&self, lease: &Lease, record: Record) -> Result<(), StoreError>;
    /// Ends the attempt: succeed, fail (requeue after `retry_in_ms` or end as failed), suspend,
    /// or release. A run whose cancellation was requested ends as cancelled instead,
    /// unless it succeeded.
    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError>;
    /// [`Queue::finish`], answering only the run's status after it: what a worker needs.
    /// A backend may answer it without reading the whole run back.
    async fn end_attempt(&self, lease: &Lease, outcome: Outcome) -> Result<RunStatus, StoreError> {
        self.finish(lease, outcome).await.map(|run| run.status)
    }
    /// Ends attempts as [`Queue::end_attempt`] does, each together with what its attempt
    /// still had to record ([`AttemptEnd::records`]), and answers each, in order. An end is
    /// one transition, stored whole or not at all: its steps and its output are checked
    /// against the storage quotas together before anything of it is stored
    /// ([`StoreError::StorageQuota`] then, and the attempt still holds its lease). Ends do
    /// not depend on each other: one refused or with a lost lease leaves the others to
    /// apply. A backend may store many in one round trip; that is what workers call.
    async fn end_attempts(&self, ends: Vec<AttemptEnd>) -> Vec<Result<RunStatus, StoreError>>;

    /// Returns when a run may have become claimable (created, due, resumed, handed back)
    /// or after `max`, whichever is first; for a worker that names `queues` (as its
    /// claims do), a run of those queues. Backends shared by several processes wake idle
    /// workers through it; the default only sleeps, and the daemon also wakes its own
    /// worker in-process.
    async fn wait_for_work(
        &self,
        max: std::time::Duration,
        _queues: &[String],
    ) -> Result<(), StoreError> {
        tokio::time::sleep(max).await;
        Ok(())
    }

    /// Whether [`Queue::wait_for_work`] returns as soon as this backend made a run
    /// claimable (created, resumed, given back), so that a worker need not be woken by
    /// whatever caused it. The default's `wait_for_work` only sleeps.
    fn announces_work(&self) -> bool {
        false
    }
}

/// What users do to runs and read of them: cancel, retry, listings, history.
#[async_trait]
pub trait Runs: Send + Sync + 'static {
    /// Cancels a run: at once unless it is running; a running run is marked, reported by
    /// [`Store::renew`] and ends as cancelled when its attempt ends. Either way its error
    /// becomes [`RunAction::cancel_error`] and its log gets [`RunAction::log_line`].
    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError>;
    /// Queues a failed or cancelled run again, with a fresh budget of attempts, and logs
    /// [`RunAction::log_line`]; refused like a new run ([`StoreError::QuotaExceeded`])
    /// when the tenant has `max_queued` runs queued.
    async fn retry(&self, req: RunAction) -> Result<Run, StoreError>;
    /// Ids of the tenant's runs that start with `prefix` (a [`crate::ids::IdRef::Prefix`]),
    /// at most `limit`, in id order.
    async fn run_ids(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError>;

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError>;
    /// Steps of a run in completion order, after the first `skip`, at most `limit`.
    async fn steps(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError>;
    /// One completed step with its output; `None` when the run or the step does not exist.
    async fn step(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError>;
    /// Newest first.
    async fn runs(&self, query: RunQuery) -> Result<Vec<Run>, StoreError>;
    /// The tenant's runs waiting to start (queued, delayed ones included) and running,
    /// per queue, in queue name order; queues with neither are left out.
    async fn queue_depths(&self, tenant: &str) -> Result<Vec<QueueDepth>, StoreError>;
    /// The tenant's runs that have not ended (queued, running, sleeping, waiting), counted
    /// per function and status, and when the oldest queued one was created: what
    /// `/metrics` reports.
    async fn load(&self, tenant: &str) -> Result<RunLoad, StoreError>;
    /// Log lines in the order written, after the first `skip`, at most `limit`.
    async fn logs(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError>;
}

/// Events: recorded once per id, starting subscribers and resuming waiters.
#[async_trait]
pub trait Events: Send + Sync + 'static {
    /// Records an event (once per id), starts a run of every subscribed function and
    /// resumes every run waiting for a matching event. An event that would start runs
    /// beyond the tenant's `max_queued` is refused as a whole ([`StoreError::QuotaExceeded`],
    /// nothing recorded), so sending it again later works.
    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError>;
}

/// What the backend holds: deleting ended runs past their retention, and how full it is.
#[async_trait]
pub trait Retention: Send + Sync + 'static {
    /// Deletes ended runs past their retention; returns how many.
    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError>;

    /// How full the backend is (Redis: `used_memory` of `maxmemory`), for the server's
    /// store guard; `None` when it has no bound it knows of (the embedded store: the
    /// server watches its disk itself).
    async fn capacity(&self) -> Result<Option<Capacity>, StoreError> {
        Ok(None)
    }
}

/// The boundary every queue backend implements, by capability: [`Registry`], [`Queue`],
/// [`Runs`], [`Events`], [`Retention`], [`Deliveries`] and [`Feed`] (and
/// [`crate::Directory`] for tenants, which with these makes a [`Backend`]). Implemented
/// for every type that implements them all.
pub trait Store: Registry + Queue + Runs + Events + Retention + Deliveries + Feed {}

impl<T: Registry + Queue + Runs + Events + Retention + Deliveries + Feed> Store for T {}

/// Everything the server holds of its backend, once: the store, the tenant directory and
/// the worker registry.
pub trait Backend: Store + crate::Directory + crate::Workers {}

impl<T: Store + crate::Directory + crate::Workers> Backend for T {}

#[derive(Debug, Clone)]
pub struct DeployRequest {
    pub tenant: String,
    pub name: String,
    pub digest: String,
    pub component: Vec<u8>,
    pub settings: FunctionSettings,
    /// Event names that start a run of the function.
    pub events: Vec<String>,
    pub schedule: Option<Schedule>,
}

#[derive(Debug, Clone, Default)]
pub struct EnqueueRequest {
    pub tenant: String,
    pub function: String,
    pub input: Vec<u8>,
    pub trigger: String,
    /// Start no earlier than this; `None`, or a time already past, = now.
    pub due_at: Option<Millis>,
    /// A repeated key (same tenant and function) within [`IDEMPOTENCY_WINDOW_MS`] returns
    /// the existing run instead of creating one.
    pub idempotency_key: Option<String>,
    /// Overrides the function's retry policy for this run.
    pub retry: Option<RetryPolicy>,
    /// Set for a child run started by `invoke` or `call`: the parent is resumed when a
    /// `call` waits for it.
    pub parent: Option<RunId>,
    /// Overrides the function's priority for this run (lower starts first).
    pub priority: Option<i32>,
    /// The trace context the run keeps ([`Run::trace`]): the span of what creates it.
    pub trace: Option<crate::TraceParent>,
}

impl EnqueueRequest {
    /// The settings a run this request creates runs with: the function's, with the
    /// request's retry policy in place of theirs when it brings one.
    pub fn run_settings(&self, function: &FunctionSettings) -> FunctionSettings {
        let mut settings = function.clone();
        if let Some(retry) = self.retry {
            settings.retry = retry;
        }
        settings
    }

    /// When the run this request creates is due, before flow control moves it: the time
    /// asked for, or now when none was or it has passed (see
    /// [`crate::lifecycle::requested_start`]).
    pub fn start_at(&self, now: Millis) -> Millis {
        self.due_at.map_or(now, |at| at.max(now))
    }

    /// The run this request creates, as every store creates it: queued, nothing run or
    /// stored yet, due when the request says (a store that debounces moves `due_at`).
    pub fn into_run(
        self,
        id: RunId,
        now: Millis,
        digest: String,
        settings: FunctionSettings,
        plan: &crate::flow::FlowPlan,
    ) -> Run {
        let due_at = self.start_at(now);
        Run {
            id,
            tenant: self.tenant,
            function: self.function,
            digest,
            settings,
            status: RunStatus::Queued,
            input: self.input,
            output: None,
            error: None,
            attempt: 0,
            trigger: self.trigger,
            priority: plan.priority,
            keys: plan.keys.clone(),
            idempotency_key: self.idempotency_key,
            parent: self.parent,
            wait: None,
            progress: None,
            created_at: now,
            updated_at: now,
            due_at,
            finished_at: None,
            stored_bytes: 0,
            log_bytes: 0,
            trace: self.trace,
        }
    }
}

/// The most runs one [`Queue::enqueue_batch`] creates (BullMQ's `addBulk` has no bound;
/// RQ's `enqueue_many` neither): a bound keeps one request's script or transaction, and
/// its answer, short enough not to stall the store for others.
pub const MAX_BATCH: usize = 1000;

/// Checks what every backend assumes of a batch ([`Queue::enqueue_batch`]): at most
/// [`MAX_BATCH`] requests, all for one function of one tenant with one trigger, none a
/// child run. Anything
/// else is a caller's bug (the API checks what users send), hence `Internal`.
pub fn check_batch(reqs: &[EnqueueRequest]) -> Result<(), StoreError> {
    let bad = |why: &str| Err(StoreError::Internal(format!("bad batch: {why}")));
    if reqs.len() > MAX_BATCH {
        return bad("more than MAX_BATCH runs");
    }
    let Some(first) = reqs.first() else {
        return Ok(());
    };
    if reqs.iter().any(|r| {
        r.tenant != first.tenant || r.function != first.function || r.trigger != first.trigger
    }) {
        return bad("runs of more than one function or trigger");
    }
    if reqs.iter().any(|r| r.parent.is_some()) {
        return bad("a child run");
    }
    Ok(())
}

/// A cancel or a manual retry of a run, and who asked for it.
#[derive(Debug, Clone)]
pub struct RunAction {
    pub tenant: String,
    pub id: RunId,
    pub kind: RunActionKind,
    /// Who asked (`key:<id>`, `admin`), and why when it was not them directly
    /// (`key:k1, with its parent run <id>`). Escaped and bounded here, like any text that
    /// reaches a store.
    pub by: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunActionKind {
    Cancel,
    Retry,
}

/// Bytes of [`RunAction::by`] kept.
pub const MAX_ACTION_BY_BYTES: usize = 256;

impl RunAction {
    pub fn cancel(tenant: &str, id: &str, by: &str) -> Self {
        Self::new(tenant, id, RunActionKind::Cancel, by)
    }

    pub fn retry(tenant: &str, id: &str, by: &str) -> Self {
        Self::new(tenant, id, RunActionKind::Retry, by)
    }

    pub fn new(tenant: &str, id: &str, kind: RunActionKind, by: &str) -> Self {
        RunAction {
            tenant: tenant.to_owned(),
            id: id.to_owned(),
            kind,
            by: crate::text::escape_line(by, MAX_ACTION_BY_BYTES),
        }
    }

    /// The error a run cancelled this way ends with (set when the cancel is asked for,
    /// so a running run's pending cancel already shows it).
    pub fn cancel_error(&self) -> RunError {
        RunError::new(ErrorReason::Cancelled, format!("by {}", self.by))
    }

    /// The line the run's log gets, numbered with the run's current attempt.
    pub fn log_line(&self, attempt: u32, now: Millis) -> LogLine {
        let message = match self.kind {
            RunActionKind::Cancel => format!("cancelled by {}", self.by),
            RunActionKind::Retry => format!(
                "retried by {}: queued again with a fresh budget of attempts",
                self.by
            ),
        };
        LogLine {
            attempt,
            at: now,
            level: match self.kind {
                RunActionKind::Cancel => LogLevel::Warn,
                RunActionKind::Retry => LogLevel::Info,
            },
            source: LogSource::Host,
            message,
        }
    }
}

/// The `retry_after_ms` of a refused enqueue: a hint, the backlog usually moves by then.
pub const QUOTA_RETRY_AFTER_MS: u64 = 1_000;

#[derive(Debug, Clone)]
pub struct EventRequest {
    pub tenant: String,
    pub name: String,
    /// JSON.
    pub data: serde_json::Value,
    /// Deduplication key: an event id seen within [`IDEMPOTENCY_WINDOW_MS`] is ignored.
    pub id: Option<String>,
    /// The trace context of the runs the event starts ([`Run::trace`]).
    pub trace: Option<crate::TraceParent>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventSent {
    pub id: String,
    /// False when the id was seen before: nothing happened.
    pub accepted: bool,
    /// The runs it started.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub started: Vec<RunId>,
    /// The waiting runs it resumed.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub resumed: Vec<RunId>,
}

/// How long an idempotency key keeps returning the run it created.
pub const IDEMPOTENCY_WINDOW_MS: Millis = 24 * 3600 * 1000;

#[derive(Debug, Clone)]
pub struct Enqueued {
    pub run: Run,
    /// False when an earlier run with the same idempotency key was returned.
    pub created: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    pub worker: String,
    pub limit: usize,
    pub lease_ms: u64,
    /// The queues to take runs from, in this order: every run of the first queue that can
    /// start goes before any of the second (tenants still take turns within a queue).
    /// Empty: every queue, as one (rank alone orders). The worker puts them in order with
    /// [`crate::queues::claim_order`].
    pub queues: Vec<String>,
}

/// A queue's load, as [`Runs::queue_depths`] counts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueDepth {
    pub queue: String,
    /// Waiting to start: queued, delayed or backing off.
    pub queued: u64,
    pub running: u64,
}

/// What [`Runs::load`] counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunLoad {
    /// (function, status, runs) for every pair with at least one run, by function name,
    /// then status in [`ACTIVE_STATUSES`] order.
    pub counts: Vec<(String, RunStatus, u64)>,
    /// Creation time of the oldest queued run.
    pub oldest_queued_at: Option<Millis>,
}

/// The statuses of runs that have not ended, as [`Runs::load`] counts them.
pub const ACTIVE_STATUSES: [RunStatus; 4] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::Sleeping,
    RunStatus::Waiting,
];

/// The right to run one attempt. `token` grows with every claim of the run: the fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The run's tenant: backends that shard by tenant find the run's keys through it.
    pub tenant: String,
    pub run_id: RunId,
    pub token: u64,
    pub expires_at: Millis,
}

/// How much of its room a backend uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub used: u64,
    pub limit: u64,
}

/// What [`Store::renew`] found; every lease not listed was extended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Leases no longer held: the run was taken over or ended.
    pub lost: Vec<RunId>,
    /// Leases still held by runs whose cancellation was requested.
    pub cancelling: Vec<RunId>,
}

impl Renewal {
    /// Every lease was extended.
    pub fn all_held(&self) -> bool {
        self.lost.is_empty() && self.cancelling.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct Claimed {
    pub run: Run,
    pub lease: Lease,
    /// Steps completed by earlier attempts, for replay, in completion order; outputs past
    /// [`crate::storage::INLINE_REPLAY_BYTES`] are left out (read with [`Store::step`]).
    pub steps: Vec<ReplayStep>,
}

#[derive(Debug, Clone)]
pub enum Record {
    /// A completed step, stored in one transition with the log lines written before it.
    Step {
        name: String,
        occurrence: u32,
        output: Vec<u8>,
        logs: Vec<LogLine>,
    },
    Logs(Vec<LogLine>),
    Progress(Progress),
}

/// How an attempt ends, as a worker hands it to [`Queue::end_attempts`]: the records its
/// attempt had not stored yet, then its outcome.
///
/// A worker need not store an attempt's last step before the guest returns: nothing the
/// guest does after it can leave the sandbox without the step being stored first (an
/// outbound request, an event, a child run, a sleep or a wait stores it, and so does a
/// short timer), so storing it with the end keeps every promise a step makes while it
/// costs one transition instead of two.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub lease: Lease,
    /// Stored first, in order, in the same transition as the outcome.
    pub records: Vec<Record>,
    pub outcome: Outcome,
}

impl AttemptEnd {
    /// The steps among its records, each (name, occurrence) once, in order: what an end
    /// adds to the storage quotas besides its output, less those the run stored already.
    pub fn steps(&self) -> Vec<(&str, u32, &[u8])> {
        let mut seen = std::collections::HashSet::new();
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Step {
                    name,
                    occurrence,
                    output,
                    ..
                } => seen.insert((name.as_str(), *occurrence)).then_some((
                    name.as_str(),
                    *occurrence,
                    output.as_slice(),
                )),
                _ => None,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Succeeded {
        output: Vec<u8>,
        fuel_used: Option<u64>,
    },
    /// `retry_in_ms: Some(d)` queues the run again, due `d` ms after the failure is
    /// recorded (the store's clock, so backoff is measured from the recorded end of the
    /// attempt); `None` ends it as failed.
    Failed {
        error: RunError,
        retry_in_ms: Option<u64>,
        fuel_used: Option<u64>,
    },
    /// The guest sleeps until `until`: the run is `sleeping`, claimable again then, and the
    /// attempt goes on (its number does not change). `fuel_used`: burned by this
    /// execution, added to the tenant's usage like that of an ended attempt.
    Suspended {
        until: Millis,
        fuel_used: Option<u64>,
    },
    /// The guest waits for an event or a run: the run is `waiting` until the store
    /// resolves the wait (matching event, end of the run, or `until`), writes the
    /// [`Resolution`] as the step's output and makes the run claimable as a resume. A
    /// wait on a run that already ended resolves at once.
    Waiting { wait: Wait, fuel_used: Option<u64> },
    /// Gives the run back untouched (shutdown): due now, the attempt not counted.
    Released,
}

/// A run with its history, bounded: the first [`crate::storage::DETAIL_STEPS`] steps
/// (without outputs) and the last [`crate::storage::DETAIL_ATTEMPTS`] executions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    pub attempts: Vec<Attempt>,
    /// Executions in all (more than `attempts` lists when it hit its bound).
    pub attempts_total: u64,
    pub steps: Vec<StepInfo>,
    /// Steps in all (page through them with [`Store::steps`]).
    pub steps_total: u64,
}

#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub tenant: String,
    pub function: Option<String>,
    pub status: Option<RunStatus>,
    /// Only children of this run.
    pub parent: Option<RunId>,
    /// Only runs listed after this id (a page's last), so older: ids sort by creation
    /// time ([`crate::ids`]), so this is also "created before" ([`crate::ids::time_floor`]).
    pub before: Option<RunId>,
    /// Only runs created at or after this time.
    pub since: Option<Millis>,
    pub limit: usize,
}

/// Which ended runs [`Store::purge`] deletes, with everything recorded about them.
#[derive(Debug, Clone)]
pub struct PurgeRequest {
    /// Succeeded runs that finished before this time.
    pub succeeded_before: Millis,
    /// Failed and cancelled runs that finished before this time.
    pub failed_before: Millis,
    /// At most this many runs per call, so one purge never holds the store for long.
    pub limit: usize,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("lease lost: run {0} was taken over or ended by another attempt")]
    LeaseLost(RunId),
    #[error("{0} not found")]
    NotFound(String),
    /// The transition does not apply to the run's current state.
    #[error("{0}")]
    Conflict(String),
    /// A tenant quota refuses the call; it may succeed once the tenant's backlog shrinks.
    #[error("{message}")]
    QuotaExceeded {
        message: String,
        /// A hint for clients (HTTP `Retry-After`).
        retry_after_ms: u64,
    },
    /// A storage quota (of the run or its tenant) refuses the bytes: not retryable, the
    /// message names the quota.
    #[error("{0}")]
    StorageQuota(String),
    /// The backend refuses writes because it is out of room (Redis at `maxmemory`, a
    /// full disk). Not retried like an outage: it lasts until something is deleted.
    #[error("store full: {0}")]
    Full(String),
    /// The backend is unreachable or overloaded; the same call may succeed later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A bug or corrupt data; retrying will not help.
    #[error("store failure: {0}")]
    Internal(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

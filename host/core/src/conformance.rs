//! Scenarios every [`Store`] backend must pass, with time driven by a [`ManualClock`].
//!
//! A backend's tests invoke [`crate::conformance_tests`] with a factory that opens a
//! fresh, empty store on the given clock: one test per scenario, named after it. Each
//! scenario also names the guarantee it checks, so a failure reads as a broken promise
//! rather than a line number.

use std::future::Future;

mod actions;
mod batch;
mod durable;
mod ends;
mod feed;
mod flow;
mod history;
mod notify;
mod queues;
mod runs;
mod storage;
mod tenants;
mod trace;
mod waits;
mod workers;

use crate::clock::{Clock, ManualClock, Millis};
use crate::flow::*;
use crate::model::*;
use crate::store::*;
use crate::tenant::*;
use crate::workers::Workers;

const T0: i64 = 1_700_000_000_000;
const LEASE: u64 = 30_000;

type Scenario<S> = fn(S, ManualClock) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Every scenario: (test name, the guarantee it checks, the scenario).
fn scenarios<S: Store + Directory + Workers>() -> Vec<(&'static str, &'static str, Scenario<S>)> {
    vec![
        (
            "deploy",
            "deploy stores the component and replaces the function",
            |s, c| Box::pin(runs::deploy(s, c)),
        ),
        (
            "schedules",
            "the scheduled functions are listed with their schedules as deployed",
            |s, c| Box::pin(runs::schedules(s, c)),
        ),
        (
            "enqueue_unknown",
            "enqueue needs a deployed function",
            |s, c| Box::pin(runs::enqueue_unknown(s, c)),
        ),
        (
            "claim_once",
            "a claimed run is leased to one worker only",
            |s, c| Box::pin(runs::claim_once(s, c)),
        ),
        (
            "claim_order",
            "claims are FIFO by due time and bounded",
            |s, c| Box::pin(runs::claim_order(s, c)),
        ),
        (
            "succeed",
            "success stores the output; the lease is then spent",
            |s, c| Box::pin(runs::succeed(s, c)),
        ),
        (
            "fencing",
            "a stale lease cannot record or finish",
            |s, c| Box::pin(runs::fencing(s, c)),
        ),
        (
            "late_completion",
            "a reclaimed run's late completion is rejected; the new holder's result stands",
            |s, c| Box::pin(runs::late_completion(s, c)),
        ),
        (
            "steps_replay",
            "steps survive a lost worker and are replayed",
            |s, c| Box::pin(runs::steps_replay(s, c)),
        ),
        (
            "retry",
            "failure with a retry delay requeues after it",
            |s, c| Box::pin(runs::retry(s, c)),
        ),
        ("dead", "failure without a retry delay is final", |s, c| {
            Box::pin(runs::dead(s, c))
        }),
        (
            "release",
            "release gives the run back without using an attempt",
            |s, c| Box::pin(runs::release(s, c)),
        ),
        (
            "end_attempt",
            "end_attempt answers the status finish leaves the run in",
            |s, c| Box::pin(runs::end_attempt(s, c)),
        ),
        (
            "end_attempts",
            "an attempt's end stores its records, then its outcome; each end on its own",
            |s, c| Box::pin(ends::end_attempts(s, c)),
        ),
        (
            "end_steps_replay",
            "steps stored with ends that retry are replayed to the next attempt",
            |s, c| Box::pin(ends::end_steps_replay(s, c)),
        ),
        (
            "claimed_whole",
            "a claim hands over a run's input and steps' outputs whole, whatever their bytes",
            |s, c| Box::pin(ends::claimed_whole(s, c)),
        ),
        (
            "end_attempts_quota",
            "an end over a storage quota stores nothing and keeps its lease",
            |s, c| Box::pin(ends::end_attempts_quota(s, c)),
        ),
        (
            "end_attempts_usage",
            "an end costs what its records and outcome cost as separate calls",
            |s, c| Box::pin(ends::end_attempts_usage(s, c)),
        ),
        (
            "renew",
            "renewal extends leases and reports lost ones",
            |s, c| Box::pin(runs::renew(s, c)),
        ),
        (
            "lease_loss_cap",
            "a run losing workers forever ends failed",
            |s, c| Box::pin(runs::lease_loss_cap(s, c)),
        ),
        (
            "pinned_digest",
            "a redeploy does not change queued runs",
            |s, c| Box::pin(runs::pinned_digest(s, c)),
        ),
        (
            "listing",
            "listing filters and orders newest first",
            |s, c| Box::pin(history::listing(s, c)),
        ),
        ("logs", "logs and progress are kept in order", |s, c| {
            Box::pin(history::logs(s, c))
        }),
        (
            "trace_context",
            "a run keeps the trace context it was created with, from every way of creating it",
            |s, c| Box::pin(trace::trace_context(s, c)),
        ),
        (
            "suspend",
            "a suspended run sleeps, then resumes the same attempt",
            |s, c| Box::pin(durable::suspend(s, c)),
        ),
        (
            "running_detail",
            "a run's detail holds its latest executions, the running one last",
            |s, c| Box::pin(durable::running_detail(s, c)),
        ),
        (
            "release_resumed",
            "a released resumed run stays a resume",
            |s, c| Box::pin(durable::release_resumed(s, c)),
        ),
        (
            "cancel",
            "cancel ends waiting runs at once and running ones at their end",
            |s, c| Box::pin(actions::cancel(s, c)),
        ),
        (
            "manual_retry",
            "manual retry requeues failed runs with a fresh budget",
            |s, c| Box::pin(actions::manual_retry(s, c)),
        ),
        (
            "cancel_and_retry_say_who",
            "a cancel or a retry records who asked, in the run's error and log",
            |s, c| Box::pin(actions::cancel_and_retry_say_who(s, c)),
        ),
        (
            "delayed",
            "a delayed run starts at its time, not before, and never once cancelled",
            |s, c| Box::pin(actions::delayed(s, c)),
        ),
        (
            "named_queues",
            "a claim naming queues takes only their runs, in the order named",
            |s, c| Box::pin(queues::named_queues(s, c)),
        ),
        (
            "all_queues_rank_together",
            "a claim naming no queue takes every queue, oldest first",
            |s, c| Box::pin(queues::all_queues_rank_together(s, c)),
        ),
        (
            "load",
            "load counts unended runs per function and status and finds the oldest queued",
            |s, c| Box::pin(queues::load(s, c)),
        ),
        (
            "feed",
            "the tenant feed records every status change while listened to, in order",
            |s, c| Box::pin(feed::feed(s, c)),
        ),
        (
            "workers",
            "the worker registry lists the workers heard from lately, by id",
            |s, c| Box::pin(workers::workers(s, c)),
        ),
        (
            "deliveries",
            "webhook deliveries are added once, leased, retried on schedule, gone with their run",
            |s, c| Box::pin(notify::deliveries(s, c)),
        ),
        (
            "enqueue_batch",
            "a batch creates its runs in order as single enqueues would, or none",
            |s, c| Box::pin(batch::enqueue_batch(s, c)),
        ),
        (
            "concurrent_enqueues",
            "enqueues made at once are each answered as alone",
            |s, c| Box::pin(batch::concurrent_enqueues(s, c)),
        ),
        (
            "run_id_prefixes",
            "a unique prefix of a run id finds the run",
            |s, c| Box::pin(actions::run_id_prefixes(s, c)),
        ),
        (
            "idempotency",
            "an idempotency key returns the same run within its window",
            |s, c| Box::pin(history::idempotency(s, c)),
        ),
        (
            "retry_override",
            "a per-run retry policy overrides the function's",
            |s, c| Box::pin(history::retry_override(s, c)),
        ),
        (
            "wait_event",
            "a matching event resumes a waiting run; others do not",
            |s, c| Box::pin(durable::wait_event(s, c)),
        ),
        (
            "many_waiters",
            "an event resumes all its matching waiters, however many",
            |s, c| Box::pin(durable::many_waiters(s, c)),
        ),
        ("wait_timeout", "a wait times out with no event", |s, c| {
            Box::pin(durable::wait_timeout(s, c))
        }),
        (
            "event_subscribers",
            "events start subscribed functions once per id",
            |s, c| Box::pin(durable::event_subscribers(s, c)),
        ),
        (
            "wait_run",
            "a run waiting on another resumes when it ends",
            |s, c| Box::pin(durable::wait_run(s, c)),
        ),
        (
            "purge",
            "purge deletes ended runs past their retention only",
            |s, c| Box::pin(storage::purge(s, c)),
        ),
        (
            "purge_past_long_runs",
            "a purge gets past runs created long ago that ended inside the retention",
            |s, c| Box::pin(storage::purge_past_long_runs(s, c)),
        ),
        (
            "tenants",
            "tenants are created once, listed and given quotas",
            |s, c| Box::pin(tenants::tenants(s, c)),
        ),
        (
            "keys",
            "keys are stored, found by id, listed and revoked",
            |s, c| Box::pin(tenants::keys(s, c)),
        ),
        (
            "usage",
            "ended executions add their fuel to the tenant's usage",
            |s, c| Box::pin(tenants::usage(s, c)),
        ),
        (
            "audit",
            "the audit trail lists newest first, per tenant",
            |s, c| Box::pin(tenants::audit(s, c)),
        ),
        (
            "concurrency_keys",
            "a concurrency key holds runs over its limit queued until a slot frees",
            |s, c| Box::pin(flow::concurrency_keys(s, c)),
        ),
        (
            "throttle",
            "a throttle starts at most N first attempts per period; none are dropped",
            |s, c| Box::pin(flow::throttle(s, c)),
        ),
        (
            "rate_limit",
            "a rate limit records runs over it as skipped",
            |s, c| Box::pin(flow::rate_limit(s, c)),
        ),
        (
            "debounce",
            "a debounced burst starts only its last run, one period after it",
            |s, c| Box::pin(flow::debounce(s, c)),
        ),
        (
            "priority",
            "lower priority starts first; aging keeps low priorities from starving",
            |s, c| Box::pin(flow::priority(s, c)),
        ),
        (
            "max_queued",
            "max_queued refuses runs, retries and, past twice it, children",
            |s, c| Box::pin(flow::max_queued(s, c)),
        ),
        (
            "max_running",
            "max_running caps a tenant's running runs",
            |s, c| Box::pin(flow::max_running(s, c)),
        ),
        (
            "fairness",
            "tenants take turns: a backlog cannot delay another tenant's run",
            |s, c| Box::pin(flow::fairness(s, c)),
        ),
        (
            "every_end_reaches_the_waiter",
            "a waiter hears how the run it waits on ended, however it ended",
            |s, c| Box::pin(waits::every_end_reaches_the_waiter(s, c)),
        ),
        (
            "a_replaced_run_tells_its_waiter",
            "a run replaced by its debounce key tells its waiter by whom",
            |s, c| Box::pin(waits::a_replaced_run_tells_its_waiter(s, c)),
        ),
        (
            "ends_together_reach_their_waiters",
            "ends stored in one call resume their waiters, and a wait begun in it on a run that ends in it",
            |s, c| Box::pin(waits::ends_together_reach_their_waiters(s, c)),
        ),
        (
            "usage_is_exact",
            "storage usage is the exact sum of what is kept; a purge gives it back",
            |s, c| Box::pin(storage::usage_is_exact(s, c)),
        ),
        (
            "run_quota",
            "max_run_bytes refuses a step or output over it; the run can still fail",
            |s, c| Box::pin(storage::run_quota(s, c)),
        ),
        (
            "tenant_quota",
            "max_stored_bytes refuses new work and steps; other tenants go on",
            |s, c| Box::pin(storage::tenant_quota(s, c)),
        ),
        (
            "log_budget",
            "max_run_log_bytes cuts a run's log once, over all its attempts",
            |s, c| Box::pin(storage::log_budget(s, c)),
        ),
        (
            "big_steps_by_reference",
            "big step outputs are read by reference; details list steps without outputs",
            |s, c| Box::pin(storage::big_steps_by_reference(s, c)),
        ),
    ]
}

/// Runs scenario `name` against a fresh store from `make` ([`crate::conformance_tests`]
/// makes one test of each). `make` returns the store and a guard of what it runs on (a
/// folder, a server), dropped after the scenario.
pub async fn run_one<S, G, F, Fut>(name: &str, make: F)
where
    S: Store + Directory + Workers,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = (S, G)>,
{
    let all = scenarios::<S>();
    let named: Vec<&str> = all.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(
        named,
        crate::conformance_tests!(@names),
        "conformance_tests! must list every scenario, in order"
    );
    let Some((_, guarantee, scenario)) = all.into_iter().find(|(n, _, _)| *n == name) else {
        panic!("no conformance scenario {name:?}");
    };
    let clock = ManualClock::new(T0);
    let (store, guard) = make(clock.clone()).await;
    eprintln!("conformance: {guarantee}");
    scenario(store, clock).await;
    drop(guard);
}

/// One `#[tokio::test]` per conformance scenario, named after it, each against a fresh
/// store from `$make` (an `async fn(ManualClock) -> (impl Store + Directory, Guard)`, see
/// [`conformance::run_one`](crate::conformance::run_one)), so a failure names its scenario
/// and scenarios run in parallel.
///
/// ```ignore
/// async fn fresh(clock: ManualClock) -> (MyStore, ()) { (MyStore::new(clock), ()) }
/// wasq_core::conformance_tests!(fresh);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@list tests ($make));
    };
    (@names) => {
        $crate::conformance_tests!(@list names ())
    };
    // The one list of scenario names (`run_one` checks it against the scenarios).
    (@list $what:ident $arg:tt) => {
        $crate::conformance_tests! { @ $what $arg;
            deploy,
            schedules,
            enqueue_unknown,
            claim_once,
            claim_order,
            succeed,
            fencing,
            late_completion,
            steps_replay,
            retry,
            dead,
            release,
            end_attempt,
            end_attempts,
            end_steps_replay,
            claimed_whole,
            end_attempts_quota,
            end_attempts_usage,
            renew,
            lease_loss_cap,
            pinned_digest,
            listing,
            logs,
            trace_context,
            suspend,
            running_detail,
            release_resumed,
            cancel,
            manual_retry,
            cancel_and_retry_say_who,
            delayed,
            named_queues,
            all_queues_rank_together,
            load,
            feed,
            workers,
            deliveries,
            enqueue_batch,
            concurrent_enqueues,
            run_id_prefixes,
            idempotency,
            retry_override,
            wait_event,
            many_waiters,
            wait_timeout,
            event_subscribers,
            wait_run,
            purge,
            purge_past_long_runs,
            tenants,
            keys,
            usage,
            audit,
            concurrency_keys,
            throttle,
            rate_limit,
            debounce,
            priority,
            max_queued,
            max_running,
            fairness,
            every_end_reaches_the_waiter,
            a_replaced_run_tells_its_waiter,
            ends_together_reach_their_waiters,
            usage_is_exact,
            run_quota,
            tenant_quota,
            log_budget,
            big_steps_by_reference
        }
    };
    (@tests ($make:expr); $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::run_one(stringify!($name), $make).await;
            }
        )*
    };
    (@names (); $($name:ident),* $(,)?) => {
        [$(stringify!($name)),*]
    };
}

fn settings(max_attempts: u32) -> FunctionSettings {
    FunctionSettings {
        limits: Limits::default(),
        retry: RetryPolicy {
            max_attempts,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 10_000,
            ..RetryPolicy::default()
        },
        ..FunctionSettings::default()
    }
}

async fn deploy_fn(store: &impl Store, name: &str, digest: &str, max_attempts: u32) -> Function {
    store
        .deploy(DeployRequest {
            tenant: DEFAULT_TENANT.into(),
            name: name.into(),
            digest: digest.into(),
            component: format!("bytes of {digest}").into_bytes(),
            settings: settings(max_attempts),
            events: vec![],
            schedule: None,
        })
        .await
        .expect("deploy")
}

async fn enqueue(store: &impl Store, function: &str, input: &str) -> Run {
    enqueue_due(store, function, input, None).await
}

/// Enqueues a run asked to start at `due_at`.
async fn enqueue_at(store: &impl Store, function: &str, input: &str, due_at: Millis) -> Run {
    enqueue_due(store, function, input, Some(due_at)).await
}

async fn enqueue_due(
    store: &impl Store,
    function: &str,
    input: &str,
    due_at: Option<Millis>,
) -> Run {
    store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: function.into(),
            input: input.as_bytes().to_vec(),
            trigger: "api".into(),
            due_at,
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
            trace: None,
        })
        .await
        .expect("enqueue")
        .run
}

async fn claim(store: &impl Store, worker: &str, limit: usize) -> Vec<Claimed> {
    store
        .claim(ClaimRequest {
            worker: worker.into(),
            limit,
            lease_ms: LEASE,
            queues: Vec::new(),
        })
        .await
        .expect("claim")
}

async fn detail(store: &impl Store, id: &str) -> RunDetail {
    store
        .run(DEFAULT_TENANT, id)
        .await
        .expect("get run")
        .expect("run exists")
}

fn failed(reason: ErrorReason, retry_in_ms: Option<u64>) -> Outcome {
    Outcome::Failed {
        error: RunError::new(reason, "boom"),
        retry_in_ms,
        fuel_used: Some(7),
    }
}

fn step_output(steps: &[ReplayStep], name: &str) -> Resolution {
    let step = steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no step {name}: {steps:?}"));
    serde_json::from_slice(step.output.as_deref().expect("a small step comes inline"))
        .expect("a resolution")
}

fn waiting_for_event(filter: Option<&str>, until: Option<i64>) -> Outcome {
    Outcome::Waiting {
        wait: Wait {
            step: "paid".into(),
            occurrence: 0,
            on: WaitOn::Event {
                name: "order.paid".into(),
                filter: filter.map(Into::into),
            },
            until,
        },
        fuel_used: None,
    }
}

async fn send(
    store: &impl Store,
    name: &str,
    data: serde_json::Value,
    id: Option<&str>,
) -> EventSent {
    store
        .send_event(EventRequest {
            tenant: DEFAULT_TENANT.into(),
            name: name.into(),
            data,
            id: id.map(Into::into),
            trace: None,
        })
        .await
        .expect("send event")
}

fn tenant(name: &str) -> Tenant {
    Tenant {
        name: name.into(),
        created_at: T0,
        quotas: Quotas::default(),
    }
}

fn api_key(id: &str, tenant: &str, at: Millis) -> ApiKey {
    ApiKey {
        id: id.into(),
        tenant: tenant.into(),
        hmac: format!("hmac-of-{id}"),
        label: format!("label {id}"),
        created_at: at,
        revoked_at: None,
    }
}

// ---- Flow control, tenant quotas and fairness ----

fn key(expr: &str) -> Option<KeyExpr> {
    Some(KeyExpr::parse(expr).expect("valid key expression"))
}

/// Flow control that debounces runs by their input's `k` for a second.
fn debounced_by_k() -> FlowControl {
    FlowControl {
        debounce: Some(Debounce {
            period_ms: 1000,
            key: key("input.k"),
        }),
        ..FlowControl::default()
    }
}

async fn deploy_flow(store: &impl Store, tenant: &str, name: &str, flow: FlowControl) {
    let settings = FunctionSettings {
        flow,
        ..settings(3)
    };
    deploy_with(store, tenant, name, settings, vec![format!("{name}.go")]).await;
}

/// Deploys function `name` of `tenant` (component `c`, digest `d`) with `settings`,
/// started by `events`.
async fn deploy_with(
    store: &impl Store,
    tenant: &str,
    name: &str,
    settings: FunctionSettings,
    events: Vec<String>,
) {
    store
        .deploy(DeployRequest {
            tenant: tenant.into(),
            name: name.into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings,
            events,
            schedule: None,
        })
        .await
        .expect("deploy");
}

async fn try_enqueue(
    store: &impl Store,
    tenant: &str,
    function: &str,
    input: serde_json::Value,
    priority: Option<i32>,
    parent: Option<&str>,
) -> Result<Enqueued, StoreError> {
    store
        .enqueue(EnqueueRequest {
            tenant: tenant.into(),
            function: function.into(),
            input: input.to_string().into_bytes(),
            trigger: "api".into(),
            priority,
            parent: parent.map(Into::into),
            ..EnqueueRequest::default()
        })
        .await
}

async fn enq(store: &impl Store, function: &str, input: serde_json::Value) -> Run {
    try_enqueue(store, DEFAULT_TENANT, function, input, None, None)
        .await
        .expect("enqueue")
        .run
}

fn ids(claimed: &[Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.run.id.clone()).collect()
}

async fn status_of(store: &impl Store, tenant: &str, id: &str) -> Run {
    store
        .run(tenant, id)
        .await
        .unwrap()
        .expect("run exists")
        .run
}

fn ok() -> Outcome {
    Outcome::Succeeded {
        output: b"{}".to_vec(),
        fuel_used: None,
    }
}

fn query(function: Option<&str>, status: Option<RunStatus>) -> RunQuery {
    RunQuery {
        tenant: DEFAULT_TENANT.into(),
        function: function.map(Into::into),
        status,
        limit: 100,
        ..RunQuery::default()
    }
}

//! Scenarios every [`Store`] backend must pass, with time driven by a [`ManualClock`].
//!
//! A backend's tests invoke [`crate::conformance_tests`] with a factory that opens a
//! fresh, empty store on the given clock: one test per scenario, named after it. Each
//! scenario also names the guarantee it checks, so a failure reads as a broken promise
//! rather than a line number.

use std::future::Future;

mod actions;
mod storage;
mod waits;

use crate::clock::{Clock, ManualClock, Millis};
use crate::flow::*;
use crate::model::*;
use crate::store::*;
use crate::tenant::*;

const T0: i64 = 1_700_000_000_000;
const LEASE: u64 = 30_000;

type Scenario<S> = fn(S, ManualClock) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Every scenario: (test name, the guarantee it checks, the scenario).
fn scenarios<S: Store + Directory>() -> Vec<(&'static str, &'static str, Scenario<S>)> {
    vec![
        (
            "deploy",
            "deploy stores the component and replaces the function",
            |s, c| Box::pin(deploy(s, c)),
        ),
        (
            "enqueue_unknown",
            "enqueue needs a deployed function",
            |s, c| Box::pin(enqueue_unknown(s, c)),
        ),
        (
            "claim_once",
            "a claimed run is leased to one worker only",
            |s, c| Box::pin(claim_once(s, c)),
        ),
        (
            "claim_order",
            "claims are FIFO by due time and bounded",
            |s, c| Box::pin(claim_order(s, c)),
        ),
        (
            "succeed",
            "success stores the output; the lease is then spent",
            |s, c| Box::pin(succeed(s, c)),
        ),
        (
            "fencing",
            "a stale lease cannot record or finish",
            |s, c| Box::pin(fencing(s, c)),
        ),
        (
            "late_completion",
            "a reclaimed run's late completion is rejected; the new holder's result stands",
            |s, c| Box::pin(late_completion(s, c)),
        ),
        (
            "steps_replay",
            "steps survive a lost worker and are replayed",
            |s, c| Box::pin(steps_replay(s, c)),
        ),
        (
            "retry",
            "failure with a retry delay requeues after it",
            |s, c| Box::pin(retry(s, c)),
        ),
        ("dead", "failure without a retry delay is final", |s, c| {
            Box::pin(dead(s, c))
        }),
        (
            "release",
            "release gives the run back without using an attempt",
            |s, c| Box::pin(release(s, c)),
        ),
        (
            "renew",
            "renewal extends leases and reports lost ones",
            |s, c| Box::pin(renew(s, c)),
        ),
        (
            "lease_loss_cap",
            "a run losing workers forever ends failed",
            |s, c| Box::pin(lease_loss_cap(s, c)),
        ),
        (
            "pinned_digest",
            "a redeploy does not change queued runs",
            |s, c| Box::pin(pinned_digest(s, c)),
        ),
        (
            "listing",
            "listing filters and orders newest first",
            |s, c| Box::pin(listing(s, c)),
        ),
        ("logs", "logs and progress are kept in order", |s, c| {
            Box::pin(logs(s, c))
        }),
        (
            "suspend",
            "a suspended run sleeps, then resumes the same attempt",
            |s, c| Box::pin(suspend(s, c)),
        ),
        (
            "release_resumed",
            "a released resumed run stays a resume",
            |s, c| Box::pin(release_resumed(s, c)),
        ),
        (
            "cancel",
            "cancel ends waiting runs at once and running ones at their end",
            |s, c| Box::pin(cancel(s, c)),
        ),
        (
            "manual_retry",
            "manual retry requeues failed runs with a fresh budget",
            |s, c| Box::pin(manual_retry(s, c)),
        ),
        (
            "cancel_and_retry_say_who",
            "a cancel or a retry records who asked, in the run's error and log",
            |s, c| Box::pin(actions::cancel_and_retry_say_who(s, c)),
        ),
        (
            "run_id_prefixes",
            "a unique prefix of a run id finds the run",
            |s, c| Box::pin(actions::run_id_prefixes(s, c)),
        ),
        (
            "idempotency",
            "an idempotency key returns the same run within its window",
            |s, c| Box::pin(idempotency(s, c)),
        ),
        (
            "retry_override",
            "a per-run retry policy overrides the function's",
            |s, c| Box::pin(retry_override(s, c)),
        ),
        (
            "wait_event",
            "a matching event resumes a waiting run; others do not",
            |s, c| Box::pin(wait_event(s, c)),
        ),
        (
            "many_waiters",
            "an event resumes all its matching waiters, however many",
            |s, c| Box::pin(many_waiters(s, c)),
        ),
        ("wait_timeout", "a wait times out with no event", |s, c| {
            Box::pin(wait_timeout(s, c))
        }),
        (
            "event_subscribers",
            "events start subscribed functions once per id",
            |s, c| Box::pin(event_subscribers(s, c)),
        ),
        (
            "wait_run",
            "a run waiting on another resumes when it ends",
            |s, c| Box::pin(wait_run(s, c)),
        ),
        (
            "purge",
            "purge deletes ended runs past their retention only",
            |s, c| Box::pin(purge(s, c)),
        ),
        (
            "tenants",
            "tenants are created once, listed and given quotas",
            |s, c| Box::pin(tenants(s, c)),
        ),
        (
            "keys",
            "keys are stored, found by id, listed and revoked",
            |s, c| Box::pin(keys(s, c)),
        ),
        (
            "usage",
            "ended executions add their fuel to the tenant's usage",
            |s, c| Box::pin(usage(s, c)),
        ),
        (
            "audit",
            "the audit trail lists newest first, per tenant",
            |s, c| Box::pin(audit(s, c)),
        ),
        (
            "concurrency_keys",
            "a concurrency key holds runs over its limit queued until a slot frees",
            |s, c| Box::pin(concurrency_keys(s, c)),
        ),
        (
            "throttle",
            "a throttle starts at most N first attempts per period; none are dropped",
            |s, c| Box::pin(throttle(s, c)),
        ),
        (
            "rate_limit",
            "a rate limit records runs over it as skipped",
            |s, c| Box::pin(rate_limit(s, c)),
        ),
        (
            "debounce",
            "a debounced burst starts only its last run, one period after it",
            |s, c| Box::pin(debounce(s, c)),
        ),
        (
            "priority",
            "lower priority starts first; aging keeps low priorities from starving",
            |s, c| Box::pin(priority(s, c)),
        ),
        (
            "max_queued",
            "max_queued refuses runs, retries and, past twice it, children",
            |s, c| Box::pin(max_queued(s, c)),
        ),
        (
            "max_running",
            "max_running caps a tenant's running runs",
            |s, c| Box::pin(max_running(s, c)),
        ),
        (
            "fairness",
            "tenants take turns: a backlog cannot delay another tenant's run",
            |s, c| Box::pin(fairness(s, c)),
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
    S: Store + Directory,
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
            renew,
            lease_loss_cap,
            pinned_digest,
            listing,
            logs,
            suspend,
            release_resumed,
            cancel,
            manual_retry,
            cancel_and_retry_say_who,
            run_id_prefixes,
            idempotency,
            retry_override,
            wait_event,
            many_waiters,
            wait_timeout,
            event_subscribers,
            wait_run,
            purge,
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
        allow_hosts: vec![],
        flow: FlowControl::default(),
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
    store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: function.into(),
            input: input.as_bytes().to_vec(),
            trigger: "api".into(),
            due_at: None,
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
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

async fn deploy(store: impl Store, clock: ManualClock) {
    let f = deploy_fn(&store, "hello", "d1", 3).await;
    assert_eq!(
        (f.name.as_str(), f.digest.as_str(), f.created_at),
        ("hello", "d1", T0)
    );
    clock.advance(5);
    let f2 = deploy_fn(&store, "hello", "d2", 5).await;
    assert_eq!(f2.digest, "d2");
    assert_eq!(f2.created_at, T0, "a redeploy keeps the creation time");
    assert_eq!(f2.updated_at, T0 + 5);
    let got = store
        .function(DEFAULT_TENANT, "hello")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, f2);
    assert_eq!(
        store.component("d1").await.unwrap(),
        Some(b"bytes of d1".to_vec())
    );
    assert_eq!(
        store.component("d2").await.unwrap(),
        Some(b"bytes of d2".to_vec())
    );
    assert_eq!(store.component("nope").await.unwrap(), None);
    assert!(
        store
            .function(DEFAULT_TENANT, "other")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .function("another-tenant", "hello")
            .await
            .unwrap()
            .is_none()
    );
    deploy_fn(&store, "alpha", "d1", 1).await;
    let names: Vec<_> = store
        .functions(DEFAULT_TENANT)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["alpha", "hello"]);
}

async fn enqueue_unknown(store: impl Store, _clock: ManualClock) {
    let err = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "missing".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            due_at: None,
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
        })
        .await
        .expect_err("no such function");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert!(
        store.runs(query(None, None)).await.unwrap().is_empty(),
        "nothing stored"
    );
}

async fn claim_once(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", r#"{"n":1}"#).await;
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!((run.attempt, run.due_at, run.created_at), (0, T0, T0));
    let got = claim(&store, "w1", 10).await;
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!(c.run.id, run.id);
    assert_eq!(c.run.status, RunStatus::Running);
    assert_eq!(c.run.attempt, 1);
    assert_eq!(c.run.input, br#"{"n":1}"#.to_vec());
    assert_eq!(c.lease.expires_at, T0 + LEASE as i64);
    assert!(c.steps.is_empty());
    assert!(
        claim(&store, "w2", 10).await.is_empty(),
        "a leased run is not handed out twice"
    );
    clock.advance(LEASE as i64 - 1);
    assert!(
        claim(&store, "w2", 10).await.is_empty(),
        "not before the lease expires"
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 1);
    assert_eq!(d.attempts[0].worker, "w1");
    assert_eq!(d.attempts[0].started_at, T0);
}

async fn claim_order(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let a = enqueue(&store, "f", "1").await;
    clock.advance(1);
    let later = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"later".to_vec(),
            trigger: "api".into(),
            due_at: Some(T0 + 60_000),
            idempotency_key: None,
            retry: None,
            parent: None,
            priority: None,
        })
        .await
        .unwrap()
        .run;
    let b = enqueue(&store, "f", "2").await;
    let c = enqueue(&store, "f", "3").await;
    let first = claim(&store, "w", 2).await;
    let ids: Vec<_> = first.iter().map(|c| c.run.id.clone()).collect();
    assert_eq!(
        ids,
        [a.id.clone(), b.id.clone()],
        "oldest due first, at most `limit`"
    );
    let second = claim(&store, "w", 10).await;
    let ids: Vec<_> = second.iter().map(|c| c.run.id.clone()).collect();
    assert_eq!(
        ids,
        std::slice::from_ref(&c.id),
        "a run due later is not claimed early"
    );
    for c in first.into_iter().chain(second) {
        let done = Outcome::Succeeded {
            output: b"1".to_vec(),
            fuel_used: None,
        };
        store.finish(&c.lease, done).await.unwrap();
    }
    clock.set(T0 + 60_000);
    let third: Vec<_> = claim(&store, "w", 10)
        .await
        .into_iter()
        .map(|c| c.run.id)
        .collect();
    assert_eq!(third, [later.id]);
}

async fn succeed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    clock.advance(40);
    let done = store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: br#"{"ok":true}"#.to_vec(),
                fuel_used: Some(9),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded);
    assert_eq!(done.output.as_deref(), Some(&br#"{"ok":true}"#[..]));
    assert_eq!(done.finished_at, Some(T0 + 40));
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.attempts[0].finished_at, Some(T0 + 40));
    assert_eq!(d.attempts[0].fuel_used, Some(9));
    let again = store
        .finish(&c.lease, failed(ErrorReason::Trap, None))
        .await;
    assert!(matches!(again, Err(StoreError::LeaseLost(_))), "{again:?}");
    assert_eq!(
        detail(&store, &run.id).await.run.status,
        RunStatus::Succeeded
    );
    clock.advance(LEASE as i64 * 2);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "finished runs are never claimed"
    );
}

async fn fencing(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let old = claim(&store, "w1", 1).await.remove(0);
    clock.advance(LEASE as i64);
    let new = claim(&store, "w2", 1).await.remove(0);
    assert_eq!(new.run.id, run.id, "an expired lease is handed out again");
    assert!(new.lease.token > old.lease.token, "the fencing token grows");
    assert_eq!(new.run.attempt, 2);
    let step = Record::Step {
        name: "s".into(),
        occurrence: 0,
        output: b"1".to_vec(),
        logs: vec![],
    };
    let r = store.record(&old.lease, step.clone()).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "stale step record: {r:?}"
    );
    let r = store
        .finish(
            &old.lease,
            Outcome::Succeeded {
                output: b"old".to_vec(),
                fuel_used: None,
            },
        )
        .await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "stale finish: {r:?}"
    );
    store.record(&new.lease, step).await.unwrap();
    let done = store
        .finish(
            &new.lease,
            Outcome::Succeeded {
                output: b"\"new\"".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(done.output.as_deref(), Some(&b"\"new\""[..]));
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(
        d.attempts[0].error.as_ref().map(|e| e.reason),
        Some(ErrorReason::LeaseExpired)
    );
    let lost = &d.attempts[0].error.as_ref().unwrap().message;
    assert!(
        lost.contains("worker w1"),
        "the lost attempt names its worker: {lost}"
    );
    assert_eq!(d.steps.len(), 1);
    assert_eq!(d.steps[0].attempt, 2);
}

async fn late_completion(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let old = claim(&store, "w1", 1).await.remove(0);
    clock.advance(LEASE as i64);
    let new = claim(&store, "w2", 1).await.remove(0);
    assert_eq!(new.run.id, run.id);
    store
        .finish(
            &new.lease,
            Outcome::Succeeded {
                output: b"\"new\"".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    // The first worker wakes up after the run was taken over and finished.
    clock.advance(5);
    for outcome in [
        Outcome::Succeeded {
            output: b"\"old\"".to_vec(),
            fuel_used: None,
        },
        failed(ErrorReason::Trap, Some(1_000)),
        Outcome::Released,
    ] {
        let r = store.finish(&old.lease, outcome).await;
        assert!(
            matches!(r, Err(StoreError::LeaseLost(_))),
            "late finish: {r:?}"
        );
    }
    let r = store.record(&old.lease, Record::Logs(vec![])).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost(_))),
        "late record: {r:?}"
    );
    let renewal = store
        .renew(std::slice::from_ref(&old.lease), LEASE)
        .await
        .unwrap();
    assert_eq!(
        renewal,
        Renewal {
            lost: vec![run.id.clone()],
            cancelling: vec![]
        },
        "late renewal"
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.run.output.as_deref(), Some(&b"\"new\""[..]));
    assert_eq!(d.run.finished_at, Some(T0 + LEASE as i64));
    assert_eq!(d.run.attempt, 2);
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(d.attempts[1].worker, "w2");
    assert_eq!(d.attempts[1].error, None);
    clock.advance(LEASE as i64 * 2);
    assert!(claim(&store, "w3", 10).await.is_empty(), "nothing to redo");
}

async fn steps_replay(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w1", 1).await.remove(0);
    for (name, occurrence, out) in [("a", 0, "1"), ("a", 1, "2"), ("b", 0, "3")] {
        clock.advance(1);
        let rec = Record::Step {
            name: name.into(),
            occurrence,
            output: out.as_bytes().to_vec(),
            logs: vec![],
        };
        store.record(&c.lease, rec).await.unwrap();
    }
    let line = LogLine {
        attempt: 1,
        at: T0,
        level: LogLevel::Info,
        source: LogSource::Guest,
        message: "body ran".into(),
    };
    let rec = Record::Step {
        name: "c".into(),
        occurrence: 0,
        output: b"4".to_vec(),
        logs: vec![line],
    };
    store.record(&c.lease, rec).await.unwrap();
    let logged: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(
        logged,
        ["body ran"],
        "a step's log lines are stored with it"
    );
    clock.advance(LEASE as i64);
    let again = claim(&store, "w2", 1).await.remove(0);
    let mut steps: Vec<_> = again
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.occurrence, s.output.as_deref()))
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        [
            ("a", 0, Some(&b"1"[..])),
            ("a", 1, Some(&b"2"[..])),
            ("b", 0, Some(&b"3"[..])),
            ("c", 0, Some(&b"4"[..]))
        ]
    );
    let d = detail(&store, &run.id).await;
    assert_eq!(d.steps.len(), 4);
    assert_eq!(d.steps_total, 4);
    assert!(
        d.steps
            .iter()
            .all(|s| s.attempt == 1 && s.output_bytes == 1)
    );
    assert_eq!(
        d.steps[0].completed_at,
        T0 + 1,
        "steps listed in completion order"
    );
}

async fn retry(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .finish(&c.lease, failed(ErrorReason::Trap, Some(1_000)))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Queued);
    assert_eq!(r.due_at, T0 + 1_000);
    assert_eq!(
        r.error.as_ref().map(|e| e.reason),
        Some(ErrorReason::Trap),
        "last error shown"
    );
    clock.advance(999);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "not before the backoff"
    );
    clock.advance(1);
    let c2 = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c2.run.attempt, 2);
    store
        .finish(
            &c2.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Succeeded);
    assert_eq!(d.run.error, None, "a success clears the last error");
    assert_eq!(d.attempts.len(), 2);
    assert_eq!(
        d.attempts[0].error.as_ref().map(|e| e.message.as_str()),
        Some("boom")
    );
    assert_eq!(d.attempts[1].error, None);
}

async fn dead(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    clock.advance(3);
    let r = store
        .finish(&c.lease, failed(ErrorReason::OutOfFuel, None))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.finished_at, Some(T0 + 3));
    assert_eq!(r.error, Some(RunError::new(ErrorReason::OutOfFuel, "boom")));
    clock.advance(LEASE as i64 * 2);
    assert!(claim(&store, "w", 1).await.is_empty());
    let failed_runs = store
        .runs(query(None, Some(RunStatus::Failed)))
        .await
        .unwrap();
    assert_eq!(failed_runs.len(), 1);
    assert_eq!(failed_runs[0].id, run.id);
}

async fn release(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store.finish(&c.lease, Outcome::Released).await.unwrap();
    assert_eq!((r.status, r.attempt), (RunStatus::Queued, 0));
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(
        (again.run.id.as_str(), again.run.attempt),
        (run.id.as_str(), 1)
    );
    assert!(again.lease.token > c.lease.token);
    assert!(
        detail(&store, &run.id).await.attempts.len() <= 1,
        "a released attempt is not history"
    );
}

async fn renew(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    enqueue(&store, "f", "1").await;
    enqueue(&store, "f", "2").await;
    let got = claim(&store, "w", 2).await;
    let (a, b) = (&got[0], &got[1]);
    clock.advance(LEASE as i64 - 10);
    let renewal = store
        .renew(std::slice::from_ref(&a.lease), LEASE)
        .await
        .unwrap();
    assert!(renewal.all_held(), "{renewal:?}");
    clock.advance(20);
    // b expired and was taken over; a was renewed and is still held
    let taken = claim(&store, "w2", 10).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].run.id, b.run.id);
    let renewal = store
        .renew(&[a.lease.clone(), b.lease.clone()], LEASE)
        .await
        .unwrap();
    assert_eq!(renewal.lost, std::slice::from_ref(&b.run.id));
    assert!(renewal.cancelling.is_empty(), "{renewal:?}");
    store
        .finish(
            &a.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .expect("the renewed lease still commits");
}

async fn lease_loss_cap(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let mut claims = 0;
    loop {
        let got = claim(&store, "w", 1).await;
        if got.is_empty() {
            break;
        }
        claims += 1;
        assert!(claims < 20, "lease losses must stop at some point");
        clock.advance(LEASE as i64);
    }
    assert_eq!(claims, 1 + crate::MAX_LOST_LEASE_EXTRA_ATTEMPTS);
    let d = detail(&store, &run.id).await;
    assert_eq!(d.run.status, RunStatus::Failed);
    assert_eq!(
        d.run.error.as_ref().map(|e| e.reason),
        Some(ErrorReason::LeaseExpired)
    );
    assert!(d.run.finished_at.is_some());
}

async fn pinned_digest(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d1", 2).await;
    let run = enqueue(&store, "f", "{}").await;
    deploy_fn(&store, "f", "d2", 7).await;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, run.id);
    assert_eq!(c.run.digest, "d1");
    assert_eq!(c.run.settings.retry.max_attempts, 2);
    assert_eq!(enqueue(&store, "f", "{}").await.digest, "d2");
}

fn query(function: Option<&str>, status: Option<RunStatus>) -> RunQuery {
    RunQuery {
        tenant: DEFAULT_TENANT.into(),
        function: function.map(Into::into),
        status,
        parent: None,
        limit: 100,
    }
}

async fn listing(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    deploy_fn(&store, "g", "d", 1).await;
    let mut ids = vec![];
    for i in 0..5 {
        clock.advance(1);
        ids.push(
            enqueue(&store, if i % 2 == 0 { "f" } else { "g" }, "{}")
                .await
                .id,
        );
    }
    let all: Vec<_> = store
        .runs(query(None, None))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    let newest_first: Vec<_> = ids.iter().rev().cloned().collect();
    assert_eq!(all, newest_first);
    let f: Vec<_> = store
        .runs(query(Some("f"), None))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(f, [ids[4].clone(), ids[2].clone(), ids[0].clone()]);
    let mut q = query(None, None);
    q.limit = 2;
    assert_eq!(store.runs(q).await.unwrap().len(), 2);
    let c = claim(&store, "w", 1).await.remove(0);
    let running = store
        .runs(query(None, Some(RunStatus::Running)))
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, c.run.id);
    let other = RunQuery {
        tenant: "someone-else".into(),
        ..query(None, None)
    };
    assert!(
        store.runs(other).await.unwrap().is_empty(),
        "runs are scoped to their tenant"
    );
    assert!(store.run("someone-else", &ids[0]).await.unwrap().is_none());
}

async fn logs(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let line = |m: &str| LogLine {
        attempt: 1,
        at: clock.now_ms(),
        level: LogLevel::Info,
        source: LogSource::Guest,
        message: m.into(),
    };
    store
        .record(&c.lease, Record::Logs(vec![line("one"), line("two")]))
        .await
        .unwrap();
    store
        .record(&c.lease, Record::Logs(vec![line("three")]))
        .await
        .unwrap();
    let p = Progress {
        percent: 40,
        message: Some("almost".into()),
    };
    store
        .record(&c.lease, Record::Progress(p.clone()))
        .await
        .unwrap();
    let all: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(all, ["one", "two", "three"]);
    let tail: Vec<_> = store
        .logs(DEFAULT_TENANT, &run.id, 2, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(tail, ["three"]);
    assert_eq!(detail(&store, &run.id).await.run.progress, Some(p));
    assert!(
        store
            .logs("someone-else", &run.id, 0, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn suspend(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let rec = Record::Step {
        name: "nap".into(),
        occurrence: 0,
        output: b"{}".to_vec(),
        logs: vec![],
    };
    store.record(&c.lease, rec).await.unwrap();
    clock.advance(10);
    let r = store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 60_000,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.due_at, r.attempt),
        (RunStatus::Sleeping, T0 + 60_000, 1)
    );
    assert!(r.finished_at.is_none());
    clock.advance(LEASE as i64);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "a sleeping run is not claimed early"
    );
    clock.set(T0 + 60_000);
    let woke = claim(&store, "w", 1).await.remove(0);
    assert_eq!(woke.run.id, run.id);
    assert_eq!(woke.run.attempt, 1, "waking is not a new attempt");
    assert_eq!(woke.steps.len(), 1, "steps are replayed");
    assert!(woke.lease.token > c.lease.token);
    let done = store
        .finish(
            &woke.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded);
    let d = detail(&store, &run.id).await;
    assert_eq!(d.attempts.len(), 2, "two executions of attempt 1");
    assert_eq!(d.attempts[0].number, 1);
    assert_eq!(d.attempts[0].suspended_until, Some(T0 + 60_000));
    assert_eq!(d.attempts[1].number, 1);
    assert_eq!(d.attempts[1].suspended_until, None);
}

async fn release_resumed(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 100,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    clock.advance(100);
    let woke = claim(&store, "w", 1).await.remove(0);
    let r = store.finish(&woke.lease, Outcome::Released).await.unwrap();
    assert_eq!(
        r.attempt, 1,
        "the attempt begun before the sleep still counts"
    );
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(
        (again.run.id.as_str(), again.run.attempt),
        (run.id.as_str(), 1)
    );
}

async fn cancel(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 3).await;
    let queued = enqueue(&store, "f", "1").await;
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:test"))
        .await
        .unwrap();
    assert_eq!((r.status, r.finished_at), (RunStatus::Cancelled, Some(T0)));
    let again = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &queued.id, "key:test"))
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let missing = store
        .cancel(RunAction::cancel("someone-else", &queued.id, "key:test"))
        .await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );

    let sleeper = enqueue(&store, "f", "2").await;
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, sleeper.id, "the cancelled run is never claimed");
    store
        .finish(
            &c.lease,
            Outcome::Suspended {
                until: T0 + 60_000,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &sleeper.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    clock.advance(60_000);
    assert!(
        claim(&store, "w", 1).await.is_empty(),
        "a cancelled sleeper never wakes"
    );

    let running = enqueue(&store, "f", "3").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &running.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(
        r.status,
        RunStatus::Running,
        "a running run ends when its attempt stops"
    );
    let renewal = store
        .renew(std::slice::from_ref(&c.lease), LEASE)
        .await
        .unwrap();
    assert_eq!(
        renewal,
        Renewal {
            lost: vec![],
            cancelling: vec![running.id.clone()]
        },
        "renewal tells the worker to stop, and that the lease is still held"
    );
    let error = RunError::new(ErrorReason::Host, "attempt cancelled");
    let r = store
        .finish(
            &c.lease,
            Outcome::Failed {
                error,
                retry_in_ms: Some(60_001),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled, "not retried");
    assert!(r.finished_at.is_some());
}

async fn manual_retry(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 2).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let r = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.due_at, r.finished_at),
        (RunStatus::Queued, T0, None)
    );
    assert_eq!(
        r.settings.retry.max_attempts, 3,
        "one used + a fresh budget of 2"
    );
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.attempt, 2);
    let conflict = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await;
    assert!(
        matches!(conflict, Err(StoreError::Conflict(_))),
        "running: {conflict:?}"
    );
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let conflict = store
        .retry(RunAction::retry(DEFAULT_TENANT, &run.id, "key:test"))
        .await;
    assert!(
        matches!(conflict, Err(StoreError::Conflict(_))),
        "succeeded: {conflict:?}"
    );
    clock.advance(1);
    let cancelled = enqueue(&store, "f", "{}").await;
    store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &cancelled.id, "key:test"))
        .await
        .unwrap();
    let r = store
        .retry(RunAction::retry(DEFAULT_TENANT, &cancelled.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Queued);
}

async fn idempotency(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    deploy_fn(&store, "g", "d", 1).await;
    let req = |function: &str, key: &str| EnqueueRequest {
        tenant: DEFAULT_TENANT.into(),
        function: function.into(),
        input: b"{}".to_vec(),
        trigger: "api".into(),
        due_at: None,
        idempotency_key: Some(key.into()),
        retry: None,
        parent: None,
        priority: None,
    };
    let first = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(first.created);
    assert_eq!(first.run.idempotency_key.as_deref(), Some("k1"));
    clock.advance(IDEMPOTENCY_WINDOW_MS - 1);
    let second = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.run.id, first.run.id);
    let other_fn = store.enqueue(req("g", "k1")).await.unwrap();
    assert!(other_fn.created, "keys are per function");
    clock.advance(1);
    let later = store.enqueue(req("f", "k1")).await.unwrap();
    assert!(later.created, "the window has passed");
    assert_ne!(later.run.id, first.run.id);
    assert_eq!(store.runs(query(Some("f"), None)).await.unwrap().len(), 2);
}

async fn retry_override(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let policy = RetryPolicy {
        max_attempts: 7,
        ..RetryPolicy::default()
    };
    let run = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            due_at: None,
            idempotency_key: None,
            retry: Some(policy),
            parent: None,
            priority: None,
        })
        .await
        .unwrap()
        .run;
    assert_eq!(run.settings.retry, policy);
    assert_eq!(
        run.settings.limits,
        Limits::default(),
        "limits still come from the function"
    );
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
        })
        .await
        .expect("send event")
}

async fn wait_event(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    let r = store
        .finish(
            &c.lease,
            waiting_for_event(Some(r#"{"order": 7}"#), Some(T0 + 60_000)),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Waiting);
    assert!(r.wait.is_some());
    let other = send(&store, "order.paid", serde_json::json!({"order": 8}), None).await;
    assert!(
        other.resumed.is_empty(),
        "a non-matching event does not resume it"
    );
    let other_name = send(
        &store,
        "order.shipped",
        serde_json::json!({"order": 7}),
        None,
    )
    .await;
    assert!(other_name.resumed.is_empty());
    clock.advance(10);
    assert!(claim(&store, "w", 1).await.is_empty(), "still waiting");
    let hit = send(
        &store,
        "order.paid",
        serde_json::json!({"order": 7, "amount": 12}),
        None,
    )
    .await;
    assert_eq!(hit.resumed, std::slice::from_ref(&run.id));
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(again.run.id, run.id);
    assert_eq!(again.run.attempt, 1, "resuming is not a retry");
    assert_eq!(
        step_output(&again.steps, "paid"),
        Resolution::Event {
            data: serde_json::json!({"order": 7, "amount": 12})
        }
    );
    let second = send(&store, "order.paid", serde_json::json!({"order": 7}), None).await;
    assert!(second.resumed.is_empty(), "a wait resolves once");
}

/// More waiters than any backend reads in one page: all the matching ones resume, and only
/// those, from one event.
async fn many_waiters(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    const N: usize = 1_200;
    for i in 0..N {
        enqueue(&store, "f", &i.to_string()).await;
    }
    let mut odd = Vec::new();
    for _ in 0..N / 100 {
        for c in claim(&store, "w", 100).await {
            let n: usize = String::from_utf8_lossy(&c.run.input).parse().unwrap();
            let filter = if n % 2 == 1 {
                odd.push(c.run.id.clone());
                r#"{"odd": true}"#
            } else {
                r#"{"odd": false}"#
            };
            store
                .finish(&c.lease, waiting_for_event(Some(filter), None))
                .await
                .unwrap();
        }
    }
    clock.advance(1);
    let sent = send(&store, "order.paid", serde_json::json!({"odd": true}), None).await;
    let mut resumed = sent.resumed;
    resumed.sort();
    odd.sort();
    assert_eq!(resumed.len(), N / 2);
    assert_eq!(resumed, odd, "exactly the matching waiters resume");
}

async fn wait_timeout(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let run = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, waiting_for_event(None, Some(T0 + 5_000)))
        .await
        .unwrap();
    clock.set(T0 + 4_999);
    assert!(claim(&store, "w", 1).await.is_empty());
    clock.set(T0 + 5_000);
    let again = claim(&store, "w", 1).await.remove(0);
    assert_eq!(again.run.id, run.id);
    assert_eq!(step_output(&again.steps, "paid"), Resolution::TimedOut);
    let late = send(&store, "order.paid", serde_json::json!({}), None).await;
    assert!(
        late.resumed.is_empty(),
        "a timed-out wait ignores later events"
    );

    // Waiting with no time limit, then cancelled.
    let forever = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1)
        .await
        .into_iter()
        .find(|c| c.run.id == forever.id)
        .unwrap();
    store
        .finish(&c.lease, waiting_for_event(None, None))
        .await
        .unwrap();
    clock.advance(365 * 24 * 3600 * 1000);
    assert!(
        claim(&store, "w", 10)
            .await
            .iter()
            .all(|c| c.run.id != forever.id)
    );
    let r = store
        .cancel(RunAction::cancel(DEFAULT_TENANT, &forever.id, "key:test"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
}

async fn event_subscribers(store: impl Store, _clock: ManualClock) {
    store
        .deploy(DeployRequest {
            tenant: DEFAULT_TENANT.into(),
            name: "welcome".into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: settings(1),
            events: vec!["user.signup".into()],
            schedule: Some(Schedule {
                crons: vec!["0 9 * * MON-FRI".into()],
                tz: "Europe/Berlin".into(),
                missed: Missed::Latest,
                paused: false,
                resumed_at: None,
            }),
        })
        .await
        .unwrap();
    deploy_fn(&store, "unrelated", "d", 1).await;
    let f = store
        .function(DEFAULT_TENANT, "welcome")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(f.events, ["user.signup"]);
    assert_eq!(
        f.schedule.as_ref().map(|s| (s.tz.as_str(), s.missed)),
        Some(("Europe/Berlin", Missed::Latest))
    );
    let sent = send(
        &store,
        "user.signup",
        serde_json::json!({"user": 1}),
        Some("evt-1"),
    )
    .await;
    assert!(sent.accepted);
    assert_eq!(sent.id, "evt-1");
    assert_eq!(sent.started.len(), 1);
    let run = detail(&store, &sent.started[0]).await.run;
    assert_eq!(
        (run.function.as_str(), run.trigger.as_str()),
        ("welcome", "event:user.signup")
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&run.input).unwrap(),
        serde_json::json!({"user": 1})
    );
    let dup = send(
        &store,
        "user.signup",
        serde_json::json!({"user": 1}),
        Some("evt-1"),
    )
    .await;
    assert!(!dup.accepted, "an event id is a dedup key");
    assert!(dup.started.is_empty());
    assert_eq!(
        store
            .runs(query(Some("welcome"), None))
            .await
            .unwrap()
            .len(),
        1
    );
    let other = send(&store, "user.signup", serde_json::json!({"user": 2}), None).await;
    assert!(
        other.accepted && other.started.len() == 1,
        "no id: always a new event"
    );
}

async fn wait_run(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let parent = enqueue(&store, "f", "{}").await;
    let p = claim(&store, "w", 1).await.remove(0);
    let child = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: format!("child:{}", parent.id),
            due_at: None,
            idempotency_key: Some(format!("child:{}:call:0", parent.id)),
            retry: None,
            parent: Some(parent.id.clone()),
            priority: None,
        })
        .await
        .unwrap()
        .run;
    assert_eq!(child.parent.as_deref(), Some(parent.id.as_str()));
    let wait = |id: &str| Outcome::Waiting {
        wait: Wait {
            step: "call".into(),
            occurrence: 0,
            on: WaitOn::Run { id: id.into() },
            until: None,
        },
        fuel_used: None,
    };
    let r = store.finish(&p.lease, wait(&child.id)).await.unwrap();
    assert_eq!(r.status, RunStatus::Waiting);
    let c = claim(&store, "w", 1).await.remove(0);
    assert_eq!(c.run.id, child.id, "the parent waits; the child runs");
    clock.advance(5);
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: br#"{"sum":3}"#.to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let p = claim(&store, "w", 1).await.remove(0);
    assert_eq!(p.run.id, parent.id, "the child's end resumes the parent");
    assert_eq!(
        step_output(&p.steps, "call"),
        Resolution::Output {
            output: serde_json::json!({"sum": 3})
        }
    );

    // Waiting on a run that already ended resolves at once; a failed one is an error.
    let failing = enqueue(&store, "f", "{}").await;
    let f = claim(&store, "w", 1)
        .await
        .into_iter()
        .find(|c| c.run.id == failing.id)
        .unwrap();
    store
        .finish(&f.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let r = store
        .finish(
            &p.lease,
            Outcome::Waiting {
                wait: Wait {
                    step: "join".into(),
                    occurrence: 0,
                    on: WaitOn::Run {
                        id: failing.id.clone(),
                    },
                    until: None,
                },
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Sleeping, "resolved at once, due now");
    let p = claim(&store, "w", 1).await.remove(0);
    assert!(
        matches!(step_output(&p.steps, "join"), Resolution::Error { message } if message.contains("boom"))
    );
}

async fn purge(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let ok = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .record(
            &c.lease,
            Record::Step {
                name: "s".into(),
                occurrence: 0,
                output: b"1".to_vec(),
                logs: vec![],
            },
        )
        .await
        .unwrap();
    store
        .finish(
            &c.lease,
            Outcome::Succeeded {
                output: b"1".to_vec(),
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let bad = enqueue(&store, "f", "{}").await;
    let c = claim(&store, "w", 1).await.remove(0);
    store
        .finish(&c.lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let queued = enqueue(&store, "f", "{}").await;
    let child = store
        .enqueue(EnqueueRequest {
            tenant: DEFAULT_TENANT.into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "child".into(),
            due_at: Some(T0 + 1_000_000),
            idempotency_key: None,
            retry: None,
            parent: Some(queued.id.clone()),
            priority: None,
        })
        .await
        .unwrap()
        .run;
    let kids = store
        .runs(RunQuery {
            parent: Some(queued.id.clone()),
            ..query(None, None)
        })
        .await
        .unwrap();
    assert_eq!(kids.len(), 1, "children listed by parent");
    assert_eq!(kids[0].id, child.id);

    clock.advance(100);
    let req = |succeeded_before, failed_before| PurgeRequest {
        succeeded_before,
        failed_before,
        limit: 100,
    };
    assert_eq!(
        store.purge(req(T0, T0)).await.unwrap(),
        0,
        "nothing ended before T0"
    );
    assert_eq!(
        store.purge(req(T0 + 50, T0)).await.unwrap(),
        1,
        "the succeeded run"
    );
    assert!(store.run(DEFAULT_TENANT, &ok.id).await.unwrap().is_none());
    assert!(
        store
            .logs(DEFAULT_TENANT, &ok.id, 0, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store.run(DEFAULT_TENANT, &bad.id).await.unwrap().is_some(),
        "failures are kept longer"
    );
    assert_eq!(
        store.purge(req(T0 + 50, T0 + 50)).await.unwrap(),
        1,
        "the failed run"
    );
    assert!(store.run(DEFAULT_TENANT, &bad.id).await.unwrap().is_none());
    assert_eq!(
        store.purge(req(i64::MAX, i64::MAX)).await.unwrap(),
        0,
        "unfinished runs are never purged"
    );
    assert!(
        store
            .run(DEFAULT_TENANT, &queued.id)
            .await
            .unwrap()
            .is_some()
    );
}

fn tenant(name: &str) -> Tenant {
    Tenant {
        name: name.into(),
        created_at: T0,
        quotas: Quotas::default(),
    }
}

async fn tenants(store: impl Store + Directory, _clock: ManualClock) {
    store.create_tenant(tenant("zeta")).await.expect("create");
    store.create_tenant(tenant("acme")).await.expect("create");
    let again = store.create_tenant(tenant("acme")).await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let names: Vec<String> = store
        .tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["acme", "zeta"]);
    let quotas = Quotas {
        max_queued: 5,
        max_running: 2,
        ..Quotas::default()
    };
    let t = store.set_quotas("acme", quotas).await.expect("set quotas");
    assert_eq!(t.quotas, quotas);
    assert_eq!(store.tenant("acme").await.unwrap().unwrap().quotas, quotas);
    assert_eq!(
        store.tenant("zeta").await.unwrap().unwrap().quotas,
        Quotas::default()
    );
    assert!(store.tenant("nobody").await.unwrap().is_none());
    let missing = store.set_quotas("nobody", quotas).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
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

async fn keys(store: impl Store + Directory, _clock: ManualClock) {
    let orphan = store.create_key(api_key("k0", "nobody", T0)).await;
    assert!(matches!(orphan, Err(StoreError::NotFound(_))), "{orphan:?}");
    store.create_tenant(tenant("acme")).await.unwrap();
    store.create_tenant(tenant("other")).await.unwrap();
    store
        .create_key(api_key("k2", "acme", T0 + 2))
        .await
        .unwrap();
    store
        .create_key(api_key("k1", "acme", T0 + 1))
        .await
        .unwrap();
    store
        .create_key(api_key("k3", "other", T0 + 3))
        .await
        .unwrap();
    let dup = store.create_key(api_key("k1", "other", T0 + 4)).await;
    assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");

    assert_eq!(
        store.key("k1").await.unwrap(),
        Some(api_key("k1", "acme", T0 + 1))
    );
    assert_eq!(store.key("nope").await.unwrap(), None);
    let ids: Vec<String> = store
        .keys("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(ids, ["k1", "k2"], "oldest first, only the tenant's");

    // Another tenant cannot revoke it; revoking twice keeps the first time.
    let wrong = store.revoke_key("other", "k1", T0 + 10).await;
    assert!(matches!(wrong, Err(StoreError::NotFound(_))), "{wrong:?}");
    assert_eq!(store.key("k1").await.unwrap().unwrap().revoked_at, None);
    let revoked = store.revoke_key("acme", "k1", T0 + 10).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(T0 + 10));
    let again = store.revoke_key("acme", "k1", T0 + 20).await.unwrap();
    assert_eq!(again.revoked_at, Some(T0 + 10));
    assert_eq!(
        store.key("k1").await.unwrap().unwrap().revoked_at,
        Some(T0 + 10)
    );
    assert_eq!(
        store.keys("acme").await.unwrap().len(),
        2,
        "revoked keys stay listed"
    );
}

async fn usage(store: impl Store + Directory, clock: ManualClock) {
    assert_eq!(store.usage(DEFAULT_TENANT).await.unwrap(), Usage::default());
    deploy_fn(&store, "f", "d1", 3).await;
    for _ in 0..4 {
        enqueue(&store, "f", "{}").await;
    }
    let c = claim(&store, "w", 4).await;
    assert_eq!(c.len(), 4);
    let ok = Outcome::Succeeded {
        output: b"{}".to_vec(),
        fuel_used: Some(1_000),
    };
    store.finish(&c[0].lease, ok).await.unwrap();
    store
        .finish(&c[1].lease, failed(ErrorReason::Trap, None))
        .await
        .unwrap();
    // Given back at shutdown: not an ended execution, nothing to bill.
    store.finish(&c[2].lease, Outcome::Released).await.unwrap();
    // An execution that ends by sleeping or waiting burned fuel too.
    let sleep = Outcome::Suspended {
        until: T0 + 60_000,
        fuel_used: Some(20),
    };
    store.finish(&c[3].lease, sleep).await.unwrap();
    clock.advance(1);
    let c = claim(&store, "w", 1).await;
    assert_eq!(c.len(), 1, "the released run is back");
    let mut wait = waiting_for_event(None, None);
    if let Outcome::Waiting { fuel_used, .. } = &mut wait {
        *fuel_used = Some(300);
    }
    store.finish(&c[0].lease, wait).await.unwrap();
    let u = store.usage(DEFAULT_TENANT).await.unwrap();
    assert_eq!((u.fuel, u.attempts), (1_327, 4), "{u:?}");
    assert!(u.stored_bytes > 0, "what the runs keep is counted: {u:?}");
    assert_eq!(store.usage("someone-else").await.unwrap(), Usage::default());
}

async fn audit(store: impl Store + Directory, _clock: ManualClock) {
    let entry = |n: i64, tenant: &str| AuditEntry {
        at: T0 + n,
        tenant: tenant.into(),
        actor: "admin".into(),
        action: "deploy".into(),
        target: format!("f{n}"),
    };
    for (n, t) in [(1, "a"), (2, "b"), (3, "a")] {
        store.audit(entry(n, t)).await.unwrap();
    }
    assert_eq!(
        store.audit_log(None, 10).await.unwrap(),
        [entry(3, "a"), entry(2, "b"), entry(1, "a")]
    );
    assert_eq!(
        store.audit_log(Some("a"), 10).await.unwrap(),
        [entry(3, "a"), entry(1, "a")]
    );
    assert_eq!(store.audit_log(None, 1).await.unwrap(), [entry(3, "a")]);
    assert!(store.audit_log(Some("c"), 10).await.unwrap().is_empty());
}

// ---- Flow control, tenant quotas and fairness ----

fn key(expr: &str) -> Option<KeyExpr> {
    Some(KeyExpr::parse(expr).expect("valid key expression"))
}

async fn deploy_flow(store: &impl Store, tenant: &str, name: &str, flow: FlowControl) {
    store
        .deploy(DeployRequest {
            tenant: tenant.into(),
            name: name.into(),
            digest: "d".into(),
            component: b"c".to_vec(),
            settings: FunctionSettings {
                flow,
                ..settings(3)
            },
            events: vec![format!("{name}.go")],
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

async fn concurrency_keys(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            concurrency: Some(ConcurrencyLimit {
                limit: 1,
                key: key("input.c"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let a1 = enq(&store, "f", json!({"c": "a"})).await;
    let a2 = enq(&store, "f", json!({"c": "a"})).await;
    let b1 = enq(&store, "f", json!({"c": "b"})).await;
    assert_eq!(a1.keys.concurrency.as_deref(), Some("a"));
    let got = claim(&store, "w", 10).await;
    assert_eq!(
        ids(&got),
        [a1.id.clone(), b1.id.clone()],
        "one per key, keys in parallel"
    );
    assert!(claim(&store, "w", 10).await.is_empty(), "a's slot is taken");
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &a2.id).await.status,
        RunStatus::Queued,
        "held back, not dropped"
    );
    clock.advance(5);
    store.finish(&got[0].lease, ok()).await.unwrap();
    let next = claim(&store, "w", 10).await;
    assert_eq!(ids(&next), [a2.id.as_str()], "the freed slot goes to a2");

    // Without a key the limit is the function's; a sleeping run frees its slot, and its
    // wake-up waits for one like any other run.
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "g",
        FlowControl {
            concurrency: Some(ConcurrencyLimit {
                limit: 2,
                key: None,
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let g: Vec<Run> = vec![
        enq(&store, "g", json!({})).await,
        enq(&store, "g", json!({})).await,
        enq(&store, "g", json!({})).await,
    ];
    let first = claim(&store, "w", 10).await;
    assert_eq!(ids(&first), [g[0].id.clone(), g[1].id.clone()]);
    let now = clock.now_ms();
    store
        .finish(
            &first[0].lease,
            Outcome::Suspended {
                until: now + 100,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    let third = claim(&store, "w", 10).await;
    assert_eq!(ids(&third), [g[2].id.clone()], "the sleeper's slot is free");
    clock.advance(100);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "the woken sleeper waits for a slot"
    );
    store
        .finish(&first[1].lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let woke = claim(&store, "w", 10).await;
    assert_eq!(ids(&woke), [g[0].id.clone()]);
    assert_eq!(woke[0].run.attempt, 1, "a resume, not a new attempt");
}

async fn throttle(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            throttle: Some(RateLimit {
                limit: 2,
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let mut a = vec![];
    for _ in 0..5 {
        a.push(enq(&store, "f", json!({"k": "a"})).await);
    }
    let b = enq(&store, "f", json!({"k": "b"})).await;
    let first = claim(&store, "w", 10).await;
    assert_eq!(
        ids(&first),
        [a[0].id.clone(), a[1].id.clone(), b.id.clone()]
    );
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "a's window is full"
    );
    // Retries are not throttled: only first starts count.
    store
        .finish(&first[0].lease, failed(ErrorReason::Retryable, Some(0)))
        .await
        .unwrap();
    let retried = claim(&store, "w", 10).await;
    assert_eq!(ids(&retried), [a[0].id.clone()]);
    assert_eq!(retried[0].run.attempt, 2);
    clock.advance(999);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "not before the window moves"
    );
    clock.advance(1);
    let second = claim(&store, "w", 10).await;
    assert_eq!(ids(&second), [a[2].id.clone(), a[3].id.clone()]);
    clock.advance(500);
    assert!(claim(&store, "w", 10).await.is_empty());
    clock.advance(500);
    assert_eq!(ids(&claim(&store, "w", 10).await), [a[4].id.clone()]);
    let skipped = store
        .runs(query(None, Some(RunStatus::Skipped)))
        .await
        .unwrap();
    assert!(skipped.is_empty(), "a throttle drops nothing");
}

async fn rate_limit(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            rate_limit: Some(RateLimit {
                limit: 2,
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let a1 = enq(&store, "f", json!({"k": "a"})).await;
    let a2 = enq(&store, "f", json!({"k": "a"})).await;
    let over = try_enqueue(&store, DEFAULT_TENANT, "f", json!({"k": "a"}), None, None)
        .await
        .unwrap();
    assert!(over.created, "a skipped run is still recorded");
    assert_eq!(over.run.status, RunStatus::Skipped);
    assert_eq!(over.run.finished_at, Some(T0));
    let err = over.run.error.clone().expect("a skipped run says why");
    assert_eq!(err.reason, ErrorReason::RateLimited);
    assert!(err.message.contains("\"a\""), "{}", err.message);
    let b1 = enq(&store, "f", json!({"k": "b"})).await;
    assert_eq!(
        (a1.status, a2.status, b1.status),
        (RunStatus::Queued, RunStatus::Queued, RunStatus::Queued)
    );
    let skipped: Vec<String> = store
        .runs(query(None, Some(RunStatus::Skipped)))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(skipped, [over.run.id.as_str()]);
    clock.advance(999);
    let late = enq(&store, "f", json!({"k": "a"})).await;
    assert_eq!(
        late.status,
        RunStatus::Skipped,
        "the window has not moved yet"
    );
    clock.advance(1);
    let a3 = enq(&store, "f", json!({"k": "a"})).await;
    assert_eq!(a3.status, RunStatus::Queued);
    let got = claim(&store, "w", 10).await;
    let mut got = ids(&got);
    got.sort();
    let mut want = vec![a1.id, a2.id, b1.id, a3.id];
    want.sort();
    assert_eq!(got, want, "skipped runs are never claimed");
}

async fn debounce(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            debounce: Some(Debounce {
                period_ms: 1000,
                key: key("input.k"),
            }),
            ..FlowControl::default()
        },
    )
    .await;
    let r1 = enq(&store, "f", json!({"k": "x", "n": 1})).await;
    clock.advance(100);
    let r2 = enq(&store, "f", json!({"k": "x", "n": 2})).await;
    clock.advance(100);
    let r3 = enq(&store, "f", json!({"k": "x", "n": 3})).await;
    let y = enq(&store, "f", json!({"k": "y"})).await;
    assert_eq!((r3.status, r3.due_at), (RunStatus::Queued, T0 + 1200));
    for (old, by) in [(&r1, &r2), (&r2, &r3)] {
        let old = status_of(&store, DEFAULT_TENANT, &old.id).await;
        assert_eq!(old.status, RunStatus::Skipped);
        let err = old.error.expect("a replaced run says by whom");
        assert_eq!(err.reason, ErrorReason::Debounced);
        assert!(err.message.contains(&by.id), "{}", err.message);
    }
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &y.id).await.status,
        RunStatus::Queued,
        "keys debounce separately"
    );
    clock.set(T0 + 1199);
    assert!(claim(&store, "w", 10).await.is_empty());
    clock.set(T0 + 1200);
    let got = claim(&store, "w", 10).await;
    assert_eq!(ids(&got), [r3.id.clone(), y.id.clone()]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[0].run.input).unwrap(),
        json!({"k": "x", "n": 3}),
        "the last input"
    );
    // A run that started is no longer replaced.
    let r4 = enq(&store, "f", json!({"k": "x", "n": 4})).await;
    assert_eq!(r4.due_at, T0 + 2200);
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &r3.id).await.status,
        RunStatus::Running
    );
}

async fn priority(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_flow(
        &store,
        DEFAULT_TENANT,
        "f",
        FlowControl {
            priority: 10,
            priority_aging_ms: 100,
            ..FlowControl::default()
        },
    )
    .await;
    let low1 = enq(&store, "f", json!({})).await;
    let low2 = enq(&store, "f", json!({})).await;
    let high = try_enqueue(&store, DEFAULT_TENANT, "f", json!({}), Some(1), None)
        .await
        .unwrap()
        .run;
    assert_eq!((low1.priority, high.priority), (10, 1));
    let order: Vec<String> = [
        claim(&store, "w", 1).await,
        claim(&store, "w", 1).await,
        claim(&store, "w", 1).await,
    ]
    .iter()
    .flat_map(|c| ids(c))
    .collect();
    assert_eq!(
        order,
        [high.id, low1.id, low2.id],
        "lower first, FIFO within"
    );

    // Aging: a priority-10 run ranks as if due 9 × 100 ms after a priority-1 run of the
    // same time, so a steady stream of priority-1 runs overtakes it for 900 ms only.
    let starving = enq(&store, "f", json!({})).await;
    let start = clock.now_ms();
    let mut started_after = None;
    for i in 1..=20 {
        clock.advance(100);
        try_enqueue(&store, DEFAULT_TENANT, "f", json!({}), Some(1), None)
            .await
            .unwrap();
        if claim(&store, "w", 1).await[0].run.id == starving.id {
            started_after = Some(i);
            break;
        }
    }
    assert_eq!(
        started_after,
        Some(9),
        "starts once newer runs rank after it ({} ms of priority-1 runs first)",
        clock.now_ms() - start
    );
}

async fn max_queued(store: impl Store + Directory, _clock: ManualClock) {
    use serde_json::json;
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_queued: 2,
                ..Quotas::default()
            },
            ..tenant("q")
        })
        .await
        .unwrap();
    deploy_flow(&store, "q", "f", FlowControl::default()).await;
    let first = try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .unwrap();
    let refused = try_enqueue(&store, "q", "f", json!({}), None, None).await;
    match refused {
        Err(StoreError::QuotaExceeded { retry_after_ms, .. }) => assert!(retry_after_ms > 0),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    let count = |runs: Vec<Run>| runs.len();
    let q = || RunQuery {
        tenant: "q".into(),
        limit: 100,
        ..RunQuery::default()
    };
    assert_eq!(count(store.runs(q()).await.unwrap()), 2, "nothing created");
    // Events are refused as a whole; children of admitted runs are not refused.
    let event = store
        .send_event(EventRequest {
            tenant: "q".into(),
            name: "f.go".into(),
            data: json!({}),
            id: Some("e1".into()),
        })
        .await;
    assert!(
        matches!(event, Err(StoreError::QuotaExceeded { .. })),
        "{event:?}"
    );
    // Children of admitted runs go on past max_queued, up to twice it: no further.
    for _ in 0..2 {
        let child = try_enqueue(&store, "q", "f", json!({}), None, Some(&first.id))
            .await
            .expect("a child may go past max_queued");
        assert_eq!(child.run.status, RunStatus::Queued);
    }
    let third = try_enqueue(&store, "q", "f", json!({}), None, Some(&first.id)).await;
    assert!(
        matches!(third, Err(StoreError::QuotaExceeded { .. })),
        "children cannot grow the queue past twice max_queued: {third:?}"
    );
    assert_eq!(count(store.runs(q()).await.unwrap()), 4);
    // Starting runs makes room, for new runs only below max_queued.
    let started = claim(&store, "w", 2).await;
    assert_eq!(started.len(), 2);
    assert!(
        try_enqueue(&store, "q", "f", json!({}), None, None)
            .await
            .is_err(),
        "2 queued: still full"
    );
    let more = claim(&store, "w", 2).await;
    assert_eq!(more.len(), 2);
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .expect("room again");
    try_enqueue(&store, "q", "f", json!({}), None, None)
        .await
        .expect("room again");
    assert!(
        try_enqueue(&store, "q", "f", json!({}), None, None)
            .await
            .is_err()
    );
    let sent = store
        .send_event(EventRequest {
            tenant: "q".into(),
            name: "f.go".into(),
            data: json!({}),
            id: Some("e1".into()),
        })
        .await;
    assert!(sent.is_err(), "still full");
    // A manual retry queues a run again: refused while the queue is full.
    let dead = store
        .finish(&started[0].lease, failed(ErrorReason::Fatal, None))
        .await
        .unwrap();
    let retried = store
        .retry(RunAction::retry("q", &dead.id, "key:test"))
        .await;
    assert!(
        matches!(retried, Err(StoreError::QuotaExceeded { .. })),
        "{retried:?}"
    );
    assert_eq!(claim(&store, "w", 1).await.len(), 1);
    let retried = store
        .retry(RunAction::retry("q", &dead.id, "key:test"))
        .await
        .expect("room for it now");
    assert_eq!(retried.status, RunStatus::Queued);
    // A tenant without a record has no quotas.
    deploy_flow(&store, "free", "f", FlowControl::default()).await;
    for _ in 0..5 {
        try_enqueue(&store, "free", "f", json!({}), None, None)
            .await
            .expect("unlimited");
    }
}

async fn max_running(store: impl Store + Directory, clock: ManualClock) {
    use serde_json::json;
    store
        .create_tenant(Tenant {
            quotas: Quotas {
                max_running: 2,
                ..Quotas::default()
            },
            ..tenant("r")
        })
        .await
        .unwrap();
    deploy_flow(&store, "r", "f", FlowControl::default()).await;
    for _ in 0..4 {
        try_enqueue(&store, "r", "f", json!({}), None, None)
            .await
            .unwrap();
    }
    let first = claim(&store, "w", 10).await;
    assert_eq!(first.len(), 2, "at most max_running at once");
    assert!(claim(&store, "w", 10).await.is_empty());
    store.finish(&first[0].lease, ok()).await.unwrap();
    let next = claim(&store, "w", 10).await;
    assert_eq!(next.len(), 1);
    let now = clock.now_ms();
    store
        .finish(
            &next[0].lease,
            Outcome::Suspended {
                until: now + 50,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        claim(&store, "w", 10).await.len(),
        1,
        "a sleeper frees its slot"
    );
    clock.advance(50);
    assert!(
        claim(&store, "w", 10).await.is_empty(),
        "the woken sleeper waits too"
    );
    // Raising the quota applies to the next claim.
    store
        .set_quotas(
            "r",
            Quotas {
                max_running: 3,
                ..Quotas::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(claim(&store, "w", 10).await.len(), 1);
}

async fn fairness(store: impl Store, _clock: ManualClock) {
    use serde_json::json;
    deploy_flow(&store, "noisy", "f", FlowControl::default()).await;
    deploy_flow(&store, "quiet", "f", FlowControl::default()).await;
    for _ in 0..300 {
        try_enqueue(&store, "noisy", "f", json!({}), None, None)
            .await
            .unwrap();
    }
    let quiet = try_enqueue(&store, "quiet", "f", json!({}), None, None)
        .await
        .unwrap()
        .run;
    let got = claim(&store, "w", 2).await;
    assert!(
        got.iter().any(|c| c.run.id == quiet.id),
        "the quiet tenant's run goes in the first claim of two"
    );
    let tenants: Vec<&str> = got.iter().map(|c| c.lease.tenant.as_str()).collect();
    assert!(tenants.contains(&"noisy"), "{tenants:?}");
}

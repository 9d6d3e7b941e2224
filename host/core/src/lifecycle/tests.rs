//! Each rule of the lifecycle on its own, with the cases backends must not confuse.

use super::*;

fn ending(cancel_requested: bool, resumed: bool) -> Ending<'static> {
    Ending {
        id: "r1",
        cancel_requested,
        resumed,
    }
}

fn failed(retry_in_ms: Option<u64>) -> Outcome {
    Outcome::Failed {
        error: RunError::new(ErrorReason::Retryable, "boom"),
        retry_in_ms,
        fuel_used: Some(7),
    }
}

#[test]
fn a_failure_requeues_after_its_backoff_or_ends_the_run() {
    let t = finish(ending(false, false), &failed(Some(500)), 1_000);
    assert_eq!(t.status, RunStatus::Queued);
    assert_eq!(t.due_at, Some(1_500));
    assert_eq!(t.resolution, None);
    assert_eq!(t.usage.fuel, Some(7));
    let t = finish(ending(false, false), &failed(None), 1_000);
    assert_eq!(t.status, RunStatus::Failed);
    assert_eq!(t.finished_at, Some(1_000));
    assert_eq!(
        t.resolution,
        Some(Resolution::Error {
            message: "retryable: boom".into()
        })
    );
}

#[test]
fn a_requested_cancel_wins_over_everything_but_success() {
    for outcome in [
        failed(Some(1)),
        Outcome::Released,
        Outcome::Suspended {
            until: 5,
            fuel_used: None,
        },
    ] {
        let t = finish(ending(true, false), &outcome, 9);
        assert_eq!(t.status, RunStatus::Cancelled, "{outcome:?}");
        assert_eq!(t.error, Change::Keep, "keeps the cancel's reason");
        assert_eq!(t.resolution, Some(cancelled_resolution("r1")));
    }
    let won = Outcome::Succeeded {
        output: b"1".to_vec(),
        fuel_used: None,
    };
    assert_eq!(
        finish(ending(true, false), &won, 9).status,
        RunStatus::Succeeded
    );
}

#[test]
fn a_release_gives_the_attempt_back_unless_it_resumed() {
    let fresh = finish(ending(false, false), &Outcome::Released, 3);
    assert_eq!(
        (fresh.status, fresh.give_back_attempt),
        (RunStatus::Queued, true)
    );
    assert_eq!(fresh.execution, Some(Execution::Drop));
    assert_eq!(fresh.usage, Usage::default(), "not billed");
    let resumed = finish(ending(false, true), &Outcome::Released, 3);
    assert_eq!(
        (resumed.status, resumed.give_back_attempt),
        (RunStatus::Sleeping, false)
    );
}

#[test]
fn a_lost_lease_requeues_until_its_cap() {
    let run = |attempt| Expired {
        id: "r1",
        attempt,
        max_attempts: 1,
        worker: Some("w1"),
        cancel_requested: false,
    };
    let t = lease_expired(run(MAX_LOST_LEASE_EXTRA_ATTEMPTS), 10);
    assert_eq!(t.status, RunStatus::Queued);
    let t = lease_expired(run(1 + MAX_LOST_LEASE_EXTRA_ATTEMPTS), 10);
    assert_eq!(t.status, RunStatus::Failed);
    let Change::Set(e) = &t.error else {
        panic!("{t:?}")
    };
    assert_eq!(
        e.message,
        format!(
            "worker w1 stopped renewing its lease during attempt {}",
            1 + MAX_LOST_LEASE_EXTRA_ATTEMPTS
        )
    );
    let cancelled = lease_expired(
        Expired {
            cancel_requested: true,
            ..run(1)
        },
        10,
    );
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(cancelled.error, Change::Keep);
}

#[test]
fn cancel_and_retry_accept_only_their_statuses() {
    let e = || RunError::new(ErrorReason::Cancelled, "by key:k");
    assert!(cancel("r", RunStatus::Running, e(), 1).unwrap().is_none());
    assert_eq!(
        cancel("r", RunStatus::Queued, e(), 1)
            .unwrap()
            .unwrap()
            .status,
        RunStatus::Cancelled
    );
    let err = cancel("r", RunStatus::Succeeded, e(), 1).unwrap_err();
    assert_eq!(err.to_string(), "run r is already succeeded");
    assert_eq!(
        retry("r", RunStatus::Failed, 3, 1).unwrap().extra_attempts,
        3
    );
    let err = retry("r", RunStatus::Queued, 0, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "run r is queued: only failed or cancelled runs can be retried"
    );
}

#[test]
fn admission_caps_children_at_twice_the_quota() {
    assert!(admit("t", Admission::Run, 9, 1, Some(10)).is_ok());
    assert!(admit("t", Admission::Run, 10, 1, Some(10)).is_err());
    assert!(admit("t", Admission::Child, 19, 1, Some(10)).is_ok());
    assert!(admit("t", Admission::Child, 20, 1, Some(10)).is_err());
    assert!(admit("t", Admission::Event, 8, 3, Some(10)).is_err());
    assert!(admit("t", Admission::Run, u64::MAX, 1, None).is_ok());
}

#[test]
fn claims_number_attempts() {
    assert_eq!(claimed_attempt(RunStatus::Queued, 0), (1, false));
    assert_eq!(claimed_attempt(RunStatus::Queued, 2), (3, false));
    assert_eq!(claimed_attempt(RunStatus::Sleeping, 2), (2, true));
    assert_eq!(claimed_attempt(RunStatus::Sleeping, 0), (1, true));
}

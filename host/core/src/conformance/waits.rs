//! Scenarios of what a run waiting on another (`call`, `join`) receives, however the other
//! ends: the resolution [`crate::lifecycle`] computes, the same on every backend.

use super::*;
use crate::lifecycle;

/// Claims the one claimable run, which must be `id`.
async fn claim_only(store: &impl Store, id: &str) -> Claimed {
    let mut got = claim(store, "w", 10).await;
    assert_eq!(ids(&got), [id.to_owned()], "only {id} is claimable");
    got.remove(0)
}

/// A parent that now waits on a run `start` creates; returns (parent id, that run).
async fn waiting_parent<S: Store>(store: &S, start: impl AsyncFnOnce(&S) -> Run) -> (String, Run) {
    let parent = enqueue(store, "f", "{}").await;
    let p = claim_only(store, &parent.id).await;
    let target = start(store).await;
    let wait = Wait {
        step: "call".into(),
        occurrence: 0,
        on: WaitOn::Run {
            id: target.id.clone(),
        },
        until: None,
    };
    let r = store
        .finish(
            &p.lease,
            Outcome::Waiting {
                wait,
                fuel_used: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Waiting);
    (parent.id, target)
}

/// The parent resumed with this resolution; it then ends.
async fn resumed_with(store: &impl Store, parent: &str) -> Resolution {
    let p = claim_only(store, parent).await;
    let got = step_output(&p.steps, "call");
    let done = Outcome::Succeeded {
        output: b"{}".to_vec(),
        fuel_used: None,
    };
    store.finish(&p.lease, done).await.unwrap();
    got
}

pub(super) async fn every_end_reaches_the_waiter(store: impl Store, clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let new_run = async |s: &_| enqueue(s, "f", "{}").await;

    // Cancelled before it started.
    let (parent, target) = waiting_parent(&store, new_run).await;
    let by = RunAction::cancel(DEFAULT_TENANT, &target.id, "key:k1");
    store.cancel(by).await.unwrap();
    assert_eq!(
        resumed_with(&store, &parent).await,
        lifecycle::cancelled_resolution(&target.id)
    );

    // Cancelled while running: it ends cancelled when its attempt fails.
    let (parent, target) = waiting_parent(&store, new_run).await;
    let t = claim_only(&store, &target.id).await;
    let by = RunAction::cancel(DEFAULT_TENANT, &target.id, "key:k1");
    store.cancel(by).await.unwrap();
    let r = store
        .finish(&t.lease, failed(ErrorReason::Retryable, Some(1)))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(
        resumed_with(&store, &parent).await,
        lifecycle::cancelled_resolution(&target.id)
    );

    // Cancelled while running, and its worker vanished: the reaper ends it cancelled.
    let (parent, target) = waiting_parent(&store, new_run).await;
    claim_only(&store, &target.id).await;
    let by = RunAction::cancel(DEFAULT_TENANT, &target.id, "key:k1");
    store.cancel(by.clone()).await.unwrap();
    clock.advance(LEASE as i64);
    assert_eq!(
        resumed_with(&store, &parent).await,
        lifecycle::cancelled_resolution(&target.id)
    );
    let d = detail(&store, &target.id).await;
    assert_eq!(d.run.status, RunStatus::Cancelled);
    assert_eq!(
        d.run.error,
        Some(by.cancel_error()),
        "keeps the cancel's reason"
    );

    // Its worker vanished once too often: failed for good, and the waiter hears why.
    let (parent, target) = waiting_parent(&store, new_run).await;
    let mut attempt = 0;
    loop {
        let got = claim(&store, "w", 10).await;
        if got.iter().any(|c| c.run.id == parent) {
            assert_eq!(ids(&got), std::slice::from_ref(&parent));
            break;
        }
        assert_eq!(
            ids(&got),
            std::slice::from_ref(&target.id),
            "handed out again"
        );
        attempt = got[0].run.attempt;
        clock.advance(LEASE as i64);
    }
    assert_eq!(attempt, 1 + lifecycle::MAX_LOST_LEASE_EXTRA_ATTEMPTS);
    let lost = lifecycle::Expired {
        id: &target.id,
        attempt,
        max_attempts: 1,
        worker: Some("w"),
        cancel_requested: false,
    };
    let expected = lifecycle::lease_expired(lost, clock.now_ms()).resolution;
    // The parent was claimed by the claim that reaped the target: read its step there.
    let d = store
        .step(DEFAULT_TENANT, &parent, "call", 0)
        .await
        .unwrap();
    let got: Resolution = serde_json::from_slice(&d.expect("resolved").output).unwrap();
    assert_eq!(Some(got), expected);
    assert_eq!(
        detail(&store, &target.id).await.run.status,
        RunStatus::Failed
    );
}

pub(super) async fn a_replaced_run_tells_its_waiter(store: impl Store, clock: ManualClock) {
    use serde_json::json;
    deploy_fn(&store, "f", "d", 1).await;
    deploy_flow(&store, DEFAULT_TENANT, "deb", debounced_by_k()).await;
    let first = async |s: &_| enq(s, "deb", json!({"k": "x"})).await;
    let (parent, replaced) = waiting_parent(&store, first).await;
    clock.advance(10);
    let successor = enq(&store, "deb", json!({"k": "x"})).await;
    let error = lifecycle::debounced_error(&successor.id);
    assert_eq!(
        resumed_with(&store, &parent).await,
        lifecycle::skipped_resolution(&replaced.id, &error)
    );
    assert_eq!(
        status_of(&store, DEFAULT_TENANT, &replaced.id).await.error,
        Some(error)
    );
}

/// The waiting parent of `target` (an [`Outcome::Waiting`] on it for step "call").
fn waits_on(target: &str) -> Outcome {
    Outcome::Waiting {
        wait: Wait {
            step: "call".into(),
            occurrence: 0,
            on: WaitOn::Run { id: target.into() },
            until: None,
        },
        fuel_used: None,
    }
}

/// Ends stored in one call ([`Queue::end_attempts`]) resume the runs waiting on them, and
/// a run that starts to wait in the call on a run that ends in it hears of that end,
/// whichever of the two comes first in the call.
pub(super) async fn ends_together_reach_their_waiters(store: impl Store, _clock: ManualClock) {
    deploy_fn(&store, "f", "d", 1).await;
    let succeeded = |out: &str| Outcome::Succeeded {
        output: out.as_bytes().to_vec(),
        fuel_used: None,
    };
    // Three parents already waiting, each on its own target.
    let mut waiting = Vec::new();
    for _ in 0..3 {
        enqueue(&store, "f", "{}").await;
    }
    for p in claim(&store, "w", 10).await {
        let target = enqueue(&store, "f", "{}").await;
        let r = store.finish(&p.lease, waits_on(&target.id)).await.unwrap();
        assert_eq!(r.status, RunStatus::Waiting);
        waiting.push((p.run.id, target));
    }
    assert_eq!(waiting.len(), 3);
    // Two parents that start to wait in the call, on targets running beside them.
    let parents = [
        enqueue(&store, "f", "{}").await,
        enqueue(&store, "f", "{}").await,
    ];
    let targets = [
        enqueue(&store, "f", "{}").await,
        enqueue(&store, "f", "{}").await,
    ];
    let claimed = claim(&store, "w", 10).await;
    assert_eq!(claimed.len(), 7, "the five targets and the two parents");
    let lease = |id: &str| {
        let c = claimed.iter().find(|c| c.run.id == id).expect("claimed");
        c.lease.clone()
    };
    let end = |id: &str, outcome| AttemptEnd {
        lease: lease(id),
        records: vec![],
        outcome,
    };
    let mut ends = vec![
        // The parent's wait comes before its target's end...
        end(&parents[0].id, waits_on(&targets[0].id)),
        end(&targets[0].id, succeeded("\"t0\"")),
        // ...and after it.
        end(&targets[1].id, succeeded("\"t1\"")),
        end(&parents[1].id, waits_on(&targets[1].id)),
    ];
    for (i, (_, target)) in waiting.iter().enumerate() {
        ends.push(end(&target.id, succeeded(&format!("\"w{i}\""))));
    }
    let answers = store.end_attempts(ends).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");

    let mut expect: Vec<(String, Resolution)> = Vec::new();
    for (parent, target) in parents.iter().zip(&targets) {
        let run = detail(&store, &target.id).await.run;
        expect.push((
            parent.id.clone(),
            lifecycle::resolution(&run).expect("ended"),
        ));
    }
    for (parent, target) in &waiting {
        let run = detail(&store, &target.id).await.run;
        expect.push((parent.clone(), lifecycle::resolution(&run).expect("ended")));
    }
    // Every parent is due again, resumed with its target's output.
    let resumed = claim(&store, "w", 10).await;
    let mut got: Vec<(String, Resolution)> = resumed
        .iter()
        .map(|c| (c.run.id.clone(), step_output(&c.steps, "call")))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    expect.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, expect);
}

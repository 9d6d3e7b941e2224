//! An attempt that no longer owns its run (its worker's lease ran out while the process
//! was paused) starts no effect: not a step body, a sleep, a wait, a child run, an event or
//! an outbound request. The real sandbox runs the `effects` guest, once per effect, with a
//! journal that says "owned" (the control: the effect happens) and one that says "not
//! owned" (the attempt ends as abandoned and nothing happened). And a journal that refuses
//! an effect decides by the kind of its refusal how the attempt ends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasq_core::{ErrorReason, Limits, LogLine, Progress};
use wasq_sandbox::{
    AttemptOutcome, AttemptSpec, Journal, JournalError, RunInfo, Sandbox, SandboxConfig,
};
use wasq_tests::{Counter, guest};

/// Records every effect that reaches it; refuses steps, events and child runs with
/// `refuse` when set.
#[derive(Default)]
struct Recorder {
    owned: bool,
    refuse: Option<JournalError>,
    effects: Mutex<Vec<String>>,
}

impl Recorder {
    fn effect(&self, what: String) -> Result<(), JournalError> {
        if let Some(e) = &self.refuse {
            return Err(e.clone());
        }
        self.effects.lock().unwrap().push(what);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Journal for Recorder {
    async fn complete_step(&self, name: &str, _: u32, _: &[u8]) -> Result<(), JournalError> {
        self.effect(format!("step {name}"))
    }
    async fn send_event(
        &self,
        event: &str,
        _: serde_json::Value,
        _: &str,
    ) -> Result<(), JournalError> {
        self.effect(format!("event {event}"))
    }
    async fn start_run(&self, function: &str, _: &[u8], _: &str) -> Result<String, JournalError> {
        self.effect(format!("run {function}"))?;
        Ok("child-1".into())
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, JournalError> {
        Err(JournalError::Failed("no stored steps here".into()))
    }
    fn log(&self, _: LogLine) {}
    fn progress(&self, _: Progress) {}
    fn ensure_owned(&self) -> Result<(), String> {
        if self.owned {
            Ok(())
        } else {
            Err("the lease ran out 5000 ms ago".into())
        }
    }
}

#[tokio::test]
async fn an_attempt_that_lost_its_run_starts_no_effect() {
    let (counter, sandbox, digest) = effects_sandbox().await;
    let attempt = |effect: &str, owned: bool| {
        let journal = Arc::new(Recorder {
            owned,
            ..Recorder::default()
        });
        let spec = spec(&digest, effect, &counter, journal.clone());
        let sandbox = sandbox.clone();
        async move { (sandbox.run(spec).await.outcome, journal) }
    };

    for effect in ["step", "sleep", "wait", "invoke", "call", "send", "http"] {
        // The control: owned, the effect happens.
        let hits = counter.hits().len();
        let (outcome, journal) = attempt(effect, true).await;
        assert!(
            !matches!(
                outcome,
                AttemptOutcome::Abandoned(_) | AttemptOutcome::Failed(_)
            ),
            "{effect}: {outcome:?}"
        );
        let suspended = matches!(
            outcome,
            AttemptOutcome::Waiting(_) | AttemptOutcome::Suspended { .. }
        );
        let happened = journal.effects.lock().unwrap().len() + counter.hits().len() - hits
            + usize::from(suspended);
        assert!(happened > 0, "{effect}: the control did nothing");

        // Not owned: abandoned before the effect.
        let hits = counter.hits().len();
        let (outcome, journal) = attempt(effect, false).await;
        match &outcome {
            AttemptOutcome::Abandoned(why) => assert!(why.contains("lease ran out"), "{why}"),
            other => panic!("{effect}: not abandoned: {other:?}"),
        }
        let recorded = journal.effects.lock().unwrap().clone();
        assert!(recorded.is_empty(), "{effect}: {recorded:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            counter.hits().len(),
            hits,
            "{effect}: a request went out for a run the attempt did not own"
        );
    }
}

/// A sandbox with the `effects` guest loaded, allowed to call the local counter.
async fn effects_sandbox() -> (Counter, Sandbox, String) {
    let counter = Counter::start().await;
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        allow_loopback_egress: true,
        ..SandboxConfig::default()
    })
    .unwrap();
    let digest = sandbox.validate(&guest("effects")).await.unwrap();
    (counter, sandbox, digest)
}

fn spec(digest: &str, effect: &str, counter: &Counter, journal: Arc<Recorder>) -> AttemptSpec {
    AttemptSpec {
        digest: digest.to_owned(),
        info: RunInfo {
            run_id: "r1".into(),
            attempt: 1,
            max_attempts: 3,
            ..RunInfo::default()
        },
        input: serde_json::to_vec(&serde_json::json!({
            "effect": effect,
            "url": counter.url(),
        }))
        .unwrap(),
        limits: Limits {
            timeout_ms: 10_000,
            ..Limits::default()
        },
        steps: vec![],
        journal,
        cancel: Default::default(),
        allow_hosts: vec!["127.0.0.1".into()],
        traceparent: None,
        max_outbound_requests: None,
    }
}

/// What the journal says of a refused effect, not what the guest makes of it, decides how
/// the attempt ends: a storage quota fails it for good with that reason and message, a
/// lost lease abandons it, anything else is the host's failure.
#[tokio::test]
async fn a_refused_effect_ends_the_attempt_as_its_kind_says() {
    let (counter, sandbox, digest) = effects_sandbox().await;
    let quota = "the run's max_run_bytes quota of 100 bytes is used up";
    for effect in ["step", "invoke", "send"] {
        for refuse in [
            JournalError::StorageQuota(quota.into()),
            JournalError::LeaseLost("taken over".into()),
            JournalError::Failed("store unavailable".into()),
        ] {
            let journal = Arc::new(Recorder {
                owned: true,
                refuse: Some(refuse.clone()),
                ..Recorder::default()
            });
            let outcome = sandbox
                .run(spec(&digest, effect, &counter, journal))
                .await
                .outcome;
            match (&refuse, &outcome) {
                (JournalError::StorageQuota(_), AttemptOutcome::Failed(e)) => {
                    assert_eq!(e.error.reason, ErrorReason::StorageQuota, "{effect}");
                    assert_eq!(e.error.message, quota, "{effect}");
                    assert_eq!(e.retry_after_ms, None, "{effect}");
                }
                (JournalError::LeaseLost(_), AttemptOutcome::Abandoned(why)) => {
                    assert_eq!(why, "taken over", "{effect}");
                }
                (JournalError::Failed(_), AttemptOutcome::Failed(e)) => {
                    assert!(
                        matches!(e.error.reason, ErrorReason::Host | ErrorReason::Trap),
                        "{effect}: {e:?}"
                    );
                    assert!(
                        e.error.message.contains("store unavailable"),
                        "{effect}: {e:?}"
                    );
                }
                _ => panic!("{effect}, refused with {refuse:?}: {outcome:?}"),
            }
        }
    }
}

//! An attempt that no longer owns its run (its worker's lease ran out while the process
//! was paused) starts no effect: not a step body, a sleep, a wait, a child run, an event or
//! an outbound request. The real sandbox runs the `effects` guest, once per effect, with a
//! journal that says "owned" (the control: the effect happens) and one that says "not
//! owned" (the attempt ends as abandoned and nothing happened).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasq_core::{Limits, LogLine, Progress};
use wasq_sandbox::{AttemptOutcome, AttemptSpec, Journal, RunInfo, Sandbox, SandboxConfig};
use wasq_tests::{Counter, guest};

/// Records every effect that reaches it.
#[derive(Default)]
struct Recorder {
    owned: bool,
    effects: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Journal for Recorder {
    async fn complete_step(&self, name: &str, _: u32, _: &[u8]) -> Result<(), String> {
        self.effects.lock().unwrap().push(format!("step {name}"));
        Ok(())
    }
    async fn send_event(&self, event: &str, _: serde_json::Value, _: &str) -> Result<(), String> {
        self.effects.lock().unwrap().push(format!("event {event}"));
        Ok(())
    }
    async fn start_run(&self, function: &str, _: &[u8], _: &str) -> Result<String, String> {
        self.effects.lock().unwrap().push(format!("run {function}"));
        Ok("child-1".into())
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, String> {
        Err("no stored steps here".into())
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
    let counter = Counter::start().await;
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        allow_loopback_egress: true,
        ..SandboxConfig::default()
    })
    .unwrap();
    let digest = sandbox.validate(&guest("effects")).await.unwrap();
    let attempt = |effect: &str, owned: bool| {
        let journal = Arc::new(Recorder {
            owned,
            ..Recorder::default()
        });
        let spec = AttemptSpec {
            digest: digest.clone(),
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
            journal: journal.clone(),
            cancel: Default::default(),
            allow_hosts: vec!["127.0.0.1".into()],
            max_outbound_requests: None,
        };
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

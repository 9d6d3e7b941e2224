//! Shared by the sandbox benchmarks: a journal that stores nothing, so a benchmark measures
//! the sandbox and the guest, not a store.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use wasq_core::{Limits, LogLine, Progress};
use wasq_sandbox::{AttemptSpec, Journal, JournalError, RunInfo};

/// A first attempt of the `hello` task (any language's) greeting Ada, under `limits`.
pub(crate) fn hello_spec(digest: &str, journal: Arc<dyn Journal>, limits: Limits) -> AttemptSpec {
    AttemptSpec {
        digest: digest.to_owned(),
        info: RunInfo {
            run_id: "bench".into(),
            function: "hello".into(),
            tenant: "default".into(),
            attempt: 1,
            max_attempts: 1,
            trigger: "bench".into(),
        },
        input: br#"{"name":"Ada"}"#.to_vec(),
        limits,
        steps: vec![],
        journal,
        cancel: CancellationToken::new(),
        allow_hosts: vec![],
        traceparent: None,
        max_outbound_requests: None,
    }
}

pub(crate) struct NoJournal;

#[async_trait::async_trait]
impl Journal for NoJournal {
    async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    async fn send_event(&self, _: &str, _: serde_json::Value, _: &str) -> Result<(), JournalError> {
        Ok(())
    }
    async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, JournalError> {
        Err(JournalError::Failed("the benchmark starts no runs".into()))
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, JournalError> {
        Err(JournalError::Failed("no stored steps here".into()))
    }
    fn log(&self, _: LogLine) {}
    fn progress(&self, _: Progress) {}
}

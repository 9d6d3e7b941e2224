//! Shared by the sandbox benchmarks: a journal that stores nothing, so a benchmark measures
//! the sandbox and the guest, not a store.

use wasq_core::{LogLine, Progress};
use wasq_sandbox::Journal;

pub struct NoJournal;

#[async_trait::async_trait]
impl Journal for NoJournal {
    async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
    async fn send_event(&self, _: &str, _: serde_json::Value, _: &str) -> Result<(), String> {
        Ok(())
    }
    async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, String> {
        Err("the benchmark starts no runs".into())
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, String> {
        Err("no stored steps here".into())
    }
    fn log(&self, _: LogLine) {}
    fn progress(&self, _: Progress) {}
}

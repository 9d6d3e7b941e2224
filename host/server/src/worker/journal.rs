//! The attempt's journal: what the guest's durable calls store, under the attempt's lease;
//! logs and progress batched and flushed in the background, steps written at once.

use super::*;

/// Streams an attempt's logs and progress to the store in batches, and stores steps
/// synchronously (a step is durable before the guest moves on), together with the log
/// lines written before it: a crash never keeps a step without the lines its body logged,
/// nor those lines without the step.
pub(crate) struct StoreJournal {
    pub(crate) app: Arc<App>,
    pub(crate) tenant: String,
    pub(crate) held: Arc<Held>,
    pub(crate) pending: std::sync::Mutex<Pending>,
    /// Held while taking and writing pending records, so lines are stored in order.
    pub(crate) writing: tokio::sync::Mutex<()>,
    pub(crate) flush: tokio::sync::Notify,
    pub(crate) closed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) logs: Vec<LogLine>,
    pub(crate) progress: Option<Progress>,
}

impl StoreJournal {
    /// What the sandbox should make of a store error on one of the guest's effects
    /// (`what`: the effect, for the message).
    fn journal_error(&self, e: StoreError, what: impl FnOnce() -> String) -> JournalError {
        match e {
            StoreError::LeaseLost(_) => {
                self.held.lose();
                JournalError::LeaseLost(e.to_string())
            }
            StoreError::StorageQuota(why) => JournalError::StorageQuota(why),
            e => JournalError::Failed(format!("{}: {e}", what())),
        }
    }

    pub(crate) fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap())
    }

    /// Writes what is pending (batched by the caller's timing).
    pub(crate) async fn flush_pending(&self) {
        let _order = self.writing.lock().await;
        let Pending { logs, progress } = self.take();
        let lease = &self.held.lease;
        if self.held.is_lost() {
            // Nothing of an abandoned attempt is recorded.
            return;
        }
        if !logs.is_empty() {
            match with_retries(|| self.app.store.record(lease, Record::Logs(logs.clone()))).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost(_)) => self.held.lose(),
                Err(e) => tracing::warn!(run = %lease.run_id, error = %e, "dropping log lines"),
            }
        }
        if let Some(p) = progress {
            let _ = self.app.store.record(lease, Record::Progress(p)).await;
        }
    }

    /// Ends the flusher after a last flush.
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.flush.notify_one();
    }
}

/// Flushes pending lines every 50 ms while there are any, until the journal is closed.
pub(crate) async fn flush_records(journal: Arc<StoreJournal>) {
    loop {
        journal.flush.notified().await;
        let closed = journal.closed.load(std::sync::atomic::Ordering::SeqCst);
        if !closed {
            // Batch what arrives within a short window rather than one write per line.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        journal.flush_pending().await;
        if closed {
            return;
        }
    }
}

#[async_trait::async_trait]
impl Journal for StoreJournal {
    async fn complete_step(
        &self,
        name: &str,
        occurrence: u32,
        output: &[u8],
    ) -> Result<(), JournalError> {
        let _order = self.writing.lock().await;
        let logs = std::mem::take(&mut self.pending.lock().unwrap().logs);
        let rec = Record::Step {
            name: name.into(),
            occurrence,
            output: output.to_vec(),
            logs,
        };
        with_retries(|| self.app.store.record(&self.held.lease, rec.clone()))
            .await
            .map_err(|e| self.journal_error(e, || format!("could not store step {name:?}")))
    }

    async fn send_event(
        &self,
        event: &str,
        data: serde_json::Value,
        id: &str,
    ) -> Result<(), JournalError> {
        let req = EventRequest {
            tenant: self.tenant.clone(),
            name: event.into(),
            data,
            id: Some(id.into()),
        };
        with_retries(|| self.app.store.send_event(req.clone()))
            .await
            .map_err(|e| self.journal_error(e, || format!("could not send event {event:?}")))?;
        self.app.wake.notify_one();
        Ok(())
    }

    async fn start_run(
        &self,
        function: &str,
        input: &[u8],
        key: &str,
    ) -> Result<String, JournalError> {
        // New work: refused while the store is nearly full (the attempt fails and is
        // retried later; the store guard's reason says why).
        if let Some(reason) = self.app.guard.refusing() {
            return Err(JournalError::Failed(format!(
                "cannot start a run of {function:?} now: {reason}"
            )));
        }
        let req = EnqueueRequest {
            tenant: self.tenant.clone(),
            function: function.into(),
            input: input.to_vec(),
            trigger: format!("child:{}", self.held.lease.run_id),
            due_at: None,
            idempotency_key: Some(key.into()),
            retry: None,
            parent: Some(self.held.lease.run_id.clone()),
            priority: None,
        };
        let enqueued = with_retries(|| self.app.store.enqueue(req.clone()))
            .await
            .map_err(|e| match e {
                StoreError::NotFound(_) => JournalError::Failed(format!(
                    "cannot start a run of {function:?}: no such function"
                )),
                e => self.journal_error(e, || format!("cannot start a run of {function:?}")),
            })?;
        self.app.wake.notify_one();
        Ok(enqueued.run.id)
    }

    async fn load_step(&self, name: &str, occurrence: u32) -> Result<Vec<u8>, JournalError> {
        let id = &self.held.lease.run_id;
        with_retries(|| self.app.store.step(&self.tenant, id, name, occurrence))
            .await
            .map_err(|e| {
                self.journal_error(e, || format!("could not read step {name:?} #{occurrence}"))
            })?
            .map(|s| s.output)
            .ok_or_else(|| {
                JournalError::Failed(format!(
                    "step {name:?} #{occurrence} vanished from the store"
                ))
            })
    }

    fn log(&self, line: LogLine) {
        self.pending.lock().unwrap().logs.push(line);
        self.flush.notify_one();
    }

    fn progress(&self, progress: Progress) {
        self.pending.lock().unwrap().progress = Some(progress);
        self.flush.notify_one();
    }

    fn ensure_owned(&self) -> Result<(), String> {
        self.held.ensure_owned()
    }
}

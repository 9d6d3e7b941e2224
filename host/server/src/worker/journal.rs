//! The attempt's journal: what the guest's durable calls store, under the attempt's lease.
//!
//! Logs and progress are batched and flushed in the background. A completed step is kept
//! back (`Pending::step`) rather than stored at once: most attempts end right after their
//! last step, and the step then goes with the end, in one transition instead of two
//! (`Queue::end_attempts`). It never waits long, and never behind an effect: the next
//! step, an event, a child run or an outbound request stores it first (`settle`), and so
//! does the background flusher [`STEP_HOLD`] after it completed. A step is stored
//! together with the log lines written before it: a crash never keeps a step without the
//! lines its body logged, nor those lines without the step.

use tokio_util::sync::CancellationToken;

use super::*;

/// How long a completed step may wait to be stored with the attempt's end before the
/// flusher stores it on its own: the longest a guest computing after its last step leaves
/// that step unstored (a crash then runs the step's body again, as a crash during its
/// store would).
pub(crate) const STEP_HOLD: Duration = Duration::from_millis(2);

/// How long log lines and progress wait to be stored together.
const LOG_BATCH: Duration = Duration::from_millis(50);

pub(crate) struct StoreJournal {
    pub(crate) app: Arc<App>,
    pub(crate) tenant: String,
    pub(crate) held: Arc<Held>,
    /// The attempt's trace context, which the runs and events it starts continue.
    trace: Option<TraceParent>,
    pending: std::sync::Mutex<Pending>,
    /// Held while taking and writing pending records, so records are stored in order.
    writing: tokio::sync::Mutex<()>,
    /// Wakes the flusher when something became pending.
    flush: tokio::sync::Notify,
    /// The attempt ended: the flusher stops, and its end takes what is pending.
    closed: CancellationToken,
    /// The flusher is running (started by the first pending record).
    flusher: std::sync::atomic::AtomicBool,
    /// What storing a kept-back step met in the background, answered to the guest's next
    /// durable call and read by the attempt's end.
    failed: std::sync::Mutex<Option<JournalError>>,
    me: std::sync::Weak<StoreJournal>,
}

/// What the attempt has not stored yet, in the order it is stored.
#[derive(Default)]
pub(crate) struct Pending {
    /// The last completed step, with the lines logged before it, and when it completed.
    step: Option<(Record, Instant)>,
    /// Lines logged after it.
    logs: Vec<LogLine>,
    progress: Option<Progress>,
    /// When the first of these lines or this progress became pending.
    since: Option<Instant>,
}

impl Pending {
    /// The records, in the order they must be stored.
    pub(crate) fn into_records(self) -> Vec<Record> {
        let mut records = Vec::with_capacity(3);
        records.extend(self.step.map(|(s, _)| s));
        if !self.logs.is_empty() {
            records.push(Record::Logs(self.logs));
        }
        records.extend(self.progress.map(Record::Progress));
        records
    }

    /// When the flusher should store what is pending; `None` when nothing is.
    fn due(&self) -> Option<Instant> {
        match (&self.step, self.since) {
            (Some((_, at)), _) => Some(*at + STEP_HOLD),
            (None, since) => since.map(|at| at + LOG_BATCH),
        }
    }
}

impl StoreJournal {
    pub(crate) fn new(
        app: Arc<App>,
        tenant: String,
        held: Arc<Held>,
        trace: Option<TraceParent>,
    ) -> Arc<StoreJournal> {
        Arc::new_cyclic(|me| StoreJournal {
            app,
            tenant,
            held,
            trace,
            pending: Default::default(),
            writing: Default::default(),
            flush: Default::default(),
            closed: CancellationToken::new(),
            flusher: Default::default(),
            failed: Default::default(),
            me: me.clone(),
        })
    }

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

    /// Something became pending: make sure the flusher runs, and let it recompute when.
    fn pending_changed(&self) {
        if !self.flusher.swap(true, Ordering::SeqCst)
            && let Some(me) = self.me.upgrade()
        {
            tokio::spawn(flush_records(me));
        }
        self.flush.notify_one();
    }

    /// What a kept-back step met when the flusher stored it, if anything.
    fn failure(&self) -> Result<(), JournalError> {
        match self.failed.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stores the kept-back step, if any (the caller holds `writing`).
    async fn store_step(&self) -> Result<(), JournalError> {
        self.failure()?;
        let Some((step, _)) = self.pending.lock().unwrap().step.take() else {
            return Ok(());
        };
        let name = match &step {
            Record::Step { name, .. } => name.clone(),
            _ => String::new(),
        };
        let stored = with_retries(|| self.app.store.record(&self.held.lease, step.clone())).await;
        stored.map_err(|e| {
            let e = self.journal_error(e, || format!("could not store step {name:?}"));
            *self.failed.lock().unwrap() = Some(e.clone());
            e
        })
    }

    /// Writes everything pending, in order (the flusher's timing batches it).
    async fn flush_pending(&self) {
        let _order = self.writing.lock().await;
        if self.closed.is_cancelled() || self.held.is_lost() {
            // The attempt's end takes what is pending; nothing of an abandoned attempt
            // is recorded.
            return;
        }
        if self.store_step().await.is_err() {
            return;
        }
        let (logs, progress) = {
            let mut p = self.pending.lock().unwrap();
            p.since = None;
            (std::mem::take(&mut p.logs), p.progress.take())
        };
        let lease = &self.held.lease;
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

    /// Ends the journal: the flusher stops, and what is pending is handed to the end of
    /// the attempt (after any write in progress), with what a kept-back step met in the
    /// background.
    pub(crate) async fn close(&self) -> (Pending, Option<JournalError>) {
        self.closed.cancel();
        let _order = self.writing.lock().await;
        let pending = std::mem::take(&mut *self.pending.lock().unwrap());
        (pending, self.failed.lock().unwrap().take())
    }
}

/// Stores what is pending when it is due (a kept-back step soon, log lines in batches),
/// until the journal is closed.
async fn flush_records(journal: Arc<StoreJournal>) {
    loop {
        let due = journal.pending.lock().unwrap().due();
        tokio::select! {
            () = journal.closed.cancelled() => return,
            () = journal.flush.notified() => continue,
            () = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => journal.flush_pending().await,
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
        // The step before this one is stored first: a step is never kept back behind
        // another step's body.
        let _order = self.writing.lock().await;
        self.store_step().await?;
        {
            let mut p = self.pending.lock().unwrap();
            let logs = std::mem::take(&mut p.logs);
            if p.progress.is_none() {
                p.since = None;
            }
            let step = Record::Step {
                name: name.into(),
                occurrence,
                output: output.to_vec(),
                logs,
            };
            p.step = Some((step, Instant::now()));
        }
        self.pending_changed();
        Ok(())
    }

    async fn settle(&self) -> Result<(), JournalError> {
        if self.pending.lock().unwrap().step.is_none() {
            return self.failure();
        }
        let _order = self.writing.lock().await;
        self.store_step().await
    }

    async fn send_event(
        &self,
        event: &str,
        data: serde_json::Value,
        id: &str,
    ) -> Result<(), JournalError> {
        self.settle().await?;
        let req = EventRequest {
            tenant: self.tenant.clone(),
            name: event.into(),
            data,
            id: Some(id.into()),
            trace: self.trace.clone(),
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
        self.settle().await?;
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
            trace: self.trace.clone(),
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
        {
            let mut p = self.pending.lock().unwrap();
            p.since.get_or_insert_with(Instant::now);
            p.logs.push(line);
        }
        self.pending_changed();
    }

    fn progress(&self, progress: Progress) {
        {
            let mut p = self.pending.lock().unwrap();
            p.since.get_or_insert_with(Instant::now);
            p.progress = Some(progress);
        }
        self.pending_changed();
    }

    fn ensure_owned(&self) -> Result<(), String> {
        self.held.ensure_owned()
    }
}

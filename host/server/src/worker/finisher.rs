//! Ends attempts in batches: attempts hand their end to one task, which stores every end
//! that arrived while its previous call was on its way in one `Queue::end_attempts` call.
//!
//! No end waits for a batch to fill: an end that finds the task idle goes out at once, and
//! the ones that arrive meanwhile go out together next. Under load this turns one store
//! round trip (and, on Redis, one script call and one schedule update) per attempt into
//! one per batch; when idle it costs nothing.

use tokio::sync::{mpsc, oneshot};

use super::*;

/// Ends stored in one call at most.
const MAX_BATCH: usize = 64;

type Answer = oneshot::Sender<Result<RunStatus, StoreError>>;

/// The handle attempts end through; the task stops when every handle is dropped.
#[derive(Clone)]
pub(crate) struct Finisher {
    ends: mpsc::UnboundedSender<(AttemptEnd, Answer)>,
}

impl Finisher {
    pub(crate) fn spawn(store: Arc<dyn Backend>) -> Finisher {
        let (ends, queue) = mpsc::unbounded_channel();
        tokio::spawn(store_ends(store, queue));
        Finisher { ends }
    }

    /// Stores `end` ([`Queue::end_attempts`]) and answers what the store answered for it.
    pub(crate) async fn end(&self, end: AttemptEnd) -> Result<RunStatus, StoreError> {
        let (answer, answered) = oneshot::channel();
        let gone = || StoreError::Unavailable("the worker's finisher has stopped".into());
        self.ends.send((end, answer)).map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

async fn store_ends(
    store: Arc<dyn Backend>,
    mut queue: mpsc::UnboundedReceiver<(AttemptEnd, Answer)>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (ends, answers): (Vec<AttemptEnd>, Vec<Answer>) = batch.drain(..).unzip();
        let results = store.end_attempts(ends).await;
        for (answer, result) in answers.into_iter().zip(results) {
            // The attempt may have stopped waiting (shutdown): nothing to tell it then.
            let _ = answer.send(result);
        }
    }
}

//! Enqueues coalesced: the enqueues that arrive while the store's previous enqueue call is
//! on its way go out together next, one script call per tenant that admits or refuses
//! each run on its own (`enqueue.lua`).
//!
//! A script call costs Redis a fixed part (entering the library, reading the function and
//! the tenant's meta, publishing its schedule) besides each run's: measured with
//! `redis_ir`, 272k instructions for an enqueue alone against 165k a run for 50 to a call.
//! So under load (an API server taking many creates at once, a worker's guests starting
//! child runs) a created run costs Redis less, and when idle nothing waits: an enqueue
//! that finds the task idle goes out at once, as before. It is the worker's `Finisher`
//! for ends, on the store's side so that every caller of [`Queue::enqueue`] gets it.
//!
//! Not a change of meaning: each run is answered as [`Queue::enqueue`] would answer it
//! alone, whatever the others in its call met (unlike [`Queue::enqueue_batch`], all or
//! nothing).

use std::sync::Weak;

use tokio::sync::{mpsc, oneshot};

use super::*;

/// Enqueues taken for one round at most (they then go out as calls of `PER_CALL`).
const PER_ROUND: usize = 256;
/// Runs in one script call at most: a call holds Redis for all of them (about 50 µs a run
/// on a slow machine), so other clients wait no longer than a few milliseconds.
const PER_CALL: usize = 32;

type Answer = oneshot::Sender<Result<Enqueued, StoreError>>;

/// The handle enqueues go through; its task stops with the store (it holds the store
/// weakly, and the store this handle).
pub(crate) struct Coalescer {
    runs: mpsc::UnboundedSender<(EnqueueRequest, Answer)>,
}

impl Coalescer {
    /// Starts the task on the current runtime.
    pub(crate) fn spawn(store: Weak<Inner>) -> Coalescer {
        let (runs, queue) = mpsc::unbounded_channel();
        tokio::spawn(rounds(store, queue));
        Coalescer { runs }
    }

    /// Sends `req` with the next round; `Err(req)` when the task is gone (its runtime
    /// stopped), for the caller to enqueue it alone.
    pub(crate) async fn enqueue(
        &self,
        req: EnqueueRequest,
    ) -> Result<Result<Enqueued, StoreError>, EnqueueRequest> {
        let (answer, answered) = oneshot::channel();
        if let Err(e) = self.runs.send((req, answer)) {
            return Err(e.0.0);
        }
        // The task dropped the request unanswered only when its runtime stopped while
        // the call was on its way: whether the run was created is not known, as when a
        // call times out.
        Ok(answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the enqueue was interrupted (the store's runtime stopped); the run may \
                 or may not have been created"
                    .into(),
            ))
        }))
    }
}

/// Each round: what arrived, grouped by tenant in order of arrival, as calls of at most
/// `PER_CALL` runs, all on their way at once.
async fn rounds(store: Weak<Inner>, mut queue: mpsc::UnboundedReceiver<(EnqueueRequest, Answer)>) {
    let mut round = Vec::with_capacity(PER_ROUND);
    while queue.recv_many(&mut round, PER_ROUND).await > 0 {
        let Some(inner) = store.upgrade() else {
            return;
        };
        let store = RedisStore { inner };
        let mut tenants: Vec<(String, Vec<(EnqueueRequest, Answer)>)> = Vec::new();
        for (req, answer) in round.drain(..) {
            match tenants
                .iter_mut()
                .find(|(t, runs)| *t == req.tenant && runs.len() < PER_CALL)
            {
                Some((_, runs)) => runs.push((req, answer)),
                None => tenants.push((req.tenant.clone(), vec![(req, answer)])),
            }
        }
        let calls = tenants.into_iter().map(|(tenant, runs)| {
            let store = store.clone();
            async move {
                let (reqs, answers): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
                let results = store.admit_runs(&tenant, reqs).await;
                for (answer, result) in answers.into_iter().zip(results) {
                    // The caller may have stopped waiting: nothing to tell it then.
                    let _ = answer.send(result);
                }
            }
        });
        futures_util::future::join_all(calls).await;
    }
}

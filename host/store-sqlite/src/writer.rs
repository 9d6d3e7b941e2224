//! Group commit: every call of the store runs on one writer thread, and the calls that
//! queue up while a batch runs share the next batch's transaction.
//!
//! A batch is one `BEGIN IMMEDIATE` transaction; each call in it runs inside a savepoint,
//! so one that fails (or panics) is rolled back alone and the others still commit. No
//! caller hears its answer before `COMMIT` returns, so an answered call is exactly as
//! durable as when each call committed on its own (WAL, `synchronous=NORMAL`); a commit
//! that fails answers every call of its batch with the error, and none of them took
//! effect. What batching saves is a commit (a WAL write) per call and the thread
//! hand-offs: with one connection behind a mutex, each call used to take a thread of
//! tokio's blocking pool that mostly waited for the lock (perf: a third of `wasq dev`'s
//! CPU per run went to scheduling and futexes).
//!
//! The connection stays behind its mutex, locked for each batch, so that tests (and
//! nothing else) can read it directly between batches.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use wasq_core::{Clock, StoreError};

use crate::internal;

/// Calls in one transaction at most: bounds how long a batch holds the write lock.
const MAX_BATCH: usize = 64;

/// One call of the store, queued for the writer.
trait Work: Send {
    /// Runs the call at `now`; whether it succeeded (its writes are kept).
    fn run(&mut self, conn: &Connection, now: i64) -> bool;
    /// Answers the caller: with its result if `committed` is Ok, else with that error.
    fn answer(self: Box<Self>, committed: Result<(), &StoreError>);
}

struct Call<T, F> {
    f: Option<F>,
    out: Option<Result<T, StoreError>>,
    reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Work for Call<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, now: i64) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        let out =
            std::panic::catch_unwind(AssertUnwindSafe(|| f(conn, now))).unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(StoreError::Internal(format!("store task panicked: {what}")))
            });
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn answer(self: Box<Self>, committed: Result<(), &StoreError>) {
        let out = match (committed, self.out) {
            (Ok(()), Some(out)) | (Err(_), Some(out @ Err(_))) => out,
            (Err(e), _) => Err(same(e)),
            (Ok(()), None) => Err(StoreError::Internal("the call never ran".into())),
        };
        // A caller that stopped waiting (its future dropped) needs no answer.
        let _ = self.reply.send(out);
    }
}

/// A copy of an error of the batch's transaction, for each call in it (the kinds
/// [`internal`] makes).
fn same(e: &StoreError) -> StoreError {
    match e {
        StoreError::Full(m) => StoreError::Full(m.clone()),
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        other => StoreError::Internal(other.to_string()),
    }
}

pub(crate) struct Writer {
    queue: mpsc::Sender<Box<dyn Work>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer(..)")
    }
}

impl Writer {
    /// Starts the writer thread; it ends when the last `Writer` handle is dropped.
    pub(crate) fn spawn(conn: Arc<Mutex<Connection>>, clock: Arc<dyn Clock>) -> Writer {
        let (queue, calls) = mpsc::channel();
        std::thread::Builder::new()
            .name("wasq-sqlite".into())
            .spawn(move || write(&conn, &*clock, &calls))
            .expect("the OS starts a thread");
        Writer { queue }
    }

    /// Runs `f` in the next batch's transaction, with the current time.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let call = Call {
            f: Some(f),
            out: None,
            reply,
        };
        self.queue
            .send(Box::new(call))
            .map_err(|_| StoreError::Internal("the store's writer thread has ended".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Internal("the store's writer thread has ended".into()))?
    }
}

fn write(conn: &Mutex<Connection>, clock: &dyn Clock, calls: &mpsc::Receiver<Box<dyn Work>>) {
    while let Ok(first) = calls.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match calls.try_recv() {
                Ok(call) => batch.push(call),
                Err(_) => break,
            }
        }
        let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
        let committed = run_batch(&conn, clock, &mut batch);
        for call in batch {
            call.answer(committed.as_ref().map(|_| ()));
        }
    }
}

/// Runs `batch` in one transaction and commits it.
fn run_batch(
    conn: &Connection,
    clock: &dyn Clock,
    batch: &mut [Box<dyn Work>],
) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE").map_err(internal)?;
    for call in batch.iter_mut() {
        let kept = conn.execute_batch("SAVEPOINT call").is_ok() && {
            // Read the time holding the write lock, so the calls' times are in the order
            // they commit (a claim cannot record a start before the finish that freed its
            // slot).
            let ok = call.run(conn, clock.now_ms());
            let undo = if ok {
                "RELEASE call"
            } else {
                "ROLLBACK TO call; RELEASE call"
            };
            conn.execute_batch(undo).is_ok()
        };
        // SQLite rolls a whole transaction back on some errors (a full disk, an I/O
        // error): then the calls before this one are gone too, and none may be answered
        // as done.
        if !kept || conn.is_autocommit() {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            return Err(StoreError::Unavailable(
                "the store's transaction was rolled back; try again".into(),
            ));
        }
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(internal(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls that share batches: the ones that fail or panic leave nothing behind, and the
    /// others' writes all commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[expect(
        clippy::await_holding_lock,
        reason = "the writer thread must wait for the connection while the calls queue up"
    )]
    async fn a_failed_call_is_undone_alone() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .unwrap();
        let conn = Arc::new(Mutex::new(conn));
        let writer = Arc::new(Writer::spawn(
            conn.clone(),
            Arc::new(wasq_core::SystemClock),
        ));
        // Held while the calls queue up, so that the writer takes them in batches.
        let held = conn.lock().unwrap();
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..200i64 {
            let writer = writer.clone();
            calls.spawn(async move {
                let out = writer
                    .call(move |c, _| {
                        c.execute("INSERT INTO t (k) VALUES (?1)", [k])
                            .map_err(internal)?;
                        match k % 3 {
                            0 => Err(StoreError::Conflict(format!("refused {k}"))),
                            1 if k % 7 == 0 => panic!("call {k} panicked"),
                            _ => Ok(k),
                        }
                    })
                    .await;
                (k, out)
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(held);
        let mut kept = Vec::new();
        for (k, out) in calls.join_all().await {
            match (k % 3, out) {
                (0, Err(StoreError::Conflict(m))) => assert_eq!(m, format!("refused {k}")),
                (1, Err(StoreError::Internal(m))) if k % 7 == 0 => {
                    assert!(m.contains(&format!("call {k} panicked")), "{m}")
                }
                (_, Ok(v)) => {
                    assert_eq!(v, k);
                    kept.push(k);
                }
                (_, other) => panic!("call {k}: {other:?}"),
            }
        }
        kept.sort_unstable();
        let stored: Vec<i64> = writer
            .call(|c, _| {
                let mut s = c.prepare("SELECT k FROM t ORDER BY k").map_err(internal)?;
                let rows = s.query_map([], |r| r.get(0)).map_err(internal)?;
                rows.collect::<Result<_, _>>().map_err(internal)
            })
            .await
            .unwrap();
        assert_eq!(stored, kept);
        assert_eq!(
            kept.len(),
            (0..200)
                .filter(|k| k % 3 != 0 && !(k % 3 == 1 && k % 7 == 0))
                .count()
        );
    }
}

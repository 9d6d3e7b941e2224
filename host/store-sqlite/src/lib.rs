//! wasq-store-sqlite: the embedded [`Store`] behind `wasq dev` and single-node servers.
//!
//! One SQLite file in WAL mode holds components, functions, runs, attempts, steps and
//! logs. Every Store transition is atomic (its own savepoint in a group commit, answered
//! only once committed), so a `kill -9` at any point leaves either the state before or
//! the state after it; leases are rows with an expiry and a per-run fencing token, so runs
//! held by a dead process are handed out again once their lease expires.
//!
//! Claims are fair and cheap with any backlog: due runs enter their tenant's *lane*
//! (indexed by tenant and rank = due time + priority offset); a claim lets the tenants with
//! runs in their lane take turns (a skip-scan of that index, starting after the tenant
//! served last), takes each tenant's best run its gates let start, and *parks* the runs a
//! full concurrency key or throttle window holds back, so they cost nothing until a slot
//! frees (a trigger) or the window opens (`gate_timers`). Quotas read per-tenant counts
//! kept by triggers (`tenant_load`).
//!
//! What a transition does to a run is decided by `wasq_core::lifecycle`; this crate
//! stores it (`transition::apply`). Layout: `schema` (tables, triggers, migration), `rows`
//! (reading), `admission` (enqueue), `claim` (reaping, lanes, gates), `transition`
//! (writing an attempt's results and core's transitions), `waits` (events and resumes),
//! `storage` (quotas, purge), `directory` (tenants and keys).
//!
//! One connection, on one writer thread that commits the calls queued meanwhile together
//! (`writer`: each call in its own savepoint, answered after the commit): SQLite
//! serialises writers anyway, and one connection keeps the transactions simple. A second
//! connection, on a thread of its own, only copies the WAL back into the file
//! (`checkpoint`), so that the calls do not wait for it. This is not a multi-host backend:
//! several processes on one file work, but use Redis for that.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use wasq_core::flow::{FlowPlan, Gate};
use wasq_core::lifecycle::{self, Admission, Change, Execution, Transition};
use wasq_core::storage as storage_limits;
use wasq_core::*;

mod admission;
mod attempt;
mod cached;
mod checkpoint;
mod claim;
mod connection;
mod deliveries;
mod directory;
mod feed;
mod load;
mod rows;
mod schema;
mod storage;
mod transition;
mod waits;
mod workers;
mod writer;

use admission::*;
use cached::Cached;
use claim::*;
use rows::*;
use schema::*;
use transition::*;
use waits::*;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The connection the writer thread uses; this crate's tests also read it directly.
    #[cfg_attr(not(test), expect(dead_code))]
    conn: Arc<Mutex<Connection>>,
    writer: Arc<writer::Writer>,
    /// The tenant the last claim served last: the next claim starts after it.
    cursor: Arc<Mutex<String>>,
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`. A new database file is created owner-only
    /// (0600), whatever the umask; SQLite gives its `-wal` and `-shm` files the database
    /// file's mode, so they are born 0600 too.
    pub fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let unavailable = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("cannot open {}: {e}", path.display()))
        };
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| unavailable(&e))?;
        }
        let conn = Connection::open(path).map_err(|e| unavailable(&e))?;
        Self::init(conn, clock, Some(path))
    }

    pub fn open_in_memory(clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(internal)?, clock, None)
    }

    /// `file`: the database's path, for a store on a file (its WAL's checkpoints then run
    /// beside the writer: `checkpoint`).
    fn init(
        mut conn: Connection,
        clock: Arc<dyn Clock>,
        file: Option<&Path>,
    ) -> Result<Self, StoreError> {
        connection::configure(&conn)?;
        conn.execute_batch(SCHEMA).map_err(internal)?;
        conn.execute_batch(directory::SCHEMA).map_err(internal)?;
        conn.execute_batch(workers::SCHEMA).map_err(internal)?;
        migrate(&conn)?;
        if let Some(path) = file {
            checkpoint::start(&mut conn, path, checkpoint::Pace::DEFAULT, true)?;
        }
        let conn = Arc::new(Mutex::new(conn));
        Ok(SqliteStore {
            writer: Arc::new(writer::Writer::spawn(conn.clone(), clock)),
            conn,
            cursor: Arc::new(Mutex::new(String::new())),
        })
    }

    /// Marks every lease as expired, so the next claim hands those runs out again at once.
    /// For a process that holds the data folder exclusively: any lease still held was held
    /// by a predecessor that died, and waiting for its expiry would only delay recovery.
    pub async fn expire_all_leases(&self) -> Result<usize, StoreError> {
        self.tx(|tx, now| {
            tx.exec(
                "UPDATE runs SET lease_expires_at = ?1 WHERE status = 'running' AND lease_expires_at > ?1",
                [now],
            )
            .map_err(internal)
        })
        .await
    }

    /// Runs `f` in a transaction (its own savepoint in the next group commit: see
    /// `writer`), with the current time.
    async fn tx<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    {
        self.writer.call(f).await
    }
}

#[async_trait]
impl Registry for SqliteStore {
    async fn deploy(&self, req: DeployRequest) -> Result<Function, StoreError> {
        self.tx(move |tx, now| {
            // A function is charged its component's size: replacing one charges the
            // difference.
            let old = load_function(tx, &req.tenant, &req.name)?
                .map_or(0, |f| storage::COST.function(f.size_bytes));
            let new = storage::COST.function(req.component.len() as u64);
            if new > old {
                storage::check_tenant(tx, &req.tenant, new - old)?;
            }
            storage::charge(tx, &req.tenant, None, new as i64 - old as i64)?;
            tx.exec(
                "INSERT INTO components (digest, bytes, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (digest) DO NOTHING",
                params![req.digest, req.component, now],
            )
            .map_err(internal)?;
            tx.exec(
                "INSERT INTO functions (tenant, name, digest, size_bytes, settings, created_at, updated_at, events, schedule)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8)
                 ON CONFLICT (tenant, name) DO UPDATE SET digest = excluded.digest,
                     size_bytes = excluded.size_bytes, settings = excluded.settings,
                     updated_at = excluded.updated_at, events = excluded.events,
                     schedule = excluded.schedule",
                params![
                    req.tenant,
                    req.name,
                    req.digest,
                    req.component.len() as u64,
                    to_json(&req.settings)?,
                    now,
                    to_json(&req.events)?,
                    req.schedule.as_ref().map(to_json).transpose()?
                ],
            )
            .map_err(internal)?;
            load_function(tx, &req.tenant, &req.name)?
                .ok_or_else(|| StoreError::Internal("deployed function vanished".into()))
        })
        .await
    }

    async fn function(&self, tenant: &str, name: &str) -> Result<Option<Function>, StoreError> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.tx(move |tx, _| load_function(tx, &tenant, &name))
            .await
    }

    async fn functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT {FUNCTION_COLUMNS} FROM functions WHERE tenant = ?1 ORDER BY name"
                ))
                .map_err(internal)?;
            let rows = stmt
                .query_map([tenant], function_from_row)
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn schedules(&self, tenant: &str) -> Result<Vec<Scheduled>, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT name, schedule FROM functions INDEXED BY functions_scheduled
                     WHERE tenant = ?1 AND schedule IS NOT NULL ORDER BY name",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map([tenant], |r| {
                    Ok(Scheduled {
                        function: r.get(0)?,
                        schedule: from_json(&r.get::<_, String>(1)?)?,
                    })
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let digest = digest.to_owned();
        self.tx(move |tx, _| {
            tx.row(
                "SELECT bytes FROM components WHERE digest = ?1",
                [digest],
                |r| r.get(0),
            )
            .optional()
            .map_err(internal)
        })
        .await
    }
}

#[async_trait]
impl Queue for SqliteStore {
    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        let admission = if req.parent.is_some() {
            Admission::Child
        } else {
            Admission::Run
        };
        self.tx(move |tx, now| insert_run(tx, now, req, Some(admission)))
            .await
    }

    async fn enqueue_batch(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Enqueued>, StoreError> {
        check_batch(&reqs)?;
        // One call, so one savepoint: a refusal rolls back every run inserted before it.
        self.tx(move |tx, now| admission::insert_batch(tx, now, reqs))
            .await
    }

    async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError> {
        let cursor = self.cursor.clone();
        let after = cursor.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (claimed, last) = self
            .tx(move |tx, now| {
                reap_expired(tx, now)?;
                resolve_timeouts(tx, now)?;
                open_throttles(tx, now)?;
                // Due runs enter their tenant's lane, ranked.
                tx.exec(
                    "UPDATE runs SET promoted = 1, rank = due_at + rank_offset
                     WHERE status IN ('queued', 'sleeping') AND promoted = 0 AND due_at <= ?1",
                    [now],
                )
                .map_err(internal)?;
                // Queues in the order asked (none named: every queue, as one).
                if req.queues.is_empty() {
                    let lane = Lane {
                        queue: None,
                        limit: req.limit,
                    };
                    return claim_round_robin(tx, now, &req, lane, &after);
                }
                let (mut claimed, mut last) = (Vec::new(), None);
                for queue in &req.queues {
                    let limit = req.limit - claimed.len();
                    if limit == 0 {
                        break;
                    }
                    let lane = Lane {
                        queue: Some(queue),
                        limit,
                    };
                    let (got, served) = claim_round_robin(tx, now, &req, lane, &after)?;
                    claimed.extend(got);
                    last = served.or(last);
                }
                Ok((claimed, last))
            })
            .await?;
        if let Some(last) = last {
            *cursor.lock().unwrap_or_else(|p| p.into_inner()) = last;
        }
        Ok(claimed)
    }

    async fn renew(&self, leases: &[Lease], lease_ms: u64) -> Result<Renewal, StoreError> {
        let leases = leases.to_vec();
        self.tx(move |tx, now| {
            let mut renewal = Renewal::default();
            for lease in leases {
                let n = tx
                    .exec(
                        "UPDATE runs SET lease_expires_at = ?3
                         WHERE id = ?1 AND lease_token = ?2 AND status = 'running'
                             AND cancel_requested = 0",
                        params![lease.run_id, lease.token, now + lease_ms as i64],
                    )
                    .map_err(internal)?;
                if n > 0 {
                    continue;
                }
                let cancelling = tx
                    .row(
                        "SELECT 1 FROM runs WHERE id = ?1 AND lease_token = ?2
                             AND status = 'running' AND cancel_requested = 1",
                        params![lease.run_id, lease.token],
                        |_| Ok(()),
                    )
                    .optional()
                    .map_err(internal)?
                    .is_some();
                if cancelling {
                    renewal.cancelling.push(lease.run_id);
                } else {
                    renewal.lost.push(lease.run_id);
                }
            }
            Ok(renewal)
        })
        .await
    }

    async fn record(&self, lease: &Lease, record: Record) -> Result<(), StoreError> {
        let lease = lease.clone();
        self.tx(move |tx, now| attempt::record(tx, now, &lease, record))
            .await
    }

    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError> {
        let lease = lease.clone();
        self.tx(move |tx, now| attempt::finish(tx, now, &lease, outcome))
            .await
    }

    async fn end_attempts(&self, ends: Vec<AttemptEnd>) -> Vec<Result<RunStatus, StoreError>> {
        // One transaction each; sent together, they share the writer's next group commit.
        let calls = ends
            .into_iter()
            .map(|end| self.tx(move |tx, now| attempt::end(tx, now, end)));
        futures_util::future::join_all(calls).await
    }

    /// Sleeps until the earliest time something becomes due (a delayed or backing-off
    /// run, a sleep, a wait's timeout, a throttle reopening), or `max`: an idle worker
    /// starts a delayed run on time, not at its next poll. Only one process uses this
    /// store, and runs created in it wake its worker directly.
    async fn wait_for_work(
        &self,
        max: std::time::Duration,
        _queues: &[String],
    ) -> Result<(), StoreError> {
        let ahead = self
            .tx(|tx, now| {
                tx.row(
                    "SELECT MIN(at) FROM (
                         SELECT MIN(due_at) AS at FROM runs
                             WHERE status IN ('queued', 'sleeping') AND promoted = 0
                         UNION ALL SELECT MIN(due_at) FROM runs WHERE status = 'waiting'
                         UNION ALL SELECT MIN(at) FROM gate_timers)",
                    [],
                    |r| r.get::<_, Option<i64>>(0),
                )
                .map(|at| at.map(|at| at.saturating_sub(now)))
                .map_err(internal)
            })
            .await?;
        // A claim promotes, resolves or opens everything due, so what is due already
        // became due since: claim again (after a millisecond, should a bug leave it due).
        let wait = match ahead {
            Some(ms) => max.min(std::time::Duration::from_millis(ms.max(1) as u64)),
            None => max,
        };
        tokio::time::sleep(wait).await;
        Ok(())
    }
}

#[async_trait]
impl Runs for SqliteStore {
    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError> {
        self.tx(move |tx, now| {
            let id = &req.id;
            let run = tenant_run(tx, &req.tenant, id)?;
            match lifecycle::cancel(id, run.status, req.cancel_error(), now)? {
                Some(t) => apply(tx, &run, &t, now)?,
                // Running: marked, it ends cancelled when its attempt ends.
                None => {
                    tx.exec(
                        "UPDATE runs SET cancel_requested = 1, error = ?3, updated_at = ?2 WHERE id = ?1",
                        params![id, now, to_json(&req.cancel_error())?],
                    )
                    .map_err(internal)?;
                }
            }
            append_logs(tx, &req.tenant, id, vec![req.log_line(run.attempt, now)])?;
            load_run(tx, id)?.ok_or_else(|| StoreError::Internal("cancelled run vanished".into()))
        })
        .await
    }

    async fn retry(&self, req: RunAction) -> Result<Run, StoreError> {
        self.tx(move |tx, now| {
            let id = &req.id;
            let run = tenant_run(tx, &req.tenant, id)?;
            let retry = lifecycle::retry(id, run.status, run.attempt, now)?;
            check_queue_quota(tx, &req.tenant, Admission::Run, 1)?;
            let mut settings = run.settings.clone();
            settings.retry.max_attempts += retry.extra_attempts;
            tx.exec(
                "UPDATE runs SET settings = ?2 WHERE id = ?1",
                params![id, to_json(&settings)?],
            )
            .map_err(internal)?;
            apply(tx, &run, &retry.transition, now)?;
            append_logs(tx, &req.tenant, id, vec![req.log_line(run.attempt, now)])?;
            load_run(tx, id)?.ok_or_else(|| StoreError::Internal("retried run vanished".into()))
        })
        .await
    }

    async fn run_ids(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        let (tenant, prefix) = (tenant.to_owned(), prefix.to_owned());
        self.tx(move |c, _| {
            // Ids are ASCII hex and '-': every id with the prefix sorts below prefix + '~'.
            let mut stmt = c
                .prepare_cached(
                    "SELECT id FROM runs WHERE id >= ?1 AND id < ?1 || '~' AND tenant = ?2
                     ORDER BY id LIMIT ?3",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![prefix, tenant, limit.min(1000) as i64], |r| {
                    r.get(0)
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.tx(move |tx, _| run_detail(tx, &tenant, &id)).await
    }

    async fn steps(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.tx(move |tx, _| {
            tenant_run(tx, &tenant, &id)?;
            step_infos(tx, &id, skip, limit)
        })
        .await
    }

    async fn step(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError> {
        let (tenant, id, name) = (tenant.to_owned(), id.to_owned(), name.to_owned());
        self.tx(move |tx, _| {
            if load_run(tx, &id)?.is_none_or(|r| r.tenant != tenant) {
                return Ok(None);
            }
            tx.row(
                "SELECT name, occurrence, output, attempt, completed_at FROM steps
                 WHERE run_id = ?1 AND name = ?2 AND occurrence = ?3",
                params![id, name, occurrence],
                |r| {
                    Ok(StepRecord {
                        name: r.get(0)?,
                        occurrence: r.get(1)?,
                        output: r.get(2)?,
                        attempt: r.get(3)?,
                        completed_at: r.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(internal)
        })
        .await
    }

    async fn runs(&self, q: RunQuery) -> Result<Vec<Run>, StoreError> {
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached(&rows::list_runs(q.status.is_some()))
                .map_err(internal)?;
            let rows = stmt
                .query_map(
                    params![
                        q.tenant,
                        q.function,
                        q.status.map(|s| s.as_str()),
                        q.limit as i64,
                        q.parent,
                        q.before,
                        q.since
                    ],
                    run_from_row,
                )
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn queue_depths(&self, tenant: &str) -> Result<Vec<QueueDepth>, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| load::queue_depths(tx, &tenant)).await
    }

    async fn load(&self, tenant: &str) -> Result<RunLoad, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| load::load(tx, &tenant)).await
    }

    async fn logs(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.tx(move |tx, _| {
            // A seek on the (run_id, seq) key, not an offset walk: seq counts from 0.
            let mut stmt = tx
                .prepare_cached(
                    "SELECT l.attempt, l.at, l.level, l.source, l.message FROM logs l
                     JOIN runs r ON r.id = l.run_id
                     WHERE l.run_id = ?1 AND r.tenant = ?2 AND l.seq >= ?3
                     ORDER BY l.seq LIMIT ?4",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(
                    params![id, tenant, skip as i64, limit.min(i64::MAX as usize) as i64],
                    |r| {
                        let level: String = r.get(2)?;
                        let source: String = r.get(3)?;
                        Ok(LogLine {
                            attempt: r.get(0)?,
                            at: r.get(1)?,
                            level: from_json(&format!("\"{level}\""))?,
                            source: from_json(&format!("\"{source}\""))?,
                            message: r.get(4)?,
                        })
                    },
                )
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }
}

#[async_trait]
impl Events for SqliteStore {
    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        self.tx(move |tx, now| send_event(tx, now, req)).await
    }
}

#[async_trait]
impl Retention for SqliteStore {
    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        self.tx(move |tx, now| storage::purge(tx, now, req)).await
    }
}

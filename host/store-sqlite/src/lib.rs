//! wasq-store-sqlite: the embedded [`Store`] behind `wasq dev` and single-node servers.
//!
//! One SQLite file in WAL mode holds components, functions, runs, attempts, steps and
//! logs. Every Store transition is one `BEGIN IMMEDIATE` transaction, so a `kill -9` at any
//! point leaves either the state before or the state after it; leases are rows with an
//! expiry and a per-run fencing token, so runs held by a dead process are handed out again
//! once their lease expires.
//!
//! Claims are fair and cheap with any backlog: due runs enter their tenant's *lane*
//! (indexed by tenant and rank = due time + priority offset); a claim lets the tenants with
//! runs in their lane take turns (a skip-scan of that index, starting after the tenant
//! served last), takes each tenant's best run its gates let start, and *parks* the runs a
//! full concurrency key or throttle window holds back, so they cost nothing until a slot
//! frees (a trigger) or the window opens (`gate_timers`). Quotas read per-tenant counts
//! kept by triggers (`tenant_load`).
//!
//! The connection sits behind a mutex and every call runs on tokio's blocking pool: SQLite
//! serialises writers anyway, and one connection keeps the transactions simple. This is
//! not a multi-host backend: several processes on one file work, but use Redis for that.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use wasq_core::flow::{self, FlowPlan, Gate};
use wasq_core::lifecycle::{self, Admission, Change, Execution, Transition};
use wasq_core::storage as storage_limits;
use wasq_core::*;

mod directory;
mod storage;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS components (
    digest     TEXT PRIMARY KEY,
    bytes      BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS functions (
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    digest     TEXT NOT NULL REFERENCES components(digest),
    size_bytes INTEGER NOT NULL,
    settings   TEXT NOT NULL,
    events     TEXT NOT NULL DEFAULT '[]',
    schedule   TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS runs (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    function         TEXT NOT NULL,
    digest           TEXT NOT NULL,
    settings         TEXT NOT NULL,
    status           TEXT NOT NULL,
    input            BLOB NOT NULL,
    output           BLOB,
    error            TEXT,
    attempt          INTEGER NOT NULL DEFAULT 0,
    trigger          TEXT NOT NULL,
    progress         TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    due_at           INTEGER NOT NULL,
    finished_at      INTEGER,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    worker           TEXT,
    idempotency_key  TEXT,
    -- a running run whose cancellation was asked for: cancelled when its attempt ends
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    -- the current execution resumed a sleeping run (it did not start a new attempt)
    resumed          INTEGER NOT NULL DEFAULT 0,
    parent           TEXT,
    -- a waiting run's Wait (JSON), and what it waits on, for indexed lookup
    wait             TEXT,
    wait_event       TEXT,
    wait_run         TEXT
);
CREATE INDEX IF NOT EXISTS runs_waiting_event ON runs (tenant, wait_event) WHERE status = 'waiting';
CREATE INDEX IF NOT EXISTS runs_waiting_run ON runs (wait_run) WHERE status = 'waiting';
CREATE INDEX IF NOT EXISTS runs_wait_due ON runs (due_at) WHERE status = 'waiting';
CREATE INDEX IF NOT EXISTS runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent) WHERE parent IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    tenant     TEXT NOT NULL,
    id         TEXT NOT NULL,
    name       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency ON runs (tenant, function, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_leased ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS runs_by_tenant ON runs (tenant, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS runs_by_function ON runs (tenant, function, created_at DESC, id DESC);
-- One row per execution: a sleep splits one attempt into several executions.
CREATE TABLE IF NOT EXISTS attempts (
    run_id          TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    number          INTEGER NOT NULL,
    worker          TEXT NOT NULL,
    started_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    error           TEXT,
    fuel_used       INTEGER,
    suspended_until INTEGER,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    occurrence   INTEGER NOT NULL,
    output       BLOB NOT NULL,
    attempt      INTEGER NOT NULL,
    completed_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, name, occurrence)
);
CREATE TABLE IF NOT EXISTS logs (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    level   TEXT NOT NULL,
    source  TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"#;

/// Flow control, quotas and fairness (see `claim`): columns added to `runs` (on old files
/// too), their indexes, and the bookkeeping tables. Triggers keep the bookkeeping exact
/// whatever statement changes a run's status:
/// - `tenant_load` counts each tenant's queued and running runs (quotas read it in O(1));
/// - a run that changes status leaves the lane (`promoted`) and any gate it was parked on;
/// - a run of a concurrency key that stops running (or ends while waiting) lets the best
///   parked run of its key back into the lane.
const FLOW_COLUMNS: &[(&str, &str)] = &[
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    // priority x aging step; rank = due_at + rank_offset, set when the run enters the lane
    ("rank_offset", "INTEGER NOT NULL DEFAULT 0"),
    ("rank", "INTEGER NOT NULL DEFAULT 0"),
    // 1 once due: the run is in its tenant's lane, ordered by rank
    ("promoted", "INTEGER NOT NULL DEFAULT 0"),
    // the gate a due run waits on (its concurrency key is full, or its throttle window)
    ("parked", "TEXT"),
    ("cgate", "TEXT"),
    ("climit", "INTEGER"),
    ("tgate", "TEXT"),
    ("tlimit", "INTEGER"),
    ("tperiod", "INTEGER"),
    ("dgate", "TEXT"),
    ("flow_keys", "TEXT"),
];

/// Storage accounting (see `storage.rs`), added to `runs` on old files too; a file that
/// lacked them is recounted once.
const STORAGE_COLUMNS: &[(&str, &str)] = &[
    ("stored_bytes", "INTEGER NOT NULL DEFAULT 0"),
    ("log_bytes", "INTEGER NOT NULL DEFAULT 0"),
    // 1 once log lines were dropped for the run's log budget (the marker line is stored)
    ("logs_cut", "INTEGER NOT NULL DEFAULT 0"),
];

/// The run's columns that change after it was created (its latest error, its pinned
/// settings on a manual retry, its progress and wait) are charged by a trigger, whatever
/// statement changes them: the difference in bytes goes to the run and its tenant (see
/// `storage.rs`), never refused (each is bounded where it is made).
fn storage_schema() -> String {
    let bytes = |row: &str| {
        ["error", "settings", "progress", "wait"]
            .map(|c| format!("COALESCE(length(CAST({row}.{c} AS BLOB)), 0)"))
            .join(" + ")
    };
    let (new, old) = (bytes("NEW"), bytes("OLD"));
    format!(
        "CREATE TRIGGER IF NOT EXISTS runs_blob_bytes
         AFTER UPDATE OF error, settings, progress, wait ON runs
         WHEN {new} <> {old}
         BEGIN
             UPDATE runs SET stored_bytes = MAX(stored_bytes + ({new}) - ({old}), 0)
             WHERE id = NEW.id;
             UPDATE tenant_usage SET stored = MAX(stored + ({new}) - ({old}), 0)
             WHERE tenant = NEW.tenant;
         END;"
    )
}

const FLOW_SCHEMA: &str = r#"
DROP INDEX IF EXISTS runs_ready;
CREATE INDEX IF NOT EXISTS runs_due ON runs (due_at)
    WHERE status IN ('queued', 'sleeping') AND promoted = 0;
CREATE INDEX IF NOT EXISTS runs_lane ON runs (tenant, rank, id)
    WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL;
CREATE INDEX IF NOT EXISTS runs_parked ON runs (tenant, parked, rank, id) WHERE parked IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_gate_running ON runs (tenant, cgate)
    WHERE status = 'running' AND cgate IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_debounce ON runs (tenant, dgate)
    WHERE status = 'queued' AND dgate IS NOT NULL;
-- Sliding windows: first starts of throttled runs, accepted runs of rate limits.
CREATE TABLE IF NOT EXISTS flow_log (
    tenant TEXT NOT NULL,
    gate   TEXT NOT NULL,
    at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS flow_log_by_gate ON flow_log (tenant, gate, at);
-- When a throttle gate with parked runs opens next.
CREATE TABLE IF NOT EXISTS gate_timers (
    tenant  TEXT NOT NULL,
    gate    TEXT NOT NULL,
    at      INTEGER NOT NULL,
    tlimit  INTEGER NOT NULL,
    tperiod INTEGER NOT NULL,
    PRIMARY KEY (tenant, gate)
);
CREATE INDEX IF NOT EXISTS gate_timers_by_time ON gate_timers (at);
CREATE TABLE IF NOT EXISTS tenant_load (
    tenant  TEXT PRIMARY KEY,
    queued  INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER IF NOT EXISTS runs_load_insert AFTER INSERT ON runs BEGIN
    INSERT OR IGNORE INTO tenant_load (tenant) VALUES (NEW.tenant);
    UPDATE tenant_load SET queued = queued + (NEW.status = 'queued'),
        running = running + (NEW.status = 'running')
    WHERE tenant = NEW.tenant;
END;
CREATE TRIGGER IF NOT EXISTS runs_load_delete AFTER DELETE ON runs BEGIN
    UPDATE tenant_load SET queued = queued - (OLD.status = 'queued'),
        running = running - (OLD.status = 'running')
    WHERE tenant = OLD.tenant;
END;
CREATE TRIGGER IF NOT EXISTS runs_status_change AFTER UPDATE OF status ON runs
WHEN OLD.status <> NEW.status BEGIN
    UPDATE tenant_load SET
        queued = queued + (NEW.status = 'queued') - (OLD.status = 'queued'),
        running = running + (NEW.status = 'running') - (OLD.status = 'running')
    WHERE tenant = NEW.tenant;
    UPDATE runs SET promoted = 0, parked = NULL
    WHERE id = NEW.id AND (promoted <> 0 OR parked IS NOT NULL);
    UPDATE runs SET parked = NULL
    WHERE OLD.cgate IS NOT NULL
      AND (OLD.status = 'running'
           OR NEW.status IN ('succeeded', 'failed', 'cancelled', 'skipped'))
      AND id = (SELECT id FROM runs WHERE tenant = OLD.tenant AND parked = OLD.cgate
                ORDER BY rank, id LIMIT 1);
END;
"#;

/// Gate checks one claim may fail (parking those runs) before it gives up for now.
const PARK_BUDGET: usize = 1000;
/// Tenants with due runs one claim considers at most.
const LANE_TENANTS_MAX: usize = 10_000;

const RUN_COLUMNS: &str = "id, tenant, function, digest, settings, status, input, output, error, \
     attempt, trigger, progress, created_at, updated_at, due_at, finished_at, idempotency_key, \
     parent, wait, priority, flow_keys, stored_bytes, log_bytes";

#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    clock: Arc<dyn Clock>,
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
        Self::init(conn, clock)
    }

    pub fn open_in_memory(clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(internal)?, clock)
    }

    fn init(conn: Connection, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        // WAL + synchronous=NORMAL: a committed transaction survives the process dying
        // (kill -9); only an OS crash or power loss can drop the last few commits.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(internal)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(internal)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(internal)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(internal)?;
        conn.execute_batch(SCHEMA).map_err(internal)?;
        conn.execute_batch(directory::SCHEMA).map_err(internal)?;
        migrate(&conn)?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            clock,
            cursor: Arc::new(Mutex::new(String::new())),
        })
    }

    /// Marks every lease as expired, so the next claim hands those runs out again at once.
    /// For a process that holds the data folder exclusively: any lease still held was held
    /// by a predecessor that died, and waiting for its expiry would only delay recovery.
    pub async fn expire_all_leases(&self) -> Result<usize, StoreError> {
        self.tx(|tx, now| {
            tx.execute(
                "UPDATE runs SET lease_expires_at = ?1 WHERE status = 'running' AND lease_expires_at > ?1",
                [now],
            )
            .map_err(internal)
        })
        .await
    }

    /// Runs `f` in one immediate transaction on the blocking pool, with the current time.
    async fn tx<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>, i64) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = self.conn.clone();
        let clock = self.clock.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(internal)?;
            // Read the time holding the write lock, so the transitions' times are in the
            // order they commit (a claim cannot record a start before the finish that freed
            // its slot).
            let now = clock.now_ms();
            let out = f(&tx, now)?;
            tx.commit().map_err(internal)?;
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }
}

/// Brings a file created by an older version up to date: adds the flow-control columns,
/// and fills `tenant_load` once, when its triggers are first created.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let have: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info('runs')")
            .map_err(internal)?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (name, decl) in FLOW_COLUMNS.iter().chain(STORAGE_COLUMNS) {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE runs ADD COLUMN {name} {decl}"))
                .map_err(internal)?;
        }
    }
    let usage_counted: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('tenant_usage') WHERE name = 'stored')",
            [],
            |r| r.get(0),
        )
        .map_err(internal)?;
    if !usage_counted {
        conn.execute_batch("ALTER TABLE tenant_usage ADD COLUMN stored INTEGER NOT NULL DEFAULT 0")
            .map_err(internal)?;
    }
    conn.execute_batch("CREATE INDEX IF NOT EXISTS runs_by_digest ON runs (digest);")
        .map_err(internal)?;
    let blobs_counted: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'runs_blob_bytes')",
            [],
            |r| r.get(0),
        )
        .map_err(internal)?;
    conn.execute_batch(&storage_schema()).map_err(internal)?;
    if !have.iter().any(|h| h == "stored_bytes") || !usage_counted || !blobs_counted {
        storage::recount(conn)?;
    }
    let counted: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'runs_load_insert')",
            [],
            |r| r.get(0),
        )
        .map_err(internal)?;
    conn.execute_batch(FLOW_SCHEMA).map_err(internal)?;
    if !counted {
        conn.execute_batch(
            "INSERT OR REPLACE INTO tenant_load (tenant, queued, running)
             SELECT tenant, SUM(status = 'queued'), SUM(status = 'running') FROM runs GROUP BY tenant",
        )
        .map_err(internal)?;
    }
    Ok(())
}

fn internal(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(ref f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
            tracing::error!(error = %e, "the disk of the embedded store is full");
            StoreError::Full(format!("the disk of the database is full: {e}"))
        }
        rusqlite::Error::SqliteFailure(ref f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            StoreError::Unavailable(e.to_string())
        }
        e => StoreError::Internal(e.to_string()),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(s: &str) -> rusqlite::Result<T> {
    serde_json::from_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn opt_json<T: serde::de::DeserializeOwned>(s: Option<String>) -> rusqlite::Result<Option<T>> {
    s.as_deref().map(from_json).transpose()
}

fn run_from_row(row: &Row<'_>) -> rusqlite::Result<Run> {
    let status: String = row.get(5)?;
    Ok(Run {
        id: row.get(0)?,
        tenant: row.get(1)?,
        function: row.get(2)?,
        digest: row.get(3)?,
        settings: from_json(&row.get::<_, String>(4)?)?,
        status: status.parse().map_err(|e: String| {
            rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, e.into())
        })?,
        input: row.get(6)?,
        output: row.get(7)?,
        error: opt_json(row.get(8)?)?,
        attempt: row.get(9)?,
        trigger: row.get(10)?,
        progress: opt_json(row.get(11)?)?,
        created_at: row.get(12)?,
        updated_at: row.get(13)?,
        due_at: row.get(14)?,
        finished_at: row.get(15)?,
        idempotency_key: row.get(16)?,
        parent: row.get(17)?,
        wait: opt_json(row.get(18)?)?,
        priority: row.get(19)?,
        keys: opt_json(row.get(20)?)?.unwrap_or_default(),
        stored_bytes: row.get::<_, i64>(21)?.max(0) as u64,
        log_bytes: row.get::<_, i64>(22)?.max(0) as u64,
    })
}

fn function_from_row(row: &Row<'_>) -> rusqlite::Result<Function> {
    Ok(Function {
        tenant: row.get(0)?,
        name: row.get(1)?,
        digest: row.get(2)?,
        size_bytes: row.get(3)?,
        settings: from_json(&row.get::<_, String>(4)?)?,
        created_at: row.get(5)?,
        updated_at: row.get(6)?,
        events: from_json(&row.get::<_, String>(7)?)?,
        schedule: opt_json(row.get(8)?)?,
    })
}

const FUNCTION_COLUMNS: &str =
    "tenant, name, digest, size_bytes, settings, created_at, updated_at, events, schedule";

fn load_function(
    tx: &Connection,
    tenant: &str,
    name: &str,
) -> Result<Option<Function>, StoreError> {
    tx.query_row(
        &format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE tenant = ?1 AND name = ?2"),
        params![tenant, name],
        function_from_row,
    )
    .optional()
    .map_err(internal)
}

fn load_run(tx: &Connection, id: &str) -> Result<Option<Run>, StoreError> {
    tx.query_row(
        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
        [id],
        run_from_row,
    )
    .optional()
    .map_err(internal)
}

/// A run's steps for replay: outputs inline while they fit in
/// [`wasq_core::storage::INLINE_REPLAY_BYTES`], the rest by reference (read when the replay
/// reaches them), so a claim never reads a run's big steps at once.
fn replay_steps(tx: &Connection, id: &str) -> Result<Vec<ReplayStep>, StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT name, occurrence, length(output) FROM steps WHERE run_id = ?1 ORDER BY rowid",
        )
        .map_err(internal)?;
    let index: Vec<(String, u32, i64)> = stmt
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(internal)?
        .collect::<Result<_, _>>()
        .map_err(internal)?;
    let mut budget = wasq_core::storage::INLINE_REPLAY_BYTES as i64;
    let mut steps = Vec::with_capacity(index.len());
    for (name, occurrence, size) in index {
        let output = if size <= budget {
            budget -= size;
            Some(step_output(tx, id, &name, occurrence)?.unwrap_or_default())
        } else {
            None
        };
        steps.push(ReplayStep {
            name,
            occurrence,
            output,
        });
    }
    Ok(steps)
}

fn step_output(
    tx: &Connection,
    id: &str,
    name: &str,
    occurrence: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    tx.prepare_cached(
        "SELECT output FROM steps WHERE run_id = ?1 AND name = ?2 AND occurrence = ?3",
    )
    .map_err(internal)?
    .query_row(params![id, name, occurrence], |r| r.get(0))
    .optional()
    .map_err(internal)
}

const STEP_INFO: &str = "SELECT name, occurrence, attempt, completed_at, length(output) FROM steps WHERE run_id = ?1 \
     ORDER BY rowid LIMIT ?2 OFFSET ?3";

fn step_infos(
    tx: &Connection,
    id: &str,
    skip: usize,
    limit: usize,
) -> Result<Vec<StepInfo>, StoreError> {
    let mut stmt = tx.prepare_cached(STEP_INFO).map_err(internal)?;
    let rows = stmt
        .query_map(params![id, limit as i64, skip as i64], |r| {
            Ok(StepInfo {
                name: r.get(0)?,
                occurrence: r.get(1)?,
                attempt: r.get(2)?,
                completed_at: r.get(3)?,
                output_bytes: r.get::<_, i64>(4)?.max(0) as u64,
            })
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// A leased run with the bookkeeping columns that ending its attempt needs.
struct Leased {
    run: Run,
    /// The current execution woke a sleeping or waiting run (see `claim`).
    resumed: bool,
    cancel_requested: bool,
}

/// Checks the fence in one read: the run is running under exactly this lease.
fn check_lease(tx: &Connection, lease: &Lease) -> Result<Leased, StoreError> {
    let (leased, token) = tx
        .query_row(
            &format!("SELECT {RUN_COLUMNS}, lease_token, resumed, cancel_requested FROM runs WHERE id = ?1"),
            [&lease.run_id],
            |r| {
                let leased = Leased {
                    run: run_from_row(r)?,
                    resumed: r.get("resumed")?,
                    cancel_requested: r.get("cancel_requested")?,
                };
                Ok((leased, r.get::<_, u64>("lease_token")?))
            },
        )
        .optional()
        .map_err(internal)?
        .ok_or_else(|| StoreError::NotFound(format!("run {}", lease.run_id)))?;
    if leased.run.status != RunStatus::Running || token != lease.token {
        return Err(StoreError::LeaseLost(lease.run_id.clone()));
    }
    Ok(leased)
}

/// Writes a lifecycle transition of `run` (as read in this transaction): its history,
/// its tenant's usage and its row; then, if it ended, resumes the runs waiting for it.
/// The transition decided everything; this only stores it.
fn apply(tx: &Connection, run: &Run, t: &Transition, now: i64) -> Result<(), StoreError> {
    match &t.execution {
        Some(Execution::Close {
            error,
            fuel_used,
            suspended_until,
        }) => close_execution(tx, run, now, error.as_ref(), *fuel_used, *suspended_until)?,
        Some(Execution::Drop) => {
            tx.execute(
                "DELETE FROM attempts
                 WHERE run_id = ?1 AND seq = (SELECT MAX(seq) FROM attempts WHERE run_id = ?1)",
                [&run.id],
            )
            .map_err(internal)?;
            storage::charge(
                tx,
                &run.tenant,
                Some(&run.id),
                -(storage::COST.attempt() as i64),
            )?;
        }
        None => {}
    }
    if t.usage.executions > 0 {
        directory::add_usage(tx, &run.tenant, t.usage.fuel)?;
    }
    let (set_error, error) = match &t.error {
        Change::Keep => (false, None),
        Change::Set(e) => (true, Some(to_json(e)?)),
        Change::Clear => (true, None),
    };
    tx.execute(
        "UPDATE runs SET status = ?2, error = CASE WHEN ?3 THEN ?4 ELSE error END,
             output = COALESCE(?5, output), due_at = COALESCE(?6, due_at), finished_at = ?7,
             attempt = attempt - ?8,
             cancel_requested = CASE WHEN ?9 THEN 0 ELSE cancel_requested END,
             updated_at = ?10, lease_expires_at = NULL, worker = NULL
         WHERE id = ?1",
        params![
            run.id,
            t.status.as_str(),
            set_error,
            error,
            t.output,
            t.due_at,
            t.finished_at,
            i64::from(t.give_back_attempt),
            t.clear_cancel,
            now
        ],
    )
    .map_err(internal)?;
    if let Some(wait) = &t.wait {
        let (event, target) = match &wait.on {
            WaitOn::Event { name, .. } => (Some(name.as_str()), None),
            WaitOn::Run { id } => (None, Some(id.as_str())),
        };
        tx.execute(
            "UPDATE runs SET wait = ?2, wait_event = ?3, wait_run = ?4 WHERE id = ?1",
            params![run.id, to_json(wait)?, event, target],
        )
        .map_err(internal)?;
    }
    if let Some(resolution) = &t.resolution {
        resolve_waiters_of(tx, &run.id, resolution, now)?;
    }
    Ok(())
}

/// Ends the run's latest execution; its error (bounded by whoever made it) is charged to
/// the run without a quota check, so a run over its quota can still fail.
fn close_execution(
    tx: &Connection,
    run: &Run,
    now: i64,
    error: Option<&RunError>,
    fuel_used: Option<u64>,
    suspended_until: Option<i64>,
) -> Result<(), StoreError> {
    let error = error.map(to_json).transpose()?;
    tx.execute(
        "UPDATE attempts SET finished_at = ?2, error = ?3, fuel_used = ?4, suspended_until = ?5
         WHERE run_id = ?1 AND seq = (SELECT MAX(seq) FROM attempts WHERE run_id = ?1)",
        params![run.id, now, error, fuel_used, suspended_until],
    )
    .map_err(internal)?;
    if let Some(e) = &error {
        storage::charge(tx, &run.tenant, Some(&run.id), e.len() as i64)?;
    }
    Ok(())
}

/// A run of `tenant`, or NotFound: other tenants' runs do not exist for the caller.
fn tenant_run(tx: &Connection, tenant: &str, id: &str) -> Result<Run, StoreError> {
    load_run(tx, id)?
        .filter(|r| r.tenant == tenant)
        .ok_or_else(|| StoreError::NotFound(format!("run {id:?}")))
}

/// Takes back runs whose worker stopped renewing: queued again, or failed for good.
fn reap_expired(tx: &Connection, now: i64) -> Result<(), StoreError> {
    let expired: Vec<(Run, Option<String>, bool)> = {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS}, worker, cancel_requested FROM runs
                 WHERE status = 'running' AND lease_expires_at <= ?1"
            ))
            .map_err(internal)?;
        let rows = stmt
            .query_map([now], |r| {
                Ok((
                    run_from_row(r)?,
                    r.get("worker")?,
                    r.get("cancel_requested")?,
                ))
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (run, worker, cancel_requested) in expired {
        let t = lifecycle::lease_expired(
            lifecycle::Expired {
                id: &run.id,
                attempt: run.attempt,
                max_attempts: run.settings.retry.max_attempts,
                worker: worker.as_deref(),
                cancel_requested,
            },
            now,
        );
        apply(tx, &run, &t, now)?;
    }
    Ok(())
}

/// Creates a run (or finds the one with the same idempotency key) inside a transaction,
/// applying the function's rate limit and debounce and the tenant's `max_queued` (see
/// [`Store::enqueue`]).
///
/// `admission`: the `max_queued` it applies; `None` when the caller checked it for a
/// batch (an event's subscribers).
fn insert_run(
    tx: &Connection,
    now: i64,
    req: EnqueueRequest,
    admission: Option<Admission>,
) -> Result<Enqueued, StoreError> {
    let id = wasq_core::ids::new_run_id(now);
    let function = load_function(tx, &req.tenant, &req.function)?
        .ok_or_else(|| StoreError::NotFound(format!("function {:?}", req.function)))?;
    if let Some(key) = &req.idempotency_key {
        let existing: Option<(String, i64)> = tx
            .query_row(
                "SELECT id, created_at FROM runs
                 WHERE tenant = ?1 AND function = ?2 AND idempotency_key = ?3",
                params![req.tenant, req.function, key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(internal)?;
        match existing {
            Some((id, created)) if created > now - IDEMPOTENCY_WINDOW_MS => {
                let run = load_run(tx, &id)?
                    .ok_or_else(|| StoreError::Internal("keyed run vanished".into()))?;
                return Ok(Enqueued {
                    run,
                    created: false,
                });
            }
            // Past its window the key is free again; the old run keeps its history.
            Some((id, _)) => {
                tx.execute("UPDATE runs SET idempotency_key = NULL WHERE id = ?1", [id])
                    .map_err(internal)?;
            }
            None => {}
        }
    }
    let plan = function
        .settings
        .flow
        .plan(&req.function, &req.input, req.priority);
    let mut settings = function.settings;
    if let Some(retry) = req.retry {
        settings.retry = retry;
    }
    let new = NewRun {
        id: &id,
        req: &req,
        digest: &function.digest,
        settings: &settings,
        plan: &plan,
    };
    if let Some(g) = &plan.rate_limit
        && window_full(tx, &req.tenant, g, now)?.is_some()
    {
        new.insert(tx, now, now, Some(&plan.rate_limited_error()))?;
        return created(tx, &id);
    }
    // The pending (not yet started) run of the debounce key, which this one replaces.
    let replaced: Option<String> = match &plan.debounce {
        Some(g) => tx
            .query_row(
                "SELECT id FROM runs WHERE tenant = ?1 AND dgate = ?2 AND status = 'queued'
                     AND attempt = 0 LIMIT 1",
                params![req.tenant, g.id],
                |r| r.get(0),
            )
            .optional()
            .map_err(internal)?,
        None => None,
    };
    if let Some(admission) = admission {
        check_queue_quota(tx, &req.tenant, admission, u64::from(replaced.is_none()))?;
    }
    if let Some(old) = replaced {
        let old = load_run(tx, &old)?
            .ok_or_else(|| StoreError::Internal("debounced run vanished".into()))?;
        let t = lifecycle::skip(&old.id, flow::debounced_error(&id), now);
        apply(tx, &old, &t, now)?;
    }
    let mut due = req.due_at.unwrap_or(now);
    if let Some(g) = &plan.debounce {
        due = due.max(now + g.period_ms as i64);
    }
    new.insert(tx, now, due, None)?;
    if let Some(g) = &plan.rate_limit {
        log_window(tx, &req.tenant, g, now)?;
    }
    created(tx, &id)
}

fn created(tx: &Connection, id: &str) -> Result<Enqueued, StoreError> {
    let run =
        load_run(tx, id)?.ok_or_else(|| StoreError::Internal("inserted run vanished".into()))?;
    Ok(Enqueued { run, created: true })
}

/// A run about to be inserted.
struct NewRun<'a> {
    id: &'a str,
    req: &'a EnqueueRequest,
    digest: &'a str,
    settings: &'a FunctionSettings,
    plan: &'a FlowPlan,
}

impl NewRun<'_> {
    /// Inserts it queued, due at `due` (in the lane at once when due now), or skipped
    /// with `skipped` as its error.
    fn insert(
        &self,
        tx: &Connection,
        now: i64,
        due: i64,
        skipped: Option<&RunError>,
    ) -> Result<(), StoreError> {
        let (req, plan) = (self.req, self.plan);
        let (status, error, finished) = match skipped {
            Some(e) => (RunStatus::Skipped, Some(to_json(e)?), Some(now)),
            None => (RunStatus::Queued, None, None),
        };
        let keys = (!plan.keys.is_empty())
            .then(|| to_json(&plan.keys))
            .transpose()?;
        let (cgate, climit) = plan
            .concurrency
            .as_ref()
            .map_or((None, None), |g| (Some(&g.id), Some(g.limit)));
        let (tgate, tlimit, tperiod) = plan.throttle.as_ref().map_or((None, None, None), |g| {
            (Some(&g.id), Some(g.limit), Some(g.period_ms as i64))
        });
        let promoted = skipped.is_none() && due <= now;
        let settings = to_json(self.settings)?;
        // Everything the row keeps whole (the idempotency key twice: the row and its
        // unique index); the rest is the per-run overhead.
        let payload = req.input.len()
            + req.trigger.len()
            + settings.len()
            + 2 * req.idempotency_key.as_ref().map_or(0, String::len)
            + keys.as_ref().map_or(0, String::len)
            + error.as_ref().map_or(0, String::len);
        let cost = storage::COST.run(payload);
        storage::check_run_keeping(tx, &req.tenant, self.id, 0, cost)?;
        tx.execute(
            "INSERT INTO runs (id, tenant, function, digest, settings, status, input, trigger,
                 created_at, updated_at, due_at, idempotency_key, parent, error, finished_at,
                 priority, rank_offset, rank, promoted, cgate, climit, tgate, tlimit, tperiod,
                 dgate, flow_keys, stored_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14,
                 ?15, ?16, ?10 + ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)",
            params![
                self.id,
                req.tenant,
                req.function,
                self.digest,
                settings,
                status.as_str(),
                req.input,
                req.trigger,
                now,
                due,
                req.idempotency_key,
                req.parent,
                error,
                finished,
                plan.priority,
                plan.rank_offset,
                promoted,
                cgate,
                climit,
                tgate,
                tlimit,
                tperiod,
                plan.debounce.as_ref().map(|g| &g.id),
                keys,
                cost as i64,
            ],
        )
        .map_err(internal)?;
        storage::charge(tx, &req.tenant, None, cost as i64)
    }
}

/// Fails with the tenant's `max_queued` error unless `admission` lets it queue `adding`
/// more runs ([`lifecycle::admit`]). A tenant without a record has no quotas.
fn check_queue_quota(
    tx: &Connection,
    tenant: &str,
    admission: Admission,
    adding: u64,
) -> Result<(), StoreError> {
    let Some(quotas) = tenant_quotas(tx, tenant)? else {
        return Ok(());
    };
    let queued: i64 = tx
        .query_row(
            "SELECT queued FROM tenant_load WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?
        .unwrap_or(0);
    lifecycle::admit(
        tenant,
        admission,
        queued.max(0) as u64,
        adding,
        Some(quotas.max_queued),
    )
}

fn tenant_quotas(tx: &Connection, tenant: &str) -> Result<Option<Quotas>, StoreError> {
    let quotas: Option<String> = tx
        .query_row(
            "SELECT quotas FROM tenants WHERE name = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    quotas
        .map(|q| serde_json::from_str(&q).map_err(|e| StoreError::Internal(format!("quotas: {e}"))))
        .transpose()
}

/// The sliding window of a throttle or rate limit: `Some(t)` when `limit` entries fall in
/// the last `period` (the window is full until `t`), `None` when there is room.
fn window_full(
    tx: &Connection,
    tenant: &str,
    gate: &Gate,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    let limit_th: Option<i64> = tx
        .query_row(
            "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at > ?3
             ORDER BY at DESC LIMIT 1 OFFSET ?4",
            params![
                tenant,
                gate.id,
                now - gate.period_ms as i64,
                i64::from(gate.limit) - 1
            ],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    Ok(limit_th.map(|at| at + gate.period_ms as i64))
}

/// Records an entry in the window (and forgets entries that left it).
fn log_window(tx: &Connection, tenant: &str, gate: &Gate, now: i64) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at <= ?3",
        params![tenant, gate.id, now - gate.period_ms as i64],
    )
    .map_err(internal)?;
    tx.execute(
        "INSERT INTO flow_log (tenant, gate, at) VALUES (?1, ?2, ?3)",
        params![tenant, gate.id, now],
    )
    .map_err(internal)?;
    Ok(())
}

/// A tenant taking turns in a claim.
struct Turn {
    tenant: String,
    /// Runs it may still start in this claim (`max_running` minus running).
    room: u64,
}

/// Runs the tenant may start now: `max_running` minus its running runs (no record: no
/// limit).
fn room(tx: &Connection, tenant: &str) -> Result<u64, StoreError> {
    let Some(q) = tenant_quotas(tx, tenant)? else {
        return Ok(u64::MAX);
    };
    let running: i64 = tx
        .query_row(
            "SELECT running FROM tenant_load WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?
        .unwrap_or(0);
    Ok(u64::from(q.max_running).saturating_sub(running.max(0) as u64))
}

/// The claim proper, after reaping and promotion: the tenants with runs in their lane take
/// turns, one run per turn, until `limit` runs are leased or no tenant has a startable run.
/// The first round walks the tenants in name order from the one after `after` (wrapping
/// around), one index seek each, and stops as soon as `limit` runs are leased; tenants
/// that got a run and may start more go round again. Returns the runs and the tenant
/// served last (where the next claim starts).
fn claim_round_robin(
    tx: &Connection,
    now: i64,
    req: &ClaimRequest,
    after: &str,
) -> Result<(Vec<Claimed>, Option<String>), StoreError> {
    let expires_at = now + req.lease_ms as i64;
    let mut claimed = Vec::new();
    let mut last = None;
    let mut parks = PARK_BUDGET;
    let mut again = std::collections::VecDeque::new();
    let mut take = |tx: &Connection,
                    mut turn: Turn,
                    parks: &mut usize,
                    claimed: &mut Vec<Claimed>|
     -> Result<Option<Turn>, StoreError> {
        let Some(id) = next_startable(tx, &turn.tenant, now, parks)? else {
            return Ok(None);
        };
        claimed.push(lease_run(tx, &id, &req.worker, now, expires_at)?);
        last = Some(turn.tenant.clone());
        turn.room -= 1;
        Ok((turn.room > 0).then_some(turn))
    };
    {
        // Skip-scan of the lane index: one seek per tenant.
        let mut next = tx
            .prepare_cached(
                "SELECT tenant FROM runs
                 WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL
                     AND tenant > ?1
                 ORDER BY tenant LIMIT 1",
            )
            .map_err(internal)?;
        let mut from = after.to_owned();
        let mut wrapped = after.is_empty();
        let mut visited = 0;
        while claimed.len() < req.limit && visited < LANE_TENANTS_MAX {
            let found = next
                .query_row([&from], |r| r.get::<_, String>(0))
                .optional()
                .map_err(internal)?;
            let tenant = match found {
                Some(t) if !(wrapped && !after.is_empty() && t.as_str() > after) => t,
                // Past the end: once more from the start, up to the cursor.
                None if !wrapped => {
                    wrapped = true;
                    from.clear();
                    continue;
                }
                _ => break,
            };
            from.clone_from(&tenant);
            visited += 1;
            let room = room(tx, &tenant)?;
            if room == 0 {
                continue;
            }
            if let Some(turn) = take(tx, Turn { tenant, room }, &mut parks, &mut claimed)? {
                again.push_back(turn);
            }
        }
    }
    while claimed.len() < req.limit {
        let Some(turn) = again.pop_front() else {
            break;
        };
        if let Some(turn) = take(tx, turn, &mut parks, &mut claimed)? {
            again.push_back(turn);
        }
    }
    Ok((claimed, last))
}

/// The tenant's best-ranked run in its lane that its gates let start now. Runs whose
/// concurrency key is full or whose throttle window is full (first starts only) are
/// parked on that gate on the way; `None` when none is left or `parks` ran out.
fn next_startable(
    tx: &Connection,
    tenant: &str,
    now: i64,
    parks: &mut usize,
) -> Result<Option<String>, StoreError> {
    loop {
        if *parks == 0 {
            return Ok(None);
        }
        #[allow(clippy::type_complexity)]
        let head: Option<(
            String,
            String,
            u32,
            Option<String>,
            Option<u32>,
            Option<String>,
            Option<u32>,
            Option<i64>,
        )> = tx
            .prepare_cached(
                "SELECT id, status, attempt, cgate, climit, tgate, tlimit, tperiod FROM runs
                 WHERE tenant = ?1 AND status IN ('queued', 'sleeping') AND promoted = 1
                     AND parked IS NULL
                 ORDER BY rank, id LIMIT 1",
            )
            .map_err(internal)?
            .query_row([tenant], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })
            .optional()
            .map_err(internal)?;
        let Some((id, status, attempt, cgate, climit, tgate, tlimit, tperiod)) = head else {
            return Ok(None);
        };
        if let (Some(gate), Some(limit)) = (&cgate, climit) {
            let running: u32 = tx
                .query_row(
                    "SELECT COUNT(*) FROM runs WHERE tenant = ?1 AND cgate = ?2 AND status = 'running'",
                    params![tenant, gate],
                    |r| r.get(0),
                )
                .map_err(internal)?;
            if running >= limit {
                park(tx, &id, gate)?;
                *parks -= 1;
                continue;
            }
        }
        if let (Some(id_t), Some(limit), Some(period)) = (&tgate, tlimit, tperiod)
            && status == "queued"
            && attempt == 0
        {
            let gate = Gate {
                id: id_t.clone(),
                limit,
                period_ms: period as u64,
            };
            if let Some(open_at) = window_full(tx, tenant, &gate, now)? {
                park(tx, &id, &gate.id)?;
                tx.execute(
                    "INSERT INTO gate_timers (tenant, gate, at, tlimit, tperiod)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (tenant, gate) DO UPDATE SET at = MIN(at, excluded.at)",
                    params![tenant, gate.id, open_at, limit, period],
                )
                .map_err(internal)?;
                *parks -= 1;
                continue;
            }
            log_window(tx, tenant, &gate, now)?;
        }
        return Ok(Some(id));
    }
}

fn park(tx: &Connection, id: &str, gate: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE runs SET parked = ?2 WHERE id = ?1",
        params![id, gate],
    )
    .map_err(internal)?;
    Ok(())
}

/// Leases run `id` (in the lane, let through by its gates) to `worker`.
fn lease_run(
    tx: &Connection,
    id: &str,
    worker: &str,
    now: i64,
    expires_at: i64,
) -> Result<Claimed, StoreError> {
    let (status, attempt): (String, u32) = tx
        .query_row(
            "SELECT status, attempt FROM runs WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(internal)?;
    let status: RunStatus = status.parse().map_err(StoreError::Internal)?;
    let (attempt, resumed) = lifecycle::claimed_attempt(status, attempt);
    let token: u64 = tx
        .query_row(
            "UPDATE runs SET status = 'running', attempt = ?5, resumed = ?6,
                 lease_token = lease_token + 1, lease_expires_at = ?2, worker = ?3,
                 updated_at = ?4
             WHERE id = ?1 RETURNING lease_token",
            params![id, expires_at, worker, now, attempt, resumed],
            |r| r.get(0),
        )
        .map_err(internal)?;
    let run =
        load_run(tx, id)?.ok_or_else(|| StoreError::Internal("claimed run vanished".into()))?;
    tx.execute(
        "INSERT INTO attempts (run_id, seq, number, worker, started_at)
         VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM attempts WHERE run_id = ?1), ?2, ?3, ?4)",
        params![id, run.attempt, worker, now],
    )
    .map_err(internal)?;
    storage::charge(tx, &run.tenant, Some(id), storage::COST.attempt() as i64)?;
    let steps = replay_steps(tx, id)?;
    Ok(Claimed {
        lease: Lease {
            tenant: run.tenant.clone(),
            run_id: id.to_owned(),
            token,
            expires_at,
        },
        run,
        steps,
    })
}

/// Throttle gates whose window opened: lets as many parked runs back into the lane as the
/// window has room for, best rank first. While runs stay parked the gate's timer is set
/// to when the window opens next (counting the let-through runs as started now).
fn open_throttles(tx: &Connection, now: i64) -> Result<(), StoreError> {
    let due: Vec<(String, String, u32, i64)> = {
        let mut stmt = tx
            .prepare_cached("SELECT tenant, gate, tlimit, tperiod FROM gate_timers WHERE at <= ?1")
            .map_err(internal)?;
        let rows = stmt
            .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (tenant, gate, limit, period) in due {
        let window: Vec<i64> = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at > ?3
                     ORDER BY at DESC LIMIT ?4",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![tenant, gate, now - period, limit], |r| r.get(0))
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)?
        };
        let room = (limit as usize).saturating_sub(window.len());
        if room > 0 {
            tx.execute(
                "UPDATE runs SET parked = NULL WHERE id IN (
                     SELECT id FROM runs WHERE tenant = ?1 AND parked = ?2
                     ORDER BY rank, id LIMIT ?3)",
                params![tenant, gate, room as i64],
            )
            .map_err(internal)?;
        }
        let still_parked: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = ?1 AND parked = ?2)",
                params![tenant, gate],
                |r| r.get(0),
            )
            .map_err(internal)?;
        if still_parked {
            let opens = window.last().copied().unwrap_or(now) + period;
            tx.execute(
                "UPDATE gate_timers SET at = ?3 WHERE tenant = ?1 AND gate = ?2",
                params![tenant, gate, opens.max(now + 1)],
            )
            .map_err(internal)?;
        } else {
            tx.execute(
                "DELETE FROM gate_timers WHERE tenant = ?1 AND gate = ?2",
                params![tenant, gate],
            )
            .map_err(internal)?;
        }
    }
    Ok(())
}

/// Appends log lines after the run's last one, as many as its log budget and its
/// tenant's storage quota take (then one marker line; the rest are dropped).
fn append_logs(
    tx: &Connection,
    tenant: &str,
    run_id: &str,
    lines: Vec<LogLine>,
) -> Result<(), StoreError> {
    let fitted = storage::fit_logs(tx, tenant, run_id, lines)?;
    let lines = fitted.lines;
    if lines.is_empty() {
        return Ok(());
    }
    storage::charge_logs(tx, tenant, run_id, fitted.bytes as i64)?;
    let first: i64 = tx
        .query_row(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM logs WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )
        .map_err(internal)?;
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO logs (run_id, seq, attempt, at, level, source, message)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(internal)?;
    for (seq, l) in (first..).zip(lines) {
        stmt.execute(params![
            run_id,
            seq,
            l.attempt,
            l.at,
            l.level.as_str(),
            l.source.as_str(),
            l.message
        ])
        .map_err(internal)?;
    }
    Ok(())
}

/// Stores a step output and charges it to the run and its tenant. First write wins: a
/// step's output never changes once stored (nor is it charged twice).
fn write_step(
    tx: &Connection,
    run: &Run,
    name: &str,
    occurrence: u32,
    output: &[u8],
    now: i64,
) -> Result<(), StoreError> {
    let stored = tx
        .execute(
            "INSERT INTO steps (run_id, name, occurrence, output, attempt, completed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            params![run.id, name, occurrence, output, run.attempt, now],
        )
        .map_err(internal)?;
    if stored > 0 {
        let cost = storage::COST.step(name.len(), output.len());
        storage::charge(tx, &run.tenant, Some(&run.id), cost as i64)?;
    }
    Ok(())
}

/// Ends a wait: the resolution becomes the waiting step's output, and the run is due now
/// as a resume of its current attempt (the replay reads the step and goes on).
fn resolve_wait(
    tx: &Connection,
    run: &Run,
    wait: &Wait,
    resolution: &Resolution,
    now: i64,
) -> Result<(), StoreError> {
    // Always stored, even past a quota: the waiting run must be able to go on and end.
    write_step(
        tx,
        run,
        &wait.step,
        wait.occurrence,
        &resolution.to_bytes(),
        now,
    )?;
    tx.execute(
        "UPDATE runs SET status = 'sleeping', due_at = ?2, updated_at = ?2,
             wait = NULL, wait_event = NULL, wait_run = NULL
         WHERE id = ?1",
        params![run.id, now],
    )
    .map_err(internal)?;
    Ok(())
}

fn waiting_runs(
    tx: &Connection,
    condition: &str,
    param: &dyn rusqlite::ToSql,
) -> Result<Vec<Run>, StoreError> {
    let mut stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'waiting' AND {condition}"
        ))
        .map_err(internal)?;
    let rows = stmt.query_map([param], run_from_row).map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Runs waiting for events named `name`, after rowid `after`, a batch at a time (in rowid
/// order, which the index keeps: no sort however many wait).
fn waiting_for_event(
    tx: &Connection,
    tenant: &str,
    name: &str,
    after: i64,
) -> Result<Vec<(i64, Run)>, StoreError> {
    const BATCH: i64 = 500;
    let rowids: Vec<i64> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT rowid FROM runs INDEXED BY runs_waiting_event
                 WHERE status = 'waiting' AND tenant = ?1 AND wait_event = ?2 AND rowid > ?3
                 ORDER BY rowid LIMIT ?4",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(params![tenant, name, after, BATCH], |r| r.get(0))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    let mut stmt = tx
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE rowid = ?1"))
        .map_err(internal)?;
    rowids
        .into_iter()
        .map(|rowid| {
            let run = stmt.query_row([rowid], run_from_row).map_err(internal)?;
            Ok((rowid, run))
        })
        .collect()
}

/// After run `id` ended: the runs waiting for it (`call`, `join`) resume with its
/// resolution.
fn resolve_waiters_of(
    tx: &Connection,
    id: &str,
    resolution: &Resolution,
    now: i64,
) -> Result<(), StoreError> {
    for waiter in waiting_runs(tx, "wait_run = ?1", &id)? {
        if let Some(wait) = &waiter.wait {
            resolve_wait(tx, &waiter, wait, resolution, now)?;
        }
    }
    Ok(())
}

/// Waits whose time is up resolve as timed out.
fn resolve_timeouts(tx: &Connection, now: i64) -> Result<(), StoreError> {
    for run in waiting_runs(tx, "due_at <= ?1", &now)? {
        if let Some(wait) = &run.wait {
            resolve_wait(tx, &run, wait, &Resolution::TimedOut, now)?;
        }
    }
    Ok(())
}
#[async_trait]
impl Store for SqliteStore {
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
            tx.execute(
                "INSERT INTO components (digest, bytes, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (digest) DO NOTHING",
                params![req.digest, req.component, now],
            )
            .map_err(internal)?;
            tx.execute(
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

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let digest = digest.to_owned();
        self.tx(move |tx, _| {
            tx.query_row(
                "SELECT bytes FROM components WHERE digest = ?1",
                [digest],
                |r| r.get(0),
            )
            .optional()
            .map_err(internal)
        })
        .await
    }

    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        let admission = if req.parent.is_some() {
            Admission::Child
        } else {
            Admission::Run
        };
        self.tx(move |tx, now| insert_run(tx, now, req, Some(admission)))
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
                tx.execute(
                    "UPDATE runs SET promoted = 1, rank = due_at + rank_offset
                     WHERE status IN ('queued', 'sleeping') AND promoted = 0 AND due_at <= ?1",
                    [now],
                )
                .map_err(internal)?;
                claim_round_robin(tx, now, &req, &after)
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
                    .execute(
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
                    .query_row(
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
        self.tx(move |tx, now| {
            let run = check_lease(tx, &lease)?.run;
            match record {
                Record::Step {
                    name,
                    occurrence,
                    output,
                    logs,
                } => {
                    let exists = step_output(tx, &run.id, &name, occurrence)?.is_some();
                    if !exists {
                        let cost = storage::COST.step(name.len(), output.len());
                        storage::check_run(tx, &run.tenant, &run.id, cost)?;
                    }
                    append_logs(tx, &run.tenant, &run.id, logs)?;
                    write_step(tx, &run, &name, occurrence, &output, now)?;
                }
                Record::Logs(lines) => append_logs(tx, &run.tenant, &run.id, lines)?,
                Record::Progress(p) => {
                    tx.execute(
                        "UPDATE runs SET progress = ?2, updated_at = ?3 WHERE id = ?1",
                        params![run.id, to_json(&p)?, now],
                    )
                    .map_err(internal)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError> {
        let lease = lease.clone();
        self.tx(move |tx, now| {
            let Leased {
                run,
                resumed,
                cancel_requested,
            } = check_lease(tx, &lease)?;
            let ending = lifecycle::Ending {
                id: &run.id,
                cancel_requested,
                resumed,
            };
            let t = lifecycle::finish(ending, &outcome, now);
            if let Some(output) = &t.output {
                // Refused over a quota (nothing changes); the worker then fails the run.
                storage::check_run(tx, &run.tenant, &run.id, output.len() as u64)?;
                storage::charge(tx, &run.tenant, Some(&run.id), output.len() as i64)?;
            }
            apply(tx, &run, &t, now)?;
            // A wait on a run that already ended (or does not exist) resolves at once.
            if let Some(
                wait @ Wait {
                    on: WaitOn::Run { id: target },
                    ..
                },
            ) = &t.wait
            {
                let resolution = match load_run(tx, target)?.filter(|t| t.tenant == run.tenant) {
                    Some(t) => lifecycle::resolution(&t),
                    None => Some(lifecycle::missing_run_resolution(target)),
                };
                if let Some(resolution) = resolution {
                    resolve_wait(tx, &run, wait, &resolution, now)?;
                }
            }
            load_run(tx, &run.id)?
                .ok_or_else(|| StoreError::Internal("finished run vanished".into()))
        })
        .await
    }

    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError> {
        self.tx(move |tx, now| {
            let id = &req.id;
            let run = tenant_run(tx, &req.tenant, id)?;
            match lifecycle::cancel(id, run.status, req.cancel_error(), now)? {
                Some(t) => apply(tx, &run, &t, now)?,
                // Running: marked, it ends cancelled when its attempt ends.
                None => {
                    tx.execute(
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
            tx.execute(
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

    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        self.tx(move |tx, now| {
            let id = req.id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
            let seen: Option<i64> = tx
                .query_row("SELECT created_at FROM events WHERE tenant = ?1 AND id = ?2", params![req.tenant, id], |r| r.get(0))
                .optional()
                .map_err(internal)?;
            if seen.is_some_and(|t| t > now - IDEMPOTENCY_WINDOW_MS) {
                return Ok(EventSent { id, accepted: false, ..EventSent::default() });
            }
            let data = req.data.to_string();
            let cost = storage::COST.event(id.len(), req.name.len(), data.len());
            storage::check_tenant(tx, &req.tenant, cost)?;
            if seen.is_some() {
                // Past its window the id is free again: the old record is replaced.
                storage::forget_event(tx, &req.tenant, &id)?;
            }
            tx.execute(
                "INSERT INTO events (tenant, id, name, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![req.tenant, id, req.name, data, now],
            )
            .map_err(internal)?;
            storage::charge(tx, &req.tenant, None, cost as i64)?;
            let mut sent = EventSent { id: id.clone(), accepted: true, ..EventSent::default() };
            let subscribers: Vec<String> = {
                let mut stmt = tx
                    .prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE tenant = ?1 ORDER BY name"))
                    .map_err(internal)?;
                let rows = stmt.query_map([&req.tenant], function_from_row).map_err(internal)?;
                let functions: Vec<Function> = rows.collect::<Result<_, _>>().map_err(internal)?;
                functions.into_iter().filter(|f| f.events.contains(&req.name)).map(|f| f.name).collect()
            };
            check_queue_quota(tx, &req.tenant, Admission::Event, subscribers.len() as u64)?;
            for function in subscribers {
                let started = insert_run(
                    tx,
                    now,
                    EnqueueRequest {
                        tenant: req.tenant.clone(),
                        function,
                        input: data.clone().into_bytes(),
                        trigger: format!("event:{}", req.name),
                        due_at: None,
                        // One run per function per event, however often it is delivered.
                        idempotency_key: Some(format!("event:{id}")),
                        retry: None,
                        parent: None,
                        priority: None,
                    },
                    None,
                )?;
                sent.started.push(started.run.id);
            }
            // Only the runs waiting for this name (an index seek), a batch at a time, so
            // a tenant with many waiters on other names costs nothing here, and many on
            // this name never sit in memory at once.
            let mut after = 0;
            loop {
                let batch = waiting_for_event(tx, &req.tenant, &req.name, after)?;
                let Some((last, _)) = batch.last() else { break };
                after = *last;
                for (_, waiter) in &batch {
                let Some(wait) = &waiter.wait else { continue };
                let WaitOn::Event { name, filter } = &wait.on else { continue };
                if *name == req.name && event_matches(filter.as_deref(), &req.data) {
                    resolve_wait(tx, waiter, wait, &Resolution::Event { data: req.data.clone() }, now)?;
                    sent.resumed.push(waiter.id.clone());
                }
                }
            }
            Ok(sent)
        })
        .await
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.tx(move |tx, _| {
            let Some(run) = load_run(tx, &id)?.filter(|r| r.tenant == tenant) else {
                return Ok(None);
            };
            let count = |table: &str| -> Result<u64, StoreError> {
                tx.query_row(
                    &format!("SELECT COUNT(*) FROM {table} WHERE run_id = ?1"),
                    [&id],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n.max(0) as u64)
                .map_err(internal)
            };
            let attempts_total = count("attempts")?;
            let mut attempts: Vec<Attempt> = {
                // The latest executions, oldest first.
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT number, worker, started_at, finished_at, error, fuel_used, suspended_until
                         FROM attempts WHERE run_id = ?1 ORDER BY seq DESC LIMIT ?2",
                    )
                    .map_err(internal)?;
                let rows = stmt
                    .query_map(params![id, storage_limits::DETAIL_ATTEMPTS as i64], |r| {
                        Ok(Attempt {
                            number: r.get(0)?,
                            worker: r.get(1)?,
                            started_at: r.get(2)?,
                            finished_at: r.get(3)?,
                            error: opt_json(r.get(4)?)?,
                            fuel_used: r.get(5)?,
                            suspended_until: r.get(6)?,
                        })
                    })
                    .map_err(internal)?;
                rows.collect::<Result<_, _>>().map_err(internal)?
            };
            attempts.reverse();
            let steps = step_infos(tx, &id, 0, storage_limits::DETAIL_STEPS)?;
            Ok(Some(RunDetail {
                run,
                attempts,
                attempts_total,
                steps,
                steps_total: count("steps")?,
            }))
        })
        .await
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
            tx.query_row(
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
                .prepare_cached(&format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE tenant = ?1 AND (?2 IS NULL OR function = ?2) AND (?3 IS NULL OR status = ?3)
                         AND (?5 IS NULL OR parent = ?5)
                     ORDER BY created_at DESC, id DESC LIMIT ?4"
                ))
                .map_err(internal)?;
            let rows = stmt
                .query_map(
                    params![q.tenant, q.function, q.status.map(|s| s.as_str()), q.limit as i64, q.parent],
                    run_from_row,
                )
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        self.tx(move |tx, now| {
            let ids: Vec<String> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT id FROM runs
                         WHERE (status IN ('succeeded', 'skipped') AND finished_at < ?1)
                            OR (status IN ('failed', 'cancelled') AND finished_at < ?2)
                         LIMIT ?3",
                    )
                    .map_err(internal)?;
                let rows = stmt
                    .query_map(
                        params![req.succeeded_before, req.failed_before, req.limit as i64],
                        |r| r.get(0),
                    )
                    .map_err(internal)?;
                rows.collect::<Result<_, _>>().map_err(internal)?
            };
            for id in &ids {
                let (tenant, bytes): (String, i64) = tx
                    .query_row(
                        "SELECT tenant, stored_bytes + log_bytes FROM runs WHERE id = ?1",
                        [id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .map_err(internal)?;
                for table in ["steps", "logs", "attempts"] {
                    tx.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), [id])
                        .map_err(internal)?;
                }
                tx.execute("DELETE FROM runs WHERE id = ?1", [id])
                    .map_err(internal)?;
                storage::charge(tx, &tenant, None, -bytes)?;
            }
            // Event ids are only remembered for their dedup window, and components only
            // while a function or a run refers to them.
            let events = storage::forget_old_events(tx, now - IDEMPOTENCY_WINDOW_MS, req.limit)?;
            if !ids.is_empty() || events > 0 {
                storage::collect_components(tx)?;
            }
            Ok(ids.len())
        })
        .await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let n = stmt.parameter_count();
        let params: Vec<rusqlite::types::Value> =
            (0..n).map(|_| rusqlite::types::Value::Integer(0)).collect();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |r| {
                r.get::<_, String>(3)
            })
            .unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap().join("; ")
    }

    /// Claims stay cheap with a large backlog: every query of the claim path seeks an
    /// index instead of scanning the runs.
    #[test]
    fn claim_queries_use_indexes() {
        let store = SqliteStore::open_in_memory(Arc::new(SystemClock)).unwrap();
        let conn = store.conn.lock().unwrap();
        for (sql, index) in [
            (
                "UPDATE runs SET promoted = 1, rank = due_at + rank_offset
                 WHERE status IN ('queued', 'sleeping') AND promoted = 0 AND due_at <= ?1",
                "runs_due",
            ),
            (
                "SELECT tenant FROM runs
                 WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL
                     AND tenant > ?1
                 ORDER BY tenant LIMIT 1",
                "runs_lane",
            ),
            (
                "SELECT id, status, attempt, cgate, climit, tgate, tlimit, tperiod FROM runs
                 WHERE tenant = ?1 AND status IN ('queued', 'sleeping') AND promoted = 1
                     AND parked IS NULL
                 ORDER BY rank, id LIMIT 1",
                "runs_lane",
            ),
            (
                "SELECT COUNT(*) FROM runs WHERE tenant = ?1 AND cgate = ?2 AND status = 'running'",
                "runs_gate_running",
            ),
            (
                "SELECT id FROM runs WHERE tenant = ?1 AND parked = ?2 ORDER BY rank, id LIMIT 1",
                "runs_parked",
            ),
            (
                "SELECT at FROM flow_log WHERE tenant = ?1 AND gate = ?2 AND at > ?3
                 ORDER BY at DESC LIMIT 1 OFFSET ?4",
                "flow_log_by_gate",
            ),
            // An event reads only the runs waiting for its name, in index order.
            (
                "SELECT rowid FROM runs INDEXED BY runs_waiting_event
                 WHERE status = 'waiting' AND tenant = ?1 AND wait_event = ?2 AND rowid > ?3
                 ORDER BY rowid LIMIT ?4",
                "runs_waiting_event",
            ),
            // Paged log reads seek the run's lines.
            (
                "SELECT l.attempt, l.at, l.level, l.source, l.message FROM logs l
                 JOIN runs r ON r.id = l.run_id
                 WHERE l.run_id = ?1 AND r.tenant = ?2 AND l.seq >= ?3
                 ORDER BY l.seq LIMIT ?4",
                "sqlite_autoindex_logs_1 (run_id=? AND seq>?)",
            ),
        ] {
            let p = plan(&conn, sql);
            assert!(p.contains(index), "{sql}\n=> {p}");
            assert!(!p.contains("TEMP B-TREE"), "no sort: {sql}\n=> {p}");
        }
    }
}

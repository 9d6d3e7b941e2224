//! The database's tables, indexes and triggers, and the migration of files an older
//! version created. Triggers keep the bookkeeping (per-tenant counts, lanes, parked runs,
//! storage charges) exact whatever statement changes a run.

use super::*;

pub(crate) const SCHEMA: &str = r#"
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
-- The cron scheduler reads a tenant's scheduled functions every second: through this
-- index, however many functions without a schedule the tenant has.
CREATE INDEX IF NOT EXISTS functions_scheduled ON functions (tenant, name) WHERE schedule IS NOT NULL;
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
-- Listing by status (`rows::list_runs`): a page of failed runs without walking the others.
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (tenant, status, created_at DESC, id DESC);
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
-- Webhook deliveries (wasq_core::notify): id is the webhook-id (it names its run).
CREATE TABLE IF NOT EXISTS deliveries (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    url        TEXT NOT NULL,
    event      TEXT NOT NULL,
    payload    BLOB NOT NULL,
    status     TEXT NOT NULL,
    tries      INTEGER NOT NULL DEFAULT 0,
    next_at    INTEGER NOT NULL,
    token      INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (next_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_by_run ON deliveries (run_id);
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
pub(crate) const FLOW_COLUMNS: &[(&str, &str)] = &[
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
    // the run's queue (its pinned settings' `queue`), for claims that name queues
    ("queue", "TEXT NOT NULL DEFAULT 'default'"),
];

/// Storage accounting (see `storage.rs`), added to `runs` on old files too; a file that
/// lacked them is recounted once.
pub(crate) const STORAGE_COLUMNS: &[(&str, &str)] = &[
    ("stored_bytes", "INTEGER NOT NULL DEFAULT 0"),
    ("log_bytes", "INTEGER NOT NULL DEFAULT 0"),
    // 1 once log lines were dropped for the run's log budget (the marker line is stored)
    ("logs_cut", "INTEGER NOT NULL DEFAULT 0"),
];

/// Trace context (`wasq_core::trace`), added to `runs` on old files too: the `traceparent`
/// of what created the run, charged with the run like its trigger.
pub(crate) const TRACE_COLUMNS: &[(&str, &str)] = &[("trace", "TEXT")];

/// The run's columns that change after it was created (its latest error, its pinned
/// settings on a manual retry, its progress and wait) are charged by a trigger, whatever
/// statement changes them: the difference in bytes goes to the run and its tenant (see
/// `storage.rs`), never refused (each is bounded where it is made).
pub(crate) fn storage_schema() -> String {
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

pub(crate) const FLOW_SCHEMA: &str = r#"
DROP INDEX IF EXISTS runs_ready;
CREATE INDEX IF NOT EXISTS runs_due ON runs (due_at)
    WHERE status IN ('queued', 'sleeping') AND promoted = 0;
CREATE INDEX IF NOT EXISTS runs_lane ON runs (tenant, rank, id)
    WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL;
-- The lanes of claims that name queues; the unended runs, for `queue_depths` and `load`.
CREATE INDEX IF NOT EXISTS runs_queue_lane ON runs (queue, tenant, rank, id)
    WHERE status IN ('queued', 'sleeping') AND promoted = 1 AND parked IS NULL;
DROP INDEX IF EXISTS runs_queue_load;
CREATE INDEX IF NOT EXISTS runs_active ON runs (tenant, status, created_at, function, queue)
    WHERE status IN ('queued', 'running', 'sleeping', 'waiting');
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

/// Brings a file created by an older version up to date: adds the flow-control columns,
/// and fills `tenant_load` once, when its triggers are first created.
pub(crate) fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let have: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info('runs')")
            .map_err(internal)?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (name, decl) in FLOW_COLUMNS
        .iter()
        .chain(STORAGE_COLUMNS)
        .chain(TRACE_COLUMNS)
    {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE runs ADD COLUMN {name} {decl}"))
                .map_err(internal)?;
        }
    }
    let usage_counted: bool = conn
        .row(
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
        .row(
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
        .row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'runs_load_insert')",
            [],
            |r| r.get(0),
        )
        .map_err(internal)?;
    conn.execute_batch(FLOW_SCHEMA).map_err(internal)?;
    conn.execute_batch(crate::feed::SCHEMA).map_err(internal)?;
    if !counted {
        conn.execute_batch(
            "INSERT OR REPLACE INTO tenant_load (tenant, queued, running)
             SELECT tenant, SUM(status = 'queued'), SUM(status = 'running') FROM runs GROUP BY tenant",
        )
        .map_err(internal)?;
    }
    Ok(())
}

//! How the store's one connection is set up: durability, and what keeps its statements
//! and pages from being made again on every call.

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use wasq_core::StoreError;

use crate::cached::STATEMENT_CACHE;
use crate::internal;

/// The connection's page cache, in KiB (SQLite's default is 2 MiB). A drain touches the
/// runs table and half a dozen of its indexes per transition; with 2 MiB their pages fell
/// out of the cache and were read again from the file (`pread`: 15% of the writer
/// thread's CPU in `cargo bench -p wasq-bench --bench embedded`). Memory is taken only as
/// pages are read, up to this bound.
pub(crate) const PAGE_CACHE_KIB: i64 = 64 * 1024;

/// Sets up a connection the store opened, before its schema is created or read.
pub(crate) fn configure(conn: &Connection) -> Result<(), StoreError> {
    // WAL + synchronous=NORMAL: a committed transaction survives the process dying
    // (kill -9); only an OS crash or power loss can drop the last few commits.
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(internal)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(internal)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(internal)?;
    conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)
        .map_err(internal)?;
    // Savepoints' journals (each call of a group commit runs in a savepoint) and temporary
    // b-trees in memory: by default the savepoint journal of a batch spilled to a temporary
    // file past 64 KiB, and every page a call changed after that was written to it
    // (`pwrite`: a third of a claim's CPU in a drain). A batch holds at most 64 calls, so
    // the journal stays small.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(internal)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(internal)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // The query planner stability guarantee: a plan never depends on a bound value. Without
    // it SQLite (3.54) marks a statement to be prepared again whenever a new value is bound
    // to its `LIMIT ?` or to a term it compared with a partial index's WHERE (and a few
    // rarer cases) — so the cached statements of a claim, a step and a finish were parsed
    // and planned again on most calls (13% of the writer thread's CPU in a drain). No
    // query here relies on a bound value for its plan: the partial indexes' conditions
    // are written as literals in the queries that use them (`claim::tests` checks the
    // plans of the claim path and of listings).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(internal)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// A cached statement is prepared once, whatever values are bound to it later.
    #[test]
    fn statements_are_not_prepared_again_when_their_values_change() {
        let conn = Connection::open_in_memory().unwrap();
        configure(&conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, s TEXT NOT NULL);
             CREATE INDEX t_n ON t (n);
             CREATE INDEX t_busy ON t (n) WHERE s = 'busy';
             INSERT INTO t (n, s) VALUES (0, 'busy'), (1, 'idle'), (2, 'busy'), (3, 'idle');",
        )
        .unwrap();
        // Both kinds of statement SQLite would otherwise prepare again on a new binding.
        use rusqlite::types::Value::{Integer, Text};
        for (sql, values) in [
            (
                "SELECT id FROM t ORDER BY id LIMIT ?1",
                vec![Integer(1), Integer(3), Integer(2)],
            ),
            (
                "SELECT id FROM t WHERE s = ?1 AND n >= 0",
                vec![
                    Text("busy".into()),
                    Text("idle".into()),
                    Text("busy".into()),
                ],
            ),
        ] {
            for v in values {
                let mut stmt = conn.prepare_cached(sql).unwrap();
                let rows = stmt.query_map([v], |r| r.get::<_, i64>(0)).unwrap();
                rows.collect::<Result<Vec<_>, _>>().unwrap();
            }
            let stmt = conn.prepare_cached(sql).unwrap();
            assert_eq!(
                stmt.get_status(StatementStatus::RePrepare),
                0,
                "prepared again: {sql}"
            );
        }
    }
}

//! `execute` and `query_row` through the connection's statement cache.
//!
//! rusqlite's `Connection::execute` and `query_row` parse and plan their SQL on every
//! call. A run's claim, step and finish run a few dozen statements, and preparing them
//! was about a third of the embedded store's CPU per run (perf, `cargo bench -p
//! wasq-bench --bench embedded`). Every statement here is a constant or one of a few
//! fixed variants, so the cache (`STATEMENT_CACHE`) holds them all.

use rusqlite::{Connection, Params, Row};

/// Statements the connection keeps prepared: more than the store has.
pub(crate) const STATEMENT_CACHE: usize = 256;

pub(crate) trait Cached {
    /// [`Connection::execute`], with the statement prepared once per connection.
    fn exec<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// [`Connection::query_row`], with the statement prepared once per connection.
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn exec<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

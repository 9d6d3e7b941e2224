//! The shared Store conformance suite against the SQLite store (file-backed, as in
//! `wasq dev`): one test per scenario, each on its own database file.

use std::sync::Arc;

use wasq_core::ManualClock;
use wasq_store_sqlite::SqliteStore;

async fn fresh(clock: ManualClock) -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("wasq.db"), Arc::new(clock)).unwrap();
    (store, dir)
}

wasq_core::conformance_tests!(fresh);

//! The shared Store conformance suite, against the SQLite store (file-backed, as in `wasq dev`).

use std::sync::Arc;

use wasq_store_sqlite::SqliteStore;

#[tokio::test]
async fn sqlite_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    wasq_core::conformance::run_all(|clock| {
        let path = dir.path().join(format!(
            "{}.db",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        async move { SqliteStore::open(&path, Arc::new(clock)).unwrap() }
    })
    .await;
}

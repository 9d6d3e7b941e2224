//! The shared Store conformance suite against the in-memory store: one test per scenario,
//! each on a fresh store.

use std::sync::Arc;

use wasq_core::ManualClock;
use wasq_store_memory::MemoryStore;

async fn fresh(clock: ManualClock) -> (MemoryStore, ()) {
    (MemoryStore::new(Arc::new(clock)), ())
}

wasq_core::conformance_tests!(fresh);

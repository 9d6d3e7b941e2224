//! Scenarios of the worker registry.

use super::*;
use crate::clock::Clock;
use crate::workers::{MAX_WORKERS_LISTED, WORKER_GONE_MS, WorkerBeat, Workers};

pub(super) async fn workers(store: impl Store + Directory + Workers, clock: ManualClock) {
    let beat = |id: &str, busy: u32, at: Millis| WorkerBeat {
        id: id.into(),
        queues: vec!["critical".into(), "default".into()],
        slots: 8,
        busy,
        started_at: T0,
        seen_at: at,
    };
    assert!(store.workers(0).await.unwrap().is_empty(), "none yet");
    store.beat(beat("b-2", 1, clock.now_ms())).await.unwrap();
    store.beat(beat("a-1", 0, clock.now_ms())).await.unwrap();
    let listed = store
        .workers(clock.now_ms() - WORKER_GONE_MS)
        .await
        .unwrap();
    assert_eq!(
        listed,
        [beat("a-1", 0, T0), beat("b-2", 1, T0)],
        "by id, as beaten"
    );

    // A later beat replaces the earlier one; a worker not heard from is not listed.
    clock.advance(WORKER_GONE_MS);
    store.beat(beat("a-1", 5, clock.now_ms())).await.unwrap();
    let listed = store
        .workers(clock.now_ms() - WORKER_GONE_MS + 1)
        .await
        .unwrap();
    assert_eq!(listed, [beat("a-1", 5, clock.now_ms())], "b-2 is gone");

    // A worker that stops leaves at once; leaving twice changes nothing.
    store.leave("a-1").await.unwrap();
    store.leave("a-1").await.unwrap();
    assert!(
        store
            .workers(0)
            .await
            .unwrap()
            .iter()
            .all(|w| w.id != "a-1")
    );

    // A listing answers at most MAX_WORKERS_LISTED, the first by id.
    for i in 0..=MAX_WORKERS_LISTED {
        store
            .beat(beat(&format!("w-{i:04}"), 0, clock.now_ms()))
            .await
            .unwrap();
    }
    let listed = store.workers(clock.now_ms()).await.unwrap();
    assert_eq!(listed.len(), MAX_WORKERS_LISTED);
    assert_eq!(listed[0].id, "w-0000");
    assert_eq!(listed[MAX_WORKERS_LISTED - 1].id, "w-0999");
}

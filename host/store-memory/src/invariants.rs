//! What the conformance suite cannot see from outside: after every scenario, each index
//! equals one rebuilt from the runs themselves, and each run's and tenant's byte counters
//! equal a recount of what is kept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use wasq_core::*;

use crate::state::{Space, State, attempt_cost};
use crate::{COST, MemoryStore};

/// Rebuilds the indexes and counters of `st` from its records and compares.
fn check(st: &State) {
    let mut timeline = crate::state::Timeline::default();
    let mut lanes = BTreeSet::new();
    let mut refs: HashMap<String, usize> = HashMap::new();
    for (tenant, space) in &st.spaces {
        let mut fresh = Space::default();
        for (id, e) in &space.runs {
            // The counters against a recount of the history and the log.
            let history: u64 = e.attempts.iter().map(attempt_cost).sum::<u64>()
                + e.steps
                    .iter()
                    .map(|s| COST.step(s.name.len(), s.output.len()))
                    .sum::<u64>();
            assert_eq!(e.history_bytes, history, "history bytes of {id}");
            let mut recounted = crate::state::RunEntry::new(e.run.clone(), &Default::default());
            recounted.history_bytes = history;
            recounted.recount();
            assert_eq!(e.run.stored_bytes, recounted.run.stored_bytes, "{id}");
            let logs: u64 = e.logs.iter().map(|l| COST.log_line(l)).sum();
            assert_eq!(e.run.log_bytes, logs, "log bytes of {id}");
            assert_eq!(e.steps.len(), e.step_index.len(), "steps of {id}");
            for (i, s) in e.steps.iter().enumerate() {
                assert_eq!(e.step_index[&(s.name.clone(), s.occurrence)], i);
            }
            fresh.usage.stored_bytes += e.bytes();
            let r = &e.run;
            *refs.entry(r.digest.clone()).or_default() += 1;
            fresh
                .by_function
                .entry(r.function.clone())
                .or_default()
                .insert(id.clone());
            if let Some(parent) = &r.parent {
                fresh
                    .kids
                    .entry(parent.clone())
                    .or_default()
                    .insert(id.clone());
            }
            fresh.place(&mut timeline, tenant, id, &e.keys(), true);
        }
        for (id, event) in &space.events {
            fresh.usage.stored_bytes += event.cost(id);
            assert!(
                space
                    .events_by_time
                    .contains(&(event.created_at, id.clone()))
            );
        }
        assert_eq!(space.events.len(), space.events_by_time.len());
        for f in space.functions.values() {
            fresh.usage.stored_bytes += COST.function(f.size_bytes);
            *refs.entry(f.digest.clone()).or_default() += 1;
        }
        for (gate, timer) in &space.gate_timers {
            timeline
                .gate_timers
                .insert((timer.at, tenant.clone(), gate.clone()));
        }
        if !fresh.lane.is_empty() {
            lanes.insert(tenant.clone());
        }
        assert_eq!(
            space.usage.stored_bytes, fresh.usage.stored_bytes,
            "{tenant}"
        );
        assert_eq!(space.by_status, fresh.by_status, "{tenant}: by status");
        assert_eq!(
            space.by_function, fresh.by_function,
            "{tenant}: by function"
        );
        assert_eq!(space.kids, fresh.kids, "{tenant}: children");
        assert_eq!(space.lane, fresh.lane, "{tenant}: lane");
        assert_eq!(space.parked, fresh.parked, "{tenant}: parked");
        assert_eq!(space.gate_running, fresh.gate_running, "{tenant}: running");
        assert_eq!(space.debounce, fresh.debounce, "{tenant}: debounce");
        assert_eq!(space.waiting_event, fresh.waiting_event, "{tenant}");
        assert_eq!(space.waiting_run, fresh.waiting_run, "{tenant}");
        assert_eq!(space.ended_ok, fresh.ended_ok, "{tenant}: ended ok");
        assert_eq!(space.ended_bad, fresh.ended_bad, "{tenant}: ended bad");
        // Each key leads to the newest run created with it.
        let mut idem: HashMap<String, HashMap<String, RunId>> = HashMap::new();
        for (id, e) in &space.runs {
            if let Some(key) = &e.run.idempotency_key {
                let keys = idem.entry(e.run.function.clone()).or_default();
                keys.insert(key.clone(), id.clone());
            }
        }
        assert_eq!(space.idem, idem, "{tenant}: idempotency keys");
    }
    assert_eq!(st.timeline.pending, timeline.pending, "pending");
    assert_eq!(st.timeline.leases, timeline.leases, "leases");
    assert_eq!(st.timeline.timeouts, timeline.timeouts, "timeouts");
    assert_eq!(st.timeline.gate_timers, timeline.gate_timers, "gate timers");
    assert_eq!(st.lanes, lanes, "tenants with a lane");
    assert_eq!(st.digest_refs, refs, "digest references");
    let digests: BTreeMap<_, _> = st.components.keys().map(|d| (d, ())).collect();
    for d in refs.keys() {
        assert!(
            digests.contains_key(d),
            "component {d} of a function or run"
        );
    }
}

/// Checks the store it holds when the scenario is over.
struct Checked(MemoryStore);

impl Drop for Checked {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.0.with(|st, _| check(st));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_leaves_exact_indexes_and_counters() {
    for name in wasq_core::conformance_tests!(@names) {
        wasq_core::conformance::run_one(name, |clock: ManualClock| async move {
            let store = MemoryStore::new(Arc::new(clock));
            (store.clone(), Checked(store))
        })
        .await;
    }
}

//! Reading: runs with their bounded history, listings, id prefixes, steps and logs.
//! Another tenant's runs do not exist for the caller.

use std::ops::Bound;

use wasq_core::storage::{DETAIL_ATTEMPTS, DETAIL_STEPS};
use wasq_core::*;

use crate::state::{RunEntry, State};

fn info(s: &StepRecord) -> StepInfo {
    StepInfo {
        name: s.name.clone(),
        occurrence: s.occurrence,
        attempt: s.attempt,
        completed_at: s.completed_at,
        output_bytes: s.output.len() as u64,
    }
}

fn step_infos(e: &RunEntry, skip: usize, limit: usize) -> Vec<StepInfo> {
    e.steps.iter().skip(skip).take(limit).map(info).collect()
}

/// A run of `tenant` with its bounded history ([`Store::run`]).
pub(crate) fn run_detail(st: &State, tenant: &str, id: &str) -> Option<RunDetail> {
    let e = st.entry(tenant, id)?;
    // The latest executions, oldest first.
    let from = e.attempts.len().saturating_sub(DETAIL_ATTEMPTS);
    Some(RunDetail {
        run: e.run.clone(),
        attempts: e.attempts[from..].to_vec(),
        attempts_total: e.attempts.len() as u64,
        steps: step_infos(e, 0, DETAIL_STEPS),
        steps_total: e.steps.len() as u64,
    })
}

/// [`Store::steps`]: NotFound for a run the tenant does not have.
pub(crate) fn steps(
    st: &State,
    tenant: &str,
    id: &str,
    skip: usize,
    limit: usize,
) -> Result<Vec<StepInfo>, StoreError> {
    Ok(step_infos(st.tenant_run(tenant, id)?, skip, limit))
}

pub(crate) fn step(
    st: &State,
    tenant: &str,
    id: &str,
    name: &str,
    occurrence: u32,
) -> Option<StepRecord> {
    let e = st.entry(tenant, id)?;
    let at = *e.step_index.get(&(name.to_owned(), occurrence))?;
    e.steps.get(at).cloned()
}

pub(crate) fn logs(st: &State, tenant: &str, id: &str, skip: usize, limit: usize) -> Vec<LogLine> {
    st.entry(tenant, id).map_or_else(Vec::new, |e| {
        e.logs.iter().skip(skip).take(limit).cloned().collect()
    })
}

/// [`Store::runs`]: newest first. An id starts with its creation time, so id order is
/// (creation time, id) order; the most selective index given is walked backwards.
pub(crate) fn runs(st: &State, q: &RunQuery) -> Vec<Run> {
    let Some(space) = st.spaces.get(&q.tenant) else {
        return Vec::new();
    };
    let ids: Box<dyn Iterator<Item = &RunId>> = if let Some(parent) = &q.parent {
        Box::new(
            space
                .kids
                .get(parent)
                .into_iter()
                .flat_map(|s| s.iter().rev()),
        )
    } else if let Some(status) = q.status {
        Box::new(
            space
                .by_status
                .get(&status)
                .into_iter()
                .flat_map(|s| s.iter().rev()),
        )
    } else if let Some(function) = &q.function {
        Box::new(
            space
                .by_function
                .get(function)
                .into_iter()
                .flat_map(|s| s.iter().rev()),
        )
    } else {
        Box::new(space.runs.keys().rev())
    };
    ids.filter(|id| q.before.as_ref().is_none_or(|b| *id < b))
        .filter_map(|id| space.runs.get(id))
        .map(|e| &e.run)
        .take_while(|r| q.since.is_none_or(|t| r.created_at >= t))
        .filter(|r| q.function.as_ref().is_none_or(|f| *f == r.function))
        .filter(|r| q.status.is_none_or(|s| s == r.status))
        .filter(|r| {
            q.parent
                .as_ref()
                .is_none_or(|p| r.parent.as_ref() == Some(p))
        })
        .take(q.limit)
        .cloned()
        .collect()
}

/// [`Store::run_ids`]: the tenant's ids starting with `prefix`, in id order.
pub(crate) fn run_ids(st: &State, tenant: &str, prefix: &str, limit: usize) -> Vec<RunId> {
    let Some(space) = st.spaces.get(tenant) else {
        return Vec::new();
    };
    space
        .runs
        .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
        .map(|(id, _)| id)
        .take_while(|id| id.starts_with(prefix))
        .take(limit.min(1000))
        .cloned()
        .collect()
}

/// [`Runs::queue_depths`]: the tenant's queued and running runs, counted per queue.
pub(crate) fn queue_depths(st: &State, tenant: &str) -> Vec<QueueDepth> {
    let mut by_queue: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    let Some(space) = st.spaces.get(tenant) else {
        return Vec::new();
    };
    for (status, slot) in [(RunStatus::Queued, 0), (RunStatus::Running, 1)] {
        for id in space.by_status.get(&status).into_iter().flatten() {
            if let Some(e) = space.runs.get(id) {
                let n = by_queue.entry(e.run.settings.queue.as_str()).or_default();
                if slot == 0 { n.0 += 1 } else { n.1 += 1 }
            }
        }
    }
    by_queue
        .into_iter()
        .map(|(queue, (queued, running))| QueueDepth {
            queue: queue.to_owned(),
            queued,
            running,
        })
        .collect()
}

/// [`Runs::load`]: the tenant's unended runs per function and status, and the oldest
/// queued one.
pub(crate) fn load(st: &State, tenant: &str) -> RunLoad {
    let Some(space) = st.spaces.get(tenant) else {
        return RunLoad::default();
    };
    let mut counts: std::collections::BTreeMap<(&str, usize), u64> = Default::default();
    let mut oldest: Option<i64> = None;
    for (i, status) in ACTIVE_STATUSES.iter().enumerate() {
        for id in space.by_status.get(status).into_iter().flatten() {
            if let Some(e) = space.runs.get(id) {
                *counts.entry((e.run.function.as_str(), i)).or_default() += 1;
                if *status == RunStatus::Queued {
                    oldest = Some(oldest.map_or(e.run.created_at, |o| o.min(e.run.created_at)));
                }
            }
        }
    }
    RunLoad {
        counts: counts
            .into_iter()
            .map(|((f, i), n)| (f.to_owned(), ACTIVE_STATUSES[i], n))
            .collect(),
        oldest_queued_at: oldest,
    }
}

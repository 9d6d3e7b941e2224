//! Admission of new runs: idempotency keys, the function's rate limit and debounce
//! (`wasq_core::flow`), the tenant's `max_queued` (`wasq_core::lifecycle::admit`) and
//! storage quota, then the insert.
//!
//! A run is first *prepared* (everything read, every decision taken, nothing changed) and
//! then *committed*, so a refusal leaves the state as it was: an event's subscribers are
//! all prepared and checked before any of them is committed.

use wasq_core::clock::Millis;
use wasq_core::flow::Gate;
use wasq_core::lifecycle::{self, Admission};
use wasq_core::storage;
use wasq_core::*;

use crate::state::{RunEntry, Space, State};
use crate::transition::{apply, write};

/// What an enqueue will do.
pub(crate) enum Prepared {
    /// The run created earlier with the same idempotency key.
    Existing(Box<Run>),
    New(Box<NewRun>),
}

/// A run about to be created.
pub(crate) struct NewRun {
    entry: RunEntry,
    /// The pending run of its debounce key, which it replaces.
    replaces: Option<RunId>,
    /// The rate limit whose window it enters.
    rate_gate: Option<Gate>,
    /// Queued (not skipped by its rate limit): it counts against `max_queued`.
    queued: bool,
}

impl NewRun {
    pub(crate) fn cost(&self) -> u64 {
        self.entry.bytes()
    }

    /// Refuses it over its tenant's `max_run_bytes` or over `max_stored_bytes` with
    /// `used` bytes stored.
    pub(crate) fn check_storage(
        &self,
        quotas: Option<&Quotas>,
        used: u64,
    ) -> Result<(), StoreError> {
        let r = &self.entry.run;
        storage::check_run_bytes(&r.id, quotas, 0, self.cost())?;
        storage::check_tenant_bytes(&r.tenant, quotas, used, self.cost())
    }
}

/// [`Store::enqueue`]: `Admission::Child` for a child run.
pub(crate) fn enqueue(
    st: &mut State,
    now: Millis,
    req: EnqueueRequest,
) -> Result<Enqueued, StoreError> {
    let admission = if req.parent.is_some() {
        Admission::Child
    } else {
        Admission::Run
    };
    let tenant = req.tenant.clone();
    let new = match prepare(st, now, req)? {
        Prepared::Existing(run) => {
            return Ok(Enqueued {
                run: *run,
                created: false,
            });
        }
        Prepared::New(new) => new,
    };
    if new.queued {
        let adding = u64::from(new.replaces.is_none());
        check_queue_quota(st, &tenant, admission, adding)?;
    }
    new.check_storage(st.quotas(&tenant).as_ref(), st.stored(&tenant))?;
    let run = commit(st, now, Prepared::New(new))?;
    Ok(Enqueued { run, created: true })
}

/// [`Store::enqueue_batch`]: the whole batch is checked first — its function, `max_queued`
/// (every run counts: `lifecycle::admit_batch`), the storage quotas against what its new
/// runs cost together — and then each run is prepared and committed in turn, which can no
/// longer be refused: all or nothing.
pub(crate) fn enqueue_batch(
    st: &mut State,
    now: Millis,
    reqs: Vec<EnqueueRequest>,
) -> Result<Vec<Enqueued>, StoreError> {
    check_batch(&reqs)?;
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    let tenant = first.tenant.clone();
    let quotas = st.quotas(&tenant);
    let prepared = reqs
        .iter()
        .map(|req| prepare(st, now, req.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(q) = quotas {
        let queued = st.count(&tenant, RunStatus::Queued);
        lifecycle::admit_batch(&tenant, queued, reqs.len(), Some(q.max_queued))?;
    }
    let mut cost = 0;
    for p in &prepared {
        if let Prepared::New(new) = p {
            new.check_storage(quotas.as_ref(), st.stored(&tenant) + cost)?;
            cost += new.cost();
        }
    }
    reqs.into_iter()
        .map(|req| match prepare(st, now, req)? {
            Prepared::Existing(run) => Ok(Enqueued {
                run: *run,
                created: false,
            }),
            new => Ok(Enqueued {
                run: commit(st, now, new)?,
                created: true,
            }),
        })
        .collect()
}

/// Reads what creating the run takes and decides it, changing nothing.
pub(crate) fn prepare(
    st: &State,
    now: Millis,
    req: EnqueueRequest,
) -> Result<Prepared, StoreError> {
    let not_found = || StoreError::NotFound(format!("function {:?}", req.function));
    let space = st.spaces.get(&req.tenant).ok_or_else(not_found)?;
    let function = space.functions.get(&req.function).ok_or_else(not_found)?;
    if let Some(key) = &req.idempotency_key
        && let Some(id) = space.idem.get(&req.function).and_then(|keys| keys.get(key))
        && let Some(e) = space.runs.get(id)
        && e.run.created_at > now - IDEMPOTENCY_WINDOW_MS
    {
        return Ok(Prepared::Existing(Box::new(e.run.clone())));
    }
    // Past its window a key is free again: the new run takes it over.
    let id = wasq_core::ids::new_run_id(now);
    let plan = function
        .settings
        .flow
        .plan(&req.function, &req.input, req.priority);
    let settings = req.run_settings(&function.settings);
    let over_rate = plan
        .rate_limit
        .as_ref()
        .is_some_and(|g| window_full(space, g, now).is_some());
    let (replaces, due) = if over_rate {
        (None, now)
    } else {
        let replaces = plan
            .debounce
            .as_ref()
            .and_then(|g| space.debounce.get(&g.id))
            .and_then(|pending| pending.first().cloned());
        let mut due = req.start_at(now);
        if let Some(g) = &plan.debounce {
            due = due.max(now.saturating_add(g.period_ms as i64));
        }
        (replaces, due)
    };
    let mut run = req.into_run(id, now, function.digest.clone(), settings, &plan);
    run.due_at = due;
    let mut entry = RunEntry::new(run, &plan);
    if over_rate {
        // Recorded, and skipped as it is created.
        let t = lifecycle::skip(&entry.run.id, lifecycle::rate_limited_error(&plan), now);
        write(&mut entry, &t, now);
        entry.recount();
    }
    Ok(Prepared::New(Box::new(NewRun {
        entry,
        replaces,
        rate_gate: if over_rate { None } else { plan.rate_limit },
        queued: !over_rate,
    })))
}

/// Creates the prepared run (skipping the run it replaces) and returns it.
pub(crate) fn commit(st: &mut State, now: Millis, prepared: Prepared) -> Result<Run, StoreError> {
    let new = match prepared {
        Prepared::Existing(run) => return Ok(*run),
        Prepared::New(new) => *new,
    };
    let NewRun {
        entry,
        replaces,
        rate_gate,
        ..
    } = new;
    let (tenant, id) = (entry.run.tenant.clone(), entry.run.id.clone());
    if let Some(old) = replaces {
        let t = lifecycle::skip(&old, lifecycle::debounced_error(&id), now);
        apply(st, &tenant, &old, &t, now)?;
    }
    st.insert(entry);
    if let Some(g) = &rate_gate {
        log_window(st.space_mut(&tenant), g, now);
    }
    Ok(st.get(&tenant, &id)?.run.clone())
}

/// Fails with the tenant's `max_queued` error unless `admission` lets it queue `adding`
/// more runs ([`lifecycle::admit`]). A tenant without a record has no quotas.
pub(crate) fn check_queue_quota(
    st: &State,
    tenant: &str,
    admission: Admission,
    adding: u64,
) -> Result<(), StoreError> {
    let Some(quotas) = st.quotas(tenant) else {
        return Ok(());
    };
    let queued = st.count(tenant, RunStatus::Queued);
    lifecycle::admit(tenant, admission, queued, adding, Some(quotas.max_queued))
}

/// The sliding window of a throttle or rate limit: `Some(t)` when `limit` entries fall in
/// the last `period` (the window is full until `t`), `None` when there is room.
pub(crate) fn window_full(space: &Space, gate: &Gate, now: Millis) -> Option<Millis> {
    let entries = space.windows.get(&gate.id).map_or(&[][..], |w| &w[..]);
    let limit = (gate.limit as usize).max(1);
    let limit_th = entries.len().checked_sub(limit).map(|i| entries[i]);
    gate.closed_until(limit_th, now)
}

/// The entries of a gate's window inside its period, oldest first.
pub(crate) fn in_window<'a>(space: &'a Space, gate: &Gate, now: Millis) -> &'a [Millis] {
    let Some(w) = space.windows.get(&gate.id) else {
        return &[];
    };
    let start = gate.window_start(now);
    &w[w.partition_point(|&at| at <= start)..]
}

/// Records an entry in the window (and forgets entries that left it).
pub(crate) fn log_window(space: &mut Space, gate: &Gate, now: Millis) {
    let w = space.windows.entry(gate.id.clone()).or_default();
    let start = gate.window_start(now);
    w.drain(..w.partition_point(|&at| at <= start));
    let at = w.partition_point(|&at| at <= now);
    w.insert(at, now);
}

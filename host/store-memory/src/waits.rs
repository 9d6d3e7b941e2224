//! Waits: a waiting run resumes when its event arrives, the run it waits on ends (with
//! the resolution core computed) or its time is up; and events, which also start the
//! functions subscribed to them.

use wasq_core::clock::Millis;
use wasq_core::lifecycle::Admission;
use wasq_core::storage;
use wasq_core::*;

use crate::admission::{self, Prepared, check_queue_quota};
use crate::claim::due;
use crate::state::{EventEntry, State};
use crate::transition::write_step;

/// Ends a wait: the resolution becomes the waiting step's output, and the run is due now
/// as a resume of its current attempt (the replay reads the step and goes on).
pub(crate) fn resolve_wait(
    st: &mut State,
    tenant: &str,
    id: &str,
    wait: &Wait,
    resolution: &Resolution,
    now: Millis,
) -> Result<(), StoreError> {
    // Always stored, even past a quota: the waiting run must be able to go on and end.
    let output = resolution.to_bytes();
    write_step(st, tenant, id, &wait.step, wait.occurrence, &output, now)?;
    st.update(tenant, id, |e| {
        e.run.status = RunStatus::Sleeping;
        e.run.due_at = now;
        e.run.updated_at = now;
        e.run.wait = None;
    })
}

/// The wait of run `id` if it is waiting.
fn wait_of(st: &State, tenant: &str, id: &str) -> Option<Wait> {
    st.entry(tenant, id)
        .filter(|e| e.run.status == RunStatus::Waiting)
        .and_then(|e| e.run.wait.clone())
}

/// After run `id` ended: the runs waiting for it (`call`, `join`) resume with its
/// resolution.
pub(crate) fn resolve_waiters_of(
    st: &mut State,
    tenant: &str,
    id: &str,
    resolution: &Resolution,
    now: Millis,
) -> Result<(), StoreError> {
    let waiters: Vec<RunId> = st
        .spaces
        .get(tenant)
        .and_then(|s| s.waiting_run.get(id))
        .map(|w| w.iter().cloned().collect())
        .unwrap_or_default();
    for waiter in waiters {
        if let Some(wait) = wait_of(st, tenant, &waiter) {
            resolve_wait(st, tenant, &waiter, &wait, resolution, now)?;
        }
    }
    Ok(())
}

/// Waits whose time is up resolve as timed out.
pub(crate) fn resolve_timeouts(st: &mut State, now: Millis) -> Result<(), StoreError> {
    for (tenant, id) in due(&st.timeline.timeouts, now) {
        if let Some(wait) = wait_of(st, &tenant, &id) {
            resolve_wait(st, &tenant, &id, &wait, &Resolution::TimedOut, now)?;
        }
    }
    Ok(())
}

/// [`Store::send_event`]: records the event, starts a run of every subscribed function
/// (all counted against `max_queued` at once, all checked before any is created) and
/// resumes every run waiting for a matching event.
pub(crate) fn send_event(
    st: &mut State,
    now: Millis,
    req: EventRequest,
) -> Result<EventSent, StoreError> {
    let tenant = req.tenant.as_str();
    let id = req
        .id
        .clone()
        .unwrap_or_else(|| wasq_core::ids::new_run_id(now));
    let seen = st
        .spaces
        .get(tenant)
        .and_then(|s| s.events.get(&id))
        .map(|e| (e.created_at, e.cost(&id)));
    if seen.is_some_and(|(at, _)| at > now - IDEMPOTENCY_WINDOW_MS) {
        return Ok(EventSent {
            id,
            accepted: false,
            ..EventSent::default()
        });
    }
    let event = EventEntry {
        name: req.name.clone(),
        data: req.data.to_string(),
        created_at: now,
    };
    let cost = event.cost(&id);
    let quotas = st.quotas(tenant);
    let mut used = st.stored(tenant);
    storage::check_tenant_bytes(tenant, quotas.as_ref(), used, cost)?;
    // Past its window the id is free again: the old record is replaced.
    used = used - seen.map_or(0, |(_, old)| old) + cost;
    let subscribers: Vec<String> = st
        .spaces
        .get(tenant)
        .map(|s| {
            s.functions
                .values()
                .filter(|f| f.events.contains(&req.name))
                .map(|f| f.name.clone())
                .collect()
        })
        .unwrap_or_default();
    check_queue_quota(st, tenant, Admission::Event, subscribers.len() as u64)?;
    let mut runs = Vec::with_capacity(subscribers.len());
    for function in subscribers {
        let start = EnqueueRequest {
            tenant: tenant.to_owned(),
            function,
            input: event.data.clone().into_bytes(),
            trigger: format!("event:{}", req.name),
            due_at: None,
            // One run per function per event, however often it is delivered.
            idempotency_key: Some(format!("event:{id}")),
            retry: None,
            parent: None,
            priority: None,
            trace: req.trace.clone(),
        };
        let prepared = admission::prepare(st, now, start)?;
        if let Prepared::New(new) = &prepared {
            new.check_storage(quotas.as_ref(), used)?;
            used += new.cost();
        }
        runs.push(prepared);
    }

    // Checked: from here on nothing is refused.
    let space = st.space_mut(tenant);
    if let Some(old) = space.events.remove(&id) {
        space.events_by_time.remove(&(old.created_at, id.clone()));
        space.usage.stored_bytes = space.usage.stored_bytes.saturating_sub(old.cost(&id));
    }
    space.events_by_time.insert((now, id.clone()));
    space.events.insert(id.clone(), event);
    space.usage.stored_bytes += cost;
    let mut sent = EventSent {
        id,
        accepted: true,
        ..EventSent::default()
    };
    for prepared in runs {
        sent.started.push(admission::commit(st, now, prepared)?.id);
    }
    let waiters: Vec<RunId> = st
        .spaces
        .get(tenant)
        .and_then(|s| s.waiting_event.get(&req.name))
        .map(|w| w.iter().cloned().collect())
        .unwrap_or_default();
    for waiter in waiters {
        let Some(wait) = wait_of(st, tenant, &waiter) else {
            continue;
        };
        let WaitOn::Event { name, filter } = &wait.on else {
            continue;
        };
        if *name == req.name && event_matches(filter.as_deref(), &req.data) {
            let resolution = Resolution::Event {
                data: req.data.clone(),
            };
            resolve_wait(st, tenant, &waiter, &wait, &resolution, now)?;
            sent.resumed.push(waiter);
        }
    }
    Ok(sent)
}

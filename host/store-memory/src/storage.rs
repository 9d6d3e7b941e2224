//! Functions and components, and what frees room: the purge of ended runs, events past
//! their dedup window and components nothing refers to any more. Every byte given back
//! is what the thing was charged (see `wasq_core::storage`).

use wasq_core::clock::Millis;
use wasq_core::storage;
use wasq_core::*;

use crate::COST;
use crate::state::State;

/// [`Store::deploy`]: a function is charged its component's size, so replacing one
/// charges the difference (refused over `max_stored_bytes` when it grows).
pub(crate) fn deploy(
    st: &mut State,
    now: Millis,
    req: DeployRequest,
) -> Result<Function, StoreError> {
    let old = st
        .spaces
        .get(&req.tenant)
        .and_then(|s| s.functions.get(&req.name));
    let old_cost = old.map_or(0, |f| COST.function(f.size_bytes));
    let created_at = old.map_or(now, |f| f.created_at);
    let old_digest = old.map(|f| f.digest.clone());
    let new_cost = COST.function(req.component.len() as u64);
    if new_cost > old_cost {
        let quotas = st.quotas(&req.tenant);
        let used = st.stored(&req.tenant);
        storage::check_tenant_bytes(&req.tenant, quotas.as_ref(), used, new_cost - old_cost)?;
    }
    let function = Function {
        tenant: req.tenant.clone(),
        name: req.name.clone(),
        digest: req.digest.clone(),
        size_bytes: req.component.len() as u64,
        settings: req.settings,
        events: req.events,
        schedule: req.schedule,
        created_at,
        updated_at: now,
    };
    st.components
        .entry(req.digest.clone())
        .or_insert(req.component);
    st.add_ref(&req.digest);
    if let Some(old) = old_digest {
        st.drop_ref(&old);
    }
    let space = st.space_mut(&req.tenant);
    space.usage.stored_bytes = (space.usage.stored_bytes + new_cost).saturating_sub(old_cost);
    space.functions.insert(req.name, function.clone());
    Ok(function)
}

/// [`Store::purge`]: deletes ended runs past their retention with everything they
/// recorded, then event ids past their dedup window and the components left unreferenced.
pub(crate) fn purge(st: &mut State, now: Millis, req: PurgeRequest) -> usize {
    let mut victims = Vec::new();
    'spaces: for (tenant, space) in &st.spaces {
        let sets = [
            (&space.ended_ok, req.succeeded_before),
            (&space.ended_bad, req.failed_before),
        ];
        for (ended, before) in sets {
            for (_, id) in ended.range(..(before, String::new())) {
                if victims.len() >= req.limit {
                    break 'spaces;
                }
                victims.push((tenant.clone(), id.clone()));
            }
        }
    }
    for (tenant, id) in &victims {
        st.remove(tenant, id);
        st.outbox.forget_run(tenant, id);
    }
    let events = forget_events(st, now - IDEMPOTENCY_WINDOW_MS, req.limit);
    if !victims.is_empty() || events > 0 {
        let refs = &st.digest_refs;
        st.components.retain(|digest, _| refs.contains_key(digest));
    }
    victims.len()
}

/// Forgets event ids first seen before `before` (an id is only remembered for its dedup
/// window), giving back what they cost; at most `limit`.
fn forget_events(st: &mut State, before: Millis, limit: usize) -> usize {
    let mut forgotten = 0;
    for space in st.spaces.values_mut() {
        while forgotten < limit {
            let Some((at, id)) = space.events_by_time.first().cloned() else {
                break;
            };
            if at >= before {
                break;
            }
            space.events_by_time.remove(&(at, id.clone()));
            if let Some(event) = space.events.remove(&id) {
                let cost = event.cost(&id);
                space.usage.stored_bytes = space.usage.stored_bytes.saturating_sub(cost);
            }
            forgotten += 1;
        }
    }
    forgotten
}

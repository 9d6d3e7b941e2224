//! Webhook deliveries ([`Deliveries`]): kept per tenant by id, a run's in the order
//! added, the pending ones by due time.

use std::collections::{BTreeSet, HashMap};

use wasq_core::clock::Millis;
use wasq_core::notify::{self, Delivery, DeliveryStatus, DeliveryTry};
use wasq_core::*;

use crate::state::State;

/// Every tenant's deliveries.
#[derive(Default)]
pub(crate) struct Outbox {
    by_id: HashMap<(String, String), Delivery>,
    /// (tenant, run) → its deliveries' ids, in the order added.
    by_run: HashMap<(String, RunId), Vec<String>>,
    /// Pending deliveries by when they are due: (next_at, tenant, id).
    due: BTreeSet<(Millis, String, String)>,
}

impl Outbox {
    fn set_due(&mut self, d: &Delivery, was: Option<Millis>) {
        if let Some(at) = was {
            self.due.remove(&(at, d.tenant.clone(), d.id.clone()));
        }
        if d.status == DeliveryStatus::Pending {
            self.due.insert((d.next_at, d.tenant.clone(), d.id.clone()));
        }
    }

    /// Drops a purged run's deliveries.
    pub(crate) fn forget_run(&mut self, tenant: &str, run: &str) {
        for id in self
            .by_run
            .remove(&(tenant.to_owned(), run.to_owned()))
            .unwrap_or_default()
        {
            if let Some(d) = self.by_id.remove(&(tenant.to_owned(), id)) {
                self.due.remove(&(d.next_at, d.tenant, d.id));
            }
        }
    }
}

pub(crate) fn add(st: &mut State, deliveries: Vec<Delivery>) {
    let out = &mut st.outbox;
    for d in deliveries {
        let key = (d.tenant.clone(), d.id.clone());
        if out.by_id.contains_key(&key) {
            continue;
        }
        out.by_run
            .entry((d.tenant.clone(), d.run_id.clone()))
            .or_default()
            .push(d.id.clone());
        out.set_due(&d, None);
        out.by_id.insert(key, d);
    }
}

pub(crate) fn claim(st: &mut State, now: Millis, limit: usize, lease_ms: u64) -> Vec<Delivery> {
    let out = &mut st.outbox;
    let due: Vec<(Millis, String, String)> = out
        .due
        .range(..(now.saturating_add(1), String::new(), String::new()))
        .take(limit)
        .cloned()
        .collect();
    let mut claimed = Vec::with_capacity(due.len());
    for (at, tenant, id) in due {
        let Some(d) = out.by_id.get_mut(&(tenant, id)) else {
            continue;
        };
        d.token += 1;
        d.next_at = now + lease_ms as Millis;
        let d = d.clone();
        out.set_due(&d, Some(at));
        claimed.push(d);
    }
    claimed
}

pub(crate) fn record_try(st: &mut State, now: Millis, tried: DeliveryTry) {
    let out = &mut st.outbox;
    let Some(d) = out.by_id.get_mut(&(tried.tenant, tried.id)) else {
        return;
    };
    if d.token != tried.token || d.status != DeliveryStatus::Pending {
        return;
    }
    let was = d.next_at;
    let after = notify::after_try(d.tries, tried.error.as_deref(), now);
    d.status = after.status;
    d.tries = after.tries;
    d.next_at = after.next_at;
    d.last_error = after.last_error;
    d.updated_at = now;
    let d = d.clone();
    out.set_due(&d, Some(was));
}

pub(crate) fn of_run(st: &State, tenant: &str, run: &str) -> Vec<Delivery> {
    let out = &st.outbox;
    out.by_run
        .get(&(tenant.to_owned(), run.to_owned()))
        .into_iter()
        .flatten()
        .filter_map(|id| out.by_id.get(&(tenant.to_owned(), id.clone())).cloned())
        .collect()
}

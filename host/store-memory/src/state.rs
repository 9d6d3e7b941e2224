//! The store's data and its indexes. Every index entry of a run is derived from the run's
//! fields by one pure function ([`RunEntry::keys`]), and every change of a run goes
//! through [`State::update`], which takes the run out of its indexes, lets the change
//! happen, puts it back and charges the difference in bytes to its tenant: the in-memory
//! equivalent of the SQLite store's triggers, so counts, lanes and charges cannot drift.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use wasq_core::clock::Millis;
use wasq_core::flow::{FlowPlan, Gate};
use wasq_core::*;

use crate::COST;

/// Everything the store keeps, behind its one mutex.
#[derive(Default)]
pub(crate) struct State {
    /// Each tenant's functions, runs, events and indexes.
    pub(crate) spaces: BTreeMap<String, Space>,
    pub(crate) timeline: Timeline,
    /// Tenants with runs in their lane, in name order: the claim's round robin.
    pub(crate) lanes: BTreeSet<String>,
    /// The tenant the last claim served last: the next claim starts after it.
    pub(crate) cursor: String,
    /// Components by digest, shared by every tenant that deploys them.
    pub(crate) components: HashMap<String, Vec<u8>>,
    /// Functions and runs that pin each digest (a component is collected at 0).
    pub(crate) digest_refs: HashMap<String, usize>,
    pub(crate) tenants: BTreeMap<String, Tenant>,
    /// The worker registry: each worker's latest heartbeat, by id.
    pub(crate) workers: BTreeMap<String, wasq_core::WorkerBeat>,
    pub(crate) keys: BTreeMap<String, ApiKey>,
    /// Oldest first; append-only.
    pub(crate) audit: Vec<AuditEntry>,
    /// Webhook deliveries.
    pub(crate) outbox: crate::deliveries::Outbox,
    /// Tenants' feeds of status changes.
    pub(crate) feeds: HashMap<String, crate::feed::TenantFeed>,
}

/// What comes due by the clock, over every tenant: `(time, tenant, run id or gate)`.
#[derive(Default)]
pub(crate) struct Timeline {
    /// Queued and sleeping runs not in their lane yet, by due time.
    pub(crate) pending: BTreeSet<(Millis, String, RunId)>,
    /// Running runs by lease expiry.
    pub(crate) leases: BTreeSet<(Millis, String, RunId)>,
    /// Waiting runs with a time limit, by that limit.
    pub(crate) timeouts: BTreeSet<(Millis, String, RunId)>,
    /// Throttle gates with parked runs, by when their window opens.
    pub(crate) gate_timers: BTreeSet<(Millis, String, String)>,
}

/// One tenant's data.
#[derive(Default)]
pub(crate) struct Space {
    pub(crate) functions: BTreeMap<String, Function>,
    /// By id, which is creation order (an id starts with its creation time).
    pub(crate) runs: BTreeMap<RunId, RunEntry>,
    pub(crate) by_status: HashMap<RunStatus, BTreeSet<RunId>>,
    pub(crate) by_function: HashMap<String, BTreeSet<RunId>>,
    pub(crate) kids: HashMap<RunId, BTreeSet<RunId>>,
    /// Function → idempotency key → the run created with it last.
    pub(crate) idem: HashMap<String, HashMap<String, RunId>>,
    /// Due queued and sleeping runs by rank (ties: id, i.e. creation order).
    pub(crate) lane: BTreeSet<(i64, RunId)>,
    /// Due runs a gate holds back, by rank.
    pub(crate) parked: HashMap<String, BTreeSet<(i64, RunId)>>,
    /// Running runs per concurrency gate.
    pub(crate) gate_running: HashMap<String, usize>,
    /// Not yet started runs per debounce gate.
    pub(crate) debounce: HashMap<String, BTreeSet<RunId>>,
    pub(crate) waiting_event: HashMap<String, BTreeSet<RunId>>,
    pub(crate) waiting_run: HashMap<RunId, BTreeSet<RunId>>,
    /// Succeeded and skipped runs by finish time (purge).
    pub(crate) ended_ok: BTreeSet<(Millis, RunId)>,
    /// Failed and cancelled runs by finish time (purge).
    pub(crate) ended_bad: BTreeSet<(Millis, RunId)>,
    /// Sliding windows of throttles and rate limits: entry times, ascending.
    pub(crate) windows: HashMap<String, Vec<Millis>>,
    pub(crate) gate_timers: HashMap<String, GateTimer>,
    pub(crate) events: HashMap<String, EventEntry>,
    pub(crate) events_by_time: BTreeSet<(Millis, String)>,
    pub(crate) usage: Usage,
}

pub(crate) struct GateTimer {
    pub(crate) at: Millis,
    pub(crate) gate: Gate,
}

/// An event id remembered for its dedup window.
pub(crate) struct EventEntry {
    pub(crate) name: String,
    pub(crate) data: String,
    pub(crate) created_at: Millis,
}

impl EventEntry {
    pub(crate) fn cost(&self, id: &str) -> u64 {
        COST.event(id.len(), self.name.len(), self.data.len())
    }
}

/// A run with its history and the bookkeeping the store needs.
pub(crate) struct RunEntry {
    pub(crate) run: Run,
    pub(crate) lease_token: u64,
    pub(crate) lease_expires_at: Option<Millis>,
    pub(crate) worker: Option<String>,
    pub(crate) cancel_requested: bool,
    /// The current execution woke a sleeping run (it did not start a new attempt).
    pub(crate) resumed: bool,
    pub(crate) rank_offset: i64,
    /// Due time + rank offset, set when the run enters its lane.
    pub(crate) rank: i64,
    /// In its tenant's lane (it was due when a claim last looked).
    pub(crate) promoted: bool,
    /// The gate holding it back.
    pub(crate) parked: Option<String>,
    pub(crate) cgate: Option<Gate>,
    pub(crate) tgate: Option<Gate>,
    pub(crate) dgate: Option<String>,
    /// Executions, oldest first.
    pub(crate) attempts: Vec<Attempt>,
    /// Steps in completion order.
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) step_index: HashMap<(String, u32), usize>,
    pub(crate) logs: Vec<LogLine>,
    /// Lines were dropped (the marker is stored): every later line is.
    pub(crate) logs_cut: bool,
    /// What its attempts and steps cost; `run.stored_bytes` is this plus the record.
    pub(crate) history_bytes: u64,
}

/// Where a run sits in the indexes: a pure function of its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    status: RunStatus,
    pending: Option<Millis>,
    lane: Option<i64>,
    parked: Option<(String, i64)>,
    lease: Option<Millis>,
    running_gate: Option<String>,
    timeout: Option<Millis>,
    waits_event: Option<String>,
    waits_run: Option<RunId>,
    debounce: Option<String>,
    /// (succeeded or skipped, finished at).
    ended: Option<(bool, Millis)>,
}

impl RunEntry {
    /// A new run's entry, with the gates of its flow plan.
    pub(crate) fn new(run: Run, plan: &FlowPlan) -> RunEntry {
        let mut e = RunEntry {
            run,
            lease_token: 0,
            lease_expires_at: None,
            worker: None,
            cancel_requested: false,
            resumed: false,
            rank_offset: plan.rank_offset,
            rank: 0,
            promoted: false,
            parked: None,
            cgate: plan.concurrency.clone(),
            tgate: plan.throttle.clone(),
            dgate: plan.debounce.as_ref().map(|g| g.id.clone()),
            attempts: Vec::new(),
            steps: Vec::new(),
            step_index: HashMap::new(),
            logs: Vec::new(),
            logs_cut: false,
            history_bytes: 0,
        };
        e.recount();
        e
    }

    /// Everything the run is charged: `stored_bytes` and `log_bytes`.
    pub(crate) fn bytes(&self) -> u64 {
        self.run.stored_bytes + self.run.log_bytes
    }

    /// Sets `stored_bytes` from the record as it is now and the history's counter.
    pub(crate) fn recount(&mut self) {
        self.run.stored_bytes = COST.run(payload(&self.run)) + self.history_bytes;
    }

    pub(crate) fn keys(&self) -> Keys {
        let r = &self.run;
        let mut k = Keys {
            status: r.status,
            pending: None,
            lane: None,
            parked: None,
            lease: None,
            running_gate: None,
            timeout: None,
            waits_event: None,
            waits_run: None,
            debounce: None,
            ended: None,
        };
        match r.status {
            RunStatus::Queued | RunStatus::Sleeping => match (&self.parked, self.promoted) {
                (_, false) => k.pending = Some(r.due_at),
                (Some(gate), true) => k.parked = Some((gate.clone(), self.rank)),
                (None, true) => k.lane = Some(self.rank),
            },
            RunStatus::Running => {
                k.lease = Some(self.lease_expires_at.unwrap_or(Millis::MAX));
                k.running_gate = self.cgate.as_ref().map(|g| g.id.clone());
            }
            RunStatus::Waiting => {
                k.timeout = (r.due_at != Millis::MAX).then_some(r.due_at);
                match r.wait.as_ref().map(|w| &w.on) {
                    Some(WaitOn::Event { name, .. }) => k.waits_event = Some(name.clone()),
                    Some(WaitOn::Run { id }) => k.waits_run = Some(id.clone()),
                    None => {}
                }
            }
            _ => {}
        }
        if lifecycle::debounce_replaces(r.status, r.attempt) {
            k.debounce.clone_from(&self.dgate);
        }
        if r.status.is_terminal()
            && let Some(at) = r.finished_at
        {
            let ok = matches!(r.status, RunStatus::Succeeded | RunStatus::Skipped);
            k.ended = Some((ok, at));
        }
        k
    }
}

/// The bytes a run record holds whole besides its fixed size (see [`COST`]): payloads and
/// texts, each at its length.
fn payload(r: &Run) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let wait = r.wait.as_ref().map_or(0, |w| {
        w.step.len()
            + match &w.on {
                WaitOn::Event { name, filter } => name.len() + text(filter),
                WaitOn::Run { id } => id.len(),
            }
    });
    let flow = &r.settings.flow;
    let exprs = [
        flow.concurrency.as_ref().and_then(|c| c.key.as_ref()),
        flow.throttle.as_ref().and_then(|t| t.key.as_ref()),
        flow.rate_limit.as_ref().and_then(|t| t.key.as_ref()),
        flow.debounce.as_ref().and_then(|d| d.key.as_ref()),
    ];
    let keys = [
        &r.keys.concurrency,
        &r.keys.throttle,
        &r.keys.rate_limit,
        &r.keys.debounce,
    ];
    r.input.len()
        + r.output.as_ref().map_or(0, Vec::len)
        + r.trigger.len()
        // The run and the idempotency index hold the key.
        + 2 * text(&r.idempotency_key)
        + text(&r.parent)
        + r.error.as_ref().map_or(0, |e| e.message.len())
        + r.progress.as_ref().map_or(0, |p| text(&p.message))
        + wait
        + r.settings.allow_hosts.iter().map(String::len).sum::<usize>()
        + exprs.into_iter().flatten().map(|k| k.as_str().len()).sum::<usize>()
        + keys.into_iter().map(text).sum::<usize>()
        + r.trace.as_ref().map_or(0, |t| t.as_str().len())
}

/// What one execution costs (with its error, once it ended with one).
pub(crate) fn attempt_cost(a: &Attempt) -> u64 {
    COST.attempt() + error_bytes(a.error.as_ref())
}

pub(crate) fn error_bytes(e: Option<&RunError>) -> u64 {
    e.map_or(0, |e| e.message.len() as u64)
}

pub(crate) fn vanished(id: &str) -> StoreError {
    StoreError::Internal(format!("run {id} vanished"))
}

impl State {
    pub(crate) fn entry(&self, tenant: &str, id: &str) -> Option<&RunEntry> {
        self.spaces.get(tenant)?.runs.get(id)
    }

    /// A run the caller knows exists.
    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<&RunEntry, StoreError> {
        self.entry(tenant, id).ok_or_else(|| vanished(id))
    }

    /// A run of `tenant`, or NotFound: other tenants' runs do not exist for the caller.
    pub(crate) fn tenant_run(&self, tenant: &str, id: &str) -> Result<&RunEntry, StoreError> {
        self.entry(tenant, id)
            .ok_or_else(|| StoreError::NotFound(format!("run {id:?}")))
    }

    pub(crate) fn space_mut(&mut self, tenant: &str) -> &mut Space {
        self.spaces.entry(tenant.to_owned()).or_default()
    }

    /// The tenant's quotas; `None` without a record (no quotas).
    pub(crate) fn quotas(&self, tenant: &str) -> Option<Quotas> {
        self.tenants.get(tenant).map(|t| t.quotas)
    }

    /// Bytes the tenant keeps now.
    pub(crate) fn stored(&self, tenant: &str) -> u64 {
        self.spaces.get(tenant).map_or(0, |s| s.usage.stored_bytes)
    }

    pub(crate) fn count(&self, tenant: &str, status: RunStatus) -> u64 {
        self.spaces
            .get(tenant)
            .and_then(|s| s.by_status.get(&status))
            .map_or(0, |s| s.len() as u64)
    }

    pub(crate) fn add_ref(&mut self, digest: &str) {
        *self.digest_refs.entry(digest.to_owned()).or_default() += 1;
    }

    pub(crate) fn drop_ref(&mut self, digest: &str) {
        if let Some(n) = self.digest_refs.get_mut(digest) {
            *n -= 1;
            if *n == 0 {
                self.digest_refs.remove(digest);
            }
        }
    }

    /// Changes run `id` of `tenant` with `f`, keeping its indexes and its tenant's charge
    /// exact. A change of status takes the run out of its lane and off its gate; a run of a
    /// concurrency key that stops running (or ends) lets the best run parked on the key
    /// back into the lane.
    pub(crate) fn update<R>(
        &mut self,
        tenant: &str,
        id: &str,
        f: impl FnOnce(&mut RunEntry) -> R,
    ) -> Result<R, StoreError> {
        let (mut f, mut out) = (Some(f), None);
        self.change(tenant, id, &mut |e| out = f.take().map(|f| f(e)))?;
        out.ok_or_else(|| vanished(id))
    }

    /// [`State::update`] without its type parameters (it calls itself).
    fn change(
        &mut self,
        tenant: &str,
        id: &str,
        f: &mut dyn FnMut(&mut RunEntry),
    ) -> Result<(), StoreError> {
        let space = self.spaces.get_mut(tenant).ok_or_else(|| vanished(id))?;
        let e = space.runs.get_mut(id).ok_or_else(|| vanished(id))?;
        let (old_keys, old_bytes, old_status) = (e.keys(), e.bytes(), e.run.status);
        f(e);
        let status = e.run.status;
        if status != old_status {
            e.promoted = false;
            e.parked = None;
            if let Some(feed) = self.feeds.get_mut(tenant) {
                feed.record(&e.run);
            }
        }
        e.recount();
        let (new_keys, new_bytes) = (e.keys(), e.bytes());
        let freed = e.cgate.as_ref().map(|g| g.id.clone()).filter(|_| {
            status != old_status && (old_status == RunStatus::Running || status.is_terminal())
        });
        space.usage.stored_bytes = (space.usage.stored_bytes + new_bytes).saturating_sub(old_bytes);
        if old_keys != new_keys {
            space.place(&mut self.timeline, tenant, id, &old_keys, false);
            space.place(&mut self.timeline, tenant, id, &new_keys, true);
        }
        self.sync_lane(tenant);
        if let Some(gate) = freed {
            let best = self.spaces[tenant]
                .parked
                .get(&gate)
                .and_then(|p| p.first())
                .map(|(_, id)| id.clone());
            if let Some(best) = best {
                self.change(tenant, &best, &mut |e| e.parked = None)?;
            }
        }
        Ok(())
    }

    /// Adds a new run and charges it to its tenant.
    pub(crate) fn insert(&mut self, mut e: RunEntry) {
        e.recount();
        let (tenant, id) = (e.run.tenant.clone(), e.run.id.clone());
        self.add_ref(&e.run.digest);
        let space = self.spaces.entry(tenant.clone()).or_default();
        let r = &e.run;
        space
            .by_function
            .entry(r.function.clone())
            .or_default()
            .insert(id.clone());
        if let Some(parent) = &r.parent {
            space
                .kids
                .entry(parent.clone())
                .or_default()
                .insert(id.clone());
        }
        if let Some(key) = &r.idempotency_key {
            space
                .idem
                .entry(r.function.clone())
                .or_default()
                .insert(key.clone(), id.clone());
        }
        space.usage.stored_bytes += e.bytes();
        if let Some(feed) = self.feeds.get_mut(&tenant) {
            feed.record(&e.run);
        }
        let space = self.spaces.entry(tenant.clone()).or_default();
        space.place(&mut self.timeline, &tenant, &id, &e.keys(), true);
        space.runs.insert(id, e);
        self.sync_lane(&tenant);
    }

    /// Deletes a run with everything it recorded, giving back what it was charged.
    pub(crate) fn remove(&mut self, tenant: &str, id: &str) -> Option<RunEntry> {
        let space = self.spaces.get_mut(tenant)?;
        let e = space.runs.remove(id)?;
        space.place(&mut self.timeline, tenant, id, &e.keys(), false);
        let r = &e.run;
        toggle_map(&mut space.by_function, &r.function, id.to_owned(), false);
        if let Some(parent) = &r.parent {
            toggle_map(&mut space.kids, parent, id.to_owned(), false);
        }
        if let Some(key) = &r.idempotency_key
            && let Some(keys) = space.idem.get_mut(&r.function)
            && keys.get(key).is_some_and(|k| k == id)
        {
            keys.remove(key);
            if keys.is_empty() {
                space.idem.remove(&r.function);
            }
        }
        space.usage.stored_bytes = space.usage.stored_bytes.saturating_sub(e.bytes());
        let digest = e.run.digest.clone();
        self.drop_ref(&digest);
        self.sync_lane(tenant);
        Some(e)
    }

    fn sync_lane(&mut self, tenant: &str) {
        let busy = self.spaces.get(tenant).is_some_and(|s| !s.lane.is_empty());
        if !busy {
            self.lanes.remove(tenant);
        } else if !self.lanes.contains(tenant) {
            self.lanes.insert(tenant.to_owned());
        }
    }

    /// Sets the timer of a throttle gate with parked runs; `earliest`: keeps an earlier
    /// time already set.
    pub(crate) fn set_timer(&mut self, tenant: &str, gate: &Gate, at: Millis, earliest: bool) {
        let space = self.spaces.entry(tenant.to_owned()).or_default();
        let at = match space.gate_timers.get(&gate.id) {
            Some(t) => {
                let old = (t.at, tenant.to_owned(), gate.id.clone());
                self.timeline.gate_timers.remove(&old);
                if earliest { t.at.min(at) } else { at }
            }
            None => at,
        };
        let timer = GateTimer {
            at,
            gate: gate.clone(),
        };
        space.gate_timers.insert(gate.id.clone(), timer);
        let key = (at, tenant.to_owned(), gate.id.clone());
        self.timeline.gate_timers.insert(key);
    }

    pub(crate) fn clear_timer(&mut self, tenant: &str, gate: &str) {
        if let Some(space) = self.spaces.get_mut(tenant)
            && let Some(t) = space.gate_timers.remove(gate)
        {
            let key = (t.at, tenant.to_owned(), gate.to_owned());
            self.timeline.gate_timers.remove(&key);
        }
    }
}

impl Space {
    /// Adds (`add`) or removes the index entries `k` of run `id`.
    pub(crate) fn place(&mut self, tl: &mut Timeline, tenant: &str, id: &str, k: &Keys, add: bool) {
        let at = |t: Millis| (t, tenant.to_owned(), id.to_owned());
        toggle_map(&mut self.by_status, &k.status, id.to_owned(), add);
        if let Some(due) = k.pending {
            toggle(&mut tl.pending, at(due), add);
        }
        if let Some(rank) = k.lane {
            toggle(&mut self.lane, (rank, id.to_owned()), add);
        }
        if let Some((gate, rank)) = &k.parked {
            toggle_map(&mut self.parked, gate, (*rank, id.to_owned()), add);
        }
        if let Some(expires) = k.lease {
            toggle(&mut tl.leases, at(expires), add);
        }
        if let Some(gate) = &k.running_gate {
            let n = self.gate_running.entry(gate.clone()).or_default();
            if add {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.gate_running.remove(gate);
                }
            }
        }
        if let Some(due) = k.timeout {
            toggle(&mut tl.timeouts, at(due), add);
        }
        if let Some(name) = &k.waits_event {
            toggle_map(&mut self.waiting_event, name, id.to_owned(), add);
        }
        if let Some(target) = &k.waits_run {
            toggle_map(&mut self.waiting_run, target, id.to_owned(), add);
        }
        if let Some(gate) = &k.debounce {
            toggle_map(&mut self.debounce, gate, id.to_owned(), add);
        }
        if let Some((ok, finished)) = k.ended {
            let set = if ok {
                &mut self.ended_ok
            } else {
                &mut self.ended_bad
            };
            toggle(set, (finished, id.to_owned()), add);
        }
    }
}

fn toggle<T: Ord>(set: &mut BTreeSet<T>, value: T, add: bool) {
    if add {
        set.insert(value);
    } else {
        set.remove(&value);
    }
}

/// Adds `value` to (or removes it from) the set under `key`; an emptied set goes.
fn toggle_map<K, Q, T>(map: &mut HashMap<K, BTreeSet<T>>, key: &Q, value: T, add: bool)
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    T: Ord,
{
    if add {
        map.entry(key.to_owned()).or_default().insert(value);
    } else if let Some(set) = map.get_mut(key) {
        set.remove(&value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

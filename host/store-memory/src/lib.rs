//! wasq-store-memory: a [`Store`] and [`Directory`] in the process's memory, for tests:
//! the conformance suite, and `wasq`'s unit tests of the worker loop and the HTTP router,
//! which then need neither a file nor a server.
//!
//! The key decision: one `Mutex<State>` per store, and every call of the traits is one
//! critical section, so each transition is atomic; time comes only from the injected
//! [`Clock`], read inside that section. What a transition does to a run is decided by
//! `wasq_core::lifecycle` and stored by `transition::apply`; flow control is
//! `wasq_core::flow`'s plan, storage quotas and log budgets `wasq_core::storage`'s. A call
//! that can be refused reads and checks everything before it changes anything (an
//! event's subscribers are all prepared before one is created), so a refusal leaves the
//! state as it was, as the SQL stores' rollback does.
//!
//! The state mirrors the SQLite store's tables and indexes as ordered maps (`state.rs`),
//! each index derived from a run's fields by one function and kept by `State::update`,
//! as SQLite's triggers keep theirs. Claims read only what is due (`claim.rs`): the global
//! timeline of pending runs, leases, wait timeouts and throttle timers, and the tenants
//! with runs in their lane, who take turns. Layout: `state` (data, indexes, charges),
//! `admission` (enqueue), `claim` (reaping, lanes, gates, round robin), `transition`
//! (core's transitions, attempts, logs, steps), `waits` (events, resumes), `queries`
//! (reads), `storage` (functions, purge), `directory` (tenants and keys).
//!
//! What it is not: not durable (everything goes with the process) and not shared between
//! processes; `wait_for_work` only sleeps (the trait's default).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use wasq_core::clock::Millis;
use wasq_core::notify;
use wasq_core::*;

mod admission;
mod claim;
mod deliveries;
mod directory;
mod feed;
#[cfg(test)]
mod invariants;
mod queries;
mod state;
mod storage;
mod transition;
mod waits;

use state::{EventEntry, RunEntry, State};

/// What each record costs besides its payload (see `wasq_core::storage`): the size of the
/// value the store keeps for it, the short names it holds on the heap at a typical
/// length, and its entries in the indexes that always hold it.
/// - `run`: the entry (the `Run` with its bookkeeping) under its id, its id, tenant,
///   function and digest, and its entries by status, by function, in a lane or on the
///   timeline (with the tenant's name), and among the ended runs;
/// - `attempt`: one `Attempt` of the run's history with its worker's name;
/// - `step`: the `StepRecord` and its entry in the run's step index (whose key holds the
///   name again, as core counts it);
/// - `log_line`: one `LogLine` of the run's log;
/// - `event`: the entry under its id and its entry by time (which holds the id again);
/// - `function`: the `Function` under its name with its digest, and its component's entry.
pub const COST: CostModel = CostModel {
    run: (size_of::<(RunId, RunEntry)>() + 4 * NAME + 5 * RUN_INDEX_ENTRY) as u64,
    attempt: (size_of::<Attempt>() + NAME) as u64,
    step: (size_of::<StepRecord>() + size_of::<((String, u32), usize)>()) as u64,
    log_line: size_of::<LogLine>() as u64,
    event: (size_of::<(String, EventEntry)>() + size_of::<(Millis, String)>()) as u64,
    function: (size_of::<(String, Function)>() + 2 * NAME + size_of::<(String, Vec<u8>)>()) as u64,
};

/// A short name on the heap (a tenant, a function, a digest, a worker), at a typical length.
const NAME: usize = 40;

/// One entry of an ordered index that names a run: a copy of its id and its share of a
/// B-tree node.
const RUN_INDEX_ENTRY: usize = size_of::<String>() + wasq_core::ids::RUN_ID_LEN + 16;

/// The in-memory store. Cloning is cheap: clones share the same state.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                clock,
            }),
        }
    }

    /// Runs `f` as one critical section, with the time read inside it (so transitions'
    /// times are in the order they happen).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut State, Millis) -> T) -> T {
        let mut state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.inner.clock.now_ms();
        f(&mut state, now)
    }
}

#[async_trait]
impl Registry for MemoryStore {
    async fn deploy(&self, req: DeployRequest) -> Result<Function, StoreError> {
        self.with(|st, now| storage::deploy(st, now, req))
    }

    async fn function(&self, tenant: &str, name: &str) -> Result<Option<Function>, StoreError> {
        self.with(|st, _| {
            let space = st.spaces.get(tenant);
            Ok(space.and_then(|s| s.functions.get(name)).cloned())
        })
    }

    async fn functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError> {
        self.with(|st, _| {
            let space = st.spaces.get(tenant);
            Ok(space.map_or_else(Vec::new, |s| s.functions.values().cloned().collect()))
        })
    }

    async fn schedules(&self, tenant: &str) -> Result<Vec<Scheduled>, StoreError> {
        self.with(|st, _| {
            let space = st.spaces.get(tenant);
            let functions = space.into_iter().flat_map(|s| s.functions.values());
            Ok(functions.filter_map(Function::scheduled).collect())
        })
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.with(|st, _| Ok(st.components.get(digest).cloned()))
    }
}

#[async_trait]
impl Queue for MemoryStore {
    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        self.with(|st, now| admission::enqueue(st, now, req))
    }

    async fn enqueue_batch(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Enqueued>, StoreError> {
        self.with(|st, now| admission::enqueue_batch(st, now, reqs))
    }

    async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError> {
        self.with(|st, now| claim::claim(st, now, &req))
    }

    async fn renew(&self, leases: &[Lease], lease_ms: u64) -> Result<Renewal, StoreError> {
        self.with(|st, now| transition::renew(st, now, leases, lease_ms))
    }

    async fn record(&self, lease: &Lease, record: Record) -> Result<(), StoreError> {
        self.with(|st, now| transition::record(st, now, lease, record))
    }

    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError> {
        self.with(|st, now| transition::finish(st, now, lease, outcome))
    }

    async fn end_attempts(&self, ends: Vec<AttemptEnd>) -> Vec<Result<RunStatus, StoreError>> {
        ends.into_iter()
            .map(|end| self.with(|st, now| transition::end(st, now, end)))
            .collect()
    }
}

#[async_trait]
impl Runs for MemoryStore {
    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError> {
        self.with(|st, now| transition::cancel(st, now, &req))
    }

    async fn retry(&self, req: RunAction) -> Result<Run, StoreError> {
        self.with(|st, now| transition::retry(st, now, &req))
    }

    async fn run_ids(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        self.with(|st, _| Ok(queries::run_ids(st, tenant, prefix, limit)))
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.with(|st, _| Ok(queries::run_detail(st, tenant, id)))
    }

    async fn steps(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError> {
        self.with(|st, _| queries::steps(st, tenant, id, skip, limit))
    }

    async fn step(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError> {
        self.with(|st, _| Ok(queries::step(st, tenant, id, name, occurrence)))
    }

    async fn runs(&self, query: RunQuery) -> Result<Vec<Run>, StoreError> {
        self.with(|st, _| Ok(queries::runs(st, &query)))
    }

    async fn queue_depths(&self, tenant: &str) -> Result<Vec<QueueDepth>, StoreError> {
        self.with(|st, _| Ok(queries::queue_depths(st, tenant)))
    }

    async fn load(&self, tenant: &str) -> Result<RunLoad, StoreError> {
        self.with(|st, _| Ok(queries::load(st, tenant)))
    }

    async fn logs(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError> {
        self.with(|st, _| Ok(queries::logs(st, tenant, id, skip, limit)))
    }
}

#[async_trait]
impl Events for MemoryStore {
    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        self.with(|st, now| waits::send_event(st, now, req))
    }
}

#[async_trait]
impl Deliveries for MemoryStore {
    async fn add_deliveries(&self, d: Vec<notify::Delivery>) -> Result<(), StoreError> {
        self.with(|st, _| deliveries::add(st, d));
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<notify::Delivery>, StoreError> {
        Ok(self.with(|st, now| deliveries::claim(st, now, limit, lease_ms)))
    }

    async fn record_try(&self, tried: notify::DeliveryTry) -> Result<(), StoreError> {
        self.with(|st, now| deliveries::record_try(st, now, tried));
        Ok(())
    }

    async fn deliveries(
        &self,
        tenant: &str,
        run: &str,
    ) -> Result<Vec<notify::Delivery>, StoreError> {
        Ok(self.with(|st, _| deliveries::of_run(st, tenant, run)))
    }
}

#[async_trait]
impl Feed for MemoryStore {
    async fn listen_feed(&self, tenant: &str, until: Millis) -> Result<(), StoreError> {
        self.with(|st, _| feed::listen(st, tenant, until));
        Ok(())
    }

    async fn feed(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<wasq_core::feed::FeedPage, StoreError> {
        self.with(|st, _| feed::read(st, tenant, after, limit))
    }
}

#[async_trait]
impl Workers for MemoryStore {
    async fn beat(&self, beat: WorkerBeat) -> Result<(), StoreError> {
        self.with(|st, _| st.workers.insert(beat.id.clone(), beat));
        Ok(())
    }

    async fn leave(&self, id: &str) -> Result<(), StoreError> {
        self.with(|st, _| st.workers.remove(id));
        Ok(())
    }

    async fn workers(&self, since: Millis) -> Result<Vec<WorkerBeat>, StoreError> {
        Ok(self.with(|st, _| {
            st.workers
                .values()
                .filter(|w| w.seen_at >= since)
                .take(wasq_core::workers::MAX_WORKERS_LISTED)
                .cloned()
                .collect()
        }))
    }
}

#[async_trait]
impl Retention for MemoryStore {
    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        self.with(|st, now| Ok(storage::purge(st, now, req)))
    }
}

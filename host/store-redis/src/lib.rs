//! wasq-store-redis: the Redis [`Store`], for servers and workers on many machines that
//! share one Redis 7.0+ (or Valkey) node or a Redis Cluster.
//!
//! # Key decision
//!
//! Every state transition is one Lua script (`scripts.rs`; a function of one library
//! loaded with `FUNCTION LOAD`, reloaded by the store when a Redis lost it) over the keys
//! of one tenant, and every key of a tenant carries the hash tag `{tenant}`: a tenant's
//! keys share a Cluster slot, each transition is atomic, and tenants spread over the
//! shards.
//! Time always comes from the injected [`Clock`] as a script argument (never Redis `TIME`),
//! and nothing depends on Redis key expiry, so the conformance suite drives this backend
//! with a manual clock like any other. Scripts keep scalar fields (status, attempt, lease
//! token, due time, ...) that they read and update, and copy JSON blobs without parsing
//! them; Rust builds `Run`s and `Function`s from the hashes.
//!
//! Things that need more than one tenant go through a small global schedule: every tenant
//! script computes the tenant's *next due time* (earliest of its ready runs, lease expiries
//! and wait timeouts) and publishes it into the `due` zset, and pushes wake-up tokens when
//! it made runs claimable (or its due time earlier). The published time is never later
//! than the truth, but may be earlier: a call that can only have moved a future due time
//! later (an end or a renewal of the run whose lease set it) leaves it, and the visit it
//! causes finds nothing and publishes the truth (`publish.lua`). On a Cluster the global keys live in
//! another slot, so the tenant script only returns these values and the store applies
//! them with a second script that keeps the newest update per tenant (a per-tenant
//! sequence number); a claim every minute republishes every tenant, repairing updates
//! lost to a crash between the two calls. On a single node there are no slots, and the
//! tenant script updates the global keys itself: one round trip per transition.
//!
//! `claim` visits only the tenants due now, rotating the first tenant and splitting the
//! batch limit evenly among them, so a tenant's backlog of 100k runs cannot hold back
//! another tenant's single run. Under a backlog the tenant the previous claim left first
//! in line is visited together with the read of the schedule (one round trip per claim,
//! not two); a tenant that became due meanwhile is then visited by that claim or first
//! by the next one.
//!
//! Flow control ([`wasq_core::flow`]) lives in the tenant scripts too, so it holds across
//! any number of workers. Rust evaluates a run's keys into *gates* at enqueue (the script
//! checks the function's settings blob is the one they were computed from, else answers
//! `stale` and Rust recomputes); Lua only compares strings and numbers. A due run moves
//! from `ready` (by due time) into the lane `q` (by rank = due time + priority offset);
//! the claim takes the lane's best run whose gates let it start, and *parks* a run whose
//! concurrency key is full (`crun:<gate>` holds that key's running runs) or whose throttle
//! window is full (`win:<gate>`, the last N start times) in `park:<gate>`. A concurrency
//! slot freed (any move out of `running`) lets the best parked run back into the lane; a
//! throttle gate's timer (`gtimer`) does the same when its window opens. Parked runs are
//! not "due", so a tenant whose runs are all held back is not visited by idle workers. The
//! tenant's `max_running` (in its `meta`) caps the claim; `max_queued` is checked against
//! the count of queued runs (`nq`) at enqueue. `wait_for_work` sleeps until the earliest
//! due time by the host's own timer (not Redis's `hz` tick), or until a wake-up token
//! arrives: one listener task per store BLPOPs the wake list on its own connection while
//! anybody in the process waits, and hands back a token that arrives after everybody
//! stopped waiting. A token names the tenant whose runs became due: the claim after the
//! wait visits it together with its read of the schedule.
//!
//! Event filters (`wait-for-event ... if`) are evaluated in Rust with
//! [`wasq_core::event_matches`], so the semantics are exactly those of every other
//! backend: the send-event script first returns the waiters and a version of the event's
//! waiter set, and the second call applies the matches only if no waiter registered in
//! between (otherwise it returns the fresh waiters and the store matches again).
//!
//! # What it is not
//!
//! Not a cache: it needs `maxmemory-policy noeviction` and AOF for durability
//! ([`RedisStore::startup_warnings`] says so). It does not use Sentinel, TLS, streams,
//! pub/sub or Redis 7.4+ commands (no hash-field TTL). A failover with asynchronous
//! replication can lose the last acknowledged writes, as with any Redis queue.
//!
//! # Code layout
//!
//! `lib.rs` holds the store's shape (options, connection, the script call and the publish
//! of due times), this key layout and the one `Store` impl, whose methods delegate to the
//! module of their area: `admission` (enqueue; `coalesce` sends the enqueues that arrive
//! while one is on its way together, each answered as alone), `claim` (claims, renewals,
//! waiting for work), `attempt` (record, finish, cancel, retry), `events`, `queries`
//! (reads, purge), `functions`, `health`; `transition` encodes core's transitions for
//! the scripts in `lua/` (`scripts.rs`); `decode` reads replies, `conn` holds the
//! connection and the wake-up listener. The key layout table is why this file is over
//! 600 lines.
//!
//! # Key layout
//!
//! `N` is the namespace (default `wasq`), `T` the tenant with `%`, `{` and `}`
//! percent-encoded. `P = N:{T}:` prefixes every key of a tenant (one slot per tenant);
//! `G = N:g:{N}:` prefixes the global keys (one slot). User-provided names (run ids,
//! function and event names) are always the last part of a key, so they cannot reach a
//! key of another family.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `N:component:<digest>` | string | component bytes, content-addressed, `SET NX` |
//! | `G tenants` | set | every tenant that deployed a function (for purge and sweeps) |
//! | `G components` | set | digests of deployed components (what `collect_components` may delete) |
//! | `G due` | zset | tenant → its next due time (the global schedule), for tenants with only the default queue |
//! | `G dueq` | zset | the same for tenants with named queues (`P meta` `mq`) |
//! | `G due:<queue>` | zset | tenant with named queues → the next due time of that queue (0 while its lane holds runs, else the tenant's next maintenance: a run becoming due, a lease expiring, a wait timing out, a throttle opening). Workers taking every queue read `due` and `dueq`; a worker naming queues reads each one's `due:<queue>`, and `due` for `default` |
//! | `G dlv` | zset | tenant → its earliest pending webhook delivery's due time (see `deliveries.rs`) |
//! | `G seq` | hash | tenant → sequence number of the last applied `due` update (Cluster) |
//! | `G wake` | list | wake-up tokens for `wait_for_work` (BLPOP), each the name of the tenant that published it ('1' from older versions: none), at most 64 |
//! | `G wake:<queue>` | list | the same for workers naming the queue (tenants with named queues): one per run that entered its lane, one when its due time came earlier |
//! | `P meta` | hash | `next` (last published due time), `seq` (its sequence number, on Cluster); with named queues `mq` = 1 and `next:<queue>` (each queue's); `feed`: the tenant feed is recorded until then; `crons` = 1 once `crons` is complete; the quotas the scripts enforce (`max_running`, `max_queued`, the storage quotas, mirrored by `directory.rs`; `qm` = 1 once they are here: an older wasq kept them in `P quotas`, which the first script that needs them moves here), read with `next`, `mq` and `feed` in one `HMGET`; for the purge, `pc:<status>` (where its walk of `st:<status>` resumes) and `noall`, `norun`, `noended` (an older wasq's indexes are dropped) |
//! | `P fn:<name>` | hash | name, digest, size_bytes, settings JSON, sv (its version: 16 hex of the SHA-1 of `digest\nsettings`), svd (`1`: `sv` names the component too; absent for a function deployed before, whose next enqueue gives it such a version), max_attempts, queue (absent: `default`), events JSON, schedule JSON, created_at, updated_at |
//! | `P queues` | set | the tenant's queues besides `default` (named by deploys; it only grows) |
//! | `P qload` | hash | `<queue>\|queued`, `<queue>\|running` → runs of a named queue (the default queue's are the rest of the tenant's: `nq` and `st:queued`, `leases`) |
//! | `P fns` | set | function names |
//! | `P crons` | set | the functions with a schedule (kept by deploys: the cron scheduler reads their schedules each second, and no other function); `meta.crons` marks it complete (built once from `fns` for a tenant deployed before it) |
//! | `P sub:<event>` | set | functions started by the event |
//! | `P sets` | hash | settings version → `digest\nsettings JSON` (versions from before they named the component: the settings JSON alone): a run pins its function's component and settings by version, so each version is stored once (deleted by `collect_components` once no run or function has it) |
//! | `P run:<id>` | hash | function, sv (the settings version it pins, which names its component; runs of versions from before that also hold the digest, runs from before versions hold `settings` JSON and the digest instead), retry (override JSON), max_attempts (with manual-retry grants), status, input (when at most 64 bytes; up to 8 × 64 bytes in pieces `in1`..`in8`, last), output, error JSON, attempt, trigger, progress JSON, created_at, updated_at, due_at, finished_at, idempotency_key, parent, trace (the W3C traceparent of what created it), wait JSON, priority, keys JSON; bookkeeping: lease_token (the fence; a lease's expiry is its score in `leases`, its worker in the open execution in `att:`; runs an older wasq leased also hold lease_expires_at and worker), cancel_requested, resumed, nosteps (`1` at creation, deleted or set to `0` by the first step: a claim skips the step keys while it is `1`), wait_step, wait_event, wait_ver, wait_run, resolution (what waiters on it receive once it ended); flow: rank_offset, cgate + climit, tgate + tlimit + tperiod, dgate, parked (the gate it waits on); qu (its queue, absent for `default`); up (the hash is no longer packed: see `UNPACK_COST`). The id and tenant are the key's (runs written before also kept them here); attempt, lease_token, resumed, cancel_requested, rank_offset and priority are absent while `0`, trigger while `api`, updated_at until the first transition (it is created_at until then) |
//! | `P in:<id>` | string | the run's input when it is over 8 × 64 bytes (runs written before the pieces: over 64), so that the hash stays packed |
//! | `P att:<id>` | list | executions: `number\|started_at\|worker JSON`, then `\n finished_at\|fuel\|suspended_until\|error JSON` once ended |
//! | `P steps:<id>` | hash | `occurrence:name` → step output (first write wins); `#` → the first step's order entry (below): a run of one step has this key alone for its steps |
//! | `P stepseq:<id>` | list | `attempt\|completed_at\|occurrence:name`, in completion order, of the steps after the first (made by the second; runs whose first step an older wasq stored have it here too, and no `#`) |
//! | `P logs:<id>` | list | log lines (JSON) |
//! | `P ready` | zset | queued and sleeping runs not yet due, by due time |
//! | `P dlv:<id>` | hash | a webhook delivery: run, url, event, payload, status, tries, next_at, token, last_error, created_at, updated_at |
//! | `P dlvq` | zset | pending deliveries by due time |
//! | `P feed` | stream | the tenant feed while listened to (`meta.feed`: until when): `r` run, `f` function, `s` status, `a` attempt, `t` time; at least the last 10,000 |
//! | `P dlvrun:<run>` | list | the run's delivery ids, in the order added (deleted with the run) |
//! | `P q`, `P q:<queue>` | zset | the lanes of the default queue and of each named one: due queued and sleeping runs by rank (ties: id, i.e. creation order) |
//! | `P park:<gate>` | zset | due runs a gate holds back, by rank |
//! | `P crun:<gate>` | set | running runs of a concurrency key |
//! | `P win:<gate>` | list | a throttle's last starts / a rate limit's last accepted runs (times, newest first, at most the limit) |
//! | `P gtimer`, `P tcfg` | zset, hash | throttle gates with parked runs by when their window opens; their `limit\|period` |
//! | `P deb` | hash | debounce gate → its pending run |
//! | `P rdig` | hash | `\|sv` (a settings version, which names the component; older runs: `digest\|sv`, or the digest alone) → runs that pin them (each run counts itself in; `meta.rdig` marks it complete: set by a deploy while the tenant has no runs, else built once from the runs) |
//! | `P leases` | zset | running runs by lease expiry (where a lease keeps its expiry): also their status index; and `LEASE_PIN` at `+inf`, which keeps it a skiplist (counts and heads leave it out) |
//! | `P timeouts` | zset | waiting runs with a time limit, by that limit |
//! | `P qfn:<function>` | zset | queued runs of a function by creation time: a queued run is in this index alone besides its lane, `ready` or `park:` (one entry less per run of a backlog, ~150 B) |
//! | `P nq` | string | the tenant's queued runs (for `max_queued`) plus one, tallied by each script call and written once; absent for a tenant from before it, whose first call that changes it counts them from the indexes |
//! | `P byfn:<function>` | zset | runs of a function by creation time, in any status but queued |
//! | `P st:<status>` | zset | runs in a status by creation time, for every status but queued and running (`st:queued` holds runs queued before `qfn:`, until they leave the status; a running run's index is its lease, and `st:running`, which an older wasq kept, goes at the tenant's first purge); between them, `leases` and the `qfn:` indexes, every run: an unfiltered listing merges them, running runs ordered by their ids (which begin with their creation time) |
//! | `P kids:<parent>` | zset | child runs by creation time |
//! | `P ended:ok`, `P ended:bad` | zset | an older wasq's index of ended runs by finish time, for the purge; a tenant's first purge since drops them (`meta.noended`): the purge finds ended runs through `st:<status>` (from a cursor, `meta.pc:<status>`) |
//! | `P idem:<function>` | hash | idempotency key → `created_at:run id` |
//! | `P events`, `P evz` | hash, zset | event id → time first seen (dedup window), and the same by time for clean-up |
//! | `P waiters:<event>` | set | runs waiting for an event of that name |
//! | `P waitver` | hash | event name → version, incremented by every new waiter |
//! | `P rw:<id>` | set | runs waiting for run `id` to end |

mod admission;
mod attempt;
mod claim;
mod coalesce;
mod conn;
mod decode;
mod deliveries;
mod directory;
mod events;
mod feed;
mod functions;
mod health;
mod mpack;
mod queries;
mod scripts;
#[cfg(feature = "testing")]
pub mod testing;
mod transition;
mod workers;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{Cmd, FromRedisValue, Value};
use wasq_core::flow::{FlowPlan, Gate};
use wasq_core::lifecycle::{self, Admission};
use wasq_core::*;

use admission::{Debounced, flow_args};
use attempt::FinishReply;
use attempt::storage_refusal;
use conn::{AnyConn, BlockSource, Wake, redis_err, timed_out};
use decode::{array, corrupt, hash, int, string};
use scripts::TenantScript;

/// How a [`RedisStore`] connects; every field has a default.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Prefix of every key. Stores with different namespaces share nothing.
    pub namespace: String,
    /// How long one call may wait for Redis before failing with `Unavailable`.
    pub op_timeout: Duration,
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
    /// Whether a claim's reading of a run spares its end the same reads (see
    /// `attempt::Memos`); on by default. Off, every end reads its run whole, as an end
    /// of a lease another process claimed does: the conformance suite runs both ways.
    pub lease_memos: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            namespace: "wasq".into(),
            op_timeout: Duration::from_millis(1500),
            connect_timeout: Duration::from_secs(1),
            lease_memos: true,
        }
    }
}

impl StoreOptions {
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }
}

/// The Redis backend of [`Store`]; cheap to clone (clones share connections).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: AnyConn,
    cluster: bool,
    clock: Arc<dyn Clock>,
    ns: String,
    /// Prefix of the global keys.
    global: String,
    op_timeout: Duration,
    wake: Arc<Wake>,
    /// The listeners of workers that name queues, by their queues (comma-separated).
    queue_wakes: std::sync::Mutex<std::collections::HashMap<String, Arc<Wake>>>,
    block_source: conn::BlockSource,
    connect_timeout: Duration,
    /// Rotates the tenant a claim starts with.
    cursor: AtomicUsize,
    /// By queue list ('' for every queue): when a claim that filled its limit ended (the
    /// clock's ms), the tenant it left first in line and how many it left (see
    /// `claim_queue`).
    next_up: std::sync::Mutex<std::collections::HashMap<String, (i64, String, usize)>>,
    /// Cluster: when every tenant's hint was last republished.
    last_sweep: std::sync::Mutex<Option<Instant>>,
    /// Cluster: a hint update failed; republish every tenant at the next claim.
    sweep_needed: AtomicBool,
    /// When unreferenced components were last collected (see `collect_components`).
    last_collect: std::sync::Mutex<Option<Instant>>,
    /// Functions' settings (by `fn:` key), from which enqueue computes the flow
    /// arguments; the scripts compare the version and answer `stale` when it changed.
    settings: std::sync::Mutex<std::collections::HashMap<String, Arc<FnSettings>>>,
    /// Runs' settings, parsed, by version (see `decode::SettingsCache`).
    parsed: decode::SettingsCache,
    /// Sends concurrent enqueues together (`coalesce.rs`); started by the first.
    coalescer: std::sync::OnceLock<coalesce::Coalescer>,
    /// What this process's claims read of each run they leased, for the lease's end (see
    /// `attempt::Memos`).
    memos: attempt::Memos,
}

/// A function's settings as stored, and parsed.
struct FnSettings {
    /// Its version (`sv`), which the run pins.
    version: String,
    settings: FunctionSettings,
}

/// Settings blobs cached at most (then the cache starts over).
const SETTINGS_CACHE_MAX: usize = 10_000;

/// How often a purge also collects unreferenced components, at most.
const COLLECT_EVERY: Duration = Duration::from_secs(600);
/// A component nobody read or wrote for this long, and nothing refers to, is deleted.
const COLLECT_MIN_IDLE: Duration = Duration::from_secs(3600);

/// What each record costs besides the bytes stored whole (see `wasq_core::storage`), as
/// `MEMORY USAGE ... SAMPLES 0` counts the tenant's keys on Redis 7 (jemalloc, 64-bit):
/// the hash fields, list entries and index entries around the payload. The scripts add
/// each payload rounded as Redis allocates it (`mem` in `scripts.rs`) and the length of
/// key names. Measured with `cargo bench -p wasq-bench --bench storage_cost`: N records of
/// each kind of known payload through the real daemon, the growth of the tenant's keys
/// divided by N, with a tenant past the sizes where Redis packs small collections (128
/// entries), so every index is a skiplist or hashtable (a smaller tenant is overcounted a
/// little; `tests/tests/storage_usage.rs` checks a mixed workload within 10%):
/// - `run`: the run's hash while packed (about 15 small fields: ~480 bytes, 70 fewer
///   since a run pins its component by its settings version instead of a digest; see
///   `UNPACK_COST` for one that is not), its entries in `byfn:` and `st:` (~130 bytes
///   each, the zset's hash table included), and its `att:` list's key (~250 bytes:
///   nearly every run runs). 170 fewer since 2026-12-07: ended runs are no longer
///   indexed by finish time too (`ended:`), and a first claim no longer writes `resumed`
///   (measured again: a tiny ended run counted 946 B for 932 actual, the mixed workload of
///   `storage_usage.rs` +0.7%);
/// - `attempt`: one entry of `att:` besides the worker name and error it holds;
/// - `step`: the field in `steps:` and its order entry (in `stepseq:`, or for a run's
///   first step in `steps:` as `#`; ~30 bytes while the hash is packed, ~75 once a step
///   output over 64 bytes or the 129th step unpacks it);
/// - `log_line`: a list entry (the line is charged at its JSON length);
/// - `event`: the id's entries in `events` and `evz` (~230 bytes with a 36-byte id);
/// - `function`: its `fn:` hash (settings included), its entries in `fns` and `sub:`, and
///   its component's key.
pub(crate) const COST: CostModel = CostModel {
    run: 790,
    attempt: 50,
    step: 40,
    log_line: 5,
    event: 160,
    function: 1_100,
};
/// A run's own key (its `logs:`, `steps:` or `stepseq:`: the key's entry, name and an
/// empty list or hash), charged when the run's first line, first step or second step
/// creates it, besides the key name's prefix.
pub(crate) const KEY_COST: u64 = 135;
/// A member kept in every tenant's `leases` (score `+inf`) so that Redis never packs it:
/// a zset stays a listpack while it holds at most 128 members of at most 64 bytes
/// (`zset-max-listpack-*`), and a listpack is scanned whole at each insert — the
/// `leases` of a worker at concurrency 50 held about 100, and each claim's insert cost
/// ~26k instructions, about 5% of a drained run's; a skiplist's costs ~2k. Longer than 64
/// bytes, and not an id (ids are hex digits and dashes): no reader takes it for a run.
pub(crate) const LEASE_PIN: &str =
    "~ a member longer than 64 bytes: keeps this zset a skiplist (see LEASE_PIN) ~";
/// What a run's hash costs once it is a hash table rather than packed: Redis keeps a hash
/// as a listpack while every value is at most 64 bytes (`hash-max-listpack-value`), and
/// converts it for good at the first longer one (an input, output or error over 64
/// bytes). Measured with the storage_cost bench (tiny runs against runs with 1, 10 and
/// 100 KB inputs and outputs).
pub(crate) const UNPACK_COST: u64 = 820;
/// An input over 8 × 64 bytes kept in its own key, `in:<id>` (so the run's hash stays
/// packed): the key's entry, its name besides the tenant's prefix, and the string's
/// headers. (Up to that, it is kept in the hash in pieces of 64 bytes, `in1`..`in8`,
/// about 8 bytes each beyond the input.)
pub(crate) const INPUT_KEY_COST: u64 = 90;
/// A settings version's entry in `sets` besides its blob (a hash-table entry: the field,
/// its 16-byte name, the value's header).
pub(crate) const SET_COST: u64 = 56;
/// Times a transition is retried after its script found the function's settings changed.
const STALE_RETRIES: usize = 16;

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.inner.ns)
            .field("cluster", &self.inner.cluster)
            .finish_non_exhaustive()
    }
}

/// Script arguments as bytes.
struct Args(Vec<Vec<u8>>);

impl Args {
    fn new() -> Self {
        Args(Vec::new())
    }
    fn s(mut self, v: impl AsRef<str>) -> Self {
        self.0.push(v.as_ref().as_bytes().to_vec());
        self
    }
    fn b(mut self, v: impl Into<Vec<u8>>) -> Self {
        self.0.push(v.into());
        self
    }
    fn n(mut self, v: impl std::fmt::Display) -> Self {
        self.0.push(v.to_string().into_bytes());
        self
    }
    fn opt_n(self, v: Option<impl std::fmt::Display>) -> Self {
        match v {
            Some(v) => self.n(v),
            None => self.s(""),
        }
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Internal(e.to_string()))
}

/// A tenant name as it appears inside the `{...}` hash tag.
fn encode_tenant(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    for c in t.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

enum Target {
    Single(String),
    Cluster(Vec<String>),
}

fn parse_target(target: &str) -> Result<Target, StoreError> {
    if let Some(rest) = target.strip_prefix("redis+cluster://") {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((a, h)) => (format!("{a}@"), h),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let nodes: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{auth}{h}"))
            .collect();
        if nodes.is_empty() {
            return Err(StoreError::Internal(format!(
                "no cluster nodes in {target:?}: expected redis+cluster://host:port,host:port"
            )));
        }
        Ok(Target::Cluster(nodes))
    } else {
        Ok(Target::Single(target.to_owned()))
    }
}

fn config_err(e: redis::RedisError) -> StoreError {
    StoreError::Internal(format!("invalid Redis target: {e}"))
}

impl RedisStore {
    /// Connects to `redis://host:port[/db]` (one node; the connection reconnects by
    /// itself) or `redis+cluster://host1:port1,host2:port2,...` (a Redis Cluster), with
    /// the default namespace `wasq`.
    pub async fn connect(target: &str, clock: Arc<dyn Clock>) -> Result<RedisStore, StoreError> {
        Self::connect_with(target, clock, StoreOptions::default()).await
    }

    pub async fn connect_with(
        target: &str,
        clock: Arc<dyn Clock>,
        opts: StoreOptions,
    ) -> Result<RedisStore, StoreError> {
        if opts.namespace.is_empty() || opts.namespace.contains(['{', '}']) {
            return Err(StoreError::Internal(format!(
                "invalid namespace {:?}: must be non-empty, without braces",
                opts.namespace
            )));
        }
        let (conn, cluster, source) = match parse_target(target)? {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(config_err)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(opts.connect_timeout))
                    .set_response_timeout(Some(opts.op_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500));
                let manager = tokio::time::timeout(
                    opts.op_timeout + opts.connect_timeout,
                    ConnectionManager::new_with_config(client.clone(), config),
                )
                .await
                .map_err(|_| timed_out(opts.op_timeout + opts.connect_timeout))?
                .map_err(redis_err)?;
                (
                    AnyConn::Manager(manager),
                    false,
                    BlockSource::Single(client),
                )
            }
            Target::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(opts.connect_timeout)
                    .response_timeout(opts.op_timeout)
                    .retries(2)
                    .build()
                    .map_err(config_err)?;
                let conn = tokio::time::timeout(
                    opts.op_timeout + opts.connect_timeout,
                    client.get_async_connection(),
                )
                .await
                .map_err(|_| timed_out(opts.op_timeout + opts.connect_timeout))?
                .map_err(redis_err)?;
                // Blocking reads: no response timeout (BLPOP answers after its own).
                let blocking = ClusterClient::builder(nodes)
                    .connection_timeout(opts.connect_timeout)
                    .retries(1)
                    .build()
                    .map_err(config_err)?;
                (
                    AnyConn::Cluster(conn),
                    true,
                    BlockSource::Cluster(Box::new(blocking)),
                )
            }
        };
        let ns = opts.namespace.clone();
        let global = format!("{ns}:g:{{{ns}}}:");
        let wake = Wake::new(
            source.clone(),
            vec![format!("{global}wake")],
            opts.connect_timeout,
        );
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                cluster,
                clock,
                global,
                ns,
                op_timeout: opts.op_timeout,
                wake: Arc::new(wake),
                queue_wakes: std::sync::Mutex::new(std::collections::HashMap::new()),
                block_source: source,
                connect_timeout: opts.connect_timeout,
                cursor: AtomicUsize::new(0),
                next_up: Default::default(),
                last_sweep: std::sync::Mutex::new(None),
                last_collect: std::sync::Mutex::new(None),
                sweep_needed: AtomicBool::new(false),
                settings: Default::default(),
                parsed: Default::default(),
                coalescer: Default::default(),
                memos: attempt::Memos::new(opts.lease_memos),
            }),
        };
        let _: String = store.query(&redis::cmd("PING")).await?;
        Ok(store)
    }

    /// The namespace every key starts with.
    pub fn namespace(&self) -> &str {
        &self.inner.ns
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// The prefix of every key of `tenant` (`namespace:{tenant}:`), for tools and tests
    /// that inspect the keyspace.
    pub fn tenant_prefix(&self, tenant: &str) -> String {
        format!("{}:{{{}}}:", self.inner.ns, encode_tenant(tenant))
    }

    fn now(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    fn g(&self, key: &str) -> String {
        format!("{}{key}", self.inner.global)
    }

    /// Awaits one Redis call, bounded by the store's operation timeout.
    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.op_timeout, call).await {
            Ok(r) => r.map_err(redis_err),
            Err(_) => Err(timed_out(self.inner.op_timeout)),
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let mut c = self.inner.conn.clone();
        self.timed(cmd.query_async(&mut c)).await
    }

    /// Runs a tenant script; returns its status word and the rest of its reply.
    async fn script(
        &self,
        script: &TenantScript,
        tenant: &str,
        args: Args,
    ) -> Result<(String, Vec<Value>), StoreError> {
        self.script_at(script, tenant, self.now(), args).await
    }

    /// [`Self::script`] at a given time: a script that creates runs runs at the time their
    /// ids were minted with, which becomes their `created_at` (see `wasq_core::ids`).
    async fn script_at(
        &self,
        script: &TenantScript,
        tenant: &str,
        now: i64,
        args: Args,
    ) -> Result<(String, Vec<Value>), StoreError> {
        let prefix = self.tenant_prefix(tenant);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(scripts::LIBRARY.function(script))
            .arg(1)
            .arg(format!("{prefix}meta"))
            .arg(&prefix)
            .arg(if self.inner.cluster {
                ""
            } else {
                &self.inner.global
            })
            .arg(now)
            .arg(tenant);
        for a in &args.0 {
            cmd.arg(a.as_slice());
        }
        let mut c = self.inner.conn.clone();
        let call = tokio::time::timeout(self.inner.op_timeout, cmd.query_async(&mut c));
        let reply: Value = match call.await {
            Ok(Err(e)) if scripts::is_missing_function(&e) => {
                self.load_library().await?;
                self.timed(cmd.query_async(&mut c)).await?
            }
            Ok(r) => r.map_err(redis_err)?,
            Err(_) => return Err(timed_out(self.inner.op_timeout)),
        };
        let mut items = array(reply)?.into_iter();
        let status = string(items.next().ok_or_else(|| corrupt("empty script reply"))?)?;
        Ok((status, items.collect()))
    }

    /// Loads the tenant scripts' library (on every primary of a cluster). Loading it
    /// again is harmless: the same source replaces itself.
    async fn load_library(&self) -> Result<(), StoreError> {
        tracing::debug!("loading the scripts' function library into Redis");
        self.query::<Value>(
            redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(&scripts::LIBRARY.source),
        )
        .await?;
        Ok(())
    }

    /// Cluster: applies what a tenant script published (next due time, wake-ups) to the
    /// global keys. A failure is logged, not returned: the transition itself committed,
    /// and the next claim republishes every tenant.
    async fn publish(&self, tenant: &str, published: Value) {
        if matches!(published, Value::Nil) || !self.inner.cluster {
            return;
        }
        let result = async {
            let mut p = array(published)?.into_iter();
            let mut next = || p.next().ok_or_else(|| corrupt("short publish reply"));
            let (seq, due, wake) = (int(next()?)?, string(next()?)?, int(next()?)?);
            let mut inv = scripts::HINT.prepare_invoke();
            inv.key(self.g("due"))
                .arg(&self.inner.global)
                .arg(tenant)
                .arg(seq)
                .arg(due)
                .arg(wake);
            // Each queue's (name, next due, runs added to its lane).
            for v in p {
                match v {
                    Value::Int(n) => inv.arg(n),
                    other => inv.arg(string(other)?),
                };
            }
            let mut c = self.inner.conn.clone();
            self.timed(inv.invoke_async::<Value>(&mut c))
                .await
                .map(drop)
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(tenant, error = %e, "could not publish a tenant's schedule; will resweep");
            self.inner.sweep_needed.store(true, Ordering::Relaxed);
        }
    }

    /// The first element of a transition's reply is what it published.
    async fn published(&self, tenant: &str, rest: &mut Vec<Value>) -> Result<(), StoreError> {
        if rest.is_empty() {
            return Err(corrupt("reply without publish element"));
        }
        let published = rest.remove(0);
        self.publish(tenant, published).await;
        Ok(())
    }

    /// The run of a `run_fields` reply of `tenant` (`output` stands in for a left-out
    /// output).
    async fn run_from(
        &self,
        tenant: &str,
        v: Value,
        output: Option<Vec<u8>>,
    ) -> Result<Run, StoreError> {
        let fields =
            decode::RunFields::new(v)?.ok_or_else(|| corrupt("run reply for a missing run"))?;
        self.load_settings(tenant, std::slice::from_ref(&fields))
            .await?;
        fields.run(&self.inner.parsed, output)
    }

    /// Reads the settings versions these runs pin that are not cached yet (one HMGET of
    /// `sets`; usually none: a worker meets each version once).
    async fn load_settings(
        &self,
        tenant: &str,
        runs: &[decode::RunFields],
    ) -> Result<(), StoreError> {
        let mut missing: Vec<&[u8]> = runs
            .iter()
            .filter_map(|r| r.unloaded_version(&self.inner.parsed))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(format!("{}sets", self.tenant_prefix(tenant)));
        for v in &missing {
            cmd.arg(*v);
        }
        let blobs: Vec<Option<Vec<u8>>> = self.query(&cmd).await?;
        for (version, blob) in missing.iter().zip(blobs) {
            let blob = blob.ok_or_else(|| {
                corrupt(format!(
                    "settings version {} missing",
                    String::from_utf8_lossy(version)
                ))
            })?;
            self.inner
                .parsed
                .insert(version, decode::Pinned::parse(&blob)?);
        }
        Ok(())
    }

    async fn tenants(&self) -> Result<Vec<String>, StoreError> {
        let mut tenants: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("tenants")))
            .await?;
        tenants.sort();
        Ok(tenants)
    }
}

#[async_trait]
impl Registry for RedisStore {
    async fn deploy(&self, req: DeployRequest) -> Result<Function, StoreError> {
        self.deploy_function(req).await
    }

    async fn function(&self, tenant: &str, name: &str) -> Result<Option<Function>, StoreError> {
        self.read_function(tenant, name).await
    }

    async fn functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError> {
        self.list_functions(tenant).await
    }

    async fn schedules(&self, tenant: &str) -> Result<Vec<Scheduled>, StoreError> {
        self.list_schedules(tenant).await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_component(digest).await
    }
}

#[async_trait]
impl Queue for RedisStore {
    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        let coalescer = self
            .inner
            .coalescer
            .get_or_init(|| coalesce::Coalescer::spawn(Arc::downgrade(&self.inner)));
        match coalescer.enqueue(req).await {
            Ok(answer) => answer,
            // Its task is gone (its runtime stopped): this enqueue goes alone.
            Err(req) => {
                let tenant = req.tenant.clone();
                let mut answers = self.admit_runs(&tenant, vec![req]).await;
                answers
                    .pop()
                    .unwrap_or_else(|| Err(corrupt("an enqueue went unanswered")))
            }
        }
    }

    async fn enqueue_batch(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Enqueued>, StoreError> {
        self.admit_batch(reqs).await
    }

    async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError> {
        self.claim_runs(req).await
    }

    async fn renew(&self, leases: &[Lease], lease_ms: u64) -> Result<Renewal, StoreError> {
        self.renew_leases(leases, lease_ms).await
    }

    async fn record(&self, lease: &Lease, record: Record) -> Result<(), StoreError> {
        self.record_attempt(lease, record).await
    }

    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError> {
        let end = AttemptEnd {
            lease: lease.clone(),
            records: Vec::new(),
            outcome,
        };
        let reply = self.end_batch(vec![end], FinishReply::Run).await;
        let (run, output) = reply.into_iter().next().expect("one answer per end")?;
        self.run_from(&lease.tenant, run, output).await
    }

    async fn end_attempt(&self, lease: &Lease, outcome: Outcome) -> Result<RunStatus, StoreError> {
        let end = AttemptEnd {
            lease: lease.clone(),
            records: Vec::new(),
            outcome,
        };
        self.end_attempts(vec![end])
            .await
            .into_iter()
            .next()
            .expect("one answer per end")
    }

    async fn end_attempts(&self, ends: Vec<AttemptEnd>) -> Vec<Result<RunStatus, StoreError>> {
        let replies = self.end_batch(ends, FinishReply::Status).await;
        replies
            .into_iter()
            .map(|r| string(r?.0)?.parse().map_err(corrupt))
            .collect()
    }

    async fn wait_for_work(&self, max: Duration, queues: &[String]) -> Result<(), StoreError> {
        self.wait_for_due(max, queues).await
    }

    fn announces_work(&self) -> bool {
        true
    }
}

#[async_trait]
impl Runs for RedisStore {
    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError> {
        self.cancel_run(req).await
    }

    async fn retry(&self, req: RunAction) -> Result<Run, StoreError> {
        self.retry_run(req).await
    }

    async fn run_ids(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        self.ids_with_prefix(tenant, prefix, limit).await
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.run_detail(tenant, id).await
    }

    async fn steps(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError> {
        self.step_page(tenant, id, skip, limit).await
    }

    async fn step(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError> {
        self.step_record(tenant, id, name, occurrence).await
    }

    async fn runs(&self, q: RunQuery) -> Result<Vec<Run>, StoreError> {
        self.list_runs(q).await
    }

    async fn queue_depths(&self, tenant: &str) -> Result<Vec<QueueDepth>, StoreError> {
        self.read_queue_depths(tenant).await
    }

    async fn load(&self, tenant: &str) -> Result<RunLoad, StoreError> {
        self.read_load(tenant).await
    }

    async fn logs(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError> {
        self.log_page(tenant, id, skip, limit).await
    }
}

#[async_trait]
impl Events for RedisStore {
    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        self.deliver_event(req).await
    }
}

#[async_trait]
impl Retention for RedisStore {
    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        self.purge_ended(req).await
    }

    async fn capacity(&self) -> Result<Option<Capacity>, StoreError> {
        self.used_memory().await
    }
}

impl RedisStore {}

impl RedisStore {
    /// Recomputes and republishes the tenant's next due time (a claim visit that leases
    /// nothing), after something the scripts do not see changed, such as its quotas.
    pub(crate) async fn republish(&self, tenant: &str) -> Result<(), StoreError> {
        let req = ClaimRequest {
            worker: "republish".into(),
            limit: 0,
            lease_ms: 0,
            queues: Vec::new(),
        };
        self.claim_tenant(tenant, 0, &req, "", true).await.map(drop)
    }
}

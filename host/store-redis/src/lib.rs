//! wasq-store-redis: the Redis [`Store`], for servers and workers on many machines that
//! share one Redis 7.0+ (or Valkey) node or a Redis Cluster.
//!
//! # Key decision
//!
//! Every state transition is one Lua script (`scripts.rs`) over the keys of one tenant,
//! and every key of a tenant carries the hash tag `{tenant}`: a tenant's keys share a
//! Cluster slot, each transition is atomic, and tenants spread over the shards.
//! Time always comes from the injected [`Clock`] as a script argument (never Redis `TIME`),
//! and nothing depends on Redis key expiry, so the conformance suite drives this backend
//! with a manual clock like any other. Scripts keep scalar fields (status, attempt, lease
//! token, due time, ...) that they read and update, and copy JSON blobs without parsing
//! them; Rust builds `Run`s and `Function`s from the hashes.
//!
//! Things that need more than one tenant go through a small global schedule: every tenant
//! script computes the tenant's *next due time* (earliest of its ready runs, lease expiries
//! and wait timeouts) and publishes it into the `due` zset, and pushes wake-up tokens when
//! it made runs claimable (or its due time earlier). On a Cluster the global keys live in
//! another slot, so the tenant script only returns these values and the store applies
//! them with a second script that keeps the newest update per tenant (a per-tenant
//! sequence number); a claim every minute republishes every tenant, repairing updates
//! lost to a crash between the two calls. On a single node there are no slots, and the
//! tenant script updates the global keys itself: one round trip per transition.
//!
//! `claim` visits only the tenants due now, rotating the first tenant and splitting the
//! batch limit evenly among them, so a tenant's backlog of 100k runs cannot hold back
//! another tenant's single run.
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
//! tenant's `max_running` (`quotas`) caps the claim; `max_queued` is checked against
//! `st:queued` at enqueue. `wait_for_work` sleeps until the earliest due time by the
//! host's own timer (not Redis's `hz` tick), or until a wake-up token arrives: one
//! listener task per store BLPOPs the wake list on its own connection while anybody in
//! the process waits, and hands back a token that arrives after everybody stopped
//! waiting.
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
//! | `G due` | zset | tenant → its next due time (the global schedule) |
//! | `G seq` | hash | tenant → sequence number of the last applied `due` update (Cluster) |
//! | `G wake` | list | wake-up tokens for `wait_for_work` (BLPOP), at most 64 |
//! | `P meta` | hash | `next` (last published due time), `seq` (its sequence number) |
//! | `P fn:<name>` | hash | name, digest, size_bytes, settings JSON, max_attempts, events JSON, schedule JSON, created_at, updated_at |
//! | `P fns` | set | function names |
//! | `P sub:<event>` | set | functions started by the event |
//! | `P run:<id>` | hash | id, tenant, function, digest, settings JSON (pinned), retry (override JSON), max_attempts (with manual-retry grants), status, input, output, error JSON, attempt, trigger, progress JSON, created_at, updated_at, due_at, finished_at, idempotency_key, parent, wait JSON, priority, keys JSON; bookkeeping: lease_token, lease_expires_at, worker, cancel_requested, resumed, nosteps (set at creation, cleared by the first step: a claim skips the step keys), wait_step, wait_event, wait_ver, wait_run, resolution (what waiters on it receive once it ended); flow: rank_offset, cgate + climit, tgate + tlimit + tperiod, dgate, parked (the gate it waits on) |
//! | `P att:<id>` | list | executions: `number\|started_at\|worker JSON`, then `\n finished_at\|fuel\|suspended_until\|error JSON` once ended |
//! | `P steps:<id>` | hash | `occurrence:name` → step output (first write wins) |
//! | `P stepseq:<id>` | list | `attempt\|completed_at\|occurrence:name`, in completion order |
//! | `P logs:<id>` | list | log lines (JSON) |
//! | `P ready` | zset | queued and sleeping runs not yet due, by due time |
//! | `P q` | zset | the lane: due queued and sleeping runs by rank (ties: id, i.e. creation order) |
//! | `P park:<gate>` | zset | due runs a gate holds back, by rank |
//! | `P crun:<gate>` | set | running runs of a concurrency key |
//! | `P win:<gate>` | list | a throttle's last starts / a rate limit's last accepted runs (times, newest first, at most the limit) |
//! | `P gtimer`, `P tcfg` | zset, hash | throttle gates with parked runs by when their window opens; their `limit\|period` |
//! | `P deb` | hash | debounce gate → its pending run |
//! | `P quotas` | hash | `max_running`, `max_queued`, the storage quotas (see `directory.rs`) |
//! | `P rdig` | hash | component digest → runs that pin it (built once from the runs when missing: `meta.rdig`) |
//! | `P leases` | zset | running runs by lease expiry |
//! | `P timeouts` | zset | waiting runs with a time limit, by that limit |
//! | `P all` | zset | every run by creation time (listing) |
//! | `P byfn:<function>` | zset | runs of a function by creation time |
//! | `P st:<status>` | zset | runs in a status by creation time |
//! | `P kids:<parent>` | zset | child runs by creation time |
//! | `P ended:ok`, `P ended:bad` | zset | succeeded / failed and cancelled runs by finish time (purge) |
//! | `P idem:<function>` | hash | idempotency key → `created_at:run id` |
//! | `P events`, `P evz` | hash, zset | event id → time first seen (dedup window), and the same by time for clean-up |
//! | `P waiters:<event>` | set | runs waiting for an event of that name |
//! | `P waitver` | hash | event name → version, incremented by every new waiter |
//! | `P rw:<id>` | set | runs waiting for run `id` to end |

mod conn;
mod decode;
mod directory;
mod scripts;
#[cfg(feature = "testing")]
pub mod testing;
mod transition;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{Cmd, FromRedisValue, Script, Value};
use wasq_core::flow::{self, FlowPlan, Gate};
use wasq_core::lifecycle::{self, Admission};
use wasq_core::*;

use conn::{AnyConn, BlockSource, Wake, redis_err, timed_out};
use decode::{array, corrupt, hash, int, string};

/// How a [`RedisStore`] connects; every field has a default.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Prefix of every key. Stores with different namespaces share nothing.
    pub namespace: String,
    /// How long one call may wait for Redis before failing with `Unavailable`.
    pub op_timeout: Duration,
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            namespace: "wasq".into(),
            op_timeout: Duration::from_millis(1500),
            connect_timeout: Duration::from_secs(1),
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
    /// Rotates the tenant a claim starts with.
    cursor: AtomicUsize,
    /// Cluster: when every tenant's hint was last republished.
    last_sweep: std::sync::Mutex<Option<Instant>>,
    /// Cluster: a hint update failed; republish every tenant at the next claim.
    sweep_needed: AtomicBool,
    /// When unreferenced components were last collected (see `collect_components`).
    last_collect: std::sync::Mutex<Option<Instant>>,
    /// Functions' settings blobs (by `fn:` key), from which enqueue computes the flow
    /// arguments; the scripts compare the blob and answer `stale` when it changed.
    settings: std::sync::Mutex<std::collections::HashMap<String, Arc<FnSettings>>>,
    /// Runs' settings blobs, parsed (see `decode::SettingsCache`).
    parsed: decode::SettingsCache,
}

/// A function's settings as stored, and parsed.
struct FnSettings {
    blob: Vec<u8>,
    flow: FlowControl,
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
/// - `run`: the run's hash (about 25 small fields beside the payload: ~1,950 bytes),
///   its entries in `all`, `byfn:`, `st:` and `ended:` (~130 bytes each, the zset's hash
///   table included), and its `att:` list's key (~180 bytes: nearly every run runs);
/// - `attempt`: one entry of `att:` besides the worker name and error it holds;
/// - `step`: the field in `steps:` and the entry in `stepseq:` (~30 bytes while the hash
///   is packed, ~75 once a step output over 64 bytes or the 129th step unpacks it);
/// - `log_line`: a list entry (the line is charged at its JSON length);
/// - `event`: the id's entries in `events` and `evz` (~230 bytes with a 36-byte id);
/// - `function`: its `fn:` hash (settings included), its entries in `fns` and `sub:`, and
///   its component's key.
pub(crate) const COST: CostModel = CostModel {
    run: 2_350,
    attempt: 50,
    step: 40,
    log_line: 5,
    event: 160,
    function: 1_100,
};
/// A run's own key (its `logs:`, `steps:` or `stepseq:`: the key's entry, name and an
/// empty list or hash), charged when the run's first line or step creates it, besides
/// the key name's prefix.
pub(crate) const KEY_COST: u64 = 135;
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

/// Due tenants one claim considers at most.
const DUE_TENANTS_MAX: usize = 10_000;
/// Rounds of per-tenant claim calls one claim makes at most.
const CLAIM_ROUNDS_MAX: usize = 32;
/// Cluster: how often a claim republishes every tenant's next due time, repairing hints
/// lost when a process died between a transition and its hint update.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Runs fetched per page when listing.
const LIST_PAGE: usize = 200;

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
        let wake = Wake::new(source, format!("{global}wake"), opts.connect_timeout);
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                cluster,
                clock,
                global,
                ns,
                op_timeout: opts.op_timeout,
                wake: Arc::new(wake),
                cursor: AtomicUsize::new(0),
                last_sweep: std::sync::Mutex::new(None),
                last_collect: std::sync::Mutex::new(None),
                sweep_needed: AtomicBool::new(false),
                settings: Default::default(),
                parsed: Default::default(),
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

    /// Settings of the Redis server(s) that put wasq's data at risk, one sentence each:
    /// `maxmemory-policy` other than `noeviction`, or AOF off. Empty when all is well.
    /// A server that refuses CONFIG (renamed or disabled) yields a reminder instead.
    pub async fn startup_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        match self.config_get("maxmemory-policy").await {
            Ok(values) => {
                for v in values.into_iter().filter(|v| v != "noeviction") {
                    warnings.push(format!(
                        "Redis maxmemory-policy is {v}: when memory runs out Redis evicts keys, \
                         silently losing runs, leases and step outputs; set maxmemory-policy noeviction"
                    ));
                }
            }
            Err(e) => warnings.push(format!(
                "could not read Redis maxmemory-policy ({e}); it must be noeviction, or Redis \
                 may evict runs when memory runs out"
            )),
        }
        match self.config_get("appendonly").await {
            Ok(values) => {
                for v in values.into_iter().filter(|v| v != "yes") {
                    warnings.push(format!(
                        "Redis appendonly is {v} (AOF off): a Redis restart loses every run, \
                         lease and step output written since the last snapshot; set appendonly yes \
                         (with appendfsync everysec or always)"
                    ));
                }
            }
            Err(e) => warnings.push(format!(
                "could not read Redis appendonly ({e}); without AOF a Redis restart loses \
                 recent runs and step outputs"
            )),
        }
        warnings.dedup();
        warnings
    }

    /// The replies of `cmd` on every node (every master of a Cluster), flattened into
    /// their strings: map keys and values, array items, in order.
    async fn on_every_node(&self, cmd: Cmd) -> Result<Vec<String>, StoreError> {
        let value = match &self.inner.conn {
            AnyConn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let mut c = c.clone();
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                self.timed(c.route_command(cmd, routing)).await?
            }
            _ => self.query::<Value>(&cmd).await?,
        };
        // Whatever shape came back: one reply, or one per node (keyed by node).
        fn flatten(v: Value, out: &mut Vec<String>) {
            match v {
                Value::Array(items) | Value::Set(items) => {
                    items.into_iter().for_each(|v| flatten(v, out))
                }
                Value::Map(pairs) => pairs.into_iter().for_each(|(k, v)| {
                    flatten(k, out);
                    flatten(v, out)
                }),
                Value::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
                Value::VerbatimString { text, .. } => out.push(text),
                Value::SimpleString(s) => out.push(s),
                _ => {}
            }
        }
        let mut flat = Vec::new();
        flatten(value, &mut flat);
        Ok(flat)
    }

    /// `INFO memory` of every node, as raw text (node names in between are harmless: the
    /// callers look for `name:value` lines).
    async fn memory_info(&self) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("memory");
        self.on_every_node(cmd).await
    }

    /// The value of a setting on every node (every master of a Cluster).
    async fn config_get(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        let flat = self.on_every_node(cmd).await?;
        // The value after each occurrence of the name.
        let values: Vec<String> = flat
            .windows(2)
            .filter(|w| w[0].eq_ignore_ascii_case(name))
            .map(|w| w[1].clone())
            .collect();
        if values.is_empty() {
            return Err(StoreError::Internal(format!(
                "CONFIG GET {name} returned nothing"
            )));
        }
        Ok(values)
    }

    fn now(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The attempt number a cancel's or retry's log line carries.
    /// The status and attempt of the run a cancel or retry names, for core to decide on
    /// (the script checks they did not change); NotFound for no such run of the tenant.
    async fn status_of(&self, req: &RunAction) -> Result<(RunStatus, u32), StoreError> {
        let key = format!("{}run:{}", self.tenant_prefix(&req.tenant), req.id);
        let (status, attempt): (Option<String>, Option<u32>) = self
            .query(redis::cmd("HMGET").arg(key).arg("status").arg("attempt"))
            .await?;
        let status = status.ok_or_else(|| StoreError::NotFound(format!("run {:?}", req.id)))?;
        let status = status.parse().map_err(corrupt)?;
        Ok((status, attempt.unwrap_or(0)))
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
        script: &Script,
        tenant: &str,
        args: Args,
    ) -> Result<(String, Vec<Value>), StoreError> {
        self.script_at(script, tenant, self.now(), args).await
    }

    /// [`Self::script`] at a given time: a script that creates runs runs at the time their
    /// ids were minted with, which becomes their `created_at` (see `wasq_core::ids`).
    async fn script_at(
        &self,
        script: &Script,
        tenant: &str,
        now: i64,
        args: Args,
    ) -> Result<(String, Vec<Value>), StoreError> {
        let prefix = self.tenant_prefix(tenant);
        let mut inv = script.prepare_invoke();
        inv.key(format!("{prefix}meta"))
            .arg(&prefix)
            .arg(if self.inner.cluster {
                ""
            } else {
                &self.inner.global
            })
            .arg(now)
            .arg(tenant);
        for a in &args.0 {
            inv.arg(a.as_slice());
        }
        let mut c = self.inner.conn.clone();
        let reply: Value = self.timed(inv.invoke_async(&mut c)).await?;
        let mut items = array(reply)?.into_iter();
        let status = string(items.next().ok_or_else(|| corrupt("empty script reply"))?)?;
        Ok((status, items.collect()))
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

    /// The run of a `run_fields` reply (`output` stands in for a left-out output).
    fn run_from(&self, v: Value, output: Option<Vec<u8>>) -> Result<Run, StoreError> {
        decode::RunFields::new(v)?
            .ok_or_else(|| corrupt("run reply for a missing run"))?
            .run(&self.inner.parsed, output)
    }

    async fn claim_tenant(
        &self,
        tenant: &str,
        limit: usize,
        req: &ClaimRequest,
        force: bool,
    ) -> Result<Vec<Claimed>, StoreError> {
        // Expired leases: the first call answers which runs need a transition, the second
        // brings what core decided for each.
        let mut reaps: Option<Vec<(String, String, lifecycle::Transition)>> = None;
        let mut rest = loop {
            let mut args = Args::new()
                .n(limit)
                .n(req.lease_ms)
                .s(&req.worker)
                .b(to_json(&req.worker)?)
                .s(if force { "1" } else { "0" });
            let now = self.now();
            match &reaps {
                None => args = args.s(""),
                Some(list) => {
                    args = args.n(list.len());
                    for (id, token, t) in list {
                        args = transition::args(args.s(id).s(token), Some(t))?;
                    }
                }
            }
            let (status, rest) = self.script_at(&scripts::CLAIM, tenant, now, args).await?;
            match status.as_str() {
                "ok" => break rest,
                "reap" if reaps.is_none() => {
                    let entries = array(rest.into_iter().next().unwrap_or(Value::Nil))?;
                    reaps = Some(
                        entries
                            .into_iter()
                            .map(|e| expired_transition(e, now))
                            .collect::<Result<_, _>>()?,
                    );
                }
                other => return Err(corrupt(format!("claim answered {other}"))),
            }
        };
        self.published(tenant, &mut rest).await?;
        let items = array(rest.into_iter().next().unwrap_or(Value::Nil))?;
        items
            .into_iter()
            .map(|item| {
                let mut parts = array(item)?.into_iter();
                let mut next = || parts.next().ok_or_else(|| corrupt("short claim entry"));
                let (run, lease) = decode::RunFields::new(next()?)?
                    .ok_or_else(|| corrupt("claimed a missing run"))?
                    .claimed(&self.inner.parsed)?;
                let steps = decode::replay_steps(next()?, next()?)?;
                Ok(Claimed { run, lease, steps })
            })
            .collect()
    }

    /// Cluster: republishes every tenant's next due time (and reaps what is due), when a
    /// sweep is due. Hints go stale only if a process died between a transition and its
    /// hint update, or the update failed.
    async fn sweep_if_due(&self, req: &ClaimRequest) -> Result<(), StoreError> {
        if !self.inner.cluster {
            return Ok(());
        }
        {
            let mut last = self
                .inner
                .last_sweep
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let needed = self.inner.sweep_needed.swap(false, Ordering::Relaxed);
            if !needed && last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let tenants: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("tenants")))
            .await?;
        for chunk in tenants.chunks(64) {
            let visits = chunk.iter().map(|t| self.claim_tenant(t, 0, req, true));
            for r in futures_util::future::join_all(visits).await {
                r?;
            }
        }
        Ok(())
    }

    /// A function's settings: from the cache unless `fresh`, else read (and cached).
    /// `None` when there is no such function.
    async fn fn_settings(
        &self,
        tenant: &str,
        function: &str,
        fresh: bool,
    ) -> Result<Option<Arc<FnSettings>>, StoreError> {
        let key = format!("{}fn:{function}", self.tenant_prefix(tenant));
        if !fresh && let Some(s) = self.settings_cache().get(&key) {
            return Ok(Some(s.clone()));
        }
        let blob: Option<Vec<u8>> = self
            .query(redis::cmd("HGET").arg(&key).arg("settings"))
            .await?;
        let Some(blob) = blob else {
            self.settings_cache().remove(&key);
            return Ok(None);
        };
        let settings: FunctionSettings = serde_json::from_slice(&blob)
            .map_err(|e| corrupt(format!("settings of {function}: {e}")))?;
        let s = Arc::new(FnSettings {
            blob,
            flow: settings.flow,
        });
        let mut cache = self.settings_cache();
        if cache.len() >= SETTINGS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, s.clone());
        Ok(Some(s))
    }

    fn settings_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<FnSettings>>> {
        self.inner
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn tenants(&self) -> Result<Vec<String>, StoreError> {
        let mut tenants: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("tenants")))
            .await?;
        tenants.sort();
        Ok(tenants)
    }
}

/// What core decides for a run whose lease expired, from a claim's `reap` entry (id,
/// lease token, worker, attempt, max_attempts, cancel_requested): (id, token, transition).
fn expired_transition(
    entry: Value,
    now: i64,
) -> Result<(String, String, lifecycle::Transition), StoreError> {
    let mut parts = array(entry)?.into_iter();
    let mut next = || -> Result<String, StoreError> {
        string(parts.next().ok_or_else(|| corrupt("short reap entry"))?)
    };
    let (id, token, worker) = (next()?, next()?, next()?);
    let number = |s: String| {
        s.parse::<u32>()
            .map_err(|e| corrupt(format!("reap entry: {e}")))
    };
    let (attempt, max_attempts) = (number(next()?)?, number(next()?)?);
    let cancel_requested = next()? == "1";
    let t = lifecycle::lease_expired(
        lifecycle::Expired {
            id: &id,
            attempt,
            max_attempts,
            worker: (!worker.is_empty()).then_some(worker.as_str()),
            cancel_requested,
        },
        now,
    );
    Ok((id, token, t))
}

/// The two lines that mark a cut log (run budget, tenant quota), ready for a script's
/// `append_logs` to store if it cuts there.
fn cut_markers(args: Args, attempt: u32, at: i64) -> Result<Args, StoreError> {
    let marker = |why| to_json(&wasq_core::storage::cut_marker(attempt, at, why));
    Ok(args
        .b(marker(wasq_core::storage::LogCut::Run)?)
        .b(marker(wasq_core::storage::LogCut::Tenant)?))
}

/// The cut markers and the line of a cancel or retry, numbered with the run's attempt
/// (the script checks it did not change).
fn action_lines(args: Args, req: &RunAction, attempt: u32, now: i64) -> Result<Args, StoreError> {
    Ok(cut_markers(args, attempt, now)?.b(to_json(&req.log_line(attempt, now))?))
}

#[async_trait]
impl Store for RedisStore {
    async fn deploy(&self, req: DeployRequest) -> Result<Function, StoreError> {
        // Content-addressed: writing it outside the deploy script is safe, a second
        // writer writes the same bytes.
        let key = format!("{}:component:{}", self.inner.ns, req.digest);
        let _: Value = self
            .query(redis::cmd("SET").arg(&key).arg(&req.component).arg("NX"))
            .await?;
        let _: Value = self
            .query(redis::cmd("SADD").arg(self.g("tenants")).arg(&req.tenant))
            .await?;
        let _: Value = self
            .query(
                redis::cmd("SADD")
                    .arg(self.g("components"))
                    .arg(&req.digest),
            )
            .await?;
        let mut args = Args::new()
            .s(&req.name)
            .s(&req.digest)
            .n(req.component.len())
            .b(to_json(&req.settings)?)
            .n(req.settings.retry.max_attempts)
            .b(to_json(&req.events)?)
            .b(match &req.schedule {
                Some(s) => to_json(s)?,
                None => Vec::new(),
            });
        for e in &req.events {
            args = args.s(e);
        }
        let (status, rest) = self.script(&scripts::DEPLOY, &req.tenant, args).await?;
        match status.as_str() {
            "ok" => {}
            "storage" => return Err(storage_refusal(&req.tenant, "", &rest)),
            other => return Err(corrupt(format!("deploy answered {other}"))),
        }
        let h = hash(rest.into_iter().next().unwrap_or(Value::Nil))?;
        decode::function(&req.tenant, &h)
    }

    async fn function(&self, tenant: &str, name: &str) -> Result<Option<Function>, StoreError> {
        let key = format!("{}fn:{name}", self.tenant_prefix(tenant));
        let v: Value = self.query(redis::cmd("HGETALL").arg(key)).await?;
        let h = hash(v)?;
        if h.is_empty() {
            return Ok(None);
        }
        decode::function(tenant, &h).map(Some)
    }

    async fn functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError> {
        let (_, rest) = self
            .script(&scripts::FUNCTIONS, tenant, Args::new())
            .await?;
        let mut fns = array(rest.into_iter().next().unwrap_or(Value::Nil))?
            .into_iter()
            .map(|v| decode::function(tenant, &hash(v)?))
            .collect::<Result<Vec<_>, _>>()?;
        fns.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(fns)
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{}:component:{digest}", self.inner.ns);
        self.query(redis::cmd("GET").arg(key)).await
    }

    async fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        let now = self.now();
        let id = wasq_core::ids::new_run_id(now);
        let not_found = || StoreError::NotFound(format!("function {:?}", req.function));
        let mut fresh = false;
        for _ in 0..STALE_RETRIES {
            let Some(fs) = self.fn_settings(&req.tenant, &req.function, fresh).await? else {
                return Err(not_found());
            };
            let plan = fs.flow.plan(&req.function, &req.input, req.priority);
            let args = Args::new()
                .s(&id)
                .s(&req.function)
                .b(req.input.clone())
                .s(&req.trigger)
                .opt_n(req.due_at)
                .s(req.idempotency_key.as_deref().unwrap_or(""))
                .b(match &req.retry {
                    Some(r) => to_json(r)?,
                    None => Vec::new(),
                })
                .opt_n(req.retry.map(|r| r.max_attempts))
                .s(req.parent.as_deref().unwrap_or(""))
                .b(fs.blob.clone());
            let admission = if req.parent.is_none() {
                Admission::Run
            } else {
                Admission::Child
            };
            let debounced = self.debounced_run(&req.tenant, &plan).await?;
            let args = flow_args(args, &plan, &id, Some(admission), &debounced)?;
            let (status, mut rest) = self
                .script_at(&scripts::ENQUEUE, &req.tenant, now, args)
                .await?;
            match status.as_str() {
                "ok" => {}
                "not_found" => return Err(not_found()),
                "stale" => {
                    fresh = true;
                    continue;
                }
                "quota" => {
                    let max = self.max_queued(&req.tenant).await;
                    return Err(queue_quota_exceeded(&req.tenant, max));
                }
                "storage" => return Err(storage_refusal(&req.tenant, &id, &rest)),
                other => return Err(corrupt(format!("enqueue answered {other}"))),
            }
            self.published(&req.tenant, &mut rest).await?;
            let mut rest = rest.into_iter();
            let created = int(rest.next().ok_or_else(|| corrupt("short enqueue reply"))?)? == 1;
            let run = self.run_from(
                rest.next().ok_or_else(|| corrupt("short enqueue reply"))?,
                None,
            )?;
            return Ok(Enqueued { run, created });
        }
        Err(StoreError::Unavailable(format!(
            "function {:?} kept being redeployed during the enqueue; try again",
            req.function
        )))
    }

    async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        self.sweep_if_due(&req).await?;
        let now = self.now();
        let mut due: Vec<String> = self
            .query(
                redis::cmd("ZRANGEBYSCORE")
                    .arg(self.g("due"))
                    .arg("-inf")
                    .arg(now)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(DUE_TENANTS_MAX),
            )
            .await?;
        if due.is_empty() {
            return Ok(Vec::new());
        }
        // Fairness: every claim starts with the next tenant in name order, and the limit
        // is split evenly among the tenants visited in a round.
        due.sort();
        let start = self.inner.cursor.fetch_add(1, Ordering::Relaxed) % due.len();
        due.rotate_left(start);
        let mut candidates: VecDeque<String> = due.into();
        let mut remaining = req.limit;
        let mut claimed = Vec::new();
        let mut first_error = None;
        for _ in 0..CLAIM_ROUNDS_MAX {
            if remaining == 0 || candidates.is_empty() {
                break;
            }
            let k = candidates.len().min(remaining);
            let batch: Vec<(String, usize)> = candidates
                .drain(..k)
                .enumerate()
                .map(|(i, t)| (t, remaining / k + usize::from(i < remaining % k)))
                .collect();
            let visits = batch
                .iter()
                .map(|(t, quota)| self.claim_tenant(t, *quota, &req, false));
            let results = futures_util::future::join_all(visits).await;
            for ((tenant, quota), result) in batch.into_iter().zip(results) {
                match result {
                    Ok(got) => {
                        // A tenant that filled its quota may have more: it goes again,
                        // after the tenants not visited yet.
                        if got.len() == quota {
                            candidates.push_back(tenant);
                        }
                        remaining -= got.len();
                        claimed.extend(got);
                    }
                    Err(e) => {
                        tracing::warn!(tenant, error = %e, "claim failed for a tenant");
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) if claimed.is_empty() => Err(e),
            _ => Ok(claimed),
        }
    }

    async fn renew(&self, leases: &[Lease], lease_ms: u64) -> Result<Renewal, StoreError> {
        let mut by_tenant: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
        for l in leases {
            by_tenant.entry(l.tenant.as_str()).or_default().push(l);
        }
        let ids = |v: Option<Value>| -> Result<Vec<String>, StoreError> {
            array(v.unwrap_or(Value::Nil))?
                .into_iter()
                .map(string)
                .collect()
        };
        let calls = by_tenant.iter().map(|(tenant, leases)| async move {
            let mut args = Args::new().n(lease_ms);
            for l in leases {
                args = args.s(&l.run_id).n(l.token);
            }
            let (status, mut rest) = self.script(&scripts::RENEW, tenant, args).await?;
            if status != "ok" {
                return Err(corrupt(format!("renew answered {status}")));
            }
            self.published(tenant, &mut rest).await?;
            let mut rest = rest.into_iter();
            Ok((ids(rest.next())?, ids(rest.next())?))
        });
        let (mut lost, mut cancelling) = (HashSet::new(), HashSet::new());
        for r in futures_util::future::join_all(calls).await {
            let (l, c) = r?;
            lost.extend(l);
            cancelling.extend(c);
        }
        let pick = |set: &HashSet<String>| {
            leases
                .iter()
                .filter(|l| set.contains(&l.run_id))
                .map(|l| l.run_id.clone())
                .collect()
        };
        Ok(Renewal {
            lost: pick(&lost),
            cancelling: pick(&cancelling),
        })
    }

    async fn record(&self, lease: &Lease, record: Record) -> Result<(), StoreError> {
        let args = Args::new().s(&lease.run_id).n(lease.token);
        let lines = |mut args: Args, lines: &[LogLine]| -> Result<Args, StoreError> {
            for l in lines {
                args = args.b(to_json(l)?);
            }
            Ok(args)
        };
        // The lines that mark a cut log, ready for the script to store if it cuts here.
        let markers = |args: Args, lines: &[LogLine]| -> Result<Args, StoreError> {
            let (attempt, at) = lines.first().map_or((0, 0), |l| (l.attempt, l.at));
            cut_markers(args, attempt, at)
        };
        let args = match &record {
            Record::Step {
                name,
                occurrence,
                output,
                logs,
            } => lines(
                markers(
                    args.s("step")
                        .s(decode::step_field(name, *occurrence))
                        .b(output.clone()),
                    logs,
                )?,
                logs,
            )?,
            Record::Logs(l) => lines(markers(args.s("logs"), l)?, l)?,
            Record::Progress(p) => args.s("progress").b(to_json(p)?),
        };
        let (status, rest) = self.script(&scripts::RECORD, &lease.tenant, args).await?;
        lease_status(&status, lease, &rest)
    }

    async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<Run, StoreError> {
        let now = self.now();
        // The script knows whether the run resumed and whether its cancel was requested:
        // it picks the transition computed for its case.
        let ending = |resumed, cancel_requested| lifecycle::Ending {
            id: &lease.run_id,
            cancel_requested,
            resumed,
        };
        let fresh = lifecycle::finish(ending(false, false), &outcome, now);
        let resumed = lifecycle::finish(ending(true, false), &outcome, now);
        let cancelled = lifecycle::finish(ending(false, true), &outcome, now);
        let args = Args::new().s(&lease.run_id).n(lease.token);
        let args = transition::args(args, Some(&fresh))?;
        let args = transition::args(args, (resumed != fresh).then_some(&resumed))?;
        let args = transition::args(args, (cancelled != fresh).then_some(&cancelled))?;
        let args = match &outcome {
            Outcome::Waiting { wait, .. } => {
                let (on, target) = match &wait.on {
                    WaitOn::Event { name, .. } => ("event", name.clone()),
                    WaitOn::Run { id } => ("run", id.clone()),
                };
                let missing = lifecycle::missing_run_resolution(&target).to_bytes();
                args.b(to_json(wait)?)
                    .s(decode::step_field(&wait.step, wait.occurrence))
                    .opt_n(wait.until)
                    .s(on)
                    .s(target)
                    .b(missing)
            }
            _ => args,
        };
        // A success's reply leaves out the output, which is this one.
        let sent_output = fresh.output;
        let (status, mut rest) = self
            .script_at(&scripts::FINISH, &lease.tenant, now, args)
            .await?;
        lease_status(&status, lease, &rest)?;
        self.published(&lease.tenant, &mut rest).await?;
        self.run_from(rest.into_iter().next().unwrap_or(Value::Nil), sent_output)
    }

    async fn cancel(&self, req: RunAction) -> Result<Run, StoreError> {
        for _ in 0..STALE_RETRIES {
            let (status, attempt) = self.status_of(&req).await?;
            let now = self.now();
            let plan = lifecycle::cancel(&req.id, status, req.cancel_error(), now)?;
            let args = Args::new()
                .s(&req.id)
                .s(status.as_str())
                .s(if plan.is_some() { "end" } else { "mark" })
                .b(to_json(&req.cancel_error())?);
            let args = transition::args(args, plan.as_ref())?;
            let args = action_lines(args, &req, attempt, now)?;
            let (status, rest) = self
                .script_at(&scripts::CANCEL, &req.tenant, now, args)
                .await?;
            if status != "stale" {
                return self.ended_run(&req.tenant, &req.id, status, rest).await;
            }
        }
        Err(StoreError::Unavailable(format!(
            "run {} kept changing during the cancel; try again",
            req.id
        )))
    }

    async fn retry(&self, req: RunAction) -> Result<Run, StoreError> {
        for _ in 0..STALE_RETRIES {
            let (status, attempt) = self.status_of(&req).await?;
            let now = self.now();
            let retry = lifecycle::retry(&req.id, status, attempt, now)?;
            let args = Args::new()
                .s(&req.id)
                .s(status.as_str())
                .n(attempt)
                .n(retry.extra_attempts)
                .n(Admission::Run.cap_factor());
            let args = transition::args(args, Some(&retry.transition))?;
            let args = action_lines(args, &req, attempt, now)?;
            let (status, rest) = self
                .script_at(&scripts::RETRY, &req.tenant, now, args)
                .await?;
            if status != "stale" {
                return self.ended_run(&req.tenant, &req.id, status, rest).await;
            }
        }
        Err(StoreError::Unavailable(format!(
            "run {} kept changing during the retry; try again",
            req.id
        )))
    }

    async fn run_ids(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        // An id starts with its run's creation time (wasq_core::ids) and `all` holds every
        // run by creation time, so the prefix's time window holds exactly the runs whose
        // ids share its time digits. Each of them matches a prefix of up to 12 digits, so
        // the first page answers; a longer prefix names one millisecond, whose runs are
        // read a page at a time until `limit` match or none is left.
        const PAGE: usize = 1_000;
        let (lo, hi) = wasq_core::ids::prefix_window(prefix);
        let key = format!("{}all", self.tenant_prefix(tenant));
        let mut found = Vec::new();
        for offset in (0..).step_by(PAGE) {
            let ids: Vec<String> = self
                .query(
                    redis::cmd("ZRANGEBYSCORE")
                        .arg(&key)
                        .arg(lo)
                        .arg(hi)
                        .arg("LIMIT")
                        .arg(offset)
                        .arg(PAGE),
                )
                .await?;
            let last_page = ids.len() < PAGE;
            found.extend(ids.into_iter().filter(|id| id.starts_with(prefix)));
            if last_page || found.len() >= limit {
                break;
            }
        }
        found.sort();
        found.truncate(limit);
        Ok(found)
    }

    async fn send_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        let id = req
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let data = req.data.to_string();
        let resolution = Resolution::Event {
            data: req.data.clone(),
        }
        .to_bytes();
        // (version of the waiter set, matched (run, wait version) pairs)
        let mut matched: Option<(String, Vec<(String, String)>)> = None;
        let mut subscribers = self.subscribers(&req.tenant, &req.name, &data).await?;
        for _ in 0..32 {
            let mut args = Args::new()
                .s(&id)
                .s(&req.name)
                .s(&data)
                .b(resolution.clone());
            match &matched {
                Some((version, pairs)) => {
                    args = args.s(version).n(pairs.len());
                    for (run, ver) in pairs {
                        args = args.s(run).s(ver);
                    }
                }
                None => args = args.s("").n(0),
            }
            args = args.n(subscribers.len());
            let now = self.now();
            for (function, blob, plan, debounced) in &subscribers {
                let id = wasq_core::ids::new_run_id(now);
                args = args.s(function).s(&id).b(blob.clone());
                args = flow_args(args, plan, &id, None, debounced)?;
            }
            let (status, mut rest) = self
                .script_at(&scripts::SEND_EVENT, &req.tenant, now, args)
                .await?;
            match status.as_str() {
                "dup" => {
                    return Ok(EventSent {
                        id,
                        accepted: false,
                        ..EventSent::default()
                    });
                }
                "match" => {
                    let version = string(
                        rest.into_iter()
                            .next()
                            .ok_or_else(|| corrupt("short match"))?,
                    )?;
                    let pairs = self
                        .matching_waiters(&req.tenant, &req.name, &req.data)
                        .await?;
                    matched = Some((version, pairs));
                }
                "stale" => {
                    subscribers = self.subscribers(&req.tenant, &req.name, &data).await?;
                }
                "quota" => {
                    let max = self.max_queued(&req.tenant).await;
                    return Err(queue_quota_exceeded(&req.tenant, max));
                }
                "storage" => return Err(storage_refusal(&req.tenant, "", &rest)),
                "ok" => {
                    self.published(&req.tenant, &mut rest).await?;
                    let mut rest = rest.into_iter();
                    let mut ids = || -> Result<Vec<String>, StoreError> {
                        array(rest.next().unwrap_or(Value::Nil))?
                            .into_iter()
                            .map(string)
                            .collect()
                    };
                    let (started, resumed) = (ids()?, ids()?);
                    return Ok(EventSent {
                        id,
                        accepted: true,
                        started,
                        resumed,
                    });
                }
                other => return Err(corrupt(format!("send_event answered {other}"))),
            }
        }
        Err(StoreError::Unavailable(format!(
            "event {id}: new waiters for {:?} kept arriving; try again",
            req.name
        )))
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        let args = Args::new()
            .s(id)
            .n(wasq_core::storage::DETAIL_STEPS)
            .n(wasq_core::storage::DETAIL_ATTEMPTS);
        let (status, rest) = self.script(&scripts::GET, tenant, args).await?;
        if status == "not_found" {
            return Ok(None);
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short run reply"));
        let run = decode::RunFields::new(next()?)?
            .ok_or_else(|| corrupt("run reply for a missing run"))?
            .run(&self.inner.parsed, None)?;
        let attempts_total = int(next()?)?.max(0) as u64;
        let attempts = array(next()?)?
            .into_iter()
            .map(|v| decode::attempt(&decode::bytes(v)?))
            .collect::<Result<Vec<_>, _>>()?;
        let steps_total = int(next()?)?.max(0) as u64;
        let steps = decode::step_infos(next()?, next()?)?;
        Ok(Some(RunDetail {
            run,
            attempts,
            attempts_total,
            steps,
            steps_total,
        }))
    }

    async fn steps(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let args = Args::new().s(id).n(skip).n(limit.min(i64::MAX as usize));
        let (status, rest) = self.script(&scripts::STEPS, tenant, args).await?;
        if status == "not_found" {
            return Err(StoreError::NotFound(format!("run {id:?}")));
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short steps reply"));
        decode::step_infos(next()?, next()?)
    }

    async fn step(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError> {
        let args = Args::new().s(id).s(decode::step_field(name, occurrence));
        let (status, rest) = self.script(&scripts::STEP, tenant, args).await?;
        if status == "not_found" {
            return Ok(None);
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short step reply"));
        decode::step_record(next()?, next()?).map(Some)
    }

    async fn runs(&self, q: RunQuery) -> Result<Vec<Run>, StoreError> {
        if q.limit == 0 {
            return Ok(Vec::new());
        }
        // Read the smallest index that covers the query; filter the rest here.
        let mut indexes = vec!["all".to_owned()];
        if let Some(p) = &q.parent {
            indexes.push(format!("kids:{p}"));
        }
        if let Some(f) = &q.function {
            indexes.push(format!("byfn:{f}"));
        }
        if let Some(s) = q.status {
            indexes.push(format!("st:{s}"));
        }
        // With at most one filter the index alone answers the query: fetch no more runs
        // than asked for (a poll for "any queued run?" reads one run, not a page).
        let page = if indexes.len() <= 2 {
            q.limit.min(LIST_PAGE)
        } else {
            LIST_PAGE
        };
        let prefix = self.tenant_prefix(&q.tenant);
        let index = if indexes.len() == 1 {
            indexes.remove(0)
        } else {
            let mut pipe = redis::pipe();
            for i in &indexes[1..] {
                pipe.cmd("ZCARD").arg(format!("{prefix}{i}"));
            }
            let mut c = self.inner.conn.clone();
            let sizes: Vec<u64> = self.timed(pipe.query_async(&mut c)).await?;
            let smallest = (0..sizes.len()).min_by_key(|&i| sizes[i]).unwrap_or(0);
            indexes.swap_remove(smallest + 1)
        };
        let mut out = Vec::new();
        let mut start = 0usize;
        loop {
            let args = Args::new().s(&index).n(start).n(start + page - 1);
            let (_, rest) = self.script(&scripts::LIST, &q.tenant, args).await?;
            let mut rest = rest.into_iter();
            let scanned = int(rest.next().ok_or_else(|| corrupt("short list reply"))?)? as usize;
            for v in array(rest.next().unwrap_or(Value::Nil))? {
                let run = self.run_from(v, None)?;
                let keep = q.function.as_ref().is_none_or(|f| *f == run.function)
                    && q.status.is_none_or(|s| s == run.status)
                    && q.parent
                        .as_ref()
                        .is_none_or(|p| Some(p) == run.parent.as_ref());
                if keep {
                    out.push(run);
                    if out.len() == q.limit {
                        return Ok(out);
                    }
                }
            }
            if scanned < page {
                return Ok(out);
            }
            start += page;
        }
    }

    async fn purge(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        let mut purged = 0;
        for tenant in self.tenants().await? {
            if purged >= req.limit {
                break;
            }
            let args = Args::new()
                .n(req.succeeded_before)
                .n(req.failed_before)
                .n(req.limit - purged);
            let (_, rest) = self.script(&scripts::PURGE, &tenant, args).await?;
            purged += int(rest.into_iter().next().unwrap_or(Value::Int(0)))? as usize;
        }
        let due = {
            let mut last = self
                .inner
                .last_collect
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= COLLECT_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            let n = self.collect_components(COLLECT_MIN_IDLE).await?;
            if n > 0 {
                tracing::info!(components = n, "deleted components no function or run uses");
            }
        }
        Ok(purged)
    }

    async fn logs(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = format!("{}logs:{id}", self.tenant_prefix(tenant));
        let last = skip
            .checked_add(limit - 1)
            .and_then(|l| i64::try_from(l).ok())
            .unwrap_or(-1);
        let lines: Vec<Vec<u8>> = self
            .query(redis::cmd("LRANGE").arg(key).arg(skip).arg(last))
            .await?;
        lines
            .iter()
            .map(|l| serde_json::from_slice(l).map_err(|e| corrupt(format!("log line: {e}"))))
            .collect()
    }

    async fn capacity(&self) -> Result<Option<Capacity>, StoreError> {
        // The fullest node decides: a tenant's keys all live on one.
        let mut fullest: Option<Capacity> = None;
        for info in self.memory_info().await? {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            let (Some(used), Some(limit)) = (field("used_memory"), field("maxmemory")) else {
                continue;
            };
            if limit == 0 {
                continue;
            }
            let node = Capacity { used, limit };
            let ratio = |c: &Capacity| c.used as f64 / c.limit as f64;
            if fullest.is_none_or(|f| ratio(&node) > ratio(&f)) {
                fullest = Some(node);
            }
        }
        Ok(fullest)
    }

    async fn wait_for_work(&self, max: Duration) -> Result<(), StoreError> {
        let now = self.now();
        let head: Vec<(String, f64)> = self
            .query(
                redis::cmd("ZRANGE")
                    .arg(self.g("due"))
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES"),
            )
            .await?;
        let mut wait = max;
        if let Some((_, score)) = head.first() {
            let at = *score as i64;
            if at <= now {
                return Ok(());
            }
            wait = wait.min(Duration::from_millis((at - now) as u64));
        }
        // Our own timer ends the wait at the due time; the listener's BLPOP ends it when a
        // wake-up token arrives.
        let notified = self.inner.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let waiter = self.inner.wake.register(&self.inner.conn);
        tokio::select! {
            _ = notified => waiter.failure().map_or(Ok(()), Err),
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }
}

impl RedisStore {
    /// The run a cancel or retry returned, or the error its script reported.
    async fn ended_run(
        &self,
        tenant: &str,
        id: &str,
        status: String,
        mut rest: Vec<Value>,
    ) -> Result<Run, StoreError> {
        match status.as_str() {
            "ok" => {
                self.published(tenant, &mut rest).await?;
                self.run_from(rest.into_iter().next().unwrap_or(Value::Nil), None)
            }
            "not_found" => Err(StoreError::NotFound(format!("run {id:?}"))),
            "quota" => {
                let max = self.max_queued(tenant).await;
                Err(queue_quota_exceeded(tenant, max))
            }
            other => Err(corrupt(format!("answered {other}"))),
        }
    }
}

/// Waiters read per page when an event is matched.
const WAITERS_PAGE: usize = 500;

impl RedisStore {
    /// The runs waiting for event `name` whose filter matches `data`, as (run, wait
    /// version) pairs, read a page at a time so no reply holds every waiter.
    async fn matching_waiters(
        &self,
        tenant: &str,
        name: &str,
        data: &serde_json::Value,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut seen = HashSet::new();
        let mut pairs = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let args = Args::new().s(name).s(&cursor).n(WAITERS_PAGE);
            let (_, rest) = self.script(&scripts::WAITERS, tenant, args).await?;
            let mut rest = rest.into_iter();
            cursor = string(rest.next().ok_or_else(|| corrupt("short waiters page"))?)?;
            for w in array(rest.next().unwrap_or(Value::Nil))? {
                let mut w = array(w)?.into_iter();
                let mut next = || w.next().ok_or_else(|| corrupt("short waiter"));
                let (run, ver, wait) = (string(next()?)?, string(next()?)?, next()?);
                let wait: Wait = serde_json::from_slice(&decode::bytes(wait)?)
                    .map_err(|e| corrupt(format!("wait: {e}")))?;
                // SSCAN may return a member twice.
                if let WaitOn::Event { filter, .. } = &wait.on
                    && event_matches(filter.as_deref(), data)
                    && seen.insert(run.clone())
                {
                    pairs.push((run, ver));
                }
            }
            if cursor == "0" {
                return Ok(pairs);
            }
        }
    }

    /// The run a debounced plan's key points to now (`""`: none, or no debounce), which
    /// the new run would replace if it has not started.
    async fn debounced_run(&self, tenant: &str, plan: &FlowPlan) -> Result<String, StoreError> {
        let Some(gate) = &plan.debounce else {
            return Ok(String::new());
        };
        let key = format!("{}deb", self.tenant_prefix(tenant));
        let id: Option<String> = self
            .query(redis::cmd("HGET").arg(key).arg(&gate.id))
            .await?;
        Ok(id.unwrap_or_default())
    }

    /// The functions an event starts, in name order, with their settings blobs and the
    /// flow plan for the event's data.
    async fn subscribers(
        &self,
        tenant: &str,
        event: &str,
        data: &str,
    ) -> Result<Vec<(String, Vec<u8>, FlowPlan, String)>, StoreError> {
        let prefix = self.tenant_prefix(tenant);
        let mut names: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(format!("{prefix}sub:{event}")))
            .await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let (blob, plan) = match self.fn_settings(tenant, &name, true).await? {
                Some(fs) => (fs.blob.clone(), fs.flow.plan(&name, data.as_bytes(), None)),
                None => (Vec::new(), FlowPlan::default()),
            };
            let debounced = self.debounced_run(tenant, &plan).await?;
            out.push((name, blob, plan, debounced));
        }
        Ok(out)
    }

    /// Recomputes and republishes the tenant's next due time (a claim visit that leases
    /// nothing), after something the scripts do not see changed, such as its quotas.
    pub(crate) async fn republish(&self, tenant: &str) -> Result<(), StoreError> {
        let req = ClaimRequest {
            worker: "republish".into(),
            limit: 0,
            lease_ms: 0,
        };
        self.claim_tenant(tenant, 0, &req, true).await.map(drop)
    }

    /// Deletes the components no tenant's function or run uses any more and that nobody
    /// read or wrote for `min_idle` (a deploy writes its component before the function
    /// points to it: the idle time keeps a deploy under way from losing it). Only
    /// components recorded in `G components` (by deploys) are considered. Returns how many.
    pub async fn collect_components(&self, min_idle: Duration) -> Result<usize, StoreError> {
        let mut in_use = HashSet::new();
        for tenant in self.tenants().await? {
            let (_, rest) = self.script(&scripts::DIGESTS, &tenant, Args::new()).await?;
            for d in array(rest.into_iter().next().unwrap_or(Value::Nil))? {
                in_use.insert(string(d)?);
            }
        }
        let known: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("components")))
            .await?;
        let mut deleted = 0;
        for digest in known.into_iter().filter(|d| !in_use.contains(d)) {
            let key = format!("{}:component:{digest}", self.inner.ns);
            // Unknown (an LFU eviction policy answers an error): keep it.
            let Ok(idle) = self
                .query::<Option<u64>>(redis::cmd("OBJECT").arg("IDLETIME").arg(&key))
                .await
            else {
                continue;
            };
            if idle.is_some_and(|secs| Duration::from_secs(secs) < min_idle) {
                continue;
            }
            let _: Value = self.query(redis::cmd("DEL").arg(&key)).await?;
            let _: Value = self
                .query(redis::cmd("SREM").arg(self.g("components")).arg(&digest))
                .await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// The tenant's `max_queued`, for the message of a refused enqueue.
    async fn max_queued(&self, tenant: &str) -> u64 {
        let key = format!("{}quotas", self.tenant_prefix(tenant));
        self.query::<Option<u64>>(redis::cmd("HGET").arg(key).arg("max_queued"))
            .await
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

/// Appends the FLOW_ARGS flow arguments of run `id` (see `read_flow` in the scripts).
/// `admission`: the `max_queued` the script applies (`None`: the caller checked it for a
/// batch, an event's subscribers). `debounced`: the run the debounce key pointed to when
/// read (`""`: none); the script answers `stale` if it changed.
fn flow_args(
    args: Args,
    plan: &FlowPlan,
    id: &str,
    admission: Option<Admission>,
    debounced: &str,
) -> Result<Args, StoreError> {
    let gate = |g: &Option<Gate>| {
        g.as_ref()
            .map_or((String::new(), String::new(), String::new()), |g| {
                (g.id.clone(), g.limit.to_string(), g.period_ms.to_string())
            })
    };
    let (cgate, climit, _) = gate(&plan.concurrency);
    let (tgate, tlimit, tperiod) = gate(&plan.throttle);
    let (rgate, rlimit, rperiod) = gate(&plan.rate_limit);
    let (dgate, _, dperiod) = gate(&plan.debounce);
    let rate_limited = plan.rate_limited_error();
    let (debounced, debounced_run) = (flow::debounced_error(id), debounced);
    let args = args
        .n(plan.priority)
        .n(plan.rank_offset)
        .s(cgate)
        .s(climit)
        .s(tgate)
        .s(tlimit)
        .s(tperiod)
        .s(rgate)
        .s(rlimit)
        .s(rperiod)
        .s(dgate)
        .s(dperiod)
        .b(if plan.keys.is_empty() {
            Vec::new()
        } else {
            to_json(&plan.keys)?
        })
        .b(to_json(&rate_limited)?)
        .b(lifecycle::skipped_resolution(id, &rate_limited).to_bytes())
        .b(to_json(&debounced)?)
        .s(debounced_run)
        .b(if debounced_run.is_empty() {
            Vec::new()
        } else {
            lifecycle::skipped_resolution(debounced_run, &debounced).to_bytes()
        })
        .n(admission.map_or(0, Admission::cap_factor));
    Ok(args)
}

/// Maps the status word of a script that checked a lease (and maybe a storage quota:
/// `rest` holds the refusal then).
fn lease_status(status: &str, lease: &Lease, rest: &[Value]) -> Result<(), StoreError> {
    match status {
        "ok" => Ok(()),
        "lease_lost" => Err(StoreError::LeaseLost(lease.run_id.clone())),
        "not_found" => Err(StoreError::NotFound(format!("run {}", lease.run_id))),
        "storage" => Err(storage_refusal(&lease.tenant, &lease.run_id, rest)),
        other => Err(corrupt(format!("answered {other}"))),
    }
}

/// A script's `storage` refusal (`kind`, bytes used, bytes asked, quota) as the error core
/// words for it.
fn storage_refusal(tenant: &str, run: &str, rest: &[Value]) -> StoreError {
    let n = |i: usize| {
        rest.get(i)
            .cloned()
            .map(int)
            .and_then(Result::ok)
            .unwrap_or(0)
            .max(0) as u64
    };
    let (used, adding, max) = (n(1), n(2), n(3));
    match rest.first().cloned().map(string) {
        Some(Ok(kind)) if kind == "run" => wasq_core::storage::run_full(run, used, adding, max),
        _ => wasq_core::storage::tenant_full(tenant, used, adding, max),
    }
}

//! wasq-sandbox: runs one attempt of a job — a WebAssembly component built for the
//! `wasq:task` world — under hard limits, and is the only crate that touches wasmtime.
//!
//! Key design decisions:
//! - Components are compiled once per host and linked once per digest into an
//!   `InstancePre` (`TaskPre`); every attempt then gets a fresh `Store` and an instance
//!   from the pooling allocator, so starting an attempt costs tens of microseconds and no
//!   state survives from one attempt to the next. Uploads are validated by compiling them
//!   in a child process bounded in wall-clock time and address space (compile.rs), with
//!   an explicit set of WebAssembly features (engine.rs); compiled artifacts are cached on
//!   disk keyed by digest and engine configuration.
//! - `Component::deserialize` only ever sees bytes this host produced: the compile
//!   child's artifact (compile.rs, `load_artifact`) and the disk cache (engine.rs,
//!   `deserialize_cached`), whose files only `DiskCache::put` writes. Uploads must be a
//!   component binary (`check_header` refuses precompiled `.cwasm` and WAT text) and are
//!   only ever compiled.
//! - Guests are CPU-bound and run on the same tokio runtime as the API and lease renewals.
//!   Every epoch tick (10 ms) the guest yields to the executor, and the same tick enforces
//!   the wall-clock limit and cancellation, so no guest can starve the process.
//! - Fuel meters CPU deterministically (the same input burns the same fuel), a
//!   `ResourceLimiter` caps memory, and every byte a guest logs or returns is bounded.
//! - Everything that can go wrong in an attempt ends up in [`AttemptResult`] as a
//!   [`wasq_core::RunError`] whose reason and message a user can act on.
//! - Outbound HTTP (wasi:http) goes through our own client behind an egress guard
//!   (`egress.rs`): per-function host allow-list, DNS resolved here with every address
//!   checked, a connection to exactly the checked address, clamped timeouts and capped
//!   sizes and counts. wasmtime-wasi-http's own client is not compiled in.
//!
//! What this crate is not: it knows nothing about queues, leases or retries (the caller
//! decides what an [`AttemptError`] means for the run), and it does no I/O besides the
//! compiled-artifact cache and guests' outbound HTTP: step outputs and logs go to the
//! caller's [`Journal`].

mod attempt;
mod compile;
mod egress;
mod engine;
mod host;
mod limits;
mod validate;

use attempt::*;
use validate::*;

pub use compile::{CHILD_ARG, CHILD_ENV, Compiler, compile_child_main};
pub use egress::{
    EgressConfig, MAX_ALLOW_HOSTS, check_webhook_url, normalize_allow_host, post_webhook,
};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, UpdateDeadline};
use wasq_core::{Clock, ErrorReason, Limits, LogLine, Progress, ReplayStep, RunError, SystemClock};

use crate::compile::CompileError;
use crate::engine::DiskCache;
use crate::host::{State, StateParams, TaskPre};
use crate::limits::{Ending, Stop, failed};

/// How often the epoch advances: the granularity of time limits, cancellation and yields.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Grace after the wall-clock limit before the attempt is abandoned from outside; only a
/// guest stuck in a host call (where epoch ticks are not observed) ever reaches it.
const BACKSTOP_GRACE: Duration = Duration::from_secs(1);

/// Limits beyond this are treated as this (and `Instant` arithmetic cannot overflow).
const MAX_TIMEOUT_MS: u64 = 366 * 24 * 3600 * 1000;

/// Grace after cancellation, for the same reason.
const CANCEL_GRACE: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// On-disk cache of compiled artifacts; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Pooling allocator size: the maximum number of concurrent attempts.
    pub max_instances: u32,
    /// Ceiling for any function's memory limit; also the pool's per-memory slot size.
    pub max_memory_bytes: u64,
    /// Largest component accepted by [`Sandbox::validate`].
    pub max_component_bytes: usize,
    /// Where components are compiled: see [`Compiler`].
    pub compiler: Compiler,
    /// Wall-clock bound of one compile, waiting for a compile slot included.
    pub compile_timeout: Duration,
    /// Address space of a compile child (`RLIMIT_AS`); not enforced by
    /// [`Compiler::InProcess`].
    pub compile_memory_bytes: u64,
    /// Cap on guest `log.write` + stdout + stderr bytes per attempt, counted after
    /// escaping control characters.
    pub log_bytes_per_attempt: usize,
    /// Cap on guest log lines (log.write calls and stdout/stderr lines) per attempt.
    pub log_lines_per_attempt: usize,
    /// Cap on the run output and on each step output.
    pub max_output_bytes: usize,
    /// A durable sleep with at most this much left is slept inside the attempt; a longer
    /// one suspends the run and frees the worker slot.
    pub inline_sleep_max: Duration,
    /// Components kept linked in memory at once; the least recently used beyond it is
    /// dropped (and reloaded from the disk cache when a run needs it again).
    pub max_loaded_components: usize,
    /// Compiled artifacts kept in the disk cache; the least recently used beyond it are
    /// deleted.
    pub max_cached_artifacts: usize,
    /// Durable operations (steps, sleeps, waits, child runs, events) one run may make,
    /// replays included: bounds what a guest can make the store hold, and how many child
    /// runs it can start.
    pub max_durable_ops: u32,
    /// Lets outbound HTTP reach loopback addresses (127.0.0.0/8, ::1) of allow-listed
    /// hosts: for `wasq dev --allow-loopback-egress` and tests. Every other private,
    /// link-local or reserved address stays refused.
    pub allow_loopback_egress: bool,
    /// Benchmarks only: an attempt returns its input without instantiating anything, so
    /// that a benchmark can tell the queue's cost from the sandbox's. No limit applies and
    /// no guest code runs; never set by the daemon's configuration.
    #[doc(hidden)]
    pub stub_guests: bool,
    /// Timeouts and caps of outbound HTTP.
    pub egress: EgressConfig,
    /// What a guest's sleeps, waits and log lines read as now: the caller's clock (the
    /// server gives the one its store reads).
    pub clock: Arc<dyn Clock>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            cache_dir: None,
            max_instances: 64,
            max_memory_bytes: 1 << 30,
            max_component_bytes: 64 << 20,
            compiler: Compiler::Auto,
            compile_timeout: Duration::from_secs(60),
            compile_memory_bytes: 1 << 30,
            log_bytes_per_attempt: 1 << 20,
            log_lines_per_attempt: 10_000,
            max_output_bytes: 4 << 20,
            inline_sleep_max: Duration::from_secs(1),
            max_durable_ops: 10_000,
            max_loaded_components: 256,
            max_cached_artifacts: 2_048,
            allow_loopback_egress: false,
            stub_guests: false,
            egress: EgressConfig::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Facts about the run, returned to the guest by `context.info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunInfo {
    pub run_id: String,
    pub function: String,
    pub tenant: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub max_attempts: u32,
    pub trigger: String,
}

/// One attempt to run.
pub struct AttemptSpec {
    /// The component, which must have been loaded with [`Sandbox::validate`] or
    /// [`Sandbox::load`].
    pub digest: String,
    pub info: RunInfo,
    pub input: Vec<u8>,
    pub limits: Limits,
    /// Steps completed by earlier attempts: `step.begin` returns their outputs (those
    /// left out are read with [`Journal::load_step`] when the replay reaches them).
    pub steps: Vec<ReplayStep>,
    pub journal: Arc<dyn Journal>,
    /// Cancelled => the guest is interrupted at the next epoch tick.
    pub cancel: CancellationToken,
    /// Hosts the guest may send HTTP requests to (the function's `allow_hosts`): exact
    /// names, `*.domain`, IP literals. Empty: no outbound HTTP.
    pub allow_hosts: Vec<String>,
    /// The W3C trace context of the attempt (its span, the caller's): sent as the
    /// `traceparent` header of every outbound request that does not carry one of its own.
    pub traceparent: Option<wasq_core::TraceParent>,
    /// The tenant's cap on outbound requests per attempt, below the sandbox's own
    /// (`EgressConfig::max_requests_per_attempt`); `None`: the sandbox's.
    pub max_outbound_requests: Option<u32>,
}

/// Why a [`Journal`] call failed. The kind decides what becomes of the attempt, whatever
/// the guest makes of the error it sees (a child run or an event refused is returned to
/// the guest, which may catch it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// A storage quota (of the run or its tenant) refused the bytes: the attempt fails for
    /// good with reason `storage_quota`, since a retry would meet the same quota.
    #[error("{0}")]
    StorageQuota(String),
    /// The attempt no longer owns its run: it ends as [`AttemptOutcome::Abandoned`].
    #[error("{0}")]
    LeaseLost(String),
    /// Anything else (the store unreachable, no such function): a step that cannot be
    /// stored ends the attempt with reason `host`, which is retried.
    #[error("{0}")]
    Failed(String),
}

/// Where an attempt's durable effects go while it runs.
#[async_trait::async_trait]
pub trait Journal: Send + Sync {
    /// Completes a step: its output is stored durably before anything the guest does
    /// afterwards can leave the sandbox. A journal may keep it back to store it with the
    /// attempt's end (one transition instead of two), as long as it stores it first
    /// whenever [`Journal::settle`] is called, and within a few milliseconds otherwise (a
    /// guest computing on after its step must not leave it unstored for long). An error
    /// traps the guest (see [`JournalError`] for how the attempt ends).
    async fn complete_step(
        &self,
        name: &str,
        occurrence: u32,
        output: &[u8],
    ) -> Result<(), JournalError>;
    /// Sends an event (exactly once per `id`): starts subscribed functions, resumes
    /// waiting runs.
    async fn send_event(
        &self,
        event: &str,
        data: serde_json::Value,
        id: &str,
    ) -> Result<(), JournalError>;
    /// Starts a child run of `function` (exactly once per `key`) and returns its id.
    async fn start_run(
        &self,
        function: &str,
        input: &[u8],
        key: &str,
    ) -> Result<String, JournalError>;
    /// Reads the output of a completed step that did not come with the attempt's steps
    /// (too big to carry along). An error traps the guest.
    async fn load_step(&self, name: &str, occurrence: u32) -> Result<Vec<u8>, JournalError>;
    /// Stores what [`Journal::complete_step`] kept back, before an effect that leaves the
    /// sandbox (an outbound request); the journal's own effects (events, child runs) settle
    /// by themselves. An error is the one storing the step met.
    async fn settle(&self) -> Result<(), JournalError> {
        Ok(())
    }
    /// Must not block: called from inside the guest's writes.
    fn log(&self, line: LogLine);
    fn progress(&self, progress: Progress);
    /// Whether the attempt may still start an effect: checked before every step body,
    /// sleep, wait, child run, event and outbound request, and must be cheap. `Err(why)`
    /// ends the attempt at once, before the effect, as [`AttemptOutcome::Abandoned`]:
    /// the caller no longer owns the run (e.g. its lease ran out while the process was
    /// paused), so another attempt may be running the same code.
    fn ensure_owned(&self) -> Result<(), String> {
        Ok(())
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// `run` returned this output.
    Output(Vec<u8>),
    Failed(AttemptError),
    /// The guest sleeps until this Unix time (ms): not a failure; replay the run then.
    Suspended {
        until: i64,
    },
    /// The guest waits for an event or for another run; replay the run when it resolves.
    Waiting(wasq_core::Wait),
    /// [`Journal::ensure_owned`] refused an effect: the attempt stopped there and has no
    /// end of its own to record (the run belongs to someone else now).
    Abandoned(String),
}

impl AttemptOutcome {
    pub fn output(&self) -> Option<&[u8]> {
        match self {
            AttemptOutcome::Output(o) => Some(o),
            _ => None,
        }
    }

    pub fn error(&self) -> Option<&AttemptError> {
        match self {
            AttemptOutcome::Failed(e) => Some(e),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    pub outcome: AttemptOutcome,
    pub fuel_used: u64,
    /// Highest total linear memory of the attempt.
    pub peak_memory_bytes: u64,
    pub duration: Duration,
    /// Outbound requests the egress guard refused (not those that failed after it let
    /// them through).
    pub egress_refused: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    pub error: RunError,
    /// Set when the guest returned `run-error.retry-after`.
    pub retry_after_ms: Option<u64>,
}

/// Why an upload was refused. Displayed to the uploader as is.
#[derive(Debug, thiserror::Error)]
pub enum InvalidComponent {
    #[error("the component is {size} bytes, over the upload limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("the upload is not a WebAssembly binary (it does not start with \"\\0asm\")")]
    NotWasm,
    #[error(
        "the upload is a precompiled artifact (.cwasm), not a component: wasq compiles \
         components itself and never loads precompiled code; upload the .wasm file"
    )]
    Precompiled,
    #[error(
        "the upload is a core WebAssembly module, not a component: build for wasm32-wasip2 \
         (`cargo build --target wasm32-wasip2`), which produces a component"
    )]
    CoreModule,
    #[error("the component does not compile: {0}")]
    Compile(String),
    /// Names the feature, e.g. "threads (shared memory and atomics)".
    #[error(
        "the component uses {feature}, a WebAssembly feature wasq does not support \
         ({detail})"
    )]
    UnsupportedFeature {
        feature: &'static str,
        detail: String,
    },
    #[error("compiling the component took longer than the limit of {}s", .0.as_secs_f64())]
    CompileTimeout(Duration),
    #[error(
        "compiling the component needed more memory than the limit of {} MiB",
        .0 >> 20
    )]
    CompileMemory(u64),
    /// Names the import, e.g. "`wasi:http/types@0.2.0`, which this wasq host does not
    /// provide".
    #[error("the component imports {0}")]
    UnsupportedImport(String),
    #[error(
        "the component does not export `run: func(input: list<u8>) -> result<list<u8>, \
         run-error>` of world wasq:task/task@0.1.0: {0}"
    )]
    MissingExport(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("wasmtime engine: {0}")]
    Engine(String),
    #[error("component {0} is not loaded")]
    NotLoaded(String),
    #[error("could not compile component: {0}")]
    Compile(String),
    #[error("component cache: {0}")]
    Io(#[from] std::io::Error),
}

/// Why [`Sandbox::load_with`] failed: fetching the bytes, or loading them.
#[derive(Debug, thiserror::Error)]
pub enum LoadError<E> {
    #[error("{0}")]
    Fetch(E),
    #[error("{0}")]
    Load(SandboxError),
}

/// Runs components. Cheap to clone; all clones share one engine, pool and cache.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: SandboxConfig,
    engine: Engine,
    linker: Linker<State>,
    compiler: compile::Resolved,
    disk: Option<DiskCache>,
    /// Linked components by digest, with when each was last used (see `uses`).
    loaded: RwLock<HashMap<String, (TaskPre<State>, AtomicU64)>>,
    /// A clock of uses: the least recently used component has the smallest stamp.
    uses: AtomicU64,
    /// One lock per digest being compiled, so that a burst of attempts of a new component
    /// compiles it once.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    compile_permits: Arc<Semaphore>,
    /// One permit per pooled component instance.
    instances: Arc<Semaphore>,
}

impl Sandbox {
    /// Builds the engine and starts the epoch ticker thread, which ends once the last
    /// clone of this sandbox is dropped.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        let engine = engine::engine(&config)?;
        let linker = engine::linker(&engine)?;
        let compiler = config.compiler.resolve().map_err(SandboxError::Engine)?;
        let disk = match &config.cache_dir {
            Some(dir) => Some(DiskCache::new(
                dir.clone(),
                engine::engine_key(&engine),
                config.max_cached_artifacts,
            )?),
            None => None,
        };
        let config_instances = config.max_instances.max(1) as usize;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let inner = Arc::new(Inner {
            config,
            engine,
            linker,
            compiler,
            disk,
            loaded: RwLock::default(),
            uses: AtomicU64::new(0),
            loading: Mutex::default(),
            compile_permits: Arc::new(Semaphore::new(cpus)),
            instances: Arc::new(Semaphore::new(config_instances)),
        });
        spawn_ticker(Arc::downgrade(&inner))?;
        Ok(Sandbox { inner })
    }

    /// sha256 of the component bytes, lowercase hex: the component's identity everywhere.
    pub fn digest(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// Checks an upload and keeps it loaded; returns its digest. Refusals name the problem
    /// in words meant for the uploader.
    pub async fn validate(&self, bytes: &[u8]) -> Result<String, InvalidComponent> {
        let max = self.inner.config.max_component_bytes;
        if bytes.len() > max {
            return Err(InvalidComponent::TooLarge {
                size: bytes.len(),
                max,
            });
        }
        check_header(bytes)?;
        let digest = Self::digest(bytes);
        if self.is_loaded(&digest) {
            return Ok(digest);
        }
        let lock = self.inner.loading_lock(&digest);
        let guard = lock.lock().await;
        let result = self.validate_locked(&digest, bytes).await;
        drop(guard);
        self.inner.loading_done(&digest);
        result.map(|()| digest)
    }

    async fn validate_locked(&self, digest: &str, bytes: &[u8]) -> Result<(), InvalidComponent> {
        if self.is_loaded(digest) {
            return Ok(());
        }
        let component = self.compile(bytes).await.map_err(InvalidComponent::from)?;
        let pre = self.inner.link(&component)?;
        if let Some(disk) = &self.inner.disk {
            disk.put(digest, &component).await;
        }
        self.inner.insert(digest, pre);
        Ok(())
    }

    pub fn is_loaded(&self, digest: &str) -> bool {
        self.inner
            .loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(digest)
    }

    /// Loads a component that passed [`Sandbox::validate`] (on this or another host):
    /// from the disk cache when possible, else by compiling `bytes`.
    pub async fn load(&self, digest: &str, bytes: &[u8]) -> Result<(), SandboxError> {
        self.load_with(digest, || async { Ok::<_, SandboxError>(bytes) })
            .await
            .map_err(|e| match e {
                LoadError::Fetch(e) | LoadError::Load(e) => e,
            })
    }

    /// [`Sandbox::load`] with the bytes fetched only when the component is not loaded
    /// yet, by the first of the callers that want it at once: the others wait for its
    /// load. A worker's slots start together; each fetching the component itself read it
    /// once per slot from the store (50 times for a worker of 50, a Python component
    /// being tens of megabytes, through Redis's one thread) and hashed it as often.
    pub async fn load_with<B, E, F, Fut>(&self, digest: &str, fetch: F) -> Result<(), LoadError<E>>
    where
        B: AsRef<[u8]>,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<B, E>>,
    {
        if self.is_loaded(digest) {
            return Ok(());
        }
        let lock = self.inner.loading_lock(digest);
        let guard = lock.lock().await;
        let result = async {
            if self.is_loaded(digest) {
                return Ok(());
            }
            let fetched = fetch().await.map_err(LoadError::Fetch)?;
            let bytes = fetched.as_ref();
            // The digest names the cache file: never let other bytes be cached under it.
            if Self::digest(bytes) != digest {
                return Err(LoadError::Load(SandboxError::Compile(format!(
                    "the component bytes do not match digest {digest}"
                ))));
            }
            self.load_locked(digest, bytes)
                .await
                .map_err(LoadError::Load)
        }
        .await;
        drop(guard);
        self.inner.loading_done(digest);
        result
    }

    async fn load_locked(&self, digest: &str, bytes: &[u8]) -> Result<(), SandboxError> {
        if self.is_loaded(digest) {
            return Ok(());
        }
        let inner = &self.inner;
        if let Some(disk) = &inner.disk
            && let Some(component) = disk.get(&inner.engine, digest).await
        {
            match inner.link(&component) {
                Ok(pre) => {
                    inner.insert(digest, pre);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(digest, error = %e, "cached component does not link; recompiling")
                }
            }
        }
        let component = self
            .compile(bytes)
            .await
            .map_err(|e| SandboxError::Compile(InvalidComponent::from(e).to_string()))?;
        let pre = inner
            .link(&component)
            .map_err(|e| SandboxError::Compile(e.to_string()))?;
        if let Some(disk) = &inner.disk {
            disk.put(digest, &component).await;
        }
        inner.insert(digest, pre);
        Ok(())
    }

    async fn compile(&self, bytes: &[u8]) -> Result<Component, CompileError> {
        let inner = &self.inner;
        compile::compile(
            &inner.engine,
            &inner.compile_permits,
            &inner.compiler,
            bytes,
            compile::Bounds {
                timeout: inner.config.compile_timeout,
                memory_bytes: inner.config.compile_memory_bytes,
            },
        )
        .await
    }

    /// Runs one attempt in a fresh store. Waits for a free pool slot first (at most
    /// `max_instances` attempts run at once); the time limit starts once it has one.
    /// Never panics: every failure, including a bug in this crate, comes back as an
    /// [`AttemptError`].
    pub async fn run(&self, spec: AttemptSpec) -> AttemptResult {
        use futures_util::FutureExt;
        let start = Instant::now();
        if self.inner.config.stub_guests {
            return AttemptResult {
                outcome: AttemptOutcome::Output(spec.input),
                fuel_used: 0,
                peak_memory_bytes: 0,
                duration: start.elapsed(),
                egress_refused: 0,
            };
        }
        // Contain a panic in this crate without a task of its own: spawning would cost a
        // cross-thread wake-up per attempt (measured: 75 µs vs 190 µs per run of `hello`).
        let attempt = std::panic::AssertUnwindSafe(attempt(self.inner.clone(), spec, start));
        match attempt.catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                AttemptResult {
                    outcome: AttemptOutcome::Failed(failed(
                        ErrorReason::Host,
                        format!("the attempt crashed: {what}"),
                    )),
                    fuel_used: 0,
                    peak_memory_bytes: 0,
                    duration: start.elapsed(),
                    egress_refused: 0,
                }
            }
        }
    }
}

impl Inner {
    fn loading_lock(&self, digest: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(digest.to_string()).or_default().clone()
    }

    /// Forgets the digest's lock once nobody else waits on it.
    fn loading_done(&self, digest: &str) {
        let mut map = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        // 2 = the map's reference + the caller's.
        if map.get(digest).is_some_and(|l| Arc::strong_count(l) <= 2) {
            map.remove(digest);
        }
    }

    fn stamp(&self) -> u64 {
        self.uses.fetch_add(1, Ordering::Relaxed)
    }

    /// Keeps `pre` linked, dropping the least recently used component when the table is
    /// full (attempts running it keep their own reference).
    fn insert(&self, digest: &str, pre: TaskPre<State>) {
        let mut loaded = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        if loaded.len() >= self.config.max_loaded_components.max(1)
            && !loaded.contains_key(digest)
            && let Some(oldest) = loaded
                .iter()
                .min_by_key(|(_, (_, used))| used.load(Ordering::Relaxed))
                .map(|(d, _)| d.clone())
        {
            loaded.remove(&oldest);
        }
        loaded.insert(digest.to_string(), (pre, AtomicU64::new(self.stamp())));
    }

    fn pre(&self, digest: &str) -> Option<TaskPre<State>> {
        let loaded = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        let (pre, used) = loaded.get(digest)?;
        used.store(self.stamp(), Ordering::Relaxed);
        Some(pre.clone())
    }

    /// Resolves imports and the `run` export once per component, so that each attempt
    /// only instantiates.
    fn link(&self, component: &Component) -> Result<TaskPre<State>, InvalidComponent> {
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| InvalidComponent::UnsupportedImport(describe_import_error(&e)))?;
        TaskPre::new(pre).map_err(|e| InvalidComponent::MissingExport(format!("{e:#}")))
    }
}

fn spawn_ticker(inner: Weak<Inner>) -> Result<(), SandboxError> {
    std::thread::Builder::new()
        .name("wasq-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match inner.upgrade() {
                    Some(inner) => inner.engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .map(drop)
        .map_err(|e| SandboxError::Engine(format!("could not start the epoch thread: {e}")))
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

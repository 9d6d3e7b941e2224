//! The wasmtime engine and its accepted WebAssembly features, the linker, and the on-disk
//! cache of compiled artifacts.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, WasmFeatures,
};

use crate::host::{self, State};
use crate::limits::MAX_TABLE_ELEMENTS;
use crate::{SandboxConfig, SandboxError};

/// Pool slots per component instance. A Rust guest needs ~4 core instances, 1 memory and
/// 1-2 tables; interpreters built as components (JS, Python) need more, so there is head
/// room. Pool slots cost address space, not resident memory.
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 4;

/// Guest call stack; the async fiber stack (2 MiB by default) must exceed it.
const MAX_WASM_STACK: usize = 1 << 20;

/// Bytes of a freed linear memory / table that the pool resets in place (kept resident)
/// rather than returning to the kernel; see `engine`.
const KEEP_RESIDENT_MEMORY: usize = 2 << 20;
const KEEP_RESIDENT_TABLE: usize = 64 << 10;

/// The WebAssembly features a component may use: WebAssembly 2.0 (bulk memory,
/// reference types, multi-value, SIMD, ...), the component model, tail calls, extended
/// constant expressions and relaxed SIMD (in its deterministic mode, so that fuel and
/// results do not depend on the machine). Everything else is refused when an upload is
/// validated, with the feature named: threads and shared memory, memory64, GC, typed
/// function references, exceptions, multi-memory (the pool gives each module one
/// memory), stack switching, custom page sizes, wide arithmetic and the component
/// model's async, threading and other extensions.
pub(crate) const ALLOWED_FEATURES: WasmFeatures = WasmFeatures::WASM2
    .union(WasmFeatures::COMPONENT_MODEL)
    .union(WasmFeatures::TAIL_CALL)
    .union(WasmFeatures::EXTENDED_CONST)
    .union(WasmFeatures::RELAXED_SIMD);

/// Everything of the engine configuration that shapes compiled code. The compile child
/// builds its engine from this alone; the parent adds the pooling allocator, which does
/// not change compiled code (wasmtime checks the rest when it loads an artifact).
pub(crate) fn compile_config() -> Config {
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .wasm_features(WasmFeatures::all().difference(ALLOWED_FEATURES), false)
        .relaxed_simd_deterministic(true)
        // The component model's async ABI is refused (see ALLOWED_FEATURES), so stores
        // need none of its runtime state: without it a store is cheaper to create and to
        // drop (wasmtime otherwise disposes of an idle worker fiber with every store).
        .concurrency_support(false)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK);
    cfg
}

pub(crate) fn engine(config: &SandboxConfig) -> Result<Engine, SandboxError> {
    let n = config.max_instances.max(1);
    let max_memory = usize::try_from(config.max_memory_bytes)
        .map_err(|_| SandboxError::Engine("max_memory_bytes does not fit in usize".into()))?;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(n.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(n.saturating_mul(TABLES_PER_COMPONENT))
        .total_stacks(n)
        .max_memory_size(max_memory)
        .table_elements(MAX_TABLE_ELEMENTS)
        // Reset the pages an instance dirtied with memset instead of madvise when its slot
        // is freed: madvise unmaps them, and in a multi-threaded process every unmap is a
        // TLB shootdown (an IPI to every core running the process). With PAGEMAP_SCAN
        // (Linux 6.7+) only the pages actually written are reset; elsewhere the first
        // bytes are. Memory above these sizes is still given back with madvise.
        .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
        .table_keep_resident(KEEP_RESIDENT_TABLE)
        .pagemap_scan(Enabled::Auto);

    let mut cfg = compile_config();
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&cfg).map_err(|e| SandboxError::Engine(format!("{e:#}")))
}

/// Everything a guest may import: WASI 0.2, wasi:http's outgoing handler (through the
/// egress guard) and wasq:task.
pub(crate) fn linker(engine: &Engine) -> Result<Linker<State>, SandboxError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .and_then(|()| wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker))
        .and_then(|()| host::add_to_linker(&mut linker))
        .map_err(|e| SandboxError::Engine(format!("linking host functions: {e:#}")))?;
    Ok(linker)
}

/// Names the engine configuration in cache file names, so artifacts from another wasmtime
/// version or another set of options are never even opened.
pub(crate) fn engine_key(engine: &Engine) -> String {
    struct Sha(Sha256);
    impl Hasher for Sha {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = Sha(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    hex::encode(h.0.finalize())[..16].to_string()
}

/// Compiled artifacts on local disk, keyed by component digest and engine configuration.
pub(crate) struct DiskCache {
    dir: PathBuf,
    engine_key: String,
    /// Files kept at most; the least recently used (by modification time, which `get`
    /// refreshes) go first.
    max_files: usize,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl DiskCache {
    pub(crate) fn new(
        dir: PathBuf,
        engine_key: String,
        max_files: usize,
    ) -> Result<DiskCache, SandboxError> {
        std::fs::create_dir_all(&dir)?;
        Ok(DiskCache {
            dir,
            engine_key,
            max_files: max_files.max(1),
        })
    }

    /// Deletes the least recently used artifacts beyond `max_files`. Deleting a file a
    /// loaded component maps is safe: the mapping stays until it is dropped.
    fn prune(dir: &Path, max_files: usize) -> std::io::Result<usize> {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= max_files {
            return Ok(0);
        }
        files.sort();
        let excess = files.len() - max_files;
        for (_, path) in &files[..excess] {
            let _ = std::fs::remove_file(path);
        }
        Ok(excess)
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// A cached artifact, if there is a usable one. A corrupt or incompatible file is
    /// removed so that the caller's fresh compile replaces it.
    pub(crate) async fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return None;
        }
        let engine = engine.clone();
        let p = path.clone();
        match tokio::task::spawn_blocking(move || {
            // Marks it recently used, for `prune`.
            let _ = std::fs::File::options()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            deserialize_cached(&engine, &p)
        })
        .await
        {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "discarding unusable cached component");
                let _ = tokio::fs::remove_file(&path).await;
                None
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "loading cached component failed");
                None
            }
        }
    }

    /// Best effort: a failed write costs a recompile later, nothing else.
    pub(crate) async fn put(&self, digest: &str, component: &Component) {
        let path = self.path(digest);
        let component = component.clone();
        let (dir, max_files) = (self.dir.clone(), self.max_files);
        let res = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let bytes = component.serialize().map_err(|e| format!("{e:#}"))?;
            write_atomically(&path, &bytes).map_err(|e| e.to_string())?;
            Self::prune(&dir, max_files).map_err(|e| e.to_string())?;
            Ok(())
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(digest, error = %e, "could not cache compiled component"),
            Err(e) => tracing::warn!(digest, error = %e, "could not cache compiled component"),
        }
    }
}

/// Readers see either no file or a complete one: write elsewhere, then rename. Never
/// write over a cache file in place: loaded artifacts are mmapped, and truncating a
/// mapped file kills the process with SIGBUS.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[allow(unsafe_code)]
fn deserialize_cached(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize_file` trusts its input to be wasmtime-compiled code.
    // Files in the cache directory are written only by `DiskCache::put`, from
    // `Component::serialize` of a component this host compiled (in process or in its
    // compile child, see compile.rs), and their name carries the engine's compatibility
    // hash; user-supplied bytes never reach this path (uploads are refused unless they are
    // a WebAssembly component binary, and are only ever compiled). wasmtime additionally
    // checks the artifact's header, version and engine settings and errors on a mismatch.
    unsafe { Component::deserialize_file(engine, path) }
}

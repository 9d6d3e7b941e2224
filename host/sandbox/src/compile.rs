//! Compiling untrusted components under a time bound and a memory bound.
//!
//! Cranelift cannot be interrupted and has no memory budget of its own, so an upload is
//! compiled in a child process: this same executable started again with the argument
//! [`CHILD_ARG`] (its `main` calls [`compile_child_main`] before anything else). The child
//! caps its own address space (`RLIMIT_AS`) and CPU time (`RLIMIT_CPU`), reads the
//! component from stdin, validates and compiles it with the engine configuration of
//! [`crate::engine::compile_config`] and writes the serialized artifact to stdout. The
//! parent kills it (SIGKILL) at the wall-clock bound and turns whatever happened into a
//! sentence for the uploader.
//!
//! Why loading the child's artifact with `Component::deserialize` is sound: its input is
//! bytes this host wrote itself, produced by wasmtime's own compiler from bytes whose
//! digest the parent computed; user bytes never reach `deserialize`. wasmtime checks the
//! artifact's header, version and engine settings on load. A child subverted by a
//! compiler bug could hand back anything, but that child is the same code the parent
//! would otherwise have run in its own address space: the process boundary never makes
//! compiling less safe than `Component::new`, and it bounds time and memory.
//!
//! `Compiler::InProcess` (unit tests, embedders without the hook) compiles on a blocking
//! thread: bounded in time for the caller only, not in memory.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::Component;

/// argv[1] of a compile child. Anything else makes [`compile_child_main`] return.
pub const CHILD_ARG: &str = "__wasq-compile-child";

/// The whole environment of a compile child (nothing of the daemon's, keys and secrets
/// included, reaches the compiler). The allocator's address-space reservations count
/// against the child's RLIMIT_AS: glibc's malloc reserves 64 MiB per arena (fewer
/// arenas); mimalloc, the `wasq` binary's, 1 GiB per arena by default, the whole default
/// bound, after which not even a compiler thread could start (64 MiB at a time instead).
pub const CHILD_ENV: &[(&str, &str)] =
    &[("MALLOC_ARENA_MAX", "2"), ("MIMALLOC_ARENA_RESERVE", "64M")];

/// The child's exit code when the component itself was refused (message on stdout).
const EXIT_REFUSED: i32 = 3;
/// The child's exit code when its arguments or stdin were unusable (message on stdout).
const EXIT_USAGE: i32 = 4;

/// stderr kept from a child, to explain a crash.
const STDERR_KEEP: usize = 4 << 10;

/// Set once `compile_child_main` has run in this process: its executable can be a
/// compile child, so [`Compiler::Auto`] re-executes it.
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Where untrusted components are compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Compiler {
    /// In a child process of this executable when its `main` called
    /// [`compile_child_main`] (the `wasq` binary does), else in process with a warning.
    #[default]
    Auto,
    /// In a child process of this executable, whose `main` must call
    /// [`compile_child_main`] first; [`crate::Sandbox::new`] refuses otherwise.
    CurrentExe,
    /// In a child process of `program`, an executable built from this same source whose
    /// `main` calls [`compile_child_main`] first (tests use the `wasq-e2e` binary).
    Program(PathBuf),
    /// On a blocking thread of this process: the caller stops waiting at the time bound
    /// but the compile runs on, and memory is not bounded. For unit tests.
    InProcess,
}

/// A [`Compiler`] resolved to what actually runs.
#[derive(Debug, Clone)]
pub(crate) enum Resolved {
    Child(PathBuf),
    InProcess,
}

impl Compiler {
    pub(crate) fn resolve(&self) -> Result<Resolved, String> {
        let this = || {
            if !HOOKED.load(Ordering::Relaxed) {
                return Err(
                    "Compiler::CurrentExe needs `wasq_sandbox::compile_child_main()` \
                            at the top of the executable's main"
                        .to_string(),
                );
            }
            // The running image even if its file was replaced since (an upgrade in place).
            let proc_self = PathBuf::from("/proc/self/exe");
            if proc_self.exists() {
                return Ok(Resolved::Child(proc_self));
            }
            std::env::current_exe()
                .map(Resolved::Child)
                .map_err(|e| format!("cannot find this executable to compile in: {e}"))
        };
        match self {
            Compiler::Auto if HOOKED.load(Ordering::Relaxed) => this(),
            Compiler::Auto => {
                tracing::warn!(
                    "components are compiled in this process, bounded in time but not in memory: \
                     call wasq_sandbox::compile_child_main() at the top of main to compile in a \
                     child process"
                );
                Ok(Resolved::InProcess)
            }
            Compiler::CurrentExe => this(),
            Compiler::Program(p) if p.is_file() => Ok(Resolved::Child(p.clone())),
            Compiler::Program(p) => Err(format!("compile helper {} not found", p.display())),
            Compiler::InProcess => Ok(Resolved::InProcess),
        }
    }
}

/// Bounds of one compile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub timeout: Duration,
    pub memory_bytes: u64,
}

pub(crate) enum CompileError {
    Timeout(Duration),
    Memory(u64),
    Failed(String),
}

/// Compiles `bytes` within `bounds`. At most `permits` compiles run at once; waiting for
/// one counts against the time bound.
pub(crate) async fn compile(
    engine: &Engine,
    permits: &Arc<Semaphore>,
    compiler: &Resolved,
    bytes: &[u8],
    bounds: Bounds,
) -> Result<Component, CompileError> {
    let deadline = tokio::time::Instant::now() + bounds.timeout;
    let permit = tokio::time::timeout_at(deadline, permits.clone().acquire_owned())
        .await
        .map_err(|_| CompileError::Timeout(bounds.timeout))?
        .map_err(|_| CompileError::Failed("the compiler is shut down".into()))?;
    match compiler {
        Resolved::Child(program) => {
            let artifact = in_child(program, bytes, deadline, bounds).await;
            drop(permit);
            let engine = engine.clone();
            let load = tokio::task::spawn_blocking(move || load_artifact(&engine, &artifact?));
            match load.await {
                Ok(r) => r,
                Err(join) => Err(CompileError::Failed(format!(
                    "loading the compiled component crashed: {join}"
                ))),
            }
        }
        Resolved::InProcess => in_process(engine, permit, bytes, deadline, bounds).await,
    }
}

/// Cranelift cannot be interrupted, so a compile that outlives the bound keeps its
/// permit until it really ends: a flood of pathological uploads waits for permits
/// instead of piling up threads.
async fn in_process(
    engine: &Engine,
    permit: tokio::sync::OwnedSemaphorePermit,
    bytes: &[u8],
    deadline: tokio::time::Instant,
    bounds: Bounds,
) -> Result<Component, CompileError> {
    let engine = engine.clone();
    let bytes = bytes.to_vec();
    let job = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        Component::new(&engine, &bytes)
    });
    match tokio::time::timeout_at(deadline, job).await {
        Err(_) => Err(CompileError::Timeout(bounds.timeout)),
        Ok(Err(join)) => Err(CompileError::Failed(format!(
            "the compiler crashed: {join}"
        ))),
        Ok(Ok(Err(e))) => Err(refused(format!("{e:#}"), bounds)),
        Ok(Ok(Ok(c))) => Ok(c),
    }
}

#[allow(unsafe_code)]
fn load_artifact(engine: &Engine, artifact: &[u8]) -> Result<Component, CompileError> {
    // SAFETY: `artifact` is what our own compile child wrote to its stdout pipe: wasmtime's
    // serialization of a component it compiled from the upload, never the upload itself
    // (see the module docs for why that is as trustworthy as compiling in process).
    // wasmtime checks the ELF header, its version and the engine settings and errors on a
    // mismatch; the pooling allocator's limits are checked here too.
    unsafe { Component::deserialize(engine, artifact) }
        .map_err(|e| CompileError::Failed(format!("{e:#}")))
}

/// A compile error message, or the memory bound when that is what it really was.
fn refused(message: String, bounds: Bounds) -> CompileError {
    let oom = ["os error 12", "Cannot allocate memory", "out of memory"];
    if oom.iter().any(|s| message.contains(s)) {
        CompileError::Memory(bounds.memory_bytes)
    } else {
        CompileError::Failed(message)
    }
}

async fn in_child(
    program: &std::path::Path,
    bytes: &[u8],
    deadline: tokio::time::Instant,
    bounds: Bounds,
) -> Result<Vec<u8>, CompileError> {
    use std::process::Stdio;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    // A backstop for a child whose parent is gone: the wall-clock bound fires first, even
    // when every core compiles in parallel.
    let cpu_secs = bounds
        .timeout
        .as_secs()
        .saturating_add(1)
        .saturating_mul(cpus)
        + 1;
    let mut child = tokio::process::Command::new(program)
        .arg(CHILD_ARG)
        .arg(bounds.memory_bytes.to_string())
        .arg(cpu_secs.to_string())
        .env_clear()
        .envs(CHILD_ENV.iter().copied())
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            CompileError::Failed(format!(
                "cannot start the compiler process {}: {e}",
                program.display()
            ))
        })?;
    let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(CompileError::Failed(
            "the compiler process has no pipes".into(),
        ));
    };
    // The artifact cannot be larger than the child's address space.
    let out_cap = bounds.memory_bytes;
    let run = async {
        let write = async move {
            // An early exit of the child shows in its status; nothing to add here.
            let _ = stdin.write_all(bytes).await;
            drop(stdin);
        };
        let read_out = async move {
            let mut out = Vec::new();
            let r = stdout.take(out_cap).read_to_end(&mut out).await;
            r.map(|_| out)
        };
        let read_err = async move {
            let mut tail = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                let excess = tail.len().saturating_sub(STDERR_KEEP);
                tail.drain(..excess);
            }
            tail
        };
        let ((), out, err) = tokio::join!(write, read_out, read_err);
        (child.wait().await, out, err)
    };
    let (status, out, err) = match tokio::time::timeout_at(deadline, run).await {
        Ok(r) => r,
        Err(_) => {
            // SIGKILL; kill() also reaps it.
            let _ = child.kill().await;
            return Err(CompileError::Timeout(bounds.timeout));
        }
    };
    let status = status.map_err(|e| {
        CompileError::Failed(format!("waiting for the compiler process failed: {e}"))
    })?;
    let out = out.map_err(|e| {
        CompileError::Failed(format!("reading from the compiler process failed: {e}"))
    })?;
    let stderr = String::from_utf8_lossy(&err);
    if status.success() {
        return Ok(out);
    }
    let message = String::from_utf8_lossy(&out).trim().to_string();
    match status.code() {
        Some(EXIT_REFUSED) => return Err(refused(message, bounds)),
        Some(EXIT_USAGE) => {
            return Err(CompileError::Failed(format!(
                "the compiler process refused its task: {message}"
            )));
        }
        _ => {}
    }
    // Rust's allocator reports an allocation refused under RLIMIT_AS this way, then
    // aborts; a thread that could not get its stack panics with EAGAIN.
    if stderr.contains("memory allocation of")
        || stderr.contains("Cannot allocate memory")
        || stderr.contains("os error 12")
        || (stderr.contains("panicked") && stderr.contains("os error 11"))
    {
        return Err(CompileError::Memory(bounds.memory_bytes));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        match status.signal() {
            // RLIMIT_CPU's soft limit.
            Some(24) => return Err(CompileError::Timeout(bounds.timeout)),
            Some(9) => {
                return Err(CompileError::Failed(
                    "the compiler process was killed (SIGKILL), perhaps by the system's \
                     out-of-memory killer"
                        .into(),
                ));
            }
            _ => {}
        }
    }
    let stderr = stderr.trim();
    Err(CompileError::Failed(if stderr.is_empty() {
        format!("the compiler process failed ({status})")
    } else {
        format!("the compiler process failed ({status}): {stderr}")
    }))
}

/// The compile child's entry point. Call it first thing in `main` of every executable
/// that runs a [`crate::Sandbox`] with [`Compiler::Auto`] or [`Compiler::CurrentExe`]
/// (the `wasq` binary does). Started as a compile child (argv[1] is [`CHILD_ARG`]) it
/// compiles one component and exits; otherwise it returns at once.
pub fn compile_child_main() {
    HOOKED.store(true, Ordering::Relaxed);
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(CHILD_ARG)) {
        return;
    }
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let code = match child(&args) {
        Ok(artifact) => write_stdout(&artifact).map_or(1, |()| 0),
        Err((code, message)) => {
            let _ = write_stdout(message.as_bytes());
            code
        }
    };
    std::process::exit(code);
}

fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

fn child(args: &[String]) -> Result<Vec<u8>, (i32, String)> {
    let usage = |m: String| (EXIT_USAGE, m);
    let [memory, cpu_secs] = args else {
        return Err(usage(format!("expected 2 arguments, got {args:?}")));
    };
    let memory: u64 = memory
        .parse()
        .map_err(|e| usage(format!("memory bound {memory:?}: {e}")))?;
    let cpu_secs: u64 = cpu_secs
        .parse()
        .map_err(|e| usage(format!("CPU bound {cpu_secs:?}: {e}")))?;
    limit_self(memory, cpu_secs).map_err(|e| usage(format!("setting resource limits: {e}")))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
        .map_err(|e| usage(format!("reading the component: {e}")))?;
    let engine = Engine::new(&crate::engine::compile_config())
        .map_err(|e| usage(format!("wasmtime engine: {e:#}")))?;
    engine
        .precompile_component(&bytes)
        .map_err(|e| (EXIT_REFUSED, format!("{e:#}")))
}

#[cfg(unix)]
fn limit_self(memory: u64, cpu_secs: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let set = |resource, current: u64, maximum: u64| {
        setrlimit(
            resource,
            Rlimit {
                current: Some(current),
                maximum: Some(maximum),
            },
        )
    };
    set(Resource::As, memory, memory)?;
    // SIGXCPU at the soft limit, SIGKILL a second later.
    set(Resource::Cpu, cpu_secs, cpu_secs + 1)?;
    // No core file when the allocator aborts.
    set(Resource::Core, 0, 0)?;
    // Dies with the parent. Linux sends this when the *thread* that spawned the child
    // ends: the sandbox spawns from async code, i.e. from runtime worker threads, which
    // live as long as the runtime (nothing here uses `block_in_place`).
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

#[cfg(not(unix))]
fn limit_self(_memory: u64, _cpu_secs: u64) -> std::io::Result<()> {
    Ok(())
}

//! The host side of the `wasq:task` world: per-attempt store state, the imports a guest
//! calls, and the capture of stdout/stderr into log lines.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use wasq_core::{
    Clock, LogLevel, LogLine, LogSource, Progress, ReplayStep, Resolution, Wait, WaitOn,
    check_event_filter, names,
    text::{escape_controls, truncate_utf8},
};

use crate::egress::{self, EgressConfig};
use crate::limits::{MemoryLimiter, Stop};
use crate::{Journal, JournalError, RunInfo};

/// The generated bindings of the `wasq:task` world (its package `wasq:task` becomes
/// `bindings::wasq::task`; the CLI crate is also called `wasq`, hence the wrapper).
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "task",
        // `trappable`: every import returns `wasmtime::Result`, so a misbehaving guest or a
        // failing journal ends the attempt with a trap instead of a made-up return value.
        imports: { default: async | trappable },
        exports: { default: async },
        // The world includes wasi:cli/imports and wasi:http/outgoing-handler; without this
        // bindgen would generate WASI traits of its own for us to implement. wasmtime-wasi's
        // and wasmtime-wasi-http's implementations are linked instead.
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi": wasmtime_wasi::p2::bindings,
        },
    });
}

pub(crate) use bindings::TaskPre;

mod logs;
mod steps;

use bindings::wasq::task::{context, log, progress, step, types};
pub(crate) use logs::*;

/// Everything one attempt's `Store` owns. Built fresh for every attempt and dropped with it.
pub(crate) struct State {
    /// What the guest's sleeps and waits read as now.
    clock: Arc<dyn Clock>,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// wasi-http's hooks: every outbound request goes through it.
    egress: egress::Guard,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) logs: Arc<LogSink>,
    info: RunInfo,
    journal: Arc<dyn Journal>,
    /// Asked before every effect; once lost, the attempt stops (see [`Ownership`]).
    pub(crate) ownership: Arc<Ownership>,
    /// Outputs of steps completed by earlier attempts, by (name, occurrence); `None` for
    /// an output left out of the claim (read from the journal when the replay gets there).
    replay: HashMap<(String, u32), Option<Vec<u8>>>,
    /// How many times `begin` was called per name in this attempt.
    occurrences: HashMap<String, u32>,
    /// Steps begun but not yet completed: name => occurrence, and the step's span (closed
    /// once the step is stored, or with the attempt).
    pending: HashMap<String, (u32, tracing::Span)>,
    max_output_bytes: usize,
    /// Sleeps this short wait in the attempt; longer ones suspend the run.
    inline_sleep_max_ms: u64,
    durable_ops: u32,
    max_durable_ops: u32,
    pub(crate) deadline: Instant,
    pub(crate) cancel: CancellationToken,
    /// Why the epoch callback stopped the guest, if it did.
    pub(crate) stop: Option<Stop>,
}

pub(crate) struct StateParams {
    pub info: RunInfo,
    pub journal: Arc<dyn Journal>,
    pub steps: Vec<ReplayStep>,
    pub memory_limit: u64,
    pub log_bytes: usize,
    pub log_lines: usize,
    pub max_output_bytes: usize,
    pub inline_sleep_max_ms: u64,
    pub max_durable_ops: u32,
    pub deadline: Instant,
    pub cancel: CancellationToken,
    /// The function's allow-list of outbound HTTP hosts.
    pub allow_hosts: Vec<String>,
    /// What outbound requests carry as `traceparent`.
    pub traceparent: Option<wasq_core::TraceParent>,
    pub egress: EgressConfig,
    pub allow_loopback_egress: bool,
    pub clock: Arc<dyn Clock>,
}

impl State {
    /// Outbound requests the egress guard refused in this attempt.
    pub(crate) fn egress_refused(&self) -> u32 {
        self.egress.refused()
    }

    pub(crate) fn new(p: StateParams) -> State {
        let logs = Arc::new(LogSink::new(
            p.journal.clone(),
            p.info.attempt,
            p.log_bytes,
            p.log_lines,
            p.clock.clone(),
        ));
        // The builder starts with nothing: no preopens, env, args or inherited stdio, and a
        // socket address check that refuses everything. Only stdout/stderr are wired, and
        // only into the attempt's log.
        let mut wasi = WasiCtx::builder();
        wasi.stdout(LogStream {
            sink: logs.clone(),
            source: LogSource::Stdout,
        })
        .stderr(LogStream {
            sink: logs.clone(),
            source: LogSource::Stderr,
        })
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
        let replay = p
            .steps
            .into_iter()
            .map(|s| ((s.name, s.occurrence), s.output))
            .collect::<HashMap<_, _>>();
        let ownership = Ownership::new(p.journal.clone());
        let egress = egress::Guard::new(egress::GuardParams {
            allow_hosts: &p.allow_hosts,
            config: &p.egress,
            allow_loopback: p.allow_loopback_egress,
            traceparent: p.traceparent.as_ref(),
            deadline: p.deadline,
            logs: logs.clone(),
            ownership: ownership.clone(),
        });
        State {
            clock: p.clock,
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            egress,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(p.memory_limit),
            logs,
            info: p.info,
            journal: Arc::new(Noted {
                inner: p.journal,
                ownership: ownership.clone(),
            }),
            ownership,
            replay,
            occurrences: HashMap::new(),
            pending: HashMap::new(),
            max_output_bytes: p.max_output_bytes,
            inline_sleep_max_ms: p.inline_sleep_max_ms,
            durable_ops: 0,
            max_durable_ops: p.max_durable_ops,
            deadline: p.deadline,
            cancel: p.cancel,
            stop: None,
        }
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.egress,
        }
    }
}

/// Adds the wasq:task imports. Not `Task::add_to_linker`: that would also try to add the
/// WASI interfaces remapped above, which `wasmtime_wasi` has already added.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<State>,
) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    context::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    step::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    log::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    progress::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    types::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    Ok(())
}

fn guest_error(msg: String) -> wasmtime::Error {
    wasmtime::Error::new(Stop::Guest(msg))
}

impl types::Host for State {}

impl context::Host for State {
    async fn info(&mut self) -> wasmtime::Result<context::RunInfo> {
        let i = &self.info;
        Ok(context::RunInfo {
            run_id: i.run_id.clone(),
            function: i.function.clone(),
            tenant: i.tenant.clone(),
            attempt: i.attempt,
            max_attempts: i.max_attempts,
            trigger: i.trigger.clone(),
        })
    }

    async fn time_left(&mut self) -> wasmtime::Result<u64> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        Ok(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
    }
}

impl log::Host for State {
    async fn write(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.logs.guest(level, message);
        Ok(())
    }
}

impl progress::Host for State {
    async fn report(&mut self, percent: u8, message: Option<String>) -> wasmtime::Result<()> {
        // Bounded like a log line would be, without charging the log budget: progress
        // replaces itself, it does not accumulate.
        let message = message.map(|m| truncate_utf8(m, 1024));
        self.journal.progress(Progress {
            percent: percent.min(100),
            message,
        });
        Ok(())
    }
}

/// Whether the attempt still owns its run, as its journal says (see
/// [`Journal::ensure_owned`]), and whether a storage quota refused one of its effects.
/// The first refusal of each kind sticks: once ownership is lost every effect is refused
/// and the epoch callback stops the guest.
pub(crate) struct Ownership {
    journal: Arc<dyn Journal>,
    lost: OnceLock<String>,
    storage_refused: OnceLock<String>,
}

impl Ownership {
    pub(crate) fn new(journal: Arc<dyn Journal>) -> Arc<Ownership> {
        Arc::new(Ownership {
            journal,
            lost: OnceLock::new(),
            storage_refused: OnceLock::new(),
        })
    }

    /// Why ownership was lost, once it was.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.get().cloned()
    }

    /// Why a storage quota refused an effect, once one did.
    pub(crate) fn storage_refused(&self) -> Option<String> {
        self.storage_refused.get().cloned()
    }

    /// Asks the journal before an effect; `Err(why)` once it refuses.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(why) = self.lost.get() {
            return Err(why.clone());
        }
        self.journal.ensure_owned().map_err(|why| {
            let _ = self.lost.set(why);
            self.lost.get().cloned().unwrap_or_default()
        })
    }

    /// Stores what the journal kept back ([`Journal::settle`]) before an effect that
    /// leaves the sandbox; `Err(why)` when it could not, noted like any failed journal call.
    pub(crate) async fn settle(&self) -> Result<(), String> {
        self.journal.settle().await.map_err(|e| {
            self.note(&e);
            e.to_string()
        })
    }

    /// Notes what a failed journal call says about the attempt.
    fn note(&self, e: &JournalError) {
        match e {
            JournalError::LeaseLost(why) => {
                let _ = self.lost.set(why.clone());
            }
            JournalError::StorageQuota(why) => {
                let _ = self.storage_refused.set(why.clone());
            }
            JournalError::Failed(_) => {}
        }
    }
}

/// The journal as the host functions use it: every failed call is noted on the attempt's
/// [`Ownership`] on its way to the guest, so what the guest makes of it cannot change how
/// the attempt ends.
struct Noted {
    inner: Arc<dyn Journal>,
    ownership: Arc<Ownership>,
}

impl Noted {
    fn seen<T>(&self, r: Result<T, JournalError>) -> Result<T, JournalError> {
        if let Err(e) = &r {
            self.ownership.note(e);
        }
        r
    }
}

#[async_trait::async_trait]
impl Journal for Noted {
    async fn complete_step(
        &self,
        name: &str,
        occurrence: u32,
        output: &[u8],
    ) -> Result<(), JournalError> {
        self.seen(self.inner.complete_step(name, occurrence, output).await)
    }

    async fn send_event(
        &self,
        event: &str,
        data: serde_json::Value,
        id: &str,
    ) -> Result<(), JournalError> {
        self.seen(self.inner.send_event(event, data, id).await)
    }

    async fn start_run(
        &self,
        function: &str,
        input: &[u8],
        key: &str,
    ) -> Result<String, JournalError> {
        self.seen(self.inner.start_run(function, input, key).await)
    }

    async fn load_step(&self, name: &str, occurrence: u32) -> Result<Vec<u8>, JournalError> {
        self.seen(self.inner.load_step(name, occurrence).await)
    }

    fn log(&self, line: LogLine) {
        self.inner.log(line);
    }

    fn progress(&self, progress: Progress) {
        self.inner.progress(progress);
    }

    async fn settle(&self) -> Result<(), JournalError> {
        self.seen(self.inner.settle().await)
    }

    fn ensure_owned(&self) -> Result<(), String> {
        self.inner.ensure_owned()
    }
}

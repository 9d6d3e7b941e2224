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
    Clock, LogLevel, LogLine, LogSource, Progress, ReplayStep, Resolution, SystemClock, Wait,
    WaitOn, check_event_filter, names,
    text::{escape_controls, truncate_utf8},
};

use crate::egress::{self, EgressConfig};
use crate::limits::{MemoryLimiter, Stop};
use crate::{Journal, RunInfo};

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
use bindings::wasq::task::{context, log, progress, step, types};

/// Everything one attempt's `Store` owns. Built fresh for every attempt and dropped with it.
pub(crate) struct State {
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
    /// Steps begun but not yet completed: name => occurrence.
    pending: HashMap<String, u32>,
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
    pub egress: EgressConfig,
    pub allow_loopback_egress: bool,
}

impl State {
    pub(crate) fn new(p: StateParams) -> State {
        let logs = Arc::new(LogSink::new(
            p.journal.clone(),
            p.info.attempt,
            p.log_bytes,
            p.log_lines,
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
            deadline: p.deadline,
            logs: logs.clone(),
            ownership: ownership.clone(),
        });
        State {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            egress,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(p.memory_limit),
            logs,
            info: p.info,
            journal: p.journal,
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
/// [`Journal::ensure_owned`]). The first refusal sticks: from then on every effect is
/// refused and the epoch callback stops the guest.
pub(crate) struct Ownership {
    journal: Arc<dyn Journal>,
    lost: OnceLock<String>,
}

impl Ownership {
    pub(crate) fn new(journal: Arc<dyn Journal>) -> Arc<Ownership> {
        Arc::new(Ownership {
            journal,
            lost: OnceLock::new(),
        })
    }

    /// Why ownership was lost, once it was.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.get().cloned()
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
}

/// Step names are stored with every step and shown in UIs.
const MAX_STEP_NAME_BYTES: usize = 256;

/// What a sleep stores as its step output: the wake-up time, fixed by the first attempt
/// that reached the sleep, so replays neither restart nor shorten it.
#[derive(serde::Serialize, serde::Deserialize)]
struct SleepRecord {
    wake_at: i64,
}

impl State {
    /// The occurrence index of the next step named `name` in this attempt.
    /// Every durable operation (step, sleep, wait, child run, event) goes through here,
    /// which bounds what one attempt can make the store hold: at most
    /// `max_durable_ops` of them, with names of at most [`MAX_STEP_NAME_BYTES`].
    fn next_occurrence(&mut self, name: &str) -> wasmtime::Result<u32> {
        // Before anything else: a worker that lost the run must not start the step body,
        // sleep, wait, child run or event that follows (another worker may be at it).
        self.ownership
            .check()
            .map_err(|why| wasmtime::Error::new(Stop::Abandoned(why)))?;
        if name.len() > MAX_STEP_NAME_BYTES {
            return Err(guest_error(format!(
                "step name of {} bytes is over the limit of {MAX_STEP_NAME_BYTES}",
                name.len()
            )));
        }
        self.durable_ops += 1;
        if self.durable_ops > self.max_durable_ops {
            return Err(guest_error(format!(
                "more than {} durable steps (steps, sleeps, waits, child runs, events) in one run",
                self.max_durable_ops
            )));
        }
        let counter = self.occurrences.entry(name.to_owned()).or_insert(0);
        let occurrence = *counter;
        *counter += 1;
        Ok(occurrence)
    }

    /// The stored output of step (`name`, `occurrence`) if an earlier attempt completed
    /// it: from the claim, or read now when it was too big to come with it. Taken out of
    /// the replay set, so the attempt holds each output once at most.
    async fn stored_output(
        &mut self,
        name: &str,
        occurrence: u32,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        match self.replay.remove(&(name.to_owned(), occurrence)) {
            None => Ok(None),
            Some(Some(output)) => Ok(Some(output)),
            Some(None) => self
                .journal
                .load_step(name, occurrence)
                .await
                .map(Some)
                .map_err(|msg| wasmtime::Error::new(Stop::Journal(msg))),
        }
    }

    /// A stored step output parsed as `T`; a different shape means the code outside
    /// steps changed what it does at this point between attempts.
    async fn replayed<T: serde::de::DeserializeOwned>(
        &mut self,
        name: &str,
        occurrence: u32,
        what: &str,
    ) -> wasmtime::Result<Option<T>> {
        match self.stored_output(name, occurrence).await? {
            None => Ok(None),
            Some(stored) => serde_json::from_slice(&stored).map(Some).map_err(|_| {
                guest_error(format!(
                    "step {name:?} #{occurrence} was not {what} in an earlier attempt: \
                     the code outside steps is not deterministic"
                ))
            }),
        }
    }

    fn idempotency_key(&self, kind: &str, name: &str, occurrence: u32) -> String {
        format!("{kind}:{}:{name}:{occurrence}", self.info.run_id)
    }

    /// A sleep is a step: its first execution stores the wake-up time; every replay reads
    /// it back. Short remaining waits are slept here; longer ones end the attempt as
    /// suspended, freeing the worker slot until the run is due again.
    async fn durable_sleep(&mut self, name: String, wake_at: i64) -> wasmtime::Result<()> {
        let occurrence = self.next_occurrence(&name)?;
        let wake_at = match self
            .replayed::<SleepRecord>(&name, occurrence, "a sleep")
            .await?
        {
            Some(r) => r.wake_at,
            None => {
                let record = serde_json::to_vec(&SleepRecord { wake_at }).expect("serialises");
                store_step(&self.journal, &name, occurrence, &record).await?;
                wake_at
            }
        };
        let remaining = wake_at.saturating_sub(SystemClock.now_ms());
        if remaining <= 0 {
            return Ok(());
        }
        let remaining = Duration::from_millis(remaining as u64);
        let fits = Instant::now() + remaining < self.deadline;
        if remaining.as_millis() as u64 > self.inline_sleep_max_ms || !fits {
            return Err(wasmtime::Error::new(Stop::Suspend(wake_at)));
        }
        tokio::select! {
            () = tokio::time::sleep(remaining) => Ok(()),
            () = self.cancel.cancelled() => Err(wasmtime::Error::new(Stop::Cancelled)),
        }
    }
}

impl step::Host for State {
    async fn begin(&mut self, name: String) -> wasmtime::Result<Option<Vec<u8>>> {
        let occurrence = self.next_occurrence(&name)?;
        match self.stored_output(&name, occurrence).await? {
            Some(output) => Ok(Some(output)),
            None => {
                self.pending.insert(name, occurrence);
                Ok(None)
            }
        }
    }

    async fn complete(&mut self, name: String, output: Vec<u8>) -> wasmtime::Result<()> {
        let Some(occurrence) = self.pending.remove(&name) else {
            return Err(guest_error(format!(
                "step.complete({name:?}) called without step.begin"
            )));
        };
        if output.len() > self.max_output_bytes {
            return Err(guest_error(format!(
                "step {name:?} output is {} bytes, over the limit of {} bytes",
                output.len(),
                self.max_output_bytes
            )));
        }
        // The guest must not continue past a step whose output is not durable: a crash
        // right after would replay the step's side effects.
        store_step(&self.journal, &name, occurrence, &output).await
    }

    async fn sleep(&mut self, name: String, millis: u64) -> wasmtime::Result<()> {
        let now = SystemClock.now_ms();
        let wake_at = now.saturating_add(i64::try_from(millis).unwrap_or(i64::MAX));
        self.durable_sleep(name, wake_at).await
    }

    async fn sleep_until(&mut self, name: String, unix_millis: u64) -> wasmtime::Result<()> {
        let wake_at = i64::try_from(unix_millis).unwrap_or(i64::MAX);
        self.durable_sleep(name, wake_at).await
    }

    async fn wait_for_event(
        &mut self,
        name: String,
        event: String,
        if_: Option<String>,
        timeout_millis: u64,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_event_name(&event).map_err(guest_error)?;
        if let Some(filter) = &if_
            && filter.len() > names::MAX_EVENT_FILTER
        {
            return Err(guest_error(format!(
                "wait-for-event filter of {} bytes is over the limit of {}",
                filter.len(),
                names::MAX_EVENT_FILTER
            )));
        }
        match self
            .replayed::<Resolution>(&name, occurrence, "a wait for an event")
            .await?
        {
            Some(Resolution::Event { data }) => return Ok(Some(data.to_string().into_bytes())),
            Some(Resolution::TimedOut) => return Ok(None),
            Some(_) => {
                return Err(guest_error(format!(
                    "step {name:?} was not a wait for an event"
                )));
            }
            None => {}
        }
        if let Some(filter) = &if_ {
            check_event_filter(filter).map_err(guest_error)?;
        }
        let until = (timeout_millis > 0).then(|| {
            SystemClock
                .now_ms()
                .saturating_add(i64::try_from(timeout_millis).unwrap_or(i64::MAX))
        });
        Err(wasmtime::Error::new(Stop::Wait(Wait {
            step: name,
            occurrence,
            on: WaitOn::Event {
                name: event,
                filter: if_,
            },
            until,
        })))
    }

    async fn invoke(
        &mut self,
        name: String,
        function: String,
        input: Vec<u8>,
    ) -> wasmtime::Result<String> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_function_name(&function).map_err(guest_error)?;
        if let Some(r) = self
            .replayed::<ChildRecord>(&name, occurrence, "an invoke")
            .await?
        {
            return Ok(r.run_id);
        }
        let key = self.idempotency_key("child", &name, occurrence);
        let run_id = start_child(&self.journal, &function, &input, &key).await?;
        let record = serde_json::to_vec(&ChildRecord {
            run_id: run_id.clone(),
        })
        .expect("serialises");
        store_step(&self.journal, &name, occurrence, &record).await?;
        Ok(run_id)
    }

    async fn call(
        &mut self,
        name: String,
        function: String,
        input: Vec<u8>,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_function_name(&function).map_err(guest_error)?;
        if let Some(resolution) = self
            .replayed::<Resolution>(&name, occurrence, "a call")
            .await?
        {
            return run_result(&name, resolution);
        }
        let key = self.idempotency_key("child", &name, occurrence);
        let run_id = start_child(&self.journal, &function, &input, &key).await?;
        Err(wait_on_run(name, occurrence, run_id))
    }

    async fn join(
        &mut self,
        name: String,
        run_id: String,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_run_id(&run_id).map_err(guest_error)?;
        if let Some(resolution) = self
            .replayed::<Resolution>(&name, occurrence, "a join")
            .await?
        {
            return run_result(&name, resolution);
        }
        Err(wait_on_run(name, occurrence, run_id))
    }

    async fn send_event(
        &mut self,
        name: String,
        event: String,
        data: Vec<u8>,
    ) -> wasmtime::Result<()> {
        let occurrence = self.next_occurrence(&name)?;
        names::check_event_name(&event).map_err(guest_error)?;
        if self
            .replayed::<serde_json::Value>(&name, occurrence, "a sent event")
            .await?
            .is_some()
        {
            return Ok(());
        }
        let data: serde_json::Value = serde_json::from_slice(&data)
            .map_err(|e| guest_error(format!("send-event {event:?}: the data is not JSON: {e}")))?;
        // The id makes the send exactly-once even if the step record below is lost.
        let id = self.idempotency_key("event", &name, occurrence);
        self.journal
            .send_event(&event, data, &id)
            .await
            .map_err(|msg| wasmtime::Error::new(Stop::Journal(msg)))?;
        let record =
            serde_json::to_vec(&serde_json::json!({ "event_id": id })).expect("serialises");
        store_step(&self.journal, &name, occurrence, &record).await
    }
}

/// What `invoke` stores: the child's id, returned again on replay.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildRecord {
    run_id: String,
}

/// Starts a child run. The key (from the step) makes it exactly-once: a replay before
/// the step is recorded finds the same run.
async fn start_child(
    journal: &Arc<dyn Journal>,
    function: &str,
    input: &[u8],
    key: &str,
) -> wasmtime::Result<String> {
    journal
        .start_run(function, input, key)
        .await
        .map_err(guest_error)
}

/// Stores a step output before the guest may go on; a failure ends the attempt.
async fn store_step(
    journal: &Arc<dyn Journal>,
    name: &str,
    occurrence: u32,
    output: &[u8],
) -> wasmtime::Result<()> {
    journal
        .complete_step(name, occurrence, output)
        .await
        .map_err(|msg| wasmtime::Error::new(Stop::Journal(msg)))
}

/// Suspends the run until run `id` ends; its result becomes step (`name`, `occurrence`).
fn wait_on_run(name: String, occurrence: u32, id: String) -> wasmtime::Error {
    wasmtime::Error::new(Stop::Wait(Wait {
        step: name,
        occurrence,
        on: WaitOn::Run { id },
        until: None,
    }))
}

/// A finished `call` / `join`: the run's output, or why it did not succeed.
fn run_result(name: &str, resolution: Resolution) -> wasmtime::Result<Result<Vec<u8>, String>> {
    match resolution {
        Resolution::Output { output } => Ok(Ok(match output {
            // Outputs that were not JSON were stored as strings: give back the text.
            serde_json::Value::String(s) => serde_json::to_vec(&s).expect("serialises"),
            v => v.to_string().into_bytes(),
        })),
        Resolution::Error { message } => Ok(Err(message)),
        _ => Err(guest_error(format!("step {name:?} was not a call or join"))),
    }
}

/// How much of stderr is kept (outside the log budget) to find a Rust panic message.
const STDERR_TAIL_BYTES: usize = 8 << 10;

/// Longest stdout/stderr line buffered: a longer one is cut into lines of this size.
const MAX_STREAM_LINE_BYTES: usize = 16 << 10;

/// Turns guest output into log lines, escaped (see [`escape_controls`]) and charged to
/// one per-attempt budget of bytes (as stored, escapes included, plus one per line) and
/// lines.
///
/// Past the budget lines are dropped *silently* for the guest, with a single marker line
/// in the log: a write error would make the guest's `println!` panic, turning
/// chatty-but-correct code into a failed attempt.
pub(crate) struct LogSink {
    journal: Arc<dyn Journal>,
    attempt: u32,
    max_bytes: usize,
    max_lines: usize,
    state: Mutex<SinkState>,
}

#[derive(Default)]
struct SinkState {
    bytes: usize,
    lines: usize,
    truncated: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stderr_tail: Vec<u8>,
}

impl LogSink {
    pub(crate) fn new(
        journal: Arc<dyn Journal>,
        attempt: u32,
        max_bytes: usize,
        max_lines: usize,
    ) -> LogSink {
        LogSink {
            journal,
            attempt,
            max_bytes,
            max_lines,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SinkState> {
        // A panic while holding this lock can only come from a bug here; the buffered
        // text is still fine to use.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn line(&self, level: LogLevel, source: LogSource, message: String) -> LogLine {
        LogLine {
            attempt: self.attempt,
            at: SystemClock.now_ms(),
            level,
            source,
            message,
        }
    }

    /// A line from wasq itself about this attempt; not charged to the budget. It may
    /// quote the guest (a URL, a backtrace), so it is escaped too, newlines apart.
    pub(crate) fn host(&self, level: LogLevel, message: String) {
        let (message, _) = escape_controls(&message, true, usize::MAX);
        self.journal.log(self.line(level, LogSource::Host, message));
    }

    /// Escapes `text` and keeps it as a line if the budget allows, or as much of it as
    /// fits; past the budget, adds the one truncation marker.
    fn push(
        &self,
        st: &mut SinkState,
        out: &mut Vec<LogLine>,
        level: LogLevel,
        source: LogSource,
        text: &str,
    ) {
        if st.truncated {
            return;
        }
        if st.lines >= self.max_lines {
            return self.overflowed(st, out, format!("{} lines", self.max_lines));
        }
        // +1 as if for the newline: empty lines must not be free, or a guest could
        // write unlimited numbers of them.
        let room = self.max_bytes - st.bytes;
        if room == 0 {
            return self.overflowed(st, out, format!("{} bytes", self.max_bytes));
        }
        let (escaped, complete) = escape_controls(text, false, room - 1);
        if complete || !escaped.is_empty() {
            st.bytes += escaped.len() + 1;
            st.lines += 1;
            out.push(self.line(level, source, escaped));
        }
        if !complete {
            self.overflowed(st, out, format!("{} bytes", self.max_bytes));
        }
    }

    /// The first time the budget overflows: drop the partial lines (there is no room for
    /// them) and add the single truncation notice.
    fn overflowed(&self, st: &mut SinkState, out: &mut Vec<LogLine>, limit: String) {
        if !st.truncated {
            st.truncated = true;
            st.stdout = Vec::new();
            st.stderr = Vec::new();
            out.push(self.line(
                LogLevel::Warn,
                LogSource::Host,
                format!(
                    "log output truncated at {limit}, this attempt's log limit: the rest of \
                     its log is dropped (the attempt goes on)"
                ),
            ));
        }
    }

    fn flush_partial(&self, st: &mut SinkState, out: &mut Vec<LogLine>) {
        for (source, level) in [
            (LogSource::Stdout, LogLevel::Info),
            (LogSource::Stderr, LogLevel::Warn),
        ] {
            let buf = match source {
                LogSource::Stdout => std::mem::take(&mut st.stdout),
                _ => std::mem::take(&mut st.stderr),
            };
            if !buf.is_empty() {
                self.push(st, out, level, source, &String::from_utf8_lossy(&buf));
            }
        }
    }

    fn emit(&self, lines: Vec<LogLine>) {
        for l in lines {
            self.journal.log(l);
        }
    }

    pub(crate) fn guest(&self, level: LogLevel, message: String) {
        let mut out = Vec::new();
        self.push(
            &mut self.lock(),
            &mut out,
            level,
            LogSource::Guest,
            &message,
        );
        self.emit(out);
    }

    fn stream(&self, source: LogSource, bytes: &[u8]) {
        let mut out = Vec::new();
        {
            let mut guard = self.lock();
            let st = &mut *guard;
            if source == LogSource::Stderr {
                st.stderr_tail.extend_from_slice(bytes);
                let excess = st.stderr_tail.len().saturating_sub(STDERR_TAIL_BYTES);
                st.stderr_tail.drain(..excess);
            }
            let level = match source {
                LogSource::Stdout => LogLevel::Info,
                _ => LogLevel::Warn,
            };
            for &b in bytes {
                if st.truncated {
                    break;
                }
                let buf = match source {
                    LogSource::Stdout => &mut st.stdout,
                    _ => &mut st.stderr,
                };
                if b == b'\n' {
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                    let line = std::mem::take(buf);
                    // Blank lines (Rust's panic output starts with one) carry nothing.
                    if !line.is_empty() {
                        self.push(st, &mut out, level, source, &String::from_utf8_lossy(&line));
                    }
                } else {
                    buf.push(b);
                    if buf.len() >= MAX_STREAM_LINE_BYTES {
                        let line = std::mem::take(buf);
                        self.push(st, &mut out, level, source, &String::from_utf8_lossy(&line));
                    }
                }
            }
        }
        self.emit(out);
    }

    /// Emits the unterminated last lines; called once the guest has stopped.
    pub(crate) fn finish(&self) {
        let mut out = Vec::new();
        self.flush_partial(&mut self.lock(), &mut out);
        self.emit(out);
    }

    /// The last Rust panic message written to stderr, e.g. "panicked at src/lib.rs:3:5: boom".
    pub(crate) fn panic_message(&self) -> Option<String> {
        let st = self.lock();
        let tail = String::from_utf8_lossy(&st.stderr_tail);
        let at = tail.rfind("panicked at ")?;
        let text: Vec<&str> = tail[at..]
            .lines()
            .take_while(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        Some(truncate_utf8(text.join(" "), 2048))
    }
}

/// stdout or stderr of one attempt.
struct LogStream {
    sink: Arc<LogSink>,
    source: LogSource,
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    // Our own OutputStream rather than the default AsyncWriteStream adapter: writes land
    // synchronously, so everything the guest printed is in the log (in order) by the time
    // the call returns, with no background task to drain.
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LogWriter {
            sink: self.sink.clone(),
            source: self.source,
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LogWriter {
            sink: self.sink.clone(),
            source: self.source,
        })
    }
}

struct LogWriter {
    sink: Arc<LogSink>,
    source: LogSource,
}

/// What `check-write` grants per call; the guest loops for larger writes.
const WRITE_PERMIT: usize = 64 << 10;

#[async_trait::async_trait]
impl Pollable for LogWriter {
    async fn ready(&mut self) {}
}

#[async_trait::async_trait]
impl OutputStream for LogWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.sink.stream(self.source, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for LogWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.sink.stream(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Lines(Mutex<Vec<LogLine>>);

    #[async_trait::async_trait]
    impl Journal for Lines {
        async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), String> {
            Ok(())
        }
        async fn send_event(&self, _: &str, _: serde_json::Value, _: &str) -> Result<(), String> {
            Ok(())
        }
        async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, String> {
            Err("no runs here".into())
        }
        async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, String> {
            Err("no steps here".into())
        }
        fn log(&self, line: LogLine) {
            self.0.lock().unwrap().push(line);
        }
        fn progress(&self, _: Progress) {}
    }

    fn texts(j: &Lines) -> Vec<(LogSource, String)> {
        j.0.lock()
            .unwrap()
            .iter()
            .map(|l| (l.source, l.message.clone()))
            .collect()
    }

    const LINES: usize = 10_000;

    #[test]
    fn stdout_lines_split_and_cap_drops_silently() {
        let j = Arc::new(Lines::default());
        // "hello\n" + "world\n" = 12 bytes; 3 more hold "mo" and the newline.
        let sink = LogSink::new(j.clone(), 1, 15, LINES);
        sink.stream(LogSource::Stdout, b"hello\r\n\nwor");
        sink.stream(LogSource::Stdout, b"ld\nmore text\n");
        sink.stream(LogSource::Stdout, b"dropped\n");
        sink.finish();
        assert_eq!(
            texts(&j),
            vec![
                (LogSource::Stdout, "hello".into()),
                (LogSource::Stdout, "world".into()),
                (LogSource::Stdout, "mo".into()),
                (
                    LogSource::Host,
                    "log output truncated at 15 bytes, this attempt's log limit: the rest of \
                     its log is dropped (the attempt goes on)"
                        .into()
                ),
            ]
        );
    }

    #[test]
    fn guest_lines_share_the_budget_and_empty_lines_cost() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 10, LINES);
        sink.guest(LogLevel::Info, "abc".into());
        sink.stream(LogSource::Stderr, b"de\n");
        for _ in 0..10 {
            sink.guest(LogLevel::Info, String::new());
        }
        sink.guest(LogLevel::Info, "never".into());
        let got = texts(&j);
        assert_eq!(
            got[..5],
            [
                (LogSource::Guest, "abc".into()),
                (LogSource::Stderr, "de".into()),
                (LogSource::Guest, "".into()),
                (LogSource::Guest, "".into()),
                (LogSource::Guest, "".into()),
            ]
        );
        assert_eq!(got.len(), 6, "{got:?}");
        assert!(got[5].1.starts_with("log output truncated at 10 bytes"));
    }

    #[test]
    fn the_line_budget_ends_with_one_marker() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, 3);
        for i in 0..100 {
            sink.guest(LogLevel::Info, format!("line {i}"));
            sink.stream(LogSource::Stdout, b"out\n");
        }
        sink.finish();
        let got = texts(&j);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[2], (LogSource::Guest, "line 1".into()));
        assert!(
            got[3].1.starts_with("log output truncated at 3 lines"),
            "{got:?}"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES);
        sink.guest(
            LogLevel::Info,
            "\x1b[31mred\x1b[0m\nINFO forged line\rover\x07\u{9b}2J\u{202e}evil\tok".into(),
        );
        sink.stream(LogSource::Stdout, b"\x1b]0;title\x07 \x00 \x7f\n");
        sink.host(LogLevel::Error, "backtrace:\n  0: \x1b[2Jf".into());
        assert_eq!(
            texts(&j),
            vec![
                (
                    LogSource::Guest,
                    "\\u{1b}[31mred\\u{1b}[0m\\nINFO forged line\\rover\\u{7}\\u{9b}2J\\u{202e}evil\tok"
                        .into()
                ),
                (LogSource::Stdout, "\\u{1b}]0;title\\u{7} \\u{0} \\u{7f}".into()),
                (LogSource::Host, "backtrace:\n  0: \\u{1b}[2Jf".into()),
            ]
        );
    }

    #[test]
    fn escapes_count_against_the_budget_and_are_never_cut() {
        let j = Arc::new(Lines::default());
        // 4 + 1 bytes fit: "ab" and the start of an escape would not.
        let sink = LogSink::new(j.clone(), 1, 8, LINES);
        sink.guest(LogLevel::Info, "ab\x1bcd".into());
        let got = texts(&j);
        assert_eq!(got[0], (LogSource::Guest, "ab".into()));
        assert!(got[1].1.contains("truncated at 8 bytes"), "{got:?}");
    }

    #[test]
    fn long_stream_lines_are_cut() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES);
        sink.stream(
            LogSource::Stdout,
            &vec![b'x'; MAX_STREAM_LINE_BYTES * 2 + 5],
        );
        sink.finish();
        let lens: Vec<usize> = texts(&j).iter().map(|(_, t)| t.len()).collect();
        assert_eq!(lens, [MAX_STREAM_LINE_BYTES, MAX_STREAM_LINE_BYTES, 5]);
    }

    #[test]
    fn panic_message_is_found_in_stderr() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES);
        sink.stream(
            LogSource::Stderr,
            b"\nthread '<unnamed>' panicked at src/lib.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
        );
        assert_eq!(
            sink.panic_message().as_deref(),
            Some("panicked at src/lib.rs:3:5: boom")
        );
    }
}

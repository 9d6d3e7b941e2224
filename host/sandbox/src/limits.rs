//! Per-attempt limits and the translation of how an attempt ended into a [`RunError`]
//! a user can act on.

use wasmtime::{ResourceLimiter, Trap};
use wasq_core::text::escape_controls;
use wasq_core::{ErrorReason, RunError};

use crate::{AttemptError, host::LogSink};

/// Largest table any guest may grow to; matches the pool's per-table reservation.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 50_000;

/// Guest-supplied error text is stored with the run and shown in UIs: keep it bounded
/// and escaped (see `escape_controls`).
const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;

/// Caps the linear memory of one attempt, summed over all memories of the component.
pub(crate) struct MemoryLimiter {
    limit: u64,
    total: u64,
    pub(crate) peak: u64,
    /// The total the guest asked for when growth was refused.
    pub(crate) denied: Option<u64>,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: u64) -> Self {
        MemoryLimiter {
            limit,
            total: 0,
            peak: 0,
            denied: None,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let wanted = self
            .total
            .saturating_add((desired - current.min(desired)) as u64);
        if wanted > self.limit {
            // Ok(false), not Err: the guest's allocator sees a failed memory.grow, as on a
            // real machine; a Rust guest then aborts and the trap is classified as OOM.
            self.denied = Some(wanted);
            return Ok(false);
        }
        self.total = wanted;
        self.peak = self.peak.max(wanted);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// Errors the host raises inside the guest's call to end the attempt; recognised again by
/// downcasting when the call returns.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Stop {
    #[error("the attempt exceeded its time limit")]
    Timeout,
    #[error("attempt cancelled: lease lost")]
    Cancelled,
    /// The journal could not store a step: not the guest's fault.
    #[error("{0}")]
    Journal(crate::JournalError),
    /// The guest misused a host function.
    #[error("{0}")]
    Guest(String),
    /// Not a failure: the guest sleeps until this Unix time (ms); the run is replayed then.
    #[error("suspended until {0}")]
    Suspend(i64),
    /// Not a failure: the guest waits for an event or a run.
    #[error("waiting")]
    Wait(wasq_core::Wait),
    /// The journal no longer lets the attempt act (its lease ran out): the attempt is
    /// dropped without an end of its own.
    #[error("attempt abandoned: {0}")]
    Abandoned(String),
}

/// "2s", "1500ms": limits are configured in ms but usually whole seconds.
pub(crate) fn format_ms(ms: u64) -> String {
    if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

pub(crate) fn failed(reason: ErrorReason, message: impl Into<String>) -> AttemptError {
    AttemptError {
        error: RunError::new(reason, message),
        retry_after_ms: None,
    }
}

pub(crate) fn timeout(timeout_ms: u64) -> AttemptError {
    failed(
        ErrorReason::Timeout,
        format!("exceeded its time limit of {}", format_ms(timeout_ms)),
    )
}

pub(crate) fn cancelled() -> AttemptError {
    failed(ErrorReason::Host, Stop::Cancelled.to_string())
}

/// The guest's own `run-error`.
pub(crate) fn guest_error(e: crate::host::bindings::wasq::task::types::RunError) -> AttemptError {
    use crate::host::bindings::wasq::task::types::RunError as G;
    let bound = |m: String| escape_controls(&m, true, MAX_ERROR_MESSAGE_BYTES).0;
    match e {
        G::Retryable(m) => failed(ErrorReason::Retryable, bound(m)),
        G::Fatal(m) => failed(ErrorReason::Fatal, bound(m)),
        G::RetryAfter((ms, m)) => AttemptError {
            error: RunError::new(ErrorReason::RetryAfter, bound(m)),
            retry_after_ms: Some(ms),
        },
    }
}

/// What the attempt knew when the guest stopped with an error.
pub(crate) struct Ending<'a> {
    pub stop: Option<&'a Stop>,
    pub denied_memory: Option<u64>,
    pub memory_limit: u64,
    pub fuel_limit: u64,
    pub timeout_ms: u64,
    pub logs: &'a LogSink,
    /// Errors that are neither traps nor ours happened while instantiating: the host
    /// could not set the attempt up.
    pub instantiating: bool,
}

/// Classifies an error returned by instantiation or by the call to `run`.
pub(crate) fn classify(err: &wasmtime::Error, end: Ending<'_>) -> AttemptError {
    // The epoch callback records why it stopped the guest before returning its error, so
    // this holds even if the error was wrapped on the way out.
    let stop = end.stop.or_else(|| err.downcast_ref::<Stop>());
    match stop {
        Some(Stop::Timeout) => return timeout(end.timeout_ms),
        Some(Stop::Cancelled) => return cancelled(),
        Some(Stop::Journal(crate::JournalError::StorageQuota(msg))) => {
            return failed(ErrorReason::StorageQuota, msg.clone());
        }
        // A lost lease ends the attempt as abandoned before it is classified.
        Some(Stop::Journal(e)) => return failed(ErrorReason::Host, e.to_string()),
        Some(Stop::Guest(msg)) => return failed(ErrorReason::Trap, msg.clone()),
        // Handled by the caller before classifying; reaching here is a bug, not the guest's.
        Some(Stop::Suspend(_) | Stop::Wait(_) | Stop::Abandoned(_)) => {
            return failed(ErrorReason::Host, "unexpected suspension".to_string());
        }
        None => {}
    }
    let trap = err.downcast_ref::<Trap>();
    if matches!(trap, Some(Trap::OutOfFuel)) {
        return failed(
            ErrorReason::OutOfFuel,
            format!("used up its fuel limit of {}", end.fuel_limit),
        );
    }
    if let Some(wanted) = end.denied_memory {
        return failed(
            ErrorReason::OutOfMemory,
            format!(
                "tried to grow memory to {wanted} bytes, over the limit of {} bytes",
                end.memory_limit
            ),
        );
    }
    if let Some(bt) = err.downcast_ref::<wasmtime::WasmBacktrace>() {
        end.logs
            .host(wasq_core::LogLevel::Error, format!("guest stopped: {bt}"));
    }
    let mut message = match (trap, err.downcast_ref::<wasmtime_wasi::I32Exit>()) {
        (Some(t), _) => t.to_string(),
        (None, Some(exit)) => format!("the guest called exit({})", exit.0),
        (None, None) if end.instantiating => {
            return failed(
                ErrorReason::Host,
                format!("could not instantiate the component: {}", err.root_cause()),
            );
        }
        (None, None) => err.root_cause().to_string(),
    };
    if let Some(panic) = end.logs.panic_message() {
        message = format!("{message}; the guest {panic}");
    }
    // The panic message and a trap's backtrace quote the guest.
    failed(
        ErrorReason::Trap,
        escape_controls(&message, true, MAX_ERROR_MESSAGE_BYTES).0,
    )
}

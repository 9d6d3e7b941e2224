//! Storage accounting: what each thing a tenant keeps costs, in bytes, and the quotas on
//! it (`max_stored_bytes` per tenant, `max_run_bytes` and `max_run_log_bytes` per run).
//!
//! Backends count with these functions in the same transition that stores or deletes the
//! thing, so a tenant's usage and a run's counters are exact sums of what was charged, and
//! a purge gives back exactly what the run was charged. Payload bytes (inputs, outputs,
//! step outputs, log messages, event data, components) count as they are; the per-record
//! overhead (a Redis hash with its index entries costs differently from an SQLite row) is
//! the backend's own [`CostModel`], measured against what it really stores.
//!
//! What is refused and what is let through (an "overdraft") is decided here too: new work
//! (a run, an event, a deploy) and a running attempt's steps and output are refused over a
//! quota; bookkeeping that must land for a run to end cleanly (its error, an attempt
//! record, a wait's resolution) is always let through, so a full tenant can still finish
//! what it started. Log lines past a budget are dropped, with one marker line.

use crate::model::{LogLevel, LogLine, LogSource};
use crate::store::StoreError;
use crate::tenant::Quotas;

/// Overhead of each kind of record, besides its payload bytes, in one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostModel {
    /// A run record with its index entries and idempotency record, besides its payload
    /// (input, trigger, idempotency key, pinned settings: whatever the backend stores
    /// whole).
    pub run: u64,
    /// One execution (attempt) record, besides its error message.
    pub attempt: u64,
    /// One step record, besides its name and output. The name counts twice: every
    /// backend keeps it in the record and again where steps are found or ordered (an
    /// index, an order list).
    pub step: u64,
    /// One log line, besides its message.
    pub log_line: u64,
    /// One event record (its dedup entry), besides its id, name and data. The id counts
    /// twice, like a step's name (the record and its dedup index).
    pub event: u64,
    /// One function record, besides its component (counted at its size).
    pub function: u64,
}

impl CostModel {
    pub fn run(&self, payload: usize) -> u64 {
        self.run + payload as u64
    }

    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    pub fn step(&self, name: usize, output: usize) -> u64 {
        self.step + (2 * name + output) as u64
    }

    pub fn log_line(&self, line: &LogLine) -> u64 {
        self.log_line + line.message.len() as u64
    }

    pub fn event(&self, id: usize, name: usize, data: usize) -> u64 {
        self.event + (2 * id + name + data) as u64
    }

    pub fn function(&self, component: u64) -> u64 {
        self.function + component
    }
}

/// Quotas of a tenant without a record: none.
fn limit(quotas: Option<&Quotas>, pick: impl Fn(&Quotas) -> u64) -> u64 {
    quotas.map_or(u64::MAX, pick)
}

/// Refuses `adding` bytes to a tenant that stores `used` and may store at most its
/// `max_stored_bytes`.
pub fn check_tenant_bytes(
    tenant: &str,
    quotas: Option<&Quotas>,
    used: u64,
    adding: u64,
) -> Result<(), StoreError> {
    let max = limit(quotas, |q| q.max_stored_bytes);
    if used.saturating_add(adding) > max {
        return Err(tenant_full(tenant, used, adding, max));
    }
    Ok(())
}

/// The error of `adding` bytes refused to a tenant storing `used` of its `max`.
pub fn tenant_full(tenant: &str, used: u64, adding: u64, max: u64) -> StoreError {
    StoreError::StorageQuota(format!(
        "tenant {tenant:?} stores {used} bytes; {adding} more would exceed its \
         max_stored_bytes quota of {max} bytes (delete or purge runs, or raise the quota)"
    ))
}

/// Refuses `adding` bytes (a step, an output) to run `id`, which keeps `used` bytes and may
/// keep at most the tenant's `max_run_bytes`.
pub fn check_run_bytes(
    id: &str,
    quotas: Option<&Quotas>,
    used: u64,
    adding: u64,
) -> Result<(), StoreError> {
    let max = limit(quotas, |q| q.max_run_bytes);
    if used.saturating_add(adding) > max {
        return Err(run_full(id, used, adding, max));
    }
    Ok(())
}

/// The error of `adding` bytes refused to run `id` keeping `used` of its `max`.
pub fn run_full(id: &str, used: u64, adding: u64, max: u64) -> StoreError {
    StoreError::StorageQuota(format!(
        "run {id} would keep {} bytes of input, steps and output, over its tenant's \
         max_run_bytes quota of {max} bytes",
        used.saturating_add(adding)
    ))
}

/// Why log lines are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogCut {
    /// The run's `max_run_log_bytes`.
    Run,
    /// The tenant's `max_stored_bytes`.
    Tenant,
}

/// Log lines after the run's budget was applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FittedLogs {
    /// The lines to store, in order, ending with the one marker line when lines are
    /// dropped for the first time.
    pub lines: Vec<LogLine>,
    /// What they cost.
    pub bytes: u64,
    /// Lines were dropped now for the first time: the run's log is cut from here on.
    pub cut_now: bool,
}

/// A run's log state, as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLog {
    /// Bytes of log lines the run keeps.
    pub bytes: u64,
    /// Lines were dropped already (the marker line is stored): drop every later line.
    pub cut: bool,
}

/// Keeps the prefix of `lines` that fits in the run's log budget and the tenant's room;
/// past either, adds one marker line (always stored, a small overdraft) and drops the rest.
pub fn fit_logs(
    lines: Vec<LogLine>,
    log: RunLog,
    quotas: Option<&Quotas>,
    tenant_used: u64,
    cost: &CostModel,
) -> FittedLogs {
    let mut out = FittedLogs::default();
    if log.cut || lines.is_empty() {
        return out;
    }
    let run_max = limit(quotas, |q| q.max_run_log_bytes);
    let tenant_max = limit(quotas, |q| q.max_stored_bytes);
    let attempt = lines[0].attempt;
    let mut run_used = log.bytes;
    let mut tenant_used = tenant_used;
    for line in lines {
        let c = cost.log_line(&line);
        let why = if run_used.saturating_add(c) > run_max {
            Some(LogCut::Run)
        } else if tenant_used.saturating_add(c) > tenant_max {
            Some(LogCut::Tenant)
        } else {
            None
        };
        if let Some(why) = why {
            let marker = cut_marker(attempt, line.at, why);
            out.bytes += cost.log_line(&marker);
            out.lines.push(marker);
            out.cut_now = true;
            return out;
        }
        run_used = run_used.saturating_add(c);
        tenant_used = tenant_used.saturating_add(c);
        out.bytes += c;
        out.lines.push(line);
    }
    out
}

/// The one line stored where a run's log is cut (backends that cannot call
/// [`fit_logs`] inside their transition get both kinds ready-made).
pub fn cut_marker(attempt: u32, at: i64, why: LogCut) -> LogLine {
    let message = match why {
        LogCut::Run => {
            "log lines dropped from here on: this run reached its tenant's \
                        max_run_log_bytes quota (the run goes on)"
        }
        LogCut::Tenant => {
            "log lines dropped from here on: the tenant reached its \
                           max_stored_bytes quota (the run goes on)"
        }
    };
    LogLine {
        attempt,
        at,
        level: LogLevel::Warn,
        source: LogSource::Host,
        message: message.into(),
    }
}

/// Step outputs a claim carries for replay, per run, at most: larger ones are read when the
/// replay reaches them ([`crate::Store::step`]), so a claim of many runs with big steps does
/// not pull them all into the worker's memory at once.
pub const INLINE_REPLAY_BYTES: usize = 256 << 10;

/// Steps listed in a run's detail ([`crate::Store::run`]); the rest page through
/// [`crate::Store::steps`].
pub const DETAIL_STEPS: usize = 1000;

/// Executions listed in a run's detail: the latest ones.
pub const DETAIL_ATTEMPTS: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;

    const COST: CostModel = CostModel {
        run: 100,
        attempt: 50,
        step: 40,
        log_line: 10,
        event: 60,
        function: 80,
    };

    fn line(msg: &str) -> LogLine {
        LogLine {
            attempt: 1,
            at: 5,
            level: LogLevel::Info,
            source: LogSource::Guest,
            message: msg.into(),
        }
    }

    fn quotas(run_logs: u64, stored: u64) -> Quotas {
        Quotas {
            max_run_log_bytes: run_logs,
            max_stored_bytes: stored,
            ..Quotas::default()
        }
    }

    #[test]
    fn logs_fit_until_the_run_budget_then_one_marker() {
        let log = RunLog {
            bytes: 0,
            cut: false,
        };
        let q = quotas(35, u64::MAX);
        // 15 bytes each: two fit in 35, the third does not.
        let lines = vec![line("abcde"), line("fghij"), line("klmno"), line("pqrst")];
        let f = fit_logs(lines, log, Some(&q), 0, &COST);
        assert_eq!(f.lines.len(), 3);
        assert_eq!(f.lines[1].message, "fghij");
        assert!(f.lines[2].message.contains("max_run_log_bytes quota"));
        assert!(f.cut_now);
        assert_eq!(f.bytes, 30 + COST.log_line(&f.lines[2]));
        // Once cut, nothing more.
        let f = fit_logs(
            vec![line("x")],
            RunLog {
                bytes: 80,
                cut: true,
            },
            Some(&q),
            0,
            &COST,
        );
        assert_eq!(f, FittedLogs::default());
    }

    #[test]
    fn the_tenant_quota_cuts_logs_too() {
        let q = quotas(u64::MAX, 1_000);
        let log = RunLog {
            bytes: 0,
            cut: false,
        };
        let f = fit_logs(
            vec![line("abcde"), line("fghij")],
            log,
            Some(&q),
            990,
            &COST,
        );
        assert_eq!(f.lines.len(), 1);
        assert!(f.lines[0].message.contains("max_stored_bytes quota"));
        // No record: no quota.
        let f = fit_logs(vec![line("abcde")], log, None, u64::MAX - 1, &COST);
        assert_eq!(f.lines.len(), 1);
        assert!(!f.cut_now);
    }

    #[test]
    fn quota_checks_name_the_quota() {
        let q = Quotas {
            max_stored_bytes: 100,
            max_run_bytes: 10,
            ..Quotas::default()
        };
        assert!(check_tenant_bytes("t", Some(&q), 90, 10).is_ok());
        let e = check_tenant_bytes("t", Some(&q), 90, 11).unwrap_err();
        assert!(
            matches!(e, StoreError::StorageQuota(ref m) if m.contains("max_stored_bytes quota of 100"))
        );
        assert!(check_run_bytes("r", Some(&q), 5, 5).is_ok());
        let e = check_run_bytes("r", Some(&q), 5, 6).unwrap_err();
        assert!(
            matches!(e, StoreError::StorageQuota(ref m) if m.contains("max_run_bytes quota of 10"))
        );
        assert!(check_run_bytes("r", None, u64::MAX, 1).is_ok());
    }
}

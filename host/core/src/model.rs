use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::flow::{FlowControl, FlowKeys};
pub use crate::retry::{Backoff, RetryPolicy};

/// Runs are identified by UUIDv7 strings: unique across hosts, sortable by creation time.
pub type RunId = String;

/// The single tenant that exists until multi-tenancy lands.
pub const DEFAULT_TENANT: &str = "default";

/// Where a run is in its life. `Queued` with a future `due_at` is what the docs call
/// "scheduled".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RunStatus {
    Queued,
    Running,
    Sleeping,
    Waiting,
    Succeeded,
    Failed,
    Cancelled,
    /// Never ran, by flow control: dropped by a rate limit or replaced by a later run of
    /// the same debounce key. The run's `error` says which.
    Skipped,
}

impl RunStatus {
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Sleeping,
        RunStatus::Waiting,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Sleeping => "sleeping",
            RunStatus::Waiting => "waiting",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Skipped => "skipped",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled | RunStatus::Skipped
        )
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<_> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown status {s:?} (expected one of {})", all.join(", "))
            })
    }
}

/// Sandbox limits for one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Limits {
    /// Wall-clock limit of one attempt.
    pub timeout_ms: u64,
    /// Fuel (roughly, wasm instructions) one attempt may burn.
    pub fuel: u64,
    /// Linear memory one attempt may grow to, summed over its memories.
    pub memory_bytes: u64,
}

/// The smallest memory limit a function may ask for: below it even a small guest's
/// stack and data do not fit.
pub const MAX_MEMORY_FLOOR: u64 = 1 << 20;

/// The longest wall-clock limit of one attempt: a day.
pub const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

impl Limits {
    /// Checks the limits a deploy asks for; `max_memory` is the server's ceiling.
    pub fn validate(&self, max_memory: u64) -> Result<(), String> {
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(format!(
                "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {}",
                self.timeout_ms
            ));
        }
        if self.fuel == 0 {
            return Err("fuel must be at least 1".into());
        }
        if !(MAX_MEMORY_FLOOR..=max_memory).contains(&self.memory_bytes) {
            return Err(format!(
                "memory_bytes must be between {MAX_MEMORY_FLOOR} and this server's ceiling of {max_memory}, got {}",
                self.memory_bytes
            ));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 30_000,
            fuel: 10_000_000_000,
            memory_bytes: 64 << 20,
        }
    }
}

/// What a deploy sets for a function; every field has a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FunctionSettings {
    pub limits: Limits,
    pub retry: RetryPolicy,
    /// Hosts the function may send HTTP requests to: exact names (`api.example.com`),
    /// `*.example.com` for every subdomain (not the apex), IP literals. Empty: none.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Concurrency, throttle, rate limit, debounce and priority (see [`crate::flow`]).
    #[serde(default, skip_serializing_if = "FlowControl::is_default")]
    pub flow: FlowControl,
    /// The function a run of this one starts when it ends failed or cancelled (see
    /// [`crate::lifecycle::failure_handler`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
    /// The queue its runs wait in (see [`crate::queues`]): workers started with
    /// `--queues` take only runs of the queues they name. Pinned in each run's settings.
    #[serde(default = "crate::queues::default_queue")]
    pub queue: String,
    /// Webhooks announcing its runs' ends (see [`crate::notify`]).
    #[serde(
        default,
        skip_serializing_if = "crate::notify::NotifySettings::is_default"
    )]
    pub notify: crate::notify::NotifySettings,
}

impl Default for FunctionSettings {
    fn default() -> Self {
        FunctionSettings {
            limits: Limits::default(),
            retry: RetryPolicy::default(),
            allow_hosts: Vec::new(),
            flow: FlowControl::default(),
            on_failure: None,
            queue: crate::queues::default_queue(),
            notify: crate::notify::NotifySettings::default(),
        }
    }
}

/// A named, deployed component. Redeploying a name replaces its component for new runs;
/// runs already created keep the digest and settings they were created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Function {
    pub tenant: String,
    pub name: String,
    /// sha256 of the component bytes, lowercase hex.
    pub digest: String,
    pub size_bytes: u64,
    pub settings: FunctionSettings,
    /// Event names that start a run of this function, one per event.
    #[serde(default)]
    pub events: Vec<String>,
    /// Cron schedules that start runs of this function.
    #[serde(default)]
    pub schedule: Option<Schedule>,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub created_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub updated_at: Millis,
}

/// When a function runs by the clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    /// Cron expressions, 5 fields (minute precision) or 6 (seconds first).
    pub crons: Vec<String>,
    /// IANA time zone the expressions are read in, e.g. `America/New_York`.
    pub tz: String,
    #[serde(default)]
    pub missed: Missed,
    #[serde(default)]
    pub paused: bool,
    /// When the schedule was last resumed after a pause: its ticks up to then were missed,
    /// and `missed` decides what fires of them (none, or the latest once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub resumed_at: Option<Millis>,
}

/// A function's schedule, as the cron scheduler reads it ([`crate::Registry::schedules`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub function: String,
    pub schedule: Schedule,
}

impl Function {
    /// Its entry in [`crate::Registry::schedules`], when it has a schedule.
    pub fn scheduled(&self) -> Option<Scheduled> {
        Some(Scheduled {
            function: self.name.clone(),
            schedule: self.schedule.clone()?,
        })
    }
}

/// What happens to ticks that passed while no server was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Missed {
    /// Forget them; the next tick fires as usual.
    #[default]
    Skip,
    /// Fire the latest missed tick once, at start-up.
    Latest,
}

/// Why an attempt failed, in words a user can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ErrorReason {
    /// The wall-clock limit passed.
    Timeout,
    /// The fuel limit was used up.
    OutOfFuel,
    /// Memory growth beyond the limit was refused.
    OutOfMemory,
    /// The guest trapped: panic, unreachable, stack overflow, bad host call.
    Trap,
    /// The guest returned `run-error.retryable`.
    Retryable,
    /// The guest returned `run-error.fatal`.
    Fatal,
    /// The guest returned `run-error.retry-after`.
    RetryAfter,
    /// The attempt's worker stopped renewing its lease (crash, kill, partition).
    LeaseExpired,
    /// The host could not run the attempt (component missing, store error).
    Host,
    /// Skipped: the function's rate limit for the run's key was reached when it was created.
    RateLimited,
    /// Skipped: a later run with the same debounce key replaced it.
    Debounced,
    /// The run or its tenant reached a storage quota (`max_run_bytes`,
    /// `max_stored_bytes`): never retried, the message names the quota.
    StorageQuota,
    /// Cancelled through the API; the message says by whom (see [`crate::RunAction`]).
    Cancelled,
}

impl ErrorReason {
    /// Every reason, for tests that check each.
    pub const ALL: [ErrorReason; 13] = [
        ErrorReason::Timeout,
        ErrorReason::OutOfFuel,
        ErrorReason::OutOfMemory,
        ErrorReason::Trap,
        ErrorReason::Retryable,
        ErrorReason::Fatal,
        ErrorReason::RetryAfter,
        ErrorReason::LeaseExpired,
        ErrorReason::Host,
        ErrorReason::RateLimited,
        ErrorReason::Debounced,
        ErrorReason::StorageQuota,
        ErrorReason::Cancelled,
    ];

    /// The reason as JSON and metrics name it (`out_of_fuel`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::Timeout => "timeout",
            ErrorReason::OutOfFuel => "out_of_fuel",
            ErrorReason::OutOfMemory => "out_of_memory",
            ErrorReason::Trap => "trap",
            ErrorReason::Retryable => "retryable",
            ErrorReason::Fatal => "fatal",
            ErrorReason::RetryAfter => "retry_after",
            ErrorReason::LeaseExpired => "lease_expired",
            ErrorReason::Host => "host",
            ErrorReason::RateLimited => "rate_limited",
            ErrorReason::Debounced => "debounced",
            ErrorReason::StorageQuota => "storage_quota",
            ErrorReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunError {
    pub reason: ErrorReason,
    pub message: String,
}

impl RunError {
    pub fn new(reason: ErrorReason, message: impl Into<String>) -> Self {
        RunError {
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.message)
    }
}

/// A suspended `wait-for-event` or `call`: the step whose output the resolution becomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Wait {
    pub step: String,
    pub occurrence: u32,
    pub on: WaitOn,
    /// Give up then (the step resolves as timed out); `None` = wait forever.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub until: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WaitOn {
    /// An event of this name whose data matches `filter` (see [`event_matches`]).
    Event {
        name: String,
        filter: Option<String>,
    },
    /// The end of this (child) run.
    Run {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        id: RunId,
    },
}

/// How a wait ended; stored (as JSON) as the waiting step's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// The matching event's data.
    Event {
        data: serde_json::Value,
    },
    /// The awaited run succeeded with this output.
    Output {
        output: serde_json::Value,
    },
    /// The awaited run failed or was cancelled.
    Error {
        message: String,
    },
    TimedOut,
}

impl Resolution {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a resolution serialises")
    }
}

/// The `if` of `wait-for-event`: a JSON object of dotted paths into the event's data and
/// the values they must equal, e.g. `{"user_id": 42, "order.status": "paid"}`. All must
/// hold. No filter matches every event; a filter that is not such an object matches none.
pub fn event_matches(filter: Option<&str>, data: &serde_json::Value) -> bool {
    let Some(filter) = filter else { return true };
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(filter)
    else {
        return false;
    };
    fields.iter().all(|(path, expected)| {
        path.split('.').try_fold(data, |v, key| v.get(key)) == Some(expected)
    })
}

/// Checks a filter when the guest registers it, so a typo fails loudly instead of never
/// matching.
pub fn check_event_filter(filter: &str) -> Result<(), String> {
    match serde_json::from_str::<serde_json::Value>(filter) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => Err(format!(
            "invalid wait-for-event filter {filter:?}: expected a JSON object of dotted paths to values, e.g. {{\"user_id\": 42}}"
        )),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    pub percent: u8,
    pub message: Option<String>,
}

/// One execution of a run, as the run's history keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub number: u32,
    pub worker: String,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub started_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub finished_at: Option<Millis>,
    pub error: Option<RunError>,
    /// Fuel burned, when the attempt ended in the sandbox.
    pub fuel_used: Option<u64>,
    /// Set when this execution ended by sleeping; the attempt goes on when the run wakes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub suspended_until: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Run {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: RunId,
    pub tenant: String,
    pub function: String,
    /// The component digest and settings pinned at creation, so that a redeploy never
    /// changes the code a half-finished run replays.
    pub digest: String,
    pub settings: FunctionSettings,
    pub status: RunStatus,
    /// The run's input: any JSON value.
    #[serde(with = "crate::model::bytes_as_json")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub input: Vec<u8>,
    /// The output of a run that succeeded: any JSON value.
    #[serde(with = "crate::model::opt_bytes_as_json")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    pub output: Option<Vec<u8>>,
    pub error: Option<RunError>,
    /// Attempts started so far.
    pub attempt: u32,
    pub trigger: String,
    /// Lower starts first (see [`crate::flow`]).
    #[serde(default)]
    pub priority: i32,
    /// The flow-control keys computed from the input when the run was created.
    #[serde(default, skip_serializing_if = "FlowKeys::is_empty")]
    pub keys: FlowKeys,
    /// The key this run was created with, for deduplicating retried requests.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The run that started this one with `invoke` or `call`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub parent: Option<RunId>,
    /// What a `waiting` run waits for.
    #[serde(default)]
    pub wait: Option<Wait>,
    pub progress: Option<Progress>,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub created_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub updated_at: Millis,
    /// Earliest time a queued run may start.
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub due_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub finished_at: Option<Millis>,
    /// Bytes the run keeps besides its logs (input, output, steps, attempts), as charged
    /// to its tenant's storage (see [`crate::storage`]).
    #[serde(default)]
    pub stored_bytes: u64,
    /// Bytes of the run's log lines.
    #[serde(default)]
    pub log_bytes: u64,
    /// The W3C trace context of what created the run (see [`crate::trace`]): every
    /// attempt's span continues this trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub trace: Option<crate::TraceParent>,
}

/// A completed step as a run's detail lists it: everything but its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepInfo {
    pub name: String,
    pub occurrence: u32,
    /// The attempt that completed it.
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub completed_at: Millis,
    /// Size of its output.
    pub output_bytes: u64,
}

/// A completed step for replay: its output, unless it was too large to come with the
/// claim (then [`crate::Store::step`] reads it when the replay reaches it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStep {
    pub name: String,
    pub occurrence: u32,
    pub output: Option<Vec<u8>>,
}

/// A completed step: its output is returned instead of re-running its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRecord {
    pub name: String,
    /// 0 for the first step of this name in a run, 1 for the second, ...
    pub occurrence: u32,
    /// The step's output: any JSON value.
    #[serde(with = "crate::model::bytes_as_json")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub output: Vec<u8>,
    /// The attempt that completed it.
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub completed_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// Where a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LogSource {
    /// The guest's `log.write`.
    Guest,
    Stdout,
    Stderr,
    /// wasq itself, about the attempt (start, failure, truncation).
    Host,
}

impl LogSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LogSource::Guest => "guest",
            LogSource::Stdout => "stdout",
            LogSource::Stderr => "stderr",
            LogSource::Host => "host",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogLine {
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub at: Millis,
    pub level: LogLevel,
    pub source: LogSource,
    pub message: String,
}

/// Serialises payload bytes as JSON when they are JSON, otherwise as a string (lossy UTF-8).
/// Deserialises any JSON value back to its compact bytes.
pub mod bytes_as_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn to_value(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into()))
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&to_value(bytes), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(v.to_string().into_bytes())
    }
}

pub mod opt_bytes_as_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => super::bytes_as_json::serialize(b, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let v = Option::<serde_json::Value>::deserialize(d)?;
        Ok(v.map(|v| v.to_string().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_reasons_are_named_as_serde_names_them() {
        for r in ErrorReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "{r:?}");
        }
    }

    #[test]
    fn event_filters_compare_dotted_paths() {
        let data = serde_json::json!({"user_id": 42, "order": {"status": "paid"}});
        assert!(event_matches(None, &data));
        assert!(event_matches(Some("{}"), &data));
        assert!(event_matches(Some(r#"{"user_id": 42}"#), &data));
        assert!(event_matches(
            Some(r#"{"user_id": 42, "order.status": "paid"}"#),
            &data
        ));
        assert!(!event_matches(Some(r#"{"user_id": 43}"#), &data));
        assert!(
            !event_matches(Some(r#"{"user_id": "42"}"#), &data),
            "types matter"
        );
        assert!(!event_matches(Some(r#"{"order.missing": 1}"#), &data));
        assert!(!event_matches(Some("user_id == 42"), &data));
        assert!(check_event_filter("[1]").is_err());
        assert!(check_event_filter(r#"{"a.b": true}"#).is_ok());
        // Found by tests/fuzz.rs: a float written out and read back must be the same
        // value (serde_json's `float_roundtrip`), or a filter copied from data never matches.
        let data = serde_json::json!({"x": 3.1145600445547606e-17});
        assert!(event_matches(Some(&data.to_string()), &data));
    }

    #[test]
    fn status_parses_and_rejects() {
        assert_eq!("waiting".parse::<RunStatus>(), Ok(RunStatus::Waiting));
        let err = "done".parse::<RunStatus>().unwrap_err();
        assert!(err.contains("queued, running"), "{err}");
    }
}

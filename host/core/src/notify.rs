//! Signed webhooks: a function's `notify` URLs get a POST when a run of it ends (and, when
//! asked, when an attempt fails and will be retried), signed per the Standard Webhooks
//! scheme (`webhook-id`, `webhook-timestamp`, `webhook-signature`; the signing is the
//! server's, which holds the tenant's secret).
//!
//! The key decision: a notification is a [`Delivery`] kept in the store, not a message in
//! a process's memory. The process that sees a run end adds its deliveries (idempotent by
//! id: one per end, per URL, however often the end is seen); any daemon claims due
//! deliveries with a lease, sends them, and records each try; a failed try is due again
//! after [`RETRY_DELAYS_MS`]. So a delivery survives the death of the process that was to
//! send it, and the run's record shows what became of each (`deliveries`).
//!
//! This module holds the rules (which ends notify, the payload, what a try does to a
//! delivery); it does no I/O: the HTTP request goes through the sandbox's egress guard.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::StoreError;
use crate::clock::Millis;
use crate::model::{Run, RunError, RunId, RunStatus};

/// Most notify URLs of a function.
pub const MAX_NOTIFY_URLS: usize = 4;
/// Longest notify URL, in bytes.
pub const MAX_NOTIFY_URL_BYTES: usize = 2048;
/// Largest run output a payload carries; a larger one is left out (its size is given).
pub const MAX_PAYLOAD_OUTPUT_BYTES: usize = 16 * 1024;
/// Bytes of a failed try's error kept on the delivery.
pub const MAX_TRY_ERROR_BYTES: usize = 512;
/// Waits before each retry of a delivery whose last try failed (Standard Webhooks'
/// schedule, shortened): 5 s, 30 s, 2 min, 10 min, 30 min, 1 h, 2 h. One try more than
/// there are delays, then the delivery is given up (`failed`), about 3.7 h after the
/// first.
pub const RETRY_DELAYS_MS: [u64; 7] = [
    5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000,
];

/// Webhook deliveries (see [`crate::notify`]): kept until sent or given up, claimed with a
/// lease by whichever daemon sends them.
#[async_trait]
pub trait Deliveries: Send + Sync + 'static {
    /// Stores deliveries to send; one whose id is stored already is left as it is (an end
    /// seen twice is announced once).
    async fn add_deliveries(&self, deliveries: Vec<Delivery>) -> Result<(), StoreError>;
    /// Leases up to `limit` pending deliveries that are due, of any tenant, earliest due
    /// first: each is due again `lease_ms` later unless a try is recorded first (a sender
    /// that died leaves it to another), and its token grows.
    async fn claim_deliveries(
        &self,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<Delivery>, StoreError>;
    /// Records a try as [`crate::notify::after_try`] says; a try under an older claim's
    /// token, or of a delivery no longer pending, changes nothing.
    async fn record_try(&self, tried: DeliveryTry) -> Result<(), StoreError>;
    /// A run's deliveries, in the order added. A purged run's are gone with it.
    async fn deliveries(&self, tenant: &str, run: &str) -> Result<Vec<Delivery>, StoreError>;
}

/// What a function's runs announce, and to whom.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotifySettings {
    /// URLs that get a POST when a run ends (`http` or `https`, through the egress guard).
    #[serde(default)]
    pub urls: Vec<String>,
    /// Also POST when an attempt fails and the run will be retried (`run.attempt_failed`).
    #[serde(default)]
    pub attempts: bool,
}

impl NotifySettings {
    pub fn is_default(&self) -> bool {
        *self == NotifySettings::default()
    }
}

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DeliveryStatus {
    /// Not delivered yet: due at `next_at`.
    Pending,
    Delivered,
    /// Given up after its last try.
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }
}

impl std::str::FromStr for DeliveryStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pending" => Ok(DeliveryStatus::Pending),
            "delivered" => Ok(DeliveryStatus::Delivered),
            "failed" => Ok(DeliveryStatus::Failed),
            other => Err(format!("unknown delivery status {other:?}")),
        }
    }
}

/// One notification of one run to one URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// The `webhook-id`: the same for every try, so a receiver drops repeats.
    pub id: String,
    pub tenant: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    pub url: String,
    /// `run.succeeded`, `run.failed`, `run.cancelled` or `run.attempt_failed`.
    pub event: String,
    /// The JSON body, sent and signed as it is.
    #[serde(skip)]
    pub payload: Vec<u8>,
    pub status: DeliveryStatus,
    /// Tries made so far.
    pub tries: u32,
    /// When a pending delivery is due (again).
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub next_at: Millis,
    /// Grows with every claim: only the latest claim's try is recorded.
    #[serde(skip)]
    pub token: u64,
    /// Why the last try failed: an HTTP status or a connection error.
    pub last_error: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub created_at: Millis,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub updated_at: Millis,
}

/// A try of a claimed delivery, as a sender reports it to the store.
#[derive(Debug, Clone)]
pub struct DeliveryTry {
    pub tenant: String,
    pub id: String,
    /// The token of the claim the try was made under.
    pub token: u64,
    /// `None`: delivered (a 2xx answer).
    pub error: Option<String>,
}

/// What a try does to a delivery: its new status, tries, due time and error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterTry {
    pub status: DeliveryStatus,
    pub tries: u32,
    pub next_at: Millis,
    pub last_error: Option<String>,
}

/// The rule of retries: a delivered try ends the delivery; a failed one makes it due
/// again after the next of [`RETRY_DELAYS_MS`], or gives it up after the last.
pub fn after_try(tries_before: u32, error: Option<&str>, now: Millis) -> AfterTry {
    let tries = tries_before + 1;
    match error {
        None => AfterTry {
            status: DeliveryStatus::Delivered,
            tries,
            next_at: now,
            last_error: None,
        },
        Some(e) => {
            let error = Some(crate::text::escape_line(e, MAX_TRY_ERROR_BYTES));
            match RETRY_DELAYS_MS.get(tries_before as usize) {
                Some(delay) => AfterTry {
                    status: DeliveryStatus::Pending,
                    tries,
                    next_at: now + *delay as Millis,
                    last_error: error,
                },
                None => AfterTry {
                    status: DeliveryStatus::Failed,
                    tries,
                    next_at: now,
                    last_error: error,
                },
            }
        }
    }
}

/// What a run announces: its end, or an attempt that failed and will be retried.
#[derive(Debug, Clone)]
pub enum Notice<'a> {
    /// The run ended (its status is terminal).
    Ended,
    /// Attempt `attempt` failed with `error`; the run is queued again.
    AttemptFailed { attempt: u32, error: &'a RunError },
}

/// The deliveries `notice` of `run` makes: one per URL of the run's pinned settings (none
/// when it has none, or for a failed attempt unless its settings ask). Ids are
/// deterministic (run, attempt, event, URL), so adding them twice adds them once.
pub fn deliveries(run: &Run, notice: Notice<'_>, now: Millis) -> Vec<Delivery> {
    let notify = &run.settings.notify;
    let (event, attempt, error) = match notice {
        Notice::Ended => {
            let event = match run.status {
                RunStatus::Succeeded => "run.succeeded",
                RunStatus::Failed => "run.failed",
                RunStatus::Cancelled => "run.cancelled",
                RunStatus::Skipped => "run.skipped",
                _ => return Vec::new(),
            };
            (event, run.attempt, run.error.as_ref())
        }
        Notice::AttemptFailed { attempt, error } => {
            if !notify.attempts {
                return Vec::new();
            }
            ("run.attempt_failed", attempt, Some(error))
        }
    };
    if notify.urls.is_empty() {
        return Vec::new();
    }
    let payload = payload(run, event, attempt, error, now);
    notify
        .urls
        .iter()
        .enumerate()
        .map(|(i, url)| Delivery {
            id: format!("{}:{attempt}:{event}:{i}", run.id),
            tenant: run.tenant.clone(),
            run_id: run.id.clone(),
            url: url.clone(),
            event: event.to_owned(),
            payload: payload.clone(),
            status: DeliveryStatus::Pending,
            tries: 0,
            next_at: now,
            token: 0,
            last_error: None,
            created_at: now,
            updated_at: now,
        })
        .collect()
}

/// The body: `{"type", "timestamp", "data": {"id", "function", "status", "attempt",
/// "trigger", "created_at", "finished_at", "error", "output"}}`; an output over
/// [`MAX_PAYLOAD_OUTPUT_BYTES`] (or not JSON) is left out, `output_omitted_bytes` says
/// how big it was.
fn payload(run: &Run, event: &str, attempt: u32, error: Option<&RunError>, now: Millis) -> Vec<u8> {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(now.max(0) as u64);
    let mut data = serde_json::json!({
        "id": run.id,
        "function": run.function,
        "status": if event == "run.attempt_failed" { "queued" } else { run.status.as_str() },
        "attempt": attempt,
        "trigger": run.trigger,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "error": error,
    });
    if event == "run.succeeded"
        && let Some(out) = &run.output
    {
        match serde_json::from_slice::<serde_json::Value>(out) {
            Ok(v) if out.len() <= MAX_PAYLOAD_OUTPUT_BYTES => data["output"] = v,
            _ => data["output_omitted_bytes"] = out.len().into(),
        }
    }
    serde_json::to_vec(&serde_json::json!({
        "type": event,
        "timestamp": humantime::format_rfc3339_millis(at).to_string(),
        "data": data,
    }))
    .expect("a JSON value serializes")
}

/// A notify URL as a deploy gives it: `http` or `https`, at most
/// [`MAX_NOTIFY_URL_BYTES`], no credentials, no fragment; the host is checked by the
/// egress guard's rules where the server parses it.
pub fn check_notify_url_shape(url: &str) -> Result<(), String> {
    let shown = crate::names::quoted(url);
    if url.len() > MAX_NOTIFY_URL_BYTES {
        return Err(format!(
            "notify URL {shown} is longer than {MAX_NOTIFY_URL_BYTES} bytes"
        ));
    }
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return Err(format!(
            "notify URL {shown} must start with https:// or http://"
        ));
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "notify URL {shown} needs a host and no user name or password"
        ));
    }
    if url.contains('#') || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "notify URL {shown} may hold no fragment, spaces or control characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_try_is_retried_on_the_schedule_then_given_up() {
        let ok = after_try(2, None, 1_000);
        assert_eq!(ok.status, DeliveryStatus::Delivered);
        assert_eq!(ok.tries, 3);
        let first = after_try(0, Some("HTTP 500"), 1_000);
        assert_eq!(first.status, DeliveryStatus::Pending);
        assert_eq!(first.next_at, 6_000);
        assert_eq!(first.last_error.as_deref(), Some("HTTP 500"));
        assert_eq!(after_try(1, Some("x"), 0).next_at, 30_000);
        let last = RETRY_DELAYS_MS.len() as u32;
        assert_eq!(
            after_try(last - 1, Some("x"), 0).status,
            DeliveryStatus::Pending
        );
        let given_up = after_try(last, Some("x"), 0);
        assert_eq!(given_up.status, DeliveryStatus::Failed);
        assert_eq!(given_up.tries, last + 1);
        let long = after_try(0, Some(&format!("\u{1b}[31m{}", "e".repeat(5000))), 0);
        let e = long.last_error.unwrap();
        assert!(
            e.len() <= MAX_TRY_ERROR_BYTES + 32 && !e.contains('\u{1b}'),
            "{e}"
        );
    }

    #[test]
    fn a_payload_carries_a_small_output_and_leaves_a_big_one_out() {
        use crate::model::{ErrorReason, FunctionSettings};
        let settings = FunctionSettings {
            notify: NotifySettings {
                urls: vec!["https://a.test/".into(), "https://b.test/".into()],
                attempts: false,
            },
            ..FunctionSettings::default()
        };
        let req = crate::EnqueueRequest {
            tenant: "t".into(),
            function: "f".into(),
            input: b"{}".to_vec(),
            trigger: "api".into(),
            ..crate::EnqueueRequest::default()
        };
        let mut run = req.into_run("r1".into(), 0, "d".into(), settings, &Default::default());
        assert!(
            deliveries(&run, Notice::Ended, 0).is_empty(),
            "queued: no end yet"
        );
        run.status = RunStatus::Succeeded;
        run.output = Some(br#"{"ok": true}"#.to_vec());
        let d = deliveries(&run, Notice::Ended, 0);
        assert_eq!(d.len(), 2);
        assert_ne!(d[0].id, d[1].id);
        let body: serde_json::Value = serde_json::from_slice(&d[0].payload).unwrap();
        assert_eq!(body["type"], "run.succeeded");
        assert_eq!(body["data"]["output"]["ok"], true);
        let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_OUTPUT_BYTES));
        run.output = Some(big.clone().into_bytes());
        let body: serde_json::Value =
            serde_json::from_slice(&deliveries(&run, Notice::Ended, 0)[0].payload).unwrap();
        assert!(body["data"]["output"].is_null(), "{body}");
        assert_eq!(body["data"]["output_omitted_bytes"], big.len());
        let error = RunError::new(ErrorReason::Retryable, "boom");
        let failed = Notice::AttemptFailed {
            attempt: 1,
            error: &error,
        };
        assert!(deliveries(&run, failed, 0).is_empty(), "attempts not asked");
    }

    #[test]
    fn notify_urls_are_checked() {
        for ok in [
            "https://hooks.example.com/x?y=1",
            "http://127.0.0.1:8080/hook",
        ] {
            assert!(check_notify_url_shape(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ftp://x",
            "https://",
            "https://user:pw@example.com/",
            "https://example.com/a b",
            "https://example.com/#f",
            &format!("https://example.com/{}", "a".repeat(3000)),
        ] {
            assert!(check_notify_url_shape(bad).is_err(), "{bad}");
        }
    }
}

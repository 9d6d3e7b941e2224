//! Prometheus metrics at `GET /metrics` (operator key): per-tenant usage and load read
//! from the store at scrape time (so every server reports the same totals, wherever the
//! attempts ran), and what this process did: attempts, their outcomes, errors by kind and
//! durations, queue waits, run durations, retries, cron ticks, refused outbound requests,
//! worker slots and store round trips. The names, and what each means, are in the README
//! ("Metrics"); `deploy/` has a Grafana dashboard and alert rules built on them.
//!
//! Each daemon owns its recorder (never the process-global one), so several daemons in one
//! process — the tests — keep separate figures.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::App;
use crate::auth::Caller;
use crate::error::ApiError;

pub(crate) struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The (tenant, function, status) series of `wasq_runs` set at the last scrape: one no
    /// longer counted is set to 0, not left at its last value.
    reported: std::sync::Mutex<std::collections::HashSet<(String, String, &'static str)>>,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0, 300.0])
            .expect("static buckets are valid")
            // 1 MiB to 4 GiB, by fours: what a guest's linear memory grows to.
            .set_buckets_for_metric(
                Matcher::Full("wasq_attempt_peak_memory_bytes".into()),
                &[1, 4, 16, 64, 256, 1024, 4096].map(|mib: u32| f64::from(mib) * 1048576.0),
            )
            .expect("static buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        Metrics {
            recorder,
            handle,
            reported: Default::default(),
        }
    }

    fn with(&self, f: impl FnOnce()) {
        metrics::with_local_recorder(&self.recorder, f);
    }

    /// A worker claimed a run `waited_ms` after it was due.
    pub(crate) fn claimed(&self, tenant: &str, waited_ms: i64) {
        self.with(|| {
            metrics::histogram!("wasq_queue_wait_seconds", "tenant" => tenant.to_owned())
                .record(waited_ms.max(0) as f64 / 1000.0);
        });
    }

    /// A run ended with `status`, `took_ms` after it was created.
    pub(crate) fn run_ended(&self, tenant: &str, status: &'static str, took_ms: i64) {
        self.with(|| {
            let labels = [("tenant", tenant.to_owned()), ("status", status.to_owned())];
            metrics::histogram!("wasq_run_duration_seconds", &labels)
                .record(took_ms.max(0) as f64 / 1000.0);
        });
    }

    /// An attempt failed with an error of `reason` (a trap, a limit, the guest's own);
    /// `retried`: the run is queued again.
    pub(crate) fn attempt_error(&self, tenant: &str, reason: &str, retried: bool) {
        self.with(|| {
            let labels = [("tenant", tenant.to_owned()), ("reason", reason.to_owned())];
            metrics::counter!("wasq_attempt_errors_total", &labels).increment(1);
            if retried {
                metrics::counter!("wasq_retries_total", "tenant" => tenant.to_owned()).increment(1);
            }
        });
    }

    /// The egress guard refused `n` outbound requests of an attempt.
    pub(crate) fn egress_refused(&self, tenant: &str, n: u32) {
        if n > 0 {
            self.with(|| {
                metrics::counter!("wasq_egress_refused_total", "tenant" => tenant.to_owned())
                    .increment(u64::from(n));
            });
        }
    }

    /// A cron tick enqueued a run.
    pub(crate) fn cron_fired(&self, tenant: &str) {
        self.with(|| {
            metrics::counter!("wasq_cron_fires_total", "tenant" => tenant.to_owned()).increment(1);
        });
    }

    /// A store call of the worker (`claim`, `end`) took `took`, there and back.
    pub(crate) fn store_call(&self, call: &'static str, took: Duration) {
        self.with(|| {
            metrics::histogram!("wasq_store_call_seconds", "call" => call)
                .record(took.as_secs_f64());
        });
    }

    /// An attempt ended in this process.
    /// `peak_memory_bytes`: the guest's highest linear memory in it.
    pub(crate) fn attempt(
        &self,
        tenant: &str,
        outcome: &'static str,
        took: Duration,
        peak_memory_bytes: u64,
    ) {
        metrics::with_local_recorder(&self.recorder, || {
            let labels = [
                ("tenant", tenant.to_owned()),
                ("outcome", outcome.to_owned()),
            ];
            metrics::counter!("wasq_attempts_total", &labels).increment(1);
            metrics::histogram!("wasq_attempt_duration_seconds", &labels)
                .record(took.as_secs_f64());
            metrics::histogram!("wasq_attempt_peak_memory_bytes", &labels[..1])
                .record(peak_memory_bytes as f64);
        });
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    operation_id = "metrics",
    summary = "Prometheus metrics",
    description = "Per-tenant usage and load read from the store, and this process's attempts, errors, durations, retries and worker slots (the README's `/metrics` row names them all).",
    security(("operator_key" = [])),
    responses(
        crate::openapi::OperatorRefusals,
        (status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4"),
    ),
)]
pub(crate) async fn scrape(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    if !matches!(caller, Caller::Admin) {
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: "metrics need the operator key".into(),
            retry_after_ms: None,
        });
    }
    let mut usage = vec![];
    for t in app.store.tenants().await? {
        let u = app.store.usage(&t.name).await?;
        let load = app.store.load(&t.name).await?;
        usage.push((t.name, t.quotas, u, load));
    }
    let m = &app.metrics;
    let refusing = app.guard.refusing().is_some();
    let now = app.now();
    let mut reported = m.reported.lock().unwrap_or_else(|p| p.into_inner());
    let mut current = std::collections::HashSet::new();
    metrics::with_local_recorder(&m.recorder, || {
        for (tenant, quotas, u, load) in usage {
            for (function, status, n) in load.counts {
                let labels = [
                    ("tenant", tenant.clone()),
                    ("function", function.clone()),
                    ("status", status.as_str().to_owned()),
                ];
                metrics::gauge!("wasq_runs", &labels).set(n as f64);
                current.insert((tenant.clone(), function, status.as_str()));
            }
            let age = load
                .oldest_queued_at
                .map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0);
            metrics::gauge!("wasq_oldest_queued_run_age_seconds", "tenant" => tenant.clone())
                .set(age);
            let labels = [("tenant", tenant)];
            metrics::counter!("wasq_tenant_fuel_consumed_total", &labels).absolute(u.fuel);
            metrics::counter!("wasq_tenant_executions_total", &labels).absolute(u.attempts);
            metrics::gauge!("wasq_tenant_stored_bytes", &labels).set(u.stored_bytes as f64);
            metrics::gauge!("wasq_tenant_max_stored_bytes", &labels)
                .set(quotas.max_stored_bytes as f64);
            // Beside wasq_runs{status="running"}: a tenant at its quota has runs that
            // wait for it, not for workers.
            metrics::gauge!("wasq_tenant_max_running", &labels).set(f64::from(quotas.max_running));
        }
        for (tenant, function, status) in reported.difference(&current) {
            let labels = [
                ("tenant", tenant.clone()),
                ("function", function.clone()),
                ("status", (*status).to_owned()),
            ];
            metrics::gauge!("wasq_runs", &labels).set(0.0);
        }
        // 1 while the store guard refuses new work (the store is nearly full).
        metrics::gauge!("wasq_store_full").set(f64::from(u8::from(refusing)));
        metrics::gauge!("wasq_worker_slots").set(app.config.concurrency as f64);
        metrics::gauge!("wasq_worker_slots_in_use").set(app.in_flight.executing() as f64);
    });
    *reported = current;
    drop(reported);
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.handle.render(),
    )
        .into_response())
}

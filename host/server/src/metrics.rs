//! Prometheus metrics at `GET /metrics` (operator key): per-tenant usage read from the
//! store at scrape time (so every server reports the same totals, wherever the attempts
//! ran), and this process's attempt outcomes and durations.
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
        Metrics { recorder, handle }
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
        usage.push((t.name, t.quotas, u));
    }
    let m = &app.metrics;
    let refusing = app.guard.refusing().is_some();
    metrics::with_local_recorder(&m.recorder, || {
        for (tenant, quotas, u) in usage {
            let labels = [("tenant", tenant)];
            metrics::counter!("wasq_tenant_fuel_consumed_total", &labels).absolute(u.fuel);
            metrics::counter!("wasq_tenant_executions_total", &labels).absolute(u.attempts);
            metrics::gauge!("wasq_tenant_stored_bytes", &labels).set(u.stored_bytes as f64);
            metrics::gauge!("wasq_tenant_max_stored_bytes", &labels)
                .set(quotas.max_stored_bytes as f64);
        }
        // 1 while the store guard refuses new work (the store is nearly full).
        metrics::gauge!("wasq_store_full").set(f64::from(u8::from(refusing)));
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.handle.render(),
    )
        .into_response())
}

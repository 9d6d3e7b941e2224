//! The daemon verbs' logs and traces: the `tracing` subscriber (logs on stderr, filtered
//! by `RUST_LOG`) and, with `--otlp-endpoint` / `OTEL_EXPORTER_OTLP_ENDPOINT`, an
//! OpenTelemetry layer that exports wasq's spans over OTLP/HTTP with protobuf.
//!
//! Which spans exist and how a run's trace crosses processes is wasq-server's
//! (`host/server/src/telemetry.rs`); this only ships them. The SDK's batch processor
//! keeps spans in a bounded queue (dropping past it, never blocking a request or an
//! attempt) and sends them from a thread of its own; [`Telemetry::shutdown`] sends what is
//! left when the daemon stops. The exporter honours the SDK's environment variables
//! (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, ...).

use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Level, Metadata};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::args::LogFormat;

/// How long one export may take (connecting included) before it is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long stopping waits for the last spans to be sent.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A `--otlp-endpoint`: an `http` or `https` URL with a host, taken as the base URL of an
/// OTLP/HTTP receiver (as `OTEL_EXPORTER_OTLP_ENDPOINT` is): spans go to `URL/v1/traces`.
pub(crate) fn otlp_endpoint(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s)
        .map_err(|e| format!("expected an http(s) URL like http://127.0.0.1:4318: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "expected an http(s) URL like http://127.0.0.1:4318, got {s:?}"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("the OTLP endpoint takes no query or fragment".into());
    }
    Ok(s.to_owned())
}

/// The URL spans are sent to: `base` + `/v1/traces` (with one `/` between).
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// The installed subscriber's exporter, if any: flush it with [`Telemetry::shutdown`].
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans not sent yet (waiting up to [`SHUTDOWN_TIMEOUT`]) and stops the
    /// exporter. Blocks: call it off the async threads.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
        {
            crate::out::errln!("wasq: exporting the last spans failed: {e}");
        }
    }
}

/// Installs the daemon's subscriber: logs on stderr in `format`, filtered by `RUST_LOG`
/// (default `info`); and, with `otlp` (a base URL from [`otlp_endpoint`]), wasq's spans
/// exported as service `service` (unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
/// names one).
pub(crate) fn init(format: LogFormat, otlp: Option<&str>, service: &str) -> Result<Telemetry> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,wasmtime=warn,cranelift=warn,opentelemetry_sdk=warn",
        )
    });
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Pretty => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    let provider = otlp.map(|base| provider(base, service)).transpose()?;
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("wasq"))
            // Spans carry what wasq records; not source locations or thread names.
            .with_location(false)
            .with_threads(false)
            // Nothing else here reads OpenTelemetry's current context: do not switch it
            // on every poll of an attempt.
            .with_context_activation(false)
            .with_filter(FilterFn::new(exported).with_max_level_hint(LevelFilter::DEBUG))
    });
    // Taken already only where a test installs its own: keep that one.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

/// What goes to the exporter: wasq's spans down to debug (requests, steps, finishes) and
/// its events down to info (they become span events); others' warnings and errors, but
/// never the exporter's own (they would feed back into it: they go to the log only).
fn exported(meta: &Metadata<'_>) -> bool {
    let level = *meta.level();
    if meta.target().starts_with("opentelemetry") {
        false
    } else if meta.target().starts_with("wasq") {
        level
            <= if meta.is_span() {
                Level::DEBUG
            } else {
                Level::INFO
            }
    } else {
        level <= Level::WARN
    }
}

fn provider(base: &str, service: &str) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(base))
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(Transport::new()?)
        .build()
        .with_context(|| format!("cannot export traces to {base}"))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(service))
        .build())
}

/// The process as traces name it: `service.name` is `service` (`wasq-server`,
/// `wasq-worker`, `wasq-dev`) unless the environment names it, and `service.version`.
fn resource(service: &str) -> Resource {
    let key = opentelemetry::Key::from_static_str("service.name");
    let named = Resource::builder()
        .build()
        .get(&key)
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    let mut builder = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if !named {
        builder = builder.with_service_name(service.to_owned());
    }
    builder.build()
}

/// The exporter's HTTP client: the workspace's reqwest, blocking (the batch processor
/// sends from its own thread), https with the webpki roots.
#[derive(Debug)]
struct Transport(reqwest::blocking::Client);

impl Transport {
    fn new() -> Result<Transport> {
        // reqwest's blocking client runs a runtime of its own, which must not be started
        // from inside this process's async runtime.
        let client = std::thread::spawn(|| {
            reqwest::blocking::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .connect_timeout(EXPORT_TIMEOUT / 2)
                .redirect(reqwest::redirect::Policy::none())
                .build()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("building the OTLP HTTP client panicked"))?
        .context("cannot build the OTLP HTTP client")?;
        Ok(Transport(client))
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Transport {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let response = self.0.execute(request.try_into()?)?;
        let status = response.status();
        // A receiver answers with a small protobuf or JSON; nothing here reads more.
        let body = response.bytes()?;
        let body = body.slice(..body.len().min(64 << 10));
        Ok(http::Response::builder().status(status).body(body)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_an_http_base_url() {
        for good in [
            "http://127.0.0.1:4318",
            "https://otlp.example.com",
            "http://collector:4318/",
        ] {
            assert_eq!(otlp_endpoint(good).as_deref(), Ok(good));
        }
        for bad in [
            "",
            "127.0.0.1:4318",
            "ftp://x",
            "http://",
            "http://x/?a=1",
            "file:///tmp",
        ] {
            assert!(otlp_endpoint(bad).is_err(), "{bad:?}");
        }
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("https://c/otlp"), "https://c/otlp/v1/traces");
    }

    #[test]
    fn wasq_spans_go_down_to_debug_others_only_warnings() {
        use tracing::callsite::Identifier;
        use tracing::field::FieldSet;
        use tracing::metadata::Kind;
        struct Cs;
        impl tracing::Callsite for Cs {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static CS: Cs = Cs;
        let meta = |target: &'static str, level, kind| {
            Metadata::new(
                "m",
                target,
                level,
                None,
                None,
                None,
                FieldSet::new(&[], Identifier(&CS)),
                kind,
            )
        };
        assert!(exported(&meta(
            "wasq_server::api",
            Level::DEBUG,
            Kind::SPAN
        )));
        assert!(!exported(&meta(
            "wasq_server::api",
            Level::TRACE,
            Kind::SPAN
        )));
        assert!(exported(&meta("wasq_sandbox", Level::INFO, Kind::EVENT)));
        assert!(!exported(&meta("wasq_sandbox", Level::DEBUG, Kind::EVENT)));
        assert!(!exported(&meta("hyper::proto", Level::INFO, Kind::EVENT)));
        assert!(exported(&meta("wasmtime", Level::WARN, Kind::EVENT)));
        assert!(!exported(&meta(
            "opentelemetry_sdk",
            Level::ERROR,
            Kind::EVENT
        )));
    }
}

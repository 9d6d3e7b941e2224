//! Traces: the spans the API and the worker make, and the W3C trace context that links
//! them across processes (README "Traces").
//!
//! - Every API request runs in a server span (`request`, named after its route) that
//!   continues the client's `traceparent` header when it sent a valid one.
//! - A run keeps the trace context of what created it ([`wasq_core::TraceParent`], stored
//!   with the run by every store): the request's span; for a child run or an event a guest
//!   sends, the parent's attempt span; a cron tick's own span.
//! - Each execution of a run is an `attempt` span whose parent is that stored context, so
//!   a worker in any process joins the trace; its steps (host/sandbox) and its `finish`
//!   (storing the end) are the attempt's children. A guest's outbound HTTP carries the
//!   attempt's `traceparent`.
//!
//! These are plain `tracing` spans: exporting them is the binary's (an OpenTelemetry
//! layer and an OTLP exporter, `cli/src/telemetry.rs`). Without that layer the functions
//! here find no span context, set none and cost a subscriber lookup; the request, step and
//! finish spans are at debug level, so a daemon logging at `info` does not even create
//! them. A run then keeps the context its creator was given, unchanged: a client's header,
//! its parent run's.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use wasq_core::TraceParent;

/// The W3C header.
pub(crate) const TRACEPARENT: &str = "traceparent";

/// The trace context a client sent: one `traceparent` header that parses. Anything else
/// (none, several, a malformed one) is ignored, as the W3C recommendation says: the
/// request starts a new trace.
pub(crate) fn incoming(headers: &HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    TraceParent::parse(value.to_str().ok()?).ok()
}

/// The context of `span` as a `traceparent`, when spans are exported (the OpenTelemetry
/// layer gave it a valid context).
pub(crate) fn of_span(span: &Span) -> Option<TraceParent> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    if !sc.is_valid() {
        return None;
    }
    TraceParent::new(
        u128::from_be_bytes(sc.trace_id().to_bytes()),
        u64::from_be_bytes(sc.span_id().to_bytes()),
        sc.is_sampled(),
    )
}

/// Makes `span` (not started yet) a child of the remote span `parent` names; nothing
/// without the OpenTelemetry layer.
pub(crate) fn continue_from(span: &Span, parent: &TraceParent) {
    if span.is_disabled() {
        return;
    }
    let flags = if parent.sampled() {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let remote = SpanContext::new(
        TraceId::from(parent.trace_id_u128()),
        SpanId::from(parent.parent_id_u64()),
        flags,
        true,
        TraceState::default(),
    );
    // Refused only without the layer (nothing to link then) or once the span started,
    // which a caller that just made it rules out.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

/// The trace context of what happens now, as a run created now keeps it: the current
/// span's when spans are exported, else what the caller was given (`given`, asked only
/// then: a client's header, the run's own).
pub(crate) fn current_or(given: impl FnOnce() -> Option<TraceParent>) -> Option<TraceParent> {
    of_span(&Span::current()).or_else(given)
}

/// Marks `span` failed, saying `what` (cut to 256 bytes: it may quote a guest), for the
/// exporter; nothing without the OpenTelemetry layer.
pub(crate) fn failed(span: &Span, what: impl std::fmt::Display) {
    if !span.is_disabled() {
        let what = wasq_core::text::truncate_utf8(what.to_string(), 256);
        span.set_status(opentelemetry::trace::Status::error(what));
    }
}

/// The server span of an API request (a layer of the router): named `METHOD route`
/// (`POST /v1/functions/{name}/runs`) with the HTTP attributes of OpenTelemetry's
/// conventions, the child of the client's `traceparent` if it sent one. Handlers run
/// inside it, so the runs they create keep its context ([`current_or`]).
pub(crate) async fn request_span(req: Request, next: Next) -> Response {
    let span = tracing::debug_span!(
        "request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %req.method(),
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if span.is_disabled() {
        return next.run(req).await;
    }
    // The route, never the path: a path holds ids and whatever a client sent.
    match req.extensions().get::<MatchedPath>() {
        Some(route) => {
            span.record("http.route", route.as_str());
            span.record(
                "otel.name",
                tracing::field::display(format_args!("{} {}", req.method(), route.as_str())),
            );
        }
        None => {
            span.record("otel.name", tracing::field::display(req.method()));
        }
    }
    if let Some(parent) = incoming(req.headers()) {
        continue_from(&span, &parent);
    }
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn one_valid_traceparent_is_taken_anything_else_starts_a_new_trace() {
        let mut headers = HeaderMap::new();
        assert_eq!(incoming(&headers), None);
        headers.insert(TRACEPARENT, GOOD.parse().unwrap());
        assert_eq!(incoming(&headers).unwrap().as_str(), GOOD);
        headers.append(TRACEPARENT, GOOD.parse().unwrap());
        assert_eq!(incoming(&headers), None, "two of them");
        headers.insert(TRACEPARENT, "00-nope".parse().unwrap());
        assert_eq!(incoming(&headers), None, "malformed");
        headers.insert(TRACEPARENT, GOOD.to_uppercase().parse().unwrap());
        assert_eq!(incoming(&headers), None, "uppercase");
    }

    #[test]
    fn without_the_layer_there_is_no_span_context_and_the_given_one_is_kept() {
        let given = TraceParent::parse(GOOD).unwrap();
        let span = tracing::info_span!("x");
        continue_from(&span, &given);
        assert_eq!(of_span(&span), None);
        let _in = span.enter();
        assert_eq!(current_or(|| Some(given.clone())), Some(given));
        assert_eq!(current_or(|| None), None);
    }
}

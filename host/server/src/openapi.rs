//! The API's OpenAPI 3.1 document at `GET /v1/openapi.json`, generated from the handlers'
//! `#[utoipa::path]` attributes, and its reference page at `/docs` (Swagger UI, compiled
//! into the binary by utoipa-swagger-ui's `vendored` feature: the page loads nothing from
//! another site). Neither needs a key: they describe the API and give access to nothing.
//!
//! The axum router (`api::router`) stays the one place routes are made; this document
//! lists the handlers' descriptions. The test at the bottom of this file checks that the
//! two agree, in both directions: every route the router serves is documented, and every
//! documented operation is served.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use utoipa::openapi::response::{Response as OpenApiResponse, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::{OpenApi, ToSchema};
use wasq_core::Function;
use wasq_core::Run;

use crate::App;
use crate::error::ErrorBody;

/// Where the document is served, and where the reference page reads it from.
pub(crate) const DOCUMENT_PATH: &str = "/v1/openapi.json";
/// Where the reference page is served.
pub(crate) const PAGE_PATH: &str = "/docs";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "wasq",
        description = "Background jobs as WebAssembly components: deploy a component as a \
            function, start runs of it by HTTP, by event or by cron, and read what they did. \
            Every route but `/healthz`, `/v1/openapi.json` and `/docs` needs \
            `Authorization: Bearer KEY`: a tenant's key for the tenant routes, the operator key \
            for managing tenants and keys. Errors are `{\"error\": {\"code\", \"message\"}}`."
    ),
    paths(
        crate::api::healthz,
        openapi_json,
        crate::metrics::scrape,
        crate::api::list_functions,
        crate::api::get_function,
        crate::api::deploy::deploy,
        crate::api::schedules::schedule_action,
        crate::api::runs::create_run,
        crate::api::batch::create_runs,
        crate::api::read::list_runs,
        crate::api::read::get_run,
        crate::api::read::list_steps,
        crate::api::read::get_step,
        crate::api::read::get_logs,
        crate::api::watch::run_events,
        crate::api::tenant_events::stream,
        crate::api::actions::cancel_run,
        crate::api::actions::retry_run,
        crate::api::runs::send_event,
        crate::api::schedules::list_schedules,
        crate::api::read::list_queues,
        crate::api::read::list_workers,
        crate::api::read::webhook_secret,
        crate::admin::create_tenant,
        crate::admin::list_tenants,
        crate::admin::own_tenant,
        crate::admin::get_tenant,
        crate::admin::set_quotas,
        crate::admin::create_key,
        crate::admin::list_keys,
        crate::admin::revoke_key,
        crate::admin::audit_log,
    ),
    // What responses and parameters name without a `body = ...` of their own: the shared
    // error answers (`Refusals`) and the enums of query parameters.
    components(schemas(ErrorBody, ScheduleAction, wasq_core::Backoff, wasq_core::Missed)),
    modifiers(&Keys),
    tags(
        (name = "functions", description = "Deployed components and their settings"),
        (name = "runs", description = "Starting runs and reading what they did"),
        (name = "events", description = "Events that start and resume runs"),
        (name = "schedules", description = "Cron schedules"),
        (name = "queues", description = "Named queues and their load"),
        (name = "webhooks", description = "Signed notifications of runs' ends"),
        (name = "tenants", description = "Tenants, their quotas and usage"),
        (name = "keys", description = "API keys"),
        (name = "audit", description = "The append-only audit trail"),
        (name = "meta", description = "Health, metrics and this document"),
    )
)]
pub(crate) struct ApiDoc;

/// The two kinds of key, both sent as `Authorization: Bearer KEY`.
struct Keys;

impl utoipa::Modify for Keys {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("wasq API key")
                    .description(Some(description))
                    .build(),
            )
        };
        components.add_security_scheme(
            "tenant_key",
            bearer(
                "A tenant's API key, `wasq_<id>_<secret>` (`wasq keys create`; `wasq dev` \
                 writes the `default` tenant's to `.wasq/dev.key`). Tenant routes act on \
                 that tenant only.",
            ),
        );
        components.add_security_scheme(
            "operator_key",
            bearer(
                "The operator key (`WASQ_ADMIN_KEY`; `wasq dev` writes it to \
                 `.wasq/admin.key`): manages tenants and keys, reads `/metrics`; refused \
                 (403) on tenant routes.",
            ),
        );
    }
}

/// The document, built once.
pub(crate) fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serialises")
    })
}

/// `GET /v1/openapi.json` and the reference page under `/docs`, mounted beside
/// `/healthz`, outside the authenticated routes.
pub(crate) fn routes() -> Router<Arc<App>> {
    let config = utoipa_swagger_ui::Config::new([DOCUMENT_PATH])
        // Swagger UI would otherwise send the document to validator.swagger.io for a
        // badge: the page stays on this server.
        .validator_url("none")
        .try_it_out_enabled(true);
    Router::new()
        .route(DOCUMENT_PATH, get(openapi_json))
        .merge(utoipa_swagger_ui::SwaggerUi::new(PAGE_PATH).config(config))
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    operation_id = "openapi",
    summary = "This OpenAPI document",
    description = "No key needed. The reference page at `/docs` reads it.",
    responses((status = 200, description = "An OpenAPI 3.1 document", body = Object)),
)]
pub(crate) async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}

/// The error answers every authenticated route may give: no valid key, the store
/// unreachable, a failure of the server.
pub(crate) struct Refusals;

/// [`Refusals`] on a tenant route, which the operator key may not use.
pub(crate) struct TenantRefusals;

/// [`Refusals`] on an operator route, which a tenant key may not use.
pub(crate) struct OperatorRefusals;

fn error_response(description: &str) -> RefOr<OpenApiResponse> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(ErrorBody::name())))
                .build(),
        )
        .build()
        .into()
}

fn refusals() -> BTreeMap<String, RefOr<OpenApiResponse>> {
    BTreeMap::from([
        (
            "401".into(),
            error_response(
                "`unauthorized`: no `Authorization: Bearer KEY`, or a key that is unknown, \
                 malformed or revoked",
            ),
        ),
        (
            "500".into(),
            error_response("`internal`: the server failed; nothing is known to be stored"),
        ),
        (
            "503".into(),
            error_response(
                "`unavailable`: the store (Redis) is unreachable and nothing was stored: \
                 retry later",
            ),
        ),
    ])
}

impl utoipa::IntoResponses for Refusals {
    fn responses() -> BTreeMap<String, RefOr<OpenApiResponse>> {
        refusals()
    }
}

impl utoipa::IntoResponses for TenantRefusals {
    fn responses() -> BTreeMap<String, RefOr<OpenApiResponse>> {
        let mut r = refusals();
        r.insert(
            "403".into(),
            error_response("`forbidden`: the operator key on a tenant route"),
        );
        r
    }
}

impl utoipa::IntoResponses for OperatorRefusals {
    fn responses() -> BTreeMap<String, RefOr<OpenApiResponse>> {
        let mut r = refusals();
        r.insert(
            "403".into(),
            error_response("`forbidden`: this route needs the operator key"),
        );
        r
    }
}

// Answers the handlers write as JSON by hand: described here, never built (hence
// `dead_code`), checked against the real answers by the tests in `tests/`.

/// `GET /healthz`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct Health {
    #[schema(example = "ok")]
    status: String,
}

/// A redeploy's answer: the function, and what the redeploy changed, in words.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct Redeployed {
    #[serde(flatten)]
    function: Function,
    /// `path: old -> new` for each setting, event list or schedule that changed (the
    /// component too), e.g. `settings.retry.max_attempts: 5 -> 2`.
    changed: Vec<String>,
}

/// A batch's answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct BatchCreated {
    /// Runs created (a repeated idempotency key answers its first run, not counted).
    created: usize,
    /// Every run of the batch, in order.
    runs: Vec<Run>,
}

/// `GET /v1/webhooks/secret`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct WebhookSecret {
    /// `whsec_...`: the key the tenant's webhooks are signed with (Standard Webhooks).
    secret: String,
}

/// A deploy's body: the component's bytes.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)]
pub(crate) struct Component(Vec<u8>);

/// What `POST /v1/functions/{name}/schedule/{action}` does.
#[derive(ToSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(dead_code)]
pub(crate) enum ScheduleAction {
    Pause,
    Resume,
    RunNow,
}

#[cfg(test)]
mod tests;

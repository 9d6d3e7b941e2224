//! Tenants, keys, usage and the audit trail over HTTP. The operator key manages every
//! tenant; a tenant's key sees and manages only its own tenant (another tenant answers
//! 404, as if it did not exist).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use wasq_core::clock::Millis;
use wasq_core::text;
use wasq_core::*;

use crate::App;
use crate::auth::{Caller, generate_key};
use crate::error::ApiError;

pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{tenant}", get(get_tenant))
        .route("/v1/tenant", get(own_tenant))
        .route("/v1/tenants/{tenant}/quotas", put(set_quotas))
        .route("/v1/tenants/{tenant}/keys", post(create_key).get(list_keys))
        .route("/v1/tenants/{tenant}/keys/{id}/revoke", post(revoke_key))
        .route("/v1/audit", get(audit_log))
}

/// Longest text an audit entry stores per field (escaped, with a truncation marker past
/// it): a target may quote a caller's input, and the trail is append-only.
const MAX_AUDIT_FIELD_BYTES: usize = 512;

/// Appends to the audit trail; a failure is logged (the action itself already happened).
/// Call it only once the action has succeeded. Every text is stored escaped and bounded
/// ([`audit_entry`]), so no entry can carry a terminal escape or forge a second line.
pub(crate) async fn audit(app: &App, tenant: &str, caller: &Caller, action: &str, target: String) {
    let entry = audit_entry(app.now(), tenant, &caller.actor(), action, &target);
    if let Err(e) = app.store.audit(entry).await {
        tracing::error!(error = %e, tenant, action, "could not write the audit trail");
    }
}

fn audit_entry(at: Millis, tenant: &str, actor: &str, action: &str, target: &str) -> AuditEntry {
    let field = |s: &str| text::escape_line(s, MAX_AUDIT_FIELD_BYTES);
    AuditEntry {
        at,
        tenant: field(tenant),
        actor: field(actor),
        action: field(action),
        target: field(target),
    }
}

fn forbidden() -> ApiError {
    ApiError {
        status: StatusCode::FORBIDDEN,
        code: "forbidden",
        message: "this route needs the operator key".into(),
        retry_after_ms: None,
    }
}

fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    match caller {
        Caller::Admin => Ok(()),
        Caller::Tenant { .. } => Err(forbidden()),
    }
}

/// The operator may act on any tenant; a tenant only on itself (others do not exist).
async fn tenant_for(app: &App, caller: &Caller, tenant: &str) -> Result<Tenant, ApiError> {
    let visible = match caller {
        Caller::Admin => true,
        Caller::Tenant { tenant: own, .. } => own == tenant,
    };
    let found = if visible {
        app.store.tenant(tenant).await?
    } else {
        None
    };
    found.ok_or_else(|| ApiError::not_found(format!("tenant {tenant:?} not found")))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
    /// Missing fields take the server's defaults.
    quotas: Option<Quotas>,
}

#[utoipa::path(
    post,
    path = "/v1/tenants",
    tag = "tenants",
    summary = "Create a tenant",
    security(("operator_key" = [])),
    request_body = NewTenant,
    responses(
        crate::openapi::OperatorRefusals,
        (status = 201, description = "The tenant", body = Tenant),
        (status = 400, description = "`bad_tenant`: not `{\"name\": ...}`, or a name that is not 1-48 lowercase letters, digits, `-` or `_`", body = crate::error::ErrorBody),
        (status = 409, description = "`conflict`: the name is taken", body = crate::error::ErrorBody),
    ),
)]
async fn create_tenant(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    admin_only(&caller)?;
    let req: NewTenant = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("bad_tenant", format!("expected {{\"name\": ...}}: {e}"))
    })?;
    if !valid_tenant_name(&req.name) {
        return Err(ApiError::bad_request(
            "bad_tenant",
            format!(
                "tenant name {:?}: use 1-48 lowercase letters, digits, '-' or '_', starting with a letter or digit",
                req.name
            ),
        ));
    }
    let tenant = app
        .store
        .create_tenant(Tenant {
            name: req.name,
            created_at: app.now(),
            quotas: req.quotas.unwrap_or(app.config.default_quotas),
        })
        .await?;
    audit(
        &app,
        &tenant.name,
        &caller,
        "tenant.create",
        tenant.name.clone(),
    )
    .await;
    Ok((StatusCode::CREATED, Json(tenant)).into_response())
}

/// A tenant with its usage.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TenantView {
    #[serde(flatten)]
    tenant: Tenant,
    usage: Usage,
}

#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "tenants",
    summary = "Every tenant, with quotas and usage",
    security(("operator_key" = [])),
    responses(
        crate::openapi::OperatorRefusals,
        (status = 200, description = "Tenants by name", body = Vec<TenantView>),
    ),
)]
async fn list_tenants(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TenantView>>, ApiError> {
    admin_only(&caller)?;
    let mut out = vec![];
    for tenant in app.store.tenants().await? {
        let usage = app.store.usage(&tenant.name).await?;
        out.push(TenantView { tenant, usage });
    }
    Ok(Json(out))
}

/// `GET /v1/tenant`: the caller's own tenant, with its quotas and usage.
#[utoipa::path(
    get,
    path = "/v1/tenant",
    tag = "tenants",
    summary = "The caller's own tenant, with its quotas and usage",
    security(("tenant_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "The key's tenant", body = TenantView),
        (status = 400, description = "`no_tenant`: the operator key belongs to no tenant", body = crate::error::ErrorBody),
    ),
)]
async fn own_tenant(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<TenantView>, ApiError> {
    let Caller::Tenant { tenant, .. } = &caller else {
        return Err(ApiError::bad_request(
            "no_tenant",
            "the operator key belongs to no tenant: GET /v1/tenants lists them",
        ));
    };
    let tenant = tenant_for(&app, &caller, tenant).await?;
    let usage = app.store.usage(&tenant.name).await?;
    Ok(Json(TenantView { tenant, usage }))
}

#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}",
    tag = "tenants",
    summary = "A tenant, with its quotas and usage",
    description = "A tenant's key sees only its own tenant: another one answers 404.",
    params(("tenant" = String, Path, description = "The tenant's name")),
    security(("tenant_key" = []), ("operator_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "The tenant", body = TenantView),
        (status = 404, description = "`not_found`: no such tenant (or not the key's)", body = crate::error::ErrorBody),
    ),
)]
async fn get_tenant(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(tenant): Path<String>,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenant_for(&app, &caller, &tenant).await?;
    let usage = app.store.usage(&tenant.name).await?;
    Ok(Json(TenantView { tenant, usage }))
}

#[utoipa::path(
    put,
    path = "/v1/tenants/{tenant}/quotas",
    tag = "tenants",
    summary = "Replace a tenant's quotas",
    description = "Fields left out take the server's defaults.",
    params(("tenant" = String, Path, description = "The tenant's name")),
    security(("operator_key" = [])),
    request_body = Quotas,
    responses(
        crate::openapi::OperatorRefusals,
        (status = 200, description = "The tenant with its new quotas", body = Tenant),
        (status = 400, description = "`bad_quotas`: not a quotas object", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such tenant", body = crate::error::ErrorBody),
    ),
)]
async fn set_quotas(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(tenant): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Tenant>, ApiError> {
    admin_only(&caller)?;
    let quotas: Quotas = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("bad_quotas", format!("quotas: {e}")))?;
    let tenant = app.store.set_quotas(&tenant, quotas).await?;
    audit(
        &app,
        &tenant.name,
        &caller,
        "tenant.quotas",
        serde_json::to_string(&quotas).unwrap_or_default(),
    )
    .await;
    Ok(Json(tenant))
}

/// A key as listings show it: never the key, never its HMAC.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct KeyView {
    /// Public: the key starts with `wasq_<id>_`.
    id: String,
    tenant: String,
    label: String,
    #[schema(value_type = i64)]
    created_at: Millis,
    #[schema(value_type = Option<i64>)]
    revoked_at: Option<Millis>,
    /// Only in the answer that created it: shown once, stored nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl From<ApiKey> for KeyView {
    fn from(k: ApiKey) -> Self {
        KeyView {
            id: k.id,
            tenant: k.tenant,
            label: k.label,
            created_at: k.created_at,
            revoked_at: k.revoked_at,
            key: None,
        }
    }
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewKey {
    /// At most 100 printable characters.
    #[serde(default)]
    label: String,
}

#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/keys",
    tag = "keys",
    summary = "Create an API key of a tenant",
    description = "The answer's `key` is the only time the key is shown: only its HMAC is stored.",
    params(("tenant" = String, Path, description = "The tenant's name")),
    security(("tenant_key" = []), ("operator_key" = [])),
    request_body(content = Option<NewKey>, description = "Optional: an empty body is no label"),
    responses(
        crate::openapi::Refusals,
        (status = 201, description = "The key, with `key` set", body = KeyView),
        (status = 400, description = "`bad_key`: a bad body or label", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no such tenant (or not the key's)", body = crate::error::ErrorBody),
    ),
)]
async fn create_key(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(tenant): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let tenant = tenant_for(&app, &caller, &tenant).await?;
    let req: NewKey = if body.iter().all(u8::is_ascii_whitespace) {
        NewKey::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request("bad_key", format!("expected {{\"label\": ...}}: {e}"))
        })?
    };
    if req.label.len() > 100 || req.label.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "bad_key",
            "a key label is at most 100 printable characters",
        ));
    }
    let (key, stored) = new_key(&app, &tenant.name, req.label).await?;
    audit(&app, &tenant.name, &caller, "key.create", stored.id.clone()).await;
    let mut view = KeyView::from(stored);
    view.key = Some(key);
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Generates and stores a key for `tenant`; returns the key (to show once) and its record.
pub(crate) async fn new_key(
    app: &App,
    tenant: &str,
    label: String,
) -> Result<(String, ApiKey), ApiError> {
    let (id, key) = generate_key();
    let stored = ApiKey {
        id,
        tenant: tenant.to_owned(),
        hmac: app.keyring.hmac_hex(&key),
        label,
        created_at: app.now(),
        revoked_at: None,
    };
    app.store.create_key(stored.clone()).await?;
    Ok((key, stored))
}

#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/keys",
    tag = "keys",
    summary = "A tenant's API keys",
    description = "Ids and labels, oldest first, revoked ones included; never the keys.",
    params(("tenant" = String, Path, description = "The tenant's name")),
    security(("tenant_key" = []), ("operator_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "The keys", body = Vec<KeyView>),
        (status = 404, description = "`not_found`: no such tenant (or not the key's)", body = crate::error::ErrorBody),
    ),
)]
async fn list_keys(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(tenant): Path<String>,
) -> Result<Json<Vec<KeyView>>, ApiError> {
    let tenant = tenant_for(&app, &caller, &tenant).await?;
    let keys = app.store.keys(&tenant.name).await?;
    Ok(Json(keys.into_iter().map(KeyView::from).collect()))
}

#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/keys/{id}/revoke",
    tag = "keys",
    summary = "Revoke an API key",
    description = "At once on this server, within a second on every other one sharing the store. Revoking a revoked key changes nothing.",
    params(
        ("tenant" = String, Path, description = "The tenant's name"),
        ("id" = String, Path, description = "The key's id"),
    ),
    security(("tenant_key" = []), ("operator_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "The revoked key", body = KeyView),
        (status = 404, description = "`not_found`: no such tenant or key", body = crate::error::ErrorBody),
    ),
)]
async fn revoke_key(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Json<KeyView>, ApiError> {
    let tenant = tenant_for(&app, &caller, &tenant).await?;
    // Revoking a revoked key answers as before and changes nothing: nothing to audit.
    // (Read first: the revocation time cannot tell, two revocations may share a ms.)
    let was_revoked = app
        .store
        .key(&id)
        .await?
        .is_some_and(|k| k.tenant == tenant.name && k.revoked_at.is_some());
    let key = app.store.revoke_key(&tenant.name, &id, app.now()).await?;
    app.keys.forget(&id);
    if !was_revoked {
        audit(&app, &tenant.name, &caller, "key.revoke", id).await;
    }
    Ok(Json(key.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AuditParams {
    /// Only this tenant's entries (a tenant's key: its own only).
    tenant: Option<String>,
    /// Entries to list, 1-1000 (default 100).
    limit: Option<usize>,
}

#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    summary = "The audit trail, newest first",
    description = "Only actions that succeeded, once each. A tenant's key sees its own tenant's.",
    params(AuditParams),
    security(("tenant_key" = []), ("operator_key" = [])),
    responses(
        crate::openapi::Refusals,
        (status = 200, description = "Entries, newest first", body = Vec<AuditEntry>),
        (status = 400, description = "`bad_query`: a bad parameter", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: another tenant than the key's", body = crate::error::ErrorBody),
    ),
)]
async fn audit_log(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    params: Result<Query<AuditParams>, QueryRejection>,
) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    let p = params
        .map(|Query(p)| p)
        .map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    let tenant = match (&caller, p.tenant) {
        (Caller::Admin, t) => t,
        (Caller::Tenant { tenant, .. }, None) => Some(tenant.clone()),
        (Caller::Tenant { tenant, .. }, Some(t)) => {
            if &t != tenant {
                return Err(ApiError::not_found(format!("tenant {t:?} not found")));
            }
            Some(t)
        }
    };
    Ok(Json(app.store.audit_log(tenant.as_deref(), limit).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_entries_are_escaped_and_bounded() {
        let e = audit_entry(
            1,
            "acme",
            "key:abc",
            "schedule.\x1b]0;pwned\x07",
            &format!(
                "f\n2026-01-01 admin key.revoke {}\u{202e}",
                "x".repeat(20 << 20)
            ),
        );
        assert_eq!(e.action, "schedule.\\u{1b}]0;pwned\\u{7}");
        assert!(
            e.target.starts_with("f\\n2026-01-01 admin key.revoke xxx"),
            "{}",
            e.target
        );
        assert!(
            e.target.len() < MAX_AUDIT_FIELD_BYTES + 32,
            "{}",
            e.target.len()
        );
        assert!(e.target.ends_with(" bytes]"), "a marker says what was cut");
        for field in [&e.tenant, &e.actor, &e.action, &e.target] {
            assert!(!field.chars().any(text::is_unsafe_char), "{field:?}");
        }
    }
}

//! Tenants, their API keys, quotas, usage and the audit trail: the [`Directory`] every
//! backend keeps beside its [`crate::Store`].
//!
//! Keys are never stored: only an HMAC-SHA256 of the whole key (computed by the server,
//! which holds the HMAC secret) and the key's public id, which is also its visible prefix.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::store::StoreError;

/// Tenant names appear in keys of the stores and in URLs: short and plain.
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=48).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Tenant {
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub created_at: Millis,
    pub quotas: Quotas,
}

/// Per-tenant ceilings. The store enforces `max_queued` (enqueue answers
/// [`StoreError::QuotaExceeded`]), `max_running` (claims skip the tenant's runs while it
/// has that many running) and the storage quotas ([`StoreError::StorageQuota`]); the
/// server enforces the rest at deploy and run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Quotas {
    /// Runs of the tenant executing at once, across all workers.
    pub max_running: u32,
    /// Runs of the tenant waiting to start (queued, including delayed and backing off).
    pub max_queued: u64,
    /// Ceiling of a function's fuel limit.
    pub max_fuel_per_run: u64,
    /// Ceiling of a function's memory limit.
    pub max_memory_per_run: u64,
    /// Largest component the tenant may upload.
    pub max_component_bytes: u64,
    /// Outbound HTTP requests one attempt may make.
    pub max_outbound_requests_per_run: u32,
    /// Bytes the tenant may keep in the store: runs (inputs, outputs, steps, logs,
    /// attempts), events, functions and their components (see [`crate::storage`]).
    pub max_stored_bytes: u64,
    /// Bytes one run may keep: its input, output and step outputs. A step or output
    /// past it fails the run (`storage_quota`).
    pub max_run_bytes: u64,
    /// Bytes of log lines one run may keep, over all its attempts; later lines are
    /// dropped, with one marker line.
    pub max_run_log_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_running: 64,
            max_queued: 100_000,
            max_fuel_per_run: 1_000_000_000_000_000,
            max_memory_per_run: 512 << 20,
            max_component_bytes: 64 << 20,
            max_outbound_requests_per_run: 64,
            max_stored_bytes: 2 << 30,
            max_run_bytes: 64 << 20,
            max_run_log_bytes: 16 << 20,
        }
    }
}

/// A stored API key: everything but the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// Public, unique; the key starts with it, so a leaked key can be found and revoked.
    pub id: String,
    pub tenant: String,
    /// Hex HMAC-SHA256 of the whole key under the server's secret.
    pub hmac: String,
    pub label: String,
    pub created_at: Millis,
    pub revoked_at: Option<Millis>,
}

/// What a tenant has consumed, summed by the store as attempts end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Fuel burned by all attempts that ended in the sandbox (the basis for billing).
    pub fuel: u64,
    /// Attempts that ended (succeeded, failed, slept or waited count once each).
    pub attempts: u64,
    /// Bytes the tenant keeps in the store now, against its `max_stored_bytes`.
    #[serde(default)]
    pub stored_bytes: u64,
}

/// One line of the append-only audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub at: Millis,
    pub tenant: String,
    /// Who acted: `key:<id>`, `admin`, or `system`.
    pub actor: String,
    /// What was done, e.g. `deploy`, `key.create`, `key.revoke`, `run.cancel`.
    pub action: String,
    /// What it was done to: a function name and digest, a key id, a run id.
    pub target: String,
}

/// Tenant metadata. Small and rarely written, so each call is its own transaction.
#[async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Creates a tenant; [`StoreError::Conflict`] if the name is taken.
    async fn create_tenant(&self, tenant: Tenant) -> Result<Tenant, StoreError>;
    /// Replaces a tenant's quotas; [`StoreError::NotFound`] if there is no such tenant.
    async fn set_quotas(&self, tenant: &str, quotas: Quotas) -> Result<Tenant, StoreError>;
    async fn tenant(&self, name: &str) -> Result<Option<Tenant>, StoreError>;
    /// Sorted by name.
    async fn tenants(&self) -> Result<Vec<Tenant>, StoreError>;

    /// Stores a new key; [`StoreError::Conflict`] if the id exists.
    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError>;
    async fn key(&self, id: &str) -> Result<Option<ApiKey>, StoreError>;
    /// Oldest first, revoked ones included.
    async fn keys(&self, tenant: &str) -> Result<Vec<ApiKey>, StoreError>;
    /// Marks a key of `tenant` revoked (once; later calls return it unchanged).
    async fn revoke_key(&self, tenant: &str, id: &str, at: Millis) -> Result<ApiKey, StoreError>;

    async fn usage(&self, tenant: &str) -> Result<Usage, StoreError>;

    async fn audit(&self, entry: AuditEntry) -> Result<(), StoreError>;
    /// Newest first; `tenant: None` = every tenant.
    async fn audit_log(
        &self,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError>;
}

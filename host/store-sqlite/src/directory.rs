//! The [`Directory`]: tenants, key records (HMACs only), usage and the audit trail.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, params};
use wasq_core::clock::Millis;
use wasq_core::*;

use crate::cached::Cached;
use crate::{SqliteStore, from_json, internal, to_json};

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tenants (
    name       TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    quotas     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    hmac       TEXT NOT NULL,
    label      TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX IF NOT EXISTS api_keys_by_tenant ON api_keys (tenant, created_at);
CREATE TABLE IF NOT EXISTS tenant_usage (
    tenant   TEXT PRIMARY KEY,
    fuel     INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    -- bytes the tenant keeps (see storage.rs); added to old files by `migrate`
    stored   INTEGER NOT NULL DEFAULT 0
);
-- Append-only: nothing updates or deletes these rows.
CREATE TABLE IF NOT EXISTS audit (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
"#;

/// Adds an ended execution's fuel to its tenant's usage, inside the finishing transaction.
pub(crate) fn add_usage(
    tx: &rusqlite::Connection,
    tenant: &str,
    fuel: Option<u64>,
) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO tenant_usage (tenant, fuel, attempts) VALUES (?1, ?2, 1)
         ON CONFLICT (tenant) DO UPDATE SET fuel = fuel + ?2, attempts = attempts + 1",
        params![tenant, fuel.unwrap_or(0) as i64],
    )
    .map_err(internal)?;
    Ok(())
}

fn tenant_from_row(row: &Row<'_>) -> rusqlite::Result<Tenant> {
    Ok(Tenant {
        name: row.get(0)?,
        created_at: row.get(1)?,
        quotas: from_json(&row.get::<_, String>(2)?)?,
    })
}

fn key_from_row(row: &Row<'_>) -> rusqlite::Result<ApiKey> {
    Ok(ApiKey {
        id: row.get(0)?,
        tenant: row.get(1)?,
        hmac: row.get(2)?,
        label: row.get(3)?,
        created_at: row.get(4)?,
        revoked_at: row.get(5)?,
    })
}

fn load_tenant(tx: &rusqlite::Connection, name: &str) -> Result<Option<Tenant>, StoreError> {
    tx.row(
        "SELECT name, created_at, quotas FROM tenants WHERE name = ?1",
        [name],
        tenant_from_row,
    )
    .optional()
    .map_err(internal)
}

const KEY_COLUMNS: &str = "id, tenant, hmac, label, created_at, revoked_at";

#[async_trait]
impl Directory for SqliteStore {
    async fn create_tenant(&self, tenant: Tenant) -> Result<Tenant, StoreError> {
        self.tx(move |tx, _| {
            let quotas = to_json(&tenant.quotas)?;
            let n = tx
                .exec(
                    "INSERT INTO tenants (name, created_at, quotas) VALUES (?1, ?2, ?3)
                     ON CONFLICT (name) DO NOTHING",
                    params![tenant.name, tenant.created_at, quotas],
                )
                .map_err(internal)?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "tenant {:?} already exists",
                    tenant.name
                )));
            }
            Ok(tenant)
        })
        .await
    }

    async fn set_quotas(&self, tenant: &str, quotas: Quotas) -> Result<Tenant, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            tx.exec(
                "UPDATE tenants SET quotas = ?2 WHERE name = ?1",
                params![tenant, to_json(&quotas)?],
            )
            .map_err(internal)?;
            load_tenant(tx, &tenant)?
                .ok_or_else(|| StoreError::NotFound(format!("tenant {tenant:?}")))
        })
        .await
    }

    async fn tenant(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        let name = name.to_owned();
        self.tx(move |tx, _| load_tenant(tx, &name)).await
    }

    async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        self.tx(|tx, _| {
            let mut stmt = tx
                .prepare_cached("SELECT name, created_at, quotas FROM tenants ORDER BY name")
                .map_err(internal)?;
            let rows = stmt.query_map([], tenant_from_row).map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.tx(move |tx, _| {
            if load_tenant(tx, &key.tenant)?.is_none() {
                return Err(StoreError::NotFound(format!("tenant {:?}", key.tenant)));
            }
            let n = tx
                .exec(
                    "INSERT INTO api_keys (id, tenant, hmac, label, created_at, revoked_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO NOTHING",
                    params![
                        key.id,
                        key.tenant,
                        key.hmac,
                        key.label,
                        key.created_at,
                        key.revoked_at
                    ],
                )
                .map_err(internal)?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "key {:?} already exists",
                    key.id
                )));
            }
            Ok(())
        })
        .await
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let id = id.to_owned();
        self.tx(move |tx, _| {
            tx.row(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1"),
                [id],
                key_from_row,
            )
            .optional()
            .map_err(internal)
        })
        .await
    }

    async fn keys(&self, tenant: &str) -> Result<Vec<ApiKey>, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant = ?1 ORDER BY created_at, id"
                ))
                .map_err(internal)?;
            let rows = stmt.query_map([tenant], key_from_row).map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }

    async fn revoke_key(&self, tenant: &str, id: &str, at: Millis) -> Result<ApiKey, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.tx(move |tx, _| {
            tx.exec(
                "UPDATE api_keys SET revoked_at = ?3
                 WHERE id = ?1 AND tenant = ?2 AND revoked_at IS NULL",
                params![id, tenant, at],
            )
            .map_err(internal)?;
            tx.row(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1 AND tenant = ?2"),
                params![id, tenant],
                key_from_row,
            )
            .optional()
            .map_err(internal)?
            .ok_or_else(|| StoreError::NotFound(format!("key {id:?}")))
        })
        .await
    }

    async fn usage(&self, tenant: &str) -> Result<Usage, StoreError> {
        let tenant = tenant.to_owned();
        self.tx(move |tx, _| {
            let usage = tx
                .row(
                    "SELECT fuel, attempts, stored FROM tenant_usage WHERE tenant = ?1",
                    [tenant],
                    |r| {
                        Ok(Usage {
                            fuel: r.get::<_, i64>(0)? as u64,
                            attempts: r.get::<_, i64>(1)? as u64,
                            stored_bytes: r.get::<_, i64>(2)?.max(0) as u64,
                        })
                    },
                )
                .optional()
                .map_err(internal)?;
            Ok(usage.unwrap_or_default())
        })
        .await
    }

    async fn audit(&self, e: AuditEntry) -> Result<(), StoreError> {
        self.tx(move |tx, _| {
            tx.exec(
                "INSERT INTO audit (at, tenant, actor, action, target) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![e.at, e.tenant, e.actor, e.action, e.target],
            )
            .map_err(internal)?;
            Ok(())
        })
        .await
    }

    async fn audit_log(
        &self,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let tenant = tenant.map(str::to_owned);
        self.tx(move |tx, _| {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT at, tenant, actor, action, target FROM audit
                     WHERE ?1 IS NULL OR tenant = ?1 ORDER BY seq DESC LIMIT ?2",
                )
                .map_err(internal)?;
            let rows = stmt
                .query_map(params![tenant, limit as i64], |r| {
                    Ok(AuditEntry {
                        at: r.get(0)?,
                        tenant: r.get(1)?,
                        actor: r.get(2)?,
                        action: r.get(3)?,
                        target: r.get(4)?,
                    })
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)
        })
        .await
    }
}

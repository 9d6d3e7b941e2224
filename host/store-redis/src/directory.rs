//! The [`Directory`] on Redis: tenants, key records (HMACs only), usage, audit trail.
//!
//! Directory keys live beside the global keys (`G dir:...`, one slot): an API key is
//! looked up by its id before the tenant is known. Each write that must check something
//! first is a small script on that one slot. Usage is the exception: the finish script
//! adds to `P usage` in the tenant's own slot, in the same transition that ends the
//! attempt.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `G dir:tenants` | set | tenant names |
//! | `G dir:tenant:<name>` | hash | created_at, quotas JSON |
//! | `G dir:key:<id>` | hash | tenant, hmac, label, created_at, revoked_at |
//! | `G dir:keys:<tenant>` | zset | key ids by creation time |
//! | `G dir:audit`, `G dir:audit:<tenant>` | list | audit entries (JSON), newest first |
//! | `P quotas` | hash | `max_running`, `max_queued`, `max_stored_bytes`, `max_run_bytes`, `max_run_log_bytes`: copies of the tenant's quotas, for the tenant scripts (none: unlimited) |
//! | `P usage` | hash | fuel, attempts, stored (bytes; see `wasq_core::storage`) |

use std::collections::HashMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use redis::{Script, Value};
use wasq_core::clock::Millis;
use wasq_core::*;

use crate::RedisStore;

/// KEYS[1] = tenant hash, KEYS[2] = tenants set; ARGV = name, created_at, quotas.
static CREATE_TENANT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'created_at', ARGV[2], 'quotas', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"#,
    )
});

/// KEYS[1] = tenant hash; ARGV = quotas. 0 when there is no such tenant.
static SET_QUOTAS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'quotas', ARGV[1])
return 1
"#,
    )
});

/// KEYS[1] = tenant hash, KEYS[2] = key hash, KEYS[3] = tenant's key index;
/// ARGV = id, tenant, hmac, label, created_at. 0: no tenant, -1: id taken.
static CREATE_KEY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('HSET', KEYS[2], 'tenant', ARGV[2], 'hmac', ARGV[3], 'label', ARGV[4], 'created_at', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return 1
"#,
    )
});

/// KEYS[1] = key hash; ARGV = tenant, at. 0 when the key is not the tenant's.
static REVOKE_KEY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return 0 end
redis.call('HSETNX', KEYS[1], 'revoked_at', ARGV[2])
return 1
"#,
    )
});

/// KEYS = the global and the tenant's audit lists; ARGV[1] = the entry.
static AUDIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
"#,
    )
});

fn field(h: &HashMap<String, String>, name: &str) -> Result<String, StoreError> {
    h.get(name)
        .cloned()
        .ok_or_else(|| StoreError::Internal(format!("directory record lacks {name}")))
}

fn millis(h: &HashMap<String, String>, name: &str) -> Result<Millis, StoreError> {
    field(h, name)?
        .parse()
        .map_err(|e| StoreError::Internal(format!("directory field {name}: {e}")))
}

fn json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Internal(format!("directory JSON: {e}")))
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

impl RedisStore {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<i64, StoreError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let mut c = self.inner.conn.clone();
        self.timed(inv.invoke_async(&mut c)).await
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, StoreError> {
        self.query(redis::cmd("HGETALL").arg(key)).await
    }

    fn tenant_record(name: &str, h: &HashMap<String, String>) -> Result<Tenant, StoreError> {
        Ok(Tenant {
            name: name.to_owned(),
            created_at: millis(h, "created_at")?,
            quotas: h
                .get("quotas")
                .map(|q| json(q))
                .transpose()?
                .unwrap_or_default(),
        })
    }

    fn key_record(id: &str, h: &HashMap<String, String>) -> Result<ApiKey, StoreError> {
        Ok(ApiKey {
            id: id.to_owned(),
            tenant: field(h, "tenant")?,
            hmac: field(h, "hmac")?,
            label: h.get("label").cloned().unwrap_or_default(),
            created_at: millis(h, "created_at")?,
            revoked_at: h
                .get("revoked_at")
                .map(|_| millis(h, "revoked_at"))
                .transpose()?,
        })
    }

    /// Copies the quotas the stores enforce into the tenant's slot, as plain fields of its
    /// `meta` that the tenant scripts read with the rest of it (`qm` says they are there;
    /// an older wasq kept them in a hash of their own, `quotas`, which goes).
    async fn mirror_quotas(&self, tenant: &str, quotas: &Quotas) -> Result<(), StoreError> {
        let prefix = self.tenant_prefix(tenant);
        let _: Value = self
            .query(
                redis::cmd("HSET")
                    .arg(format!("{prefix}meta"))
                    .arg("qm")
                    .arg(1)
                    .arg("max_running")
                    .arg(quotas.max_running)
                    .arg("max_queued")
                    .arg(quotas.max_queued)
                    .arg("max_stored_bytes")
                    .arg(quotas.max_stored_bytes)
                    .arg("max_run_bytes")
                    .arg(quotas.max_run_bytes)
                    .arg("max_run_log_bytes")
                    .arg(quotas.max_run_log_bytes),
            )
            .await?;
        let _: Value = self
            .query(redis::cmd("DEL").arg(format!("{prefix}quotas")))
            .await?;
        // A tenant held back by max_running may be startable now: republish its due time.
        self.republish(tenant).await
    }
}

#[async_trait]
impl Directory for RedisStore {
    async fn create_tenant(&self, tenant: Tenant) -> Result<Tenant, StoreError> {
        let keys = [
            self.g(&format!("dir:tenant:{}", tenant.name)),
            self.g("dir:tenants"),
        ];
        let args = [
            tenant.name.clone(),
            tenant.created_at.to_string(),
            to_json(&tenant.quotas)?,
        ];
        match self.eval(&CREATE_TENANT, &keys, &args).await? {
            // A crash before the copy leaves the tenant unlimited until its quotas are
            // set again; the copy cannot go first, or a duplicate create would change it.
            1 => {
                self.mirror_quotas(&tenant.name, &tenant.quotas).await?;
                Ok(tenant)
            }
            _ => Err(StoreError::Conflict(format!(
                "tenant {:?} already exists",
                tenant.name
            ))),
        }
    }

    async fn set_quotas(&self, tenant: &str, quotas: Quotas) -> Result<Tenant, StoreError> {
        let keys = [self.g(&format!("dir:tenant:{tenant}"))];
        if self.eval(&SET_QUOTAS, &keys, &[to_json(&quotas)?]).await? == 0 {
            return Err(StoreError::NotFound(format!("tenant {tenant:?}")));
        }
        self.mirror_quotas(tenant, &quotas).await?;
        self.tenant(tenant)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("tenant {tenant:?}")))
    }

    async fn tenant(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        let h = self.hgetall(&self.g(&format!("dir:tenant:{name}"))).await?;
        if h.is_empty() {
            return Ok(None);
        }
        Self::tenant_record(name, &h).map(Some)
    }

    async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let mut names: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("dir:tenants")))
            .await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(t) = Directory::tenant(self, &name).await? {
                out.push(t);
            }
        }
        Ok(out)
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        let keys = [
            self.g(&format!("dir:tenant:{}", key.tenant)),
            self.g(&format!("dir:key:{}", key.id)),
            self.g(&format!("dir:keys:{}", key.tenant)),
        ];
        let args = [
            key.id.clone(),
            key.tenant.clone(),
            key.hmac,
            key.label,
            key.created_at.to_string(),
        ];
        match self.eval(&CREATE_KEY, &keys, &args).await? {
            1 => Ok(()),
            0 => Err(StoreError::NotFound(format!("tenant {:?}", key.tenant))),
            _ => Err(StoreError::Conflict(format!(
                "key {:?} already exists",
                key.id
            ))),
        }
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let h = self.hgetall(&self.g(&format!("dir:key:{id}"))).await?;
        if h.is_empty() {
            return Ok(None);
        }
        Self::key_record(id, &h).map(Some)
    }

    async fn keys(&self, tenant: &str) -> Result<Vec<ApiKey>, StoreError> {
        let ids: Vec<String> = self
            .query(
                redis::cmd("ZRANGE")
                    .arg(self.g(&format!("dir:keys:{tenant}")))
                    .arg(0)
                    .arg(-1),
            )
            .await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(k) = self.key(&id).await? {
                out.push(k);
            }
        }
        Ok(out)
    }

    async fn revoke_key(&self, tenant: &str, id: &str, at: Millis) -> Result<ApiKey, StoreError> {
        let keys = [self.g(&format!("dir:key:{id}"))];
        if self
            .eval(&REVOKE_KEY, &keys, &[tenant.to_owned(), at.to_string()])
            .await?
            == 0
        {
            return Err(StoreError::NotFound(format!("key {id:?}")));
        }
        self.key(id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("key {id:?}")))
    }

    async fn usage(&self, tenant: &str) -> Result<Usage, StoreError> {
        let h = self
            .hgetall(&format!("{}usage", self.tenant_prefix(tenant)))
            .await?;
        let n = |name: &str| h.get(name).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(Usage {
            fuel: n("fuel"),
            attempts: n("attempts"),
            // Never negative in practice; a counter driven below zero reads as none.
            stored_bytes: h
                .get("stored")
                .and_then(|v| v.parse::<i64>().ok())
                .map_or(0, |v| v.max(0) as u64),
        })
    }

    async fn audit(&self, entry: AuditEntry) -> Result<(), StoreError> {
        let keys = [
            self.g("dir:audit"),
            self.g(&format!("dir:audit:{}", entry.tenant)),
        ];
        self.eval(&AUDIT, &keys, &[to_json(&entry)?]).await?;
        Ok(())
    }

    async fn audit_log(
        &self,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = match tenant {
            Some(t) => self.g(&format!("dir:audit:{t}")),
            None => self.g("dir:audit"),
        };
        let lines: Vec<String> = self
            .query(
                redis::cmd("LRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(limit.saturating_sub(1) as i64),
            )
            .await?;
        lines.iter().map(|l| json(l)).collect()
    }
}

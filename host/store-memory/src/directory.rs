//! The [`Directory`]: tenants, key records (HMACs only), usage and the audit trail.

use async_trait::async_trait;
use wasq_core::clock::Millis;
use wasq_core::*;

use crate::MemoryStore;

#[async_trait]
impl Directory for MemoryStore {
    async fn create_tenant(&self, tenant: Tenant) -> Result<Tenant, StoreError> {
        self.with(|st, _| {
            if st.tenants.contains_key(&tenant.name) {
                return Err(StoreError::Conflict(format!(
                    "tenant {:?} already exists",
                    tenant.name
                )));
            }
            st.tenants.insert(tenant.name.clone(), tenant.clone());
            Ok(tenant)
        })
    }

    async fn set_quotas(&self, tenant: &str, quotas: Quotas) -> Result<Tenant, StoreError> {
        self.with(|st, _| {
            let t = st
                .tenants
                .get_mut(tenant)
                .ok_or_else(|| StoreError::NotFound(format!("tenant {tenant:?}")))?;
            t.quotas = quotas;
            Ok(t.clone())
        })
    }

    async fn tenant(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        self.with(|st, _| Ok(st.tenants.get(name).cloned()))
    }

    async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        self.with(|st, _| Ok(st.tenants.values().cloned().collect()))
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.with(|st, _| {
            if !st.tenants.contains_key(&key.tenant) {
                return Err(StoreError::NotFound(format!("tenant {:?}", key.tenant)));
            }
            if st.keys.contains_key(&key.id) {
                return Err(StoreError::Conflict(format!(
                    "key {:?} already exists",
                    key.id
                )));
            }
            st.keys.insert(key.id.clone(), key);
            Ok(())
        })
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        self.with(|st, _| Ok(st.keys.get(id).cloned()))
    }

    async fn keys(&self, tenant: &str) -> Result<Vec<ApiKey>, StoreError> {
        self.with(|st, _| {
            let mut keys: Vec<ApiKey> = st
                .keys
                .values()
                .filter(|k| k.tenant == tenant)
                .cloned()
                .collect();
            // By id already; oldest first, ties by id.
            keys.sort_by_key(|k| k.created_at);
            Ok(keys)
        })
    }

    async fn revoke_key(&self, tenant: &str, id: &str, at: Millis) -> Result<ApiKey, StoreError> {
        self.with(|st, _| {
            let key = st
                .keys
                .get_mut(id)
                .filter(|k| k.tenant == tenant)
                .ok_or_else(|| StoreError::NotFound(format!("key {id:?}")))?;
            key.revoked_at.get_or_insert(at);
            Ok(key.clone())
        })
    }

    async fn usage(&self, tenant: &str) -> Result<Usage, StoreError> {
        self.with(|st, _| Ok(st.spaces.get(tenant).map(|s| s.usage).unwrap_or_default()))
    }

    async fn audit(&self, entry: AuditEntry) -> Result<(), StoreError> {
        self.with(|st, _| {
            st.audit.push(entry);
            Ok(())
        })
    }

    async fn audit_log(
        &self,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        self.with(|st, _| {
            Ok(st
                .audit
                .iter()
                .rev()
                .filter(|e| tenant.is_none_or(|t| e.tenant == t))
                .take(limit)
                .cloned()
                .collect())
        })
    }
}

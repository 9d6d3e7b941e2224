//! Webhook deliveries ([`Deliveries`]): each tenant's in its slot (`lua/deliveries.lua`),
//! and the tenants with pending ones in the global `G dlv` zset by their earliest due
//! time, which a claim reads to find whom to visit.
//!
//! `G dlv` is in another slot than the deliveries (Cluster), so it is kept from Rust
//! after each script, race-free without a transaction: an add lowers the tenant's entry
//! (`ZADD LT`); a claim or a try removes it, reads the tenant's earliest pending delivery
//! again, and puts that back. A delivery is always in its tenant's `dlvq` before its
//! adder touches `G dlv`, so whichever order two processes run in, the entry ends no later
//! than the earliest pending delivery.

use wasq_core::notify::{self, Delivery, DeliveryTry};

use crate::decode::bytes;

use super::*;

/// Tenants one claim of deliveries visits at most.
const CLAIM_TENANTS: usize = 100;

impl RedisStore {
    /// After a script of `tenant` that did not only add: `G dlv` follows its `dlvq`.
    async fn refresh_due(&self, tenant: &str) -> Result<(), StoreError> {
        let key = self.g("dlv");
        self.query::<i64>(redis::cmd("ZREM").arg(&key).arg(tenant))
            .await?;
        let head: Vec<(String, f64)> = self
            .query(
                redis::cmd("ZRANGE")
                    .arg(format!("{}dlvq", self.tenant_prefix(tenant)))
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES"),
            )
            .await?;
        if let Some((_, at)) = head.first() {
            self.lower_due(tenant, *at as i64).await?;
        }
        Ok(())
    }

    async fn lower_due(&self, tenant: &str, at: i64) -> Result<(), StoreError> {
        self.query::<i64>(
            redis::cmd("ZADD")
                .arg(self.g("dlv"))
                .arg("LT")
                .arg(at)
                .arg(tenant),
        )
        .await
        .map(drop)
    }

    async fn claim_tenant_deliveries(
        &self,
        tenant: &str,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<Delivery>, StoreError> {
        let args = Args::new().s("claim").n(limit).n(lease_ms);
        let (status, rest) = self.script(&scripts::DELIVERIES, tenant, args).await?;
        if status != "ok" {
            return Err(corrupt(format!("deliveries answered {status}")));
        }
        let items = array(rest.into_iter().nth(1).unwrap_or(Value::Nil))?;
        self.refresh_due(tenant).await?;
        items.into_iter().map(|v| delivery(tenant, v)).collect()
    }
}

/// A delivery from its id and `FIELDS` (see `lua/deliveries.lua`).
fn delivery(tenant: &str, v: Value) -> Result<Delivery, StoreError> {
    let mut f = array(v)?.into_iter();
    let mut next = || f.next().ok_or_else(|| corrupt("short delivery"));
    let text = |v: Value| string(v);
    let id = text(next()?)?;
    let run_id = text(next()?)?;
    let url = text(next()?)?;
    let event = text(next()?)?;
    let payload = bytes(next()?)?;
    let status = text(next()?)?.parse().map_err(corrupt)?;
    let tries = int(next()?)? as u32;
    let next_at = int(next()?)?;
    let token = int(next()?)? as u64;
    let last_error = match next()? {
        Value::Nil => None,
        v => Some(text(v)?),
    };
    let created_at = int(next()?)?;
    let updated_at = int(next()?)?;
    Ok(Delivery {
        id,
        tenant: tenant.to_owned(),
        run_id,
        url,
        event,
        payload,
        status,
        tries,
        next_at,
        token,
        last_error,
        created_at,
        updated_at,
    })
}

#[async_trait]
impl Deliveries for RedisStore {
    async fn add_deliveries(&self, deliveries: Vec<Delivery>) -> Result<(), StoreError> {
        let mut by_tenant: BTreeMap<String, Vec<Delivery>> = BTreeMap::new();
        for d in deliveries {
            by_tenant.entry(d.tenant.clone()).or_default().push(d);
        }
        for (tenant, ds) in by_tenant {
            let mut args = Args::new().s("add").n(ds.len());
            for d in &ds {
                args = args
                    .s(&d.id)
                    .s(&d.run_id)
                    .s(&d.url)
                    .s(&d.event)
                    .b(d.payload.clone());
            }
            let (status, rest) = self.script(&scripts::DELIVERIES, &tenant, args).await?;
            if status != "ok" {
                return Err(corrupt(format!("deliveries answered {status}")));
            }
            let head = string(rest.into_iter().next().unwrap_or(Value::Nil))?;
            if let Ok(at) = head.parse::<i64>() {
                self.lower_due(&tenant, at).await?;
            }
        }
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<Delivery>, StoreError> {
        let due: Vec<String> = self
            .query(
                redis::cmd("ZRANGEBYSCORE")
                    .arg(self.g("dlv"))
                    .arg("-inf")
                    .arg(self.now())
                    .arg("LIMIT")
                    .arg(0)
                    .arg(CLAIM_TENANTS),
            )
            .await?;
        let mut claimed = Vec::new();
        for tenant in due {
            if claimed.len() >= limit {
                break;
            }
            let got = self
                .claim_tenant_deliveries(&tenant, limit - claimed.len(), lease_ms)
                .await?;
            claimed.extend(got);
        }
        Ok(claimed)
    }

    async fn record_try(&self, tried: DeliveryTry) -> Result<(), StoreError> {
        let key = format!("{}dlv:{}", self.tenant_prefix(&tried.tenant), tried.id);
        let tries: Option<u32> = self
            .query(redis::cmd("HGET").arg(&key).arg("tries"))
            .await?;
        let Some(tries) = tries else {
            return Ok(());
        };
        let after = notify::after_try(tries, tried.error.as_deref(), self.now());
        let args = Args::new()
            .s("try")
            .s(&tried.id)
            .n(tried.token)
            .n(tries)
            .s(after.status.as_str())
            .n(after.tries)
            .n(after.next_at)
            .s(after.last_error.unwrap_or_default());
        let (status, _) = self
            .script(&scripts::DELIVERIES, &tried.tenant, args)
            .await?;
        if status != "ok" {
            return Err(corrupt(format!("deliveries answered {status}")));
        }
        self.refresh_due(&tried.tenant).await
    }

    async fn deliveries(&self, tenant: &str, run: &str) -> Result<Vec<Delivery>, StoreError> {
        let (status, rest) = self
            .script(&scripts::DELIVERY_LIST, tenant, Args::new().s(run))
            .await?;
        if status != "ok" {
            return Err(corrupt(format!("delivery_list answered {status}")));
        }
        array(rest.into_iter().next().unwrap_or(Value::Nil))?
            .into_iter()
            .map(|v| delivery(tenant, v))
            .collect()
    }
}

//! Webhook deliveries ([`Deliveries`]): one row each, the pending ones by due time; a
//! purged run's go with it (`storage::purge`).

use wasq_core::notify::{self, Delivery, DeliveryTry};

use super::*;

#[async_trait]
impl Deliveries for SqliteStore {
    async fn add_deliveries(&self, d: Vec<Delivery>) -> Result<(), StoreError> {
        self.tx(move |tx, _| add(tx, d)).await
    }

    async fn claim_deliveries(
        &self,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.tx(move |tx, now| claim(tx, now, limit, lease_ms))
            .await
    }

    async fn record_try(&self, tried: DeliveryTry) -> Result<(), StoreError> {
        self.tx(move |tx, now| record_try(tx, now, tried)).await
    }

    async fn deliveries(&self, tenant: &str, run: &str) -> Result<Vec<Delivery>, StoreError> {
        let (tenant, run) = (tenant.to_owned(), run.to_owned());
        self.tx(move |tx, _| of_run(tx, &tenant, &run)).await
    }
}

const COLUMNS: &str = "id, tenant, run_id, url, event, payload, status, tries, next_at, token, \
                       last_error, created_at, updated_at";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Delivery> {
    let status: String = r.get(6)?;
    Ok(Delivery {
        id: r.get(0)?,
        tenant: r.get(1)?,
        run_id: r.get(2)?,
        url: r.get(3)?,
        event: r.get(4)?,
        payload: r.get(5)?,
        status: status.parse().map_err(|e: String| {
            rusqlite::Error::FromSqlConversionFailure(6, rusqlite::types::Type::Text, e.into())
        })?,
        tries: r.get(7)?,
        next_at: r.get(8)?,
        token: r.get::<_, i64>(9)? as u64,
        last_error: r.get(10)?,
        created_at: r.get(11)?,
        updated_at: r.get(12)?,
    })
}

pub(crate) fn add(tx: &Connection, deliveries: Vec<Delivery>) -> Result<(), StoreError> {
    for d in deliveries {
        tx.exec(
            "INSERT OR IGNORE INTO deliveries (id, tenant, run_id, url, event, payload, status,
                 tries, next_at, token, last_error, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                d.id,
                d.tenant,
                d.run_id,
                d.url,
                d.event,
                d.payload,
                d.status.as_str(),
                d.tries,
                d.next_at,
                d.token as i64,
                d.last_error,
                d.created_at,
                d.updated_at
            ],
        )
        .map_err(internal)?;
    }
    Ok(())
}

pub(crate) fn claim(
    tx: &Connection,
    now: i64,
    limit: usize,
    lease_ms: u64,
) -> Result<Vec<Delivery>, StoreError> {
    let ids: Vec<String> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT id FROM deliveries WHERE status = 'pending' AND next_at <= ?1
                 ORDER BY next_at LIMIT ?2",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(params![now, limit as i64], |r| r.get(0))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    let mut claimed = Vec::with_capacity(ids.len());
    for id in ids {
        let d = tx
            .row(
                &format!(
                    "UPDATE deliveries SET token = token + 1, next_at = ?2 WHERE id = ?1
                     RETURNING {COLUMNS}"
                ),
                params![id, now + lease_ms as i64],
                from_row,
            )
            .map_err(internal)?;
        claimed.push(d);
    }
    Ok(claimed)
}

pub(crate) fn record_try(tx: &Connection, now: i64, tried: DeliveryTry) -> Result<(), StoreError> {
    let tries: Option<u32> = tx
        .row(
            "SELECT tries FROM deliveries
             WHERE id = ?1 AND tenant = ?2 AND token = ?3 AND status = 'pending'",
            params![tried.id, tried.tenant, tried.token as i64],
            |r| r.get(0),
        )
        .optional()
        .map_err(internal)?;
    let Some(tries) = tries else {
        return Ok(());
    };
    let after = notify::after_try(tries, tried.error.as_deref(), now);
    tx.exec(
        "UPDATE deliveries SET status = ?2, tries = ?3, next_at = ?4, last_error = ?5,
             updated_at = ?6
         WHERE id = ?1",
        params![
            tried.id,
            after.status.as_str(),
            after.tries,
            after.next_at,
            after.last_error,
            now
        ],
    )
    .map_err(internal)?;
    Ok(())
}

pub(crate) fn of_run(
    tx: &Connection,
    tenant: &str,
    run: &str,
) -> Result<Vec<Delivery>, StoreError> {
    let mut stmt = tx
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM deliveries WHERE run_id = ?1 AND tenant = ?2 ORDER BY rowid"
        ))
        .map_err(internal)?;
    let rows = stmt
        .query_map(params![run, tenant], from_row)
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

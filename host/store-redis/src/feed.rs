//! The tenant feed ([`Feed`], `wasq_core::feed`).

use super::*;

/// The tenant feed ([`Feed`]): the `feed` stream the scripts append to while `meta.feed`
/// is ahead of now (see `flush_feed` in the prelude); cursors are stream ids.
#[async_trait]
impl Feed for RedisStore {
    async fn listen_feed(&self, tenant: &str, until: i64) -> Result<(), StoreError> {
        let meta = format!("{}meta", self.tenant_prefix(tenant));
        self.query::<i64>(redis::cmd("HSET").arg(meta).arg("feed").arg(until))
            .await
            .map(drop)
    }

    async fn feed(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<wasq_core::feed::FeedPage, StoreError> {
        use wasq_core::feed::{FeedEntry, FeedPage};
        let key = format!("{}feed", self.tenant_prefix(tenant));
        let Some(after) = after else {
            let last: Vec<(String, Vec<(String, String)>)> = self
                .query(
                    redis::cmd("XREVRANGE")
                        .arg(&key)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(1),
                )
                .await?;
            let next = last
                .first()
                .map_or_else(|| "0-0".to_owned(), |(id, _)| id.clone());
            return Ok(FeedPage {
                entries: Vec::new(),
                next,
            });
        };
        if !after.contains('-') {
            return Err(StoreError::NotFound(format!("feed cursor {after:?}")));
        }
        let page: Vec<(String, Vec<(String, String)>)> = self
            .query(
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(format!("({after}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(limit),
            )
            .await?;
        let mut entries = Vec::with_capacity(page.len());
        for (id, fields) in page {
            let get = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("")
            };
            entries.push(FeedEntry {
                cursor: id.clone(),
                run_id: get("r").to_owned(),
                function: get("f").to_owned(),
                status: get("s").parse().map_err(corrupt)?,
                attempt: get("a").parse().map_err(corrupt)?,
                at: get("t").parse().map_err(corrupt)?,
            });
        }
        let next = entries
            .last()
            .map_or_else(|| after.to_owned(), |e| e.cursor.clone());
        Ok(FeedPage { entries, next })
    }
}

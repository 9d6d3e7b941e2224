//! The tenant feed ([`Feed`]): entries appended by `State` on every status change while
//! the tenant is listened to; cursors are the entries' sequence numbers.

use std::collections::VecDeque;

use wasq_core::clock::Millis;
use wasq_core::feed::{FEED_KEEP, FeedEntry, FeedPage};
use wasq_core::*;

use crate::state::State;

#[derive(Default)]
pub(crate) struct TenantFeed {
    /// Recorded while changes happen before this.
    until: Millis,
    /// The sequence number of the last entry appended (0: none yet).
    last: u64,
    entries: VecDeque<(u64, FeedEntry)>,
}

impl TenantFeed {
    /// Appends a change of `run`'s status, if the feed is listened to at its time.
    pub(crate) fn record(&mut self, run: &Run) {
        if run.updated_at > self.until {
            return;
        }
        self.last += 1;
        self.entries.push_back((
            self.last,
            FeedEntry {
                cursor: self.last.to_string(),
                run_id: run.id.clone(),
                function: run.function.clone(),
                status: run.status,
                attempt: run.attempt,
                at: run.updated_at,
            },
        ));
        while self.entries.len() > FEED_KEEP {
            self.entries.pop_front();
        }
    }
}

pub(crate) fn listen(st: &mut State, tenant: &str, until: Millis) {
    let f = st.feeds.entry(tenant.to_owned()).or_default();
    f.until = f.until.max(until);
}

pub(crate) fn read(
    st: &State,
    tenant: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<FeedPage, StoreError> {
    let feed = st.feeds.get(tenant);
    let last = feed.map_or(0, |f| f.last);
    let Some(after) = after else {
        return Ok(FeedPage {
            entries: Vec::new(),
            next: last.to_string(),
        });
    };
    let after: u64 = after
        .parse()
        .map_err(|_| StoreError::NotFound(format!("feed cursor {after:?}")))?;
    let entries: Vec<FeedEntry> = feed
        .into_iter()
        .flat_map(|f| f.entries.iter())
        .filter(|(seq, _)| *seq > after)
        .take(limit)
        .map(|(_, e)| e.clone())
        .collect();
    let next = entries
        .last()
        .map_or_else(|| after.to_string(), |e| e.cursor.clone());
    Ok(FeedPage { entries, next })
}

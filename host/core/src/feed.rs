//! A tenant's feed: every change of a run's status, in the order the store made them,
//! for tenant-wide live streams (`GET /v1/runs:events`, BullMQ's `QueueEvents`).
//!
//! The key decision: the feed is recorded only while someone listens. A stream renews
//! [`Feed::listen_feed`] while it is open; while the tenant has no listener its
//! transitions write nothing more than before (on Redis the flag is read with what a
//! transition reads anyway). A reader that reconnects with its last cursor within
//! [`FEED_LISTEN_MS`] and within the last [`FEED_KEEP`] entries misses nothing.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::StoreError;
use crate::clock::Millis;
use crate::model::{RunId, RunStatus};

/// How long one renewal of [`Feed::listen_feed`] keeps the feed recorded.
pub const FEED_LISTEN_MS: Millis = 30_000;
/// Entries a tenant's feed keeps at least (older ones are trimmed).
pub const FEED_KEEP: usize = 10_000;
/// Most entries one read answers.
pub const MAX_FEED_PAGE: usize = 1000;
/// Longest cursor.
pub const MAX_CURSOR: usize = 41;

/// One change of a run's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedEntry {
    /// Where this entry is: a cursor the next read may start after.
    pub cursor: String,
    pub run_id: RunId,
    pub function: String,
    pub status: RunStatus,
    pub attempt: u32,
    /// When the store made the change.
    pub at: Millis,
}

/// A read of the feed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeedPage {
    pub entries: Vec<FeedEntry>,
    /// Where the next read starts: the last entry's cursor, or the cursor read after (the
    /// feed's current end for a read from now).
    pub next: String,
}

/// A tenant's feed of run status changes (see [`crate::feed`]), recorded while listened to.
#[async_trait]
pub trait Feed: Send + Sync + 'static {
    /// Keeps the tenant's feed recorded until `until` (a listener renews it): from now on
    /// every change of one of its runs' status is appended, in the order made.
    async fn listen_feed(&self, tenant: &str, until: Millis) -> Result<(), StoreError>;
    /// The entries after cursor `after` (`None`: none, with the feed's current end as
    /// `next`), oldest first, at most `limit`.
    async fn feed(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<FeedPage, StoreError>;
}

/// Whether `s` has a cursor's shape (digits, optionally `-` and digits): anything else
/// is refused before it reaches a store.
pub fn is_cursor(s: &str) -> bool {
    let mut parts = s.splitn(2, '-');
    let digits =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    s.len() <= MAX_CURSOR && digits(parts.next()) && parts.next().is_none_or(|p| digits(Some(p)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cursors_have_a_shape() {
        for ok in ["0", "17", "1700000000000-3"] {
            assert!(super::is_cursor(ok), "{ok}");
        }
        for bad in ["", "-", "1-", "a", "1-2-3", "1.2", &"9".repeat(42)] {
            assert!(!super::is_cursor(bad), "{bad}");
        }
    }
}

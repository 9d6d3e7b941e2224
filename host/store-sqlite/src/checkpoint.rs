//! WAL checkpoints beside the writer: a thread with a connection of its own copies the
//! WAL's pages back into the database file, so that the writer thread, which every store
//! call waits for, seldom stops to do it.
//!
//! SQLite's automatic checkpoint runs in the connection that commits, each time the WAL
//! has grown by 1,000 pages: it copies them and syncs the WAL and the file, a few
//! milliseconds during which every queued call waits. It set `wasq dev`'s create→start p99
//! at 1,000 runs/s (4.3–6.4 ms, against 1.3 ms with checkpoints off; `cargo bench -p
//! wasq-bench --bench latency`). Here the writer's commits only wake the thread, at the
//! same pace (each 1,000 pages the WAL grows: `Pace`): as many checkpoints and syncs as
//! before, off the writer. Woken after every commit instead, the thread synced so often
//! that it cost more CPU than the writer saved (`wasq dev`'s CPU per created run 75 → 130
//! µs).
//!
//! The WAL starts over from its beginning only when a write transaction begins with every
//! frame copied back, and a checkpoint beside a busy writer seldom ends so: the writer
//! commits while it copies. So once the WAL holds 16,384 pages (64 MiB), the writer
//! checkpoints after its commit, as SQLite would by itself (after the thread's checkpoint,
//! if one is running: SQLite runs one at a time and would refuse the second). It copies
//! what the thread has not, about 100 pages (the thread is woken each 100 pages near the
//! tail), once per 16,384 pages of WAL instead of 1,000 each 1,000; and the WAL stays
//! within that and one batch.
//!
//! Durability is SQLite's: a checkpoint never copies a frame that is not committed, and
//! any connection may run one (`PASSIVE`: it waits for no reader or writer).

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use wasq_core::StoreError;

use crate::internal;

/// When checkpoints run, in WAL pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    /// How far the WAL grows between two of the thread's checkpoints.
    pub(crate) step: c_int,
    /// The WAL's length after a commit at which the writer checkpoints what the thread has
    /// not.
    pub(crate) tail: c_int,
}

impl Pace {
    /// `step`: SQLite's own pace for its automatic checkpoint. `tail`: 64 MiB of
    /// 4 KiB pages; a WAL much longer than this makes each read of a page that is not in the
    /// cache search more of the WAL's index.
    pub(crate) const DEFAULT: Pace = Pace {
        step: 1000,
        tail: 16 * 1024,
    };
}

/// Checkpoints of a WAL that held pages, by where they ran (for tests).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) beside: AtomicU64,
    pub(crate) on_writer: AtomicU64,
}

/// Takes the WAL's checkpoints off `writer`, a connection to the database file at `path`:
/// with `beside`, a thread of its own does them (until `writer` is closed); without, only
/// the writer's checkpoints at `pace.tail` are left (a test checks that fallback alone).
pub(crate) fn start(
    writer: &mut Connection,
    path: &Path,
    pace: Pace,
    beside: bool,
) -> Result<Arc<Counts>, StoreError> {
    let counts = Arc::new(Counts::default());
    // Held while a checkpoint runs: the writer's waits for the thread's.
    let one_at_a_time = Arc::new(Mutex::new(()));
    let wake = if beside {
        let conn = Connection::open(path).map_err(internal)?;
        // A connection opens the WAL when it first reads the file: until then its
        // checkpoints find no WAL and do nothing.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(internal)?;
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let (counts, one_at_a_time) = (counts.clone(), one_at_a_time.clone());
        std::thread::Builder::new()
            .name("wasq-sqlite-ckpt".into())
            .spawn(move || {
                // Ends when the writer's connection (which holds `wake`) is closed.
                while woken.recv().is_ok() {
                    let _one = one_at_a_time.lock().unwrap_or_else(|p| p.into_inner());
                    checkpoint(&conn, &counts.beside);
                }
            })
            .map_err(|e| StoreError::Internal(format!("cannot start a thread: {e}")))?;
        Some(wake)
    } else {
        None
    };
    let counted = counts.clone();
    // The WAL's length when the thread was last woken.
    let mut woken_at: c_int = 0;
    // Replaces SQLite's automatic checkpoint (which is a WAL hook of its own).
    writer
        .wal_hook(Some(move |wal: &mut Wal, pages: c_int| {
            if pages < woken_at {
                // The WAL started over.
                woken_at = 0;
            }
            if pages >= pace.tail {
                let _one = one_at_a_time.lock().unwrap_or_else(|p| p.into_inner());
                if let Ok((_, copied)) = wal.checkpoint_v2(CheckpointMode::PASSIVE)
                    && copied > 0
                {
                    counted.on_writer.fetch_add(1, Ordering::Relaxed);
                }
            } else if pages >= woken_at + step(pace, pages)
                && let Some(wake) = &wake
            {
                woken_at = pages;
                // Full: a wake-up is pending already.
                let _ = wake.try_send(());
            }
            // Never an error: the commit has happened, and an error here would make the
            // COMMIT report one. A checkpoint that failed runs again after a later commit.
            Ok(())
        }))
        .map_err(internal)?;
    Ok(counts)
}

/// How far the WAL grows before the thread is woken again, at `pages`: a tenth of the
/// step in the last step before the tail, so that the writer's checkpoint there finds
/// about a tenth as much to copy and sync.
fn step(pace: Pace, pages: c_int) -> c_int {
    if pages >= pace.tail - pace.step {
        (pace.step / 10).max(1)
    } else {
        pace.step
    }
}

fn checkpoint(conn: &Connection, count: &AtomicU64) {
    match conn.wal_checkpoint_v2(Some("main"), CheckpointMode::PASSIVE) {
        // `copied`: the WAL's pages in the file now, this checkpoint's and earlier ones'.
        Ok((_, copied)) if copied > 0 => {
            count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "WAL checkpoint beside the writer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits `n` transactions of about `pages` pages each on `conn`.
    fn commit(conn: &Connection, n: usize, pages: usize) {
        for _ in 0..n {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            for _ in 0..pages {
                conn.execute("INSERT INTO t (v) VALUES (randomblob(3900))", [])
                    .unwrap();
            }
            conn.execute_batch("COMMIT").unwrap();
        }
    }

    /// The most frames the WAL file has held (it is reused from its start, not shrunk).
    fn wal_frames(path: &Path) -> i64 {
        let wal = path.with_file_name("db-wal");
        let len = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
        // A 32-byte header, then frames of a 24-byte header and a 4 KiB page.
        (len.saturating_sub(32) / (24 + 4096)) as i64
    }

    /// A store-like connection on a new file in `dir`, its checkpoints taken at `pace`
    /// (by the thread too with `beside`).
    fn open(
        dir: &tempfile::TempDir,
        pace: Pace,
        beside: bool,
    ) -> (Connection, std::path::PathBuf, Arc<Counts>) {
        let path = dir.path().join("db");
        let mut conn = Connection::open(&path).unwrap();
        crate::connection::configure(&conn).unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
            .unwrap();
        let counts = start(&mut conn, &path, pace, beside).unwrap();
        (conn, path, counts)
    }

    fn rows(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// With the thread beside it, checkpoints run there, the WAL stays bounded, and what
    /// was committed is in the file once the connection is closed.
    #[test]
    fn the_thread_checkpoints_and_the_wal_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let pace = Pace {
            step: 100,
            tail: 1000,
        };
        let (conn, path, counts) = open(&dir, pace, true);
        // About 20,000 pages, twenty times the bound.
        commit(&conn, 2_000, 10);
        assert!(
            counts.beside.load(Ordering::Relaxed) > 0,
            "the thread never checkpointed"
        );
        // The bound and one commit.
        let frames = wal_frames(&path);
        assert!(
            frames <= i64::from(pace.tail) + 20,
            "WAL of {frames} frames"
        );
        let before = rows(&conn);
        assert_eq!(before, 20_000);
        drop(conn);
        assert_eq!(rows(&Connection::open(&path).unwrap()), before);
    }

    /// Without the thread (as if it could not keep up at all), no checkpoint runs below
    /// the tail (SQLite's own, each 1,000 pages, is off), and the writer's own at the tail
    /// keep the WAL within it and a commit.
    #[test]
    fn the_writer_bounds_the_wal_alone() {
        let dir = tempfile::tempdir().unwrap();
        let pace = Pace {
            step: 100,
            tail: 2000,
        };
        let (conn, path, counts) = open(&dir, pace, false);
        for _ in 0..1_000 {
            if wal_frames(&path) >= 1_200 {
                break;
            }
            commit(&conn, 1, 10);
        }
        let frames = wal_frames(&path);
        assert!(frames >= 1_200, "WAL of {frames} frames");
        assert_eq!(counts.on_writer.load(Ordering::Relaxed), 0);
        commit(&conn, 2_000, 10);
        assert!(counts.on_writer.load(Ordering::Relaxed) >= 5);
        let frames = wal_frames(&path);
        assert!(
            frames <= i64::from(pace.tail) + 20,
            "WAL of {frames} frames"
        );
    }
}

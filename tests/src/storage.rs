//! The bytes a store really keeps for a tenant, beside the usage it counted
//! (`usage.stored_bytes`): for the storage-usage test (`tests/storage_usage.rs`) and the
//! calibration of the cost constants (`bench/benches/storage_cost.rs`).
//!
//! "Really keeps" means:
//! - **SQLite**: `dbstat` over the tables that hold a tenant's things (runs, attempts,
//!   steps, logs, events, functions, components) and their indexes: the bytes of the
//!   b-tree pages in use, i.e. page size less unused bytes (page and cell headers, cell
//!   pointers, payload, overflow pages). Free pages and free space inside pages are not
//!   counted: SQLite reuses them (`VACUUM` gives them back to the file system). The
//!   tenants, keys, audit trail, flow-control logs and per-tenant counters are a constant
//!   per tenant, not charged: listed apart. The database must hold only this tenant.
//! - **Redis**: `MEMORY USAGE key SAMPLES 0` summed over every key of the tenant
//!   (`SCAN MATCH <namespace>:{tenant}:*`) and the component keys of its functions, less the
//!   tenant's own bookkeeping hashes `meta`, `quotas` and `usage` (a constant of a few
//!   hundred bytes, not charged: listed apart). Directory keys (the tenant's record, API
//!   keys, audit) are global keys, not the tenant's, and left out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Api;

/// Where the bytes a tenant really keeps are read.
pub enum Probe {
    /// The daemon's `wasq.db`, read beside it (WAL: a reader sees what committed).
    Sqlite(PathBuf),
    Redis {
        client: redis::Client,
        /// `<namespace>:{tenant}:`.
        prefix: String,
        namespace: String,
    },
}

/// Bytes really stored, in all and by table (SQLite) or key family (Redis).
#[derive(Debug, Default, Clone)]
pub struct Actual {
    pub total: u64,
    pub parts: BTreeMap<String, u64>,
    /// Stored but not charged by design (a constant per tenant); not in `total`.
    pub fixed: BTreeMap<String, u64>,
}

/// SQLite tables whose rows a tenant is charged for (with their indexes).
const CHARGED_TABLES: &[&str] = &[
    "runs",
    "attempts",
    "steps",
    "logs",
    "events",
    "functions",
    "components",
];

/// Redis keys of a tenant that are its own bookkeeping, not charged.
const FIXED_KEYS: &[&str] = &["meta", "quotas", "usage"];

impl Probe {
    /// The keys of `tenant` on the Redis at `url`, in wasq's default namespace.
    pub async fn redis(url: &str, tenant: &str) -> Probe {
        let clock = std::sync::Arc::new(wasq_core::SystemClock);
        let store = wasq_store_redis::RedisStore::connect(url, clock)
            .await
            .expect("connect to the test's redis-server");
        Probe::Redis {
            client: redis::Client::open(url).unwrap(),
            prefix: store.tenant_prefix(tenant),
            namespace: store.namespace().to_owned(),
        }
    }

    /// The bytes stored for the tenant, with the components of `digests`.
    pub async fn actual(&self, digests: &[String]) -> Actual {
        match self {
            Probe::Sqlite(db) => sqlite_actual(db),
            Probe::Redis {
                client,
                prefix,
                namespace,
            } => redis_actual(client, prefix, namespace, digests).await,
        }
    }
}

fn sqlite_actual(db: &Path) -> Actual {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open wasq.db read-only");
    let mut stmt = conn
        .prepare(
            "SELECT m.tbl_name, SUM(s.pgsize - s.unused) FROM dbstat s
             JOIN sqlite_schema m ON m.name = s.name GROUP BY m.tbl_name",
        )
        .expect("dbstat (SQLITE_ENABLE_DBSTAT_VTAB)");
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap();
    let mut actual = Actual::default();
    for row in rows {
        let (table, bytes) = row.unwrap();
        let bytes = bytes as u64;
        if CHARGED_TABLES.contains(&table.as_str()) {
            actual.total += bytes;
            actual.parts.insert(table, bytes);
        } else {
            actual.fixed.insert(table, bytes);
        }
    }
    actual
}

async fn redis_actual(
    client: &redis::Client,
    prefix: &str,
    namespace: &str,
    digests: &[String],
) -> Actual {
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = vec![];
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .unwrap();
        keys.extend(page);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    // SCAN may return a key twice; a component shared by two functions is stored once.
    keys.sort();
    keys.dedup();
    let mut digests = digests.to_vec();
    digests.sort();
    digests.dedup();
    keys.extend(digests.iter().map(|d| format!("{namespace}:component:{d}")));
    let mut actual = Actual::default();
    for chunk in keys.chunks(500) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query_async(&mut con).await.unwrap();
        for (k, size) in chunk.iter().zip(sizes) {
            let family = match k.strip_prefix(prefix) {
                Some(rest) => rest.split(':').next().unwrap_or(rest).to_owned(),
                None => "component".to_owned(),
            };
            let size = size.unwrap_or(0);
            let into = if FIXED_KEYS.contains(&family.as_str()) {
                &mut actual.fixed
            } else {
                actual.total += size;
                &mut actual.parts
            };
            *into.entry(family).or_default() += size;
        }
    }
    actual
}

/// The tenant's usage as `GET /v1/tenants/{tenant}` shows it.
pub async fn counted(api: &Api, tenant: &str) -> u64 {
    let (status, t) = api.get(&format!("/v1/tenants/{tenant}")).await;
    assert_eq!(status, 200, "{t}");
    t["usage"]["stored_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.stored_bytes in {t}"))
}

/// One reading: what the store counted and what it really keeps.
#[derive(Debug, Clone)]
pub struct Reading {
    pub counted: u64,
    pub actual: Actual,
}

/// Reads the `default` tenant's usage through `api` and its bytes through `probe`.
pub async fn read(api: &Api, probe: &Probe, digests: &[String]) -> Reading {
    Reading {
        counted: counted(api, wasq_core::DEFAULT_TENANT).await,
        actual: probe.actual(digests).await,
    }
}

/// Waits until no run of the tenant is queued, running, sleeping or waiting.
pub async fn settle(api: &Api, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut busy = vec![];
        for status in ["queued", "running", "sleeping", "waiting"] {
            let (code, runs) = api.get(&format!("/v1/runs?status={status}&limit=5")).await;
            assert_eq!(code, 200, "{runs}");
            if !runs.as_array().unwrap().is_empty() {
                busy.push((status, runs));
            }
        }
        if busy.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not settle within {within:?}: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

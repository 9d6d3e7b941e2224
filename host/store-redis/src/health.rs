//! What the server's store guard and start-up checks read: memory used of `maxmemory`,
//! and the settings a queue needs (`noeviction`, AOF), on every node of a Cluster.

use super::*;

impl RedisStore {
    /// Settings of the Redis server(s) that put wasq's data at risk, one sentence each:
    /// `maxmemory-policy` other than `noeviction`, or AOF off. Empty when all is well.
    /// A server that refuses CONFIG (renamed or disabled) yields a reminder instead.
    pub async fn startup_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        match self.config_get("maxmemory-policy").await {
            Ok(values) => {
                for v in values.into_iter().filter(|v| v != "noeviction") {
                    warnings.push(format!(
                        "Redis maxmemory-policy is {v}: when memory runs out Redis evicts keys, \
                         silently losing runs, leases and step outputs; set maxmemory-policy noeviction"
                    ));
                }
            }
            Err(e) => warnings.push(format!(
                "could not read Redis maxmemory-policy ({e}); it must be noeviction, or Redis \
                 may evict runs when memory runs out"
            )),
        }
        match self.config_get("appendonly").await {
            Ok(values) => {
                for v in values.into_iter().filter(|v| v != "yes") {
                    warnings.push(format!(
                        "Redis appendonly is {v} (AOF off): a Redis restart loses every run, \
                         lease and step output written since the last snapshot; set appendonly yes \
                         (with appendfsync everysec or always)"
                    ));
                }
            }
            Err(e) => warnings.push(format!(
                "could not read Redis appendonly ({e}); without AOF a Redis restart loses \
                 recent runs and step outputs"
            )),
        }
        warnings.dedup();
        warnings
    }

    /// The replies of `cmd` on every node (every master of a Cluster), flattened into
    /// their strings: map keys and values, array items, in order.
    pub(crate) async fn on_every_node(&self, cmd: Cmd) -> Result<Vec<String>, StoreError> {
        let value = match &self.inner.conn {
            AnyConn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let mut c = c.clone();
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                self.timed(c.route_command(cmd, routing)).await?
            }
            _ => self.query::<Value>(&cmd).await?,
        };
        // Whatever shape came back: one reply, or one per node (keyed by node).
        fn flatten(v: Value, out: &mut Vec<String>) {
            match v {
                Value::Array(items) | Value::Set(items) => {
                    items.into_iter().for_each(|v| flatten(v, out))
                }
                Value::Map(pairs) => pairs.into_iter().for_each(|(k, v)| {
                    flatten(k, out);
                    flatten(v, out)
                }),
                Value::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
                Value::VerbatimString { text, .. } => out.push(text),
                Value::SimpleString(s) => out.push(s),
                _ => {}
            }
        }
        let mut flat = Vec::new();
        flatten(value, &mut flat);
        Ok(flat)
    }

    /// `INFO memory` of every node, as raw text (node names in between are harmless: the
    /// callers look for `name:value` lines).
    pub(crate) async fn memory_info(&self) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("memory");
        self.on_every_node(cmd).await
    }

    /// The value of a setting on every node (every master of a Cluster).
    pub(crate) async fn config_get(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        let flat = self.on_every_node(cmd).await?;
        // The value after each occurrence of the name.
        let values: Vec<String> = flat
            .windows(2)
            .filter(|w| w[0].eq_ignore_ascii_case(name))
            .map(|w| w[1].clone())
            .collect();
        if values.is_empty() {
            return Err(StoreError::Internal(format!(
                "CONFIG GET {name} returned nothing"
            )));
        }
        Ok(values)
    }

    pub(crate) async fn used_memory(&self) -> Result<Option<Capacity>, StoreError> {
        // The fullest node decides: a tenant's keys all live on one.
        let mut fullest: Option<Capacity> = None;
        for info in self.memory_info().await? {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            let (Some(used), Some(limit)) = (field("used_memory"), field("maxmemory")) else {
                continue;
            };
            if limit == 0 {
                continue;
            }
            let node = Capacity { used, limit };
            let ratio = |c: &Capacity| c.used as f64 / c.limit as f64;
            if fullest.is_none_or(|f| ratio(&node) > ratio(&f)) {
                fullest = Some(node);
            }
        }
        Ok(fullest)
    }
}

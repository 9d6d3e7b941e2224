//! Reads (a run with its history, steps, logs, listings, id prefixes) and the purge of
//! ended runs.

use super::*;

/// Runs fetched per page when listing.
const LIST_PAGE: usize = 200;

impl RedisStore {
    pub(crate) async fn ids_with_prefix(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        // An id starts with its run's creation time (wasq_core::ids) and the `st:` and
        // `qfn:` indexes hold every run but the running ones between them by creation
        // time, so the prefix's time window holds exactly the runs whose ids share its
        // time digits. Each of them matches a prefix of up to 12 digits, so one page of
        // each index answers; a longer prefix names one millisecond, whose runs are read a
        // page at a time until `limit` match or none is left. Within an index ids come in
        // order, so the `limit` smallest of all are among the first `limit` matches of
        // each. Running runs are indexed by their lease alone (`leases`, by expiry; there
        // are at most the tenant's max_running): read whole and matched here.
        const PAGE: usize = 1_000;
        let (lo, hi) = wasq_core::ids::prefix_window(prefix);
        let tenant_prefix = self.tenant_prefix(tenant);
        let fns: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(format!("{tenant_prefix}fns")))
            .await?;
        let keys: Vec<String> = RunStatus::ALL
            .iter()
            .filter(|s| **s != RunStatus::Running)
            .map(|s| format!("{tenant_prefix}st:{s}"))
            .chain(fns.iter().map(|f| format!("{tenant_prefix}qfn:{f}")))
            .collect();
        let range = |key: &str, offset: usize| {
            let mut cmd = redis::cmd("ZRANGEBYSCORE");
            cmd.arg(key)
                .arg(lo)
                .arg(hi)
                .arg("LIMIT")
                .arg(offset)
                .arg(PAGE);
            cmd
        };
        // The first page of every index in one round trip; the rare index with more in a
        // millisecond is read on alone.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.add_command(range(key, 0));
        }
        pipe.cmd("ZRANGEBYSCORE")
            .arg(format!("{tenant_prefix}leases"))
            .arg("-inf")
            .arg("(+inf");
        let mut c = self.inner.conn.clone();
        let mut firsts: Vec<Vec<String>> = self.timed(pipe.query_async(&mut c)).await?;
        // A lease entry can outlive its run's status (the claim that meets it drops it):
        // such a run is in another index too, and counted once.
        let leased = firsts.pop().unwrap_or_default();
        let mut found: Vec<String> = leased
            .into_iter()
            .filter(|id| id.starts_with(prefix))
            .collect();
        for (key, mut ids) in keys.iter().zip(firsts) {
            let mut matched = 0;
            for offset in (PAGE..).step_by(PAGE) {
                let last_page = ids.len() < PAGE;
                let before = found.len();
                found.extend(ids.into_iter().filter(|id| id.starts_with(prefix)));
                matched += found.len() - before;
                if last_page || matched >= limit {
                    break;
                }
                ids = self.query(&range(key, offset)).await?;
            }
        }
        found.sort();
        found.dedup();
        found.truncate(limit);
        Ok(found)
    }

    pub(crate) async fn run_detail(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<RunDetail>, StoreError> {
        let args = Args::new()
            .s(id)
            .n(wasq_core::storage::DETAIL_STEPS)
            .n(wasq_core::storage::DETAIL_ATTEMPTS);
        let (status, rest) = self.script(&scripts::GET, tenant, args).await?;
        if status == "not_found" {
            return Ok(None);
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short run reply"));
        let run = self.run_from(tenant, next()?, None).await?;
        let attempts_total = int(next()?)?.max(0) as u64;
        let attempts = array(next()?)?
            .into_iter()
            .map(|v| decode::attempt(&decode::bytes(v)?))
            .collect::<Result<Vec<_>, _>>()?;
        let steps_total = int(next()?)?.max(0) as u64;
        let steps = decode::step_infos(next()?, next()?)?;
        Ok(Some(RunDetail {
            run,
            attempts,
            attempts_total,
            steps,
            steps_total,
        }))
    }

    pub(crate) async fn step_page(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<StepInfo>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let args = Args::new().s(id).n(skip).n(limit.min(i64::MAX as usize));
        let (status, rest) = self.script(&scripts::STEPS, tenant, args).await?;
        if status == "not_found" {
            return Err(StoreError::NotFound(format!("run {id:?}")));
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short steps reply"));
        decode::step_infos(next()?, next()?)
    }

    pub(crate) async fn step_record(
        &self,
        tenant: &str,
        id: &str,
        name: &str,
        occurrence: u32,
    ) -> Result<Option<StepRecord>, StoreError> {
        let args = Args::new().s(id).s(decode::step_field(name, occurrence));
        let (status, rest) = self.script(&scripts::STEP, tenant, args).await?;
        if status == "not_found" {
            return Ok(None);
        }
        let mut rest = rest.into_iter();
        let mut next = || rest.next().ok_or_else(|| corrupt("short step reply"));
        decode::step_record(next()?, next()?).map(Some)
    }

    pub(crate) async fn list_runs(&self, q: RunQuery) -> Result<Vec<Run>, StoreError> {
        if q.limit == 0 {
            return Ok(Vec::new());
        }
        // Read the smallest set of indexes that covers the query (each a merge of some: a
        // queued run is in its function's `qfn:` index, any other in `st:<status>` and
        // `byfn:<function>`; `*` and `*queued` are every run's and every queued run's,
        // merged by the script), and filter the rest here. `st:queued` only holds runs
        // queued before `qfn:` existed.
        let mut covers: Vec<Vec<String>> = Vec::new();
        if let Some(p) = &q.parent {
            covers.push(vec![format!("kids:{p}")]);
        }
        match (&q.function, q.status) {
            (Some(f), Some(RunStatus::Queued)) => {
                covers.push(vec![format!("qfn:{f}"), "st:queued".to_owned()]);
            }
            (Some(f), Some(_)) => covers.push(vec![format!("byfn:{f}")]),
            (Some(f), None) => covers.push(vec![format!("byfn:{f}"), format!("qfn:{f}")]),
            (None, _) => {}
        }
        match q.status {
            Some(RunStatus::Queued) => covers.push(vec!["*queued".to_owned()]),
            // A running run is indexed by its lease alone (see `prelude.lua`).
            Some(RunStatus::Running) => covers.push(vec!["leases".to_owned()]),
            Some(s) => covers.push(vec![format!("st:{s}")]),
            None => {}
        }
        let filters = usize::from(q.parent.is_some())
            + usize::from(q.function.is_some())
            + usize::from(q.status.is_some());
        // With at most one filter the indexes alone answer the query: fetch no more runs
        // than asked for (a poll for "any queued run?" reads one run, not a page).
        let page = if filters <= 1 {
            q.limit.min(LIST_PAGE)
        } else {
            LIST_PAGE
        };
        let prefix = self.tenant_prefix(&q.tenant);
        let indexes = match covers.len() {
            0 => vec!["*".to_owned()],
            1 => covers.remove(0),
            _ => {
                // The one with the fewest runs (every queued run's: as counted).
                let mut pipe = redis::pipe();
                for i in covers.iter().flatten().filter(|i| *i != "*queued") {
                    pipe.cmd("ZCARD").arg(format!("{prefix}{i}"));
                }
                let mut c = self.inner.conn.clone();
                let sizes: Vec<u64> = self.timed(pipe.query_async(&mut c)).await?;
                let mut sizes = sizes.into_iter();
                let mut totals = Vec::with_capacity(covers.len());
                for cover in &covers {
                    let mut total = 0;
                    for i in cover {
                        total += if i == "*queued" {
                            self.queued_runs(&prefix).await?
                        } else {
                            sizes.next().unwrap_or_default()
                        };
                    }
                    totals.push(total);
                }
                let smallest = (0..totals.len()).min_by_key(|&i| totals[i]).unwrap_or(0);
                covers.swap_remove(smallest)
            }
        };
        // Index scores are creation times, and an id starts with its own: `before` and
        // `since` bound the scores read; ids of `before`'s millisecond are filtered here.
        let max = q.before.as_deref().map_or_else(
            || "+inf".to_owned(),
            |b| {
                let time: String = b.chars().take(13).collect();
                wasq_core::ids::prefix_window(&time).0.to_string()
            },
        );
        let min = q.since.map_or_else(|| "-inf".to_owned(), |t| t.to_string());
        let mut out = Vec::new();
        let mut start = 0usize;
        loop {
            let mut args = Args::new().n(start).n(page).s(&max).s(&min);
            for i in &indexes {
                args = args.s(i);
            }
            let (_, rest) = self.script(&scripts::LIST, &q.tenant, args).await?;
            let mut rest = rest.into_iter();
            let scanned = int(rest.next().ok_or_else(|| corrupt("short list reply"))?)? as usize;
            for v in array(rest.next().unwrap_or(Value::Nil))? {
                let run = self.run_from(&q.tenant, v, None).await?;
                let keep = q.before.as_ref().is_none_or(|b| run.id < *b)
                    && q.function.as_ref().is_none_or(|f| *f == run.function)
                    && q.status.is_none_or(|s| s == run.status)
                    && q.parent
                        .as_ref()
                        .is_none_or(|p| Some(p) == run.parent.as_ref());
                if keep {
                    out.push(run);
                    if out.len() == q.limit {
                        return Ok(out);
                    }
                }
            }
            if scanned < page {
                return Ok(out);
            }
            start += page;
        }
    }

    pub(crate) async fn log_page(
        &self,
        tenant: &str,
        id: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<LogLine>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = format!("{}logs:{id}", self.tenant_prefix(tenant));
        let last = skip
            .checked_add(limit - 1)
            .and_then(|l| i64::try_from(l).ok())
            .unwrap_or(-1);
        let lines: Vec<Vec<u8>> = self
            .query(redis::cmd("LRANGE").arg(key).arg(skip).arg(last))
            .await?;
        lines
            .iter()
            .map(|l| serde_json::from_slice(l).map_err(|e| corrupt(format!("log line: {e}"))))
            .collect()
    }

    pub(crate) async fn purge_ended(&self, req: PurgeRequest) -> Result<usize, StoreError> {
        let mut purged = 0;
        for tenant in self.tenants().await? {
            if purged >= req.limit {
                break;
            }
            let args = Args::new()
                .n(req.succeeded_before)
                .n(req.failed_before)
                .n(req.limit - purged);
            let (_, rest) = self.script(&scripts::PURGE, &tenant, args).await?;
            purged += int(rest.into_iter().next().unwrap_or(Value::Int(0)))? as usize;
        }
        let due = {
            let mut last = self
                .inner
                .last_collect
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= COLLECT_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            let n = self.collect_components(COLLECT_MIN_IDLE).await?;
            if n > 0 {
                tracing::info!(components = n, "deleted components no function or run uses");
            }
        }
        Ok(purged)
    }
}

impl RedisStore {
    /// The tenant's queued runs: `nq` holds their count plus one (see `prelude.lua`); a
    /// tenant whose scripts have not counted them yet has them all in `st:queued`.
    async fn queued_runs(&self, prefix: &str) -> Result<u64, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(format!("{prefix}nq"));
        pipe.cmd("ZCARD").arg(format!("{prefix}st:queued"));
        let mut c = self.inner.conn.clone();
        let (counted, older): (Option<u64>, u64) = self.timed(pipe.query_async(&mut c)).await?;
        Ok(counted.map_or(older, |n| n.saturating_sub(1)))
    }

    /// [`Runs::queue_depths`]: named queues from their counters (`qload`), the default
    /// queue as the rest of the status indexes.
    pub(crate) async fn read_queue_depths(
        &self,
        tenant: &str,
    ) -> Result<Vec<QueueDepth>, StoreError> {
        let p = self.tenant_prefix(tenant);
        let load: Vec<(String, i64)> = self
            .query(redis::cmd("HGETALL").arg(format!("{p}qload")))
            .await?;
        let queued = self.queued_runs(&p).await?;
        // Every lease but the pin (LEASE_PIN, at +inf).
        let running: u64 = self
            .query(
                redis::cmd("ZCOUNT")
                    .arg(format!("{p}leases"))
                    .arg("-inf")
                    .arg("(+inf"),
            )
            .await?;
        let mut by_queue: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let (mut named_queued, mut named_running) = (0u64, 0u64);
        for (field, n) in load {
            let Some((queue, status)) = field.rsplit_once('|') else {
                continue;
            };
            let n = n.max(0) as u64;
            let slot = by_queue.entry(queue.to_owned()).or_default();
            match status {
                "queued" => {
                    slot.0 += n;
                    named_queued += n;
                }
                "running" => {
                    slot.1 += n;
                    named_running += n;
                }
                _ => {}
            }
        }
        by_queue.insert(
            wasq_core::queues::DEFAULT_QUEUE.to_owned(),
            (
                queued.saturating_sub(named_queued),
                running.saturating_sub(named_running),
            ),
        );
        Ok(by_queue
            .into_iter()
            .filter(|(_, (q, r))| q + r > 0)
            .map(|(queue, (queued, running))| QueueDepth {
                queue,
                queued,
                running,
            })
            .collect())
    }
}

impl RedisStore {
    /// [`Runs::load`], counted by `lua/load.lua`.
    pub(crate) async fn read_load(&self, tenant: &str) -> Result<RunLoad, StoreError> {
        let mut args = Args::new();
        for s in ACTIVE_STATUSES {
            args = args.s(s.as_str());
        }
        let (status, rest) = self.script(&scripts::LOAD, tenant, args).await?;
        if status != "ok" {
            return Err(corrupt(format!("load answered {status}")));
        }
        let mut rest = rest.into_iter();
        let oldest = string(rest.next().unwrap_or(Value::Nil))?;
        let mut flat = array(rest.next().unwrap_or(Value::Nil))?.into_iter();
        let mut counts = Vec::new();
        while let (Some(f), Some(s), Some(n)) = (flat.next(), flat.next(), flat.next()) {
            let status: RunStatus = string(s)?.parse().map_err(corrupt)?;
            counts.push((string(f)?, status, int(n)? as u64));
        }
        Ok(RunLoad {
            counts,
            oldest_queued_at: oldest.parse().ok(),
        })
    }
}

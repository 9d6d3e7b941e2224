//! Claims: the due tenants take turns (the limit split among them), each visited by one
//! claim script (under a backlog the first visit goes out with the read of the due
//! tenants); expired leases take a second call with core's transitions; lease renewals.

use wasq_core::queues::DEFAULT_QUEUE;

use super::*;

/// Due tenants one claim considers at most.
const DUE_TENANTS_MAX: usize = 10_000;
/// Rounds of per-tenant claim calls one claim makes at most.
const CLAIM_ROUNDS_MAX: usize = 32;
/// How long the tenant a claim left first in line is visited ahead by the next claim
/// (see `claim_queue`): a worker with a backlog claims again within milliseconds; after
/// longer, the tenant has likely been drained, and a visit that finds nothing costs more
/// than the round trip it saves.
const NEXT_UP_FRESH_MS: i64 = 20;
/// Cluster: how often a claim republishes every tenant's next due time, repairing hints
/// lost when a process died between a transition and its hint update.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl RedisStore {
    /// Sleeps until the earliest due time of the schedules the claims of `queues` read
    /// ([`Self::due_keys`], their heads read in one round trip), or until a wake-up token
    /// arrives: the claim that follows visits the tenant the token names with its read
    /// of the schedule ([`Self::woken_by`]).
    pub(crate) async fn wait_for_due(
        &self,
        max: Duration,
        queues: &[String],
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut wait = max;
        let mut pipe = redis::pipe();
        for key in self.due_keys(queues) {
            pipe.cmd("ZRANGE").arg(key).arg(0).arg(0).arg("WITHSCORES");
        }
        let mut c = self.inner.conn.clone();
        let heads: Vec<Vec<(String, f64)>> = self.timed(pipe.query_async(&mut c)).await?;
        for head in heads {
            if let Some((_, score)) = head.first() {
                let at = *score as i64;
                if at <= now {
                    return Ok(());
                }
                wait = wait.min(Duration::from_millis((at - now) as u64));
            }
        }
        // Our own timer ends the wait at the due time; the listener's BLPOP ends it when a
        // wake-up token arrives.
        let wake = self.wake_of(queues);
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let waiter = wake.register(&self.inner.conn);
        tokio::select! {
            _ = notified => {
                if let Some(e) = waiter.failure() {
                    return Err(e);
                }
                if let Some((list, tenant)) = wake.token() {
                    self.woken_by(queues, &list, &tenant);
                }
                Ok(())
            }
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// A wake-up token from `list` named `tenant`, whose runs just became due: the next
    /// claim of the queue it woke visits that tenant ahead, with its read of the schedule
    /// (as it visits the tenant a claim under a backlog left first in line), so a run
    /// created while workers wait starts one round trip sooner. The read decides every
    /// other visit. Tokens from before tokens named tenants ('1') name none.
    fn woken_by(&self, queues: &[String], list: &str, tenant: &str) {
        if tenant == "1" {
            return;
        }
        let queue = if queues.is_empty() {
            String::new()
        } else if list == self.g("wake") {
            DEFAULT_QUEUE.to_owned()
        } else {
            match list.strip_prefix(&self.g("wake:")) {
                Some(q) => q.to_owned(),
                None => return,
            }
        };
        self.set_next_up(&queue, tenant, 1);
    }

    /// The schedules a claim of `queue` reads (`None`: every queue): tenants with only
    /// the default queue are in `due`, those with named queues in `dueq` (every queue)
    /// and in `due:<queue>` (each).
    fn schedules(&self, queue: Option<&str>) -> Vec<String> {
        match queue {
            None => vec![self.g("due"), self.g("dueq")],
            Some(DEFAULT_QUEUE) => vec![self.g("due"), self.g(&format!("due:{DEFAULT_QUEUE}"))],
            Some(q) => vec![self.g(&format!("due:{q}"))],
        }
    }

    /// Every schedule a worker taking `queues` reads.
    fn due_keys(&self, queues: &[String]) -> Vec<String> {
        if queues.is_empty() {
            return self.schedules(None);
        }
        queues
            .iter()
            .flat_map(|q| self.schedules(Some(q)))
            .collect()
    }

    /// The wake-up listener of workers that take `queues` (one per queue list).
    fn wake_of(&self, queues: &[String]) -> Arc<Wake> {
        if queues.is_empty() {
            return self.inner.wake.clone();
        }
        let mut wakes = self
            .inner
            .queue_wakes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        wakes
            .entry(queues.join(","))
            .or_insert_with(|| {
                // Tenants with only the default queue wake its workers through `wake`.
                let mut keys: Vec<String> = queues
                    .iter()
                    .map(|q| self.g(&format!("wake:{q}")))
                    .collect();
                if queues.iter().any(|q| q == DEFAULT_QUEUE) {
                    keys.push(self.g("wake"));
                }
                Arc::new(Wake::new(
                    self.inner.block_source.clone(),
                    keys,
                    self.inner.connect_timeout,
                ))
            })
            .clone()
    }

    /// Claims from the queues asked, in order (each queue's tenants taking turns), or from
    /// every queue as one.
    pub(crate) async fn claim_runs(&self, req: ClaimRequest) -> Result<Vec<Claimed>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        self.sweep_if_due(&req).await?;
        if req.queues.is_empty() {
            return self.claim_queue(&req, None, req.limit).await;
        }
        let mut claimed = Vec::new();
        for queue in &req.queues {
            let limit = req.limit - claimed.len();
            if limit == 0 {
                break;
            }
            match self.claim_queue(&req, Some(queue), limit).await {
                Ok(got) => claimed.extend(got),
                Err(e) if claimed.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(queue, error = %e, "claim failed for a queue");
                    break;
                }
            }
        }
        Ok(claimed)
    }

    /// Up to `limit` runs of `queue` (`None`: every queue): the tenants due in its
    /// schedule take turns.
    ///
    /// Under a backlog a claim's first visit is known before the schedule is read: the
    /// tenant that the previous claim of the queue left first in line when it filled its
    /// limit (its share: the limit split among the tenants left in line). That visit goes
    /// out with the read of the schedule, so a claim costs one round trip, not two (a
    /// worker at concurrency 1 claims once per run: 20-28% more runs per second, 44-55%
    /// at concurrency 10). The read still decides every other visit: a tenant that
    /// became due is visited by this claim if the visit ahead left room, else first by
    /// the next one (`backlog::a_claim_under_a_backlog_visits_...`).
    async fn claim_queue(
        &self,
        req: &ClaimRequest,
        queue: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError> {
        let now = self.now();
        let queues = queue.unwrap_or("");
        let ahead = self
            .take_next_up(queues, now)
            .map(|(tenant, left)| (tenant, share(limit, left.clamp(1, limit), 0)));
        // Its schedules, read in one round trip.
        let mut pipe = redis::pipe();
        for key in self.schedules(queue) {
            pipe.cmd("ZRANGEBYSCORE")
                .arg(key)
                .arg("-inf")
                .arg(now)
                .arg("LIMIT")
                .arg(0)
                .arg(DUE_TENANTS_MAX);
        }
        let mut c = self.inner.conn.clone();
        let read = self.timed(pipe.query_async::<Vec<Vec<String>>>(&mut c));
        let visit = async {
            match &ahead {
                Some((tenant, quota)) => {
                    Some(self.claim_tenant(tenant, *quota, req, queues, false).await)
                }
                None => None,
            }
        };
        let (due, visited) = futures_util::future::join(read, visit).await;
        let mut visits = Visits {
            remaining: limit,
            ..Visits::default()
        };
        if let (Some((tenant, quota)), Some(result)) = (&ahead, visited) {
            visits.settle(tenant.clone(), *quota, result);
        }
        let mut due: Vec<String> = match due {
            Ok(due) => due.into_iter().flatten().collect(),
            // Runs the visit ahead leased are returned, not left to their leases' expiry.
            Err(e) if visits.claimed.is_empty() => return Err(e),
            Err(_) => return Ok(visits.claimed),
        };
        // The tenant visited ahead is not visited again in the first round (it goes
        // again after the others if it filled its quota).
        if let Some((t, _)) = &ahead {
            due.retain(|d| d != t);
        }
        // Fairness: every claim starts with the next tenant in name order, and the limit
        // is split evenly among the tenants visited in a round.
        due.sort();
        due.dedup();
        if !due.is_empty() {
            let start = self.inner.cursor.fetch_add(1, Ordering::Relaxed) % due.len();
            due.rotate_left(start);
        }
        let mut candidates: VecDeque<String> = due.into();
        candidates.extend(visits.filled.drain(..));
        for _ in 0..CLAIM_ROUNDS_MAX {
            let remaining = visits.remaining;
            if remaining == 0 || candidates.is_empty() {
                break;
            }
            let k = candidates.len().min(remaining);
            let batch: Vec<(String, usize)> = candidates
                .drain(..k)
                .enumerate()
                .map(|(i, t)| (t, share(remaining, k, i)))
                .collect();
            let calls = batch
                .iter()
                .map(|(t, quota)| self.claim_tenant(t, *quota, req, queues, false));
            let results = futures_util::future::join_all(calls).await;
            for ((tenant, quota), result) in batch.into_iter().zip(results) {
                visits.settle(tenant, quota, result);
            }
            candidates.extend(visits.filled.drain(..));
        }
        if let (0, Some(first)) = (visits.remaining, candidates.front()) {
            self.set_next_up(queues, first, candidates.len());
        }
        match visits.first_error {
            Some(e) if visits.claimed.is_empty() => Err(e),
            _ => Ok(visits.claimed),
        }
    }

    /// The tenant a claim of `queues` that filled its limit left first in line, and how
    /// many it left, if that claim was recent (by `now`): the next claim visits it ahead.
    fn take_next_up(&self, queues: &str, now: i64) -> Option<(String, usize)> {
        let mut next = self.inner.next_up.lock().unwrap_or_else(|p| p.into_inner());
        let (at, tenant, left) = next.remove(queues)?;
        (now - at < NEXT_UP_FRESH_MS).then_some((tenant, left))
    }

    /// The next claim of `queues` visits `tenant` ahead with the share of `left` tenants
    /// in line (a claim that filled its limit, or a wake-up naming the tenant).
    fn set_next_up(&self, queues: &str, tenant: &str, left: usize) {
        let mut next = self.inner.next_up.lock().unwrap_or_else(|p| p.into_inner());
        next.insert(queues.to_owned(), (self.now(), tenant.to_owned(), left));
    }

    pub(crate) async fn renew_leases(
        &self,
        leases: &[Lease],
        lease_ms: u64,
    ) -> Result<Renewal, StoreError> {
        let mut by_tenant: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
        for l in leases {
            by_tenant.entry(l.tenant.as_str()).or_default().push(l);
        }
        let ids = |v: Option<Value>| -> Result<Vec<String>, StoreError> {
            array(v.unwrap_or(Value::Nil))?
                .into_iter()
                .map(string)
                .collect()
        };
        let calls = by_tenant.iter().map(|(tenant, leases)| async move {
            let mut args = Args::new().n(lease_ms);
            for l in leases {
                args = args.s(&l.run_id).n(l.token);
            }
            let (status, mut rest) = self.script(&scripts::RENEW, tenant, args).await?;
            if status != "ok" {
                return Err(corrupt(format!("renew answered {status}")));
            }
            self.published(tenant, &mut rest).await?;
            let mut rest = rest.into_iter();
            Ok((ids(rest.next())?, ids(rest.next())?))
        });
        let (mut lost, mut cancelling) = (HashSet::new(), HashSet::new());
        for r in futures_util::future::join_all(calls).await {
            let (l, c) = r?;
            lost.extend(l);
            cancelling.extend(c);
        }
        let pick = |set: &HashSet<String>| {
            leases
                .iter()
                .filter(|l| set.contains(&l.run_id))
                .map(|l| l.run_id.clone())
                .collect()
        };
        Ok(Renewal {
            lost: pick(&lost),
            cancelling: pick(&cancelling),
        })
    }

    /// One claim script on `tenant`: `queues` as the script takes them (comma-separated,
    /// '' for every queue).
    pub(crate) async fn claim_tenant(
        &self,
        tenant: &str,
        limit: usize,
        req: &ClaimRequest,
        queues: &str,
        force: bool,
    ) -> Result<Vec<Claimed>, StoreError> {
        // Expired leases: the first call answers which runs need a transition, the second
        // brings what core decided for each.
        let mut reaps: Option<Vec<(String, String, lifecycle::Transition)>> = None;
        let worker_json = to_json(&req.worker)?;
        // The time the claim that leased the runs ran at (their executions' start).
        let mut claimed_at;
        let mut rest = loop {
            let mut args = Args::new()
                .n(limit)
                .n(req.lease_ms)
                .s(&req.worker)
                .b(worker_json.clone())
                .s(if force { "1" } else { "0" });
            let now = self.now();
            claimed_at = now;
            match &reaps {
                None => args = args.s("").s(queues),
                Some(list) => {
                    args = args.n(list.len()).s(queues);
                    for (id, token, t) in list {
                        args = transition::args(args.s(id).s(token), Some(t))?;
                    }
                }
            }
            let (status, rest) = self.script_at(&scripts::CLAIM, tenant, now, args).await?;
            match status.as_str() {
                "ok" => break rest,
                "reap" if reaps.is_none() => {
                    let entries = array(rest.into_iter().next().unwrap_or(Value::Nil))?;
                    reaps = Some(
                        entries
                            .into_iter()
                            .map(|e| expired_transition(e, now))
                            .collect::<Result<_, _>>()?,
                    );
                }
                other => return Err(corrupt(format!("claim answered {other}"))),
            }
        };
        self.published(tenant, &mut rest).await?;
        // Packed (`cmsgpack`, see mpack.rs), one array, flat (`append_run` in the
        // scripts): per run its RUN_FIELDS values (an array), its lease's memo, then a
        // count and that many step entries, then a count and that many (name, output)
        // pairs' values.
        let packed = decode::bytes(rest.into_iter().next().unwrap_or(Value::Nil))?;
        let mut r = mpack::Reader::new(&packed, "claim reply");
        let mut left = r.array()?;
        let mut runs = Vec::new();
        let mut steps = Vec::new();
        let mut memos = Vec::new();
        while left > 0 {
            runs.push(
                decode::RunFields::unpack(&mut r)?
                    .ok_or_else(|| corrupt("claimed a missing run"))?,
            );
            memos.push(r.opt_bytes()?.unwrap_or(attempt::PLAIN_MEMO));
            let n = r.count()?;
            let order = (0..n).map(|_| r.string()).collect::<Result<Vec<_>, _>>()?;
            let m = r.count()?;
            if m % 2 != 0 {
                return Err(corrupt("claim reply: an odd count of step outputs' values"));
            }
            let outputs = (0..m / 2)
                .map(|_| Ok((r.string()?, r.bytes()?.to_vec())))
                .collect::<Result<decode::Hash, StoreError>>()?;
            steps.push(decode::replay_steps(order, outputs)?);
            left = left
                .checked_sub(4 + n + m)
                .ok_or_else(|| corrupt("claim reply: a run longer than the reply"))?;
        }
        self.load_settings(tenant, &runs).await?;
        runs.into_iter()
            .zip(steps)
            .zip(memos)
            .map(|((fields, steps), memo)| {
                let (run, lease) = fields.claimed(&self.inner.parsed)?;
                let claim = attempt::ClaimedAs {
                    at: claimed_at,
                    worker_json: &worker_json,
                };
                self.inner.memos.keep(&lease, &run, memo, &claim);
                Ok(Claimed { run, lease, steps })
            })
            .collect()
    }

    /// Cluster: republishes every tenant's next due time (and reaps what is due), when a
    /// sweep is due. Hints go stale only if a process died between a transition and its
    /// hint update, or the update failed.
    pub(crate) async fn sweep_if_due(&self, req: &ClaimRequest) -> Result<(), StoreError> {
        if !self.inner.cluster {
            return Ok(());
        }
        {
            let mut last = self
                .inner
                .last_sweep
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let needed = self.inner.sweep_needed.swap(false, Ordering::Relaxed);
            if !needed && last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let tenants: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("tenants")))
            .await?;
        for chunk in tenants.chunks(64) {
            let visits = chunk.iter().map(|t| self.claim_tenant(t, 0, req, "", true));
            for r in futures_util::future::join_all(visits).await {
                r?;
            }
        }
        Ok(())
    }
}

/// What core decides for a run whose lease expired, from a claim's `reap` entry (id,
/// lease token, worker, attempt, max_attempts, cancel_requested): (id, token, transition).
pub(crate) fn expired_transition(
    entry: Value,
    now: i64,
) -> Result<(String, String, lifecycle::Transition), StoreError> {
    let mut parts = array(entry)?.into_iter();
    let mut next = || -> Result<String, StoreError> {
        string(parts.next().ok_or_else(|| corrupt("short reap entry"))?)
    };
    let (id, token, worker) = (next()?, next()?, next()?);
    let number = |s: String| {
        s.parse::<u32>()
            .map_err(|e| corrupt(format!("reap entry: {e}")))
    };
    let (attempt, max_attempts) = (number(next()?)?, number(next()?)?);
    let cancel_requested = next()? == "1";
    let t = lifecycle::lease_expired(
        lifecycle::Expired {
            id: &id,
            attempt,
            max_attempts,
            worker: (!worker.is_empty()).then_some(worker.as_str()),
            cancel_requested,
        },
        now,
    );
    Ok((id, token, t))
}

/// The quota of the `i`-th of `k` tenants visited in a round, of `remaining` runs: the
/// limit split evenly, the first ones taking one more while it does not divide.
fn share(remaining: usize, k: usize, i: usize) -> usize {
    remaining / k + usize::from(i < remaining % k)
}

/// What a claim's visits have taken so far.
#[derive(Default)]
struct Visits {
    remaining: usize,
    claimed: Vec<Claimed>,
    first_error: Option<StoreError>,
    /// Tenants that filled their quota since the caller last took them: they may have
    /// more, and go again after the tenants not visited yet.
    filled: Vec<String>,
}

impl Visits {
    fn settle(&mut self, tenant: String, quota: usize, result: Result<Vec<Claimed>, StoreError>) {
        match result {
            Ok(got) => {
                if got.len() == quota {
                    self.filled.push(tenant);
                }
                self.remaining -= got.len();
                self.claimed.extend(got);
            }
            Err(e) => {
                tracing::warn!(tenant, error = %e, "claim failed for a tenant");
                self.first_error.get_or_insert(e);
            }
        }
    }
}
